"""train: factorize the task graph (L2G) and train L2G-Net and its baselines with Lightning.

Models (all regress y = exp(-tL) s from s, node by node, on whole-graph signals):
  l2g       L2G-Net: local spline filters on the subgraph spectra -> Cauchy chain -> global spline
            filter -> inverse, gated residual (the factorization from stages/l2g_net/gft.py)
  full_gft  the same spectral layer on the dense eigh basis (no local stage)
  chebnet   ChebConv layers of order ``cheb_k`` (cheb_k - 1 hops each)
  gcn       GCN layers (one hop each)

    python -m stages train l2g_net
"""
from __future__ import annotations

import pickle
import time
from typing import Literal

import numpy as np
import scipy.linalg
import scipy.sparse as sp
import torch
from pydantic import Field
from threadpoolctl import threadpool_limits
from torch.utils.data import DataLoader, TensorDataset

from stages.common.config import StageConfig
from stages.common.paths import write_json
from stages.common.runner import StageContext
from stages.common.trainer import TrainerConfig, make_trainer
from stages.l2g_net.gft import factorize
from stages.l2g_net.model import SignalRegression, build_model, count_parameters

ModelKind = Literal["l2g", "full_gft", "chebnet", "gcn"]


class ModelSizes(StageConfig):
    spectral_hidden: int = Field(8, ge=1, description="channels of l2g / full_gft")
    spectral_layers: int = Field(1, ge=1)
    num_basis: int = Field(12, ge=4, description="cubic B-spline basis functions per spectral filter")
    local_hidden: int = Field(32, ge=1, description="channels of chebnet / gcn")
    cheb_k: int = Field(4, ge=1, description="Chebyshev order K (K-1 hops per layer)")
    cheb_layers: int = Field(1, ge=1)
    gcn_layers: int = Field(3, ge=1)


class Config(StageConfig):
    seed: int = 0
    models: list[ModelKind] = Field(default_factory=lambda: ["l2g", "full_gft", "chebnet", "gcn"], min_length=1)
    sizes: ModelSizes = ModelSizes()
    min_part_size: int = Field(32, ge=1, description="partitioner: smallest part it may create")
    max_cut_fraction: float = Field(1 / 16, gt=0, le=1, description="partitioner: split only if cut <= this * size")
    batch_size: int = Field(32, ge=1)
    lr: float = Field(1e-2, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    trainer: TrainerConfig = TrainerConfig(max_epochs=40, precision="64-true", log_every_n_steps=5)


def model_kwargs(cfg: Config) -> dict:
    s = cfg.sizes
    return {"l2g": dict(hidden=s.spectral_hidden, num_layers=s.spectral_layers),
            "full_gft": dict(hidden=s.spectral_hidden, num_layers=s.spectral_layers),
            "chebnet": dict(hidden=s.local_hidden, num_layers=s.cheb_layers),
            "gcn": dict(hidden=s.local_hidden, num_layers=s.gcn_layers)}


def run(cfg: Config, ctx: StageContext) -> None:
    torch.set_num_threads(1)
    with threadpool_limits(1):
        _run(cfg, ctx)


def _run(cfg: Config, ctx: StageContext) -> None:
    prep = ctx.input("prepare")
    L = sp.load_npz(prep / "task" / "laplacian.npz").tocsr()
    data = np.load(prep / "task" / "signals.npz")
    t0 = time.perf_counter()
    fact = factorize(L, min_part_size=cfg.min_part_size, max_cut_fraction=cfg.max_cut_fraction)
    fact_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    lam, U = scipy.linalg.eigh(L.toarray())
    eigh_s = time.perf_counter() - t0
    with open(ctx.out / "factorization.pkl", "wb") as fh:
        pickle.dump(fact, fh)
    np.savez(ctx.out / "eigh.npz", lam=lam, U=U)

    S, Y = torch.tensor(data["S"]), torch.tensor(data["Y"])
    train = TensorDataset(S[data["train"]], Y[data["train"]])
    val = TensorDataset(S[data["val"]], Y[data["val"]])
    summary = {"factorize_s": fact_s, "eigh_s": eigh_s, "num_parts": len(fact.parts),
               "num_cut_edges": int(len(fact.cut_edges)),
               "eigenvalue_rel_err": float(np.abs(fact.eigenvalues - lam).max() / np.abs(lam).max()),
               "models": {}}
    (ctx.out / "models").mkdir()
    kw = model_kwargs(cfg)
    for kind in cfg.models:
        torch.manual_seed(cfg.seed)
        model = build_model(kind, fact=fact, U=U, lam=lam, L=L, num_basis=cfg.sizes.num_basis,
                            cheb_k=cfg.sizes.cheb_k, backend="torch", **kw[kind])
        module = SignalRegression(model, lr=cfg.lr, weight_decay=cfg.weight_decay)
        trainer = make_trainer(cfg.trainer, ctx.tracker)
        gen = torch.Generator().manual_seed(cfg.seed)
        t0 = time.perf_counter()
        trainer.fit(module, DataLoader(train, batch_size=cfg.batch_size, shuffle=True, generator=gen),
                    DataLoader(val, batch_size=len(val)))
        torch.save(model.state_dict(), ctx.out / "models" / f"{kind}.pt")
        summary["models"][kind] = {"params": count_parameters(model), "fit_s": time.perf_counter() - t0,
                                   "history": module.history, **kw[kind]}
        print(f"[l2g_net] {kind}: {summary['models'][kind]['params']} params, "
              f"final val mse {module.history[-1]['val_mse'] if module.history else float('nan'):.4g}")
    summary["config"] = cfg.model_dump(mode="json")
    write_json(ctx.out / "train_summary.json", summary)
