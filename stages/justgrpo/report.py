"""report: seed-aware verdicts on the flexibility trap (pass@k, fork entropy) and on JustGRPO vs the
arbitrary-order GRPO baseline (greedy accuracy at 1/2/4 tokens per step), with pass@k curves and
accuracy-vs-RL-step curves.

    python -m stages report justgrpo [--profile smoke]
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

from stages.justgrpo.task import MOD  # noqa: E402

CHANCE = 1.0 / MOD  # a uniformly guessed answer digit

CLAIMS = [
    Better("ar_coverage_at_large_k",
           "Flexibility trap: on the pretrained dLLM, AR-order sampling covers more solutions than "
           "low-confidence arbitrary order at the largest k (pass@k, T = 1, unbiased estimator)",
           a="passk.ar.at_kmax", b="passk.arbitrary.at_kmax", n_items="passk_prompts",
           refuted_by="arbitrary-order pass@k_max not below AR-order pass@k_max beyond 2 s.e. on a majority of seeds", kind="finding"),
    Better("fork_entropy_ar_higher",
           "Arbitrary order defers fork tokens and decodes them with lower entropy than AR order does "
           "(entropy of the fork position's predictive distribution when it gets decoded)",
           a="fork.ar.fork_entropy", b="fork.arbitrary.fork_entropy",
           refuted_by="fork entropy under arbitrary order not below AR order's beyond 2 s.e.", kind="finding"),
    Better("justgrpo_improves_base",
           "JustGRPO (AR-order rollouts, exact AR likelihood, clipped surrogate, no KL) raises greedy accuracy "
           "over the pretrained dLLM (1 token/step, semi-AR low-confidence decoding)",
           a="acc.justgrpo.tps1", b="acc.base.tps1", n_items="eval_prompts",
           refuted_by="JustGRPO accuracy not above the base model's beyond 2 s.e.", kind="finding"),
    Better("justgrpo_beats_arbitrary_grpo",
           "JustGRPO reaches higher greedy accuracy than the GRPO baseline that keeps arbitrary-order "
           "rollouts with a one-step masked log-prob surrogate (same steps, group size, learning rate)",
           a="acc.justgrpo.tps1", b="acc.arbitrary.tps1", n_items="eval_prompts",
           refuted_by="baseline accuracy not below JustGRPO's beyond 2 s.e. on a majority of seeds", kind="finding"),
    Bound("gain_survives_parallel",
          "Most of JustGRPO's RL gain survives parallel decoding: its gain over the base model at 4 tokens/step "
          "is at least half its gain at 1 token/step (value = gain₄ − ½·gain₁)",
          value="derived.justgrpo_survival_tps4",
          refuted_by="gain at 4 tokens/step below half the gain at 1 token/step beyond 2 s.e.", kind="finding"),
    Bound("baseline_beats_chance",
          "Sanity: the arbitrary-order GRPO baseline is non-degenerate (greedy accuracy above the 1/MOD = 20% of a "
          "guessed digit)",
          value="acc.arbitrary.tps1", n_items="eval_prompts",
          refuted_by="baseline accuracy not above chance beyond the t-bound", kind="check"),
]


class Config(ReportConfig):
    pass


def derive(ev: dict) -> dict:
    kmax = max(ev["ks"])
    for s in ev["passk"].values():
        s["at_kmax"] = s[f"pass{kmax}"]
    acc = ev["acc"]
    d = {}
    for arm in [a for a in acc if a != "base"]:
        for tps in acc[arm]:
            d[f"{arm}_gain_{tps}"] = [x - y for x, y in zip(acc[arm][tps], acc["base"][tps])]
        if "tps4" in acc[arm] and "tps1" in acc[arm]:
            d[f"{arm}_survival_tps4"] = [g4 - 0.5 * g1 for g4, g1 in zip(d[f"{arm}_gain_tps4"], d[f"{arm}_gain_tps1"])]
    ev["derived"] = d
    return ev


def _arr(v) -> np.ndarray:
    """Per-seed values as floats; null (a non-finite value written by write_json) becomes NaN."""
    return np.asarray([np.nan if x is None else x for x in v], float)


def nmean(v) -> float:
    a = _arr(v)
    return float(np.nanmean(a)) if np.isfinite(a).any() else float("nan")


def mean_sd(v: list[float]) -> str:
    a = _arr(v)
    a = a[np.isfinite(a)]
    if not len(a):
        return "n/a"
    return f"{a.mean():.3f} ± {a.std(ddof=1) if len(a) > 1 else 0:.3f}"


def passk_figure(pk: pl.DataFrame):
    fig, ax = plt.subplots(figsize=(6, 4))
    for sampler, color in (("ar", "C0"), ("arbitrary", "C3")):
        sub = pk.filter(pl.col("sampler") == sampler)
        for seed in sub["seed"].unique().sort():
            s = sub.filter(pl.col("seed") == seed).sort("k")
            ax.plot(s["k"], s["pass_at_k"], color=color, alpha=0.25, lw=1)
        m = sub.group_by("k", maintain_order=True).agg(pl.col("pass_at_k").mean()).sort("k")
        ax.plot(m["k"], m["pass_at_k"], color=color, lw=2.5, marker="o",
                label={"ar": "AR order (block 1)", "arbitrary": "low-confidence arbitrary order"}[sampler])
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k (test prompts)")
    ax.set_title("Pretrained dLLM: solution coverage vs decoding order (T = 1)")
    ax.legend()
    return fig


def rl_figure(hist: pl.DataFrame, base_acc: float, col: str = "acc_tps1", chance: float | None = CHANCE):
    fig, ax = plt.subplots(figsize=(6, 4))
    ev = hist.drop_nulls(col)
    for arm, color in (("justgrpo", "C0"), ("arbitrary", "C3")):
        sub = ev.filter(pl.col("arm") == arm)
        if sub.is_empty():
            continue
        for seed in sub["seed"].unique().sort():
            s = sub.filter(pl.col("seed") == seed).sort("step")
            ax.plot(s["step"], s[col], color=color, alpha=0.25, lw=1)
        m = sub.group_by("step", maintain_order=True).agg(pl.col(col).mean()).sort("step")
        ax.plot(m["step"], m[col], color=color, lw=2.5, marker="o",
                label={"justgrpo": "JustGRPO (AR order, exact likelihood)",
                       "arbitrary": "GRPO, arbitrary order + one-step surrogate"}[arm])
    if chance is not None:
        ax.axhline(chance, color="grey", ls=":", label="chance (guessed digit)")
    ax.set_xlabel("RL step")
    ax.set_ylabel("greedy accuracy (1 token/step, eval subset)")
    ax.set_title("Accuracy vs RL step (thin: seeds, thick: mean)")
    ax.legend(fontsize=8)
    return fig


def tps_figure(acc: pl.DataFrame):
    fig, ax = plt.subplots(figsize=(6, 4))
    m = acc.group_by(["model", "tokens_per_step"], maintain_order=True).agg(pl.col("acc").mean(), pl.col("acc").std().alias("sd"))
    models = ["base", "justgrpo", "arbitrary"]
    tpss = sorted(m["tokens_per_step"].unique())
    w = 0.8 / len(models)
    for i, name in enumerate(models):
        sub = m.filter(pl.col("model") == name).sort("tokens_per_step")
        if sub.is_empty():
            continue
        ax.bar(np.arange(len(tpss)) + i * w, sub["acc"], w, yerr=sub["sd"].fill_null(0), label=name)
    ax.set_xticks(np.arange(len(tpss)) + w, [f"{t} tok/step" for t in tpss])
    ax.set_ylabel("greedy accuracy (test prompts)")
    ax.set_title("Parallel decoding (semi-AR blocks, low-confidence)")
    ax.legend()
    return fig


def run(cfg: Config, ctx: StageContext) -> None:
    ev = derive(read_json(ctx.input("evaluate") / "eval.json"))
    models = read_json(ctx.input("train") / "models.json")
    pk = pl.read_csv(ctx.input("evaluate") / "passk.csv")
    acc = pl.read_csv(ctx.input("evaluate") / "accuracy.csv")
    hist = pl.read_csv(ctx.input("train") / "rl_history.csv")
    if models.get("kind") == "hf":                   # full profile: the real dLLM on GSM8K (issue 41)
        return run_real(ctx, ev, models, pk, acc, hist)
    seeds = ev["seeds"]
    rep = Report(ctx, "JustGRPO — the flexibility trap: GRPO in AR order for masked diffusion LMs",
                 "Arbitrary-order decoding lets a diffusion LLM skip high-entropy fork tokens, which narrows "
                 "solution coverage (pass@k); RL with plain AR-order rollouts and the exact AR likelihood "
                 "(JustGRPO) trains better than arbitrary-order GRPO, and the gain survives parallel decoding.")
    m, rl = models["model"], models["rl"]
    rep.section("Setup", f"""
Task (generated in `prepare`): two-step arithmetic mod {MOD}, prompt `a o b o c` (digits < {MOD}, o ∈ {{+, *}}, * before +),
solution with explicit steps, e.g. `3+4*2` → `4*2=3;3+3=1;#1`; generation length {models['gen_len']}.
With equal operators either pair may be reduced first, so the first generated token is a **fork**
(`a` or `b`). Reward +1 when the digit after `#` is right, −1 otherwise. {ev['passk_prompts']} test prompts
({ev['n_fork_prompts']} with a fork) for pass@k, {ev['eval_prompts']} for greedy accuracy.

Model: the shared tiny transformer in bidirectional mode (d={m['d_model']}, {m['n_layers']} layers,
{m['n_heads']} heads), pretrained per seed with the masked-diffusion objective for
{models['pretrain']['steps']} steps (batch {models['pretrain']['batch']}). RL from that base with the shared
GRPO trainer (`stages/common/grpo.py`): {rl['steps']} steps × {rl['prompts_per_step']} prompts × group
{rl['grpo']['group_size']}, AdamW lr {rl['lr']}, ε = {rl['grpo']['clip_eps']}, KL β = {rl['grpo']['kl_coef']},
loss scaled by 1/(L · #samples with A≠0), A = (r − mean)/(std + 1e-4). Arms: **justgrpo** (AR rollouts, block 1,
T = 1; exact AR likelihood with the rollout's own masked context) and **arbitrary** (low-confidence arbitrary-order
rollouts, T = 1; d1-style one-step likelihood with the whole completion masked). Seeds {seeds}
(each: its own pretraining, RL sampling and evaluation sampling). Evaluation: greedy (T = 0) semi-AR decoding,
blocks of {models['eval_block']}, low-confidence remasking, 1/2/4 tokens per step.
""")
    kmax = max(ev["ks"])
    rows = []
    for s in ("ar", "arbitrary"):
        rows.append({"sampler": s, **{f"pass@{k}": mean_sd(ev["passk"][s][f"pass{k}"]) for k in ev["ks"]
                                      if k in (1, 4, 16, kmax)},
                     "fork entropy (nats)": mean_sd(ev["fork"][s]["fork_entropy"]),
                     "non-fork pos-0 entropy": mean_sd(ev["fork"][s]["nonfork_entropy"]),
                     "fork decoded at (0 first, 1 last)": mean_sd(ev["fork"][s]["fork_decode_step"])})
    rep.table("Results: flexibility trap (pretrained dLLM, mean ± sd over seeds)", pl.DataFrame(rows))
    rows = []
    for name in ["base"] + models["arms"]:
        rows.append({"model": name, **{f"{t[3:]} tok/step": mean_sd(v) for t, v in ev["acc"][name].items()}})
    rep.table("Results: greedy accuracy with parallel decoding (mean ± sd over seeds)", pl.DataFrame(rows),
              note=f"Chance (a guessed answer digit) is {CHANCE}.")
    rep.figure("passk_curves", passk_figure(pk), "pass@k of AR-order vs low-confidence arbitrary-order sampling "
               "on each seed's pretrained dLLM (thin lines: seeds)")
    base_acc = float(nmean(ev["acc"]["base"]["tps1"]))
    rep.figure("acc_vs_rl_step", rl_figure(hist, base_acc), "Greedy accuracy vs RL step for both GRPO arms")
    rep.figure("acc_vs_tokens_per_step", tps_figure(acc), "Greedy accuracy at 1/2/4 tokens per step")
    curve = pk.group_by(["sampler", "k"], maintain_order=True).agg(pl.col("pass_at_k").mean()).pivot(
        on="sampler", index="k", values="pass_at_k").sort("k")
    rep.plot("passk", curve, x="k", y=[c for c in ("ar", "arbitrary") if c in curve.columns], title="pass@k")
    evh = hist.drop_nulls("acc_tps1").group_by(["arm", "step"], maintain_order=True).agg(pl.col("acc_tps1").mean()).pivot(
        on="arm", index="step", values="acc_tps1").sort("step")
    rep.plot("acc_vs_rl_step", evh, x="step", y=[a for a in models["arms"] if a in evh.columns],
             title="greedy accuracy vs RL step")
    rep.table("Deviations", pl.DataFrame({
        "what": ["model and task", "ratio / clip", "baseline", "group and batch", "evaluation",
                 "pass@k models", "seeds", "RL learning rate (disclosure)"],
        "paper / official code": [
            "LLaDA-8B-Instruct, GSM8K / MATH, generation 256",
            "ρ = exp(lp − lp.detach()) ≡ 1 (grpo.py:46): clip inert, REINFORCE with group advantages",
            "d1 (diffu-GRPO): random prompt masking, μ inner updates; not in the JustGRPO repo",
            "8 generations × 2 repeats = 16 per prompt, 64 prompts per step, 125 steps, lr 5e-6",
            "blocks of 32, 256 steps (1 token/step), GSM8K test, single greedy sample",
            "pass@k analysis on LLaDA and other dLLMs, k up to 1024",
            "one run (seed 1234)",
            "5e-6 (8B model)"],
        "here": [
            "tiny bidirectional transformer trained here with the masked-diffusion objective; synthetic mod-5 arithmetic (500 prompts), generation 14",
            "same (ppo_epochs = 1); the shared trainer can run ppo_epochs > 1, which makes the clip live",
            "one-step masked surrogate with the whole completion masked, no prompt masking, one inner update",
            f"group {rl['grpo']['group_size']}, {rl['prompts_per_step']} prompts per step, {rl['steps']} steps, lr {rl['lr']} (tiny model)",
            f"blocks of {models['eval_block']}, 1/2/4 tokens per step, held-out synthetic prompts",
            f"k up to {kmax} with n = {ev['n_samples']} samples per prompt",
            f"{len(seeds)} seeds, each its own pretrained base",
            f"{rl['lr']} (the rate fixed before the first run). After seeing that run (RL left both arms where "
            "they started), a rerun at 1e-3 for both arms was tried: the baseline then collapsed (−0.073) while "
            "JustGRPO stayed flat, turning justgrpo_beats_arbitrary_grpo from fails into inconclusive. A change "
            "chosen after seeing results that favours one arm is not kept; the verdicts here are at the original rate"]}))
    gains = ", ".join(f"{a} {nmean(ev['derived'][f'{a}_gain_tps1']):+.3f}" for a in models["arms"])
    kx = max(ev["ks"])
    rep.section("Discussion", f"""
Measured here (means over seeds): pass@{kx} {nmean(ev['passk']['ar']['at_kmax']):.3f} (AR order) vs
{nmean(ev['passk']['arbitrary']['at_kmax']):.3f} (arbitrary order); under arbitrary order the fork token is
decoded at {nmean(ev['fork']['arbitrary']['fork_decode_step']):.2f} of the way through decoding (0 = first,
1 = last). RL gain in greedy accuracy at 1 token/step over the base model: {gains} (base
{nmean(ev['acc']['base']['tps1']):.3f}, chance {CHANCE:.2f}). With only {rl['steps']} RL steps of
{rl['prompts_per_step']}×{rl['grpo']['group_size']} samples on a tiny model whose base accuracy is near chance,
the RL claims are decided by this small budget and the small held-out set (100 prompts), not by the method's
ceiling; a larger `rl.steps` and model (the `full` profile) is the real test of them. What the miniature does
show is the direction the paper predicts for the baseline: a one-step masked surrogate is a poor stand-in
for the likelihood of arbitrary-order rollouts (tests/justgrpo checks that the AR likelihood is exact and the
surrogate is not), and at the same learning rate that arm is the less stable one.

The paper runs JustGRPO on LLaDA-8B-Instruct (GSM8K 89.1%, MATH-500 45.1 at generation length 256) and
shows the flexibility trap with pass@k up to large k on real reasoning benchmarks. This miniature keeps the
mechanism — a masked-diffusion LM whose arbitrary-order sampler can postpone fork tokens, RL through the exact
AR likelihood vs a one-step masked surrogate — on a task with one explicit fork per prompt and a tiny model.
It does not reproduce the scale, the natural-language reasoning traces, the long generations (where a
one-step surrogate is much further from the true likelihood), nor the paper's benchmarks. The verdicts above
are about this miniature only; a claim that fails here is reported as failing, not tuned.
""")
    rep.section("Threats to validity", f"""
Red-team pass on this design (what could make a verdict wrong, and what remains):

- **Budget decides the RL claims.** The base model is near chance and RL runs {rl['steps']} steps of
  {rl['prompts_per_step']}×{rl['grpo']['group_size']} samples; `justgrpo_improves_base` and
  `justgrpo_beats_arbitrary_grpo` can fail or be inconclusive because the budget is too small for either arm
  to move, not because the method does not work. The accuracy-vs-step curve (figure and `acc_vs_rl_step`
  plot) shows whether the arms were still moving at the last step. The learning rate was fixed before the
  first run; a post-hoc rerun at a larger rate was not kept (Deviations).
- **Item noise.** Greedy accuracy is over the same {ev['eval_prompts']} held-out prompts for every arm and
  seed; per-item lists are not stored, so the claims use the binomial item variance (`n_items`), unpaired —
  conservative against a paired per-item test. pass@k uses the same binomial term over
  {ev['passk_prompts']} prompts, an upper bound for a mean of per-prompt estimates in [0, 1].
- **Min effects** (params `papers.justgrpo.report.claims`): 0.02 in accuracy / pass@k and 0.05 nats of
  fork entropy, fixed as the smallest gaps that matter on this eval size, not from results.
- **Guessing saturates pass@k.** Answers are one digit mod {MOD}: a uniform guesser reaches pass@{kmax}
  = 1 − (1 − 1/{MOD})^{kmax} ≈ {1 - (1 - CHANCE) ** kmax:.4f}, so `ar_coverage_at_large_k` compares two saturated
  answer-level numbers and cannot show the coverage gap the paper means; it is kept at the k fixed before the
  run, and trace-level (every step valid) pass@k at unsaturated k is open (issue 46).
- **Logged loss.** The RL "loss" in the training log is the clipped surrogate's value (ratio ≡ 1 with one update
  per rollout, as in the official code), ≈ 0 by construction; reward and held-out accuracy are the signals.
- **Fork entropy** is measured at one explicit fork position per fork prompt
  ({ev['n_fork_prompts']} of {ev['passk_prompts']}); prompts without a fork do not enter it.
- **Mechanism, not scale.** A tiny model on a synthetic task with a 14-token generation: the one-step
  surrogate is much closer to the true likelihood here than at generation length 256, which weakens the
  baseline's handicap relative to the paper's setting.
""")
    rep.finish(CLAIMS, ev)


def run_real(ctx: StageContext, ev: dict, models: dict, pk: pl.DataFrame, acc: pl.DataFrame,
             hist: pl.DataFrame) -> None:
    """The report of the `full` profile's real path: the same claims (minus the toy's guessed-digit sanity check)
    on a real masked-diffusion checkpoint fine-tuned with both GRPO arms on GSM8K."""
    src, d, rl = models["source"], models["dllm"], models["rl"]
    rep = Report(ctx, "JustGRPO — the flexibility trap on a real dLLM (GSM8K)",
                 "Arbitrary-order decoding narrows a diffusion LLM's solution coverage (pass@k); RL with AR-order "
                 "rollouts and the exact AR likelihood (JustGRPO) trains better than arbitrary-order GRPO, and the "
                 "gain survives parallel decoding.")
    rep.section("Setup", f"""
Real path (`full` profile): checkpoint `{src.get('model')}` (dtype {src.get('dtype')}) used as a masked-diffusion LM
(MASK id {d['mask_token_id']}, attention {d['bidirectional']}), GSM8K records from prepare (official answer
extraction and `math_equal`). RL per seed and arm from the checkpoint: {rl['steps']} steps × {rl['prompts_per_step']}
prompts × group {rl['grpo']['group_size']}, lr {rl['lr']}, reward ±1 (official). Generation length {models['gen_len']}.
pass@k: {ev['n_samples']} samples per question (T = 1) on {ev['passk_prompts']} test questions, AR order (block 1)
vs low-confidence arbitrary order (one block); greedy accuracy: {ev['eval_prompts']} test questions, semi-AR blocks,
{', '.join(str(t) for t in sorted(int(k[3:]) for k in ev['acc']['base']))} token(s) per step. Seeds {ev['seeds']}.
GSM8K has no labelled fork tokens: the fork-entropy claim has no measurement here (inconclusive by design).
""")
    rows = [{"sampler": s, **{f"pass@{k}": mean_sd(ev["passk"][s][f"pass{k}"]) for k in ev["ks"]}}
            for s in ("ar", "arbitrary")]
    rep.table("Results: flexibility trap (the checkpoint, mean ± sd over seeds)", pl.DataFrame(rows))
    rows = [{"model": name, **{f"{t[3:]} tok/step": mean_sd(v) for t, v in ev["acc"][name].items()}}
            for name in ["base"] + models["arms"]]
    rep.table("Results: greedy GSM8K accuracy with parallel decoding (mean ± sd over seeds)", pl.DataFrame(rows))
    rep.figure("passk_curves", passk_figure(pk), "pass@k of AR-order vs arbitrary-order sampling (thin: seeds)")
    rep.figure("acc_vs_rl_step", rl_figure(hist, float(nmean(ev["acc"]["base"]["tps1"])), "acc_gsm8k", None),
               "Greedy GSM8K accuracy (train's eval subset) vs RL step for both GRPO arms")
    rep.figure("acc_vs_tokens_per_step", tps_figure(acc), "Greedy accuracy by tokens per step")
    curve = pk.group_by(["sampler", "k"], maintain_order=True).agg(pl.col("pass_at_k").mean()).pivot(
        on="sampler", index="k", values="pass_at_k").sort("k")
    rep.plot("passk", curve, x="k", y=[c for c in ("ar", "arbitrary") if c in curve.columns], title="pass@k")
    rep.section("Threats to validity", """
- The fork-token analysis needs labelled fork positions, which GSM8K does not have: `fork_entropy_ar_higher` is
  inconclusive by construction on this path.
- Accuracy claims use the binomial item variance over the evaluated questions (per-question 0/1 lists are in
  eval.json `acc_items`); the RL budget and learning rate are whatever `full` names, not the paper's 125 steps of
  64 prompts × 16 samples unless set so.
""")
    rep.finish([c for c in CLAIMS if c.name != "baseline_beats_chance"], ev)
