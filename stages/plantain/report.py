"""report: seed-aware verdicts on PLANTAIN's claims — time to first visible response (TTFR) of
plan-first interleaved vs think-then-answer models, pass@1 not dropping, Rewind-and-Repeat at plan
level reaching a target accuracy with fewer tokens than at answer level, and the effect of the
r_helpful reward on plan validity — with TTFR distributions and accuracy-vs-token-budget curves.

    python -m stages report plantain [--profile smoke]
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import polars as pl

from stages.common.claims import Better, Bound
from stages.common.config import ReportConfig
from stages.common.paths import read_json
from stages.common.reporting import Report
from stages.common.runner import StageContext
from stages.plantain.task import CHANCE, MOD

CLAIMS = [
    Bound("ttfr_drop_60",
          "Plan-first interleaved reasoning cuts the time to first visible response by more than 60% vs "
          "think-then-answer (TTFR in tokens on the models' own greedy traces, both after SFT + GRPO; value = "
          "1 − TTFR_pf/TTFR_tta). Both models choose how many steps to draft before their first visible token "
          "(SFT traces draft 0..n steps, and a longer draft means fewer plan errors), so TTFR is the models' choice",
          value="derived.ttfr_reduction",
          refuted_by="the per-seed TTFR reduction not above 0.6 beyond the t-bound: e.g. both models drafting every "
                     "step before the plan (1 − (4n + 5)/(11n + 8), ≈ 0.597 on these problems), or a plan-first "
                     "model drifting back to think-then-answer under RL",
          kind="finding"),
    Bound("ttfr_format_reference",
          "The format alone: on the test problems, reference traces with no draft (plan-first 4 tokens before the "
          "plan, think-then-answer 7n + 7) give a TTFR reduction above 0.6. A check: it needs no model",
          value="derived.ttfr_reduction_reference",
          refuted_by="the no-draft reference reduction not above 0.6", kind="check"),
    Bound("pass1_no_drop",
          "pass@1 does not drop: plan-first minus think-then-answer pass@1 (greedy, held-out problems, both after "
          "SFT + GRPO) stays above minus the tolerance in params (the paper's +6% is not promised here)",
          value="derived.pass1_delta",
          refuted_by="the pass@1 delta below minus the tolerance beyond 2 s.e. on a majority of seeds", kind="finding"),
    Better("plan_rewind_fewer_tokens",
           "Rewind-and-Repeat at plan level reaches the target accuracy with fewer generated tokens (all attempts "
           "counted) than repeating whole answers, on the plan-first SFT model whose plans are often faulty. A check, "
           "not a finding: both levels act on the same plan judge's verdict on the same samples, so answer level "
           "keeps the same or a later attempt and pays whole traces for it; it can win only by also catching "
           "arithmetic errors (red team: 1.9% of accepted plans)",
           a="rr.sft.plan.tokens_to_target", b="rr.sft.answer.tokens_to_target", higher_is_better=False,
           refuted_by="answer-level repetition (which also checks the arithmetic, so it can fix execution errors "
                      "that plan-level rewinding cannot) reaching the target with fewer tokens beyond 2 s.e.", kind="check"),
    Better("plan_rewind_fewer_tokens_after_rl",
           "The same on the plan-first model after GRPO (fewer faulty plans left to fix); a check for the same reason",
           a="rr.grpo.plan.tokens_to_target", b="rr.grpo.answer.tokens_to_target", higher_is_better=False,
           refuted_by="answer-level repetition reaching the target with fewer tokens beyond 2 s.e.", kind="check"),
    Better("rewind_fixes_plans",
           "Plan-level Rewind-and-Repeat (max retries) raises accuracy over a single sampled attempt on the "
           "plan-first SFT model (there is something for the judge to fix)",
           a="rr.sft.plan.acc_max", b="rr.sft.plan.acc0", n_items="rr_prompts",
           refuted_by="accuracy with rewinds not above single-attempt accuracy beyond 2 s.e.", kind="check"),
    Better("helpful_reward_raises_plan_validity",
           "The helpful reward itself raises plan validity: plan-first GRPO with r = r_format × (1 + r_correct + "
           "r_helpful) samples right plans (rule-based check; T = 1.2, top-p 0.9) more often than the same GRPO run "
           "with w_helpful = 0 (same SFT checkpoint, steps, prompts and sampling seed)",
           a="plan_valid_sampled.grpo", b="plan_valid_sampled.grpo_nohelp", n_items="rr_prompts",
           refuted_by="sampled-plan acceptance with r_helpful not above the w_helpful = 0 run's beyond 2 s.e.",
           kind="finding"),
    Better("grpo_raises_plan_validity_over_sft",
           "GRPO with the full reward raises the share of sampled plans that are right over the SFT model (a check: "
           "r_correct alone can do this, see helpful_reward_raises_plan_validity)",
           a="plan_valid_sampled.grpo", b="plan_valid_sampled.sft", n_items="rr_prompts",
           refuted_by="sampled-plan acceptance after GRPO not above SFT's beyond 2 s.e.", kind="check"),
    Better("grpo_improves_pass1_pf",
           "GRPO raises the plan-first model's pass@1 over its SFT starting point",
           a="pass1.pf.grpo", b="pass1.pf.sft", n_items="eval_prompts",
           refuted_by="pass@1 after GRPO not above SFT's beyond 2 s.e.", kind="check"),
    Bound("baseline_beats_chance",
          f"Sanity: the think-then-answer baseline is non-degenerate (pass@1 above the {CHANCE:.1f} of a guessed answer)",
          value="pass1.tta.grpo", n_items="eval_prompts",
          refuted_by=f"baseline pass@1 not above {CHANCE:.1f} beyond 2 s.e.", kind="check"),
]


class Config(ReportConfig):
    pass


def grpo_vs_sft_note(ev: dict) -> str:
    """Test pass@1 of each format after SFT and after GRPO, the pass@1 delta against think-then-answer's better
    checkpoint per seed, and the TTFR reduction of the SFT models (all per seed, from the evaluate stage)."""
    p, t = ev.get("pass1", {}), ev.get("ttfr_tokens", {})
    if not all(k in p.get(f, {}) for f in ("tta", "pf") for k in ("sft", "grpo")):
        return "pass@1 after SFT and after GRPO are not in this run's evaluation"
    fmt = lambda xs: " / ".join(f"{x:.2f}" for x in xs)                       # noqa: E731
    best_tta = [max(a, b) for a, b in zip(p["tta"]["sft"], p["tta"]["grpo"])]
    delta = [a - b for a, b in zip(p["pf"]["grpo"], best_tta)]
    note = (f"Test pass@1, SFT → GRPO per seed: think-then-answer {fmt(p['tta']['sft'])} → {fmt(p['tta']['grpo'])}, "
            f"plan-first {fmt(p['pf']['sft'])} → {fmt(p['pf']['grpo'])}; plan-first after GRPO minus "
            f"think-then-answer's better checkpoint: {fmt(delta)}")
    if all(k in t.get(f, {}) for f in ("tta", "pf") for k in ("sft",)):
        red = [1 - a / b for a, b in zip(t["pf"]["sft"], t["tta"]["sft"])]
        note += f"; the TTFR reduction of the SFT models (before GRPO): {fmt(red)}"
    return note


def derive(ev: dict) -> dict:
    tt, p1 = ev["ttfr_tokens"], ev["pass1"]
    ev["derived"] = {
        "ttfr_reduction": [1.0 - a / b for a, b in zip(tt["pf"]["grpo"], tt["tta"]["grpo"])],
        "ttfr_reduction_sft": [1.0 - a / b for a, b in zip(tt["pf"]["sft"], tt["tta"]["sft"])],
        "ttfr_reduction_reference": [1.0 - ev["ttfr_reference"]["pf"] / ev["ttfr_reference"]["tta"]] * len(tt["pf"]["grpo"]),
        "pass1_delta": [a - b for a, b in zip(p1["pf"]["grpo"], p1["tta"]["grpo"])],
        "pass1_delta_sft": [a - b for a, b in zip(p1["pf"]["sft"], p1["tta"]["sft"])],
    }
    return ev


def mean_of(v: list[float | None], fmt: str = "{:.2f}") -> str:
    """Mean over seeds of a value that may be missing (None/NaN: e.g. no greedy trace with a readable draft)."""
    a = np.asarray([np.nan if x is None else x for x in v], float)
    a = a[np.isfinite(a)]
    return fmt.format(a.mean()) if len(a) else "n/a"


def mean_sd(v: list[float], fmt: str = "{:.3f}") -> str:
    a = np.asarray([np.nan if x is None else x for x in v], float)
    a = a[np.isfinite(a)]
    if not len(a):
        return "n/a"
    sd = a.std(ddof=1) if len(a) > 1 else 0.0
    return f"{fmt.format(a.mean())} ± {fmt.format(sd)}"


def ttfr_figure(tt: pl.DataFrame):
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    bins = np.arange(0, tt["ttfr_tokens"].max() + 3) - 0.5
    for ax, model in zip(axes, ("sft", "grpo")):
        for fmt, color, label in (("tta", "C3", "think-then-answer"), ("pf", "C0", "plan-first interleaved")):
            v = tt.filter((pl.col("model") == model) & (pl.col("format") == fmt))["ttfr_tokens"].to_numpy()
            ax.hist(v, bins=bins, color=color, alpha=0.6, label=f"{label} (mean {v.mean():.1f})")
        ax.set_title(f"after {model.upper()} (all seeds, held-out problems)")
        ax.set_xlabel("TTFR: tokens before the first visible token")
        ax.legend(fontsize=8)
    axes[0].set_ylabel("problems")
    return fig


def budget_figure(rw: pl.DataFrame):
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, model in zip(axes, ("sft", "grpo")):
        sub = rw.filter(pl.col("model") == model)
        for level, color, label in (("plan", "C0", "plan-level rewind"), ("answer", "C3", "answer-level repeat")):
            s = sub.filter(pl.col("level") == level)
            for seed in s["seed"].unique().sort():
                q = s.filter(pl.col("seed") == seed).sort("retries")
                ax.plot(q["tokens"], q["acc"], color=color, alpha=0.25, lw=1)
            m = s.group_by("retries").agg(pl.col("tokens").mean(), pl.col("acc").mean()).sort("retries")
            ax.plot(m["tokens"], m["acc"], color=color, lw=2.5, marker="o", label=label)
            for r, t, a in zip(m["retries"], m["tokens"], m["acc"]):
                ax.annotate(str(r), (t, a), fontsize=7, xytext=(3, -9), textcoords="offset points")
        ax.set_title(f"plan-first {model.upper()} model (labels: max retries)")
        ax.set_xlabel("token budget: mean tokens per problem (all attempts)", fontsize=9)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("accuracy (held-out problems)")
    return fig


def sft_curve_figure(curve: pl.DataFrame):
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for fmt, color, label in (("tta", "C3", "think-then-answer"), ("pf", "C0", "plan-first interleaved")):
        s = curve.filter(pl.col("fmt") == fmt)
        for i, seed in enumerate(s["seed"].unique().sort()):
            q = s.filter(pl.col("seed") == seed).sort("step")
            ax.plot(q["step"], q["dev_pass1"], color=color, lw=1.5, alpha=0.7, label=label if i == 0 else None)
    ax.axhline(CHANCE, color="grey", ls=":", lw=1, label="chance (a guessed answer)")
    ax.set_xlabel("SFT step")
    ax.set_ylabel("greedy pass@1 (dev problems)")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=8)
    return fig


def rl_figure(hist: pl.DataFrame):
    """GRPO per arm: mean reward per step; the learning curve, greedy pass@1 on the held-out dev slice (thin lines:
    seeds; thick: their mean); and, on each step's rollouts, the judge's acceptance beside the plans' truth."""
    has_curve = "dev_pass1" in hist.columns and hist["dev_pass1"].is_not_null().any()
    has_judge = "judge_accept" in hist.columns and hist["judge_accept"].is_not_null().any()
    fig, axes = plt.subplots(1, 1 + has_curve + has_judge, figsize=(5.5 * (1 + has_curve + has_judge), 3.8),
                             squeeze=False)
    ax_reward = axes[0][0]
    ax_curve = axes[0][1] if has_curve else None
    ax_judge = axes[0][1 + has_curve] if has_judge else None
    arms = (("tta", "C3", "think-then-answer"), ("pf", "C0", "plan-first"), ("pf_nohelp", "C2", "plan-first, w_helpful = 0"))
    for fmt, color, label in arms:
        s = hist.filter(pl.col("fmt") == fmt)
        if s.is_empty():
            continue
        m = s.filter(pl.col("reward_mean").is_not_null()).group_by("step").agg(pl.col("reward_mean").mean()).sort("step")
        ax_reward.plot(m["step"], m["reward_mean"], color=color, lw=2, label=f"{label} (mean over seeds)")
        if ax_curve is not None:
            c = s.filter(pl.col("dev_pass1").is_not_null())
            for seed in c["seed"].unique().sort():
                q = c.filter(pl.col("seed") == seed).sort("step")
                ax_curve.plot(q["step"], q["dev_pass1"], color=color, lw=0.8, alpha=0.5)
            mc = c.group_by("step").agg(pl.col("dev_pass1").mean()).sort("step")
            ax_curve.plot(mc["step"], mc["dev_pass1"], color=color, lw=2, marker="o", label=label)
        if ax_judge is not None:
            j = s.filter(pl.col("judge_accept").is_not_null()).group_by("step").agg(
                pl.col("judge_accept").mean(), pl.col("plan_right").mean()).sort("step")
            ax_judge.plot(j["step"], j["judge_accept"], color=color, lw=1.5, label=f"{label}: judge accepts")
            ax_judge.plot(j["step"], j["plan_right"], color=color, lw=1.5, ls="--", label=f"{label}: plan right")
    ax_reward.set_xlabel("GRPO step")
    ax_reward.set_ylabel("mean reward r_format × (1 + r_correct + r_helpful)")
    ax_reward.legend(fontsize=8, loc="lower right")
    for ax, ylabel in ((ax_curve, "greedy pass@1 (dev slice, held out from GRPO)"),
                       (ax_judge, "share of the step's rollouts (mean over seeds)")):
        if ax is not None:
            ax.set_xlabel("GRPO step")
            ax.set_ylabel(ylabel)
            ax.set_ylim(0, 1.02)
            ax.legend(fontsize=6 if ax is ax_judge else 8)
    return fig


def run(cfg: Config, ctx: StageContext) -> None:
    if (ctx.input("evaluate") / "metrics.json").exists():   # full profile: the real model (issue 41)
        return run_real(ctx, read_json(ctx.input("evaluate") / "metrics.json"))
    ev = derive(read_json(ctx.input("evaluate") / "eval.json"))
    models = read_json(ctx.input("train") / "models.json")
    meta = read_json(ctx.input("prepare") / "meta.json")
    tt = pl.read_csv(ctx.input("evaluate") / "ttfr.csv")
    rw = pl.read_csv(ctx.input("evaluate") / "rewind.csv")
    hist = pl.read_csv(ctx.input("train") / "rl_history.csv")
    seeds = ev["seeds"]
    m, rl, sft = models["model"], models["rl"], models["sft"]
    rep = Report(ctx, "PLANTAIN — plan-first interleaved reasoning",
                 "Post-training a model so that its first visible response is an explicit plan (then interleaved "
                 "thinking and answering), with RL reward r = r_format × (1 + r_correct + r_helpful), cuts the time "
                 "to first response by more than 60% vs think-then-answer without hurting pass@1 (≈ +6% in the "
                 "paper), and Rewind-and-Repeat at the plan level fixes bad plans with fewer tokens than repeating "
                 "whole answers.")
    ex = meta["examples"][0]
    draft_txt = ("each with the same pre-plan DRAFT (hidden: the first j steps worked out before anything is "
                 f"shown, j uniform on 0..n, mean {meta.get('sft_draft_mean', 0):.2f}), so both formats think for "
                 "the same number of tokens before the plan and a model decides at generation how long to draft."
                 if meta.get("drafts") else "with a one-token pre-plan thought (the number of operations).")
    rep.section("Setup", f"""
Task (`prepare`): list pipelines written as compositions, `o1 d1 … on dn ( x )` = o1 d1 ∘ … ∘ on dn applied to x,
innermost (last written) first, arithmetic mod {MOD}, o ∈ {{+, −, ×}}, {meta['min_ops']}–{meta['max_ops']} operations;
{meta['n']['sft']} SFT problems, {meta['n']['rl']} RL prompts, {meta['n']['test']} held-out test problems. Each SFT problem has
a trace in both formats, {draft_txt} Traces carry ONE injected plan error ({', '.join(meta['error_kinds'])}) with
probability {meta['plan_error_rate']:.0%}·(n − j)/n after a draft of j of n steps, only among the operations the draft did not
reach ({meta['sft_error_share']:.0%} of SFT traces), identical in both formats, and their steps execute the faulty plan.
Example (`{ex['prompt']}`):

- think-then-answer: `{ex['tta']}`
- plan-first interleaved: `{ex['pf']}`

Visible = inside `<ans> … </ans>`. TTFR (tokens) = generated tokens before the first visible token (the official
helper counts tokens before the first `<answer>`; through `</think>` for the baseline). Model: the shared tiny causal
transformer (d={m['d_model']}, {m['n_layers']} layers, {m['n_heads']} heads), per seed and format: SFT {sft['steps']} steps ×
batch {sft['batch']} (AdamW lr {sft['lr']}), then GRPO through `stages/common/grpo.py`: {rl['steps']} steps × {rl['prompts_per_step']}
prompts × group {rl['grpo']['group_size']}, lr {rl['lr']}, rollout T = {rl['temperature']}, no KL, reward
r = r_format × (1 + {rl['reward']['w_correct']}·r_correct + {rl['reward']['w_helpful']}·r_helpful); r_helpful = 1 when the
rule-based judge accepts the trace's plan (exactly the problem's operations, numbered, innermost first): for
plan-first the first visible segment; for think-then-answer, which has no intermediate visible answer (the paper gives
it no r_helpful), {"the plan inside its thinking — an equivalent process reward, so the formats differ only in ordering (issue 47)" if rl['reward'].get('tta_process_reward', False) else "none: its r_helpful is 0 (the paper's reward)"}.
Evaluation: greedy pass@1 and TTFR on {ev['eval_prompts']} test problems; a streaming KV-cache decode of single prompts
measures TTFR in wall time (reported only). Rewind-and-Repeat on {ev['rr_prompts']} test problems: plan sampled at T = 1.2,
top-p 0.9 (official), the rest at T = 0.5; up to {max(ev['rr']['retries'])} retries; plan level re-samples only the plan
when the judge rejects it; answer level re-samples the whole trace when a whole-trace judge (plan + every step +
answer) rejects it; tokens count every attempt. Target accuracy per seed: halfway from single-attempt accuracy to
the lower of the two levels' best accuracy (reachable by both). Seeds {seeds}.
""")
    p1, tk, fo, pv = ev["pass1"], ev["ttfr_tokens"], ev["format_ok"], ev["plan_valid_greedy"]
    rows = []
    for fmt in ("tta", "pf"):
        for stage in ("sft", "grpo"):
            w = ev["ttfr_wall"][fmt][stage]
            rows.append({"format": fmt, "model": stage, "pass@1": mean_sd(p1[fmt][stage]),
                         "format valid": mean_sd(fo[fmt][stage]), "greedy plan valid": mean_sd(pv[fmt][stage]),
                         "TTFR (tokens)": mean_sd(tk[fmt][stage], "{:.2f}"),
                         "steps drafted": mean_sd(ev["draft_steps"][fmt][stage], "{:.2f}"),
                         "TTFR wall (ms, streamed)": mean_sd(w["ttfr_ms"], "{:.2f}"),
                         "NLL hidden": mean_sd(ev["nll"][fmt][stage]["nll_hidden"]),
                         "NLL visible": mean_sd(ev["nll"][fmt][stage]["nll_visible"])})
    rep.table("Results: pass@1 and time to first visible response (mean ± sd over seeds)", pl.DataFrame(rows),
              note=f"Chance pass@1 = {CHANCE:.1f}. TTFR reduction after GRPO: {mean_sd(ev['derived']['ttfr_reduction'])} "
                   f"(after SFT: {mean_sd(ev['derived']['ttfr_reduction_sft'])}; reference traces with no draft: "
                   f"{ev['derived']['ttfr_reduction_reference'][0]:.3f}). Steps drafted: mean pre-plan draft of the "
                   "greedy traces (0..n). "
                   f"pass@1 delta (pf − tta) after GRPO: {mean_sd(ev['derived']['pass1_delta'])} (after SFT: "
                   f"{mean_sd(ev['derived']['pass1_delta_sft'])}). Wall-clock TTFR is measured on a shared CPU and is "
                   "not used by any verdict. NLL: the model's own greedy traces, hidden vs visible tokens "
                   "(token log-prob kernel).")
    rows = []
    for stage in ("sft", "grpo"):
        d = ev["rr"][stage]
        for level in ("plan", "answer"):
            x = d[level]
            rows.append({"model": f"pf.{stage}", "level": level, "acc (1 attempt)": mean_sd(x["acc0"]),
                         f"acc ({max(ev['rr']['retries'])} retries)": mean_sd(x["acc_max"]),
                         "tokens (1 attempt)": mean_sd(x["tokens0"], "{:.1f}"),
                         f"tokens ({max(ev['rr']['retries'])} retries)": mean_sd(x["tokens_max"], "{:.1f}"),
                         "target acc": mean_sd(d["target"]),
                         "tokens to target": mean_sd(x["tokens_to_target"], "{:.1f}"),
                         **{f"acc @ ≤{b} tok": mean_sd(x[f"acc_at_budget_{b}"]) for b in ev["rr"]["token_budgets"]}})
    rep.table("Results: Rewind-and-Repeat, plan level vs answer level (mean ± sd over seeds)", pl.DataFrame(rows),
              note=f"Judge: **{ev['judge']['deployed']}** (the deployed plan judge, fixed in params). "
                   "Sampled plans that are right (rule-based check; T = 1.2, top-p 0.9): SFT "
                   f"{mean_sd(ev['plan_valid_sampled']['sft'])}, GRPO {mean_sd(ev['plan_valid_sampled']['grpo'])}"
                   + (f", GRPO with w_helpful = 0 {mean_sd(ev['plan_valid_sampled']['grpo_nohelp'])}"
                      if "grpo_nohelp" in ev["plan_valid_sampled"] else "") + ". "
                   "'acc @ ≤B tok': best accuracy among retry caps whose mean tokens per problem fit budget B "
                   "(0 when even one attempt does not fit).")
    judge_rows = []
    for name in sorted(ev["judge"]["heldout"], key=lambda n: (n == "oracle", ev["judge"]["heldout"][n]["train_pairs"])):
        q = ev["judge"]["heldout"][name]
        j = ev["rr_judges"]["sft"][name]
        judge_rows.append({"judge": name + (" (deployed)" if name == ev["judge"]["deployed"] else ""),
                           "train pairs": q["train_pairs"] or "—", "held-out acc": f"{q['accuracy']:.3f}",
                           "held-out precision": f"{q['precision']:.3f}", "held-out recall": f"{q['recall']:.3f}",
                           "acc on sampled plans": mean_sd(j["sampled_accuracy"]),
                           "precision on sampled": mean_sd(j["sampled_precision"]),
                           "plan-level acc (max retries)": mean_sd(j["plan"]["acc_max"]),
                           "answer-level acc (max retries)": mean_sd(j["answer"]["acc_max"]),
                           "plan tokens to target": mean_sd(j["plan"]["tokens_to_target"], "{:.1f}"),
                           "answer tokens to target": mean_sd(j["answer"]["tokens_to_target"], "{:.1f}")})
    rep.table("Results: Rewind-and-Repeat vs judge accuracy (plan-first SFT model, mean ± sd over seeds)",
              pl.DataFrame(judge_rows),
              note="Learned judges: MLPs on one-hot (problem, plan) tokens trained on the first n labelled pairs of the "
                   "judge split (half the plans right, half with one injected error; problems never in the test "
                   "set); held-out = that split's held-out pairs; 'on sampled plans' = every plan the SFT model "
                   "sampled for Rewind-and-Repeat, labelled by the rule-based check (the oracle's row is 1 by "
                   "definition: the upper bound). A rejected right plan costs a retry; an accepted wrong plan is "
                   "kept, so judge precision caps plan-level accuracy. Targets are per judge (halfway from one "
                   "attempt to the lower of the two levels' best accuracy).")
    rep.figure("ttfr_distributions", ttfr_figure(tt), "Distribution of TTFR (tokens before the first visible token) "
               "of think-then-answer vs plan-first models, after SFT and after GRPO")
    rep.figure("accuracy_vs_token_budget", budget_figure(rw), "Accuracy vs token budget (mean generated tokens per "
               "problem, all attempts) for plan-level Rewind-and-Repeat vs answer-level repetition (thin: seeds)")
    sft_curve_path = ctx.input("train") / "sft_curve.csv"
    if sft_curve_path.exists():
        sc = pl.read_csv(sft_curve_path)
        if len(sc):
            rep.figure("sft_curve", sft_curve_figure(sc), "SFT learning curve recorded by the train stage: greedy "
                       "pass@1 on dev problems (the last RL-split problems, held out from GRPO, never test) per format and seed; "
                       "`sft.steps` is read from it (every seed and format must leave chance)")
    judge_note = "the judge log is not in this run's history"
    if "judge_accept" in hist.columns:
        parts = []
        for fmt, label in (("tta", "think-then-answer"), ("pf", "plan-first")):
            h = hist.filter((pl.col("fmt") == fmt) & pl.col("judge_accept").is_not_null())
            last = int(h["step"].max()) if h.height else 0
            first10, last10 = h.filter(pl.col("step") <= 10), h.filter(pl.col("step") > last - 10)
            if first10.height and last10.height:
                parts.append(f"{label}: the judge accepts {first10['judge_accept'].mean():.2f} → "
                             f"{last10['judge_accept'].mean():.2f} of sampled plans while "
                             f"{first10['plan_right'].mean():.2f} → {last10['plan_right'].mean():.2f} are right, "
                             "first vs last 10 steps")
        judge_note = "; ".join(parts) or judge_note
    rep.figure("rl_reward", rl_figure(hist), "GRPO: mean reward per step; the learning curve the train stage "
               "records (greedy pass@1 on the dev slice, held out from the GRPO prompts; thin: seeds); and on each "
               "step's rollouts the deployed judge's acceptance (solid) beside the share of right plans (dashed)")
    curve = rw.group_by(["model", "level", "retries"]).agg(pl.col("tokens").mean(), pl.col("acc").mean()).sort(
        ["model", "level", "retries"])
    for stage in ("sft", "grpo"):
        c = curve.filter(pl.col("model") == stage)
        wide = c.filter(pl.col("level") == "plan").select("retries", pl.col("tokens").alias("plan_tokens"),
                                                           pl.col("acc").alias("plan_acc")).join(
            c.filter(pl.col("level") == "answer").select("retries", pl.col("tokens").alias("answer_tokens"),
                                                         pl.col("acc").alias("answer_acc")), on="retries")
        rep.plot(f"rewind_{stage}", wide, x="retries", y=["plan_acc", "answer_acc"],
                 title=f"accuracy vs max retries (pf {stage}); tokens in the CSV")
    hist_frame = tt.filter(pl.col("model") == "grpo").group_by(["ttfr_tokens", "format"]).len().pivot(
        on="format", index="ttfr_tokens", values="len").fill_null(0).sort("ttfr_tokens")
    hist_frame = hist_frame.select("ttfr_tokens", *(c for c in ("tta", "pf") if c in hist_frame.columns))  # fixed order
    rep.plot("ttfr_hist_grpo", hist_frame, x="ttfr_tokens",
             y=[c for c in ("tta", "pf") if c in hist_frame.columns], title="TTFR histogram after GRPO")
    rep.table("Deviations", pl.DataFrame({
        "what": ["model and data", "RL algorithm", "r_helpful judge", "r_unit_test", "Rewind-and-Repeat",
                 "answer-level judge", "sampling", "TTFR", "plan errors", "seeds"],
        "paper / official code": [
            "Qwen3-4B/8B, traces from Qwen3-32B; code, math, SQL, QA benchmarks",
            "PPO (verl)",
            "LLM judge, binary per intermediate <answer> (usable, clarifying, concrete action)",
            "part of the coding reward (form unknown)",
            "judge rejects the plan; re-prompt listing the rejected plan(s); max 2 retries at eval; keep the last",
            "not specified beyond 'answer-level repeat' (and Best-of-N plans)",
            "eval T = 0.2, 4096 tokens; plans T = 1.2, top-p 0.9",
            "whitespace tokens before the first <answer> (or through </think>), /4096",
            "none injected: bad plans come from the model",
            "single runs"],
        "here": [
            "tiny causal transformer trained from scratch; synthetic list-pipeline compositions (mod 5)",
            "GRPO (shared trainer, one on-policy update per rollout batch, no KL) — the card's PPO/GRPO",
            (f"a learned plan judge ({models['judge']['deployed_name']}: an MLP on one-hot (problem, plan) tokens "
             f"trained on {models['judge']['deployed']} labelled pairs; stages/plantain/judge.py) — it can be wrong "
             "(held-out accuracy in the judge table); the rule-based equality with the gold plan is the oracle "
             "upper bound. r_helpful rewards a plan the judge accepts; "
             if models.get("judge", {}).get("kind") == "learned" else
             "rule-based plan validator (task.validate_plan): exact equality with the gold plan — an oracle; ")
            + ("think-then-answer receives the same judge's score of the plan in its thinking (issue 47), so "
               "both arms get it" if rl["reward"].get("tta_process_reward") else
               "only the plan-first arm receives it"),
            "none (no unit tests in this task)",
            f"re-sample the plan (no re-prompt listing rejected plans); up to {max(ev['rr']['retries'])} retries "
            "to draw the accuracy-vs-budget curve; keep the last",
            "whole-trace judge = the same plan judge on the trace's plan AND a rule-based check that the steps "
            "execute that plan through to the answer (task.steps_follow_plan): it sees the plan judge's verdict "
            "only after a whole trace, so the token comparison favours plan level by construction (a check, not a "
            "finding); a judge of the answer with its own information is open",
            "greedy pass@1; rollouts T = 1; R&R: plan T = 1.2 / top-p 0.9, rest T = 0.5 (so that a repeated "
            "answer can differ)",
            "model tokens before the first visible content token (no /4096 normalisation)",
            f"{meta['sft_error_share']:.0%} of SFT traces carry one injected plan error, so that the model samples "
            f"faulty plans for Rewind-and-Repeat to fix (rate {meta['plan_error_rate']:.0%}·(n − j)/n after a "
            "pre-plan draft of j steps: the drafts and their error rates are this miniature's, so that a model "
            "decides how long to think before its first visible token)",
            f"{len(seeds)} seeds (each its own SFT, GRPO and sampling)"]}))
    d = ev["derived"]
    nohelp_txt = (f" (the same GRPO without r_helpful: {np.mean(ev['plan_valid_sampled']['grpo_nohelp']):.0%})"
                  if "grpo_nohelp" in ev["plan_valid_sampled"] else "")
    rep.section("Discussion", f"""
Measured here (means over seeds): TTFR falls from {np.mean(tk['tta']['grpo']):.1f} tokens (think-then-answer) to
{np.mean(tk['pf']['grpo']):.1f} (plan-first), a {np.mean(d['ttfr_reduction']):.0%} reduction; pass@1
{np.mean(p1['tta']['grpo']):.3f} vs {np.mean(p1['pf']['grpo']):.3f} (delta {np.mean(d['pass1_delta']):+.3f}). On the
plan-first SFT model the judge accepts {np.mean(ev['plan_valid_sampled']['sft']):.0%} of plans sampled at T = 1.2 and
GRPO with r_helpful raises that to {np.mean(ev['plan_valid_sampled']['grpo']):.0%}{nohelp_txt}; plan-level rewinding reaches the
target accuracy with {np.mean(ev['rr']['sft']['plan']['tokens_to_target']):.1f} tokens per problem vs
{np.mean(ev['rr']['sft']['answer']['tokens_to_target']):.1f} for answer-level repetition.

How much of the TTFR reduction is left depends on how long the models draft before their first visible token: with
no draft the format alone gives {d['ttfr_reduction_reference'][0]:.3f}; the greedy traces draft
{mean_of(ev['draft_steps']['pf']['sft'])} steps (plan-first) and {mean_of(ev['draft_steps']['tta']['sft'])}
(think-then-answer) after SFT, {mean_of(ev['draft_steps']['pf']['grpo'])} and
{mean_of(ev['draft_steps']['tta']['grpo'])} after GRPO (whose reward pays for right plans and answers, which a longer
draft makes more likely, and nothing for latency), for a reduction of {np.mean(d['ttfr_reduction_sft']):.3f} after SFT and
{np.mean(d['ttfr_reduction']):.3f} after GRPO. The paper's pass@1 gain (+6%) comes from the plan helping a large model reason on
real benchmarks; here both formats hold the same tokens (count, numbered plan, start value, steps, answer) and
differ only in which of them are visible and in the tags around them, so only a "does not drop" statement is
tested. pass@1 across seeds: sd {np.std(p1['pf']['grpo'], ddof=1):.2f} for plan-first,
{np.std(p1['tta']['grpo'], ddof=1):.2f} for think-then-answer after {sft['steps']} SFT steps (the SFT curve shows where each
seed and format left chance). Plan-level rewinding is cheaper because a
rejected plan costs only the plan's tokens while a rejected answer costs a whole trace; its limit is that it cannot
fix execution errors after a good plan, which the answer-level judge can — visible where the answer-level curve
ends higher. After GRPO few plans are rejected, so both levels have little to fix and that comparison is weaker.

The paper post-trains Qwen3-4B/8B with PPO on traces distilled from Qwen3-32B and evaluates on MBPP, BigCodeBench,
MATH500, AIME24, BIRD-SQL and long-form QA with an LLM judge; this miniature keeps the trace formats, the
multiplicative reward, the plan judge in the loop of RL and of Rewind-and-Repeat, and the TTFR measurement, on a
synthetic task with a rule-based judge. It does not reproduce the scale, natural-language plans, the LLM judge's
notion of helpfulness, unit-test rewards, nor the benchmarks; verdicts are about this miniature only.
""")
    process_note = ("both arms receive it (the think-then-answer arm on the plan in its thinking), so the pass@1 "
                    "comparison isolates the ordering; the paper's own reward gives the baseline none."
                    if rl["reward"].get("tta_process_reward") else
                    "only the plan-first arm gets it: the pass@1 comparison is not isolated to the plan-first ordering.")
    rep.section("Threats to validity", f"""
Red-team passes on this design (what could make a verdict wrong, and what remains; the issue-47 judges had their own
pass, summarised in its bullet below):

- **TTFR is the models' choice, within a range the data set.** Before the first visible token both formats may draft
  0..n steps (SFT traces: uniform, with fewer plan errors after longer drafts); plan-first TTFR is 4 + (1 + 4j) after a
  draft of j ≥ 1 steps, think-then-answer's 7n + 7 + the same. With no draft the format alone gives ≈
  {ev['derived']['ttfr_reduction_reference'][0]:.3f} (check `ttfr_format_reference`); a full draft brings it to
  1 − (4n + 5)/(11n + 8), 0.585–0.603 for n = 3..5, so `ttfr_drop_60` is decided by how long the plan-first model
  drafts relative to the baseline. A red team found that decision narrow: with j uniform on 0..n in the SFT traces,
  greedy decoding stops after n − 1 drafted steps with probability ≈ 1/2 (the data's own stop rate there is
  exactly 1/2), so each model drafts n − 1 or n steps, and the reduction sits between ≈ 0.646 (both n − 1) and
  ≈ 0.597 (both full), on either side of 0.6, decided by logit noise around one half (share of full plan-first
  drafts after GRPO: {mean_sd(ev['draft_full']['pf']['grpo'], '{:.2f}')}; think-then-answer
  {mean_sd(ev['draft_full']['tta']['grpo'], '{:.2f}')}). GRPO lengthens both formats' drafts (its reward pays for right
  plans and answers, which a longer draft makes more likely, and nothing for latency), towards the full-draft floor
  that fails: with more RL steps the verdict would move towards fails, so at this budget the step count takes part in
  it. The draft distribution is this miniature's design (the paper's teacher traces and reward may differ); a draft
  choice the model makes from what it sees (e.g. problem difficulty) and TTFR under sampling are not built.
  Rewind-and-Repeat charges each plan retry for the draft and the plan (everything up to the first `</ans>`).
- **Judges.** The deployed plan judge is learned ({ev['judge']['deployed']}, held-out accuracy
  {ev['judge']['heldout'][ev['judge']['deployed']]['accuracy']:.3f}) and is also the one that scores r_helpful in GRPO;
  its accuracy on the plans the SFT model actually samples is in the judge table — off the distribution it was
  trained on (one injected error per wrong plan), a judge can be worse. The judge table reads Rewind-and-Repeat
  against judges from 100 to 1,600 training pairs and the oracle (upper bound). r_helpful is a process reward:
  {process_note}
- **Red team of the issue-47 judges** (a reviewer who did not write them; what remains):
  (1) the answer-level judge is the same plan judge plus an arithmetic check, so plan level wins the token
  comparison by construction — both `plan_rewind_fewer_tokens*` are checks now; a judge of the answer with its own
  information (matched in accuracy) is open. (2) The deployed judge scores r_helpful in GRPO and then judges
  Rewind-and-Repeat on the model GRPO shaped against it: on the GRPO model's wrong sampled plans it caught 7 of 50
  (about 72% on the SFT model's), so `*_after_rl` has a judge the policy learned to pass; a judge the policy was
  not trained against is open. (3) Fixed: `helpful_reward_raises_plan_validity` now compares against a GRPO run
  with w_helpful = 0 from the same SFT checkpoint (same steps, prompts, sampling seed), isolating r_helpful from
  r_correct (the answer follows the plan) and from RL sharpening; the comparison with SFT is the check
  `grpo_raises_plan_validity_over_sft`. A second review of that arm confirmed it identical but for w_helpful (same
  SFT copy, GRPO seed, prompt stream, config; the oracle-only evaluation draws the same samples) and found the
  comparison near its ceiling by construction: the plan-first answer executes the plan, so r_correct already rewards
  right plans (after GRPO plan and answer disagree on ≤ 3% of samples), the w_helpful = 0 arm reaches ~0.96, and
  the 0.02 minimum effect asks r_helpful to remove about half of the remaining errors; item noise (paired per
  prompt, ~0.006) is now in both plan-validity verdicts. (4) The judge learns
  single injected errors; the model's wrong plans include several errors at once and other lengths, and the
  deployed judge catches operand errors only ~37% of the time (by kind: swap 0.92, drop 0.96); 'acc / precision on
  sampled plans' pool all retry attempts, including ones the loop never judged. (5) The SFT endpoint was noisy
  under a constant lr (dev pass@1 swung up to 0.23 between checkpoints), more than the pass@1 deltas `pass1_no_drop`
  reads; the lr now decays linearly to 0 over the last {sft.get('decay_frac', 0):g} of the SFT steps
  (warmup-stable-decay; SFT-only probes of the three think-then-answer seeds: 0.82 / 0.82 / 0.91 final dev pass@1 at
  1,200 such steps against 0.66 / 0.84 / 0.83 at 1,500 constant-lr steps). (6) The deployed judge size (400 pairs) landed in the same commit as its results.
- **Budget decides pass@1.** The SFT curve (figure) shows when each seed and format leaves chance; at 600 steps
  one think-then-answer seed never did (issue 47), so `sft.steps` = {sft['steps']} (lr decayed over the last
  {sft.get('decay_frac', 0):g}) was read from probes of that curve. Where a seed still sits near chance at the end of its curve, `pass1_no_drop` and `grpo_improves_pass1_pf`
  reflect how fast each format is learned at this budget. `pass1_no_drop` is a tolerance (params) on the delta, tested
  on the per-seed deltas without item noise (the delta is not a rate).
- **GRPO length, and a policy that learns to pass the judge.** {models['rl']['steps']} GRPO steps. The train stage
  records a GRPO learning curve (figure: greedy pass@1 every {models['rl'].get('eval_every', 0)} steps on the
  {models.get('n_dev_prompts', sft['curve_prompts'])} dev problems held out from the GRPO prompts) and, on every step's
  rollouts, how often the deployed judge accepts the plan beside how often the plan is right (figure, right panel;
  `judge_accept`, `plan_right`, `judge_false_accept` in `rl_history.csv`). A 90-step probe from less-trained SFT models
  (900 SFT steps, not committed) raised plan-first dev pass@1 by 0.25 / 0.04 / 0.13 (seeds 0–2) while
  think-then-answer fell on two seeds (0.48 → 0.34, 0.72 → 0.52). A reviewer who did not write the code reproduced
  seed 0 exactly and found reward hacking of the learned judge, not a bug: over the run the judge's acceptance of
  think-then-answer's sampled plans rose 0.53 → 0.77 while right plans stayed at 0.18–0.31 (greedy dev: accepted
  0.72 → 0.87, right 0.50 → 0.35); from the same checkpoint with the rule-based judge pass@1 rose 0.48 → 0.64 (one
  seed). Think-then-answer is the more exposed arm: at 900 SFT steps only 0.28 of its sampled answers were right, so
  r_correct is mostly noise and the judge's false positives drive its advantages, while a plan-first answer executes
  its plan, so r_correct pushes back against a wrong accepted plan. The reviewer ruled out the reward code, format
  failures (≤ 0.8%), parsing, the length cap and the loss normalisation. In this run's rollouts: {judge_note};
  longer GRPO is not adopted, and `grpo_improves_pass1_pf` reads the committed budget. Before the SFT schedule
  change (constant lr, 1,500 steps), a 120-step study of this pipeline
  ([`reports/studies/plantain_grpo120/report.md`](../studies/plantain_grpo120/report.md), 4× the GRPO steps,
  9 min) found no judge gaming there: acceptance and right plans rise together (think-then-answer: accepted
  0.71 → 0.95, right 0.51 → 0.84; plan-first: 0.74 → 0.97 and 0.61 → 0.96, first vs last 10 steps). Plan-first
  test pass@1 rose 0.87 → 0.97 (seed 0: 0.68 → 0.90; the other two seeds start at 0.95 and 0.97), yet
  `grpo_improves_pass1_pf` stays inconclusive (gap 0.098, t-bounds [−0.059, 0.254]: 3 seeds, two at the ceiling);
  `pass1_no_drop` holds there, and `plan_rewind_fewer_tokens_after_rl` fails (almost no faulty plans are left to
  rewind). The SFT ceiling, not the GRPO length, kept `grpo_improves_pass1_pf` open there.
- **GRPO can weaken the baseline it is compared with.** {grpo_vs_sft_note(ev)}. `pass1_no_drop` reads both formats
  after GRPO, so where GRPO lowers think-then-answer it compares plan-first with a weakened baseline (a red team
  of this run: the +0.13 to +0.19 deltas are about twice the delta against think-then-answer's better checkpoint);
  `grpo_improves_pass1_pf` is bounded by plan-first's SFT ceiling; `ttfr_drop_60` reads the models after GRPO,
  whose reward pays nothing for latency and drives both formats towards drafting every step, where the format
  caps the reduction at about 0.597 (below the paper's 60%). The SFT schedule (lr decayed to 0 over the last
  {sft.get('decay_frac', 0):g} of the steps) was chosen on SFT-only dev pass@1 of the same three
  think-then-answer seeds that are reported (three configurations, 100 dev problems).
  An SFT gate before RL, a w_helpful = 0 arm for think-then-answer, and an r_helpful paid only when the steps
  follow the plan are not built.
- **Item noise.** Rates are over the same {ev['eval_prompts']} held-out problems (pass@1) and {ev['rr_prompts']}
  (Rewind-and-Repeat) for every seed; no per-item lists are stored, so the rate claims use the binomial item
  variance (`n_items`), unpaired — conservative. Tokens-to-target claims use seed variance only.
- **Plan errors** come partly from errors injected into the SFT traces (Deviations), which sets how much there is
  to fix.
- **Min effects** (params `papers.plantain.report.claims`): 2 generated tokens per problem for tokens-to-target,
  0.02 for rates, fixed as the smallest gaps that matter, not from results.
- **Checks, not findings:** the no-draft TTFR reduction (format), the baseline above chance, GRPO raising pass@1 over SFT (machinery), and rewinding
  raising accuracy over one attempt (the precondition of the Rewind-and-Repeat comparison), and plan-level
  rewinding costing fewer tokens than answer-level repetition (by construction with one shared plan judge).
""")
    rep.finish(CLAIMS, ev, wallclock=("ttfr_wall",))


REAL_CLAIMS = ("ttfr_drop_60", "pass1_no_drop", "plan_rewind_fewer_tokens_after_rl", "rewind_fixes_plans_after_rl")


def real_metrics(m: dict) -> dict:
    """Per-seed values of the real path's runs (evaluate.hf_source.evaluate_real) in the toy's metric layout."""
    seeds = m["seeds"]
    run = {(r["seed"], r["fmt"]): r for r in m["runs"]}
    mean = lambda v: float(np.mean(v)) if len(v) else float("nan")                      # noqa: E731
    ev: dict = {"seeds": seeds, "pass1": {}, "ttfr_whitespace": {}, "rr": {"grpo": {"plan": {}, "answer": {}}},
                "eval_prompts": len(m["runs"][0]["correct"]) if m["runs"] else 0}
    for fmt in m["formats"]:
        ev["pass1"][fmt] = [mean(run[(s, fmt)]["correct"]) for s in seeds]
        ev["ttfr_whitespace"][fmt] = [mean(run[(s, fmt)]["ttfr_whitespace"]) for s in seeds]
    pf, tta = ev["ttfr_whitespace"].get("pf"), ev["ttfr_whitespace"].get("tta")
    ev["derived"] = {"ttfr_reduction": [1.0 - a / b if b else float("nan") for a, b in zip(pf, tta)] if pf and tta else [],
                     "pass1_delta": [a - b for a, b in zip(ev["pass1"].get("pf", []), ev["pass1"].get("tta", []))]}
    rr_runs = [run[(s, "pf")]["rr"] for s in seeds if (s, "pf") in run and "rr" in run[(s, "pf")]]
    for level in ("plan", "answer"):
        d = ev["rr"]["grpo"][level]
        d["tokens_to_target"] = [r[level]["tokens_to_target"] for r in rr_runs]
        d["acc0"] = [r[level]["acc"][0] for r in rr_runs]
        d["acc_max"] = [r[level]["acc"][-1] for r in rr_runs]
    ev["rr_prompts"] = rr_runs[0]["prompts"] if rr_runs else 0
    return ev


def run_real(ctx: StageContext, m: dict) -> None:
    """The report of the `full` profile's real path: TTFR (whitespace tokens before the first <answer>), pass@1 and
    Rewind-and-Repeat of both formats' GRPO models on the real test records."""
    ev = real_metrics(m)
    info = read_json(ctx.input("train") / "models.json")
    rep = Report(ctx, "PLANTAIN — plan-first interleaved reasoning on a real model",
                 "Plan-first interleaved reasoning cuts the time to first visible response without hurting pass@1, "
                 "and Rewind-and-Repeat at plan level reaches a target accuracy with fewer tokens than whole-answer "
                 "repetition.")
    src = info.get("source", {})
    rep.section("Setup", f"""
Real path (`full` profile): model `{src.get('model')}`, records `{src.get('dataset')}` (MATH-style with
`<think>/<answer>` traces); formats {', '.join(m['formats'])}; seeds {ev['seeds']}; {ev['eval_prompts']} test problems,
greedy decoding; TTFR = whitespace tokens before the first `<answer>`. Rewind-and-Repeat on the plan-first GRPO
model. The judge is rule-based (answer and plan checks), not the paper's LLM judge.
""")
    rows = [{"format": f, "pass@1": mean_sd(ev["pass1"][f]), "TTFR (whitespace tokens)": mean_sd(ev["ttfr_whitespace"][f], "{:.1f}")}
            for f in m["formats"]]
    rep.table("Results (GRPO models, mean ± sd over seeds)", pl.DataFrame(rows))
    rows = [{"level": lv, **{k: mean_sd(ev["rr"]["grpo"][lv][k], "{:.2f}") for k in ("acc0", "acc_max", "tokens_to_target")}}
            for lv in ("plan", "answer")]
    rep.table("Rewind-and-Repeat (plan-first GRPO model)", pl.DataFrame(rows))
    fig, ax = plt.subplots(figsize=(5, 3.5))
    fmts = list(m["formats"])
    ax.bar(fmts, [np.mean(ev["ttfr_whitespace"][f]) for f in fmts], color=["C3" if f == "tta" else "C0" for f in fmts])
    ax.set_ylabel("TTFR (whitespace tokens)")
    ax.set_title("Time to first visible response by format")
    rep.figure("ttfr_by_format", fig, "Mean TTFR by format (real path, GRPO models)")
    rep.plot("ttfr_by_format", pl.DataFrame({"format": fmts, "ttfr": [float(np.mean(ev["ttfr_whitespace"][f])) for f in fmts]}),
             x="format", y="ttfr", template="bar_horizontal", title="TTFR by format")
    rep.section("Threats to validity", """
- Rule-based judges stand in for the paper's LLM judges; only the GRPO models are evaluated on this path (the SFT-model
  claims and the r_helpful comparison are toy-only).
""")
    claims = [c for c in CLAIMS if c.name in REAL_CLAIMS]
    claims.append(Better("rewind_fixes_plans_after_rl",
                         "Plan-level Rewind-and-Repeat (max retries) raises accuracy over a single sampled attempt on "
                         "the plan-first GRPO model",
                         a="rr.grpo.plan.acc_max", b="rr.grpo.plan.acc0", n_items="rr_prompts",
                         refuted_by="accuracy with rewinds not above single-attempt accuracy beyond 2 s.e.",
                         kind="check"))
    rep.finish(claims, ev)
