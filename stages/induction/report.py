"""report: INDUCTION -- validity, size, held-out generalization and difficulty by depth."""
from __future__ import annotations

import json

import matplotlib.pyplot as plt
import numpy as np
import polars as pl

from stages.common.claims import Better, Claim
from stages.common.config import StageConfig
from stages.common.paths import read_json
from stages.common.reporting import Report
from stages.common.runner import StageContext

CLAIMS = [
    Claim("enumeration_solves_fullobs",
          "Bottom-up enumeration solves most FULLOBS instances within the formula-count budget "
          "(a compact formula, not the fallback)",
          "enum.fullobs.valid_rate > 0.5",
          refuted_by="half or fewer of the FULLOBS instances solved (status 'solved' and valid) within the "
                     "budget of generated formulas"),
    Better("compact_generalizes",
           "Among training-valid formulas, compact (enumerated) ones generalize to held-out worlds better than "
           "the best of the bloated decision-tree fit and a constant majority-label classifier, by more than "
           "5 points of held-out object accuracy (per generator seed, paired instances)",
           a="heldout.per_seed.compact_acc", b="heldout.per_seed.best_baseline_acc", margin=0.05,
           refuted_by="per-seed held-out accuracy of the compact formulas not above max(bloated tree, majority) + "
                      "0.05 beyond 2 standard errors on a majority of seeds (fails if the reverse holds)"),
    Claim("difficulty_rises_with_depth",
          "Difficulty rises sharply with gold formula depth: search effort grows by >= 100x from the "
          "shallowest to the deepest templates and the budgeted solve rate is lower at the deepest",
          "difficulty.effort_ratio >= 100 and difficulty.solve_rate_deep < difficulty.solve_rate_shallow",
          refuted_by="median formulas generated at the deepest templates < 100x the shallowest, or the deepest "
                     "templates solved at least as often within the same count budget"),
    Claim("reaches_outside_fragment",
          "The extended grammar (pairs of guard literals, x != y, a nested guard back to x) solves concepts "
          "outside the original one-literal-guard fragment with near-gold size",
          "fragment.outside.solve_rate >= 0.5 and fragment.outside.median_size_over_gold <= 1.5",
          refuted_by="fewer than half of the outside-fragment instances solved within the budget, or their "
                     "solutions more than 1.5x the gold size (memorizing fallbacks)"),
]


class Config(StageConfig):
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
    rep.table("Deviations", pl.DataFrame([
        {"what": "solvers evaluated", "paper / official code": "frontier LLMs prompted with the worlds",
         "here": "symbolic enumeration + decision-tree baseline (+ small neural ranker)",
         "why": "the paper's headline evaluation is of frontier LLMs; not reproducible offline on a CPU"},
        {"what": "templates", "paper / official code": "~10 public templates + harder calibrated families "
                                                       "(depth 2-3 lifts, domains 9-11)",
         "here": f"{n_tmpl} templates ({n_tmpl - n_out} within, {n_out} outside the one-literal-guard fragment), domains 5-8",
         "why": "the harder families' definitions are not in the public generator source; see Discussion"},
        {"what": "budget", "paper / official code": "LLM calls", "here": "a count of generated formulas",
         "why": "same params give the same metrics on any machine"},
        {"what": "output size", "paper / official code": "flattened s-expressions",
         "here": "formulas as enumerated (binary and/or)",
         "why": "size equals enumeration cost, so the first valid formula is size-minimal in the grammar"},
    ]))
    rep.section("Discussion", f"""
The paper evaluates frontier LLMs on the benchmark (FULLOBS / CI / EC, with held-out worlds) and finds that
compact formulas generalize while bloated, memorizing ones do not; it also reports that harder families
(quantifier depth 2-3 "lifts", domains of 9-11 objects) defeat most models. This miniature does not evaluate any
LLM; it checks the benchmark's mechanics and the compact-vs-bloated finding with a symbolic synthesizer at
laptop scale ({m['n_instances']} instances, budget {json.dumps(list(m['budgeted'].get('fullobs', {}).keys()))}
formulas). Not reproduced: the upstream harder families (guardless cross-scope lifts, dual-role lifts, binary-guard
incoming lifts, nested containment/response on 9-11-object domains) -- their definitions are not in the public
generator source -- and any comparison with the LLM numbers the upstream repository publishes. Remaining limits of
the grammar: quantifier bodies may mention the outer variable only through one literal, a pair of literals, or a
3-cycle path back to it; concepts beyond that fall back to the bloated formula (status "fallback", counted apart).
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
