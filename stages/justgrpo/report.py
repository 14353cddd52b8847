"""report: seed-aware verdicts on the flexibility trap (pass@k, fork entropy) and on JustGRPO vs the
arbitrary-order GRPO baseline (greedy accuracy at 1/2/4 tokens per step), with pass@k curves and
accuracy-vs-RL-step curves.

    python -m stages report justgrpo [--profile smoke]
"""
from __future__ import annotations

import dataclasses

import matplotlib.pyplot as plt
import numpy as np
import polars as pl

from stages.common.config import ReportConfig
from stages.common.paths import read_json
from stages.common.reporting import Report
from stages.common.runner import StageContext

from stages.common.claims import Better, Bound, Claim  # noqa: E402
from stages.justgrpo.prepare import load_prompts  # noqa: E402

CLAIMS = [
    Better("ar_coverage_at_k",
           "Flexibility trap: on the one pretrained dLLM checkpoint, AR-order sampling covers more solutions than "
           "low-confidence arbitrary order (trace-level pass@k at the k fixed in evaluate.claim_k, T = 1, unbiased "
           "estimator, paired per test prompt)",
           a="passk_items.ar.trace_at_claim_k", b="passk_items.arbitrary.trace_at_claim_k",
           refuted_by="arbitrary-order trace-level pass@k not below AR order's beyond the t-bound", kind="finding"),
    Bound("coverage_unsaturated",
          "Control: at the claim's k neither sampler's trace-level pass@k is saturated (the larger of the two stays "
          "below the bound), so the coverage comparison can show a gap",
          value="derived.max_trace_at_claim_k",
          refuted_by="a sampler's pass@k at the claim's k at or above the saturation bound", kind="check"),
    Better("fork_branches_ar_wider",
           "Flexibility trap, the mechanism: sampled at T = 1, AR order reaches both branches of a fork in VALID "
           "traces (both writing orders of the ones column, each in a trace with every step valid, among a prompt's "
           "samples) on more fork prompts than arbitrary order, which settles the fork late, from the "
           "already-decoded rest (per fork prompt, paired)",
           a="fork.ar.both_orders_valid", b="fork.arbitrary.both_orders_valid",
           refuted_by="arbitrary order reaches both branches in valid traces on no fewer fork prompts than AR order, "
                      "beyond the t-bound", kind="finding"),
    Better("fork_first_token_ar_wider",
           "First-token diversity: AR order's samples start with both writing orders on more fork prompts than "
           "arbitrary order's, broken traces included. A check, not a finding: AR samples position 0 from the "
           "pretraining marginal (both orders equally often), so with n samples its rate is ≈ 1 − 2·0.5ⁿ by "
           "construction",
           a="fork.ar.both_orders", b="fork.arbitrary.both_orders",
           refuted_by="arbitrary order's samples start both ways on no fewer fork prompts than AR order's, beyond "
                      "the t-bound", kind="check"),
    Better("fork_entropy_ar_higher",
           "Arbitrary order defers fork tokens and decodes them with lower entropy than AR order does. A check, not "
           "a finding: once the other operand of the column is decoded the fork token is determined, so a late "
           "decode has low entropy by construction; AR's value is a deterministic function of the prompts",
           a="fork.ar.fork_entropy", b="fork.arbitrary.fork_entropy",
           refuted_by="fork entropy under arbitrary order not below AR order's beyond the t-bound", kind="check"),
    Bound("base_trace_above_floor",
          "Design: the base dLLM reasons at a moderate level — its AR-order (T = 1) trace-level pass@1 on test "
          "prompts is above the floor",
          value="passk_items.ar.trace_pass1", refuted_by="base trace-level pass@1 not above the floor", kind="check"),
    Bound("base_trace_below_ceiling",
          "Design: the base dLLM leaves room for RL — its AR-order (T = 1) trace-level pass@1 is below the ceiling",
          value="passk_items.ar.trace_pass1", refuted_by="base trace-level pass@1 not below the ceiling", kind="check"),
    Bound("base_greedy_below_ceiling",
          "Design: the base leaves room for RL on the metric the RL findings read — its greedy answer accuracy "
          "(semi-AR, 1 token/step) is below the ceiling",
          value="acc.base.tps1", refuted_by="base greedy answer accuracy not below the ceiling", kind="check"),
    Claim("guessing_rare", "Design: guessing is rare — the best constant answer is right on under the bound's share "
          "of test prompts", "guess_rate < param.below", kind="check"),
    Better("justgrpo_improves_base",
           "JustGRPO (AR-order rollouts, exact AR likelihood, clipped surrogate, no KL) raises greedy answer accuracy "
           "over the pretrained dLLM (1 token/step, semi-AR low-confidence decoding, paired per test prompt; this one "
           "base checkpoint). A check, not a finding: the imperfect teacher plants the room (on carry prompts the base's "
           "greedy answer is wrong while its samples sometimes carry), and any working RL arm uses it — the findings "
           "compare JustGRPO with the control and the arbitrary-order baseline",
           a="acc.justgrpo.tps1", b="acc.base.tps1",
           refuted_by="JustGRPO accuracy not above the base model's beyond the t-bound", kind="check"),
    Better("justgrpo_beats_continued",
           "JustGRPO's gain is the RL's, not more training's: its greedy answer accuracy is above the control's — the "
           "base trained on for the same number of steps with its own masked-diffusion objective and teacher data "
           "(same lr, as many sequences per step), paired per test prompt (this one base checkpoint)",
           a="acc.justgrpo.tps1", b="acc.continued.tps1",
           refuted_by="the continued-pretraining control's accuracy not below JustGRPO's beyond the t-bound",
           kind="finding"),
    Better("justgrpo_improves_base_trace",
           "JustGRPO's gain holds at trace level: greedy traces with every step valid become more frequent than the "
           "base model's (this one base checkpoint). A check, like the answer-level one: the gain is on carry "
           "prompts, where the teacher planted the error; the carry / no-carry table shows what RL does elsewhere",
           a="trace_acc.justgrpo.tps1", b="trace_acc.base.tps1",
           refuted_by="JustGRPO trace-level accuracy not above the base model's beyond the t-bound", kind="check"),
    Better("justgrpo_beats_arbitrary_grpo",
           "JustGRPO reaches higher greedy accuracy than the GRPO baseline that keeps arbitrary-order "
           "rollouts with a one-step masked log-prob surrogate (same base, steps, group size, learning rate; this one base checkpoint: seeds vary RL and evaluation sampling, not the base)",
           a="acc.justgrpo.tps1", b="acc.arbitrary.tps1",
           refuted_by="baseline accuracy not below JustGRPO's beyond the t-bound", kind="finding"),
    Better("justgrpo_beats_arbitrary_trace",
           "JustGRPO's lead over the arbitrary-order GRPO baseline holds at trace level (greedy traces with every step "
           "valid, 1 token/step, paired per test prompt; this one base checkpoint: seeds vary RL and evaluation sampling, not the base)",
           a="trace_acc.justgrpo.tps1", b="trace_acc.arbitrary.tps1",
           refuted_by="baseline trace-level accuracy not below JustGRPO's beyond the t-bound", kind="finding"),
    Bound("gain_survives_parallel",
          "Most of JustGRPO's RL gain survives parallel decoding: its gain over the base model at 4 tokens/step "
          "is at least half its gain at 1 token/step (value = gain₄ − ½·gain₁, per test prompt; this one base checkpoint: seeds vary RL and evaluation sampling, not the base)",
          value="derived.justgrpo_survival_tps4",
          refuted_by="gain at 4 tokens/step below half the gain at 1 token/step beyond the t-bound", kind="finding"),
    Bound("baseline_beats_guesser",
          "Sanity: the arbitrary-order GRPO baseline is non-degenerate (greedy answer accuracy above the best "
          "constant guesser's)",
          value="acc.arbitrary.tps1", above="guess_rate",
          refuted_by="baseline accuracy not above the guesser's beyond the t-bound", kind="check"),
]


# the real path (GSM8K, no step checker, no per-prompt pass@k lists): the paper's claims on answer-level numbers
REAL_CLAIMS = [dataclasses.replace(CLAIMS[0], a="passk.ar.at_claim_k", b="passk.arbitrary.at_claim_k",
                                   statement="Flexibility trap: AR-order sampling covers more GSM8K questions than "
                                             "low-confidence arbitrary order (answer-level pass@k at evaluate.claim_k)")]
REAL_CLAIMS += [c for c in CLAIMS if c.name in ("fork_entropy_ar_higher", "justgrpo_improves_base",
                                                "justgrpo_beats_arbitrary_grpo", "gain_survives_parallel")]


class Config(ReportConfig):
    pass


def _sub(x: list, y: list, w: float = 1.0) -> list:
    """Per-seed (per-item) x − w·y for per-seed numbers or per-seed lists of per-item numbers."""
    if x and isinstance(x[0], list):
        return [[a - w * b for a, b in zip(xs, ys)] for xs, ys in zip(x, y)]
    return [a - w * b for a, b in zip(x, y)]


def derive(ev: dict) -> dict:
    kmax, kc = max(ev["ks"]), ev.get("claim_k", max(ev["ks"]))
    for s in ev["passk"].values():
        for lv in ([s[k] for k in ("trace", "answer") if k in s] or [s]):   # the real path has one level
            lv["at_kmax"] = lv[f"pass{kmax}"]
            lv["at_claim_k"] = lv.get(f"pass{kc}", lv[f"pass{kmax}"])
    d = {}
    if "passk" in ev and all("trace" in v for v in ev["passk"].values()):
        d["max_trace_at_claim_k"] = [max(x) for x in zip(*(v["trace"][f"pass{kc}"] for v in ev["passk"].values()))]
    acc = ev["acc"]
    for arm in [a for a in acc if a != "base"]:
        for tps in acc[arm]:
            d[f"{arm}_gain_{tps}"] = _sub(acc[arm][tps], acc["base"][tps])
        if "tps4" in acc[arm] and "tps1" in acc[arm]:
            d[f"{arm}_survival_tps4"] = _sub(d[f"{arm}_gain_tps4"], d[f"{arm}_gain_tps1"], 0.5)
    ev["derived"] = d
    return ev


def _mean(v) -> float:
    """A per-seed value's mean: a number, or the mean of a per-item list (None -> NaN)."""
    if isinstance(v, list):
        a = _arr(v)
        return float(np.nanmean(a)) if np.isfinite(a).any() else float("nan")
    return float("nan") if v is None else float(v)


def _arr(v) -> np.ndarray:
    """Per-seed values as floats (a per-item list becomes its mean); null (a non-finite value written by
    write_json) becomes NaN."""
    return np.asarray([_mean(x) if isinstance(x, list) else (np.nan if x is None else x) for x in v], float)


def nmean(v) -> float:
    a = _arr(v)
    return float(np.nanmean(a)) if np.isfinite(a).any() else float("nan")


def stratum(per_seed: list[list[float]], mask: np.ndarray) -> list[float]:
    """Per seed, the mean of its per-prompt values over the prompts ``mask`` selects (a carry stratum)."""
    return [float(np.asarray(v)[mask].mean()) for v in per_seed]


def mean_sd(v: list[float]) -> str:
    a = _arr(v)
    a = a[np.isfinite(a)]
    if not len(a):
        return "n/a"
    return f"{a.mean():.3f} ± {a.std(ddof=1) if len(a) > 1 else 0:.3f}"


def passk_figure(pk: pl.DataFrame):
    """pass@k per level (trace, answer): seed-mean curve with the item-level ±1 s.e. band, thin seed lines."""
    levels = [lv for lv in ("trace", "answer") if "level" not in pk.columns or lv in pk["level"].to_list()]
    fig, axes = plt.subplots(1, len(levels), figsize=(5.5 * len(levels), 4), squeeze=False)
    for ax, level in zip(axes[0], levels):
        sub0 = pk.filter(pl.col("level") == level) if "level" in pk.columns else pk
        for sampler, color in (("ar", "C0"), ("arbitrary", "C3")):
            sub = sub0.filter(pl.col("sampler") == sampler)
            for seed in sub["seed"].unique().sort():
                s = sub.filter(pl.col("seed") == seed).sort("k")
                ax.plot(s["k"], s["pass_at_k"], color=color, alpha=0.25, lw=1)
            m = sub.group_by("k", maintain_order=True).agg(
                pl.col("pass_at_k").mean(), (pl.col("item_se").mean() if "item_se" in sub.columns
                                             else pl.lit(0.0)).alias("se")).sort("k")
            ax.plot(m["k"], m["pass_at_k"], color=color, lw=2.5, marker="o",
                    label={"ar": "AR order (block 1)", "arbitrary": "low-confidence arbitrary order"}[sampler])
            ax.fill_between(m["k"], m["pass_at_k"] - m["se"], m["pass_at_k"] + m["se"], color=color, alpha=0.15)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("k")
        ax.set_ylabel(f"{level}-level pass@k (test prompts)")
        ax.set_title(f"{level}-level coverage (band: ±1 item s.e.)")
        ax.legend(fontsize=8)
    fig.suptitle("Pretrained dLLM: solution coverage vs decoding order (T = 1)")
    return fig


ARM_LABEL = {"justgrpo": "JustGRPO (AR order, exact likelihood)", "arbitrary": "GRPO, arbitrary order + one-step surrogate",
             "continued": "control: the base's own training, same steps"}


def rl_figure(hist: pl.DataFrame, base_acc: float | None = None, col: str = "dev_acc", chance: float | None = None,
              panels: tuple[tuple[str, str], ...] | None = None):
    """RL curves per arm: seed-mean line with a ±1 sd band across seeds, one panel per logged quantity."""
    panels = panels or ((col, "greedy answer accuracy (dev)"), ("dev_trace_acc", "greedy trace-level accuracy (dev)"),
                        ("reward_mean", "rollout reward mean (±1)"), ("kl_to_base", "KL(policy ‖ base) on AR-order samples\n(the JustGRPO rollout law, for both arms)"))
    panels = tuple((c, t) for c, t in panels if c in hist.columns)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.3 * len(panels), 3.6), squeeze=False)
    for ax, (c, title) in zip(axes[0], panels):
        ev = hist.drop_nulls(c)
        for arm, color in (("justgrpo", "C0"), ("arbitrary", "C3"), ("continued", "C7")):
            sub = ev.filter(pl.col("arm") == arm)
            if sub.is_empty():
                continue
            m = sub.group_by("step", maintain_order=True).agg(pl.col(c).mean().alias("m"),
                                                               pl.col(c).std().fill_null(0).alias("sd")).sort("step")
            ax.plot(m["step"], m["m"], color=color, lw=2, label=ARM_LABEL[arm])
            ax.fill_between(m["step"], m["m"] - m["sd"], m["m"] + m["sd"], color=color, alpha=0.15)
        if c == col and chance is not None:
            ax.axhline(chance, color="grey", ls=":", label="best constant guesser")
        ax.set_xlabel("RL step")
        ax.set_title(title, fontsize=9)
    axes[0][0].legend(fontsize=7, loc="lower right")
    fig.suptitle("RL curves (line: seed mean, band: ±1 sd across seeds)")
    fig.tight_layout()
    return fig


def pretrain_figure(loss: pl.DataFrame, curve: pl.DataFrame, target: float | None):
    fig, ax = plt.subplots(figsize=(6, 4))
    if not loss.is_empty():
        k = max(1, loss.height // 100)
        sm = loss.with_columns(pl.col("loss").rolling_mean(k)).gather_every(k)
        ax.plot(sm["step"], sm["loss"], color="grey", lw=1, label="masked-diffusion loss (rolling mean)")
    ax.set_xlabel("pretraining step")
    ax.set_ylabel("loss")
    ax2 = ax.twinx()
    if not curve.is_empty():
        ax2.plot(curve["step"], curve["dev_greedy_acc"], color="C0", marker="o",
                 label="dev greedy answer accuracy" + (" (the stop rule)" if target is not None else ""))
        ax2.plot(curve["step"], curve["dev_greedy_trace"], color="C1", marker=".", label="dev greedy trace-level accuracy")
        ax2.plot(curve["step"], curve["dev_trace_pass1"], color="C2", marker=".", label="dev trace-level pass@1 (AR, T = 1)")
    if target is not None:
        ax2.axhline(target, color="C0", ls=":", label="stop-rule target")
    ax2.set_ylabel("dev accuracy")
    ax2.set_ylim(0, 1)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax2.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper left")
    ax.set_title("Pretraining of the base dLLM" + (" and its stop rule" if target is not None else ""), fontsize=9)
    return fig


def tps_figure(acc: pl.DataFrame):
    if "decoder" in acc.columns:
        acc = acc.filter(pl.col("decoder") == "semi_ar")
    cols = [c for c in ("acc", "trace_acc") if c in acc.columns]
    fig, axes = plt.subplots(1, len(cols), figsize=(5.5 * len(cols), 4), squeeze=False)
    models = [m for m in ("base", "justgrpo", "arbitrary", "continued") if m in set(acc["model"])]
    for ax, col in zip(axes[0], cols):
        m = acc.group_by(["model", "tokens_per_step"], maintain_order=True).agg(
            pl.col(col).mean().alias("m"), pl.col(col).std().alias("sd"))
        tpss = sorted(m["tokens_per_step"].unique())
        w = 0.8 / len(models)
        for i, name in enumerate(models):
            sub = m.filter(pl.col("model") == name).sort("tokens_per_step")
            if sub.is_empty():
                continue
            ax.bar(np.arange(len(tpss)) + i * w, sub["m"], w, yerr=sub["sd"].fill_null(0), label=name)
        ax.set_xticks(np.arange(len(tpss)) + w, [f"{t} tok/step" for t in tpss])
        ax.set_ylabel({"acc": "greedy answer accuracy", "trace_acc": "greedy trace-level accuracy"}[col] + " (test)")
        ax.legend(fontsize=8)
    fig.suptitle("Parallel decoding (semi-AR blocks, low-confidence)")
    return fig


def run(cfg: Config, ctx: StageContext) -> None:
    ev = derive(read_json(ctx.input("evaluate") / "eval.json"))
    models = read_json(ctx.input("train") / "models.json")
    pk = pl.read_csv(ctx.input("evaluate") / "passk.csv")
    acc = pl.read_csv(ctx.input("evaluate") / "accuracy.csv")
    hist = pl.read_csv(ctx.input("train") / "rl_history.csv")
    if models.get("kind") == "hf":                   # full profile: the real dLLM on GSM8K (issue 41)
        return run_real(ctx, ev, models, pk, acc, hist)
    pre_loss = pl.read_csv(ctx.input("train") / "pretrain_history.csv")
    pre_curve = pl.read_csv(ctx.input("train") / "pretrain_curve.csv")
    meta = read_json(ctx.input("prepare") / "meta.json")
    seeds, kc, kmax = ev["seeds"], ev["claim_k"], max(ev["ks"])
    rep = Report(ctx, "JustGRPO — the flexibility trap: GRPO in AR order for masked diffusion LMs",
                 "Arbitrary-order decoding lets a diffusion LLM skip high-entropy fork tokens, which narrows "
                 "solution coverage (pass@k); RL with plain AR-order rollouts and the exact AR likelihood "
                 "(JustGRPO) trains better than arbitrary-order GRPO, and the gain survives parallel decoding.")
    m, rl, pre = models["model"], models["rl"], models["pretrain"]
    if pre.get("target_greedy_acc") is None:
        stop = (f"trained for a fixed {models['pretrain_steps_run']} steps (no stop rule; dev readings every "
                f"{pre['eval_every']} steps on {pre['eval_prompts']} dev prompts are recorded)")
    elif models.get("pretrain_stopped_at_target"):
        stop = (f"stopped at step {models['pretrain_steps_run']}, the first check (every {pre['eval_every']} steps, "
                f"{pre['eval_prompts']} dev prompts) at which greedy answer accuracy (the RL findings' metric) "
                f"reached the target {pre['target_greedy_acc']}")
    else:
        stop = f"ran all {models['pretrain_steps_run']} steps (the target {pre['target_greedy_acc']} was not reached)"
    drop = pre.get("teacher_carry_drop", 0.0)
    teacher = (f" The pretraining data come from an **imperfect teacher**: on a prompt with a carry it writes the "
               f"tens column without the carry on {drop:.0%} of traces (`47+38` → `7+8=15;4+3=7;#75`, an invalid trace, "
               f"answer one ten short). A base that imitates it leaves the carry out under greedy decoding on most carry "
               f"prompts while its T = 1 samples carry about {1 - drop:.0%} of the time: room that RL's correctness "
               f"reward can use and more of the same training should not fill (the `continued` control measures how "
               f"much it does), and the carry token is a fork whose branches differ in correctness." if drop else "")
    controls = (f" Control **continued**: the base trained on with its own objective and teacher for the same "
                f"{rl['steps']} steps at lr {rl['lr']} on {rl['prompts_per_step'] * rl['grpo']['group_size']} traces "
                f"per step (as many sequences as an RL step scores), per seed." if models.get("controls") else "")
    rep.section("Setup", f"""
Task (generated in `prepare`): two-digit addition `ab+cd` (all 10⁴ prompts; {meta['n_train']} train, {meta['n_dev']} dev,
{meta['n_test']} test, disjoint), solved column by column with explicit steps, e.g. `47+38` → `7+8=15;4+3+1=8;#85`;
generation length {models['gen_len']}. Addition commutes, so each column can be written either way round: when
b ≠ d the first generated token is a **fork** (`b` or `d`). Answers span 0..198 ({meta['n_answers']} values): the best
constant guesser is right on {meta['guess_rate']:.3f} of test prompts. Reward +1 when the number after `#` is right,
−1 otherwise (the paper's). Correctness is read at two levels: **answer** (the number after `#`) and **trace**
(every step valid: the right column digits in either order, the right sums, the carry written iff there is one,
the answer assembled from the steps, EOS only after it).{teacher}

Model: the shared tiny transformer in bidirectional mode (d={m['d_model']}, {m['n_layers']} layers, {m['n_heads']} heads),
**one** base pretrained with the masked-diffusion objective (batch {pre['batch']}, lr {pre['lr']}{f", constant, then decayed linearly to 0 over the last {pre['lr_decay_frac']:.0%} of steps" if pre.get('lr_decay_frac') else ''}, seed {pre['seed']}),
{stop}. Every seed's RL starts from that base (the shared prefix is computed once). RL with the shared GRPO trainer
(`stages/common/grpo.py`): {rl['steps']} steps × {rl['prompts_per_step']} prompts × group {rl['grpo']['group_size']},
AdamW lr {rl['lr']}, ε = {rl['grpo']['clip_eps']}, KL β = {rl['grpo']['kl_coef']}, loss scaled by 1/(L · #samples
with A≠0), A = (r − mean)/(std + 1e-4). Arms: **justgrpo** (AR rollouts, block 1, T = 1; exact AR likelihood with the
rollout's own masked context) and **arbitrary** (low-confidence arbitrary-order rollouts, T = 1; d1-style one-step
likelihood with the whole completion masked).{controls} Seeds {seeds}: each seed is its own RL sampling stream (both arms) and
its own evaluation sampling stream on the base. Evaluation on test prompts: pass@k with n = {ev['n_samples']} samples
on {ev['passk_prompts']} prompts ({ev['n_fork_prompts']} with a fork), the coverage claim at k = {kc} (fixed in
`evaluate.claim_k`); greedy (T = 0) semi-AR decoding, blocks of {models['eval_block']}, low-confidence remasking, 1/2/4
tokens per step, on {ev['eval_prompts']} prompts, every verdict paired per test prompt.
""")
    rows = []
    for smp in ("ar", "arbitrary"):
        row = {"sampler": smp}
        for level in ("trace", "answer"):
            for k in sorted({1, kc, kmax}):
                row[f"{level} pass@{k}"] = mean_sd(ev["passk"][smp][level][f"pass{k}"])
        row["fork prompts with both branches"] = mean_sd(ev["fork"][smp]["both_orders"])
        row["… among valid traces"] = mean_sd(ev["fork"][smp]["both_orders_valid"])
        row["fork entropy (nats)"] = mean_sd(ev["fork"][smp]["fork_entropy"])
        row["fork decoded at (0 first, 1 last)"] = mean_sd(ev["fork"][smp]["fork_decode_step"])
        rows.append(row)
    rep.table("Results: flexibility trap (the pretrained base, mean ± sd over sampling seeds)", pl.DataFrame(rows))
    rows = []
    for name in ["base"] + models["arms"] + models.get("controls", []):
        row = {"model": name}
        for t in sorted(ev["acc"][name], key=lambda t: (t == "full_arbitrary", t)):   # tok/step first
            label = "full arbitrary" if t == "full_arbitrary" else f"{t[3:]} tok/step"
            row[f"answer, {label}"] = mean_sd(ev["acc"][name][t])
            row[f"trace, {label}"] = mean_sd(ev["trace_acc"][name][t])
        rows.append(row)
    rep.table("Results: greedy accuracy with parallel decoding (test prompts, mean ± sd over seeds)", pl.DataFrame(rows),
              note=f"The best constant guesser scores {meta['guess_rate']:.3f}. *k tok/step*: semi-AR blocks of "
                   f"{models['eval_block']} (the claims' decoder); *full arbitrary*: one block, low-confidence order, "
                   "1 token per step.")
    test = load_prompts(ctx.input("prepare"), "test")[: ev["eval_prompts"]]
    carry = ((test[:, 1] + test[:, 4]) >= 10).numpy()
    rows = []
    for name in ["base"] + models["arms"] + models.get("controls", []):
        row = {"model": name}
        for label, mask in (("carry", carry), ("no carry", ~carry)):
            row[f"answer, {label}"] = mean_sd(stratum(ev["acc"][name]["tps1"], mask))
            row[f"trace, {label}"] = mean_sd(stratum(ev["trace_acc"][name]["tps1"], mask))
        rows.append(row)
    nc_trace = {name: nmean(stratum(ev["trace_acc"][name]["tps1"], ~carry)) for name in ["base"] + models["arms"]}
    c_trace = {name: nmean(stratum(ev["trace_acc"][name]["tps1"], carry)) for name in ["base"] + models["arms"]}
    rep.table("Results: greedy accuracy (1 tok/step) on test prompts with and without a carry (mean ± sd over seeds)",
              pl.DataFrame(rows), note=f"{int(carry.sum())} of the {len(carry)} evaluated prompts have a carry "
              "(the column where the imperfect teacher slips).")
    pk_test = load_prompts(ctx.input("prepare"), "test")[: ev["passk_prompts"]]
    pk_carry = ((pk_test[:, 1] + pk_test[:, 4]) >= 10).numpy()
    rows = []
    for smp in ("ar", "arbitrary"):
        row = {"sampler": smp}
        for level in ("trace", "answer"):
            per_seed = ev["passk_items"][smp].get(f"{level}_at_claim_k", [])
            for label, mask in (("carry", pk_carry), ("no carry", ~pk_carry)):
                row[f"{level} pass@{kc}, {label}"] = mean_sd(stratum(per_seed, mask))
        rows.append(row)
    rep.table(f"Results: pass@{kc} of the base on pass@k prompts with and without a carry (mean ± sd over seeds)",
              pl.DataFrame(rows), note=f"{int(pk_carry.sum())} of the {len(pk_carry)} pass@k prompts have a carry; "
              "`ar_coverage_at_k` reads all of them (as registered).")
    rep.figure("pretrain_curve", pretrain_figure(pre_loss, pre_curve, pre["target_greedy_acc"]),
               "Masked-diffusion pretraining loss and the stop rule's dev readings (greedy answer accuracy, which "
               "stops it; greedy trace-level accuracy and T = 1 trace-level pass@1 beside it)")
    rep.figure("passk_curves", passk_figure(pk), "Trace- and answer-level pass@k of AR-order vs low-confidence "
               "arbitrary-order sampling on the base (thin lines: seeds; band: ±1 item-level s.e.)")
    rep.figure("rl_curves", rl_figure(hist, chance=meta["guess_rate"]),
               "RL on the dev slice: greedy answer and trace accuracy, reward, KL to the base, per arm")
    rep.figure("acc_vs_tokens_per_step", tps_figure(acc), "Greedy answer and trace accuracy at 1/2/4 tokens per step")
    for level in ("trace", "answer"):
        curve = pk.filter(pl.col("level") == level).group_by(["sampler", "k"], maintain_order=True).agg(
            pl.col("pass_at_k").mean()).pivot(on="sampler", index="k", values="pass_at_k").sort("k")
        rep.plot(f"passk_{level}", curve, x="k", y=[c for c in ("ar", "arbitrary") if c in curve.columns],
                 title=f"{level}-level pass@k")
    for col in ("dev_acc", "dev_trace_acc", "kl_to_base"):
        evh = hist.drop_nulls(col).group_by(["arm", "step"], maintain_order=True).agg(pl.col(col).mean()).pivot(
            on="arm", index="step", values=col).sort("step")
        rep.plot(f"rl_{col}", evh, x="step", y=[a for a in models["arms"] + models.get("controls", []) if a in evh.columns],
                 title=f"{col} vs RL step")
    rep.table("Deviations", pl.DataFrame({
        "what": ["model and task", "ratio / clip", "baseline", "group and batch", "evaluation", "pass@k models",
                 "base model and seeds", "RL length and rate", "pretraining data"],
        "paper / official code": [
            "LLaDA-8B-Instruct, GSM8K / MATH, generation 256",
            "ρ = exp(lp − lp.detach()) ≡ 1 (grpo.py:46): clip inert, REINFORCE with group advantages",
            "d1 (diffu-GRPO): random prompt masking, μ inner updates; not in the JustGRPO repo",
            "8 generations × 2 repeats = 16 per prompt, 64 prompts per step, 125 steps, lr 5e-6",
            "blocks of 32, 256 steps (1 token/step), GSM8K test, single greedy sample",
            "pass@k analysis on LLaDA and other dLLMs, k up to 1024",
            "one pretrained checkpoint, one RL run (seed 1234)",
            "125 steps × 64 prompts",
            "LLaDA's pretraining and instruction data (natural text; the base's errors are its own)"],
        "here": [
            "tiny bidirectional transformer pretrained here with the masked-diffusion objective; synthetic two-digit "
            f"addition with explicit steps (10⁴ prompts), generation {models['gen_len']}",
            "same (ppo_epochs = 1); the shared trainer can run ppo_epochs > 1, which makes the clip live",
            f"one-step masked surrogate with the whole completion masked, no prompt masking, one inner update; rollouts "
            f"with low-confidence order inside semi-AR blocks of {rl.get('baseline_block') or models['gen_len']} (d1 rolls "
            "out with LLaDA's semi-AR sampler; the first version of this redesign rolled out in one block and was scored "
            "with blocks of 5, a mismatch the red team flagged); the same learning rate as JustGRPO, the best of both arms' "
            "dev sweep (reports/studies/justgrpo_lr_sweep.md); JustGRPO's step count",
            f"group {rl['grpo']['group_size']}, {rl['prompts_per_step']} prompts per step, {rl['steps']} steps, lr {rl['lr']} (tiny model)",
            f"blocks of {models['eval_block']}, 1/2/4 tokens per step, plus one fully arbitrary-order decode, held-out "
            "synthetic prompts; answer- and trace-level",
            f"k up to {kmax} with n = {ev['n_samples']} samples on {ev['passk_prompts']} prompts, the claim at k = {kc}. "
            "The first run used n = 64 on 100 prompts; the red team found the coverage claim underpowered (detectable "
            "gap 0.096, item noise dominant), so the same sampling budget now covers 4× the prompts (k unchanged)",
            f"one pretrained base shared by all {len(seeds)} seeds (the CPU budget: pretraining is most of the stage); "
            "seeds vary RL and evaluation sampling",
            f"{rl['steps']} steps, fixed from a 200-step learning-curve probe of this pipeline on an earlier, "
            "teacher-free base (reports/studies/justgrpo_rl_probe.csv): JustGRPO's dev accuracy rose within 40–60 "
            "steps and then stayed flat, while trace-level accuracy fell further the longer RL ran. Re-derived on "
            "this base by a 200-step, 5-seed study (reports/studies/justgrpo_rl200_5seeds): JustGRPO's dev answer "
            "accuracy (mean of 5 seeds) is 0.97 at step 10 and stays at 0.96–0.985 to step 200, the baseline's "
            "reaches 0.95 by step 30; trace-level accuracy peaks at step 10 (0.82) and falls with more RL (0.38 at "
            "200), so 60 steps is past both arms' answer-level plateau; lr "
            f"{rl['lr']} from both arms' dev sweep (reports/studies/justgrpo_lr_sweep.md)",
            f"an imperfect teacher's traces: the carry left out on {pre.get('teacher_carry_drop', 0.0):.0%} of carry "
            f"traces, for a fixed {models['pretrain_steps_run']} steps — a built-in, systematic error that gives the base "
            "moderate accuracy, RL room that more pretraining should not fill (the `continued` control), and a fork "
            "whose branches differ in correctness"]}))
    dv = ev["derived"]
    gains = ", ".join(f"{a} {nmean(dv[f'{a}_gain_tps1']):+.3f}" for a in models["arms"])
    tgains = ", ".join(f"{a} {nmean(ev['trace_acc'][a]['tps1']) - nmean(ev['trace_acc']['base']['tps1']):+.3f}"
                       for a in models["arms"])
    bound = cfg.claims.get("coverage_unsaturated", {}).get("below", float("nan"))
    ans_ar, ans_arb = (nmean(ev['passk'][smp]['answer'][f'pass{kc}']) for smp in ("ar", "arbitrary"))
    ans1_ar, ans1_arb = (nmean(ev['passk'][smp]['answer']['pass1']) for smp in ("ar", "arbitrary"))
    saturated = max(ans_ar, ans_arb) >= bound
    answer_note = (f"At answer level (the paper's metric) pass@1 is {ans1_ar:.3f} (AR order) vs {ans1_arb:.3f} "
                   f"(arbitrary order) and pass@{kc} {ans_ar:.3f} vs {ans_arb:.3f}"
                   + (f"; at k = {kc} it is at or above the saturation bound of the coverage control ({bound}), so no "
                      "claim reads it."
                      if saturated else f", below the coverage control's saturation bound ({bound})."))
    rep.section("Discussion", f"""
Measured here (means over seeds): trace-level pass@{kc} {nmean(ev['passk']['ar']['trace'][f'pass{kc}']):.3f} (AR order)
vs {nmean(ev['passk']['arbitrary']['trace'][f'pass{kc}']):.3f} (arbitrary order); trace-level pass@1
{nmean(ev['passk']['ar']['trace']['pass1']):.3f} vs {nmean(ev['passk']['arbitrary']['trace']['pass1']):.3f}. Under arbitrary
order the fork token is decoded {nmean(ev['fork']['arbitrary']['fork_decode_step']):.2f} of the way through decoding (0 =
first, 1 = last); a fork prompt's samples take both branches on {nmean(ev['fork']['ar']['both_orders']):.2f} of fork
prompts under AR order vs {nmean(ev['fork']['arbitrary']['both_orders']):.2f} under arbitrary order, and both branches
in valid traces on {nmean(ev['fork']['ar']['both_orders_valid']):.2f} vs {nmean(ev['fork']['arbitrary']['both_orders_valid']):.2f}.
{answer_note} RL gain in greedy
answer accuracy at 1 token/step over the base ({nmean(ev['acc']['base']['tps1']):.3f}): {gains}; in trace-level accuracy
(base {nmean(ev['trace_acc']['base']['tps1']):.3f}): {tgains}. With fully arbitrary-order greedy decoding the base
scores {nmean(ev['acc']['base']['full_arbitrary']):.3f}, JustGRPO {nmean(ev['acc']['justgrpo']['full_arbitrary']):.3f} and
the baseline {nmean(ev['acc']['arbitrary']['full_arbitrary']) if 'arbitrary' in ev['acc'] else float('nan'):.3f}: the
findings are read with the semi-AR decoder (the paper's evaluation), and how much of a gain is the decoder's is
visible in that column. The reward reads only the answer, so RL is free to trade valid steps for right answers; the
trace-level columns and the dev curves show whether it did.

The paper runs JustGRPO on LLaDA-8B-Instruct (GSM8K 89.1%, MATH-500 45.1 at generation length 256) and shows the
flexibility trap with pass@k up to large k on real reasoning benchmarks. This miniature keeps the mechanism — a
masked-diffusion LM whose arbitrary-order sampler can postpone fork tokens, RL through the exact AR likelihood vs a
one-step masked surrogate — on a task where a guess is right about 1% of the time and every step of a trace can be
checked. It does not reproduce the scale, natural-language traces, the long generations (where a one-step
surrogate is much further from the true likelihood) or the paper's benchmarks. Verdicts are about this miniature
only; a claim that fails here is reported as failing, not tuned.
""")
    rep.section("Threats to validity", f"""
Red-team review of this design (a reviewer who did not write it; its own validator agreed with `trace_valid` on
≈ 32,600 real generations). What it found and what was done:

- **Two kinds of fork.** The ones column's writing order is a fork whose branches are both valid traces: covering
  both cannot raise trace-level correctness. `fork_branches_ar_wider` (valid samples taking both branches) and the
  `fork_*` checks read that fork. The carry is a fork whose branches differ in correctness: the imperfect teacher
  leaves it out on {pre.get('teacher_carry_drop', 0.0):.0%} of carry traces, so the base samples `+1` or not and
  only `+1` is right. `ar_coverage_at_k` (trace-level pass@k over all pass@k prompts, as registered) is decided on
  carry prompts (the carry / no-carry pass@k table). The second red team's check on the 185 carry test prompts of
  this recipe's constant-lr base (16 samples each, two sampling seeds; not re-run on the committed base): the share of samples that write
  the carry barely differs (AR 0.285, low-confidence 0.245), but low-confidence order makes each prompt's carry
  decision nearly fixed (all 16 samples agree on 0.83 of prompts vs 0.16 under AR; answer pass@16 0.25 vs 0.81);
  random order, which also decides the carry late, loses no coverage (all agree on 0.00, pass@16 0.92), and a
  max-probability order sits between (0.55, 0.45). So the collapse comes from confidence-ordered decoding — the
  paper's mechanism — not from deciding late. That fork is
  built into the teacher (a deviation: the paper's forks come from natural reasoning); earlier versions of this
  miniature had no fork where one branch fails, and `ar_coverage_at_k` failed there (0.945 vs 0.975 at k = 16).
- **Fork entropy is low by construction under arbitrary order** (the fork token is determined once the column's other
  operand is decoded; AR's entropy is a deterministic function of the prompts): it is a check, not a finding — and
  on the batch-64 base of the sensitivity study it failed (gap 0.048 against 0.05), so "by construction" is about
  its direction, not its size.
- **Decoder dependence.** The RL findings use semi-AR blocks of {models['eval_block']} (as the paper's evaluation);
  with fully arbitrary-order greedy decoding the base is already much stronger and the RL gains shrink (Results
  table, *full arbitrary* columns). The baseline now rolls out with semi-AR blocks too (Deviations).
- **Control strength (second red team).** The `continued` control runs at the RL arms' lr {rl['lr']}, unswept. The
  reviewer re-ran it (60 steps, batch 64, from this recipe's earlier constant-lr base) at lr 3e-3 (the pretraining
  lr: 0.900 / 0.698 / 0.612 over 3 seeds) and 1e-3 (0.808 / 0.842 / 0.738) against JustGRPO's 0.974–0.982 there: the
  finding survived every rate, with a worst-case gap near 0.08. The control imitates a teacher whose majority answer
  on carry prompts is wrong, so its greedy output is not expected to learn the carry: `justgrpo_beats_continued`
  says RL's gain is not "more training", not that JustGRPO beats other ways of using the base's own correct samples
  (a reward-filtered fine-tuning control is not built). On that earlier base the control's carry-prompt accuracy
  swung between 0.09 and 0.84 within 60–300 steps: the constant-lr base sat at a low point of an oscillation, which
  is why pretraining now ends with a linear lr decay to 0 over its last {pre.get('lr_decay_frac', 0):.0%} of steps
  (LLaDA's warmup-stable-decay, without the warmup). A first variant decayed over all 3,000 steps: its base was
  less trained (T = 1 trace-level pass@1 0.12, greedy 0.628) and neither RL arm raised it in 60 steps (JustGRPO
  0.619, the baseline 0.539, traces collapsing to 0.05–0.12; `reports/studies/justgrpo_base_sensitivity.md`): the RL
  verdicts need a base whose samples are often valid.
- **What RL does off the planted error.** On the evaluated prompts without a carry JustGRPO's greedy trace-level
  accuracy is {nc_trace['justgrpo']:.3f} against the base's {nc_trace['base']:.3f} (on carry prompts
  {c_trace['justgrpo']:.3f} against {c_trace['base']:.3f}): the answer-only reward lets RL trade valid steps for right
  answers wherever nothing rewards the steps, so the trace-level check is read per stratum (carry / no-carry table).
- **Baseline strength.** Both arms run lr {rl['lr']}, from one sweep of lr ∈ {{1e-4, 3e-4, 1e-3}} for both arms on
  earlier bases (2 RL seeds disjoint from the run's, dev slice, `reports/studies/justgrpo_lr_sweep.md`; 3e-4 best
  or tied for both); the sweep was not repeated on this base. The step count is JustGRPO's, from its probe curve on
  an earlier base. No d1 prompt masking or inner updates.
- **One base model.** Pretraining is most of the CPU budget, so one base (seed {pre['seed']}) serves every seed; the
  seeds vary RL and evaluation sampling, not the pretrained weights. Every verdict is about this checkpoint, and
  the checkpoint moves with float-level changes: two other bases from the same recipe (attention through the math
  SDPA path; batch 64) stopped at dev readings 0.45 / 0.37, and `justgrpo_improves_base`, `gain_survives_parallel`,
  the coverage finding and the trace-level comparisons changed verdict on at least one of them
  (`reports/studies/justgrpo_base_sensitivity.md`, on the earlier teacher-free recipe; not re-measured for this
  one). With the base as the unit of replication (those three bases, the second reviewer's computation)
  `justgrpo_improves_base` had t-bounds [−0.023, +0.132]: inconclusive. So the RL findings are stated for this
  checkpoint; a design with one pretraining per seed does not fit the CPU budget.
- **Seeds.** {len(seeds)} RL seeds (the default ran 3 until repeated rows were computed once, below); each
  finding's smallest detectable gap is in its row. The switch to 5 seeds (issue 46 asks for ≥ 5 where the budget
  allows) was made after the 5-seed configuration had been run on this code, its verdicts seen. The 3-seed runs read
  the JustGRPO-vs-baseline answer gap as 0.027, t-bounds [0.004, 0.051] (before the change below) and 0.028
  [0.003, 0.053] (after): inconclusive both times.
- **Float rounding moves RL runs.** The samplers and the likelihoods now compute each distinct row of a batch once
  (a prompt's samples share the prompt and most of their prefix: with 16 samples per prompt 60% of AR-order and
  90% of arbitrary-order sampler rows repeat, 54–65% in a GRPO group of 8; tested equal to the plain batch in
  tokens, log-probs and gradients to float tolerance). Pass@k samples came out the same. Of the 3-seed run's RL
  models, JustGRPO's seed 1 moved by one test prompt in answer accuracy (0.982 → 0.980; two trace items flipped,
  net 0); the baseline's seed 2, whose one-step surrogate now sums its gradient over a group's copies in another
  order, moved more (answer accuracy 0.946 → 0.942 with 22 items differing, greedy trace accuracy 0.692 → 0.748),
  and `justgrpo_beats_arbitrary_trace` went from inconclusive (upper t-bound 0.033) to fails (0.017, against the
  0.02 min effect). At 5 seeds it reads inconclusive with its upper bound 0.001 above the min effect, its mean gap
  negative (JustGRPO's trace accuracy below the baseline's on most seeds, the win share in its row): the point
  estimate favours the baseline at trace level, and the word sits on the edge of what these seeds resolve.
- **KL panel.** KL to the base is estimated on AR-order samples (JustGRPO's rollout law) for both arms; for the
  baseline it is not the KL of its own rollout distribution.
- **The base (imperfect teacher, fixed steps).** The first stop rule read one T = 1 sample's trace-level pass@1
  (target 0.3) and stopped where greedy accuracy was already 0.954: `justgrpo_improves_base` had no room. Its
  replacement stopped at the first dev greedy reading ≥ 0.75 and landed mid-jump (0.67 → 0.90 between two checks);
  the red team continued that base's own pretraining for 60 steps and matched JustGRPO's gain (+0.078 vs +0.079):
  any further training raised it. Now the base imitates an imperfect teacher (carry left out on
  {pre.get('teacher_carry_drop', 0.0):.0%} of carry traces) for a fixed {models['pretrain_steps_run']} steps
  (`target_greedy_acc` null), and the `continued` control (the same number of further steps of that training, per
  seed) is in every run: `justgrpo_beats_continued` reads JustGRPO against it. With a constant lr the dev greedy
  reading swung between checks (the greedy carry decision sits near the teacher's split); with the lr decayed over
  the last {pre.get('lr_decay_frac', 0):.0%} of steps it settles (pretraining figure), and the control's accuracy is
  {nmean(ev['acc']['continued']['tps1']) if 'continued' in ev['acc'] else float('nan'):.3f} against the base's
  {nmean(ev['acc']['base']['tps1']):.3f}. Test greedy answer accuracy of the base {nmean(ev['acc']['base']['tps1']):.3f};
  T = 1 trace-level pass@1 {nmean(ev['passk']['ar']['trace']['pass1']):.3f} (AR order; `base_trace_*` checks);
  trace pass@{kc} reaches {max(nmean(ev['passk'][s]['trace'][f'pass{kc}']) for s in ('ar', 'arbitrary')):.3f} (`coverage_unsaturated`).
  The teacher's rate and the step count were set in the design, before any RL result; the lr schedule was chosen
  among three recipes by the design checks (`base_*`) and the red team's oscillation critique, with every recipe's
  RL verdicts in `reports/studies/justgrpo_base_sensitivity.md` (the JustGRPO-vs-baseline findings are inconclusive
  under all three).
- **Evaluation slices (second review).** The splits used to be stored sorted, so every slice — `test[:n]` for the
  verdicts, the dev slices of the stop rule and the RL curves — held the prompts with the smallest first operands.
  The reviewer's re-evaluation of the previous checkpoints on a random slice moved `ar_coverage_at_k` from fails
  (−0.028) to inconclusive (+0.015) and flipped the sign of `justgrpo_improves_base_trace`'s gap. Each split is now
  stored in a seeded random order (this run and the two 5-seed studies, run after the fix).
- **Budget.** RL runs {rl['steps']} steps. The 200-step, 5-seed study of this pipeline
  ([`reports/studies/justgrpo_rl200_5seeds/report.md`](../studies/justgrpo_rl200_5seeds/report.md)) re-derives that
  on this base: both arms' dev answer accuracy is on its plateau by step 30 (JustGRPO 0.97 from step 10), and
  trace-level accuracy falls the longer RL runs (JustGRPO 0.82 at step 10, 0.38 at step 200; one seed's greedy test
  traces 0.006), so more steps would not move the answer-level findings and cost trace validity. There
  `justgrpo_beats_arbitrary_grpo` is still inconclusive (gap 0.043, lower t-bound 0.0045 against the 0.02 min
  effect, wins 4/5).
- **Item noise.** Verdicts pair arms per test prompt ({ev['eval_prompts']} for greedy accuracy, {ev['passk_prompts']}
  for pass@k), with the same prompts for every seed (item variance added, not divided by seeds).
- **Min effects and bounds** (params `papers.justgrpo.report.claims`) are fixed before the run, not from results.
- **Mechanism, not scale.** A {models['gen_len']}-token generation: the one-step surrogate is much closer to the true
  likelihood here than at generation length 256, which weakens the baseline's handicap relative to the paper.
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
    rep.finish(REAL_CLAIMS, ev)
