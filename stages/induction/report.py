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

CLAIMS = [
    Claim("enumeration_solves_fullobs",
          "Bottom-up enumeration solves most FULLOBS instances within the formula-count budget "
          "(a compact formula, not the fallback)",
          "enum.fullobs.valid_rate > param.k0_5",
          refuted_by="half or fewer of the FULLOBS instances solved (status 'solved' and valid) within the "
                     "budget of generated formulas", kind="finding"),
    Better("compact_generalizes",
           "Among training-valid formulas, compact (enumerated) ones generalize to held-out worlds better than "
           "the best of the bloated decision-tree fit and a constant majority-label classifier, by more than "
           "5 points of held-out object accuracy (per generator seed, paired instances)",
           a="heldout.per_seed.compact_acc", b="heldout.per_seed.best_baseline_acc", 
           refuted_by="per-seed held-out accuracy of the compact formulas not above max(bloated tree, majority) + "
                      "0.05 beyond 2 standard errors on a majority of seeds (fails if the reverse holds)", kind="finding"),
    Claim("difficulty_rises_with_depth",
          "Difficulty rises sharply with gold formula depth: search effort grows by >= 100x from the "
          "shallowest to the deepest templates and the budgeted solve rate is lower at the deepest",
          "difficulty.effort_ratio >= param.k100 and difficulty.solve_rate_deep < difficulty.solve_rate_shallow",
          refuted_by="median formulas generated at the deepest templates < 100x the shallowest, or the deepest "
                     "templates solved at least as often within the same count budget", kind="finding"),
    Claim("reaches_outside_fragment",
          "The extended grammar (pairs of guard literals, x != y, a nested guard back to x) solves concepts "
          "outside the original one-literal-guard fragment with near-gold size",
          "fragment.outside.solve_rate >= param.k0_5 and fragment.outside.median_size_over_gold <= param.k1_5",
          refuted_by="fewer than half of the outside-fragment instances solved within the budget, or their "
                     "solutions more than 1.5x the gold size (memorizing fallbacks)", kind="finding"),
    Better("lift_reaches_benchmark_families",
           "On the held-out benchmark families (upstream new36 shapes, quantifier depth 2-3, domains 9-11), the "
           "two-bank lift enumerator solves at least 30 points more instances than the guarded grammar "
           "(per generator seed, same instances)",
           a="bench.per_seed.lift_solve_rate", b="bench.per_seed.guarded_solve_rate", 
           refuted_by="per-seed lift solve rate not above the guarded grammar's + 0.3 beyond 2 standard errors on a "
                      "majority of seeds", kind="finding"),
    Bound("lift_solutions_generalize",
          "Formulas the lift enumerator finds for the benchmark families label fresh worlds of the same hidden "
          "concept correctly: held-out object accuracy above 0.9 (per generator seed)",
          value="bench.per_seed.lift_heldout_acc_solved", 
          refuted_by="per-seed held-out object accuracy of the solved formulas not above 0.9 beyond 2 standard "
                     "errors on a majority of seeds (compact but spurious formulas that fit only the 4 training worlds)", kind="finding"),
]

# Published LLM numbers on the same families: Claude Opus 5.5, Challenge100 round 1, "new36" subset, per
# family -- from SerafimBatzoglou/concept-synth benchmarks/induction/eval/claude_opus_5_5_challenge100_round1_report.json
# (by_category_or_slice): (train-correct, tasks, median AST of correct formulas, holdout correct, holdout available)
UPSTREAM_LLM = {
    "guardless_cross_scope_lift_qd2": (3, 3, 11, 1, 1),
    "guardless_same_relation_scope_lift_qd2": (2, 3, 11, 1, 1),
    "dual_role_cross_lift_qd2": (0, 4, None, 0, 0),
    "binary_guard_incoming_lift_qd2": (5, 5, 16, 5, 5),
    "filtered_ef_lift_qd2": (1, 4, 15, 1, 1),
    "compact_ef_lift_qd2": (3, 4, 15, 3, 3),
    "filtered_dual_role_lift_qd2": (1, 4, 20, 0, 0),
    "compact_response_qd3": (0, 3, None, 0, 0),
    "universal_nested_response_qd3": (1, 3, 23, 1, 1),
    "nested_containment_qd3": (3, 3, 22, 3, 3),
}
UPSTREAM_SRC = ("SerafimBatzoglou/concept-synth, benchmarks/induction/eval/claude_opus_5_5_challenge100_round1_report.json "
                "(Claude Opus 5.5, Challenge100 round 1, new36 subset: 19/36 train-correct, median AST 16)")


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
    for k, (col, label, color) in enumerate((("lift_solve_rate", "lift enumeration (this run)", "tab:blue"),
                                             ("guarded_solve_rate", "guarded grammar (this run)", "tab:red"),
                                             ("llm_rate", "Claude Opus 5.5 (upstream, new36)", "tab:gray"))):
        ax.bar(x + (k - 1) * 0.27, fam[col].fill_null(0).to_numpy(), width=0.27, label=label, color=color)
    ax.set_xticks(x, [f.replace("_qd", "\nqd").replace("_lift", "") for f in fam["family"].to_list()],
                  fontsize=7, rotation=30, ha="right")
    ax.set(ylabel="solved (train-valid) fraction", ylim=(0, 1.05), title="benchmark families: solve rate")
    ax.legend(fontsize=8)
    fig.tight_layout()
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
        rep.plot("ranker_effort", gdf)
    b = m.get("bench")
    if b:
        fam_rows = []
        for family, e in b["per_family"].items():
            llm = UPSTREAM_LLM.get(family)
            fam_rows.append({
                "family": family, "qd": e["depth"], "gold_size": e["gold_size"], "n": e["lift"]["n"],
                "lift_solve_rate": e["lift"]["solve_rate"], "lift_size/gold": e["lift"]["median_size_over_gold"],
                "lift_fresh_acc": e["lift"]["heldout_acc_solved"], "lift_fresh_exact": e["lift"]["heldout_all_worlds_exact"],
                "lift_generated": e["lift"]["median_generated"],
                "guarded_solve_rate": e["guarded"]["solve_rate"], "guarded_out_size": e["guarded"]["median_output_size"],
                "guarded_fresh_acc": e["guarded"]["heldout_acc_output"],
                "llm_correct": f"{llm[0]}/{llm[1]}" if llm else "-", "llm_rate": llm[0] / llm[1] if llm else None,
                "llm_ast": llm[2] if llm else None,
                "llm_holdout": f"{llm[3]}/{llm[4]}" if llm else "-"})
        fam = pl.DataFrame(fam_rows, infer_schema_length=None)
        lift, guard = b["lift"], b["guarded"]
        rep.section("Benchmark families (held-out suite)", f"""
{b['n_instances']} instances from the 10 upstream "new36" families (one independent set per generator seed
{b['seeds']}; FullObs, 4 training worlds of 9-11 objects, 4 fresh held-out worlds each; shapes in
`stages/induction/families.py`). (A') **lift enumeration**: two banks -- unary formulas φ(x) and binary formulas
χ(x, v) whose inner scopes may mention x again -- bottom-up by AST size with exact observational-equivalence
pruning on both banks, canonical forms and the small-operand rule, count budget {b['budget_generated']:,} generated formulas per
instance; (A) the **guarded grammar** of the main run with its budget (+ the bloated fallback, status "fallback").
Lift: {lift['n_solved']} solved ({lift['solve_rate']:.0%}; by depth {json.dumps(lift['solve_rate_by_depth'])}),
median size/gold {lift['median_size_over_gold']:.3g}, fresh-world object accuracy of solved formulas
{lift['heldout_acc_solved']:.1%}, all held-out worlds exact on {lift['heldout_all_worlds_exact']:.0%} of instances.
Guarded: {guard['solve_rate']:.0%} solved, fallback on {guard['fallback_rate']:.0%} (median output size
{guard['median_output_size']:.0f}), all held-out worlds exact on {guard['heldout_all_worlds_exact']:.0%}.
LLM columns: {UPSTREAM_SRC}; its tasks are the upstream instances, ours are regenerated from our reading of the
family shapes, so the comparison is of families, not of identical tasks.
""")
        rep.table("Per benchmark family (lift vs guarded vs published LLM)", fam.drop("llm_rate"))
        better = fam.filter(pl.col("lift_solve_rate") > pl.col("llm_rate"))["family"].to_list()
        worse = fam.filter(pl.col("lift_solve_rate") < pl.col("llm_rate"))["family"].to_list()
        rep.section("Against the published LLM numbers", f"""
Per family, the lift enumerator's solve rate (this run's budget) is above the published LLM train-correct rate on
{len(better)} famil{'y' if len(better) == 1 else 'ies'} ({', '.join(better) or 'none'}) and below it on {len(worse)}
({', '.join(worse) or 'none'}). Where both succeed, sizes agree: the enumerator's solutions are at the gold size
(median size/gold {lift['median_size_over_gold']:.3g}) and the LLM's correct formulas have median AST
{float(fam['llm_ast'].drop_nulls().median()):.3g} over these families. {_budget_note(lift, b)}
""")
        rep.figure("bench_families", _fig_bench(fam),
                   "Benchmark families: fraction solved by the lift enumerator, by the guarded grammar (this run) and "
                   "train-correct by Claude Opus 5.5 on the upstream tasks.")
        rep.plot("bench_families", fam.select("family", "lift_solve_rate", "guarded_solve_rate"), x="family",
                 y=["lift_solve_rate", "guarded_solve_rate"], title="benchmark families: solve rate")
        if b.get("ablation"):
            ab = pl.DataFrame(b["ablation"]).select("id", "family", "plain_solved", "plain_generated",
                                                     "canonical_solved", "canonical_generated", "guarded_solved",
                                                     "guarded_generated")
            rep.table("Pruning ablation (first seed, depth-2 families): formulas generated until success", ab)
            rep.section("Which pruning works", f"""
Same count budget for each arm. Plain lift (x-only atoms inside scopes, negation of anything, and/or with one
operand of size <= 7, B_n grown before U_n) needs median {float(ab['plain_generated'].median()):.3g} generated
formulas on these instances; the canonical lift (x-only atoms outside scopes, negation only of atoms and
quantified formulas, one operand <= 4, U_n tested before B_n is grown) needs {float(ab['canonical_generated'].median()):.3g}
(generated counts are censored at the budget when unsolved; plain solved {int(ab['plain_solved'].sum())}/{ab.height},
canonical {int(ab['canonical_solved'].sum())}/{ab.height}); the guarded grammar solves {int(ab['guarded_solved'].sum())}/{ab.height} of them within its budget.
No z3/CEGIS path was tried for these families (all are FullObs, where signatures decide validity exactly).
""")
    rep.table("Deviations", pl.DataFrame([
        {"what": "solvers evaluated", "paper / official code": "frontier LLMs prompted with the worlds",
         "here": "symbolic enumeration + decision-tree baseline (+ small neural ranker)",
         "why": "the paper's headline evaluation is of frontier LLMs; not reproducible offline on a CPU"},
        {"what": "templates", "paper / official code": "~10 public templates + harder calibrated families "
                                                       "(depth 2-3 lifts, domains 9-11)",
         "here": f"{n_tmpl} templates ({n_tmpl - n_out} within, {n_out} outside the one-literal-guard fragment), "
                 "domains 5-8; plus the 10 harder families as a held-out suite (see Benchmark families)",
         "why": "the public generator has only the simple templates; the harder families are rebuilt below"},
        {"what": "budget", "paper / official code": "LLM calls", "here": "a count of generated formulas",
         "why": "same params give the same metrics on any machine"},
        {"what": "output size", "paper / official code": "flattened s-expressions",
         "here": "formulas as enumerated (binary and/or)",
         "why": "size equals enumeration cost, so the first valid formula is size-minimal in the grammar"},
        {"what": "benchmark families", "paper / official code":
            "new36 FullObs tasks of 10 families, calibrated internally; gold formulas not released",
         "here": "our own generator for the same 10 family names (shapes read off the train-correct LLM formulas "
                 "published upstream; dual_role_cross_lift and compact_response have none published: own reading "
                 "of the names); out-degree per world 2-6 instead of 2",
         "why": "upstream publishes only the family names, LLM outputs and holdout worlds (several guardless "
                "tasks have no holdout world: out-degree-2 worlds make them trivial)"},
        {"what": "benchmark-family sizes", "paper / official code": "flattened s-expressions",
         "here": "lift formulas are flattened (n-ary and/or) before their size is reported",
         "why": "compare with gold sizes as written"},
    ]))
    rep.section("Discussion", f"""
The paper evaluates frontier LLMs on the benchmark (FULLOBS / CI / EC, with held-out worlds) and finds that
compact formulas generalize while bloated, memorizing ones do not; it also reports that harder families
(quantifier depth 2-3 "lifts", domains of 9-11 objects) defeat most models. This miniature does not evaluate any
LLM; it checks the benchmark's mechanics and the compact-vs-bloated finding with a symbolic synthesizer at
laptop scale ({m['n_instances']} instances, budget {json.dumps(list(m['budgeted'].get('fullobs', {}).keys()))}
formulas). The upstream harder families are regenerated from their names and published LLM solutions (not
the upstream tasks themselves) and solved by the lift enumerator; the LLM numbers are quoted, not re-measured.
Remaining limits: the guarded grammar's quantifier bodies mention the outer variable only through one literal,
a pair of literals, or a 3-cycle path back to it (fallback otherwise, counted apart); the lift grammar's binary
bank carries only x and the innermost variable (no formula that refers to two enclosing bound variables at
once), combines formulas by and/or only with a small operand, and supports FULLOBS/CI only (EC: guarded grammar);
its depth-3 families of size 22-23 need 7-15 million generated formulas and ~2.7 GB each (first measured for
seed 0: compact_response 7.0 M, nested_containment 7.6 M, universal_nested_response 14.6 M).
""")
    rep.plot("difficulty_by_depth", diff_df.filter(pl.col("regime") == "all").drop("regime"), x="depth",
             y=["solve_rate", "median_generated"], title="enumeration: solve rate and effort by gold depth")
    rep.plot("budgeted_validity", budget_df.filter(pl.col("regime") == "fullobs").drop("regime"),
             x="budget_generated", y="valid_rate", title="FULLOBS solved within a formula-count budget")
    rep.plot("results", res.drop("error"))
    verdicts = rep.finish(CLAIMS, m)
    failed = [v["name"] for v in verdicts if v["verdict"] != "holds"]
    if failed:   # say it plainly in the report too
        text = (ctx.out / "report.md").read_text()
        text += ("\n**Not holding at this scale:** " + ", ".join(failed) +
                 " (see the verdict table for the measured numbers).\n")
        (ctx.out / "report.md").write_text(text)

def _budget_note(lift: dict, b: dict) -> str:
    """What the unsolved benchmark instances say about the budget (read from this run)."""
    unsolved = {d: r for d, r in lift["solve_rate_by_depth"].items() if r < 1}
    if not unsolved:
        return (f"Every instance, depth 3 included, is solved within this run's budget of {b['budget_generated']:,} "
                "generated formulas per instance.")
    return (f"Depths {', '.join(unsolved)} are not always solved within this run's budget of "
            f"{b['budget_generated']:,} generated formulas (status \"budget\": the depth-3 families need B-bank "
            "levels up to size 20-21 and 7-15 M generated formulas).")
