"""prepare: the graphs of Part A (exactness, scaling) and the Minesweeper task of Part B.

Part A
  suite/       graphs that stress exactness: SBM halves, weighted Barabasi-Albert halves, grids
               joined by bridges, disjoint identical copies + stars + complete graphs + isolated
               nodes, weighted multi-component graphs (weights over 6 decades), a hypercube.
  scaling/     Barabasi-Albert (m = ``ba_m``) and square-grid graphs for n in ``scaling.sizes``; the
               number of parts grows with n (evaluate: n / ``part_size`` parts by recursive bisection).
  scaling_k/   ``cut_blocks`` random blocks of ``cut_n`` nodes in all joined in a ring by k distinct
               bridges for k in ``cut_sizes``, with the blocks as parts (every bridge is a cut edge).
Part B
  parity/      distance-to-source parity: a 4-neighbour grid with 10% of its edges removed, a few
               sources; label = parity of the hop distance to the nearest source (heterophilous).
  task/        Minesweeper (Platonov et al. 2023), generated: side x side king-move grid, 20% mines,
               features = one-hot count of neighbouring mines + 'unknown' flag, 50% of the nodes'
               features hidden; the label is 'is a mine'. With ``task.source.kind: heterophilous_npz``
               (the full profile) the published benchmark file instead, with its 10 fixed splits
               (task/splits.npz; stages.l2g_net.heterophilous).

    python -m stages prepare l2g_net
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

import networkx as nx
import numpy as np
import scipy.sparse as sp
from pydantic import Field, field_validator, model_validator
from threadpoolctl import threadpool_limits

from stages.common.config import Fraction, Seed, StageConfig, unique_items
from stages.common.paths import write_json
from stages.common.runner import StageContext
from stages.l2g_net.graphs import (ba_graph, edge_homophily, exactness_suite, grid_graph, laplacian, minesweeper,
                                   sbm_blocks, source_parity)

Family = Literal["ba", "grid"]


class ScalingConfig(StageConfig):
    families: list[Family] = Field(default_factory=lambda: ["ba", "grid"], min_length=1)
    sizes: list[int] = Field(default_factory=lambda: [400, 700, 1000, 1500, 2000, 3000], min_length=6,
                             description=">= 6 sizes for the fitted exponents")
    ba_m: int = Field(3, ge=1, le=20, description="edges per new node of the Barabasi-Albert graphs")

    @field_validator("families")
    @classmethod
    def _distinct(cls, v):
        return unique_items(v, "scaling.families")

    @field_validator("sizes")
    @classmethod
    def _sizes(cls, v):
        if any(x < 32 for x in v) or any(x > 20000 for x in v) or sorted(set(v)) != list(v):
            raise ValueError(f"must be strictly increasing sizes in [32, 20000] (got {v}); beyond 20000 the dense "
                             "eigh reference needs more than 3 GB per matrix")
        return v


class TaskSource(StageConfig):
    """Where the Minesweeper task comes from: generated here (default, smoke) or the published benchmark file
    in the heterophilous `.npz` schema (the `full` profile; stages.l2g_net.heterophilous)."""
    kind: Literal["generated", "heterophilous_npz"] = "generated"
    path: str | None = Field(None, description="the .npz file (relative to the repository root) for heterophilous_npz")

    @model_validator(mode="after")
    def _path(self):
        if self.kind == "heterophilous_npz" and not self.path:
            raise ValueError("path: kind heterophilous_npz needs the .npz file's path")
        return self


class TaskConfig(StageConfig):
    side: int = Field(24, ge=6, le=200, description="grid side; the paper's Minesweeper is 100 x 100")
    mine_fraction: float = Field(0.2, gt=0.0, le=0.5)
    hidden_fraction: Fraction = 0.5
    source: TaskSource = TaskSource()


class ParityConfig(StageConfig):
    side: int = Field(24, ge=6, le=200, description="grid side of the distance-to-source parity task")
    num_sources: int = Field(8, ge=1, le=1000)
    drop_fraction: float = Field(0.1, ge=0.0, le=0.4, description="grid edges removed (kept connected)")

    @model_validator(mode="after")
    def _fit(self):
        if self.num_sources > self.side * self.side // 4:
            raise ValueError(f"num_sources: {self.num_sources} sources on a {self.side} x {self.side} grid leave "
                             "no long-range structure (at most side^2 / 4)")
        return self


class Config(StageConfig):
    seed: Seed = 0
    suite_scale: int = Field(120, ge=16, le=5000, description="~nodes of the larger exactness-suite graphs")
    scaling: ScalingConfig = ScalingConfig()
    cut_blocks: int = Field(4, ge=2, le=64)
    cut_avg_degree: float = Field(10.0, gt=0, le=200)
    cut_n: int = Field(1000, ge=16, le=20000)
    cut_sizes: list[int] = Field(default_factory=lambda: [4, 8, 16, 32], min_length=3)
    task: TaskConfig = TaskConfig()
    parity: ParityConfig = ParityConfig()

    @model_validator(mode="after")
    def _cut(self):
        v = self.cut_sizes
        if any(x < 1 for x in v) or sorted(set(v)) != list(v):
            raise ValueError(f"cut_sizes: must be strictly increasing positive integers (got {v})")
        block = self.cut_n // self.cut_blocks
        if block < 8:
            raise ValueError(f"cut_n: cut_n / cut_blocks = {block} nodes per block; needs >= 8")
        if self.cut_avg_degree > block - 1:
            raise ValueError(f"cut_avg_degree: {self.cut_avg_degree} exceeds a block of {block} nodes")
        most = self.cut_blocks * block * block if self.cut_blocks > 2 else block * block
        if v[-1] > most:
            raise ValueError(f"cut_sizes: {v[-1]} bridges exceed the {most} distinct node pairs between "
                             f"consecutive blocks (the graph cannot have that many cut edges)")
        return self


def _save(path, L) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    sp.save_npz(path, sp.csr_matrix(L))


def run(cfg: Config, ctx: StageContext) -> None:
    with threadpool_limits(1):
        _run(cfg, ctx)


def _run(cfg: Config, ctx: StageContext) -> None:
    out = ctx.out
    manifest: dict = {"suite": {}, "scaling": [], "scaling_k": []}
    t = cfg.task
    if t.source.kind == "heterophilous_npz":   # read (and check) the real file before any other work
        (out / "task").mkdir(parents=True, exist_ok=True)
        manifest["task"] = _real_task(t.source.path, out / "task")
    for name, G in exactness_suite(cfg.seed, cfg.suite_scale).items():
        _save(out / "suite" / f"{name}.npz", laplacian(G))
        manifest["suite"][name] = {"n": G.number_of_nodes(), "edges": G.number_of_edges(),
                                   "components": nx.number_connected_components(G)}
    for fam in cfg.scaling.families:
        for n in cfg.scaling.sizes:
            G = ba_graph(n, cfg.scaling.ba_m, cfg.seed + n) if fam == "ba" else grid_graph(n)
            name = f"{fam}_n{n}.npz"
            _save(out / "scaling" / name, laplacian(G))
            manifest["scaling"].append({"file": name, "family": fam, "n": G.number_of_nodes(),
                                        "edges": G.number_of_edges()})
    block = cfg.cut_n // cfg.cut_blocks
    for k in cfg.cut_sizes:
        G = sbm_blocks(cfg.cut_blocks, block, cfg.cut_avg_degree, k, cfg.seed + 7 * k)
        _save(out / "scaling_k" / f"k{k}.npz", laplacian(G))
        manifest["scaling_k"].append({"file": f"k{k}.npz", "n": G.number_of_nodes(), "bridges": k,
                                      "block_size": block, "blocks": cfg.cut_blocks})

    # Part B: Minesweeper (generated, or the published benchmark file at `full`)
    if t.source.kind == "generated":
        (out / "task").mkdir(parents=True, exist_ok=True)
        ms = minesweeper(t.side, t.mine_fraction, t.hidden_fraction, cfg.seed + 1000)
        G = ms["graph"]
        sp.save_npz(out / "task" / "adjacency.npz",
                    sp.csr_matrix(nx.to_scipy_sparse_array(G, nodelist=range(G.number_of_nodes()), format="csr")))
        np.savez(out / "task" / "nodes.npz", x=ms["x"], y=ms["y"], counts=ms["counts"])
        manifest["task"] = {"name": "minesweeper", "source": "generated", "side": t.side, "n": G.number_of_nodes(),
                            "edges": G.number_of_edges(), "mines": int(ms["y"].sum()),
                            "hidden": int(ms["x"][:, 9].sum()), "edge_homophily": edge_homophily(G, ms["y"])}

    # Part B: distance-to-source parity (heterophilous, long range)
    q = cfg.parity
    sp_task = source_parity(q.side, q.num_sources, q.drop_fraction, cfg.seed + 2000)
    G = sp_task["graph"]
    (out / "parity").mkdir(parents=True, exist_ok=True)
    sp.save_npz(out / "parity" / "adjacency.npz",
                sp.csr_matrix(nx.to_scipy_sparse_array(G, nodelist=range(G.number_of_nodes()), format="csr")))
    np.savez(out / "parity" / "nodes.npz", x=sp_task["x"], y=sp_task["y"], distance=sp_task["distance"])
    manifest["parity"] = {"name": "source_parity", "side": q.side, "n": G.number_of_nodes(),
                          "edges": G.number_of_edges(), "sources": q.num_sources,
                          "max_distance": int(sp_task["distance"].max()),
                          "mean_distance": float(sp_task["distance"].mean()),
                          "positive_fraction": float(sp_task["y"].mean()),
                          "edge_homophily": edge_homophily(G, sp_task["y"]),
                          **parity_structure(G, sp_task["y"], sp_task["sources"], q.side)}
    write_json(out / "manifest.json", manifest)


def parity_structure(G: nx.Graph, y: np.ndarray, sources: np.ndarray, side: int) -> dict:
    """How the parity label is tied to the graph's structure (issue 54): the grid (with edges removed) is
    bipartite with colouring c(v) = (row + col) mod 2, so every path from v to a source s has length parity
    c(v) XOR c(s); the label is then c(v) XOR c(nearest source) on every node, and c is (up to D^(1/2)
    scaling) the eigenvector of the normalized Laplacian at its largest eigenvalue, 2. A spectral model with a
    high-pass filter reads the colouring off one eigenvector; a low-pass 1-hop model cannot."""
    from scipy.sparse.csgraph import laplacian as csgraph_laplacian

    n = G.number_of_nodes()
    colour = np.array([(v // side + v % side) % 2 for v in range(n)])
    dist, nearest = nx.multi_source_dijkstra(G, [int(s) for s in sources], weight=None)
    xor = np.array([colour[v] ^ colour[nearest[v][0]] for v in range(n)])
    A = nx.to_scipy_sparse_array(G, nodelist=range(n), weight=None, format="csr").astype(float)
    lam, vec = np.linalg.eigh(csgraph_laplacian(A.toarray(), normed=True))
    top = np.sign(vec[:, -1])
    agree = float(max(np.mean((top > 0) == (colour == 1)), np.mean((top > 0) == (colour == 0))))
    return {"bipartite": bool(nx.is_bipartite(G)), "label_is_colour_xor_source_colour": float(np.mean(xor == y)),
            "normalized_lambda_max": float(lam[-1]), "top_eigvec_sign_matches_colouring": agree}


def _real_task(path: str, out) -> dict:
    """The published benchmark graph (heterophilous `.npz`) as the Minesweeper task: adjacency, features,
    labels and its fixed splits (train uses split seed % S)."""
    from stages.common.paths import ROOT
    from stages.common.runner import MissingInputError
    from stages.l2g_net.heterophilous import HeterophilousFormatError, load_heterophilous_npz

    file = Path(path) if Path(path).is_absolute() else ROOT / path
    try:
        data = load_heterophilous_npz(file)
    except HeterophilousFormatError as err:
        raise MissingInputError(f"papers.l2g_net.prepare.task.source.path: {err}") from None
    if data["num_classes"] != 2:
        raise MissingInputError(f"papers.l2g_net.prepare.task.source.path: {data['name']} has {data['num_classes']} "
                                "classes; the pipeline's task is scored by ROC AUC (binary: minesweeper, tolokers, "
                                "questions)")
    sp.save_npz(out / "adjacency.npz", data["adjacency"])
    np.savez(out / "nodes.npz", x=data["x"], y=data["y"])
    np.savez(out / "splits.npz", **data["splits"])
    G = nx.from_scipy_sparse_array(data["adjacency"])
    return {"name": data["name"], "source": str(path), "n": int(data["x"].shape[0]), "edges": int(len(data["edges"])),
            "features": int(data["x"].shape[1]), "positives": int(data["y"].sum()),
            "splits": int(data["splits"]["train"].shape[0]), "edge_homophily": edge_homophily(G, data["y"])}
