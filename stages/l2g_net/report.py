"""report: exactness, scaling with growing parts (crossover, memory, sparsification), Minesweeper.

    python -m stages report l2g_net
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import polars as pl

from stages.common.claims import Better, Bound, Claim, Estimate, Within, bind
from stages.common.config import ReportConfig
from stages.common.paths import read_json
from stages.common.reporting import Report
from stages.common.runner import StageContext
from stages.l2g_net.scaling import fit_exponent

TITLE = "L2G-Net: exact local-to-global factorization of the graph Fourier transform"
PAPER_CLAIM = (
    "Splitting a graph into subgraphs and adding the cut edges back as rank-one updates gives the "
    "exact graph Fourier transform as a chain of Cauchy-like factors (eigenvalue error ~1e-11 at "
    "20k nodes); the factorization scales ~n^2.0 against ~n^2.9 for dense eigh (20k nodes: 63 s vs "
    "385 s) and linearly in the cut size; L2G-Net built on it reaches state-of-the-art accuracy on "
    "heterophilous node classification (Minesweeper ROC AUC 97.50).")

AUC = "task.auc"
PAR = "parity.auc"


def _claims() -> list:
    """Every threshold (tolerances, margins, min effects, bands) is read from params.yaml
    (papers.l2g_net.report.claims), fixed before the run."""
    out = [
        Claim("exact", "The factorization is exact for the Laplacian it factorizes: eigenvalues, orthogonality, "
              "reconstruction and spectral filtering (Cauchy chain through the kernel) agree with dense eigh / expm "
              "to within tol (relative) on every graph (suite, cut-size graphs, sparsified scaling graphs, the task "
              "graphs' sparsified and exact-cut bases)",
              "exactness.max_eig_rel_err <= param.tol and exactness.max_orthogonality <= param.tol and "
              "exactness.max_reconstruction <= param.tol and exactness.max_filter_rel_err <= param.tol",
              refuted_by="any error above tol on any graph or partition", kind="finding"),
        Estimate("scaling_exponent_ba", "On Barabasi-Albert graphs with parts growing with n and the cut sparsified "
                 "(the paper's scaling setting), L2G's runtime exponent is below dense eigh's by more than the margin "
                 "(params: above): slope of log(t_eigh / t_L2G) on log n, median of the timings per size, "
                 "residual-based s.e., t with N − 2 df",
                 value="scaling.ba.exponent_gap", se="scaling.ba.exponent_gap_se", df="scaling.ba.exponent_gap_df",
                 points="scaling.ba.sizes",
                 refuted_by="an exponent gap whose upper one-sided 95% t-bound is below the margin", kind="finding"),
        Claim("faster_than_eigh_ba", "At the largest Barabasi-Albert size run here L2G (partition + sparsification "
              "+ factorization) is faster than dense eigh (median timings)",
              "scaling.ba.l2g_s_at_largest < scaling.ba.eigh_s_at_largest",
              refuted_by="L2G's median CPU time at the largest size >= eigh's", kind="finding"),
        Claim("linear_in_cut", "The rank-one updates grow linearly with the number of cut edges (fitted exponent "
              "within band of 1)", "abs(scaling_k.l2g_update_exponent_k - 1) <= param.band",
              refuted_by="an update-time exponent in k outside 1 ± band", kind="finding"),
    ]
    for base, label in (("gcn", "GCN"), ("gin", "GIN"), ("chebnet", "ChebNet (order K)"),
                        ("chebnet_long", "ChebNet of order K_long (~20)")):
        out.append(Better(f"l2g_beats_{base}", f"On Minesweeper L2G-Net has a higher test ROC AUC than {label} at "
                          "matched parameters, by more than min_effect", a=f"{AUC}.l2g", b=f"{AUC}.{base}",
                          refuted_by=f"an AUC gain over {label} whose upper t-bound is below min_effect",
                          kind="finding"))
    out += [
        Within("l2g_matches_full_gft", "On Minesweeper L2G-Net (local + global filters on the factorized GFT of the "
               "sparsified graph, the paper's setting) is within delta AUC of the same filters on the full dense GFT",
               a=f"{AUC}.l2g", b=f"{AUC}.full_gft", refuted_by="a gap whose t-bounds lie outside ±delta",
               kind="finding"),
    ]
    for base, label in (("chebnet", "ChebNet (order K)"), ("chebnet_long", "ChebNet of order K_long (~20)")):
        out.append(Better(f"parity_l2g_beats_{base}", f"On the distance-to-source parity task L2G-Net has a higher "
                          f"test ROC AUC than {label} at matched parameters, by more than min_effect (both can "
                          "represent the high-frequency eigenvector the label follows)", a=f"{PAR}.l2g",
                          b=f"{PAR}.{base}", refuted_by=f"an AUC gain over {label} whose upper t-bound is below "
                          "min_effect", kind="finding"))
    out += [
        Within("parity_l2g_matches_full_gft", "On the parity task L2G-Net is within delta AUC of the same filters on "
               "the full dense GFT", a=f"{PAR}.l2g", b=f"{PAR}.full_gft",
               refuted_by="a gap whose t-bounds lie outside ±delta", kind="finding"),
        # ---- checks: baselines' sanity, structurally favoured comparisons, the exact-cut control
        Bound("baselines_beat_chance", "Every baseline beats the trivial predictor (AUC 0.5) on Minesweeper (the "
              "weakest baseline per seed)", value="task.auc_min_baseline",
              refuted_by="the weakest baseline's AUC not above 0.5", kind="check"),
        Bound("parity_baselines_beat_chance", "On the parity task every baseline beats the trivial predictor (AUC "
              "0.5; the weakest baseline per seed)", value="parity.auc_min_baseline",
              refuted_by="the weakest baseline's AUC not above 0.5", kind="check"),
    ]
    for base, label in (("gcn", "GCN"), ("gin", "GIN")):
        out.append(Better(f"parity_l2g_beats_{base}", f"Structurally favoured (a check, not a finding): on the "
                          f"bipartite parity task L2G-Net beats the 1-hop {label}; the label is colour(v) XOR "
                          "colour(nearest source) and the colouring is the normalized Laplacian's λ = 2 eigenvector, "
                          "which a global high-pass filter reads off directly", a=f"{PAR}.l2g", b=f"{PAR}.{base}",
                          refuted_by=f"L2G-Net not ahead of {label} by min_effect although the task favours it",
                          kind="check"))
    for prefix, key, name in (("", AUC, "Minesweeper"), ("parity_", PAR, "parity")):
        out += [
            Within(f"{prefix}exact_cut_recovers_full_gft", f"Control ({name}): L2G-Net on the exact basis of the true "
                   "L (every cut edge kept) is within delta AUC of the full-GFT model",
                   a=f"{key}.l2g_exact", b=f"{key}.full_gft", refuted_by="a gap whose t-bounds lie outside ±delta",
                   kind="check"),
            Better(f"{prefix}exact_cut_beats_sparsified", f"Control ({name}): L2G-Net on the exact-cut basis beats "
                   "the sparsified-cut L2G-Net by more than min_effect AUC (what the paper's sparsification costs)",
                   a=f"{key}.l2g_exact", b=f"{key}.l2g",
                   refuted_by="an AUC gain of the exact cut whose upper t-bound is below min_effect", kind="check"),
        ]
    return out


CLAIMS = _claims()


class Config(ReportConfig):
    pass


def _upper_half(sc: pl.DataFrame) -> dict:
    """Per family: exponents fitted over the upper half of the sizes only (n >= the median size), the kept cut
    edges and mean active update size at the smallest and largest n, and the exact-cut timings where run: what
    the exponent and speed claims rest on (threats to validity)."""
    out = {}
    for fam in sc["family"].unique(maintain_order=True).to_list():
        d = sc.filter(pl.col("family") == fam).sort("n")
        n = d["n"].to_numpy()
        up = d.filter(pl.col("n") >= float(np.median(n)))
        ex = d.filter(pl.col("exact_l2g_s").is_not_null())
        out[fam] = {"sizes_from": int(up["n"][0]), "sizes": up.height,
                    "l2g_exponent": fit_exponent(up["n"].to_numpy(), up["l2g_s"].to_numpy()),
                    "eigh_exponent": fit_exponent(up["n"].to_numpy(), up["eigh_s"].to_numpy()),
                    "cut_kept": [int(d["cut_kept"][0]), int(d["cut_kept"][-1])],
                    "update_size_over_n": [float(d["mean_update_size"][0] / n[0]),
                                           float(d["mean_update_size"][-1] / n[-1])],
                    "exact_cut_timed": [{"n": int(r["n"]), "exact_l2g_s": float(r["exact_l2g_s"]),
                                         "eigh_s": float(r["eigh_s"])} for r in ex.iter_rows(named=True)]}
    return out


def _mean_sd(v):
    a = np.asarray(v, float)
    return float(a.mean()), float(a.std(ddof=1)) if a.size > 1 else 0.0


def run(cfg: Config, ctx: StageContext) -> None:
    res = read_json(ctx.input("evaluate") / "results.json")
    train = read_json(ctx.input("train") / "train_summary.json")
    rep = Report(ctx, TITLE, PAPER_CLAIM)
    suite, sk = pl.DataFrame(res["suite"]), pl.DataFrame(res["scaling_k"])
    sc = pl.DataFrame(res["scaling"], infer_schema_length=None)
    errcols = ["eig_rel_err", "orthogonality", "reconstruction", "filter_rel_err"]
    every = pl.concat([suite.select(errcols), sk.select(errcols)])
    ek, task, tg = res["exponents_k"], res["task"], res["task_graph"]
    train_ms = train["tasks"]["minesweeper"]
    fits_all = res["scaling_fits"]
    primary = res["scaling_partitioners"][0]
    fits = {d["family"]: d for d in fits_all.values() if d["partitioner"] == primary}
    sc_eig = sc["eig_err_vs_sparsified"].drop_nulls()
    graphs = [g for g in (tg, res.get("parity_graph")) if g]     # the task graphs: sparsified and exact-cut bases
    metrics = {
        "exactness": {"max_eig_rel_err": max(float(every["eig_rel_err"].max()),
                                             float(sc_eig.max()) if sc_eig.len() else 0.0,
                                             *(g["eig_err_vs_sparsified"] for g in graphs),
                                             *(g["exact_eig_err_vs_true_L"] for g in graphs)),
                      "max_orthogonality": max(float(every["orthogonality"].max()),
                                               *(g["chain_orthogonality"] for g in graphs),
                                               *(g["exact_chain_orthogonality"] for g in graphs)),
                      "max_reconstruction": max(float(every["reconstruction"].max()),
                                                float(sc["probe_err_vs_sparsified"].max())),
                      "max_filter_rel_err": float(every["filter_rel_err"].max()),
                      "graphs_checked": int(every.height + sc.height + 2 * len(graphs))},
        "scaling": fits,
        "scaling_upper": _upper_half(sc.filter(pl.col("partitioner") == primary)),
        "scaling_partitioner": primary,
        "timing_processes": res.get("timing_processes", 1),
        "scaling_by_partitioner": fits_all,
        "scaling_k": {"l2g_exponent_k": ek["l2g_k"], "l2g_update_exponent_k": ek["l2g_updates_k"],
                      "requested_bridges_are_cut_edges": ek["requested_equals_actual"]},
        "fallbacks": {"suite": {f"{r['graph']}/{r['partition']}": r["fallback"] for r in res["suite"]
                                if r["fallback"] != "none"},
                      "task_default_partitioner": res["task_default_partitioner"]["fallback"] or "none"},
        "task": task,
        "task_graph": tg,
    }
    par, pg, pdata = res.get("parity"), res.get("parity_graph"), res.get("parity_data", {})
    if par is not None:
        metrics.update({"parity": par, "parity_graph": pg, "parity_data": pdata})
    # ---------------------------------------------------------------- setup
    fam_txt = ", ".join(f"{f} (n = {sorted(set(sc.filter(pl.col('family') == f)['n'].to_list()))})" for f in fits)
    rep.section("Setup", f"""
**Factorization** (`stages/l2g_net/gft.py`, `factorize(L, parts=None)`): one dense eigh per part, then one
rank-one update per cut edge (deflation with Givens rotations propagated to every later cut edge,
secular equation per interlacing interval by a safeguarded two-pole rational iteration, roots stored
relative to the nearer pole, Gu-Eisenstat recomputation of z, column normalization; these three run as compiled
per-root loops, `stages/l2g_net/secular_jit.py`, as LAPACK's dlaed4 does). The basis is never
formed: U^T = P C_K^T G_K^T ... C_1^T G_1^T U0^T. The exactness checks form U (n <= 400) or apply it to
probes by running every Cauchy factor over all columns at once through `kernels/cauchy_apply.py`.

**Exactness suite**: {suite['graph'].n_unique()} graphs (SBM / weighted Barabasi-Albert halves, grids joined by
bridges, Petersen copies + stars + cliques + isolated nodes, weights over six decades, a hypercube), each with
the built-in partitioner (default settings; its refusals are reported) and a random partition.

**Scaling** (the paper's setting): {fam_txt}; parts grow with n (about n / part_size parts, recursive
bisection, one row per partitioner: {', '.join(res['scaling_partitioners'])}; `metis` = pymetis, the paper's,
`spectral` = Fiedler sweep cuts; claims read the first, `{primary}`), each bisection's cut sparsified to a target number of edges by effective-resistance sampling (as the
official code), and the sparsified Laplacian factorized exactly. L2G time = partition + sparsification +
factorization, against LAPACK `eigh` (values + vectors); CPU seconds of one single-threaded process, the median of
{sc['repeats'][0] if 'repeats' in sc.columns else 1} runs per size and method (each run's time in `metrics.json`); {_procs_txt(res)}. Peak memory: measured by the standalone
study (below), not at this profile.
Exactness for the Laplacian factorized: eigenvalues against eigvalsh of the sparsified Laplacian and probes
U diag(lam) U^T X = L_s X. Where the cut is small enough, the exact factorization of
the true L (every cut edge kept) is timed too (speed-up of sparsification). **Cut size**: n = {int(sk['n'][0])},
{int(sk['parts'][0])} blocks as parts, bridges {sk['bridges'].to_list()} (all distinct, all cut edges).

**Minesweeper** ({_ms_source(res.get("task_data", {}), tg)}); 50/25/25 node split per seed (or the dataset's fixed
splits, split = seed mod 10), seeds {task['seeds']}; each seed draws its own split, so the seed-to-seed spread
of the test AUC includes test-node sampling. Graph operator:
{tg['laplacian']} Laplacian; {tg['num_parts']} parts {tg['part_sizes']} by {tg.get('partitioner', 'spectral')} bisection; of
{tg['cut_edges_total']} cut edges {tg['cut_edges_kept']} kept by sparsification (official: 1); the
chain matrix `basis_cauchy` formed through the kernel (orthogonality {tg['chain_orthogonality']:.1e},
eigenvalue error vs the sparsified Laplacian {tg['eig_err_vs_sparsified']:.1e}, vs the true one
{tg['eig_err_vs_true_L']:.2f} x lambda_max). **Exact-cut control arm** (`l2g_exact`): the same L2G-Net on the same
parts with every one of the {tg['exact_cut_edges']} cut edges kept, i.e. the exact basis of the true L
(eigenvalue error {tg['exact_eig_err_vs_true_L']:.1e}, orthogonality {tg['exact_chain_orthogonality']:.1e}).
Models share the official skeleton (input linear, residual steps with LayerNorm,
feed-forward modules, output LayerNorm + linear) and differ in the graph module: L2G-Net (local band-pass spline
banks with sigmoid-gated steps, global high-pass spline bank, SiLU + sigmoid-gated residual), full-GFT (global
bank on the dense eigh basis of the true L), ChebNet (K = {train['config']['cheb_k']} and, `chebnet_long`, K = {train['config'].get('cheb_k_long')}), GCN, GIN; widths
{train_ms['dims']} chosen so that every model has about {train_ms['params_target']} parameters. AdamW,
{train['config']['trainer']['max_steps']} full-graph steps, spline coefficients at
{train['config']['spectral_lr_mult']}x the learning rate, best-validation-AUC state kept; {_seed_mode(train['config'])}
in {train['config'].get('workers', 1)} single-threaded processes, each seed seeded on its own (its split, initialization
and dropout masks; results do not depend on the process count).
{_parity_setup(pg, pdata, res.get("task_data", {}).get("edge_homophily")) if par is not None else ""}""")
    # ---------------------------------------------------------------- results: exactness
    rep.table("Exactness suite", suite.select("graph", "partition", "n", "parts", "cut_edges", *errcols, "fallback"),
              note="eig_rel_err = max|lam - lam_eigh| / max|lam_eigh|; orthogonality = max|U^T U - I|; "
                   "reconstruction = max|U diag(lam) U^T - L| / max|L|; filter = ||h(L)X - expm|| / ||expm||. "
                   "`fallback` names what the built-in partitioner did when it refused a cut (default "
                   "min_part_size 48, max_cut_fraction 1/48).")
    fb = res["task_default_partitioner"]
    rep.section("Partitioner fallback", (
        f"With its default settings the built-in partitioner splits a part only when the cut has at most "
        f"1/48 of the part's size in edges. On the Minesweeper graph it returned {fb['parts']} part(s): "
        f"fallback = `{fb['fallback'] or 'none'}`. Refusals in the exactness suite are listed in the table "
        f"above ({len(metrics['fallbacks']['suite'])} of {suite.height} rows). `Factorization.fallback` and "
        "`partition_info['refused']` carry this in the API; forced splits are available through "
        "`bisection_parts` (used by the model and the scaling study)."))
    rep.section("Comparison with the official code (measured once, not re-run here)", (
        "A review ran this factorization side by side with the official implementation (sf219/L2G_NET: "
        "same METIS parts, every cut edge kept, no sparsification) on five graphs: the largest eigenvalue "
        "error here was <= 2e-13, the official code's up to 8.6e6 (its Cauchy factors lose column "
        "normalization on hard graphs); time 0.43-1.13x the official one (faster on four of the five; measured "
        "with this factorization's earlier numpy secular solver, before its loops were compiled). The official "
        "repository is not a dependency of this pipeline, so the comparison is quoted, not recomputed by "
        "`dvc repro`."))
    # ---------------------------------------------------------------- scaling
    cols = ["family", "partitioner", "n", "parts", "cut_edges", "cut_kept", "l2g_s", "local_eigh_s", "updates_s",
            "mean_update_size", "eigh_s", "eig_err_vs_sparsified", "probe_err_vs_sparsified", "spectral_err_vs_true_L", "storage_mb", "dense_U_mb",
            "l2g_peak_mb", "eigh_peak_mb", "exact_l2g_s", "sparsify_speedup", "exact_eig_err"]
    rep.table("Scaling with parts growing with n (sparsified cut)", sc.select(cols), note=(
        "l2g_s = partition + sparsification + factorization. mean_update_size: active size m of the rank-one "
        "updates after deflation (their cost ~ m^2 each). eig_err_vs_sparsified / probe_err_vs_sparsified: exactness for the Laplacian factorized; spectral_err_vs_true_L: "
        "max|lam - lam(L)| / max lam(L), the error sparsification introduces. storage_mb: the factorization "
        "as kept (local bases + O(m) numbers per factor) vs dense_U_mb. exact_*: every cut edge kept (only "
        "where the cut is small enough; else empty)."))
    ftab = pl.DataFrame(list(fits_all.values()), infer_schema_length=None)
    rep.table("Fitted exponents and crossover", ftab,
              note="fitted_crossover_n: where the fitted power laws meet (extrapolated when beyond the sizes run); "
                   f"claims read the `{primary}` rows.")
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for (key, f), mk in zip(fits_all.items(), ("o", "s", "^", "v", "D", "x")):
        d = sc.filter((pl.col("family") == f["family"]) & (pl.col("partitioner") == f["partitioner"]))
        axes[0].loglog(d["n"].to_numpy(), d["l2g_s"].to_numpy(), mk + "-",
                       label=f"{key} L2G (sparsified): ~n^{f['l2g_exponent']:.2f}")
        if f["partitioner"] == primary:
            axes[0].loglog(d["n"].to_numpy(), d["eigh_s"].to_numpy(), mk + "--",
                           label=f"{f['family']} dense eigh: ~n^{f['eigh_exponent']:.2f}")
        axes[2].semilogy(d["n"].to_numpy(), np.maximum(d["spectral_err_vs_true_L"].to_numpy(), 1e-17), mk + "-",
                         label=f"{key}: vs true L")
        axes[2].semilogy(d["n"].to_numpy(), np.maximum(d["probe_err_vs_sparsified"].to_numpy(), 1e-17), mk + ":",
                         label=f"{key}: vs sparsified L (probes)")
    axes[0].set(xlabel="n", ylabel="CPU s", title="runtime, parts growing with n")
    axes[0].legend(fontsize=7)
    k = np.maximum(sk["cut_edges"].to_numpy(), 1)
    axes[1].loglog(k, sk["updates_s"].to_numpy(), "^-", label=f"rank-one updates ~k^{ek['l2g_updates_k']:.2f}")
    axes[1].loglog(k, sk["factorize_s"].to_numpy(), "o-", label=f"factorize ~k^{ek['l2g_k']:.2f}")
    axes[1].set(xlabel="cut edges k", ylabel="CPU s", title=f"runtime vs cut size (n = {int(sk['n'][0])})")
    axes[1].legend(fontsize=7)
    axes[2].set(xlabel="n", ylabel="max eigenvalue error / max lam", title="sparsification error vs exactness")
    axes[2].legend(fontsize=7)
    rep.figure("scaling", fig, "Left: CPU time of L2G (sparsified cut) and dense eigh vs n. Middle: time vs the "
               "number of cut edges (exact). Right: eigenvalue error of the factorization against the sparsified "
               "Laplacian it factorizes (exactness) and against the true L (what sparsification costs).")
    prim = sc.filter(pl.col("partitioner") == primary)
    long = pl.concat([prim.select("n", pl.concat_str(pl.col("family"), pl.lit(f" L2G ({primary})")).alias("series"),
                                  pl.col("l2g_s").alias("cpu_s")),
                      prim.select("n", pl.concat_str(pl.col("family"), pl.lit(" dense eigh")).alias("series"),
                                  pl.col("eigh_s").alias("cpu_s"))])
    rep.plot("scaling", long, x="n", y="cpu_s", series="series",
             title="runtime vs n (CPU s, median of the timings per size)")
    rep.section("Large-n scaling (standalone run, committed numbers)", _large_text())
    rep.plot("scaling_k", sk.select("cut_edges", "factorize_s", "updates_s"), x="cut_edges",
             y=["factorize_s", "updates_s"], title="runtime vs cut size")
    rep.table("Scaling in cut size (exact)", sk.select("n", "bridges", "cut_edges", "factorize_s", "updates_s",
                                                       *errcols))
    # ---------------------------------------------------------------- tasks
    ttab = _task_results(rep, "Minesweeper", "task", task, train_ms,
                         f"Minesweeper {int(np.sqrt(tg['n']))}x{int(np.sqrt(tg['n']))}")
    ptab = None
    if par is not None:
        ptab = _task_results(rep, "Distance-to-source parity", "parity", par, train["tasks"]["parity"],
                             f"parity {pdata.get('side', '?')}x{pdata.get('side', '?')}, {pdata.get('sources', '?')} sources")
    # ---------------------------------------------------------------- deviations + discussion
    dev = pl.DataFrame([
        {"what": "partitioner", "paper / official": "METIS recursive bisection",
         "here": "METIS recursive bisection through pymetis when installed (else spectral sweep cuts); the scaling "
                 "study runs both", "why": "the paper's partitioner; spectral kept as the no-dependency fallback"},
        {"what": "second task", "paper / official": "roman-empire, amazon-ratings, tolokers (downloaded)",
         "here": "distance-to-source parity on a bipartite grid, generated (structurally favours global high-pass "
                 "filters: its GCN/GIN comparisons are checks); the benchmarks' `.npz` loader exists and is tested "
                 "on a fixture",
         "why": "no downloads at default; a long-range heterophilous task asked for by an earlier issue"},
        {"what": "exact-cut control", "paper / official": "not run (official target_cut 1)",
         "here": "`l2g_exact`: the same model on the exact basis of the true L, every cut edge kept",
         "why": "separates the price of sparsification from the model's"},
        {"what": "secular solver / sums", "paper / official": "Newton + bisection, compensated sums",
         "here": "two-pole rational step + bisection, sign-separated sums (as LAPACK dlaed4), Gu-Eisenstat + column "
                 "normalization, in compiled per-root loops (numba, `secular_jit.py`)",
         "why": "exact in floating point on every graph tried (official loses normalization on hard graphs)"},
        {"what": "Minesweeper", "paper / official": "100x100 dataset file, 10 fixed splits",
         "here": f"generated {int(np.sqrt(tg['n']))}x{int(np.sqrt(tg['n']))} at default (100x100 in full), splits by seed",
         "why": "no downloads; 5-minute default budget on 2 cores"},
        {"what": "model size / steps", "paper / official": "16 layers, width 32+, 1500 steps, 10 splits",
         "here": f"{train['config']['num_layers']} layers, width {train['config']['dim']}, "
                 f"{train['config']['trainer']['max_steps']} steps, {len(task['seeds'])} seeds",
         "why": "default budget (full profile: 8 layers, 1500 steps, 10 seeds on the published file's 10 splits)"},
        {"what": "target cut", "paper / official": "1 (Minesweeper)", "here": str(train['config']['target_cut']),
         "why": "a configurable option; the chain is exact for the sparsified graph in both"},
        {"what": "baselines", "paper / official": "published numbers of tuned models",
         "here": "same skeleton, parameter-matched widths, same budget", "why": "a controlled comparison"},
        {"what": "timings", "paper / official": "wall clock, multithreaded, one run",
         "here": "CPU s, one thread, median of 3 runs per size", "why": "robust on a shared 2-core machine"},
    ])
    rep.table("Deviations", dev)
    rep.section("Discussion", _discussion(metrics, ttab, ptab))
    rep.section("Threats to validity", _threats(metrics, len(task["seeds"]), train))
    rep.finish(_applicable(CLAIMS, metrics), metrics,
               wallclock=("scaling", "scaling_upper", "scaling_by_partitioner", "scaling_k", "task_graph",
                          "parity_graph"))


def _applicable(claims: list, metrics: dict) -> list:
    """The claims whose arms were run (a task or model left out of params drops the claims that compare it)."""
    from stages.common.claims import flatten

    env = flatten(metrics)
    out = []
    for c in claims:
        refs = [getattr(c, f, None) for f in ("a", "b", "value")]
        if all(r is None or not isinstance(r, str) or r in env for r in refs):
            out.append(c)
    return out


def _task_results(rep: Report, title: str, name: str, task: dict, tr: dict, label: str) -> pl.DataFrame:
    rows = []
    for kind, aucs in task["auc"].items():
        m, s = _mean_sd(aucs)
        vm, _ = _mean_sd(task["val_auc"][kind])
        rows.append({"model": kind, "params": task["params"][kind], "width": tr["dims"][kind],
                     "test_auc_mean": m, "test_auc_sd": s, "val_auc_mean": vm,
                     "per_seed": ", ".join(f"{a:.4f}" for a in aucs)})
    ttab = pl.DataFrame(rows)
    rep.table(f"{title} (test ROC AUC over seeds)", ttab, note="sd = sample standard deviation over seeds.")
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    curves = []
    for kind, runs in tr["runs"].items():
        h = runs[0]["history"]
        axes[0].plot([e["step"] for e in h], [e["val_auc"] for e in h], label=f"{kind} (seed {runs[0]['seed']})")
        curves += [{"model": kind, "step": e["step"], "val_auc": e["val_auc"]} for e in h]
    axes[0].set(xlabel="step", ylabel="validation ROC AUC", title=f"training ({title})")
    axes[0].legend(fontsize=8)
    for i, kind in enumerate(task["auc"]):
        axes[1].scatter([i] * len(task["auc"][kind]), task["auc"][kind], alpha=0.7)
        axes[1].errorbar(i + 0.15, ttab["test_auc_mean"][i], yerr=ttab["test_auc_sd"][i], fmt="k_", capsize=4)
    axes[1].axhline(0.5, color="gray", ls=":", label="chance")
    axes[1].set_xticks(range(len(task["auc"])), list(task["auc"]))
    axes[1].set(ylabel="test ROC AUC", title=label)
    rep.figure(name, fig, f"{title}: validation AUC during training (first seed) and test AUC per seed (dots), "
               "mean +- sd (bars).")
    if curves:
        rep.plot("val_curves" if name == "task" else f"val_curves_{name}", pl.DataFrame(curves), x="step",
                 y="val_auc", series="model", title=f"validation AUC, first seed ({title})")
    return ttab


def _procs_txt(res: dict) -> str:
    k = res.get("timing_processes", 1)
    if k > 1:
        return (f"the graphs are timed {k} at a time, one per single-threaded process (L2G and eigh of a graph "
                "always in the same process)")
    return "every graph and method timed in one process, one after the other"


def _ms_source(data: dict, tg: dict) -> str:
    if data.get("source", "generated") != "generated":
        return (f"the published benchmark file `{data['source']}` ({data.get('name')}), {tg['n']} nodes, "
                f"{data.get('edges')} edges, its {data.get('splits')} fixed splits")
    side = int(np.sqrt(tg['n']))
    return (f"generated as Platonov et al. 2023: {tg['n']}-node king-move grid (side {side}; the paper's is 100 x 100 "
            "= 10,000 nodes, which the full profile reads from the published file), 20% mines, one-hot "
            "neighbour-mine counts with 50% of the nodes' features hidden")


def _parity_setup(pg: dict, pdata: dict, ms_homophily: float | None) -> str:
    ms = "" if ms_homophily is None else f", Minesweeper's {ms_homophily:.2f}"
    return f"""
**Distance-to-source parity** (a generated long-range heterophilous task, not in the paper): a {pdata['side']} x
{pdata['side']} 4-neighbour grid with 10% of its edges removed (kept connected; {pdata['n']} nodes, {pdata['edges']}
edges), {pdata['sources']} random sources; features = [is source, not a source]; label = parity of the hop distance
to the nearest source (max distance {pdata['max_distance']}, mean {pdata['mean_distance']:.1f}; positives
{pdata['positive_fraction']:.2f}; edge homophily {pdata['edge_homophily']:.3f}{ms}). **Structural favour, measured:**
the graph is bipartite ({pdata.get('bipartite')}), so the label equals colour(v) XOR colour(nearest source) on
{100 * pdata.get('label_is_colour_xor_source_colour', float('nan')):.1f}% of the nodes, and the 2-colouring is the
eigenvector of the normalized Laplacian at its largest eigenvalue (λ_max = {pdata.get('normalized_lambda_max', float('nan')):.6f};
its sign pattern matches the colouring on {100 * pdata.get('top_eigvec_sign_matches_colouring', float('nan')):.1f}% of
the nodes). A global high-pass spectral filter (L2G-Net's, initialised high-pass, and the full-GFT model's) reads
that eigenvector off directly, while a 1-hop low-pass GCN/GIN cannot: the comparisons with GCN and GIN on this task
are therefore checks, not findings; those with ChebNet (whose polynomials also reach the top of the spectrum) stay
findings. Same models, widths matched to L2G-Net's {pg['n']}-node factorization ({pg['num_parts']} parts
{pg['part_sizes']} by {pg.get('partitioner', 'spectral')} bisection, {pg['cut_edges_kept']} of {pg['cut_edges_total']}
cut edges kept; eigenvalue error vs the true Laplacian {pg['eig_err_vs_true_L']:.2f} x lambda_max; the exact-cut arm
keeps all {pg.get('exact_cut_edges')}), same training budget and seeds.
"""


STUDY_CMD = ("python -m stages.l2g_net.scaling --sizes 1000 2000 3000 4000 6000 8000 --jobs 2 "
             "--repeats 3 --memory-sizes 1 --out reports/studies/l2g_net_scaling_large.json")


def _large_text() -> str:
    return ("The default profile stops at n = 3000 (dense eigh at n = 8000 alone costs 1–2 min per graph and run on "
            "one thread, beyond the 5-minute budget). The larger sizes (BA and grid at six sizes from n = 1000 to "
            "8000, METIS and spectral parts, peak memory of both at the largest size) are measured by the standalone "
            f"command `{STUDY_CMD}` (`stages/l2g_net/scaling.py`; about 25 minutes on two otherwise idle cores), "
            "committed in [l2g_net_scaling_large.md](../studies/l2g_net_scaling_large.md) (JSON beside it) and not "
            "re-run by `dvc repro`. Every time there is the median of 3 CPU-time runs per size and method (all runs "
            "kept in the JSON); its fitted exponents carry residual-based s.e. (t with N − 2 df) and its claims use "
            "this paper's thresholds from params.yaml, so its verdicts are read there, as wall-clock-like "
            "measurements that a rerun may change. The claims above read only the default profile's own "
            "median-of-3 timings (n <= 3000).")


def _discussion(m: dict, ttab: pl.DataFrame, ptab: pl.DataFrame | None = None) -> str:
    e, f = m["exactness"], m["scaling"]
    lines = [f"- Exactness: over {e['graphs_checked']} factorizations the largest eigenvalue error is "
             f"{e['max_eig_rel_err']:.1e}, orthogonality {e['max_orthogonality']:.1e}, reconstruction "
             f"{e['max_reconstruction']:.1e}, heat-filter error {e['max_filter_rel_err']:.1e}."]
    for fam, d in f.items():
        cross = d["fitted_crossover_n"]
        lines.append(
            f"- Scaling ({fam}): L2G ~n^{d['l2g_exponent']:.2f} vs eigh ~n^{d['eigh_exponent']:.2f} for n up to "
            f"{d['largest_n']}; at the largest size L2G {d['l2g_s_at_largest']:.2f} s vs eigh {d['eigh_s_at_largest']:.2f} s; "
            f"first size where L2G is faster: {d['first_n_l2g_faster']}; fitted crossover n = "
            f"{'none' if cross is None else f'{cross:.0f}'}. The price: eigenvalues of the sparsified graph differ "
            f"from the true ones by up to {d['max_spectral_err_vs_true_L']:.2f} x lambda_max (the factorization "
            f"itself is exact to {d['max_eig_err_vs_sparsified']:.1e} for the graph it factorizes).")
    if "scaling_by_partitioner" in m and len({d["partitioner"] for d in m["scaling_by_partitioner"].values()}) > 1:
        lines.append("- Partitioner: " + "; ".join(
            f"{k} ~n^{d['l2g_exponent']:.2f} ({d['l2g_s_at_largest']:.2f} s at n = {d['largest_n']})"
            for k, d in m["scaling_by_partitioner"].items()) + ". The cost of each rank-one update is ~m^2 in its "
            "active size m after deflation (`mean_update_size`): parts whose cut edges touch eigenvectors with "
            "tiny entries deflate more, so the partitioner, not only the number of cut edges, sets the speed.")
    if ptab is not None:
        pb = ptab.sort("test_auc_mean", descending=True)
        lines.append(f"- Distance-to-source parity: best mean test AUC {pb['model'][0]} ({pb['test_auc_mean'][0]:.3f}), "
                     f"worst {pb['model'][-1]} ({pb['test_auc_mean'][-1]:.3f}); the claims table gives the "
                     "seed-aware verdicts. This task is not in the paper; it is a generated long-range heterophilous "
                     "task (label = parity of the distance to the nearest source).")
    for key, name in (("task", "Minesweeper"), ("parity", "parity")):
        if key not in m or not {"l2g", "l2g_exact", "full_gft"} <= set(m[key]["auc"]):
            continue
        a, g = m[key]["auc"], m[f"{key}_graph"]
        mean = lambda u, v: float(np.mean(np.subtract(a[u], a[v])))  # noqa: E731
        d_sp, d_ex, d_cut = mean("l2g", "full_gft"), mean("l2g_exact", "full_gft"), mean("l2g_exact", "l2g")
        if abs(d_ex) < abs(d_sp) / 2 and d_cut > 0:
            reading = ("the exact cut closes most of the gap: it is the price of sparsifying the cut")
        elif abs(d_cut) < abs(d_sp) / 2:
            reading = ("the exact cut does not close it: the gap comes from the model (local stage, training), not "
                       "from sparsification")
        else:
            reading = "the exact cut moves the gap only partly; see the control checks for their t-bounds"
        lines.append(f"- Exact-cut control ({name}): mean AUC l2g − full_gft {d_sp:+.3f} with {g['cut_edges_kept']} of "
                     f"{g['cut_edges_total']} cut edges kept (eigenvalue error vs the true L "
                     f"{g['eig_err_vs_true_L']:.2f} x lambda_max); l2g_exact − full_gft {d_ex:+.3f} with all "
                     f"{g.get('exact_cut_edges')} kept (error {g.get('exact_eig_err_vs_true_L', float('nan')):.1e}); "
                     f"l2g_exact − l2g {d_cut:+.3f}: {reading}.")
    best = ttab.sort("test_auc_mean", descending=True)["model"][0]
    lines.append(f"- Minesweeper: best mean test AUC {best}; see the table. The paper reports 97.50 for "
                 "L2G-Net at 100x100 with 16 layers and 1500 steps; this miniature trains far less, on a smaller "
                 "grid, so absolute AUCs are lower and the ranking is what is tested.")
    lines.append("- Not reproduced here: the 20,000-node timings (the standalone study goes to n = 8000), the other "
                 "heterophilous datasets at full size (roman-empire, amazon-ratings, tolokers, questions: their `.npz` "
                 "loader is tested on a fixture, `stages/l2g_net/heterophilous.py`) and the Polynormer parameter "
                 "comparison; the baselines here are parameter-matched, not the published tuned models.")
    return "\n".join(lines)


def _late_arms(train: dict) -> list[str]:
    """(task, model) arms whose best validation state came in the last 10% of training on most seeds: their
    curves were still rising when the step budget ended (measured from the runs, not assumed)."""
    steps = train["config"]["trainer"]["max_steps"]
    out = []
    for task, t in train["tasks"].items():
        for kind, runs in t["runs"].items():
            late = sum(r["best_step"] >= 0.9 * steps for r in runs)
            if late * 2 > len(runs):
                out.append(f"{task}/{kind} ({late}/{len(runs)} seeds)")
    return out


def _upper_text(m: dict) -> str:
    """Threat: the exponent claim's fit leans on small sizes; the speed claim times a sparsified factorization."""
    parts = []
    for fam, u in m["scaling_upper"].items():
        f = m["scaling"][fam]
        ex = "; ".join(f"n = {r['n']}: {r['exact_l2g_s']:.2f} s vs eigh {r['eigh_s']:.2f} s"
                       for r in u["exact_cut_timed"])
        parts.append(
            f"{fam}: over all sizes L2G ~n^{f['l2g_exponent']:.2f} vs eigh ~n^{f['eigh_exponent']:.2f}, over the "
            f"{u['sizes']} sizes from n = {u['sizes_from']} L2G ~n^{u['l2g_exponent']:.2f} vs eigh "
            f"~n^{u['eigh_exponent']:.2f}; kept cut edges {u['cut_kept'][0]} → {u['cut_kept'][1]}, mean active "
            f"update size {u['update_size_over_n'][0]:.2f} → {u['update_size_over_n'][1]:.2f} x n; eigenvalues "
            f"off the true L's by up to {f['max_spectral_err_vs_true_L']:.2f} x lambda_max"
            + (f"; exact cut (every cut edge kept) timed at {ex}" if ex else ""))
    return ("- **What the speed claims rest on.** Fixed per-part work dominates L2G at small n, so the exponent fitted "
            "over all sizes is lower than the growth at the top (each rank-one update costs ~m^2 in its active size "
            "m, and the kept cut edges grow with n), and L2G's speed is bought by sparsifying the cut, while eigh is "
            "exact for the true L. " + "; ".join(parts) + ".")


def _seed_mode(cfg: dict) -> str:
    if cfg.get("vectorize_seeds", False):
        return ("the seeds of each (task, model) train as one vectorized ensemble (`NodeTaskEnsemble`: each seed "
                "is its solo run's computation, equal to float rounding over the tests' short runs; over 300 steps "
                "ChebNet and GIN amplify rounding differences as any two builds would, so solo runs give other "
                "numbers for them), one ensemble per job,")
    return "every (task, model, seed) trains on its own,"


def _threats(m: dict, seeds: int, train: dict) -> str:
    pdata = m.get("parity_data", {})
    late = _late_arms(train)
    steps = train["config"]["trainer"]["max_steps"]
    seed_text = (f"Learned arms run {seeds} seeds (each with its own random node split), as the shared rule asks for "
                 "findings; " if seeds >= 5 else
                 f"Learned arms run {seeds} seeds (each with its own random node split); the shared rule asks for 5 for "
                 "findings, which this profile's budget does not allow; ")
    return "\n".join([
        "- **Seeds.** " + seed_text + "the full profile runs 10 seeds on the published file's 10 fixed splits. "
        "Inconclusive verdicts show the smallest gap their design could detect. Verdicts near their thresholds move "
        "with the random draw: changing only the dropout masks' random stream (2026-12-05, when the seeds became one "
        "vectorized ensemble) moved `parity_l2g_matches_full_gft` (inconclusive to holds), "
        "`exact_cut_recovers_full_gft` (inconclusive to fails) and `parity_exact_cut_recovers_full_gft` (holds to "
        "inconclusive); read them as one draw of five seeds.",
        "- **Parity task structure.** The parity label is a function of the bipartite colouring "
        f"({100 * pdata.get('label_is_colour_xor_source_colour', float('nan')):.0f}% of nodes), the top eigenvector of the "
        "normalized Laplacian: L2G-Net's and the full-GFT model's high-pass global filters can read it off, 1-hop "
        "GCN/GIN cannot. Hence `parity_l2g_beats_gcn/gin` are checks; the parity findings are the comparisons with "
        "ChebNet (which also reaches the top of the spectrum) and with the full GFT.",
        "- **Sparsified vs exact cut.** The paper's setting (and the official code) factorizes a cut-sparsified "
        "graph, so L2G-Net's basis is not the true graph's (eigenvalue error of order lambda_max); the `l2g_exact` "
        "control arm keeps every cut edge and isolates that effect from the model's.",
        f"- **Budget.** {steps} full-graph steps on a small graph (the paper: 1500 steps, 100 x 100, 16 layers). "
        "Arms whose best validation AUC came in the last 10% of training on most seeds (still rising when the budget "
        "ended): " + (", ".join(late) + "; verdicts involving them are budget-limited." if late else
                      "none — every arm peaked earlier, so the step budget does not decide the verdicts."),
        "- **Wall-clock claims.** Scaling claims read CPU times of one thread on a shared machine (median of 3 "
        "runs); the exponent claim uses the residual-based s.e. of the fit, so non-monotone timings (deflation "
        "varies with the graph) widen its t-bound instead of deciding it. "
        + ("The graphs are timed at the same time in separate processes: a process's CPU time excludes waiting for "
           "a core but not the caches and memory bandwidth the others share, which slows L2G's rank-one updates "
           "more than eigh and biases the comparison against L2G. "
           if m.get("timing_processes", 1) > 1 else "")
        + "This machine's CPU timings drift by tens of percent from run to run, so a wall-clock verdict can flip "
          "on a re-run.",
        "- **Implementations, not only algorithms, are timed.** eigh is LAPACK (compiled); L2G's inner loops "
        "(secular roots, Gu-Eisenstat z, column scales) are compiled per-root loops (`stages/l2g_net/secular_jit.py`, "
        "numba, as LAPACK's dlaed4), the rest numpy/scipy. With the earlier vectorized-numpy solver (kept as the "
        "tests' reference) L2G was about 5x slower at these sizes and `faster_than_eigh_ba` failed (README, "
        "Performance); the speed verdicts say what these implementations do.",
        _upper_text(m),
        "- **Large-n study outside the DVC graph.** The committed standalone study to n = 8000 (the paper's regime; "
        "median of 3 timings per size and method) is neither a dependency of this report "
        "nor re-run by `dvc repro`; its timings are CPU seconds of this machine and change on another, and its "
        "exponent-gap claims rest on six sizes (4 df), so only large gaps can be resolved there.",
        "- **Red-team pass (self-review).** Exactness could fail on any of the graphs (40+ factorizations, two "
        "partition modes); the scaling claims read medians with an s.e.; the AUC findings use min effects fixed in "
        "params and each seed's own split. Independent check: `tests/l2g_net/test_heterophilous.py` runs "
        "the factorization and L2G-Net on a fixture in the published `.npz` schema (a graph this project never "
        "generated) and checks the eigenvalues against dense eigh.",
    ])
