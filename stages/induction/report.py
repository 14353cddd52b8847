"""report: INDUCTION -- validity, size, held-out generalization and difficulty by depth."""
from __future__ import annotations

import json

import matplotlib.pyplot as plt
import numpy as np
import polars as pl

from stages.common.claims import Better, Bound, Claim
from stages.common.config import ReportConfig
from stages.common.paths import read_json
from stages.common.reporting import Report
from stages.common.runner import StageContext
from stages.induction.concept_synth import family_of

# Findings: statements of the paper card (enumeration solves most FULLOBS instances; compact formulas
# generalize better than bloated ones; difficulty rises with depth), on the synthetic suite and -- when the
# upstream release is vendored -- on the released tasks. Checks: baselines' sanity, the project's grammar
# extensions, the synthetic families suite, and the loader's agreement with the published upstream results.
# Every threshold lives in params.yaml under papers.induction.report.claims.
CLAIMS = [
    Bound("enumeration_solves_fullobs",
          "Bottom-up enumeration solves most FULLOBS instances within the formula-count budget (a compact, "
          "exactly valid formula, not the fallback), per generator seed",
          kind="finding", value="per_seed_solved.fullobs", items_shared=False,
          refuted_by="the per-seed FULLOBS solve rate (instances as items) not above the bound beyond its one-sided "
                     "t-bound (fails if surely at or below it)"),
    Better("compact_generalizes",
           "Among training-valid formulas, compact (enumerated) ones generalize to held-out worlds better than the "
           "bloated decision-tree fit on the same instances, by more than min_effect of held-out object accuracy",
           kind="finding", a="heldout.items.compact_acc", b="heldout.items.bloated_acc", items_shared=False,
           refuted_by="the paired per-instance gap (compact - bloated held-out accuracy, seeds x instances) not above "
                      "min_effect beyond its one-sided t-bound (fails if surely below min_effect)"),
    Claim("difficulty_rises_with_depth",
          "Difficulty rises sharply with gold formula depth: search effort grows by >= k100 x from the "
          "shallowest to the deepest templates and the budgeted solve rate is lower at the deepest",
          "difficulty.effort_ratio >= param.k100 and difficulty.solve_rate_deep < difficulty.solve_rate_shallow",
          kind="finding",
          refuted_by="median formulas generated at the deepest templates < k100 x the shallowest, or the deepest "
                     "templates solved at least as often within the same count budget"),
    Better("bloated_beats_majority",
           "Baseline sanity: the bloated decision-tree fit generalizes better than a constant majority-label "
           "classifier (any improvement: min_effect 0), so the compact-vs-bloated gap is not against a strawman",
           kind="check", a="heldout.items.bloated_acc", b="heldout.items.majority_acc", items_shared=False,
           refuted_by="the bloated fit's held-out accuracy not above the majority classifier's"),
    Claim("reaches_outside_fragment",
          "The project's extended guarded grammar (pairs of guard literals, x != y, a nested guard back to x) "
          "solves concepts outside the original one-literal-guard fragment with near-gold size",
          "fragment.outside.solve_rate >= param.k0_5 and fragment.outside.median_size_over_gold <= param.k1_5",
          kind="check",
          refuted_by="fewer than half of the outside-fragment instances solved within the budget, or their "
                     "solutions more than 1.5x the gold size (memorizing fallbacks)"),
    Better("lift_beats_guarded_synthetic",
           "Synthetic families suite (the project's own generator for the upstream family names, not the upstream "
           "tasks): the two-bank lift enumerator solves more instances than the guarded grammar, per generator seed",
           kind="check", a="bench.per_seed.lift_solve_rate", b="bench.per_seed.guarded_solve_rate",
           refuted_by="per-seed lift solve rate not above the guarded grammar's + min_effect beyond its t-bound"),
    Bound("lift_generalizes_synthetic",
          "Synthetic families suite: formulas the lift enumerator finds label fresh worlds of the same hidden "
          "concept correctly (held-out object accuracy above the bound, per generator seed)",
          kind="check", value="bench.per_seed.lift_heldout_acc_solved",
          refuted_by="per-seed held-out object accuracy of the solved formulas not above the bound beyond its t-bound"),
]

# The same findings on the released upstream tasks (stages/induction/upstream); inconclusive (no values) when
# the release is not vendored in the run. The check that the loader + evaluator reproduce what upstream published
# for its own LLM runs is declared only when the release is vendored.
CLAIMS += [
    Bound("upstream_enumeration_solves",
          "On the released upstream tasks (new36 FullObs families, quantifier depth 2-3, domains 9-11), enumeration "
          "in the grammar that reaches the task's regime (lift) solves most of them within the count budget",
          kind="finding", value="upstream.per_fold.solved",
          refuted_by="per-fold solve rate (tasks as items, shared across folds) not above the bound beyond its "
                     "one-sided t-bound"),
    Better("upstream_compact_generalizes",
           "On the released upstream tasks, compact enumerated formulas label the held-out released worlds better "
           "than the bloated decision-tree fit trained on the same worlds, by more than min_effect of object accuracy",
           kind="finding", a="upstream.per_fold.compact_acc", b="upstream.per_fold.bloated_acc",
           refuted_by="the paired per-task gap (compact - bloated held-out accuracy, folds x tasks) not above "
                      "min_effect beyond its one-sided t-bound"),
]
UPSTREAM_CHECKS = [
    Claim("upstream_published_results_reproduced",
          "Loader and evaluator agree with upstream: every published LLM formula re-evaluated on the vendored "
          "holdout worlds gets the published holdout verdict, and its AST size in upstream's convention (n-ary "
          "and/or counted as nested binary) equals the published correct_ast",
          "upstream.llm_recheck.n_checked >= 1 and upstream.llm_recheck.mismatches == 0 "
          "and upstream.llm_recheck.ast_mismatches == 0",
          kind="check",
          refuted_by="any published holdout verdict or AST size that the project's loader + semantics do not "
                     "reproduce (a schema or semantics mismatch)"),
]


class Config(ReportConfig):
    pass


def _fig_depth(diff_rows: pl.DataFrame):
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    for regime, marker in (("fullobs", "o"), ("ci", "s"), ("ec", "^"), ("all", "D")):
        r = diff_rows.filter(pl.col("regime") == regime).sort("depth")
        if r.height:
            a.plot(r["depth"], r["solve_rate"], marker=marker, label=regime, lw=2.5 if regime == "all" else 1.2)
            b.plot(r["depth"], r["median_generated"], marker=marker, label=regime, lw=2.5 if regime == "all" else 1.2)
    a.set(xlabel="gold quantifier depth", ylabel="enumeration valid within budget", ylim=(-0.05, 1.05),
          title="budgeted solve rate")
    b.set(xlabel="gold quantifier depth", ylabel="formulas generated (median)", yscale="log",
          title="search effort (censored at the budget)")
    a.legend()
    for ax in (a, b):
        ax.set_xticks(sorted(set(diff_rows["depth"].to_list())))
    return fig


def _fig_heldout(res: pl.DataFrame):
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for solver, color in (("enum", "tab:blue"), ("bloated", "tab:red")):
        r = res.filter((pl.col("solver") == solver) & (pl.col("solved") if solver == "enum" else pl.col("valid")))
        jitter = np.random.default_rng(0).uniform(-0.01, 0.01, r.height)
        ax.scatter(r["size"], r["heldout_acc"].to_numpy() + jitter, s=14, alpha=0.6, color=color,
                   label=f"{solver} (training-valid, n={r.height})")
    ax.set(xscale="log", xlabel="formula AST size (log)", ylabel="held-out object accuracy",
           title="compact vs bloated formulas on fresh worlds")
    ax.legend()
    return fig


def _fig_bench(fam: pl.DataFrame):
    fig, ax = plt.subplots(figsize=(10, 4))
    x = np.arange(fam.height)
    for k, (col, label, color) in enumerate((("lift_solve_rate", "lift enumeration", "tab:blue"),
                                             ("guarded_solve_rate", "guarded grammar", "tab:red"))):
        ax.bar(x + (k - 0.5) * 0.4, fam[col].fill_null(0).to_numpy(), width=0.4, label=label, color=color)
    ax.set_xticks(x, [f.replace("_qd", "\nqd").replace("_lift", "") for f in fam["family"].to_list()],
                  fontsize=7, rotation=30, ha="right")
    ax.set(ylabel="solved (train-valid) fraction", ylim=(0, 1.05),
           title="SYNTHETIC families (project generator, not the upstream tasks): solve rate")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _fig_upstream(fam: pl.DataFrame, models: list[str]):
    fig, ax = plt.subplots(figsize=(10, 4.2))
    x = np.arange(fam.height)
    cols = [("solve_rate", "this run: solved (train-valid)", "tab:blue"),
            ("heldout_exact_solved", "this run: held-out world exact (solved)", "tab:cyan")]
    for model, color in zip(models, ("tab:gray", "tab:brown", "tab:olive", "tab:pink")):
        cols.append((f"{model}_train_rate", f"{model}: train-correct (published)", color))
    w = 0.8 / len(cols)
    for k, (col, label, color) in enumerate(cols):
        ax.bar(x + (k - (len(cols) - 1) / 2) * w, fam[col].fill_null(0).to_numpy(), width=w, label=label, color=color)
    ax.set_xticks(x, [f.replace("_qd", "\nqd").replace("_lift", "") for f in fam["family"].to_list()],
                  fontsize=7, rotation=30, ha="right")
    ax.set(ylabel="fraction", ylim=(0, 1.05), title="released upstream tasks: this run vs published LLM (same task ids)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig


def _fig_upstream_budget(curve: pl.DataFrame):
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    ax.plot(curve["budget_generated"], curve["solve_rate"], marker="o")
    ax.set(xscale="log", xlabel="budget per task (formulas generated)", ylabel="solved (train-valid)",
           ylim=(-0.05, 1.05), title="released upstream tasks: budgeted solve rate")
    return fig


def _fig_budget(budget_rows: pl.DataFrame):
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for regime in ("fullobs", "ci", "ec"):
        r = budget_rows.filter(pl.col("regime") == regime).sort("budget_generated")
        if r.height:
            ax.plot(r["budget_generated"], r["valid_rate"], marker="o", label=regime)
    ax.set(xscale="log", xlabel="budget per instance (formulas generated)", ylabel="solved (valid, compact)",
           ylim=(-0.05, 1.05), title="budgeted validity (enumeration)")
    ax.legend()
    return fig


def _fig_size(res: pl.DataFrame):
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for solver, color in (("enum", "tab:blue"), ("bloated", "tab:red")):
        r = res.filter((pl.col("solver") == solver) & (pl.col("solved") if solver == "enum" else pl.col("valid")))
        ax.scatter(r["gold_size"], r["size"], s=14, alpha=0.6, color=color, label=solver)
    lim = [2, max(30, int(res["gold_size"].max()) + 2)]
    ax.plot(lim, lim, "k--", lw=0.8, label="size = gold")
    ax.set(yscale="log", xlabel="gold formula size", ylabel="found formula size (log)", title="size vs gold")
    ax.legend()
    return fig


def _fig_guided(gdf: pl.DataFrame):
    fig, ax = plt.subplots(figsize=(5, 4.5))
    for regime, marker in (("fullobs", "o"), ("ci", "s"), ("ec", "^")):
        r = gdf.filter(pl.col("regime") == regime)
        ax.scatter(r["plain_generated"] + 1, r["guided_generated"] + 1, marker=marker, s=18, alpha=0.7, label=regime)
    hi = max(10, float(max(gdf["plain_generated"].max(), gdf["guided_generated"].max())) * 2)
    ax.plot([1, hi], [1, hi], "k--", lw=0.8)
    ax.set(xscale="log", yscale="log", xlabel="plain enumeration: formulas generated",
           ylabel="ranker-guided: formulas generated", title="search effort with the neural ranker")
    ax.legend()
    return fig


def run(cfg: Config, ctx: StageContext) -> None:
    ev = ctx.input("evaluate")
    m = read_json(ev / "metrics.json")
    res = pl.read_csv(ev / "results.csv")
    prep_meta = read_json(ctx.input("prepare") / "meta.json")
    enum = res.filter(pl.col("solver") == "enum")
    diff_rows = []
    for regime in ("fullobs", "ci", "ec", "all"):
        r = enum if regime == "all" else enum.filter(pl.col("regime") == regime)
        for depth in sorted(r["depth"].unique().to_list()):
            d = r.filter(pl.col("depth") == depth)
            diff_rows.append({"regime": regime, "depth": depth, "n": d.height, "solve_rate": float(d["solved"].mean()),
                              "median_generated": float(d["generated"].median())})
    diff_df = pl.DataFrame(diff_rows)
    budget_df = pl.DataFrame([{"regime": reg, "budget_generated": int(k[1:]), "valid_rate": v}
                              for reg, block in m["budgeted"].items() for k, v in block.items()])
    claim = ("Compact first-order concept formulas found by bottom-up enumeration generalize to fresh worlds far "
             "better than bloated fits that are equally valid on the training worlds; enumeration solves most fully "
             "observed instances within a small budget, and difficulty rises sharply with the gold formula's "
             "quantifier depth.")
    rep = Report(ctx, "INDUCTION: finite-structure concept synthesis", claim)
    n_tmpl = len(prep_meta["templates"])
    n_out = sum(v == "outside" for v in prep_meta.get("fragment", {}).values())
    rep.section("Setup", f"""
{m['n_instances']} generated instances ({json.dumps(prep_meta['per_regime'])}; generator seeds {m['seeds']}, one
independent instance set per seed) from {n_tmpl} gold templates of quantifier depth 0-3, {n_out} of them outside the
original one-literal-guard fragment (mutual edges, a successor other than x via `(= x y)`, a 3-cycle back to x).
Domains of 5-8 objects; FULLOBS 4 worlds, CI 6 YES + 2 NO worlds, EC 4 worlds with each atom unknown with prob.
0.35; every instance has fresh, fully observed held-out worlds of the same hidden concept.

Solvers: (A) bottom-up enumeration by AST size with exact observational-equivalence pruning over bit-packed
signatures (quantifier productions batched through the `quantifier_eval` kernel), with a **count budget** of
generated formulas per instance and a size cap (max_size >= the largest gold size, checked before work); a
wall-clock safety net fired on {m['safety_net_fired']} instance(s). When enumeration finds nothing within budget
its output line carries the bloated formula marked `"status": "fallback"`; fallbacks are never counted as solved.
(B) the "bloated" fitter: a CART decision tree grown to purity over a bank of {29} enumerated unary features
(atoms and depth-1 guarded quantifiers, extended only to separate clashing objects), read off as a DNF over its
positive leaves. Validity is exact (`python -m stages.induction.check`: numpy evaluation, EC with z3, each world
its own completion). Held-out accuracy is computed through the kernel-backed evaluator and cross-checked against
numpy: {m['kernel']['evaluator_mismatches']} disagreements, {m['kernel']['numpy_fallbacks']} formulas outside the
compiled fragment (evaluated by numpy).
In EC, observational equivalence is judged on the Kleene bounds plus 8 sampled completions per world: this can drop
a formula that differs only on unsampled completions (completeness), never admit an invalid one.
""")
    val_rows = []
    for solver in ("enum", "bloated"):
        for regime, b in m[solver].items():
            val_rows.append({"solver": solver, "regime": regime, "n": b["n"], "solved/valid rate": b["valid_rate"],
                             "fallback rate": b["fallback_rate"], "median_size": b["median_size"],
                             "median_size/gold": b["median_size_over_gold"],
                             "heldout_acc": b["heldout_acc_valid"]})
    rep.table("Validity and size per regime", pl.DataFrame(val_rows),
              "enum: rate of instances solved by a compact, exactly valid formula within the count budget (fallback "
              "lines counted apart); bloated: training validity of the tree DNF. Sizes are AST sizes.")
    h = m["heldout"]
    ps = h["per_seed"]
    rep.table("Held-out generalization (instances where both solvers are training-valid)", pl.DataFrame([
        {"formulas": "compact (enumeration)", "n": h["n_pairs"], "median_size": h["compact_median_size"],
         "heldout_object_acc": h["compact_acc"], "heldout_worlds_exact": h["compact_exact"]},
        {"formulas": "bloated (decision-tree DNF)", "n": h["n_pairs"], "median_size": h["bloated_median_size"],
         "heldout_object_acc": h["bloated_acc"], "heldout_worlds_exact": h["bloated_exact"]},
        {"formulas": "reference: constant majority label", "n": h["n_pairs"], "median_size": float("nan"),
         "heldout_object_acc": h["majority_acc"], "heldout_worlds_exact": float("nan")}]),
        f"Per seed {ps['seed']}: compact {[round(v, 3) for v in ps['compact_acc']]}, bloated "
        f"{[round(v, 3) for v in ps['bloated_acc']]}, majority {[round(v, 3) for v in ps['majority_acc']]}. The "
        f"bloated baseline {'beats' if h['bloated_minus_majority'] > 0 else 'does NOT beat'} the majority classifier "
        f"({h['bloated_acc']:.1%} vs {h['majority_acc']:.1%}).")
    frag_rows = [{"fragment": k, **v} for k, v in m["fragment"].items()]
    rep.table("Inside vs outside the original grammar fragment (enumeration)", pl.DataFrame(frag_rows),
              "inside: every quantifier body mentions x through one guard literal (the original grammar); outside: "
              "two literals over x, y (incl. `(= x y)`) or a nested quantifier that mentions x again.")
    tmpl = (enum.group_by("template", "fragment", maintain_order=True).agg(pl.len().alias("n"), pl.col("solved").mean().alias("solve_rate"),
                                                       (pl.col("size") / pl.col("gold_size")).filter(pl.col("solved"))
                                                       .median().alias("median_size/gold"),
                                                       pl.col("heldout_acc").filter(pl.col("solved")).mean()
                                                       .alias("heldout_acc_solved"),
                                                       (pl.col("status") == "fallback").sum().alias("fallbacks"))
            .sort("template"))
    rep.table("Per template (enumeration, all regimes and seeds)", tmpl)
    d = m["difficulty"]
    medians = [d[f"depth_{k}"]["median_generated"] for k in range(d["shallowest"], d["deepest"] + 1) if f"depth_{k}" in d]
    drops = [f"depth {d['shallowest'] + k} -> {d['shallowest'] + k + 1}" for k in range(len(medians) - 1)
             if medians[k + 1] < medians[k]]
    monotone_note = (" (not monotone: the median falls at " + ", ".join(drops) +
                     "; deeper templates are sometimes explained by shorter formulas)") if drops else " (monotone)"
    ec_ratio = m["enum"].get("ec", {}).get("median_size_over_gold", float("nan"))
    rep.section("Observations", f"""
- Compact vs bloated: on the {h['n_pairs']} instances where both are valid on the training worlds, the
  enumerated formulas (median size {h['compact_median_size']:.0f}) label {h['compact_acc']:.1%} of held-out objects
  correctly and {h['compact_exact']:.1%} of held-out worlds exactly; the decision-tree DNFs (median size
  {h['bloated_median_size']:.0f}) reach {h['bloated_acc']:.1%} and {h['bloated_exact']:.1%}, against
  {h['majority_acc']:.1%} for a constant majority-label classifier.
- Depth: the enumeration solves {d['solve_rate_shallow']:.0%} of depth-{d['shallowest']} and
  {d['solve_rate_deep']:.0%} of depth-{d['deepest']} instances within the count budget; its median search effort
  grows {d['effort_ratio']:.0f}x from depth {d['shallowest']} to depth {d['deepest']}{monotone_note}. Failures are now
  budget failures (max_size is >= every gold size): see the per-template table.
- EC: median size/gold of solved enumerated formulas is {ec_ratio:.2f} (each world may complete its unknown
  atoms its own way, so smaller formulas often explain the observations), with held-out accuracy
  {m['enum'].get('ec', {}).get('heldout_acc_valid', float('nan')):.1%} against
  {m['enum'].get('fullobs', {}).get('heldout_acc_valid', float('nan')):.1%} for FULLOBS.
""")
    rep.table("Difficulty by gold depth (enumeration)", diff_df.filter(pl.col("regime") == "all").drop("regime"))
    rep.figure("difficulty_by_depth", _fig_depth(diff_df),
               "Enumeration: solved within the count budget (left) and formulas generated until success or budget "
               "(right) by gold quantifier depth.")
    rep.figure("heldout_vs_size", _fig_heldout(res),
               "Held-out object accuracy of training-valid formulas against their size.")
    rep.figure("budgeted_validity", _fig_budget(budget_df), "Fraction of instances solved within each formula budget.")
    rep.figure("size_vs_gold", _fig_size(res), "Size of valid found formulas against the gold formula's size.")
    if "guided" in m:
        g = m["guided"]
        rep.table("Optional (C): neural-ranker-guided enumeration (ranker's held-out split)", pl.DataFrame([
            {"enumeration": "plain (by AST size)", "n": g["n"], "valid_rate": g["plain_valid_rate"],
             "median_generated": g["plain_median_generated"], "median_size (both valid)": g["plain_median_size"]},
            {"enumeration": "ranker-guided (size + learned penalties)", "n": g["n"], "valid_rate": g["guided_valid_rate"],
             "median_generated": g["guided_median_generated"], "median_size (both valid)": g["guided_median_size"]}]),
            f"A LightningModule scores the atom/guard productions from depth-1 label agreement; it is trained on "
            f"the productions used by plain enumeration's solutions of the other split. Guided search used less "
            f"effort on {g['frac_less_effort']:.0%} of instances (mean log10 effort ratio "
            f"{g['mean_log10_effort_ratio']:+.2f}; negative = less). Same count and size budgets.")
        gdf = pl.read_csv(ev / "guided.csv")
        rep.figure("ranker_effort", _fig_guided(gdf),
                   "Formulas generated per instance: plain vs ranker-guided enumeration (below the diagonal = guided "
                   "needed fewer).")
        rep.plot("ranker_effort", gdf, x="plain_generated", y="guided_generated", template="scatter",
                 title="formulas generated: plain vs ranker-guided enumeration")
    up_meta = prep_meta.get("upstream", {"vendored": False, "reason": "prepare wrote no upstream block"})
    if m.get("upstream"):
        _upstream_section(rep, m["upstream"], up_meta)
    else:
        rep.section("Upstream released benchmark (not vendored in this run)", f"""
The released concept-synth tasks are not part of this run: {up_meta.get('reason', '')}. The loader for the
upstream schema (`stages/induction/concept_synth.py`: benchmark records, generated IID holdout worlds, published
model reports) is tested on a hand-written fixture in that schema (`tests/induction/test_concept_synth.py`,
`pytest -m real_source`). What remains: vendoring the upstream files with their MIT licence and source commit
under `stages/induction/upstream/` (see `stages/induction/upstream/README.md`); the pipeline then builds the
tasks, solves them and compares with the published LLM results on the same task ids, with no code change.
""")
    b = m.get("bench")
    if b:
        _synthetic_families_section(rep, b)
    rep.table("Deviations", pl.DataFrame(_deviations(n_tmpl, n_out, up_meta)))
    rep.section("Threats to validity", _threats(m, up_meta))
    rep.section("Discussion", f"""
The paper evaluates frontier LLMs on the benchmark (FULLOBS / CI / EC, with held-out worlds) and finds that
compact formulas generalize while bloated, memorizing ones do not; it also reports that harder families
(quantifier depth 2-3 "lifts", domains of 9-11 objects) defeat most models. This miniature does not evaluate any
LLM; it checks the benchmark's mechanics and the compact-vs-bloated finding with a symbolic synthesizer at
laptop scale ({m['n_instances']} generated instances, budget {json.dumps(list(m['budgeted'].get('fullobs', {}).keys()))}
formulas){' and on the released upstream tasks loaded from the vendored files' if m.get('upstream') else ''}.
Published LLM numbers are quoted from upstream's report files and re-checked on the vendored worlds, never
re-measured. Remaining limits: the guarded grammar's quantifier bodies mention the outer variable only through
one literal, a pair of literals, or a 3-cycle path back to it; the lift grammar's binary bank carries only x and
the innermost variable (no formula that refers to two enclosing bound variables at once), combines formulas by
and/or only with a small operand, and supports FULLOBS/CI only (EC: guarded grammar).
""")
    rep.plot("difficulty_by_depth", diff_df.filter(pl.col("regime") == "all").drop("regime"), x="depth",
             y=["solve_rate", "median_generated"], title="enumeration: solve rate and effort by gold depth")
    rep.plot("budgeted_validity", budget_df.filter(pl.col("regime") == "fullobs").drop("regime"),
             x="budget_generated", y="valid_rate", title="FULLOBS solved within a formula-count budget")
    sizes = (res.filter(pl.col("valid")).group_by("gold_size", "solver")
             .agg(pl.col("size").median().alias("median_size")).sort("gold_size", "solver"))
    rep.plot("size_vs_gold", sizes, x="gold_size", y="median_size", series="solver",
             title="median size of training-valid formulas by gold size")
    claims = CLAIMS + (UPSTREAM_CHECKS if m.get("upstream", {}).get("per_task_reports") else [])
    if not m.get("upstream"):         # not vendored: the released-task findings have no values (inconclusive)
        m["upstream"] = {"vendored": False, "per_fold": {"solved": [], "compact_acc": [], "bloated_acc": []}}
    verdicts = rep.finish(claims, m)
    failed = [v["name"] for v in verdicts if v["verdict"] != "holds"]
    if failed:   # say it plainly in the report too
        text = (ctx.out / "report.md").read_text()
        text += ("\n**Not holding at this scale:** " + ", ".join(failed) +
                 " (see the verdict table for the measured numbers).\n")
        (ctx.out / "report.md").write_text(text)


def _upstream_section(rep: Report, u: dict, meta: dict) -> None:
    models = sorted({mdl for e in u["per_family"].values() for mdl in e["llm"]})
    released: dict[str, list[int]] = {}
    for tid, n in meta.get("holdout_worlds_per_task", {}).items():
        released.setdefault(family_of(tid), []).append(n)
    rows = []
    for family, e in u["per_family"].items():
        row = {"family": family, "released_tasks": len(released.get(family, [])), "tasks": e["n_tasks"],
               "units": e["n_units"], "solve_rate": e["solve_rate"],
               "tasks_solved_every_fold": e["tasks_solved_every_fold"],
               "heldout_exact_solved": e["heldout_exact_solved"], "median_size": e["median_size"],
               "ref_size": e["median_ref_size"], "ref": e["ref_kind"], "size/ref": e["median_size_over_ref"],
               "median_generated": e["median_generated"]}
        for model in models:
            lt = e["llm"].get(model)
            row[f"{model}_train_correct"] = f"{lt['train_correct']}/{lt['n']}" if lt else "-"
            row[f"{model}_train_rate"] = lt["train_correct"] / lt["n"] if lt else None
            row[f"{model}_holdout_correct"] = f"{lt['holdout_correct']}/{lt['holdout_available']}" if lt else "-"
            row[f"{model}_median_ast"] = lt["median_correct_ast"] if lt else None
        rows.append(row)
    fam = pl.DataFrame(rows, infer_schema_length=None)
    e, bl, pr, rc = u["enum"], u["bloated"], u["paired"], u["llm_recheck"]
    fold_mode = u["mode"] == "holdout_folds"
    how = ("**Tasks from the released holdout worlds** (the .yaml.gz benchmark records with the released training "
           "worlds are not vendored): each released task with enough generated holdout worlds gives one fold per "
           "world j -- train on the other worlds, test on world j. These are worlds of the released hidden concept, "
           "generated upstream, but not the worlds the LLMs were shown."
           + (" The published LLM columns are for the same task ids on the released training worlds (train-correct) "
              "and on all of these holdout worlds (holdout-correct)." if u.get("per_task_reports") else "")
           if fold_mode else
           "**Tasks as released**: each benchmark record's training worlds; held out: its test worlds and the "
           "released generated holdout worlds of that task id. The LLM columns are for the same tasks.")
    paras = [" ".join(ln.strip() for ln in para.splitlines()) for para in meta.get("source", "").split("\n\n")]
    src = next((p for p in paras if p and not p.startswith("#")), "")
    n_world_counts = sorted(meta.get("holdout_worlds_per_task", {}).values())
    need = meta.get("min_worlds") or 0
    few = sum(n < need for n in n_world_counts)
    rep.section("Upstream released benchmark (vendored)", f"""
Loaded from `{meta.get('dir')}` in the upstream schema (`stages/induction/concept_synth.py`): {json.dumps(meta.get('files'))};
licence file {'present' if meta.get('licence') else '**missing**'}; provenance (`{meta.get('provenance_file')}`): {src or 'none'}
{how}

Of the {len(n_world_counts)} released tasks with a holdout line, {len(n_world_counts) - few} have at least {need}
released holdout worlds; {sum(n == 0 for n in n_world_counts)} have none and {few - sum(n == 0 for n in n_world_counts)}
have 1 to {max(need - 1, 0)} (upstream generated no more) -- too few to hold one out and train on {max(need - 1, 0)}.
{u['n_tasks']} tasks evaluated ({u['n_instances']} solver problems: tasks x folds); grammar per problem {json.dumps(u['grammars'])}
(the one that reaches the regime: lift for FullObs/CI), count budget {u['budget_generated']:,} generated formulas
each, safety net fired {u['safety_net_fired']} time(s). Enumeration solved {e['solve_rate']:.0%}
({e['n_solved']}); {_size_text(u)}; held-out worlds labelled exactly by {e['heldout_exact_solved']:.0%}
of the solved formulas. Bloated fit: training-valid {bl['valid_rate']:.0%}, median size {bl['median_size']:.0f},
held-out worlds exact {bl['heldout_exact_valid']:.0%}. On the {pr['n']} (fold, task) pairs where both are
training-valid, held-out object accuracy: compact {pr['compact_acc']:.1%} (median size {pr['compact_median_size']:.0f}),
bloated {pr['bloated_acc']:.1%} (median size {pr['bloated_median_size']:.0f}), constant majority label
{pr['majority_acc']:.1%}.

{_recheck_text(u)}
""")
    if u.get("registry"):
        reg = pl.DataFrame([{"model": r["display_name"], "id": r["id"], "evaluable": f"{r['evaluable']}/36",
                             "train_correct": f"{r['correct']}/36",
                             "holdout_correct": f"{r['holdout_correct']}/{r['holdout_evaluable']}",
                             "median_correct_ast": float(np.median(r["correct_ast"])) if r["correct_ast"] else None}
                            for r in u["registry"]])
        t = u["tasks"]
        rep.table("Published per-model aggregates over all 36 released tasks (upstream model registry)", reg,
                  f"From `{u['registry_files']}` (counts over the 36 benchmarked36 tasks on their released training "
                  "worlds; holdout: correct formulas that are also exact on every released holdout world). NOT a "
                  "same-task comparison with this run, which evaluates only the tasks with 5 released holdout worlds, "
                  "on folds of those worlds: this run solved (train-valid) "
                  f"{t['solved_every_fold']}/{t['n']} of its tasks in every fold (mean fold solve rate "
                  f"{t['mean_fold_solve_rate']:.0%}); median size of its solutions "
                  f"{float(np.median(t['solved_sizes'])) if t['solved_sizes'] else float('nan'):.0f}. The same-task "
                  "per-family comparison needs upstream's per-task reports (eval/*_challenge100_round1_report.json), "
                  "which are " + ("vendored (see the per-family table)." if u.get("per_task_reports") else
                                  "not vendored in this run."))
    show = fam.drop([c for c in fam.columns if c.endswith("_train_rate")])
    if set(show["ref"].to_list()) == {"none"}:          # no gold and no published formula: no size reference
        show = show.drop("ref_size", "ref", "size/ref")
    rep.table("Released tasks per family: this run" + (" next to the published LLM results on the same task ids"
                                                         if models else ""), show,
              "released_tasks: tasks of the family in the release; tasks: those evaluated here; units: solver problems "
              "(task x fold); solve_rate over units; heldout_exact_solved: fraction of solved formulas exact on their "
              "held-out world(s)" + ("; LLM columns count only task ids that this run also evaluated (only where both "
                                     "exist); train-correct is on the released training worlds, holdout-correct on "
                                     "every released holdout world of the task." if models else
                                     "; no per-task published result is vendored, so no LLM column (see the registry "
                                     "aggregates above)."))
    curve = pl.DataFrame([{"budget_generated": int(k[1:]), "solve_rate": v} for k, v in u["budgeted"].items()])
    rep.figure("upstream_budget", _fig_upstream_budget(curve),
               "Released upstream tasks: fraction of solver problems (task x fold) solved within each count budget of "
               f"generated formulas (the run's budget: {u['budget_generated']:,}; recorded, not tuned).")
    rep.plot("upstream_budget", curve, x="budget_generated", y="solve_rate",
             title="released upstream tasks solved within a formula-count budget")
    rep.figure("upstream_families", _fig_upstream(fam, models),
               "Released upstream tasks per family: solved and held-out-exact fractions of this run, and the published "
               "train-correct rate of each vendored LLM report on the same task ids.")
    ycols = ["solve_rate", "heldout_exact_solved"] + [f"{mdl}_train_rate" for mdl in models]
    plot_df = fam.select("family", *ycols).with_columns(pl.col(c).cast(pl.Float64) for c in ycols)
    rep.plot("upstream_families", plot_df, x="family", y=ycols, template="bar_horizontal",
             title="released upstream tasks: this run vs published LLM (same task ids)")


def _synthetic_families_section(rep: Report, b: dict) -> None:
    fam_rows = []
    for family, e in b["per_family"].items():
        fam_rows.append({
            "family": family, "qd": e["depth"], "gold_size": e["gold_size"], "n": e["lift"]["n"],
            "lift_solve_rate": e["lift"]["solve_rate"], "lift_size/gold": e["lift"]["median_size_over_gold"],
            "lift_fresh_acc": e["lift"]["heldout_acc_solved"], "lift_fresh_exact": e["lift"]["heldout_all_worlds_exact"],
            "lift_generated": e["lift"]["median_generated"],
            "guarded_solve_rate": e["guarded"]["solve_rate"], "guarded_out_size": e["guarded"]["median_output_size"],
            "guarded_fresh_acc": e["guarded"]["heldout_acc_output"]})
    fam = pl.DataFrame(fam_rows, infer_schema_length=None)
    lift, guard = b["lift"], b["guarded"]
    rep.section("Synthetic families suite (the project's generator -- NOT the upstream tasks)", f"""
A separate, synthetic suite: {b['n_instances']} instances that the project's own generator
(`stages/induction/families.py`) builds for the 10 upstream "new36" family NAMES (one independent set per
generator seed {b['seeds']}; FullObs, 4 training worlds of 9-11 objects, 4 fresh held-out worlds each). An
independent check found that these shapes are not the upstream concepts (no instantiation of them labels the
released holdout worlds of two upstream tasks correctly), so no upstream or LLM number is compared with this
suite; it measures the project's two grammars on concepts of known depth. (A') **lift enumeration** (two banks,
exact observational-equivalence pruning, canonical forms, small-operand rule), count budget
{b['budget_generated']:,} generated formulas per instance; (A) the **guarded grammar** with the main budget (+ the
bloated fallback, status "fallback"). Lift: {lift['n_solved']} solved ({lift['solve_rate']:.0%}; by depth
{json.dumps(lift['solve_rate_by_depth'])}), median size/gold {lift['median_size_over_gold']:.3g}, fresh-world
object accuracy of solved formulas {lift['heldout_acc_solved']:.1%}, all held-out worlds exact on
{lift['heldout_all_worlds_exact']:.0%} of instances. Guarded: {guard['solve_rate']:.0%} solved, fallback on
{guard['fallback_rate']:.0%} (median output size {guard['median_output_size']:.0f}).
""")
    rep.table("Synthetic families suite per family (lift vs guarded; no LLM comparison)", fam)
    rep.figure("bench_families", _fig_bench(fam),
               "SYNTHETIC families suite (project generator): fraction solved by the lift enumerator and by the "
               "guarded grammar.")
    rep.plot("bench_families", fam.select("family", "lift_solve_rate", "guarded_solve_rate"), x="family",
             y=["lift_solve_rate", "guarded_solve_rate"], template="bar_horizontal",
             title="SYNTHETIC families (project generator): solve rate")
    if b.get("ablation"):
        ab = pl.DataFrame(b["ablation"]).select("id", "family", "plain_solved", "plain_generated",
                                                 "canonical_solved", "canonical_generated", "guarded_solved",
                                                 "guarded_generated")
        rep.table("Pruning ablation (synthetic suite, first seed, depth-2 families): formulas generated until success", ab,
                  f"Plain lift (x-only atoms inside scopes, negation of anything, one and/or operand <= 7) needs "
                  f"median {float(ab['plain_generated'].median()):.3g} generated formulas, the canonical lift "
                  f"{float(ab['canonical_generated'].median()):.3g} (censored at the budget when unsolved; plain solved "
                  f"{int(ab['plain_solved'].sum())}/{ab.height}, canonical {int(ab['canonical_solved'].sum())}/{ab.height}, "
                  f"guarded {int(ab['guarded_solved'].sum())}/{ab.height}).")


def _deviations(n_tmpl: int, n_out: int, up_meta: dict) -> list[dict]:
    vend = up_meta.get("vendored")
    return [
        {"what": "solvers evaluated", "paper / official code": "frontier LLMs prompted with the worlds",
         "here": "symbolic enumeration + decision-tree baseline (+ small neural ranker); LLM numbers quoted from "
                 "upstream's published reports",
         "why": "the paper's headline evaluation is of frontier LLMs; not reproducible offline on a CPU"},
        {"what": "benchmark tasks", "paper / official code": "775 released instances (FullObs/CI/EC .yaml.gz) + the "
                                                             "new36 FullObs tasks with generated IID holdout worlds",
         "here": ("the vendored release files, loaded in their own schema" if vend
                  else "not vendored in this run (loader tested on a schema fixture)"),
         "why": ("the .yaml.gz records could not be read with the tools here; tasks are built from the released "
                 "holdout worlds (leave-one-world-out folds)" if vend and up_meta.get("mode") == "holdout_folds"
                 else "see the upstream section")},
        {"what": "synthetic suite", "paper / official code": "~10 public templates (public generator), domains 5-8",
         "here": f"{n_tmpl} templates ({n_tmpl - n_out} within, {n_out} outside the one-literal-guard fragment), "
                 "domains 5-8; plus a synthetic families suite for the 10 new36 family names (own shapes)",
         "why": "the public generator has only the simple templates; the synthetic families are labelled as such and "
                "not compared with upstream numbers"},
        {"what": "budget", "paper / official code": "LLM calls", "here": "a count of generated formulas",
         "why": "same params give the same metrics on any machine"},
        {"what": "AST size", "paper / official code": "n-ary and/or counted as nested binary (upstream evaluator)",
         "here": "upstream convention for every upstream comparison (checked against the published correct_ast); "
                 "the synthetic suite reports n-ary sizes (1 + children)",
         "why": "the card's size rule reads '1 + children'; upstream's published sizes count (and a b c) as 2 nodes"},
    ]


def _threats(m: dict, up_meta: dict) -> str:
    u = m.get("upstream") if m.get("upstream", {}).get("vendored", True) else None
    lines = [
        "Red-team pass (the author's own, adversarial, on the final design):",
        "- *Could the findings have failed?* Yes: each is a one-sided t-test against a minimum effect or bound fixed "
        "in params before the run, with test items (instances / tasks) as the item noise. `compact_generalizes` "
        "compares against the bloated fit on the same instances (paired), and that baseline is itself checked against "
        "a constant majority classifier (`bloated_beats_majority`). `difficulty_rises_with_depth` reads a fixed "
        "threshold (params) for the card's 'sharply'.",
        "- *Decided by construction?* The enumerator returns the first valid formula in size order, so compact "
        "formulas are size-minimal in its grammar by construction; generalization to held-out worlds is not fixed by "
        "that. The bloated fitter is training-valid by construction (a property, not a claim).",
        "- *Decided by budget?* Solve rates are 'within the count budget' (params); the pipeline records the budget "
        "curves (`budgeted_validity`, and `upstream_budget` for the released tasks) rather than tuning a budget to a "
        "verdict. The released-task budget (params: train.upstream_max_generated) was set before the released tasks "
        "were first solved.",
        "- *Seeds:* the solvers are deterministic and not learned; 'seeds' are generator seeds (synthetic, 3) and "
        "held-out-world folds (released tasks); the item-level variance over instances/tasks enters every verdict.",
        "- The synthetic families suite is the project's reading of family names; it is labelled, carries only "
        "checks, and is compared with no upstream number.",
    ]
    if u:
        fold = u["mode"] == "holdout_folds"
        lines += [
            "- Released tasks: " + (
                "the released training worlds (.yaml.gz records) are not vendored, so tasks are built from the "
                "released generated holdout worlds, which upstream describes as a post-selection diagnostic, not "
                "solver input: here 4 of them are the solver's input and the 5th is held out. Only tasks with 5 such "
                "worlds are evaluated (upstream generated fewer for the others, e.g. where degree-2 worlds make the "
                "concept near-constant), so the evaluated set is not all 36 tasks. Folds share worlds (each world "
                "is training input in the other folds), so folds are not independent replicates; tasks are the "
                "paired items. " if fold else "solved as released. ")
            + ("No published per-task result is vendored: the LLM numbers are per-model aggregates over all 36 "
               "tasks on other worlds, shown as context only -- no same-task comparison is claimed."
               if not u.get("per_task_reports") else
               "The LLM columns count only task ids this run evaluated."),
            ("- *Baseline strength on the released tasks:* no (fold, task) pair where both solvers are training-valid."
             if not all(isinstance(u["paired"].get(k), (int, float)) for k in ("bloated_acc", "majority_acc", "compact_acc"))
             else "- *Baseline strength on the released tasks:* the bloated decision-tree fit labels the held-out released "
            f"worlds at {u['paired']['bloated_acc']:.1%} object accuracy against {u['paired']['majority_acc']:.1%} for a "
            "constant majority label " + ("(BELOW it: `upstream_compact_generalizes` beats a baseline weaker than a "
                                          "constant, so read it with the compact-vs-majority gap, "
                                          f"{u['paired']['compact_acc']:.1%} vs {u['paired']['majority_acc']:.1%}; "
                                          "no claim checks that gap)."
                                          if u['paired']['bloated_acc'] <= u['paired']['majority_acc'] else
                                          "(above it, so the bloated baseline is not a strawman there).")),
            f"- Independent checks on data the project never generated: {u['brute_check']['n_worlds']} held-out "
            f"worlds of solved released tasks re-labelled by textbook (Tarskian) evaluation, one assignment at a time: "
            f"{u['brute_check']['mismatches']} disagree with the pipeline's evaluator. "
            + (f"Every published LLM holdout verdict on the vendored worlds re-evaluated: "
               f"{u['llm_recheck']['n_checked']} checked, {u['llm_recheck']['mismatches']} disagree."
               if u.get("per_task_reports") else
               "tests/induction/test_concept_synth.py also checks properties of the released worlds (9-11 objects, "
               "R and S out-degree exactly 2) and reproduces the issue's independent check (lift trained on 4 "
               "released worlds of guardless_cross_scope_lift_qd2_003, exact on the 5th)."),
        ]
    else:
        lines.append("- The upstream release is not vendored in this run: the released-task findings are inconclusive "
                     "(no values); the loader is tested on a hand-written fixture in the upstream schema only.")
    return "\n".join(lines) + "\n"


def _recheck_text(u: dict) -> str:
    rc = u["llm_recheck"]
    if not u.get("per_task_reports"):
        return ("No per-task published report (eval/*_challenge100_round1_report.json) is vendored, so no published "
                "formula or per-task verdict can be re-checked here and the per-family LLM columns are empty.")
    return (f"Re-check of the published results on the vendored files: {rc['n_checked']} published holdout verdicts "
            f"re-evaluated, {rc['mismatches']} disagree"
            f"{(' (' + ', '.join(rc['mismatched'][:5]) + ')') if rc['mismatched'] else ''}; {rc['n_ast']} published "
            f"correct-formula AST sizes, {rc['ast_mismatches']} differ from this project's upstream-convention size"
            f"{(' (' + ', '.join(rc['ast_mismatched'][:5]) + ')') if rc['ast_mismatched'] else ''}; "
            f"{len(rc['unparsed'])} published formula(s) the project's parser rejects. Published reports: "
            f"{json.dumps(u['published_files'])}.")


def _size_text(u: dict) -> str:
    e, t = u["enum"], u["tasks"]
    conv = "sizes in upstream's AST convention: n-ary and/or counted as nested binary"
    med = float(np.median(t["solved_sizes"])) if t["solved_sizes"] else float("nan")
    r = e["median_size_over_ref"]
    if r is not None and r == r:      # a reference exists (not NaN; write_json stores NaN as null)
        return (f"median size {med:.0f}, median size / reference {e['median_size_over_ref']:.3g}, at or below the "
                f"reference size on {e['frac_size_le_ref']:.0%} of solved problems ({conv}; reference: the gold when "
                "records are vendored, else the smallest published LLM formula that is correct on every released "
                "holdout world of the task)")
    return (f"median size of the solutions {med:.0f} ({conv}); size vs gold is not measured: no gold formula (records) "
            "and no published per-task formula is vendored")
