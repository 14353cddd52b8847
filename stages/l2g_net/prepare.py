"""prepare: the graphs of Part A (exactness suite, scaling families) and the long-range task of Part B.

Part A
  suite/       graphs that stress exactness: SBM halves, weighted Barabasi-Albert halves, grids
               joined by bridges, disjoint identical copies + stars + complete graphs + isolated
               nodes, weighted multi-component graphs (weights over 6 decades), a hypercube.
  scaling_n/   ``scaling_blocks`` random blocks of mean degree ``scaling_avg_degree`` joined in a
               ring by ``scaling_bridges`` bridges, for n in ``scaling_sizes``.
  scaling_k/   the same family at n = ``cut_n`` for each number of bridges in ``cut_sizes``.
Part B
  task/        one graph of ``task.num_blocks`` dense blocks joined by ``task.bridges`` bridges;
               node signals s ~ N(0, I) and targets y = exp(-t L) s (heat diffusion at a large time
               t = ``diffusion_time_over_fiedler`` / lambda_2, so every node's target depends on
               blocks many hops away), standardized by the training targets' std.

    python -m stages prepare l2g_net
"""
from __future__ import annotations

import networkx as nx
import numpy as np
import scipy.sparse as sp
from pydantic import Field, model_validator
from scipy.sparse.linalg import eigsh, expm_multiply
from threadpoolctl import threadpool_limits

from stages.common.config import StageConfig
from stages.common.paths import write_json
from stages.common.runner import StageContext
from stages.l2g_net.graphs import exactness_suite, laplacian, sbm_blocks


class TaskConfig(StageConfig):
    num_blocks: int = Field(4, ge=2, description="dense blocks, joined in a ring")
    block_size: int = Field(64, ge=8)
    avg_degree: float = Field(16.0, gt=0)
    bridges: int = Field(4, ge=1, description="edges between consecutive blocks (ring), in total")
    diffusion_time_over_fiedler: float = Field(2.0, gt=0, description="t * lambda_2 of the heat kernel")
    num_train: int = Field(512, ge=8)
    num_val: int = Field(128, ge=4)
    num_test: int = Field(256, ge=4)

    @model_validator(mode="after")
    def _degree_fits(self):
        if self.avg_degree > self.block_size - 1:
            raise ValueError(f"avg_degree ({self.avg_degree}) must be <= block_size - 1 ({self.block_size - 1})")
        if self.bridges < self.num_blocks - 1:
            raise ValueError(f"bridges ({self.bridges}) must be >= num_blocks - 1 ({self.num_blocks - 1}) "
                             "so that the task graph is connected")
        return self


class Config(StageConfig):
    seed: int = 0
    suite_scale: int = Field(120, ge=16, le=5000, description="~nodes of the larger exactness-suite graphs")
    scaling_sizes: list[int] = Field(default_factory=lambda: [250, 500, 1000, 1500, 2000], min_length=3)
    scaling_blocks: int = Field(4, ge=2)
    scaling_avg_degree: float = Field(10.0, gt=0)
    scaling_bridges: int = Field(8, ge=1)
    cut_n: int = Field(1000, ge=16)
    cut_sizes: list[int] = Field(default_factory=lambda: [4, 8, 16, 32], min_length=3)
    task: TaskConfig = TaskConfig()

    @model_validator(mode="after")
    def _sizes(self):
        for name in ("scaling_sizes", "cut_sizes"):
            vals = getattr(self, name)
            if any(v < 1 for v in vals) or sorted(set(vals)) != list(vals):
                raise ValueError(f"{name} must be strictly increasing positive integers (got {vals})")
        small = self.scaling_sizes[0] // self.scaling_blocks
        if small < 8:
            raise ValueError(f"scaling_sizes[0] / scaling_blocks = {small} nodes per block; needs >= 8")
        if self.scaling_avg_degree > small - 1:
            raise ValueError(f"scaling_avg_degree ({self.scaling_avg_degree}) exceeds the smallest block "
                             f"({small} nodes)")
        if self.cut_n // self.scaling_blocks < 8:
            raise ValueError(f"cut_n / scaling_blocks must be >= 8 (got {self.cut_n // self.scaling_blocks})")
        return self


def _save(path, L) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    sp.save_npz(path, sp.csr_matrix(L))


def run(cfg: Config, ctx: StageContext) -> None:
    with threadpool_limits(1):
        _run(cfg, ctx)


def _run(cfg: Config, ctx: StageContext) -> None:
    out = ctx.out
    manifest: dict = {"suite": {}, "scaling_n": [], "scaling_k": []}
    for name, G in exactness_suite(cfg.seed, cfg.suite_scale).items():
        _save(out / "suite" / f"{name}.npz", laplacian(G))
        manifest["suite"][name] = {"n": G.number_of_nodes(), "edges": G.number_of_edges(),
                                   "components": nx.number_connected_components(G)}
    for n in cfg.scaling_sizes:
        G = sbm_blocks(cfg.scaling_blocks, n // cfg.scaling_blocks, cfg.scaling_avg_degree, cfg.scaling_bridges,
                       cfg.seed + n)
        _save(out / "scaling_n" / f"n{n}.npz", laplacian(G))
        manifest["scaling_n"].append({"file": f"n{n}.npz", "n": G.number_of_nodes(), "bridges": cfg.scaling_bridges})
    for k in cfg.cut_sizes:
        G = sbm_blocks(cfg.scaling_blocks, cfg.cut_n // cfg.scaling_blocks, cfg.scaling_avg_degree, k,
                       cfg.seed + 7 * k)
        _save(out / "scaling_k" / f"k{k}.npz", laplacian(G))
        manifest["scaling_k"].append({"file": f"k{k}.npz", "n": G.number_of_nodes(), "bridges": k})

    # Part B: long-range node regression by heat diffusion over a block graph
    t = cfg.task
    G = sbm_blocks(t.num_blocks, t.block_size, t.avg_degree, t.bridges, cfg.seed + 1000)
    L = laplacian(G)
    n = L.shape[0]
    lam2 = float(np.sort(eigsh(sp.csc_matrix(L), k=2, sigma=-1e-3, which="LM",
                               v0=np.cos(np.arange(n) + 0.3))[0])[1])
    time = t.diffusion_time_over_fiedler / lam2
    rng = np.random.default_rng(cfg.seed)
    total = t.num_train + t.num_val + t.num_test
    S = rng.normal(size=(total, n))
    Y = expm_multiply(-time * L, S.T).T      # y = exp(-t L) s, independent of any eigendecomposition
    Y /= Y[: t.num_train].std()
    _save(out / "task" / "laplacian.npz", L)
    np.savez(out / "task" / "signals.npz", S=S, Y=Y,
             train=np.arange(t.num_train), val=np.arange(t.num_train, t.num_train + t.num_val),
             test=np.arange(t.num_train + t.num_val, total))
    manifest["task"] = {"n": n, "edges": G.number_of_edges(), "lambda2": lam2, "diffusion_time": time,
                        "num_blocks": t.num_blocks, "bridges": t.bridges}
    write_json(out / "manifest.json", manifest)
