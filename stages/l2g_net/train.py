"""train: factorize each task's graph (L2G) and train L2G-Net and its baselines with Lightning.

Tasks (``tasks``): Minesweeper and the distance-to-source parity task (prepare); outputs per task
under train/<task>/ (spectral.npz, models/), one train_summary.json with summary["tasks"][task].

The graph is split into ``num_parts`` parts by recursive bisection (METIS through pymetis when
installed, else spectral; the paper: 2 parts, METIS); its cut is optionally sparsified to ``target_cut`` edges per bisection by effective-resistance
sampling (the official code: target cut 1 on Minesweeper), and the resulting Laplacian is factorized
exactly. The Cauchy chain is materialized once as the (n, n) ``basis_cauchy`` (as the official
training does) by applying every factor to the identity through kernels/cauchy_apply.

Models (same skeleton, matched parameter counts: each baseline's width is chosen so that its
parameter count is closest to L2G-Net's):
  l2g       L2G-Net: local spline banks -> Cauchy chain -> global spline bank -> inverse, gated steps, FF
  full_gft  the global spline bank on the dense eigh basis of the true Laplacian
  chebnet   Chebyshev filters of order ``cheb_k``; chebnet_long of order ``cheb_k_long`` (20)
  gcn, gin  one-hop message passing

Every model x seed: the seed fixes the 50/25/25 node split and the initialization; the state with
the best validation ROC AUC (checked every ``eval_every`` steps) is kept.

    python -m stages train l2g_net
"""
from __future__ import annotations

import time
from typing import Literal

import numpy as np
import scipy.linalg
import scipy.sparse as sp
import torch
from pydantic import Field, field_validator, model_validator
from scipy.sparse.csgraph import laplacian as csgraph_laplacian
from threadpoolctl import threadpool_limits

from kernels.record import KernelRecord
from stages.common.config import Fraction, Probability, Seeds, StageConfig, unique_items
from stages.common.device import DeviceName, pick_device
from stages.common.paths import write_json
from stages.common.runner import StageContext
from stages.common.trainer import TrainerConfig, make_trainer
from stages.l2g_net.gft import bisection_parts, factorize, resolve_partitioner, sparsify_cut
from stages.l2g_net.kernel_path import kernel_cauchy
from stages.l2g_net.model import NodeTask, build_model, count_parameters, matched_dim

ModelKind = Literal["l2g", "full_gft", "chebnet", "chebnet_long", "gcn", "gin"]
TaskKind = Literal["minesweeper", "parity"]


class Config(StageConfig):
    tasks: list[TaskKind] = Field(default_factory=lambda: ["minesweeper", "parity"], min_length=1)
    seeds: Seeds = Field(default_factory=lambda: [0, 1, 2])
    models: list[ModelKind] = Field(default_factory=lambda: ["l2g", "full_gft", "chebnet", "chebnet_long", "gcn", "gin"],
                                    min_length=1)
    laplacian: Literal["normalized", "combinatorial"] = "normalized"
    partitioner: Literal["auto", "metis", "spectral"] = Field(
        "auto", description="recursive bisection: METIS (pymetis) when installed, else spectral")
    num_parts: int = Field(2, ge=1, le=64, description="parts of the recursive bisection (the paper: 2)")
    target_cut: int | None = Field(8, ge=1, le=100000,
                                   description="cut edges kept per bisection (None: every cut edge, exact for L)")
    dim: int = Field(32, ge=4, le=512, description="L2G-Net width; baselines are matched in parameters")
    num_layers: int = Field(4, ge=1, le=32)
    num_basis: int = Field(8, ge=4, le=64, description="cubic B-spline basis functions per filter bank")
    cheb_k: int = Field(8, ge=2, le=32, description="ChebNet order K (K-1 hops per layer)")
    cheb_k_long: int = Field(20, ge=2, le=64, description="order of the second ChebNet, chebnet_long")
    dropout: Probability = 0.2
    lr: float = Field(3e-3, gt=0, le=1.0)
    spectral_lr_mult: float = Field(16.0, gt=0, le=1000, description="lr multiplier of the spline coefficients")
    weight_decay: float = Field(0.0, ge=0, le=1.0)
    eval_every: int = Field(10, ge=1, le=10000)
    train_fraction: Fraction = 0.5
    val_fraction: Fraction = 0.25
    device: DeviceName = "auto"
    trainer: TrainerConfig = TrainerConfig(max_steps=300, precision="32-true", log_every_n_steps=10,
                                           enable_progress_bar=False)

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v):
        return unique_items(v, "seeds")

    @field_validator("tasks")
    @classmethod
    def _tasks(cls, v):
        return unique_items(v, "tasks")

    @field_validator("models")
    @classmethod
    def _models(cls, v):
        return unique_items(v, "models")

    @model_validator(mode="after")
    def _check(self):
        if self.train_fraction + self.val_fraction >= 1:
            raise ValueError(f"val_fraction: train_fraction + val_fraction must be < 1 (got "
                             f"{self.train_fraction} + {self.val_fraction})")
        if not 1 <= self.trainer.max_steps <= 20000:
            raise ValueError(f"trainer.max_steps: must be in [1, 20000] (got {self.trainer.max_steps}); "
                             "use the full profile for longer runs")
        if self.trainer.precision not in ("32-true", "64-true"):
            raise ValueError(f"trainer.precision: the spectral bases are fp32/fp64 (got {self.trainer.precision})")
        return self


def task_laplacian(A: sp.csr_matrix, kind: str) -> sp.csr_matrix:
    return sp.csr_matrix(csgraph_laplacian(A.astype(np.float64), normed=(kind == "normalized")))


def spectral_tensors(cfg: Config, A: sp.csr_matrix, rec: KernelRecord, device: torch.device) -> tuple[dict, dict]:
    """Parts, sparsified cut, exact factorization and its chain matrix; plus the dense eigh reference."""
    L = task_laplacian(A, cfg.laplacian)
    t0 = time.process_time()
    parts, splits = bisection_parts(L, cfg.num_parts, method=cfg.partitioner)
    if cfg.target_cut is not None and cfg.num_parts > 1:
        Ls, sinfo = sparsify_cut(L, parts, splits, cfg.target_cut, seed=cfg.seeds[0])
    else:
        Ls, sinfo = L, {"cut_edges_before": None, "cut_edges_after": None, "target_cut": None}
    fact = factorize(Ls, parts)
    t1 = time.process_time()
    chain = fact.chain_matrix(cauchy=kernel_cauchy(rec, device))     # basis_cauchy through the kernel
    t2 = time.process_time()
    lam, U = scipy.linalg.eigh(L.toarray())
    lam_s = scipy.linalg.eigvalsh(Ls.toarray())
    t3 = time.process_time()
    scale = float(np.abs(lam).max())
    spec = {"parts": [p.astype(np.int64) for p in fact.parts], "local_bases": fact.local_bases,
            "local_eigenvalues": [fact.local_eigenvalues[o:o + p.size] for o, p in zip(fact.offsets, fact.parts)],
            "eigenvalues": fact.eigenvalues, "chain": chain, "U": U, "lam": lam, "A": A}
    info = {"n": int(L.shape[0]), "laplacian": cfg.laplacian, "num_parts": len(fact.parts),
            "part_sizes": [int(p.size) for p in fact.parts], "cut_edges_total": sinfo["cut_edges_before"],
            "cut_edges_kept": int(len(fact.cut_edges)), "target_cut": cfg.target_cut,
            "eig_err_vs_sparsified": float(np.abs(fact.eigenvalues - lam_s).max() / max(np.abs(lam_s).max(), 1e-300)),
            "eig_err_vs_true_L": float(np.abs(fact.eigenvalues - lam).max() / scale),
            "chain_orthogonality": float(np.abs(chain.T @ chain - np.eye(L.shape[0])).max()),
            "factorize_s": t1 - t0, "chain_s": t2 - t1, "eigh_s": t3 - t2,
            "partitioner_fallback": fact.fallback, "partitioner": resolve_partitioner(cfg.partitioner)}
    return spec, info


def node_split(n: int, seed: int, train: float, val: float) -> dict[str, np.ndarray]:
    perm = np.random.default_rng(seed).permutation(n)
    a, b = int(round(train * n)), int(round((train + val) * n))
    masks = {}
    for name, idx in (("train", perm[:a]), ("val", perm[a:b]), ("test", perm[b:])):
        m = np.zeros(n, dtype=bool)
        m[idx] = True
        masks[name] = m
    return masks


def run(cfg: Config, ctx: StageContext) -> None:
    torch.set_num_threads(1)
    with threadpool_limits(1):
        _run(cfg, ctx)


TASK_DIRS = {"minesweeper": "task", "parity": "parity"}


def load_spec(npz_path, A) -> dict:
    """The spectral tensors saved by train (for evaluate)."""
    d = np.load(npz_path)
    k = len(d["part_sizes"])
    return {"parts": [d[f"part{i}"] for i in range(k)], "local_bases": [d[f"basis{i}"] for i in range(k)],
            "local_eigenvalues": [d[f"lam{i}"] for i in range(k)], "eigenvalues": d["eigenvalues"],
            "chain": d["chain"], "U": d["U"], "lam": d["lam"], "A": A}


def _run(cfg: Config, ctx: StageContext) -> None:
    device = pick_device(cfg.device)
    rec = KernelRecord(device)
    prep = ctx.input("prepare")
    summary = {"tasks": {}}
    for task in cfg.tasks:
        summary["tasks"][task] = _train_task(cfg, ctx, rec, device, prep / TASK_DIRS[task], ctx.out / task, task)
    summary["config"] = cfg.model_dump(mode="json")
    write_json(ctx.out / "train_summary.json", summary)
    rec.save(ctx.out)


def _train_task(cfg: Config, ctx: StageContext, rec: KernelRecord, device, src, out, task: str) -> dict:
    out.mkdir(parents=True)
    A = sp.load_npz(src / "adjacency.npz").tocsr()
    nodes = np.load(src / "nodes.npz")
    spec, info = spectral_tensors(cfg, A, rec, device)
    np.savez(out / "spectral.npz", chain=spec["chain"], U=spec["U"], lam=spec["lam"],
             eigenvalues=spec["eigenvalues"], part_sizes=np.array(info["part_sizes"]),
             **{f"part{k}": p for k, p in enumerate(spec["parts"])},
             **{f"basis{k}": Q for k, Q in enumerate(spec["local_bases"])},
             **{f"lam{k}": v for k, v in enumerate(spec["local_eigenvalues"])})
    n = A.shape[0]
    x = torch.tensor(nodes["x"], dtype=torch.float32)
    y = torch.tensor(nodes["y"], dtype=torch.long)
    kw = dict(in_features=x.shape[1], num_layers=cfg.num_layers, num_basis=cfg.num_basis, dropout=cfg.dropout,
              cheb_k=cfg.cheb_k, cheb_k_long=cfg.cheb_k_long)
    count = lambda kind, d: count_parameters(build_model(kind, spec, dim=d, **kw))  # noqa: E731
    target = count("l2g", cfg.dim)
    dims = {k: (cfg.dim if k == "l2g" else matched_dim(k, target, count)) for k in cfg.models}
    accel = "gpu" if device.type == "cuda" else "cpu"
    tcfg = cfg.trainer.model_copy(update={"accelerator": accel, "devices": 1})
    (out / "models").mkdir()
    summary = {"graph": info, "dims": dims, "params_target": target, "runs": {}}
    for kind in cfg.models:
        summary["runs"][kind] = []
        for seed in cfg.seeds:
            masks = node_split(n, seed, cfg.train_fraction, cfg.val_fraction)
            torch.manual_seed(seed)
            model = build_model(kind, spec, dim=dims[kind], **kw)
            module = NodeTask(model, x, y, {k: torch.as_tensor(v) for k, v in masks.items()}, lr=cfg.lr,
                              weight_decay=cfg.weight_decay, spectral_lr_mult=cfg.spectral_lr_mult,
                              eval_every=cfg.eval_every)
            trainer = make_trainer(tcfg, ctx.tracker)
            loader = torch.utils.data.DataLoader([0], batch_size=1)
            t0 = time.process_time()
            trainer.fit(module, loader)
            fit_s = time.process_time() - t0
            torch.save(module.best["state"], out / "models" / f"{kind}_seed{seed}.pt")
            summary["runs"][kind].append({"seed": seed, "params": count_parameters(model), "dim": dims[kind],
                                          "best_val_auc": module.best["val_auc"], "best_step": module.best["step"],
                                          "fit_cpu_s": fit_s, "history": module.history})
            print(f"[l2g_net] {task} {kind} seed {seed}: {count_parameters(model)} params, best val AUC "
                  f"{module.best['val_auc']:.4f} at step {module.best['step']}", flush=True)
    return summary
