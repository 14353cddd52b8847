"""Scaling study of the factorization (the paper's setting) and a standalone large-n run.

One measurement per graph and partitioner (``measure``): parts growing with n (about n / part_size
parts by recursive bisection: METIS via pymetis when installed, else spectral), each bisection's cut
sparsified to ``target_cut`` edges by effective-resistance sampling, the sparsified Laplacian
factorized exactly; against LAPACK ``eigh`` (values + vectors) of the true L. Times are CPU seconds
of one single-threaded process (``time.process_time``), the median of ``repeats`` runs per size and
method (every run's time is kept), so they are wall-clock-like measurements: claims reading them are
marked wall-clock in the report. The exponent claims use the slope of log(t_eigh / t_L2G) on log n with
its residual-based s.e. (t with N − 2 df). Peak memory by tracemalloc in separate, untimed runs.

The evaluate stage runs ``measure`` on the prepared sizes (default profile: n <= 3000). The larger
sizes (to n = 8000, beyond the 5-minute default budget: dense eigh alone costs ~30 s per graph at
n = 6000 and ~1 min at 8000 on one thread) are run by the standalone command

    python -m stages.l2g_net.scaling --sizes 1000 2000 3000 4000 6000 8000 --jobs 2 \\
        --repeats 3 --memory-sizes 1 --out reports/studies/l2g_net_scaling_large.json

whose JSON (and the markdown table next to it) is committed; it lives outside reports/l2g_net/
because the report stage replaces that folder as a whole. The report stage does not read it (it is
not a DVC dependency), it only links to it. Its claims take their thresholds from params.yaml
(papers.l2g_net.report.claims, the same entries as the default run's scaling claims).
"""
from __future__ import annotations

import argparse
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import scipy.linalg

from stages.l2g_net import secular_jit
from stages.l2g_net.gft import Factorization, bisection_parts, factorize, resolve_partitioner, sparsify_cut


def fit_exponent(x, y) -> float:
    return float(np.polyfit(np.log(np.asarray(x, float)), np.log(np.asarray(y, float)), 1)[0])


def exponent_gap(n, t_slow, t_fast) -> dict:
    """How much faster t_fast grows than t_slow: the least-squares slope of log(t_slow / t_fast) on log n
    (= the difference of the two fitted exponents), with its residual-based standard error and N − 2
    degrees of freedom (departures from a power law, e.g. a non-monotone timing, count as noise)."""
    x = np.log(np.asarray(n, float))
    yv = np.log(np.asarray(t_slow, float) / np.asarray(t_fast, float))
    N = len(x)
    sxx = float(((x - x.mean()) ** 2).sum())
    slope = float(((x - x.mean()) * yv).sum() / sxx)
    resid = yv - (yv.mean() + slope * (x - x.mean()))
    df = N - 2
    se = float(np.sqrt((resid ** 2).sum() / df / sxx)) if df >= 1 else float("nan")
    return {"gap": slope, "se": se, "df": float(df), "points": N}


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


def timed(fn, repeats: int = 1):
    """(median CPU seconds over ``repeats`` runs, the last result, every run's seconds)."""
    times, result = [], None
    for _ in range(repeats):
        t0 = time.process_time()
        result = fn()
        times.append(time.process_time() - t0)
    return float(np.median(times)), result, times


def peak_mb(fn) -> tuple[float, object]:
    tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        out = fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak / 2**20, out


def l2g_sparsified(L, part_size: int, target_cut: int, seed: int, partitioner: str = "auto"):
    """The scaling pipeline: parts growing with n, sparsified cut, exact factorization of it."""
    num_parts = max(2, int(round(L.shape[0] / part_size)))
    parts, splits = bisection_parts(L, num_parts, method=partitioner)
    Ls, info = sparsify_cut(L, parts, splits, target_cut, seed=seed)
    return factorize(Ls, parts), Ls, parts, info


def measure(L, family: str, partitioners: list[str], *, part_size: int, target_cut: int, seed: int,
            exact_max_cut: int, memory: bool, eig_check_max_n: int, l2g_memory: bool | None = None, probes: int = 4, repeats: int = 1) -> list[dict]:
    """One row per partitioner for the graph L (eigh of L run once, shared by the rows)."""
    n = L.shape[0]
    Ld = L.toarray()
    secular_jit.warm_up()   # compiled loops loaded before anything is timed
    t_eigh, (lam_ref, _), eigh_runs = timed(lambda: scipy.linalg.eigh(Ld), repeats)
    eigh_mb = peak_mb(lambda: scipy.linalg.eigh(Ld))[0] if memory else None   # a separate, untimed run
    scale = float(np.abs(lam_ref).max())
    rng = np.random.default_rng(seed)
    rows = []
    for method in partitioners:
        ran = resolve_partitioner(method)
        t_l2g, (fact, Ls, parts, sinfo), l2g_runs = timed(
            lambda: l2g_sparsified(L, part_size, target_cut, seed, ran), repeats)
        row = {"family": family, "partitioner": ran, "n": n, "parts": len(parts),
               "cut_edges": sinfo["cut_edges_before"], "cut_kept": int(len(fact.cut_edges)),
               "l2g_s": t_l2g, "eigh_s": t_eigh, "l2g_s_runs": l2g_runs, "eigh_s_runs": eigh_runs,
               "repeats": repeats, **{k: float(v) for k, v in fact.timings.items()},
               "mean_update_size": float(np.mean([f.idx.size for f in fact.factors])) if fact.factors else 0.0,
               "spectral_err_vs_true_L": float(np.abs(fact.eigenvalues - lam_ref).max() / scale),
               "spectral_mean_err_vs_true_L": float(np.abs(fact.eigenvalues - lam_ref).mean() / scale),
               "storage_mb": storage_bytes(fact) / 2**20, "dense_U_mb": n * n * 8 / 2**20,
               "eig_err_vs_sparsified": None, "probe_err_vs_sparsified": None,
               "exact_l2g_s": None, "sparsify_speedup": None, "exact_eig_err": None, "exact_skipped": None,
               "l2g_peak_mb": None, "eigh_peak_mb": eigh_mb}
        # exactness for the Laplacian factorized: probes U Lambda U^T X = Ls X always, eigenvalues when small
        X = rng.normal(size=(n, probes))
        LX = fact.filter(lambda lam: lam, X)
        row["probe_err_vs_sparsified"] = float(np.abs(LX - Ls @ X).max() / (np.abs(Ls).max() * np.abs(X).max()))
        if n <= eig_check_max_n:
            lam_s = scipy.linalg.eigvalsh(Ls.toarray())
            row["eig_err_vs_sparsified"] = float(np.abs(fact.eigenvalues - lam_s).max() / np.abs(lam_s).max())
        if sinfo["cut_edges_before"] <= exact_max_cut:
            t_ex, fex, _ = timed(lambda: factorize(L, parts), repeats)
            t_part, _, _ = timed(lambda: bisection_parts(L, len(parts), method=ran), repeats)
            row["exact_l2g_s"] = t_ex + t_part
            row["sparsify_speedup"] = (t_ex + t_part) / t_l2g
            row["exact_eig_err"] = float(np.abs(fex.eigenvalues - lam_ref).max() / scale)
        else:
            row["exact_skipped"] = f"{sinfo['cut_edges_before']} cut edges > exact_max_cut = {exact_max_cut}"
        if memory if l2g_memory is None else l2g_memory:
            row["l2g_peak_mb"] = peak_mb(lambda: l2g_sparsified(L, part_size, target_cut, seed, ran))[0]
        rows.append(row)
    return rows


def fits(rows: list[dict]) -> dict:
    """Fitted exponents, crossover and the largest size, per family_partitioner."""
    out = {}
    for key in dict.fromkeys(f"{r['family']}_{r['partitioner']}" for r in rows):
        rs = sorted((r for r in rows if f"{r['family']}_{r['partitioner']}" == key), key=lambda r: r["n"])
        n = [r["n"] for r in rs]
        tl, te = [r["l2g_s"] for r in rs], [r["eigh_s"] for r in rs]
        faster = [r["n"] for r in rs if r["l2g_s"] < r["eigh_s"]]
        errs = [r["eig_err_vs_sparsified"] for r in rs if r["eig_err_vs_sparsified"] is not None]
        gap = exponent_gap(n, te, tl)
        monotone = all(b > a for a, b in zip(tl, tl[1:]))
        out[key] = {"family": rs[0]["family"], "partitioner": rs[0]["partitioner"],
                    "l2g_exponent": fit_exponent(n, tl), "eigh_exponent": fit_exponent(n, te),
                    "exponent_gap": gap["gap"], "exponent_gap_se": gap["se"], "exponent_gap_df": gap["df"],
                    "l2g_times_monotone": monotone,
                    "updates_exponent": fit_exponent(n, [max(r["updates_s"], 1e-6) for r in rs]),
                    "fitted_crossover_n": crossover(n, tl, te), "first_n_l2g_faster": faster[0] if faster else None,
                    "l2g_faster_at_sizes": len(faster), "largest_n": n[-1], "l2g_s_at_largest": tl[-1],
                    "eigh_s_at_largest": te[-1], "speed_ratio_at_largest": te[-1] / tl[-1],
                    "max_eig_err_vs_sparsified": max(errs) if errs else None,
                    "max_probe_err_vs_sparsified": max(r["probe_err_vs_sparsified"] for r in rs),
                    "max_spectral_err_vs_true_L": max(r["spectral_err_vs_true_L"] for r in rs),
                    "sizes": len(rs)}
    return out


def study_claims(fit: dict) -> list:
    """Wall-clock claims of the standalone run, one pair per family and partitioner. Their thresholds are the
    default profile's (papers.l2g_net.report.claims, e.g. ``scaling_exponent_*: {above: ...}``), read from
    params.yaml when the study runs — never written here."""
    from stages.common.claims import Claim, Estimate

    out = []
    for key, d in fit.items():
        out += [Estimate(f"scaling_exponent_{key}", f"{key}: L2G's fitted runtime exponent is below dense eigh's by "
                         f"more than the margin (params: above) over n up to {d['largest_n']} (slope of log(t_eigh / "
                         "t_L2G) on log n, median timings, residual-based s.e., t with N − 2 df)",
                         value=f"fits.{key}.exponent_gap", se=f"fits.{key}.exponent_gap_se",
                         df=f"fits.{key}.exponent_gap_df", points=f"fits.{key}.sizes",
                         refuted_by="an exponent gap whose upper one-sided 95% t-bound is below the margin", kind="finding",
                         wallclock=True),
                Claim(f"faster_than_eigh_{key}", f"{key}: L2G is faster than dense eigh at n = {d['largest_n']} "
                      "(median timings)", f"fits.{key}.l2g_s_at_largest < fits.{key}.eigh_s_at_largest",
                      refuted_by="L2G's median CPU time at the largest size >= eigh's", kind="finding", wallclock=True)]
    return out


def study_thresholds(params_path: Path | None = None) -> dict:
    """papers.l2g_net.report.claims from params.yaml (the study's claims share the default run's thresholds)."""
    import yaml

    from stages.common.paths import ROOT

    params = yaml.safe_load((params_path or ROOT / "params.yaml").read_text())
    return params["papers"]["l2g_net"]["report"]["claims"]


def _markdown(doc: dict) -> str:
    import polars as pl

    from stages.common.reporting import measured_text

    cols = ["family", "partitioner", "n", "parts", "cut_edges", "cut_kept", "l2g_s", "l2g_s_runs", "updates_s",
            "eigh_s", "eigh_s_runs",
            "mean_update_size", "probe_err_vs_sparsified", "eig_err_vs_sparsified", "spectral_err_vs_true_L",
            "storage_mb", "dense_U_mb", "l2g_peak_mb", "eigh_peak_mb"]
    rows = pl.DataFrame(doc["rows"], infer_schema_length=None).select(cols)
    f = pl.DataFrame(list(doc["fits"].values()), infer_schema_length=None)
    with pl.Config(tbl_formatting="MARKDOWN", tbl_hide_dataframe_shape=True, tbl_hide_column_data_types=True,
                   tbl_rows=200, tbl_cols=40, fmt_str_lengths=200, tbl_width_chars=2000):
        return "\n".join([
            "# l2g_net: large-n scaling (standalone run, committed numbers)", "",
            f"Command: `{doc['command']}`", "",
            f"Settings: {doc['settings']}. CPU seconds of one single-threaded process (timings are "
            "wall-clock-like measurements of this shared machine; rerunning changes them).", "",
            "## Claims (all wall-clock: CPU-time measurements, they may change on rerun)", "",
            "Thresholds from params.yaml (papers.l2g_net.report.claims, the default run's): "
            + ", ".join(f"{k} = {v}" for k, v in doc["thresholds"].items()) + ".", "",
            "| claim | verdict | statement | measured | would have refuted it |", "|---|---|---|---|---|",
            *[f"| {v['name']} | {v['verdict']} (wall-clock) | {v['statement']} | {measured_text(v)} | {v['refuted_by']} |"
              for v in doc["claims"]],
            "", "## Fitted exponents and crossover", "", str(f), "",
            "fitted_crossover_n: where the fitted power laws meet (extrapolated when outside the sizes run); "
            "first_n_l2g_faster: the first measured size where L2G took less CPU time than eigh.", "",
            "## Per size", "", str(rows), "",
            "Peak memory by tracemalloc: eigh during its timed run; L2G (partition + sparsification + "
            "factorization) in a separate run at the largest sizes. storage_mb: the factorization as kept; "
            "dense_U_mb: an n x n float64 basis.", ""])


def _family_rows(fam: str, a) -> list[dict]:
    from threadpoolctl import threadpool_limits

    from stages.l2g_net.graphs import ba_graph, grid_graph, laplacian

    rows = []
    with threadpool_limits(1):
        for n in a.sizes:
            G = ba_graph(n, a.ba_m, a.seed + n) if fam == "ba" else grid_graph(n)
            mem = n in a.sizes[len(a.sizes) - a.memory_sizes:]
            new = measure(laplacian(G), fam, a.partitioners, part_size=a.part_size, target_cut=a.target_cut,
                          seed=a.seed, exact_max_cut=a.exact_max_cut, memory=mem, eig_check_max_n=a.eig_check_max_n,
                          repeats=a.repeats)
            rows += new
            print(f"[scaling] {fam} n={new[0]['n']}: eigh {new[0]['eigh_s']:.1f}s (median of {a.repeats}), "
                  + ", ".join(f"{x['partitioner']} {x['l2g_s']:.1f}s" for x in new), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stages.l2g_net.scaling", description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", required=True)
    ap.add_argument("--families", nargs="+", default=["ba", "grid"], choices=["ba", "grid"])
    ap.add_argument("--partitioners", nargs="+", default=["metis", "spectral"], choices=["auto", "metis", "spectral"])
    ap.add_argument("--part-size", type=int, default=250)
    ap.add_argument("--target-cut", type=int, default=4)
    ap.add_argument("--ba-m", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--exact-max-cut", type=int, default=0)
    ap.add_argument("--eig-check-max-n", type=int, default=3000)
    ap.add_argument("--jobs", type=int, default=1, help="processes (one per family)")
    ap.add_argument("--memory-sizes", type=int, default=1, help="peak memory (eigh and L2G, separate untimed runs) "
                    "at the largest this many sizes")
    ap.add_argument("--repeats", type=int, default=3, help="timings per size and method; the median is used (>= 3)")
    ap.add_argument("--params", default=None, help="params.yaml to read the claims' thresholds from (default: the repo's)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    out = Path(a.out)
    sizes = a.sizes
    if a.repeats < 3:
        print(f"error: --repeats: the study reports the median of >= 3 timings per size (got {a.repeats})",
              file=sys.stderr)
        return 2
    try:
        thresholds = study_thresholds(Path(a.params) if a.params else None)
    except (OSError, KeyError, TypeError) as err:
        print(f"error: --params: cannot read papers.l2g_net.report.claims ({err!r})", file=sys.stderr)
        return 2
    if len(sizes) < 6 or sorted(set(sizes)) != sizes or sizes[0] < 32 or sizes[-1] > 20000:
        print(f"error: --sizes: need >= 6 strictly increasing sizes in [32, 20000] (got {sizes})", file=sys.stderr)
        return 2
    if out.is_dir() or out.suffix != ".json":
        print(f"error: --out: must be a .json file path (got {out})", file=sys.stderr)
        return 2
    from concurrent.futures import ProcessPoolExecutor

    from stages.common.paths import write_json

    if a.jobs > 1:   # one process per family (each single-threaded; CPU times are per process)
        with ProcessPoolExecutor(max_workers=min(a.jobs, len(a.families))) as pool:
            rows = [r for part in pool.map(_family_rows, a.families, [a] * len(a.families)) for r in part]
    else:
        rows = [r for fam in a.families for r in _family_rows(fam, a)]
    from stages.common.claims import ClaimError, evaluate_claims

    doc = {"command": "python -m stages.l2g_net.scaling " + " ".join(argv if argv is not None else sys.argv[1:]),
           "settings": {k: v for k, v in vars(a).items() if k not in ("out", "params")}, "rows": rows,
           "fits": fits(rows)}
    claims = study_claims(doc["fits"])
    used = {k: v for k, v in thresholds.items() if any(__import__("fnmatch").fnmatchcase(c.name, k) for c in claims)}
    try:
        doc["claims"] = evaluate_claims(claims, doc, used, where="papers.l2g_net.report")
    except ClaimError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    doc["thresholds"] = used
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, doc)
    out.with_suffix(".md").write_text(_markdown(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
