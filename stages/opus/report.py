"""report@opus: loss curves per arm, selection mix, static filters on the whole pool, overhead in FLOPs
and time per cost variant against the target-loss gain, the redundancy term, verdicts.

    python -m stages report opus             # writes reports/opus/{report.md, metrics.json, figures/, plots/}
"""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import polars as pl

from stages.common.claims import Better, Bound, Claim, Within, evaluate_claims
from stages.common.config import Seed, ReportConfig
from stages.common.paths import read_json
from stages.common.reporting import Report
from stages.opus.corpus import KINDS

PAPER_OVERHEAD = 0.047  # the paper's reported compute overhead of OPUS scoring
# official defaults (gszfwsb/OPUS train.py): buffer 96 sequences of 2048 tokens, ρ = 0.5, 512-token
# score window, 16 proxy windows: scored tokens per trained token (next-token positions)
OFFICIAL_RATIO = (96 * 511 + 16 * 511) / (48 * 2047)

CLAIMS = [
    Better("opus_adamw_beats_random",
           "Population: the main pool (15% target text). OPUS (AdamW-preconditioned, Boltzmann on standardized "
           "utility) reaches lower target-domain validation loss than random selection at equal update tokens",
           a="arms.opus_adamw.val_loss", b="arms.random.val_loss", higher_is_better=False,
           refuted_by="random selection reaching an equal or lower final target loss on most seeds", kind="finding"),
    Better("sgd_opus_beats_sgd_random",
           "Population: the main pool, an SGD-trained model. OPUS with the SGD preconditioner (P = I, η = lr) "
           "beats random selection under the same SGD training",
           a="arms.sgd_opus.val_loss", b="arms.sgd_random.val_loss", higher_is_better=False,
           refuted_by="sgd_random reaching an equal or lower final target loss on most seeds", kind="finding"),
    Better("boltzmann_beats_greedy",
           "Population: the main pool (5% near-duplicates of 4 documents). Boltzmann sampling beats greedy "
           "top-utility selection",
           a="arms.opus_adamw.val_loss", b="arms.greedy_opus.val_loss", higher_is_better=False,
           refuted_by="greedy reaching an equal or lower final target loss on most seeds", kind="finding"),
    Better("boltzmann_beats_greedy_redundant",
           "Population: the redundant pool (30% near-duplicates of 2 documents). Boltzmann sampling beats greedy "
           "selection where redundancy exists (the diversity hypothesis)",
           a="arms.redundant_boltzmann.val_loss", b="arms.redundant_greedy.val_loss", higher_is_better=False,
           refuted_by="greedy reaching an equal or lower final target loss on most seeds of the redundant pool", kind="finding"),
    Bound("official_sampler_near_uniform",
          "The official sampler p ∝ exp(U/τ) on the raw utility (τ = 0.9) is near-uniform here: the spread "
          "(sd over candidates) of its logits U/τ stays below the bound at every diagnostic step from step 0 "
          "(per seed, the maximum over steps)",
          value="arms.official_raw_tau.raw_logit_sd_max",
          refuted_by="raw logits with sd at or above the bound at some step (then raw-score sampling discriminates)",
          kind="check"),
    Within("random_streams_agree",
           "Control: random selection on a second RNG stream (same init, same candidate stream) ends within the "
           "findings' min effect of random selection: the selection draw alone does not move the final loss",
           a="arms.random_stream2.val_loss", b="arms.random.val_loss",
           refuted_by="a stream-to-stream gap at or beyond the bound (the findings' min effect would be noise)",
           kind="check"),
    Within("official_sampler_like_random",
           "The official raw-τ sampler trains like random selection: final target loss within the band of random",
           a="arms.official_raw_tau.val_loss", b="arms.random.val_loss",
           refuted_by="a gap at or beyond the band to random on most seeds", kind="check"),
    Better("official_sampler_beats_random",
           "The official raw-τ sampler beats random selection by more than the findings' min effect (raw "
           "utilities still carry signal when near-uniform)",
           a="arms.official_raw_tau.val_loss", b="arms.random.val_loss", higher_is_better=False,
           refuted_by="a gain at or below the min effect", kind="check"),
    Bound("static_filter_flags_toxic_in_pool",
          "Population: all candidates (a random sample of the training pool, every kind at its pool share). "
          "The static OPUS utility (low U flagged) ranks toxic documents above the rest: AUROC > 0.5",
          value="static_filter.pool.opus",
          refuted_by="AUROC <= 0.5 on the pool sample: the filter would remove other documents before toxic ones", kind="finding"),
    Bound("static_filter_flags_toxic_among_target",
          "Population: clean target-domain vs toxic documents only. The static OPUS utility flags toxic ones: "
          "AUROC > 0.7",
          value="static_filter.target_only.opus",
          refuted_by="AUROC <= 0.7 among target-domain documents", kind="finding"),
    Claim("overhead_tracks_token_ratio",
          "Scoring FLOPs per trained step are set by the scored-to-trained token ratio: for every cost variant, "
          "(scoring FLOPs / training-step FLOPs) / (scored tokens / trained tokens) lies in [0.5, 2]",
          "overhead.flop_per_token_min >= param.k0_5 and overhead.flop_per_token_max <= param.k2",
          refuted_by="a variant whose FLOP overhead departs more than 2x from its token ratio", kind="check"),
    Better("cheap_variant_keeps_half_the_gain",
           "The all-knobs variant opus_cheap (window 16 of 32 tokens, scoring every 4 steps, combined capture, "
           "on-device selection) keeps more than half of full OPUS's target-loss gain over random",
           a="gain.opus_cheap", b="gain_half.opus_adamw", higher_is_better=True,
           refuted_by="opus_cheap's gain over random at or below half of opus_adamw's on most seeds", kind="finding"),
    Claim("overhead_small",
          "The paper's overhead: scoring costs a small fraction of a training step, checked in counted FLOPs "
          "for the all-knobs variant opus_cheap as <= 10% (paper: 4.7%)",
          "overhead.flops.cheap <= param.k0_1",
          refuted_by="a FLOP overhead above 0.10 for opus_cheap", kind="finding"),
]


class Config(ReportConfig):
    seed: Seed = 0


def _arm_stats(runs: list[dict], seeds: list[int]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for arm in dict.fromkeys(r["arm"] for r in runs):
        by_seed = {r["seed"]: r for r in runs if r["arm"] == arm}
        rs = [by_seed[s] for s in seeds if s in by_seed]
        finals = [r["final_val_loss"] for r in rs]
        counts = np.sum([r["selected_kind_counts"] for r in rs], axis=0).astype(float)
        frac = counts / counts.sum()
        diag = [d for r in rs for d in r["diagnostics"]]
        entry = {"val_loss": finals, "val_loss_mean": float(np.mean(finals)),
                 **{f"{k}_frac": float(f) for k, f in zip(KINDS, frac)},
                 "update_tokens": rs[0]["update_tokens"], "steps": rs[0]["steps"],
                 "time_overhead_in_training": float(sum(r["score_s_total"] for r in rs)
                                                    / max(sum(r["update_s_total"] for r in rs), 1e-12))}
        if diag:
            entry["raw_logit_sd"] = [float(np.median([d["raw_logit_sd"] for d in r["diagnostics"]])) for r in rs]
            entry["raw_logit_sd_max"] = [float(max(d["raw_logit_sd"] for d in r["diagnostics"])) for r in rs]
            entry["raw_logit_sd_step0"] = [float(next((d["raw_logit_sd"] for d in r["diagnostics"]
                                                       if d["step"] == 0), float("nan"))) for r in rs]
            entry["redundancy_over_alignment"] = float(np.mean([d["redundancy_over_alignment"] for d in diag]))
            entry["greedy_picks_changed"] = float(np.mean([d["greedy_picks_changed"] for d in diag]))
        out[arm] = entry
    return out


def _raw_tau_reading(arms: dict, say) -> str:
    """What the raw-τ numbers say, from the measured spread and the stream control (no fixed wording)."""
    sd_max = max(arms["official_raw_tau"]["raw_logit_sd_max"])
    tilt = math.exp(6 * sd_max)  # ratio of selection weights between candidates ±3 sd apart
    stream = [a - b for a, b in zip(arms["random_stream2"]["val_loss"], arms["random"]["val_loss"])]
    gain = [b - a for a, b in zip(arms["official_raw_tau"]["val_loss"], arms["random"]["val_loss"])]
    text = (f"With logit sd at most {sd_max:.2g} at any step, selection weights of candidates 3 sd apart differ by a "
            f"factor {tilt:.4f} (a tilt of {100 * (tilt - 1):.1f}%). ")
    if say("random_streams_agree") != "holds" and max(abs(x) for x in stream) >= float(np.mean(gain)) / 2:
        text += (f"Another random draw alone moves the final loss by up to {max(abs(x) for x in stream):.3f} "
                 f"(stream control not within the findings' min effect), the same order as raw-τ's gain "
                 f"{float(np.mean(gain)):.3f}: raw-τ differs from random only in which draws it makes, so its gain "
                 "is within draw-to-draw noise at 3 seeds and is not evidence that raw utilities carry signal; "
                 "more seeds (or several draws per seed) would separate the two.")
    else:
        text += ("The stream control bounds the draw-to-draw noise below raw-τ's gain, so the gain is not a "
                 "draw artefact.")
    return text


def _mean_abs(x) -> float:
    return float(np.mean(np.abs(np.asarray(x, float))))


def _se(x) -> float:
    x = np.asarray(x, float)
    return float(x.std(ddof=1) / math.sqrt(len(x))) if len(x) > 1 else float("nan")


def run(cfg: Config, ctx) -> None:
    prep, train, ev = ctx.input("prepare"), ctx.input("train"), ctx.input("evaluate")
    corpus = read_json(prep / "corpus.json")
    tr = read_json(train / "runs.json")
    e = read_json(ev / "evaluate.json")
    runs = tr["runs"]
    seeds = sorted({r["seed"] for r in runs})
    arms = _arm_stats(runs, seeds)
    k, n = tr["k"], tr["buffer_size"]

    def gain(arm: str, base: str) -> list[float]:
        return [b - a for a, b in zip(arms[arm]["val_loss"], arms[base]["val_loss"])]

    base_of = {a: ("sgd_random" if a.startswith("sgd_") else "redundant_random" if a.startswith("redundant_")
                   else "random") for a in arms}
    gains = {a: gain(a, b) for a, b in base_of.items() if a != b}
    static = e["static"]
    static_metrics = {pop: {m: [s[pop][m] for s in static] for m in ("opus", "loss", "trigger")}
                      for pop in ("pool", "target_only")}
    variants = e["variants"]
    per_token = [v["flop_overhead"] / v["scored_per_trained_token"] for v in variants]
    c_flop = float(np.mean(per_token))
    metrics = {
        "arms": arms,
        "gain": gains,
        "gain_half": {a: [0.5 * g for g in v] for a, v in gains.items()},
        "static_filter": static_metrics,
        "overhead": {"flops": {v["variant"]: v["flop_overhead"] for v in variants},
                     "token_ratio": {v["variant"]: v["scored_per_trained_token"] for v in variants},
                     "flop_per_token_min": float(min(per_token)), "flop_per_token_max": float(max(per_token)),
                     "flop_per_token_mean": c_flop, "official_token_ratio": OFFICIAL_RATIO,
                     "official_predicted_flops": c_flop * OFFICIAL_RATIO, "paper": PAPER_OVERHEAD},
        "timing": {"note": "wall-clock runtime fields (not used by any claim)",
                   "variants": {v["variant"]: v["time_overhead"] for v in variants},
                   "in_training": {a: s["time_overhead_in_training"] for a, s in arms.items()}},
        "sketch_fidelity": min(e["fidelity"], key=lambda r: abs(r["m"] - tr["sketch_size"])),
        "corpus": {"target_entropy_rate": corpus["target_entropy_rate"], "uniform_entropy": corpus["uniform_entropy"]},
        "seeds": seeds,
        "device": {"train": tr.get("device"), "evaluate": e.get("device")},
    }

    rep = Report(ctx, "OPUS: Optimizer-induced Projected Utility Selection (miniature)",
                 "Selecting each step's training batch by the OPUS utility — the alignment of a candidate's "
                 "optimizer-preconditioned update (CountSketch-projected, ghost-computed) with a proxy "
                 "gradient, minus a redundancy penalty, sampled by Boltzmann — trains a language model to a "
                 "better target-domain loss than random selection at equal tokens, with ~4.7% compute overhead; "
                 "the same utility works as a static data filter.")
    c, cr = corpus["counts"], corpus["counts_redundant"]
    any_arm = next(iter(arms.values()))
    rep.section("Setup", f"""
Synthetic corpus (prepare, HF `datasets`): main pool of {sum(c.values())} documents of {corpus['seq_len']} tokens
over {corpus['vocab_size']} tokens — target chain A {c['target']}, chain B {c['other']}, near-uniform noise
{c['noise']}, near-duplicates of {corpus['dup_sources']} A documents {c['dup']}, toxic (A + trigger n-gram
{corpus['trigger']}) {c['toxic']}. A second **redundant pool** has {cr['dup']} near-duplicates of
{corpus['redundant_dup_sources']} A documents (noise {cr['noise']}) for the diversity test. Proxy and validation:
held-out A (entropy rate of A {corpus['target_entropy_rate']:.3f} nats/token = the loss floor; uniform
{corpus['uniform_entropy']:.3f}).

Model: the shared TinyTransformer, trained by Lightning (`make_trainer`) on `{tr.get('device')}`. Each step
every arm sees a buffer of N = {n} candidates from a per-seed stream (identical across arms) and trains on
K = {k} (ρ = {k / n:.2f}): {any_arm['update_tokens']} update tokens over {any_arm['steps']} steps, seeds {seeds}.
OPUS: hooks on every `nn.Linear` capture inputs a and output gradients b (one forward/backward of the candidates
and of a {tr['proxy_batch']}-sequence proxy batch); φ_r(z) = Π_r(P_r Σ_t b_t a_tᵀ) through
`kernels/ghost_countsketch.py` (m = {tr['sketch_size']} per layer); ψ_r = Π_r(mean proxy gradient);
U_z = η⟨φ,ψ⟩ − η²⟨φ,Φ⟩ with η = η_opt/K; K rounds of Boltzmann sampling on **standardized** U (τ = {tr['tau']}).
**The claims use the standardized sampler** (`opus_adamw`); `official_raw_tau` is the official sampler on raw U.

Arms (AdamW-trained unless named sgd_): `random`; `high_loss` (top-K loss); `greedy_opus` (argmax);
`raw_grad_opus` (P = I, η = lr on the AdamW-trained model: raw-gradient scoring, formerly `opus_sgd`);
`opus_adamw` (P = C_t·diag(1/(√v̂+ε)) from the live AdamW state); `opus_no_redundancy`; `official_raw_tau`;
`sgd_random` / `sgd_opus` (an SGD-trained model, lr {tr.get('sgd_lr')}, with the SGD preconditioner P = I);
cost variants `opus_window` (a random 16-token window of each 32-token sequence scored, like the official
512 of 2048), `opus_every4` (one scoring of 4 buffers per 4 steps, state up to 3 steps stale), `opus_cheap`
(window + every 4 + one combined capture + on-device selection); `redundant_random` / `redundant_greedy` /
`redundant_boltzmann` on the redundant pool.
""")

    rows = []
    for a, s in arms.items():
        g = gains.get(a)
        rows.append({"arm": a, "final target val loss (mean)": s["val_loss_mean"],
                     "per seed": " / ".join(f"{v:.3f}" for v in s["val_loss"]),
                     "gain vs its random": f"{np.mean(g):+.3f} ± {_se(g):.3f}" if g else "—",
                     "target": s["target_frac"], "other": s["other_frac"], "noise": s["noise_frac"],
                     "dup": s["dup_frac"], "toxic": s["toxic_frac"]})
    rep.table("Results per arm", pl.DataFrame(rows),
              note="Gain = loss of the arm's random baseline (random / sgd_random / redundant_random) minus the "
                   "arm's, mean ± s.e. over seeds. Kind columns: fraction of all selected sequences (main pool: "
                   "target 0.15, other 0.40, noise 0.35, dup 0.05, toxic 0.05; redundant pool: dup 0.30, "
                   "noise 0.10).")

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    curve_rows = []
    for ax, group in zip(axes, (["random", "high_loss", "greedy_opus", "raw_grad_opus", "opus_adamw",
                                 "official_raw_tau", "sgd_random", "sgd_opus"],
                                ["opus_adamw", "opus_window", "opus_every4", "opus_cheap", "redundant_random",
                                 "redundant_greedy", "redundant_boltzmann"])):
        for a in group:
            rs = [r for r in runs if r["arm"] == a]
            if not rs:
                continue
            steps = np.array([s for s, _ in rs[0]["val_curve"]])
            vals = np.array([[v for _, v in r["val_curve"]] for r in rs])
            mu, sd = vals.mean(0), vals.std(0)
            ax.plot(steps, mu, label=a)
            ax.fill_between(steps, mu - sd, mu + sd, alpha=0.15)
            if ax is axes[0]:
                curve_rows += [{"step": int(s), "arm": a, "val_loss": float(v)} for s, v in zip(steps, mu)]
        ax.axhline(corpus["target_entropy_rate"], color="k", ls=":", lw=1, label="entropy rate of A")
        ax.set_xlabel("training step (K sequences each)")
        ax.set_ylabel("target validation loss (nats/token)")
        ax.legend(fontsize=7)
    axes[0].set_title("selectors and optimizers")
    axes[1].set_title("cost variants; redundant pool")
    rep.figure("val_loss_curves", fig, f"Target-domain validation loss per arm at equal update tokens "
                                      f"(mean ± std over {len(seeds)} seeds).")
    wide = pl.DataFrame(curve_rows).pivot(on="arm", index="step", values="val_loss")
    rep.plot("val_loss_curves", wide, x="step", y=[c for c in wide.columns if c != "step"],
             title="target validation loss (mean over seeds)")

    srows = []
    for pop, label in (("pool", f"all candidates (pool sample, {e['filter_docs']} docs)"),
                       ("target_only", "clean target vs toxic (static set)")):
        for m, what in (("opus", "OPUS utility (low U flagged)"), ("loss", "per-document loss (high flagged)"),
                        ("trigger", "trigger n-gram count (oracle)")):
            vals = static_metrics[pop][m]
            srows.append({"population": label, "filter": what, "AUROC mean": float(np.mean(vals)),
                          "per seed": " / ".join(f"{v:.3f}" for v in vals)})
    rep.table("Static filter: flagging toxic documents", pl.DataFrame(srows),
              note=f"Final `{e['static_arm']}` model and its live AdamW state score each document once with "
                   "η⟨φ(z),ψ⟩ against the full proxy set. The directions were fixed before looking (low utility, "
                   "high loss, many triggers); an AUROC below 0.5 means the rule removes other documents first "
                   "(1 − AUROC is what the reversed rule, chosen after seeing the labels, would get).")

    vrows = []
    full_gain = np.mean(gains.get("opus_adamw", [float("nan")]))
    for v in variants:
        g = gains.get(v["arm"], [float("nan")])
        vrows.append({"variant": v["variant"], "trained arm": v["arm"],
                      "scored/trained tokens": v["scored_per_trained_token"],
                      "FLOP overhead": v["flop_overhead"],
                      "FLOP overhead / token ratio": v["flop_overhead"] / v["scored_per_trained_token"],
                      "time overhead (runtime)": v["time_overhead"],
                      "gain vs random": float(np.mean(g)), "kept of full gain": float(np.mean(g) / full_gain)})
    keep = [r for r in vrows if r["kept of full gain"] > 0.5]
    cheapest = min(keep, key=lambda r: r["FLOP overhead"]) if keep else None
    rep.table("Overhead per cost variant (FLOPs counted, time measured) against the target-loss gain",
              pl.DataFrame(vrows),
              note="FLOP overhead = matmul FLOPs of scoring+selection for one trained step (FlopCounterMode, "
                   "amortised over 4 steps for every4/cheap) / FLOPs of one AdamW training step on K; tokens count "
                   "next-token positions of candidates + proxy against those trained. `combined` and "
                   "`vectorized` change no selection math: their gain is opus_adamw's. Time overhead is "
                   "wall-clock on a shared CPU (a runtime field, not claimed). Cheapest variant keeping more than "
                   f"half of the gain: **{cheapest['variant'] if cheapest else 'none'}**"
                   + (f" (FLOP overhead {cheapest['FLOP overhead']:.2f}, kept {cheapest['kept of full gain']:.2f})."
                      if cheapest else "."))

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for r in vrows:
        axes[0].scatter(r["FLOP overhead"], r["gain vs random"])
        axes[0].annotate(r["variant"], (r["FLOP overhead"], r["gain vs random"]), fontsize=8)
    axes[0].axvline(PAPER_OVERHEAD, color="r", ls="--", label="paper: 4.7%")
    axes[0].set_xlabel("scoring FLOPs / training-step FLOPs")
    axes[0].set_ylabel("target-loss gain over random (nats)")
    axes[0].legend()
    vn, vm = e["overhead_vs_n"], e["overhead_vs_m"]
    axes[1].plot([r["N"] for r in vn], [r["flop_overhead"] for r in vn], "o-", label="FLOPs vs N (m fixed)")
    axes[1].plot([r["N"] for r in vn], [r["time_overhead"] for r in vn], "s--", label="time vs N (runtime)")
    axes[1].set_xscale("log", base=2)
    axes[1].set_xlabel("buffer size N (K = N/2)")
    axes[1].set_ylabel("overhead (× training step)")
    axes[1].legend()
    rep.figure("overhead", fig, "Left: FLOP overhead of each cost variant against its measured gain over random. "
                                "Right: FLOP and time overhead against the buffer size N.")
    rep.plot("overhead_variants", pl.DataFrame([{"flop_overhead": r["FLOP overhead"], "gain": r["gain vs random"]}
                                                for r in vrows]), x="flop_overhead", y="gain",
             title="gain vs FLOP overhead", template="scatter")
    rep.plot("overhead_vs_n", pl.DataFrame([{"N": r["N"], "flop_overhead": r["flop_overhead"],
                                             "time_overhead": r["time_overhead"]} for r in vn]), x="N",
             y=["flop_overhead", "time_overhead"])
    rep.plot("overhead_vs_m", pl.DataFrame([{"m": r["m"], "flop_overhead": r["flop_overhead"],
                                             "time_overhead": r["time_overhead"]} for r in vm]), x="m",
             y=["flop_overhead", "time_overhead"])
    rep.table("Sketch fidelity (CountSketch vs ghost-exact inner products)", pl.DataFrame(e["fidelity"]),
              note="align_pearson: correlation over documents of ⟨Π(PG(z)), Π(ḡ)⟩ with the exact "
                   "⟨PG(z), ḡ⟩ (ghost identity Σ_t b_tᵀ(D⊙ḡ)a_t); gram_*: sketched vs ghost-exact "
                   "⟨G(z),G(z')⟩ over document pairs (P = I).")

    red_rows = [{"arm": a, "|redundancy| / |alignment| at pick": s["redundancy_over_alignment"],
                 f"greedy picks changed by the penalty (of K)": s["greedy_picks_changed"],
                 "raw logit sd U/τ": float(np.mean(s["raw_logit_sd"]))}
                for a, s in arms.items() if "redundancy_over_alignment" in s]
    rep.table("The redundancy term", pl.DataFrame(red_rows),
              note="Every `diag_every` steps (params): mean over picks of "
                   "|η²⟨φ(pick),Φ⟩| / |η⟨φ(pick),ψ⟩|, and how many of the K (4K for every4/cheap) greedy picks "
                   "differ with and without the penalty on the same scores.")

    raw_rows = [{"step": d["step"], "seed": f"seed {r['seed']}", "raw_logit_sd": d["raw_logit_sd"]}
                for r in runs if r["arm"] == "official_raw_tau" for d in r["diagnostics"]]
    if raw_rows:
        rep.plot("raw_logit_sd_by_step", pl.DataFrame(raw_rows), x="step", y="raw_logit_sd", series="seed",
                 title="official sampler: sd of raw logits U/τ over candidates, per diagnostic step")

    v = {x["name"]: x for x in evaluate_claims(CLAIMS, metrics, cfg.claims, "papers.opus.report")}

    def say(name):
        return v[name]["verdict"]

    def gap(arm: str, base: str) -> list[float]:      # per seed, > 0: the arm ends lower than the base
        return [b - a for a, b in zip(arms[arm]["val_loss"], arms[base]["val_loss"])]

    oa, ra = arms["opus_adamw"], arms["random"]
    pool_frac = {kind: c[kind] / sum(c.values()) for kind in KINDS}
    red = arms.get("opus_adamw", {})
    deviations = pl.DataFrame([
        {"what": "sampler", "paper / official code": "p ∝ exp(raw U / 0.9)",
         "here": "p ∝ exp(standardized U / 0.9) (official_raw_tau arm: raw)",
         "why": "raw U spread is tiny, so raw sampling ≈ uniform (measured below)"},
        {"what": "labels", "paper / official code": "labels shifted twice: position t scored against token t+2",
         "here": "next-token loss (t against t+1)", "why": "the official shift reads as an off-by-one; kept correct"},
        {"what": "per-layer weights", "paper / official code": "1/√(d_out·d_in) per layer", "here": "unweighted sum",
         "why": "the paper's Eq. has no weights"},
        {"what": "scoring schedule", "paper / official code": "512 of 2048 tokens, combined pass, once per 4 steps",
         "here": "full sequences by default; window / every-4 / combined as variants",
         "why": "measured as cost knobs against the gain"},
        {"what": "preconditioner", "paper / official code": "Muon in the default run; AdamW, SGD",
         "here": "AdamW and SGD", "why": "the shared optimizer set has no Muon"},
        {"what": "AdamW before step 1", "paper / official code": "v = 0", "here": "P = I with η = lr",
         "why": "v = 0 carries no information"},
        {"what": "scale", "paper / official code": "GPT-2 XL, FineWeb 30B tokens, GPUs",
         "here": "1-layer d=32 model, synthetic 12k-document pool, CPU",
         "why": "default profile ≤ 5 CPU minutes"},
    ])
    rep.table("Deviations", deviations)

    fid = metrics["sketch_fidelity"]
    rep.section("Discussion", f"""
- **OPUS vs random (main pool).** opus_adamw {oa['val_loss_mean']:.3f} vs random {ra['val_loss_mean']:.3f}
  ({say('opus_adamw_beats_random')}). OPUS picks target text at {oa['target_frac']:.2f} of its batches against the
  pool's {pool_frac['target']:.2f}; near-duplicates at {oa['dup_frac']:.2f} (pool {pool_frac['dup']:.2f}) and toxic
  documents at {oa['toxic_frac']:.2f} (pool {pool_frac['toxic']:.2f}): both are target-chain text. Raw-gradient
  scoring on the same AdamW model (raw_grad_opus) reaches {arms['raw_grad_opus']['val_loss_mean']:.3f}.
- **Real SGD arm.** sgd_opus {arms['sgd_opus']['val_loss_mean']:.3f} vs sgd_random
  {arms['sgd_random']['val_loss_mean']:.3f} ({say('sgd_opus_beats_sgd_random')}); no AdamW-vs-SGD gap is claimed
  (different optimizers reach different losses whatever the selection).
- **Boltzmann vs greedy.** Main pool: {say('boltzmann_beats_greedy')} (opus_adamw {oa['val_loss_mean']:.3f} vs
  greedy {arms['greedy_opus']['val_loss_mean']:.3f}). Redundant pool: {say('boltzmann_beats_greedy_redundant')}
  (Boltzmann {arms['redundant_boltzmann']['val_loss_mean']:.3f}, dup share {arms['redundant_boltzmann']['dup_frac']:.2f};
  greedy {arms['redundant_greedy']['val_loss_mean']:.3f}, dup share {arms['redundant_greedy']['dup_frac']:.2f};
  random {arms['redundant_random']['val_loss_mean']:.3f}). Diversity hypothesis: Boltzmann should help where the
  pool is redundant; the redundant pool's verdict above is the test. Both OPUS arms carry the redundancy penalty,
  so Boltzmann's extra diversity is only over candidates the penalty does not already separate.
- **The official sampler.** Raw logits U/τ have sd {np.mean(arms['official_raw_tau']['raw_logit_sd']):.2g} over
  candidates (median over diagnostic steps), {np.mean(arms['official_raw_tau']['raw_logit_sd_step0']):.2g} at step 0
  and at most {max(arms['official_raw_tau']['raw_logit_sd_max']):.2g} at any step
  (`official_sampler_near_uniform`: {say('official_sampler_near_uniform')}; per-step curve in the plot
  `raw_logit_sd_by_step`). Final target loss: official_raw_tau {arms['official_raw_tau']['val_loss_mean']:.3f},
  random {ra['val_loss_mean']:.3f}, random on a second RNG stream {arms['random_stream2']['val_loss_mean']:.3f}.
  The selection draw alone moves the loss by {_mean_abs(gap('random_stream2', 'random')):.3f} on average
  (`random_streams_agree`: {say('random_streams_agree')}); the raw-τ sampler's gain over random is
  {np.mean(gap('official_raw_tau', 'random')):.3f} (`official_sampler_beats_random`:
  {say('official_sampler_beats_random')}; `official_sampler_like_random`: {say('official_sampler_like_random')}).
  {_raw_tau_reading(arms, say)} The utility's scale is
  η = η_opt/K times an inner product of AdamW-sized steps; at GPT-2-XL scale the same units (lr ≈ 1e-3,
  per-sample steps) are as small. The findings use the standardized sampler.
- **Redundancy term.** In opus_adamw the penalty at pick time is {red.get('redundancy_over_alignment', float('nan')):.3g}
  of the alignment term and changes {red.get('greedy_picks_changed', float('nan')):.2f} of K = {k} greedy picks on
  average; opus_no_redundancy reaches {arms['opus_no_redundancy']['val_loss_mean']:.3f} (gain over random
  {np.mean(gains['opus_no_redundancy']):+.3f} vs opus_adamw's {np.mean(gains['opus_adamw']):+.3f}). The term scales with
  η² = (η_opt/K)² and with how parallel the already-picked updates are; it changes picks mostly among
  target-chain candidates (duplicates and target text have similar sketched updates).
- **Static filter, scoped.** On all candidates (pool sample) the OPUS utility's AUROC for toxic documents is
  {np.mean(static_metrics['pool']['opus']):.3f} ({say('static_filter_flags_toxic_in_pool')}): toxic documents are
  target-chain text and score *higher* than the off-domain majority, so a low-utility filter removes chain-B and
  noise documents first. Among target-domain documents only it is {np.mean(static_metrics['target_only']['opus']):.3f}
  ({say('static_filter_flags_toxic_among_target')}). The loss baseline gets {np.mean(static_metrics['pool']['loss']):.3f}
  on the pool; the trigger-count oracle {np.mean(static_metrics['pool']['trigger']):.3f}.
- **Overhead.** Scoring needs one forward + backward of every scored token and a per-sample outer product per
  layer: the counted FLOP overhead is {metrics['overhead']['flop_per_token_mean']:.2f} × the scored-to-trained
  token ratio on average over variants ({say('overhead_tracks_token_ratio')}); scoring 4 buffers at once
  makes the N×N Gram of the redundancy term 4× larger per step, which is why every4 saves no FLOPs here. Full scoring (ratio
  {vrows[0]['scored/trained tokens']:.2f}) costs {vrows[0]['FLOP overhead']:.2f}× a training step; the all-knobs
  variant opus_cheap ({vrows[-1]['scored/trained tokens']:.2f} tokens per trained token) {vrows[-1]['FLOP overhead']:.2f}×
  (overhead_small: {say('overhead_small')}), keeping {vrows[-1]['kept of full gain']:.2f} of the gain
  ({say('cheap_variant_keeps_half_the_gain')}). The official defaults score
  {OFFICIAL_RATIO:.2f} tokens per trained token, which by this constant predicts ≈ {metrics['overhead']['official_predicted_flops']:.2f}×
  a training step (the paper card's own FLOP count of those defaults: ~1.5×); the paper's 4.7% does not follow
  from them. Wall-clock ratios (runtime fields) follow the same order on this CPU but carry per-call costs.
- **Sketch.** At m = {fid['m']} the sketched alignment correlates {fid['align_pearson']:.3f} with the ghost-exact one.
- **What the miniature does not reproduce.** GPT-2-XL / FineWeb scale, Muon preconditioning, downstream
  benchmark averages, 8× data efficiency, the τ and sketch-size ablations at scale.
""")
    rep.section("Threats to validity", f"""
Red-team pass on this design (what could make a verdict wrong, and what remains):

- **Equal budgets, full-strength baseline.** Every arm trains the same steps on the same number of update tokens
  from the same per-seed init; random selection uses the same optimizer and learning rate as OPUS. The budget
  ({len(seeds)} seeds, a tiny LM) is what decides how large the OPUS gain can be; the validation-loss curves are
  recorded and plotted per arm.
- **Min effects** (params `papers.opus.report.claims`): 0.01 nats/token for the selection claims, fixed as the
  smallest gain that matters, not from results; `cheap_variant_keeps_half_the_gain` compares against half of
  the full gain per seed (the statement itself; min effect 0).
- **Checks, not findings:** the official raw-τ sampler's near-uniform logits (a property of the official code's
  scale here), how it compares with random (against the random-stream control), and FLOP overhead tracking the
  token ratio (accounting). They explain why the findings use the standardized sampler.
- **Planted structure.** Toxic documents, near-duplicates and the target chain are planted by `prepare`; the
  static-filter AUROCs are about those planted kinds, and the scoping (pool vs target-only) is fixed in the
  claim statements before the run.
- **The raw-τ sampler vs random (issue 54).** The per-step spread is logged from step 0 and the stream control
  (`random_stream2`) measures how much a different selection draw alone moves the final loss; the verdicts of
  `official_sampler_beats_random` and `random_streams_agree` above say whether raw-τ's gap over random is
  larger than that noise at 3 seeds. Both are checks (they explain why the findings use the standardized sampler).
- **Overhead** is counted in FLOPs (deterministic); wall-clock overheads are runtime fields and not claimed.
- **Not reproduced:** GPT-2-XL / FineWeb scale, Muon, downstream benchmarks (Discussion).
""")
    rep.finish(CLAIMS, metrics)
