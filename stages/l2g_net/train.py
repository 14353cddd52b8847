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
            (the chain of the cut-sparsified graph: the paper's and the official code's setting)
  l2g_exact the same L2G-Net on the exact factorization of the true L (every cut edge kept): the control
            arm that separates the price of sparsification from the model
  full_gft  the global spline bank on the dense eigh basis of the true Laplacian
  chebnet   Chebyshev filters of order ``cheb_k``; chebnet_long of order ``cheb_k_long`` (20)
  gcn, gin  one-hop message passing

Every model x seed: the seed fixes the 50/25/25 node split (or picks split seed mod S of a benchmark
file's fixed splits), the initialization and the dropout masks (its own generator); the state with the best
validation ROC AUC (checked every ``eval_every`` steps) is kept. The seeds of a (task, model) train as one
vectorized ensemble (``vectorize_seeds``: ``NodeTaskEnsemble``, each seed the same computation as its solo run,
equal to float rounding over short runs; over 300 steps ChebNet and GIN amplify the rounding as any two builds
would), or one by one (``NodeTask``). A result's ``fit_cpu_s`` is its share of its job's fit (the job's / seeds). The (task, model) jobs (or (task, model, seed) jobs) go to ``workers``
single-threaded processes; each seed is seeded on its own, so the results do not depend on the number of workers.

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
from stages.common.jobs import payload, run_jobs
from stages.common.paths import write_json
from stages.common.runner import StageContext
from stages.common.trainer import TrainerConfig, make_trainer
from stages.l2g_net.gft import bisection_parts, factorize, resolve_partitioner, sparsify_cut
from stages.l2g_net.kernel_path import kernel_cauchy
from stages.l2g_net.model import NodeTask, NodeTaskEnsemble, build_model, count_parameters, matched_dim

ModelKind = Literal["l2g", "l2g_exact", "full_gft", "chebnet", "chebnet_long", "gcn", "gin"]
TaskKind = Literal["minesweeper", "parity"]


class Config(StageConfig):
    tasks: list[TaskKind] = Field(default_factory=lambda: ["minesweeper", "parity"], min_length=1)
    seeds: Seeds = Field(default_factory=lambda: [0, 1, 2])
    models: list[ModelKind] = Field(default_factory=lambda: ["l2g", "l2g_exact", "full_gft", "chebnet", "chebnet_long",
                                                             "gcn", "gin"], min_length=1)
    workers: int = Field(1, ge=1, le=64, description="processes training (task, model) jobs in parallel, one "
                         "thread each; every seed is seeded on its own, so results do not depend on this")
    vectorize_seeds: bool = Field(True, description="train a (task, model)'s seeds as one vectorized ensemble "
                                  "(per seed the solo run's computation, equal to float rounding; ~1.2x less CPU here)")
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
    """Parts, sparsified cut, exact factorization and its chain matrix; the exact-cut control (every cut edge
    kept: the basis of the true L) on the same parts; plus the dense eigh reference."""
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
    exact = factorize(L, parts) if Ls is not L else fact               # control arm: every cut edge kept
    chain_exact = exact.chain_matrix(cauchy=kernel_cauchy(rec, device)) if exact is not fact else chain
    t4 = time.process_time()
    scale = float(np.abs(lam).max())

    def tensors(f, ch):
        return {"parts": [p.astype(np.int64) for p in f.parts], "local_bases": f.local_bases,
                "local_eigenvalues": [f.local_eigenvalues[o:o + p.size] for o, p in zip(f.offsets, f.parts)],
                "eigenvalues": f.eigenvalues, "chain": ch}

    spec = {**tensors(fact, chain), "exact": tensors(exact, chain_exact), "U": U, "lam": lam, "A": A}
    info = {"n": int(L.shape[0]), "laplacian": cfg.laplacian, "num_parts": len(fact.parts),
            "part_sizes": [int(p.size) for p in fact.parts], "cut_edges_total": sinfo["cut_edges_before"],
            "cut_edges_kept": int(len(fact.cut_edges)), "target_cut": cfg.target_cut,
            "eig_err_vs_sparsified": float(np.abs(fact.eigenvalues - lam_s).max() / max(np.abs(lam_s).max(), 1e-300)),
            "eig_err_vs_true_L": float(np.abs(fact.eigenvalues - lam).max() / scale),
            "chain_orthogonality": float(np.abs(chain.T @ chain - np.eye(L.shape[0])).max()),
            "exact_cut_edges": int(len(exact.cut_edges)),
            "exact_eig_err_vs_true_L": float(np.abs(exact.eigenvalues - lam).max() / scale),
            "exact_chain_orthogonality": float(np.abs(chain_exact.T @ chain_exact - np.eye(L.shape[0])).max()),
            "factorize_s": t1 - t0, "chain_s": t2 - t1, "eigh_s": t3 - t2, "exact_factorize_s": t4 - t3,
            "partitioner_fallback": fact.fallback, "partitioner": resolve_partitioner(cfg.partitioner)}
    return spec, info


def node_split(n: int, seed: int, train: float, val: float, fixed: dict | None = None) -> dict[str, np.ndarray]:
    """Train/val/test node masks of one seed: the seed's random 50/25/25 split, or split ``seed % S`` of the
    dataset's fixed splits (``fixed``: {"train", "val", "test"} of shape (S, n), the benchmark files' 10)."""
    if fixed is not None:
        s = seed % fixed["train"].shape[0]
        return {k: np.asarray(fixed[k][s], dtype=bool) for k in ("train", "val", "test")}
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
    local = {"parts": [d[f"part{i}"] for i in range(k)], "local_bases": [d[f"basis{i}"] for i in range(k)],
             "local_eigenvalues": [d[f"lam{i}"] for i in range(k)]}
    return {**local, "eigenvalues": d["eigenvalues"], "chain": d["chain"], "U": d["U"], "lam": d["lam"], "A": A,
            "exact": {**local, "eigenvalues": d["eigenvalues_exact"], "chain": d["chain_exact"]}}


def load_splits(task_dir) -> dict | None:
    """The dataset's fixed splits (task/splits.npz, written for a benchmark file), or None (random per seed)."""
    f = task_dir / "splits.npz"
    if not f.exists():
        return None
    d = np.load(f)
    return {k: d[k] for k in ("train", "val", "test")}


def _run(cfg: Config, ctx: StageContext) -> None:
    device = pick_device(cfg.device)
    rec = KernelRecord(device)
    prep = ctx.input("prepare")
    summary: dict = {"tasks": {}}
    payloads, jobs = {}, []
    for task in cfg.tasks:      # factorize every task's graph first, then train every (task, model, seed) run
        summary["tasks"][task], payloads[task], task_jobs = _prepare_task(cfg, rec, device, prep / TASK_DIRS[task],
                                                                          ctx.out / task, task)
        jobs += task_jobs
    results = run_jobs(_run_job, jobs, payloads, cfg.workers)
    for (task, kind, _, _), runs in zip(jobs, results):
        for r in runs:
            seed = r["seed"]
            summary["tasks"][task]["runs"][kind].append(r)
            for e in r["history"]:
                ctx.tracker.log({f"{task}/{kind}/seed{seed}/val_auc": e["val_auc"],
                                 f"{task}/{kind}/seed{seed}/train_bce": e["train_bce"]})
            print(f"[l2g_net] {task} {kind} seed {seed}: {r['params']} params, best val AUC "
                  f"{r['best_val_auc']:.4f} at step {r['best_step']}", flush=True)
    summary["config"] = cfg.model_dump(mode="json")
    write_json(ctx.out / "train_summary.json", summary)
    rec.save(ctx.out)


def _prepare_task(cfg: Config, rec: KernelRecord, device, src, out, task: str) -> tuple[dict, dict, list]:
    """Factorize the task's graph (sparsified cut, exact cut, dense reference), match the widths; returns the
    task's summary skeleton, the payload its runs need and its (task, model, seed, width) jobs."""
    out.mkdir(parents=True)
    A = sp.load_npz(src / "adjacency.npz").tocsr()
    nodes = np.load(src / "nodes.npz")
    spec, info = spectral_tensors(cfg, A, rec, device)
    np.savez(out / "spectral.npz", chain=spec["chain"], U=spec["U"], lam=spec["lam"],
             eigenvalues=spec["eigenvalues"], part_sizes=np.array(info["part_sizes"]),
             chain_exact=spec["exact"]["chain"], eigenvalues_exact=spec["exact"]["eigenvalues"],
             **{f"part{k}": p for k, p in enumerate(spec["parts"])},
             **{f"basis{k}": Q for k, Q in enumerate(spec["local_bases"])},
             **{f"lam{k}": v for k, v in enumerate(spec["local_eigenvalues"])})
    x = np.asarray(nodes["x"], dtype=np.float32)
    y = np.asarray(nodes["y"], dtype=np.int64)
    kw = model_kwargs(cfg, x.shape[1])
    count = lambda kind, d: count_parameters(build_model(kind, spec, dim=d, **kw))  # noqa: E731
    target = count("l2g", cfg.dim)
    dims = {k: (cfg.dim if k in ("l2g", "l2g_exact") else matched_dim(k, target, count)) for k in cfg.models}
    (out / "models").mkdir()
    fixed = load_splits(src)
    payload = {"cfg": cfg.model_dump(mode="json"), "spec": spec, "x": x, "y": y, "fixed": fixed,
               "out": str(out / "models"), "device": str(device)}
    summary = {"graph": info, "dims": dims, "params_target": target, "runs": {k: [] for k in cfg.models},
               "splits": "fixed (dataset)" if fixed is not None else "random 50/25/25 per seed"}
    groups = [tuple(cfg.seeds)] if cfg.vectorize_seeds else [(seed,) for seed in cfg.seeds]
    return summary, payload, [(task, kind, seeds, dims[kind]) for kind in cfg.models for seeds in groups]


def model_kwargs(cfg: Config, in_features: int) -> dict:
    return dict(in_features=in_features, num_layers=cfg.num_layers, num_basis=cfg.num_basis, dropout=cfg.dropout,
                cheb_k=cfg.cheb_k, cheb_k_long=cfg.cheb_k_long)


# --- one (task, model) job over its seeds; in this process or in a worker process of stages/common/jobs.py ------
def _run_job(job: tuple) -> list[dict]:
    """Train ``seeds`` of one (task, model): one vectorized ensemble (``vectorize_seeds``) or a single seed's
    ``NodeTask``. Returns one result per seed; saves each seed's best state as <kind>_seed<seed>.pt."""
    task, kind, seeds, dim = job
    p = payload()[task]
    cfg = Config.model_validate(p["cfg"])
    x, y = torch.tensor(p["x"]), torch.tensor(p["y"])
    splits = [node_split(x.shape[0], seed, cfg.train_fraction, cfg.val_fraction, p["fixed"]) for seed in seeds]
    kw = model_kwargs(cfg, x.shape[1])
    make_model = lambda seed: build_model(kind, p["spec"], dim=dim, **kw)  # noqa: E731 (seeded by the caller)
    hp = dict(lr=cfg.lr, weight_decay=cfg.weight_decay, spectral_lr_mult=cfg.spectral_lr_mult, eval_every=cfg.eval_every)
    if cfg.vectorize_seeds:
        masks = {k: torch.as_tensor(np.stack([s[k] for s in splits])) for k in ("train", "val", "test")}
        module = NodeTaskEnsemble(make_model, list(seeds), x, y, masks, **hp)
    else:
        if len(seeds) != 1:
            raise ValueError(f"a solo job trains one seed (got {list(seeds)})")
        torch.manual_seed(seeds[0])                    # the seed fixes the split and the initialization
        module = NodeTask(make_model(seeds[0]), x, y, {k: torch.as_tensor(v) for k, v in splits[0].items()},
                          dropout_seed=seeds[0], **hp)
    device = torch.device(p["device"])
    tcfg = cfg.trainer.model_copy(update={"accelerator": "gpu" if device.type == "cuda" else "cpu", "devices": 1})
    trainer = make_trainer(tcfg, None)
    loader = torch.utils.data.DataLoader([0], batch_size=1)
    t0 = time.process_time()
    trainer.fit(module, loader)
    fit_s = time.process_time() - t0
    bests = module.best if cfg.vectorize_seeds else [module.best]
    histories = module.histories if cfg.vectorize_seeds else [module.history]
    params = count_parameters(make_model(seeds[0]))
    results = []
    for seed, best, history in zip(seeds, bests, histories):
        torch.save(best["state"], f"{p['out']}/{kind}_seed{seed}.pt")
        results.append({"seed": seed, "params": params, "dim": dim, "best_val_auc": best["val_auc"],
                        "best_step": best["step"], "fit_cpu_s": fit_s / len(seeds), "history": history})
    return results
