"""evaluate: Part A (exactness, scaling, sparsification, partitioner fallback) and Part B (test ROC AUC).

Part A
  exactness  every suite graph, factorized with the built-in partitioner and with a random
             partition into ``random_parts`` parts; against scipy eigh: eigenvalue error
             max|lam - lam_ref| / max|lam_ref|, orthogonality max|U^T U - I| and reconstruction
             max|U diag(lam) U^T - L| / max|L| with U formed by applying the Cauchy chain to the
             identity (all n columns at once) through kernels/cauchy_apply (random probes above
             ``dense_check_max_n``), and the heat-filter error ||U e^{-t Lambda} U^T X - expm(-tL) X||.
             Each row names the partitioner's fallback when it refused a cut.
  scaling    Barabasi-Albert and grid graphs, parts growing with n (n / ``part_size`` parts by
             recursive spectral bisection), cut sparsified to ``target_cut`` edges per bisection
             (the official code's setting): CPU time of partition + sparsification + factorize vs
             dense eigh (one thread each), fitted exponents, crossover, factorization storage, peak
             memory (tracemalloc) at the largest ``memory_sizes`` sizes, eigenvalue error against
             the sparsified Laplacian (exactness) and against the true L (sparsification error);
             where the cut has at most ``exact_max_cut`` edges also the exact factorization (every
             cut edge kept) for the speed-up of sparsification.
  scaling_k  blocks joined by k bridges (blocks as parts, every bridge a cut edge): time vs k.
Part B       test ROC AUC of every trained model and seed (best-validation state).

    python -m stages evaluate l2g_net
"""
from __future__ import annotations

import time
import tracemalloc

import numpy as np
import scipy.linalg
import scipy.sparse as sp
import torch
from pydantic import Field
from scipy.sparse.linalg import expm_multiply
from threadpoolctl import threadpool_limits
from tqdm import tqdm

from kernels.cauchy_apply import cauchy_apply
from kernels.record import KernelRecord
from stages.common.config import Seed, StageConfig
from stages.common.device import DeviceName, pick_device
from stages.common.paths import read_json, write_json
from stages.common.runner import StageContext
from stages.l2g_net.gft import Factorization, bisection_parts, factorize, sparsify_cut
from stages.l2g_net.graphs import random_parts
from stages.l2g_net.kernel_path import NAME, factor_args, kernel_cauchy
from stages.l2g_net.model import build_model, roc_auc
from stages.l2g_net.train import Config as TrainConfig
from stages.l2g_net.train import node_split


class Config(StageConfig):
    seed: Seed = 0
    random_parts: int = Field(6, ge=2, le=1000, description="parts of the random-partition stress test")
    dense_check_max_n: int = Field(400, ge=1, le=5000, description="form U densely only up to this n")
    probe_columns: int = Field(4, ge=1, le=256)
    heat_time: float = Field(0.5, gt=0, le=1e6, description="t of the heat filter exp(-tL) used as filter test")
    timing_repeats: int = Field(1, ge=1, le=10, description="best-of repeats per timing")
    part_size: int = Field(250, ge=8, le=20000, description="scaling: about n / part_size parts")
    target_cut: int = Field(4, ge=1, le=10000, description="scaling: cut edges kept per bisection")
    exact_max_cut: int = Field(150, ge=0, le=100000, description="scaling: exact run only up to this many cut edges")
    memory_sizes: int = Field(1, ge=0, le=20, description="peak memory measured at the largest this many sizes")
    device: DeviceName = "auto"


def exactness(fact: Factorization, L: sp.csr_matrix, lam_ref: np.ndarray, cfg: Config,
              rng: np.random.Generator, cauchy) -> dict:
    n = L.shape[0]
    Ld = L.toarray()
    scale = max(float(np.abs(lam_ref).max()), 1e-300)
    out = {"eig_rel_err": float(np.abs(fact.eigenvalues - lam_ref).max() / scale)}
    if n <= cfg.dense_check_max_n:
        U = fact.inverse(np.eye(n), cauchy=cauchy)          # batched: every column through the kernel
        out["orthogonality"] = float(np.abs(U.T @ U - np.eye(n)).max())
        out["reconstruction"] = float(np.abs(U @ (fact.eigenvalues[:, None] * U.T) - Ld).max()
                                      / max(np.abs(Ld).max(), 1e-300))
        out["dense_checked"] = True
    else:  # probes: U U^T X = X and U Lambda U^T X = L X
        X = rng.normal(size=(n, cfg.probe_columns))
        Y = fact.transform(X, cauchy=cauchy)
        out["orthogonality"] = float(np.abs(fact.inverse(Y, cauchy=cauchy) - X).max() / np.abs(X).max())
        LX = fact.inverse(fact.eigenvalues[:, None] * Y, cauchy=cauchy)
        out["reconstruction"] = float(np.abs(LX - L @ X).max() / (np.abs(Ld).max() * np.abs(X).max()))
        out["dense_checked"] = False
    X = rng.normal(size=(n, cfg.probe_columns))
    ref = expm_multiply(-cfg.heat_time * L, X)
    got = fact.filter(lambda lam: np.exp(-cfg.heat_time * lam), X, cauchy=cauchy)
    out["filter_rel_err"] = float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-300))
    return out


def fit_exponent(x, y) -> float:
    return float(np.polyfit(np.log(np.asarray(x, float)), np.log(np.asarray(y, float)), 1)[0])


def crossover(n, t_a, t_b) -> float | None:
    """n where the fitted power laws t_a = c_a n^p_a and t_b = c_b n^p_b cross (None if parallel)."""
    pa, ca = np.polyfit(np.log(n), np.log(t_a), 1)
    pb, cb = np.polyfit(np.log(n), np.log(t_b), 1)
    if abs(pa - pb) < 1e-9:
        return None
    return float(np.exp((cb - ca) / (pa - pb)))


def storage_bytes(fact: Factorization) -> int:
    """Bytes kept by the factorization: local bases + O(m) numbers per Cauchy factor."""
    total = sum(Q.nbytes for Q in fact.local_bases) + fact.local_eigenvalues.nbytes + fact.eigenvalues.nbytes
    for f in fact.factors:
        total += sum(getattr(f, k).nbytes for k in ("rot_p", "rot_j", "rot_c", "rot_s", "idx", "d", "z", "org",
                                                     "tau", "a"))
    return int(total)


def timed(fn, repeats: int):
    best, result = np.inf, None
    for _ in range(repeats):
        t0 = time.process_time()
        result = fn()
        best = min(best, time.process_time() - t0)
    return best, result


def peak_mb(fn) -> float:
    tracemalloc.start()
    tracemalloc.reset_peak()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 2**20


def l2g_sparsified(L, part_size: int, target_cut: int, seed: int):
    """The scaling pipeline: parts growing with n, sparsified cut, exact factorization of it."""
    num_parts = max(2, int(round(L.shape[0] / part_size)))
    parts, splits = bisection_parts(L, num_parts)
    Ls, info = sparsify_cut(L, parts, splits, target_cut, seed=seed)
    return factorize(Ls, parts), Ls, parts, info


def run(cfg: Config, ctx: StageContext) -> None:
    torch.set_num_threads(1)
    with threadpool_limits(1):
        _run(cfg, ctx)


def _run(cfg: Config, ctx: StageContext) -> None:
    device = pick_device(cfg.device)
    rec = KernelRecord(device)
    cauchy = kernel_cauchy(rec, device)
    prep, trained = ctx.input("prepare"), ctx.input("train")
    manifest = read_json(prep / "manifest.json")
    rng = np.random.default_rng(cfg.seed)
    results: dict = {"suite": [], "scaling": [], "scaling_k": []}
    parity_done = False

    # ---- Part A: exactness suite (default partitioner: its refusals are reported) ----
    for name, meta in tqdm(manifest["suite"].items(), desc="exactness suite"):
        L = sp.load_npz(prep / "suite" / f"{name}.npz").tocsr()
        lam_ref = scipy.linalg.eigvalsh(L.toarray())
        for mode in ("partitioner", "random_parts"):
            parts = None if mode == "partitioner" else random_parts(L.shape[0], cfg.random_parts, rng)
            fact = factorize(L, parts)
            row = {"graph": name, "partition": mode, "n": meta["n"], "components": meta["components"],
                   "parts": len(fact.parts), "cut_edges": int(len(fact.cut_edges)),
                   "fallback": fact.fallback or "none",
                   **exactness(fact, L, lam_ref, cfg, rng, cauchy)}
            results["suite"].append(row)
            big = [f for f in fact.factors if 8 <= f.idx.size <= 160]
            if not parity_done and mode == "random_parts" and big:
                f0 = max(big, key=lambda f: f.idx.size)   # the largest factor the interpreter handles quickly
                X = rng.normal(size=(f0.idx.size, 5))
                rec.parity(NAME, cauchy_apply, *factor_args(f0, X, device),
                           slice=f"largest Cauchy factor (m = {f0.idx.size}) of suite graph {name} "
                                 "(random parts) applied to 5 random columns")
                parity_done = True

    # ---- Part A: scaling with parts growing with n, sparsified cut ----
    largest = {}
    for meta in manifest["scaling"]:
        largest.setdefault(meta["family"], []).append(meta["n"])
    for meta in tqdm(manifest["scaling"], desc="scaling"):
        L = sp.load_npz(prep / "scaling" / meta["file"]).tocsr()
        n = L.shape[0]
        Ld = L.toarray()
        t_l2g, (fact, Ls, parts, sinfo) = timed(lambda: l2g_sparsified(L, cfg.part_size, cfg.target_cut, cfg.seed),
                                               cfg.timing_repeats)
        t_eigh, (lam_ref, _) = timed(lambda: scipy.linalg.eigh(Ld), cfg.timing_repeats)
        lam_s = scipy.linalg.eigvalsh(Ls.toarray())
        scale = float(np.abs(lam_ref).max())
        row = {"family": meta["family"], "n": n, "parts": len(parts), "cut_edges": sinfo["cut_edges_before"],
               "cut_kept": int(len(fact.cut_edges)), "l2g_s": t_l2g, "eigh_s": t_eigh,
               **{k: float(v) for k, v in fact.timings.items()},
               "eig_err_vs_sparsified": float(np.abs(fact.eigenvalues - lam_s).max() / np.abs(lam_s).max()),
               "spectral_err_vs_true_L": float(np.abs(fact.eigenvalues - lam_ref).max() / scale),
               "spectral_mean_err_vs_true_L": float(np.abs(fact.eigenvalues - lam_ref).mean() / scale),
               "storage_mb": storage_bytes(fact) / 2**20, "dense_U_mb": n * n * 8 / 2**20,
               "exact_l2g_s": None, "sparsify_speedup": None, "exact_eig_err": None,
               "exact_skipped": None, "l2g_peak_mb": None, "eigh_peak_mb": None}
        if sinfo["cut_edges_before"] <= cfg.exact_max_cut:
            t_ex, fex = timed(lambda: factorize(L, parts), cfg.timing_repeats)
            t_part, _ = timed(lambda: bisection_parts(L, len(parts)), 1)
            row["exact_l2g_s"] = t_ex + t_part
            row["sparsify_speedup"] = (t_ex + t_part) / t_l2g
            row["exact_eig_err"] = float(np.abs(fex.eigenvalues - lam_ref).max() / scale)
        else:
            row["exact_skipped"] = (f"{sinfo['cut_edges_before']} cut edges > exact_max_cut = {cfg.exact_max_cut}")
        if meta["n"] in sorted(largest[meta["family"]])[len(largest[meta["family"]]) - cfg.memory_sizes:]:
            row["l2g_peak_mb"] = peak_mb(lambda: l2g_sparsified(L, cfg.part_size, cfg.target_cut, cfg.seed))
            row["eigh_peak_mb"] = peak_mb(lambda: scipy.linalg.eigh(Ld))
        results["scaling"].append(row)
    fams = {}
    for fam in largest:
        rows = [r for r in results["scaling"] if r["family"] == fam]
        n = [r["n"] for r in rows]
        tl, te = [r["l2g_s"] for r in rows], [r["eigh_s"] for r in rows]
        faster = [r["n"] for r in rows if r["l2g_s"] < r["eigh_s"]]
        fams[fam] = {"l2g_exponent": fit_exponent(n, tl), "eigh_exponent": fit_exponent(n, te),
                     "updates_exponent": fit_exponent(n, [max(r["updates_s"], 1e-6) for r in rows]),
                     "fitted_crossover_n": crossover(n, tl, te), "first_n_l2g_faster": faster[0] if faster else None,
                     "largest_n": n[-1], "l2g_s_at_largest": tl[-1], "eigh_s_at_largest": te[-1],
                     "speed_ratio_at_largest": te[-1] / tl[-1],
                     "max_eig_err_vs_sparsified": max(r["eig_err_vs_sparsified"] for r in rows),
                     "max_spectral_err_vs_true_L": max(r["spectral_err_vs_true_L"] for r in rows),
                     "sizes": len(rows)}
    results["scaling_fits"] = fams

    # ---- Part A: scaling in the cut size (blocks as parts, every bridge kept) ----
    for meta in tqdm(manifest["scaling_k"], desc="scaling_k"):
        L = sp.load_npz(prep / "scaling_k" / meta["file"]).tocsr()
        b = meta["block_size"]
        parts = [list(range(k * b, (k + 1) * b)) for k in range(meta["blocks"])]
        t_fact, fact = timed(lambda: factorize(L, parts), cfg.timing_repeats)
        lam_ref = scipy.linalg.eigvalsh(L.toarray())
        row = {"n": meta["n"], "bridges": meta["bridges"], "parts": len(fact.parts),
               "cut_edges": int(len(fact.cut_edges)), "factorize_s": t_fact,
               **{k: float(v) for k, v in fact.timings.items()},
               **exactness(fact, L, lam_ref, cfg, rng, cauchy)}
        results["scaling_k"].append(row)
    sk = results["scaling_k"]
    results["exponents_k"] = {
        "l2g_k": fit_exponent([max(r["cut_edges"], 1) for r in sk], [r["factorize_s"] for r in sk]),
        "l2g_updates_k": fit_exponent([max(r["cut_edges"], 1) for r in sk], [r["updates_s"] for r in sk]),
        "requested_equals_actual": all(r["cut_edges"] == r["bridges"] for r in sk)}

    # ---- the partitioner's fallback on the task graph (default settings) ----
    A = sp.load_npz(prep / "task" / "adjacency.npz").tocsr()
    summary = read_json(trained / "train_summary.json")
    tcfg = TrainConfig.model_validate(summary["config"])
    from stages.l2g_net.train import task_laplacian  # noqa: PLC0415

    Lt = task_laplacian(A, tcfg.laplacian)
    results["task_default_partitioner"] = {"parts": len(factorize(Lt).parts), "fallback": factorize(Lt).fallback}

    # ---- Part B: test ROC AUC ----
    sp_npz = np.load(trained / "spectral.npz")
    k = len(sp_npz["part_sizes"])
    spec = {"parts": [sp_npz[f"part{i}"] for i in range(k)], "local_bases": [sp_npz[f"basis{i}"] for i in range(k)],
            "local_eigenvalues": [sp_npz[f"lam{i}"] for i in range(k)], "eigenvalues": sp_npz["eigenvalues"],
            "chain": sp_npz["chain"], "U": sp_npz["U"], "lam": sp_npz["lam"], "A": A}
    nodes = np.load(prep / "task" / "nodes.npz")
    x = torch.tensor(nodes["x"], dtype=torch.float32, device=device)
    y = torch.tensor(nodes["y"], dtype=torch.long, device=device)
    kw = dict(in_features=x.shape[1], num_layers=tcfg.num_layers, num_basis=tcfg.num_basis,
              dropout=tcfg.dropout, cheb_k=tcfg.cheb_k)
    task: dict = {"auc": {}, "val_auc": {}, "params": {}, "seeds": list(tcfg.seeds)}
    for kind, runs in summary["runs"].items():
        aucs = []
        for r in runs:
            model = build_model(kind, spec, dim=r["dim"], **kw)
            model.load_state_dict(torch.load(trained / "models" / f"{kind}_seed{r['seed']}.pt", map_location="cpu"))
            model.to(device).eval()
            mask = torch.as_tensor(node_split(A.shape[0], r["seed"], tcfg.train_fraction,
                                              tcfg.val_fraction)["test"], device=device)
            with torch.no_grad():
                aucs.append(roc_auc(model(x)[mask], y[mask]))
        task["auc"][kind] = aucs
        task["val_auc"][kind] = [r["best_val_auc"] for r in runs]
        task["params"][kind] = runs[0]["params"]
    base = [kd for kd in task["auc"] if kd != "l2g"]
    if base:
        task["auc_min_baseline"] = [min(task["auc"][kd][i] for kd in base) for i in range(len(tcfg.seeds))]
    results["task"] = task
    results["task_graph"] = summary["graph"]
    results["device"] = str(device)
    write_json(ctx.out / "results.json", results)
    rec.save(ctx.out)
