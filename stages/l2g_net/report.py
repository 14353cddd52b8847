"""report: exactness table, scaling figure with fitted exponents, long-range task results, verdicts.

    python -m stages report l2g_net
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import polars as pl

from stages.common.claims import Claim, evaluate_claims
from stages.common.config import StageConfig
from stages.common.paths import read_json
from stages.common.reporting import Report
from stages.common.runner import StageContext

TITLE = "L2G-Net: exact local-to-global factorization of the graph Fourier transform"
PAPER_CLAIM = (
    "Splitting a graph into subgraphs and adding the cut edges back as rank-one updates gives the "
    "exact graph Fourier transform as a chain of Cauchy-like factors (eigenvalue error ~1e-11 at "
    "20k nodes); the factorization scales ~n^2.0 against ~n^2.9 for dense eigh and linearly in the "
    "cut size; L2G-Net built on it reaches state-of-the-art long-range accuracy (Minesweeper ROC-AUC "
    "97.5) with orders of magnitude fewer parameters than competing models.")

CLAIMS = [
    Claim("exact", "The factorization is exact: eigenvalues, orthogonality, reconstruction and spectral "
          "filtering agree with dense eigh / expm to <= 1e-8 relative on every test graph",
          "exactness.max_eig_rel_err <= 1e-8 and exactness.max_orthogonality <= 1e-8 and "
          "exactness.max_reconstruction <= 1e-8 and exactness.max_filter_rel_err <= 1e-8"),
    Claim("scaling_in_n", "Runtime exponent in n clearly (>= 0.3) below dense eigh's at the sizes run here",
          "scaling.l2g_exponent_n <= scaling.eigh_exponent_n - 0.3"),
    Claim("linear_in_cut", "Runtime grows linearly with the number of cut edges (fitted exponent within 0.3 of 1)",
          "abs(scaling.l2g_update_exponent_k - 1) <= 0.3"),
    Claim("beats_local_filters", "On the long-range task L2G-Net is at least as accurate (test R^2) as ChebNet "
          "and GCN with at most 1/5 of their parameters",
          "task.l2g.test_r2 >= task.chebnet.test_r2 and task.l2g.test_r2 >= task.gcn.test_r2 and "
          "task.l2g.params <= 0.2 * min(task.chebnet.params, task.gcn.params)"),
    Claim("matches_full_gft", "L2G-Net matches the full-GFT spectral net (test R^2 within 0.02)",
          "abs(task.l2g.test_r2 - task.full_gft.test_r2) <= 0.02"),
]


class Config(StageConfig):
    pass


def _fit_line(x, y):
    p = np.polyfit(np.log(x), np.log(y), 1)
    return p[0], np.exp(np.polyval(p, np.log(x)))


def run(cfg: Config, ctx: StageContext) -> None:
    res = read_json(ctx.input("evaluate") / "results.json")
    train = read_json(ctx.input("train") / "train_summary.json")
    rep = Report(ctx, TITLE, PAPER_CLAIM)

    suite = pl.DataFrame(res["suite"])
    sn, sk = pl.DataFrame(res["scaling_n"]), pl.DataFrame(res["scaling_k"])
    every = pl.concat([suite.select("eig_rel_err", "orthogonality", "reconstruction", "filter_rel_err"),
                       sn.select("eig_rel_err", "orthogonality", "reconstruction", "filter_rel_err"),
                       sk.select("eig_rel_err", "orthogonality", "reconstruction", "filter_rel_err")])
    ex = res["exponents"]
    metrics = {
        "exactness": {"max_eig_rel_err": float(every["eig_rel_err"].max()),
                      "max_orthogonality": float(every["orthogonality"].max()),
                      "max_reconstruction": float(every["reconstruction"].max()),
                      "max_filter_rel_err": float(every["filter_rel_err"].max()),
                      "graphs_checked": int(every.height)},
        "scaling": {"l2g_exponent_n": ex["l2g_n"], "eigh_exponent_n": ex["eigh_n"],
                    "l2g_exponent_k": ex["l2g_k"], "l2g_update_exponent_k": ex["l2g_updates_k"],
                    "largest_n": int(sn["n"].max()),
                    "l2g_s_at_largest_n": float(sn["factorize_s"][-1]), "eigh_s_at_largest_n": float(sn["eigh_s"][-1])},
        "task": res["task"],
        "task_graph": res["task_graph"],
    }
    tg = res["task_graph"]
    rep.section("Setup", f"""
**Part A (exactness, scaling).** `stages/l2g_net/gft.py` implements `factorize(L, parts=None)`: parts from
the built-in partitioner (connected components, then recursive spectral bisection by a Fiedler sweep cut,
splitting a part only when the cut is small), one dense eigh per part, then one rank-one update per cut
edge with deflation (tiny z_i; nearly equal eigenvalues merged by Givens rotations that are applied to the
z of every later cut edge), the secular equation solved per interlacing interval by a safeguarded
rational (Bunch-Nielsen-Sorensen) iteration with bisection fallback, roots stored relative to the nearest
pole, and Gu-Eisenstat recomputation of z. The basis is never formed: U^T = P C_K^T G_K^T ... C_1^T G_1^T U0^T.
The exactness suite ({suite['graph'].n_unique()} graphs: SBM and weighted Barabasi-Albert halves joined by
bridges, grids joined by bridges, disjoint Petersen copies + stars + complete graphs + isolated nodes,
weighted multi-component graphs with weights over six decades, a hypercube) is factorized both with the
built-in partitioner and with a random partition (many cut edges), and compared with scipy eigh,
with dense U up to n = 400 and random probes above. Heat-filter errors use the Cauchy chain through
`kernels/cauchy_apply.py` (backend `{res['backend']}`) against `scipy.sparse.linalg.expm_multiply`.
Scaling: {len(sn)} graphs of 4 random blocks (mean degree 10) joined by a fixed number of bridges,
n = {sn['n'].to_list()}; and n = {sk['n'][0]} with {sk['bridges'].to_list()} bridges. Timings are CPU
seconds of the process (best of the configured repeats), one BLAS thread for both methods, so that other
jobs sharing the 2-core machine disturb them as little as possible.

**Part B (model).** Graph of {tg['num_blocks']} dense blocks ({tg['n']} nodes, {tg['edges']} edges) joined
by {tg['bridges']} bridges; target y = exp(-tL) s for white-noise node signals s with
t = {tg['diffusion_time']:.1f} = 2/lambda_2, so each node's target mixes every block. The partitioner split it
into {tg['num_parts']} parts with {tg['num_cut_edges']} cut edges (eigenvalue error vs eigh
{tg['eigenvalue_rel_err']:.1e}). Models trained with Lightning (AdamW, one-cycle): L2G-Net (local spline
filters -> Cauchy chain -> global cubic-B-spline filter -> inverse, gated residual), the same spectral
layer on the dense eigh basis (full GFT), ChebNet (one ChebConv of order 4: 3 hops) and GCN (3 layers:
3 hops), written in plain torch (no torch-geometric).
""")
    rep.table("Exactness suite", suite.select(
        "graph", "partition", "n", "components", "parts", "cut_edges", "eig_rel_err", "orthogonality",
        "reconstruction", "filter_rel_err"),
        note="eig_rel_err = max|lam - lam_eigh| / max|lam_eigh|; orthogonality = max|U^T U - I|; "
             "reconstruction = max|U diag(lam) U^T - L| / max|L|; filter = ||h(L)X - expm|| / ||expm||.")
    cols = ["n", "bridges", "parts", "cut_edges", "factorize_s", "partition_s", "local_eigh_s", "updates_s",
            "eigh_s", "eig_rel_err", "orthogonality", "reconstruction"]
    rep.table("Scaling in n", sn.select(cols),
              note=f"Fitted exponents t ~ n^p: L2G p = {ex['l2g_n']:.2f}, dense eigh p = {ex['eigh_n']:.2f}.")
    rep.table("Scaling in cut size", sk.select(cols),
              note=f"Fitted exponent in the number of cut edges: total {ex['l2g_k']:.2f}, "
                   f"rank-one updates alone {ex['l2g_updates_k']:.2f}.")

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    n, tl, te = sn["n"].to_numpy(), sn["factorize_s"].to_numpy(), sn["eigh_s"].to_numpy()
    for y, label, mk in ((tl, "L2G factorize", "o"), (te, "dense eigh (LAPACK)", "s")):
        p, fit = _fit_line(n, y)
        axes[0].loglog(n, y, mk, label=f"{label}: ~n^{p:.2f}")
        axes[0].loglog(n, fit, "--", color=axes[0].lines[-1].get_color())
    axes[0].set(xlabel="nodes n", ylabel="CPU seconds", title=f"runtime vs n ({int(sn['bridges'][0])} bridges)")
    axes[0].legend()
    k = np.maximum(sk["cut_edges"].to_numpy(), 1)
    for y, label, mk in ((sk["factorize_s"].to_numpy(), "L2G factorize (total)", "o"),
                         (sk["updates_s"].to_numpy(), "rank-one updates only", "^"),
                         (sk["eigh_s"].to_numpy(), "dense eigh", "s")):
        p, fit = _fit_line(k, y)
        axes[1].loglog(k, y, mk, label=f"{label}: ~k^{p:.2f}")
        axes[1].loglog(k, fit, "--", color=axes[1].lines[-1].get_color())
    axes[1].set(xlabel="cut edges k", ylabel="CPU seconds", title=f"runtime vs cut size (n = {int(sk['n'][0])})")
    axes[1].legend()
    rep.figure("scaling", fig, "Runtime of the L2G factorization and of dense eigh vs n (left) and vs the number "
               "of cut edges (right), log-log with fitted power laws.")
    rep.plot("scaling_n", sn.select("n", "factorize_s", "eigh_s"))
    rep.plot("scaling_k", sk.select("cut_edges", "factorize_s", "updates_s", "eigh_s"))

    fig, ax = plt.subplots(figsize=(7, 3.8))
    errs = suite.with_columns(pl.concat_str([pl.col("graph"), pl.col("partition")], separator="/").alias("g"))
    x = np.arange(errs.height)
    for j, col in enumerate(("eig_rel_err", "orthogonality", "reconstruction", "filter_rel_err")):
        ax.semilogy(x + 0.1 * j, np.maximum(errs[col].to_numpy(), 1e-18), "o", label=col)
    ax.axhline(1e-8, color="k", ls=":", label="1e-8 claim threshold")
    ax.set_xticks(x, errs["g"].to_list(), rotation=70, fontsize=7)
    ax.set_ylabel("error")
    ax.legend(fontsize=7)
    rep.figure("exactness", fig, "Errors of the factorization against dense eigh / expm on the exactness suite.")

    task = pl.DataFrame([{"model": k, "params": v["params"], "test_mse": v["test_mse"], "test_r2": v["test_r2"]}
                         for k, v in res["task"].items()])
    rep.table("Long-range task (test signals)", task)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    curves = []
    for kind, info in train["models"].items():
        ep = [h["epoch"] for h in info["history"]]
        mse = [h["val_mse"] for h in info["history"]]
        axes[0].semilogy(ep, mse, label=f"{kind} ({info['params']} params)")
        curves += [{"model": kind, "epoch": e, "val_mse": m} for e, m in zip(ep, mse)]
    axes[0].set(xlabel="epoch", ylabel="validation MSE", title="training")
    axes[0].legend()
    axes[1].bar(task["model"].to_list(), task["test_r2"].to_list())
    for i, (r2, p) in enumerate(zip(task["test_r2"].to_list(), task["params"].to_list())):
        axes[1].text(i, r2, f"{r2:.3f}\n{p} par.", ha="center", va="bottom", fontsize=8)
    axes[1].set(ylabel="test R^2", title="long-range heat-diffusion regression", ylim=(min(0.0, *task["test_r2"].to_list()), 1.2))
    rep.figure("task", fig, "Part B: validation curves and test R^2 (parameter counts annotated).")
    if curves:
        rep.plot("val_curves", pl.DataFrame(curves))

    measured = {k for k in res["task"]}
    claims = [c for c in CLAIMS if not any(name.startswith("task.") and name.split(".")[1] not in measured
                                           for name in c.names())]
    held = {v["name"]: v["holds"] for v in evaluate_claims(claims, metrics)}
    rep.section("Reading the verdicts", _discussion(metrics, held))
    rep.finish(claims, metrics)


def _discussion(m: dict, held: dict[str, bool]) -> str:
    e, s, t = m["exactness"], m["scaling"], m["task"]
    verdict = ", ".join(f"{k}: {'holds' if v else 'does NOT hold'}" for k, v in held.items())
    lines = [
        f"- Verdicts at this scale: {verdict}.",
        f"- Exactness: over {e['graphs_checked']} factorizations the largest eigenvalue error is "
        f"{e['max_eig_rel_err']:.1e}, orthogonality {e['max_orthogonality']:.1e}, reconstruction "
        f"{e['max_reconstruction']:.1e}, heat-filter error {e['max_filter_rel_err']:.1e} (claim threshold 1e-8).",
        f"- Scaling: fitted exponents n^{s['l2g_exponent_n']:.2f} (L2G) vs n^{s['eigh_exponent_n']:.2f} "
        f"(dense eigh) for n up to {s['largest_n']}; at that size L2G took {s['l2g_s_at_largest_n']:.2f} s and "
        f"eigh {s['eigh_s_at_largest_n']:.2f} s. The constants favour LAPACK at these sizes (our updates are "
        "numpy, eigh is compiled); the claim is about the exponent. Cut size: the rank-one updates grow as "
        f"k^{s['l2g_update_exponent_k']:.2f}, the whole factorization as k^{s['l2g_exponent_k']:.2f}.",
    ]
    if all(k in t for k in ("l2g", "chebnet", "gcn")):
        lines.append(
            f"- Long-range task: test R^2 L2G-Net {t['l2g']['test_r2']:.4f} ({t['l2g']['params']} params) vs "
            f"ChebNet {t['chebnet']['test_r2']:.4f} ({t['chebnet']['params']}) and GCN {t['gcn']['test_r2']:.4f} "
            f"({t['gcn']['params']})" + (f"; full-GFT spectral net {t['full_gft']['test_r2']:.4f} "
                                        f"({t['full_gft']['params']})." if "full_gft" in t else "."))
    lines.append("- Deviations from the paper, stated plainly: the partitioner is recursive spectral bisection "
                 "(Fiedler sweep cut, scipy) rather than METIS; the secular sums are sign-separated pairwise sums "
                 "(as LAPACK dlaed4) rather than Kahan-compensated sums; the root iteration is a two-pole rational "
                 "(Bunch-Nielsen-Sorensen) step safeguarded by bisection rather than plain Newton; the gated "
                 "residual is H + sigmoid(gamma) * GELU(W H_filt + b) with a per-channel gate; the B-spline knots are "
                 "uniform on a log-warped eigenvalue axis. Timings are CPU seconds of one single-threaded process.")
    lines.append("- Not reproduced at this scale: the Minesweeper benchmark and the Polynormer comparison "
                 "(the task here is synthetic heat diffusion), and the 20k-node timings (the full profile "
                 "sets them).")
    return "\n".join(lines)
