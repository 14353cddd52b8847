"""report@opus: loss curves per arm, selection mix, static-filter AUROC, overhead vs N and m, verdicts.

    python -m stages report opus             # writes reports/opus/{report.md, metrics.json, figures/, plots/}
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import polars as pl

from stages.common.claims import Claim
from stages.common.config import StageConfig
from stages.common.paths import read_json
from stages.common.reporting import Report
from stages.opus.corpus import KINDS

PAPER_OVERHEAD = 0.047  # the paper's reported compute overhead of OPUS scoring

CLAIMS = [
    Claim("opus_adamw_beats_random",
          "OPUS (AdamW-preconditioned, Boltzmann) reaches lower target-domain validation loss than random "
          "selection at equal update tokens (mean over seeds)",
          "arms.opus_adamw.val_loss < arms.random.val_loss"),
    Claim("boltzmann_ge_greedy",
          "Boltzmann sampling is at least as good as greedy top-utility selection (mean final target loss)",
          "arms.opus_adamw.val_loss <= arms.greedy_opus.val_loss"),
    Claim("static_filter_flags_toxic",
          "Used as a static filter, the OPUS utility flags toxic (trigger-carrying) documents among "
          "target-domain documents: AUROC well above 0.5 (> 0.7)",
          "static_filter.auroc_toxic_vs_target > 0.7"),
    Claim("overhead_small",
          "OPUS scoring costs a small fraction of a training step (paper: 4.7%; checked here as <= 10%)",
          "overhead.opus_adamw_in_training <= 0.10"),
]


class Config(StageConfig):
    seed: int = 0


def _arm_stats(runs: list[dict]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for arm in dict.fromkeys(r["arm"] for r in runs):
        rs = [r for r in runs if r["arm"] == arm]
        finals = np.array([r["final_val_loss"] for r in rs])
        counts = np.sum([r["selected_kind_counts"] for r in rs], axis=0).astype(float)
        frac = counts / counts.sum()
        score = np.concatenate([r["score_s"] for r in rs])
        update = np.concatenate([r["update_s"] for r in rs])
        out[arm] = {"val_loss": float(finals.mean()), "val_loss_std": float(finals.std()),
                    "val_loss_per_seed": {str(r["seed"]): r["final_val_loss"] for r in rs},
                    **{f"{k}_frac": float(f) for k, f in zip(KINDS, frac)},
                    "score_s": float(np.median(score)), "update_s": float(np.median(update)),
                    "overhead": float(np.median(score) / np.median(update)),
                    "update_tokens": rs[0]["update_tokens"], "steps": rs[0]["steps"]}
    return out


def run(cfg: Config, ctx) -> None:
    prep, train, ev = ctx.input("prepare"), ctx.input("train"), ctx.input("evaluate")
    corpus = read_json(prep / "corpus.json")
    tr = read_json(train / "runs.json")
    e = read_json(ev / "evaluate.json")
    runs = tr["runs"]
    arms = _arm_stats(runs)
    seeds = sorted({r["seed"] for r in runs})
    static = e["static"]
    bd = min(e["overhead_vs_m"], key=lambda r: abs(r["m"] - tr["sketch_size"]))
    fid_default = min(e["fidelity"], key=lambda r: abs(r["m"] - tr["sketch_size"]))
    metrics = {
        "arms": arms,
        "static_filter": {"auroc_toxic_vs_target": float(np.mean([s["auroc_toxic_vs_target"] for s in static])),
                          "auroc_toxic_vs_all": float(np.mean([s["auroc_toxic_vs_all"] for s in static]))},
        "overhead": {"opus_adamw_in_training": arms.get("opus_adamw", {}).get("overhead", float("nan")),
                     "paper": PAPER_OVERHEAD,
                     "sweep_n": {str(r["N"]): r["overhead"] for r in e["overhead_vs_n"]},
                     "sweep_m": {str(r["m"]): r["overhead"] for r in e["overhead_vs_m"]}},
        "sketch_fidelity": {"m": fid_default["m"], "align_pearson": fid_default["align_pearson"],
                            "gram_pearson": fid_default["gram_pearson"]},
        "corpus": {"target_entropy_rate": corpus["target_entropy_rate"], "uniform_entropy": corpus["uniform_entropy"]},
        "seeds": len(seeds),
    }
    if "random" in arms:
        wins = {a: sum(arms[a]["val_loss_per_seed"][s] < arms["random"]["val_loss_per_seed"][s]
                       for s in arms[a]["val_loss_per_seed"]) for a in arms if a != "random"}
        metrics["seeds_beating_random"] = wins

    rep = Report(ctx, "OPUS: Optimizer-induced Projected Utility Selection (miniature)",
                 "Selecting each step's training batch by the OPUS utility — the alignment of a candidate's "
                 "optimizer-preconditioned update (CountSketch-projected, ghost-computed) with a proxy "
                 "gradient, minus a redundancy penalty, sampled by Boltzmann — trains a language model to a "
                 "better target-domain loss than random selection at equal tokens, with ~4.7% compute overhead; "
                 "the same utility works as a static data filter.")
    c = corpus["counts"]
    k, n = tr["k"], tr["buffer_size"]
    rep.section("Setup", f"""
Synthetic corpus (prepare, HF `datasets`): {sum(c.values())} documents of {corpus['seq_len']} tokens over
{corpus['vocab_size']} tokens — target chain A {c['target']}, chain B {c['other']}, near-uniform noise
{c['noise']}, near-duplicates of {corpus['dup_sources']} A documents {c['dup']}, toxic (A + trigger n-gram
{corpus['trigger']}) {c['toxic']}. Proxy = held-out A, validation = held-out A (entropy rate of A:
{corpus['target_entropy_rate']:.3f} nats/token, the floor of the validation loss; uniform: {corpus['uniform_entropy']:.3f}).

Model: the shared TinyTransformer, trained by Lightning (`make_trainer`). Every step each arm gets a buffer
of N = {n} candidates and trains on K = {k} of them (ρ = {k / n:.2f}), so all arms see the same
{next(iter(arms.values()))['update_tokens']} update tokens over {next(iter(arms.values()))['steps']} steps;
seeds {seeds} (the candidate stream of a seed is identical across arms).
OPUS: hooks on every `nn.Linear` capture inputs a and output gradients b of one forward/backward of the
candidates and of a {tr['proxy_batch']}-sequence proxy batch; φ_r(z) = Π_r(P_r Σ_t b_t a_tᵀ) through the fused kernel
`kernels/ghost_countsketch.py` (m = {tr['sketch_size']} buckets per layer), ψ_r = Π_r(mean proxy gradient),
U_z = η⟨φ,ψ⟩ − η²⟨φ,Φ⟩ with η = η_opt/K (the optimizer averages the K picks), K rounds of Boltzmann sampling
on standardized U (τ = {tr['tau']}). Arms: `random`; `high_loss` (top-K loss); `greedy_opus` (argmax
instead of Boltzmann); `opus_sgd` (P = I, η = lr: the raw-gradient utility, same AdamW training);
`opus_adamw` (P = C_t·diag(1/(√v̂+ε)) read from the live AdamW state); `opus_no_redundancy` (opus_adamw
without the redundancy penalty). Muon preconditioning is not
implemented (the shared optimizer set has no Muon).
""")
    rows = []
    for a, s in arms.items():
        rows.append({"arm": a, "final target val loss": s["val_loss"], "std over seeds": s["val_loss_std"],
                     "per seed": " / ".join(f"{v:.3f}" for v in s["val_loss_per_seed"].values()),
                     "picked target": s["target_frac"], "picked other": s["other_frac"],
                     "picked noise": s["noise_frac"], "picked dup": s["dup_frac"], "picked toxic": s["toxic_frac"],
                     "score/step time": s["overhead"]})
    rep.table("Results per arm", pl.DataFrame(rows),
              note="Fractions are of all selected sequences (pool: target 0.15, other 0.40, noise 0.35, "
                   "dup 0.05, toxic 0.05). score/step time = median selection time / median time of the "
                   "K-sequence forward+backward+optimizer step, measured inside training.")

    fig, ax = plt.subplots(figsize=(7, 4.2))
    curve_rows = []
    for a in arms:
        rs = [r for r in runs if r["arm"] == a]
        steps = np.array([s for s, _ in rs[0]["val_curve"]])
        vals = np.array([[v for _, v in r["val_curve"]] for r in rs])
        mu, sd = vals.mean(0), vals.std(0)
        ax.plot(steps, mu, label=a)
        ax.fill_between(steps, mu - sd, mu + sd, alpha=0.2)
        curve_rows += [{"arm": a, "step": int(s), "val_loss": float(v)} for s, v in zip(steps, mu)]
    ax.axhline(corpus["target_entropy_rate"], color="k", ls=":", lw=1, label="entropy rate of A")
    ax.set_xlabel("training step (K sequences each)")
    ax.set_ylabel("target-domain validation loss (nats/token)")
    ax.legend()
    ax.set_title(f"Target validation loss, mean ± std over {len(seeds)} seeds")
    rep.figure("val_loss_curves", fig, "Target-domain validation loss per arm at equal update tokens "
                                      "(mean ± std over seeds).")
    rep.plot("val_loss_curves", pl.DataFrame(curve_rows))

    rep.table("Static filter (OPUS utility as a toxic-document flagger)", pl.DataFrame([
        {"seed": s["seed"], "preconditioner": s["preconditioner"], "AUROC toxic vs target": s["auroc_toxic_vs_target"],
         "AUROC toxic vs all": s["auroc_toxic_vs_all"],
         **{f"mean U ({KINDS[int(i)]})": u for i, u in s["mean_utility_by_kind"].items()}} for s in static]),
        note=f"Final `{e['static_arm']}` model and its live AdamW state score each static document once "
             "with η⟨φ(z),ψ⟩ against the full proxy set; −U is the toxicity score. `vs all` also counts "
             "chain-B and noise documents as negatives (they have low utility too, so a domain-agnostic "
             "flagger would need more than utility).")

    fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharex="col")
    vn, vm = e["overhead_vs_n"], e["overhead_vs_m"]
    for col, (rows_, key, label) in enumerate([(vn, "N", f"buffer size N (K = N/2, m = {vn[0]['m']})"),
                                               (vm, "m", f"sketch size m per layer (N = {vm[0]['N']})")]):
        xs = [r[key] for r in rows_]
        axes[0, col].plot(xs, [r["overhead"] for r in rows_], "o-", label="measured (CPU)")
        axes[0, col].axhline(PAPER_OVERHEAD, color="r", ls="--", label="paper: 4.7%")
        axes[0, col].set_ylabel("scoring time / training-step time")
        axes[0, col].set_ylim(bottom=0)
        axes[0, col].legend()
        axes[1, col].loglog(xs, [1e3 * r["score_s"] for r in rows_], "o-", label="OPUS scoring + selection")
        axes[1, col].loglog(xs, [1e3 * r["step_s"] for r in rows_], "s-", label="training step on K")
        axes[1, col].set_ylabel("median time (ms)")
        axes[1, col].set_xlabel(label)
        axes[1, col].set_xscale("log", base=2)
        axes[1, col].legend()
    rep.figure("overhead", fig, "Selection overhead (OPUS scoring + K Boltzmann rounds over N candidates, "
                                "divided by one AdamW step on K sequences) against N and sketch size m.")
    rep.plot("overhead_vs_n", pl.DataFrame(vn))
    rep.plot("overhead_vs_m", pl.DataFrame(vm))
    rep.table("Sketch fidelity (CountSketch vs ghost-exact inner products)", pl.DataFrame(e["fidelity"]),
              note="align_pearson: correlation over documents of ⟨Π(PG(z)), Π(ḡ)⟩ with the exact "
                   "⟨PG(z), ḡ⟩ from the ghost identity Σ_t b_tᵀ(D⊙ḡ)a_t; gram_*: sketched vs ghost-exact "
                   "⟨G(z),G(z')⟩ = Σ_{t,s}(a_t·a'_s)(b_t·b'_s) over document pairs (P = I).")

    ra, oa = arms.get("random", {}), arms.get("opus_adamw", {})
    held = {v["name"]: v for v in _verdicts_preview(metrics)}
    pool_frac = {kind: c[kind] / sum(c.values()) for kind in KINDS}

    def enrich(kind: str, arm: str = "opus_adamw") -> float:
        frac = arms.get(arm, {}).get(f"{kind}_frac", float("nan"))
        return frac / pool_frac[kind] if pool_frac[kind] else float("nan")

    slope_n = _loglog_slope([r["N"] for r in vn], [r["score_s"] for r in vn])
    slope_m = _loglog_slope([r["m"] for r in vm], [r["score_s"] for r in vm])
    rep.section("Discussion", f"""
- **OPUS vs random.** Final target loss: opus_adamw {oa.get('val_loss', float('nan')):.3f} vs random
  {ra.get('val_loss', float('nan')):.3f} (seeds where each arm beats random: {metrics.get('seeds_beating_random')}).
  OPUS picks target-domain text at {oa.get('target_frac', float('nan')):.2f} of its batches against the
  pool's {pool_frac['target']:.2f} (enrichment ×{enrich('target'):.2f}) — the proxy alignment term does the
  domain targeting. Near-duplicates are enriched ×{enrich('dup'):.2f} and toxic documents ×{enrich('toxic'):.2f}:
  both are target-chain text, so the online utility favours them too. Redundancy ablation:
  without the η²⟨φ,Φ⟩ penalty (opus_no_redundancy) near-duplicates are enriched ×{enrich('dup', 'opus_no_redundancy'):.2f}
  and the final target loss is {arms.get('opus_no_redundancy', {}).get('val_loss', float('nan')):.3f}. Claim
  {'holds' if held['opus_adamw_beats_random']['holds'] else 'does **not** hold'} at this scale.
- **Boltzmann vs greedy.** opus_adamw {oa.get('val_loss', float('nan')):.3f} vs greedy_opus
  {arms.get('greedy_opus', {}).get('val_loss', float('nan')):.3f}: claim
  {'holds' if held['boltzmann_ge_greedy']['holds'] else 'does **not** hold'} here.
- **AdamW vs SGD preconditioning.** opus_sgd (P = I) {arms.get('opus_sgd', {}).get('val_loss', float('nan')):.3f}
  vs opus_adamw {oa.get('val_loss', float('nan')):.3f}; no gap is claimed, this is the measured difference.
- **Static filter.** Mean AUROC toxic vs clean target {metrics['static_filter']['auroc_toxic_vs_target']:.3f},
  toxic vs all other documents {metrics['static_filter']['auroc_toxic_vs_all']:.3f}.
- **Overhead.** Measured in training: {metrics['overhead']['opus_adamw_in_training']:.2f}× a training step,
  against the paper's 0.047. Breakdown at N = {bd['N']}, m = {bd['m']} (evaluate): forward+backward capture of
  candidates and proxy {1e3 * bd['capture_s']:.1f} ms, sketch kernel {1e3 * bd['sketch_s']:.1f} ms, K Boltzmann rounds
  {1e3 * bd['select_s']:.1f} ms, against {1e3 * bd['step_s']:.1f} ms for the training step on K. Scoring needs a
  forward+backward over N = 2K candidates plus the proxy batch, and at this toy scale fixed per-call CPU
  costs dominate every part; the paper's 4.7% is for GPT-2-XL-scale steps on GPUs. Fitted scaling of the scoring time:
  ∝ N^{slope_n:.2f} over N = {vn[0]['N']}..{vn[-1]['N']} and ∝ m^{slope_m:.2f} over m = {vm[0]['m']}..{vm[-1]['m']}
  (the sketch scatters all d_out·d_in entries per sample whatever m is, so m matters little; timings are
  medians on a shared 2-core CPU and are noisy).
- **Faithfulness notes.** The default CPU path runs the kernel's torch reference (chunks of 16 samples'
  gradients are formed transiently, never the full [N, d_out, d_in]); the Triton kernel (CUDA or
  TRITON_INTERPRET=1) never forms them. The AdamW preconditioner falls back to P = I before the first
  optimizer step (v = 0). Muon is not implemented.
""")
    rep.finish(CLAIMS, metrics)


def _loglog_slope(xs: list[float], ys: list[float]) -> float:
    if len(set(xs)) < 2:
        return float("nan")
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def _verdicts_preview(metrics: dict) -> list[dict]:
    from stages.common.claims import evaluate_claims

    return evaluate_claims(CLAIMS, metrics)
