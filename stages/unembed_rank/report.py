"""report: seed-aware claims on the batch-size × weight-decay grid, tables and figures (erank vs the
hyperparameters, erank vs loss coloured by stratum, trajectories).

    python -m stages report unembed_rank
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import polars as pl

from stages.common.claims import Better, Bound, Claim
from stages.common.config import ReportConfig
from stages.common.paths import read_json
from stages.common.reporting import Report
from stages.common.runner import StageContext

CLAIMS = [
    Bound("erank_driven_by_hparams",
          "Effective rank of W_U is strongly driven by batch size and weight decay (equal tokens, main block): per "
          "seed, the range of the final erank's level means over the batch sizes and the range over the weight "
          "decays both exceed a minimum effect in erank points (% of max rank; the smaller of the two is judged)",
          value="erank_effects.min_axis_range",
          refuted_by="the smaller of the two ranges below the minimum beyond 2 s.e. (one of the two axes moves erank "
                     "by less than the minimum)", kind="finding"),
    Bound("erank_driven_by_batch_equal_steps",
          "Effective rank is strongly driven by batch size at equal optimizer steps (design 2): per seed, the range "
          "of the final erank's level means over the batch sizes exceeds the same minimum effect",
          value="equal_steps.bs_range",
          refuted_by="the batch-size range below the minimum beyond 2 s.e.", kind="finding"),
    Better("larger_batch_higher_erank",
           "Larger batches give a higher erank (paper §4), at equal token budget: mean erank at the largest "
           "batch size above that at the smallest",
           a="erank_effects.bs_max", b="erank_effects.bs_min",
           refuted_by="erank at the largest batch not above the smallest's beyond 2 s.e.", kind="finding"),
    Better("larger_batch_higher_erank_matched_loss",
           "Larger batches give a higher erank at equal training progress: erank when each run first reaches the "
           "same in-domain loss (the main block's worst final loss), largest batch size above the smallest — the "
           "equal-token comparison also gives the large batches fewer optimizer steps by the batch-size ratio. "
           "Every step is logged early (dense_steps) and a crossing whose bracketing points differ by more than "
           "the guard (evaluate.matched_loss_max_gap nats) is not interpolated (non-finite → inconclusive)",
           a="matched_loss.bs_max", b="matched_loss.bs_min",
           refuted_by="erank at the largest batch not above the smallest's at the matched loss, beyond 2 s.e.", kind="finding"),
    Better("larger_batch_higher_erank_matched_loss_equal_steps",
           "The same at a second, lower loss level: within the equal-steps design (every batch size trained for the "
           "same steps, logged every step), erank when each run first reaches that design's worst final loss, "
           "largest batch size above the smallest (same guard)",
           a="matched_loss_steps.bs_max", b="matched_loss_steps.bs_min",
           refuted_by="erank at the largest batch not above the smallest's at the second matched loss, beyond 2 s.e.",
           kind="finding"),
    Better("larger_batch_higher_erank_equal_steps",
           "Larger batches give a higher erank at equal optimizer steps: every batch size takes the same number of "
           "steps (the equal-steps design; tokens then grow with the batch size), mean erank at the largest batch "
           "size above that at the smallest",
           a="equal_steps.bs_max", b="equal_steps.bs_min",
           refuted_by="erank at the largest batch not above the smallest's at equal steps, beyond 2 s.e.", kind="finding"),
    Better("strong_wd_keeps_erank",
           "Strong weight decay keeps the rank (paper §4): mean erank at the largest weight decay above that "
           "at the smallest",
           a="erank_effects.wd_max", b="erank_effects.wd_min",
           refuted_by="erank at the largest weight decay not above the smallest's beyond 2 s.e.", kind="finding"),
    Claim("correlation_confounded",
          "erank's correlation with loss is confounded by the hyperparameters: over all equal-token runs the partial "
          "Spearman ρ controlling for batch size, weight decay, final LR and model width is smaller in magnitude than the raw ρ and not significant "
          "(p > 0.05), for in-domain and OOD loss (paper: −0.70 → −0.13 n.s., −0.67 → −0.13 n.s.)",
          "abs(corr.val_loss.erank.pooled_partial) < abs(corr.val_loss.erank.pooled_raw) and corr.val_loss.erank.pooled_partial_p > param.k0_05 and (abs(corr.ood_loss.erank.pooled_partial) < abs(corr.ood_loss.erank.pooled_raw)) and (corr.ood_loss.erank.pooled_partial_p > param.k0_05)",
          refuted_by="a partial ρ as large as the raw one, or significant at p ≤ 0.05 (erank still tracks loss "
                     "among runs with the same hyperparameters)", kind="finding"),
    Claim("no_incremental_r2",
          "Once the hyperparameters are known, erank adds little out-of-sample predictive power for loss: the "
          "paper's absolute incremental R² (leave-one-out R² of loss ~ one-hot hyperparameters + erank minus that "
          "without erank) is below a small bound, for in-domain and OOD loss (paper: ΔR² −0.003 / −0.004)",
          "delta_r2.val_loss.erank.delta_r2 < param.max_delta_r2 and delta_r2.ood_loss.erank.delta_r2 < param.max_delta_r2",
          refuted_by="erank adding at least the bound to the out-of-sample R² of either loss", kind="finding"),
    Claim("no_incremental_r2_relative",
          "A stricter reading of the same statement (ours, not the paper's metric): erank explains < 10% of the "
          "loss variance the hyperparameter baseline leaves, out of sample (ΔR² / (1 − R²_base)); the absolute "
          "ΔR² cannot be large when the baseline already explains almost everything",
          "delta_r2.val_loss.erank.rel_delta_r2 < param.max_rel and delta_r2.ood_loss.erank.rel_delta_r2 < param.max_rel",
          refuted_by="erank explaining ≥ 10% of the loss variance left by the hyperparameters, out of sample", kind="finding"),
    Claim("saturation_low_rank_not_causal",
          "Low erank co-occurs with late saturation (saturated runs have lower erank) but low-rank runs "
          "without saturation exist (adversarial cases); compared within the saturation probe and within one "
          "weight-decay level (saturation and erank both move with weight decay, so the erank gap is taken between "
          "saturated and unsaturated runs of the same weight decay, averaged over the levels that have both)",
          "saturation.low_sat >= 1 and saturation.low_nosat >= 1 and saturation.erank_gap_within_wd > 0",
          refuted_by="no saturated low-rank run, saturated runs not lower in erank within a weight-decay level, or "
                     "every low-rank run saturating (inconclusive by design when no weight-decay level has both "
                     "saturated and unsaturated runs: the within-level gap is then undefined)", kind="finding"),
    Claim("saturation_regime_reached",
          "Design check: at least one saturation-probe run saturates (ID val loss rising by > 0.01 nats over the "
          "last 20% of its steps), so the saturation finding is testable at this budget",
          "saturation.n_sat >= 1",
          refuted_by="no run saturating", kind="check"),
]


class Config(ReportConfig):
    pass


def num(x, spec: str = ".2f") -> str:
    """A measured number as text; null (NaN/inf written by write_json, e.g. a p-value with no degrees of
    freedom on a tiny grid) reads as "n/a" instead of failing the format."""
    return "n/a" if x is None or (isinstance(x, float) and x != x) else format(x, spec)


def grid_table(res: pl.DataFrame) -> pl.DataFrame:
    return (res.group_by("d_model", "final_lr_frac", "batch_size", "weight_decay", "lr", maintain_order=True).agg(
        pl.len().alias("seeds"), pl.col("steps").first(), pl.col("tokens").first(),
        pl.col("erank").mean().alias("erank %"), pl.col("erank").std().alias("erank sd"),
        pl.col("erank_sq").mean().alias("erank σ² %"), pl.col("h_erank").mean().alias("erank(H) %"),
        pl.col("cosine").mean().alias("cos"), pl.col("isotropy").mean().alias("I(W)"),
        pl.col("val_loss").mean().alias("ID loss"), pl.col("ood_loss").mean().alias("OOD loss"),
        pl.col("saturated").sum().alias("saturated"))
        .sort(pl.col("d_model"), pl.col("final_lr_frac"), "lr", "batch_size", "weight_decay",
              descending=[True, True, False, False, False]))


def probe_table(probe: pl.DataFrame, hist: pl.DataFrame) -> pl.DataFrame:
    rows = []
    for r in probe.sort("batch_size", "weight_decay", "seed").iter_rows(named=True):
        h = hist.filter(pl.col("run") == r["run"]).sort("step")
        i = int(h["val_loss"].arg_min())
        rows.append({"run": r["run"], "min logged ID loss": float(h["val_loss"][i]),
                     "at step": int(h["step"][i]), "final logged ID loss": float(h["val_loss"][-1]),
                     "rise over last 20%": r["loss_rise_last20"], "saturated": r["saturated"],
                     "final erank %": r["erank"], "erank change last 20%": r["erank_change_last20"]})
    return pl.DataFrame(rows)


def fig_probe(hist: pl.DataFrame, probe: pl.DataFrame):
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for j, name in enumerate(probe.sort("batch_size", "weight_decay", "seed")["run"].to_list()):
        h = hist.filter(pl.col("run") == name).sort("step")
        for ax, col in zip(axes, ("val_loss", "erank")):
            ax.plot(h["step"], h[col], color=f"C{j % 10}", marker=".", label=name)
    for ax, lab in zip(axes, ("in-domain val loss", "erank(W_U) %")):
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(lab)
    axes[0].legend(fontsize=6)
    fig.suptitle("saturation probe: repeated small training slice (learning curves recorded by train)")
    fig.tight_layout()
    return fig


def corr_table(an: dict) -> pl.DataFrame:
    rows = []
    for loss in ("val_loss", "ood_loss"):
        for m, c in an["corr"][loss].items():
            d = an["delta_r2"][loss][m]
            rows.append({"loss": loss, "metric": m, "ρ raw (pooled)": c["pooled_raw"],
                         "ρ partial (pooled)": c["pooled_partial"], "p partial": c["pooled_partial_p"],
                         "ρ raw per seed": ", ".join(num(x) for x in c["raw"]),
                         "R² hparams (LOO)": d["r2_base"], "ΔR² (LOO)": d["delta_r2"],
                         "ΔR² / (1 − R²)": d["rel_delta_r2"]})
    return pl.DataFrame(rows)


def fig_hparams(res: pl.DataFrame):
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, metric, label in zip(axes, ("erank", "erank_sq", "val_loss"),
                                 ("erank(W_U) % (σ)", "erank(W_U) % (σ²)", "in-domain val loss")):
        for wd in sorted(res["weight_decay"].unique().to_list()):
            g = res.filter(pl.col("weight_decay") == wd).group_by("batch_size", maintain_order=True).agg(
                pl.col(metric).mean().alias("m"), pl.col(metric).std().alias("s")).sort("batch_size")
            ax.errorbar(g["batch_size"].to_numpy(), g["m"].to_numpy(), yerr=g["s"].fill_null(0).to_numpy(),
                        marker="o", capsize=3, label=f"wd={wd:g}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size (equal tokens)")
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def fig_scatter(res: pl.DataFrame):
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    markers = ["o", "s", "^", "D", "v", "P", "X", "*"]
    wds = sorted(res["weight_decay"].unique().to_list())
    for ax, loss in zip(axes, ("val_loss", "ood_loss")):
        for j, bs in enumerate(sorted(res["batch_size"].unique().to_list())):
            for k, wd in enumerate(wds):
                f = res.filter((pl.col("batch_size") == bs) & (pl.col("weight_decay") == wd))
                ax.scatter(f["erank"], f[loss], color=f"C{j}", marker=markers[k % len(markers)],
                           label=f"bs={bs}, wd={wd:g}", s=30)
        ax.set_xlabel("erank(W_U) % of max rank")
        ax.set_ylabel(loss.replace("_", " "))
    axes[1].legend(fontsize=6, ncol=2)
    fig.suptitle("erank vs loss, coloured by batch-size stratum (marker = weight decay)")
    fig.tight_layout()
    return fig


def fig_traj(hist: pl.DataFrame, seed: int):
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    styles = ["-", "--", ":", "-."]
    h = hist.filter(pl.col("seed") == seed)
    wds = sorted(h["weight_decay"].unique().to_list())
    for j, bs in enumerate(sorted(h["batch_size"].unique().to_list())):
        for k, wd in enumerate(wds):
            f = h.filter((pl.col("batch_size") == bs) & (pl.col("weight_decay") == wd)).sort("tokens")
            for ax, col in zip(axes, ("erank", "val_loss", "ood_loss")):
                ax.plot(f["tokens"], f[col], color=f"C{j}", linestyle=styles[k % 4], label=f"bs={bs}, wd={wd:g}")
    for ax, lab in zip(axes, ("erank(W_U) %", "in-domain val loss", "OOD val loss")):
        ax.set_xlabel("training tokens")
        ax.set_ylabel(lab)
    axes[0].legend(fontsize=6, ncol=2)
    fig.suptitle(f"trajectories (seed {seed})")
    fig.tight_layout()
    return fig


def threats(rep: Report, an: dict, g: dict, ini: dict, s: dict, dv: dict, do: dict, steps: list[int],
            probe: pl.DataFrame, rep_params: dict | None = None) -> None:
    rep_params = {k: dict(v) for k, v in (rep_params or {}).items()}
    sb, sa = an["saturation_by_design"], an["saturation_all"]
    nonprobe = [(d, v) for d, v in sb.items() if d != "sat"]
    esl = an.get("equal_steps_loss", {})
    es_loss = (f"at {g['equal_steps']} steps the in-domain loss is still {num(sum(esl['bs_min']) / len(esl['bs_min']), '.2f')} "
               f"(smallest batch) / {num(sum(esl['bs_max']) / len(esl['bs_max']), '.2f')} (largest) against "
               f"{num(ini['val_loss'], '.2f')} at initialization"
               if esl else "the design is off in this profile")
    wd_note = ""
    if probe.height:
        by_wd = probe.group_by("weight_decay").agg(pl.col("saturated").sum(), pl.len()).sort("weight_decay")
        wd_note = ("; in the probe, saturated runs per weight decay: " +
                   ", ".join(f"wd {r['weight_decay']:g}: {r['saturated']}/{r['len']}" for r in by_wd.iter_rows(named=True)) +
                   " — saturation and erank both move with weight decay there; the claim therefore compares within a "
                   f"weight-decay level ({s.get('n_wd_levels_mixed', 0)} level(s) have both saturated and unsaturated runs; "
                   "with none the claim is inconclusive by design: this probe cannot separate saturation from weight decay)")
    rep.section("Threats to validity", f"""
A red-team pass over this design (could each finding have failed? is it decided by construction or by the budget?):

- **Step-count confound, three designs.** At equal tokens the batch sizes take {steps} optimizer steps, so
  `erank_driven_by_hparams` and `larger_batch_higher_erank` mix batch size with training progress: the runs start near
  full rank ({num(ini['erank'], '.1f')}% at step 0) and fewer steps leave them closer to it. The matched-loss comparison
  removes the progress difference but not the schedule phase (a small-batch run reaches the matched loss mid-schedule).
  The equal-steps design ({g['equal_steps']} steps for every batch size, weight decays {g.get('equal_steps_weight_decays')})
  removes the update-count difference but confounds batch size with tokens seen; {es_loss}. No single design isolates
  batch size; the three are reported side by side.
- **Matched loss needs dense logging (review finding, fixed).** The first version logged 10 points per run and
  interpolated erank linearly between step 0 and the first point below the matched loss (a 1.6-nat bracket for the
  smallest batch), which understated the small batches' erank (erank stays near its initial value for ~10 steps, then
  falls): a reviewer's every-step re-run of one run moved the gap from +3.9 to +0.1 points. Now every step ≤
  {an.get('dense_steps', 0)} is logged in the main block and the equal-steps design, and a crossing whose bracketing
  points differ by more than the guard ({num(an['matched_loss'].get('max_gap'), '.3g')} nats, evaluate params, fixed before
  this run from the reviewer's every-step curve of one earlier run: one step drops the smallest batch's loss by ~0.09 nats
  at the crossing, and erank vs loss is smooth enough there that a 0.15-nat bracket bounds the interpolation error by
  ~0.03 points) gives a non-finite value (inconclusive). Widest bracket over the runs (guarded ones included): {num(an['matched_loss'].get('bracket_gap_max'), '.3g')}
  nats (level 1){'' if 'matched_loss_steps' not in an else f", {num(an['matched_loss_steps'].get('bracket_gap_max'), '.3g')} nats (level 2)"}.
- **Effect-size minimum of the "driven by" findings.** η² (the first version's statistic) is ≈ 1 by construction with one
  run per cell and paired seeds, so it is reported only as context; the findings judge the range of the level means in
  erank points against a minimum of {num(float(rep_params.get('erank_driven_by_hparams', {}).get('above', float('nan'))), '.3g')} points
  (params). That minimum is our reading of "strongly" (5% of the maximal rank), set with the review, after the earlier
  runs' values were known (batch-size range ~46 points, weight-decay range ~2 points): disclosed, not derived from the
  results by code.
- **Absolute ΔR² has little room.** The hyperparameter baseline already explains R² = {num(dv['r2_base'], '.4f')} (ID) /
  {num(do['r2_base'], '.4f')} (OOD) of the loss out of sample, so the absolute ΔR² (the paper's metric,
  `no_incremental_r2`) cannot exceed {num(1 - dv['r2_base'], '.2g')} / {num(1 - do['r2_base'], '.2g')}, close to the claim's bound
  for in-domain loss, so the ID half can barely fail (the OOD half is a fair test); the bound ({num(float(rep_params.get('no_incremental_r2', {}).get('max_delta_r2', float('nan'))), '.3g')})
  was set after an earlier run's values (ΔR² ~3e-4) were known (commit 82fe742). The relative version
  (`no_incremental_r2_relative`) is the reading with room to fail, reported beside it.
- **Saturation comes from repeated data in the probe, not from the paper's mechanism.** Saturated runs outside the probe:
  {', '.join(f"{d} {v['n_sat']}/{v['n_runs']}" for d, v in nonprobe)}; in the probe {sb.get('sat', {}).get('n_sat', 0)} of
  {sb.get('sat', {}).get('n_runs', 0)}. The probe repeats a small slice of the training bytes for many epochs, so its late
  rise in in-domain val loss is overfitting, whereas the paper's saturation (Pythia-14M) happens on fresh Pile data late
  in a very long run. The operational definition (loss rise over the last 20% of steps) is the same; the cause is not,
  so `saturation_low_rank_not_causal` tests the co-occurrence pattern in a proxy regime, on {s['n_runs']} runs{wd_note}.
  The probe's setting was fixed from one exploratory learning curve of the same probe, chosen so that the curve turns
  up (the claim's expression was fixed before).
- **Scope of the saturation claim changed after the first default run (disclosed).** As first written, the claim pooled
  every run of every design; that run gave it "holds" (gap {num(sa['erank_gap_nosat_minus_sat'])} points, low/saturated
  {sa['low_sat']}, low/unsaturated {sa['low_nosat']}), but the red-team pass found that gap decided by construction: the
  unsaturated side is mostly barely trained runs (equal steps, large batches at equal tokens) near the full-rank
  initialization, which cannot saturate. The claim now compares within the probe only; the pooled counts stay in the
  saturation table's note.
- **erank in % of max rank across widths** ({g['d_models']}): the correlation analyses pool both widths with width as a
  control; the percentage is not strictly comparable across widths.
- **Weight decay has little time to act**: with lr × wd × steps ≤ {num(max(g['lrs']) * max(g['weight_decays']) * max(steps), '.2g')}
  the decay shrinks weights by a bounded factor; the paper's runs are ~10⁵× longer, so `strong_wd_keeps_erank`
  tests a short-horizon regime.
- **Unbalanced seeds in the correlation analyses**: the main block has {len(g['seeds'])} seeds, the other cells
  {len(g['extra_seeds'])}; pooled n = {an['n_tokens']} with {len(an['controls'])} controls; the partial ρ's p-value is a t
  approximation with n − 2 − k degrees of freedom that treats every run as independent, although the main block's seeds
  share the initialization and the batches across cells (effective n below the pooled n): the p-values of
  `correlation_confounded` are anti-conservative, so a p just below 0.05 there is weak evidence of a residual correlation. The findings on hyperparameter effects use only the main block
  ({len(g['seeds'])} seeds; the project's ≥ 5 seeds did not fit the default budget).
- **Axes**: one peak LR in the default grid (the final-LR axis {g['final_lr_fracs']} and widths {g['d_models']} are varied;
  peak-LR multipliers only in the `full` profile).
- **Independent checks**: the erank ΔR² recomputed with the paper's 5-fold CV instead of leave-one-out:
  {num(an['delta_r2_5fold']['val_loss']['delta_r2'], '.2g')} (ID) / {num(an['delta_r2_5fold']['ood_loss']['delta_r2'], '.2g')} (OOD), relative
  {num(an['delta_r2_5fold']['val_loss']['rel_delta_r2'], '.3f')} / {num(an['delta_r2_5fold']['ood_loss']['rel_delta_r2'], '.3f')}; erank recomputed with numpy SVD / scipy entropy in the tests (test_geometry_brute,
  test_erank_matches_scipy_entropy_and_invariances); the matched-loss interpolation and its guard checked on hand-worked
  histories (test_matched_loss_interpolates_the_first_crossing_by_hand, test_first_crossing_guard_by_hand); the dense
  points of run bs8_wd0_lr0.003_f0.1_d32_n256_s0 (steps 0–30) equal, to the last digit, an every-step re-run written
  independently by the reviewer (its erank at the matched loss: 83.69 both ways, against 79.89 from the old 10-point
  logging); at the second level the smallest batch reaches the matched loss late in its cosine schedule (lower LR) and
  the largest earlier, so that comparison keeps a schedule-phase difference; the design bookkeeping (shared runs, flags, seeds per
  cell) against a hand count (test_run_specs_designs_by_hand).
""")


def deviations(rep: Report) -> None:
    rep.section("Deviations", """
| paper / official setup | here | why |
| --- | --- | --- |
| 108 OLMo LMs, 4–75M non-embedding params, the Pile, 8–128B tokens | two tiny widths (d 32 / 16, ~30k / ~10k params), stdlib Python bytes, ~10⁵ tokens per run | 2-CPU budget of a few minutes for the whole grid |
| bs 32–512, WD 0.01/0.1/0.5, peak-LR multipliers, final-LR 0/1/10% | bs {8, 32, 128} × WD {0, 0.1, 1.0} (card's grid), one peak LR, final LR {10%, 0} | card's miniature grid; peak-LR axis only in the `full` profile |
| 18 configs per size, all with one seed | main block 3 seeds, other cells 1 seed | findings need seeds; the correlation-only cells fit the budget with one |
| BPE vocab (50k) ≫ d_model | byte vocab 256 vs d_model 32 / 16 | offline byte-level corpus |
| OOD: Dolma code / Paloma; GPTQ and fine-tuning losses | OOD: C headers; no quantization / fine-tuning | no downloads; scope |
| partial Spearman over 18 configs per size, 5-fold ΔR² with size/compute/token controls | pooled partial Spearman over all equal-token runs, LOO ΔR², controls = every varying hyperparameter incl. width and final LR | small n |
| saturation shown on single cases (Pythia-14M, fresh data) | counted over every run with a fixed rule; saturating runs come from a repeated-data probe | the card asks for counts; the paper's regime is out of reach at this budget |
| equal tokens only (token-budget runs also change bs) | equal tokens, matched loss and equal steps | the issue asks for both designs |
""")


def run(cfg: Config, ctx: StageContext) -> None:
    ev, tr = ctx.input("evaluate"), ctx.input("train")
    an = read_json(ev / "analysis.json")
    res = pl.read_csv(ev / "results.csv")
    hist = pl.read_csv(tr / "history.csv")
    info = read_json(tr / "runs.json")
    corpus = read_json(ctx.input("prepare") / "meta.json").get("corpus", "live stdlib")
    vmax = info.get("vectorize_max_batch", 0)
    vec_text = (f"the seeds of a cell with batch ≤ {vmax} train as one vectorized `SeedEnsemble` in one Lightning fit "
                "(member k = seed k's solo run; tested equal to seed after seed, `vectorize_seeds: false`), larger "
                "batches one fit per run, seed after seed (no speed-up there)" if vmax
                else "one Lightning fit per run, seed after seed (`vectorize_seeds: false`)")
    g = an["grid"]
    main, tok, stp, probe = (res.filter(pl.col(f"in_{d}")) for d in ("main", "tokens", "steps", "sat"))
    main_hist = hist.filter(pl.col("run").is_in(main["run"].to_list()))
    sp = info["saturation"]
    rep = Report(ctx, "Unembedding effective rank vs performance (miniature)",
                 "Across controlled OLMo-style training runs the best models often have a high effective rank of "
                 "the unembedding matrix, but the effective rank is strongly driven by batch size and weight "
                 "decay; once those are controlled its correlation with (ID and OOD) loss is weak, and low rank "
                 "co-occurs with late saturation without causing it.")
    m = info["model"]
    rep.section("Setup", f"""
- Corpus (prepare, offline): bytes of the Python standard library's top-level `*.py` sources
  (in-domain; every 10th file → val) and CPython's C headers `include/*.h` (OOD: another file family), read from the
  {corpus}: the same bytes on every machine (a live stdlib differs by Python version and build). Vocab = 256 bytes.
- Model: shared tiny transformer, OLMo-style (pre-norm RMSNorm, no biases, SwiGLU, RoPE, **untied** W_U of
  shape {m['vocab_size']}×d), {m['n_layers']} layers, {m['n_heads']} heads, context {info['seq_len']}, width d ∈ {g['d_models']}.
  AdamW (β = 0.9/0.95), linear warm-up then cosine to a final LR of {g['final_lr_fracs']} × the peak; weight decay on
  2-D weights incl. W_U, not on the input embedding or norms. All runs inside the train stage: {vec_text}.
- **Design 1, equal tokens** (every run **{g['tokens']:,} tokens**, steps = tokens / (batch × context)): batch size
  {g['batch_sizes']} × weight decay {g['weight_decays']} × peak lr {g['lrs']} × final LR {g['final_lr_fracs']} × width
  {g['d_models']}. The **main block** (width {g['d_models'][0]}, final LR {g['final_lr_fracs'][0]}) runs seeds {g['seeds']}
  ({an['n_main']} runs) and feeds the hyperparameter-effect findings and the matched-loss comparison; the other cells run
  seeds {g['extra_seeds']} and only feed the correlation / ΔR² analyses ({an['n_tokens']} equal-token runs in all), whose
  controls are every varying hyperparameter ({', '.join(an['controls'])}).
- **Design 2, equal steps**: the main block's batch sizes × weight decay {g['equal_steps_weight_decays']} with every
  batch size taking **{g['equal_steps']} optimizer steps** (runs identical to an equal-token run are shared), so tokens
  grow with the batch size ({an['n_steps']} runs, seeds {g['seeds']}); every step ≤ {an.get('dense_steps', 0)} is logged
  (ID val loss and erank) in the main block and this design, for the matched-loss crossings.
- **Design 3, saturation probe**: width {sp['d_model']}, the first {sp['train_bytes']:,} bytes of the train split repeated,
  {sp['steps']} steps, batch {sp['batch_sizes']} × weight decay {sp['weight_decays']} × seeds {sp['seeds']} ({an['n_probe']} runs).
- Same seed ⇒ same initialization in every cell of a width; same seed and batch size ⇒ same batches for every weight
  decay, final LR and width. {an['n_runs']} distinct runs in all.
- Metrics: erank R(W) = exp(−Σ p_k log p_k), p_k = σ_k/Σσ_j (and the σ²-normalized variant), in % of
  min(V, d); mean cosine similarity of W_U rows; isotropy I(W); the same on H (last-token final-layer
  representations of the val windows). Logged at {info.get('n_evals', 10)} step-aligned points of every run (the learning curves in
  train/history.csv); final losses over the whole val / OOD splits through the fused linear+CE kernel.
- **Saturation (operational definition)**: the paper's late saturation is in-domain loss rising late in training
  (Pythia-14M, §3.2); here a run is saturated when its logged in-domain val loss rises by > 0.01 nats from the point
  at 80% of its steps to the end. Low erank: below the median final erank of the saturation probe's runs (the claim's
  comparison set; the pooled split over all runs is given beside it).
""")
    rep.table("Results: equal-token grid, means over seeds (main block: 3 seeds; other cells: extra seeds)",
              grid_table(tok))
    ini = an["init"]
    rep.section("At initialization", f"Mean over runs at step 0: erank(W_U) = {ini['erank']:.1f}% (σ), "
                f"{ini['erank_sq']:.1f}% (σ²), ID val loss = {ini['val_loss']:.3f} (ln 256 = 5.545). Training lowers the "
                "rank from this near-full value; runs with fewer optimizer steps (larger batches at equal tokens) "
                "stay closer to it.")
    rep.figure("erank_vs_hparams", fig_hparams(main),
               "Main block: final erank (σ and σ² variants) and in-domain loss vs batch size, one line per weight decay (mean ± sd over seeds)")
    ml = an["matched_loss"]
    rep.table("erank at matched loss (equal progress) vs at equal tokens (main block)", pl.DataFrame(
        [{"batch size": r["batch_size"], "erank % at matched loss": r["erank"], "steps to reach it": r["step"],
          "tokens to reach it": r["tokens"], "largest bracketing loss gap (nats)": r["gap"],
          "final erank % (equal tokens)": float(main.filter(pl.col("batch_size") == r["batch_size"])["erank"].mean()),
          "final steps": float(main.filter(pl.col("batch_size") == r["batch_size"])["steps"].mean())}
         for r in ml["by_batch"]]),
        note=f"Matched level: in-domain val loss {num(ml['level'], '.3f')} nats (the largest final logged loss over the "
             "main block, so every run reaches it; fixed by that rule, not chosen), erank linearly interpolated between "
             f"the two logged points around each run's first crossing (every step ≤ {an.get('dense_steps', 0)} is logged); "
             f"guard: a bracket wider than {num(ml.get('max_gap'), '.3g')} nats makes the run's value non-finite "
             f"({ml.get('n_guarded', 0)} of {ml.get('n_runs', 0)} runs guarded; widest bracket {num(ml.get('bracket_gap_max'), '.3g')} nats); "
             "means over seeds and weight decays. The "
             "batch-size claims use min_effect 0: the paper states a direction (larger batches → higher rank), not a size.")
    if "matched_loss_steps" in an:
        m2 = an["matched_loss_steps"]
        rep.table("erank at a second matched loss (within the equal-steps design)", pl.DataFrame(
            [{"batch size": r["batch_size"], "erank % at matched loss": r["erank"], "steps to reach it": r["step"],
              "tokens to reach it": r["tokens"], "largest bracketing loss gap (nats)": r["gap"]} for r in m2["by_batch"]]),
            note=f"Level: {num(m2['level'], '.3f')} nats (the equal-steps design's largest final logged loss); "
                 f"{m2['n_guarded']} of {m2['n_runs']} runs guarded (bracket > {num(m2['max_gap'], '.3g')} nats); per seed, "
                 f"largest batch {', '.join(num(x) for x in m2['bs_max'])} vs smallest {', '.join(num(x) for x in m2['bs_min'])}.")
    if stp.height:
        es = an["equal_steps"]
        rep.table(f"Design 2: equal steps ({g['equal_steps']} steps for every batch size)", (
            stp.group_by("batch_size", "weight_decay", maintain_order=True).agg(
                pl.len().alias("seeds"), pl.col("tokens").first(), pl.col("erank").mean().alias("erank %"),
                pl.col("erank").std().alias("erank sd"), pl.col("val_loss").mean().alias("ID loss"),
                pl.col("ood_loss").mean().alias("OOD loss")).sort("batch_size", "weight_decay")),
            note=f"Per seed, erank at the largest batch {', '.join(num(x) for x in es['bs_max'])} vs smallest "
                 f"{', '.join(num(x) for x in es['bs_min'])}; range over batch sizes per seed "
                 f"{', '.join(num(x) for x in es['bs_range'])} points (η², context only: "
                 f"{', '.join(num(x, '.3f') for x in es['eta2'])}). At equal steps the larger batch also sees more tokens "
                 "(lower loss): batch size is no longer confounded with the number of updates, but it is with data seen.")
    rep.figure("erank_vs_loss", fig_scatter(tok), "Final erank vs in-domain / OOD loss over the equal-token runs, coloured by batch-size stratum")
    rep.figure("trajectories", fig_traj(main_hist, g["seeds"][0]), "Main block: erank and losses during training (first seed)")
    rep.table("Correlations with loss: raw and partial Spearman, incremental R² (equal-token runs)", corr_table(an),
              note=f"Partial ρ controls for the ranks of {', '.join(an['controls'])} (log scale; +1e-3 where 0 occurs); "
                   "ΔR² is the leave-one-out R² of loss ~ one-hot hyperparameters + metric minus that without the "
                   "metric, pooled over seeds (the paper's absolute incremental R²); the last column divides it by the "
                   "variance the baseline leaves.")
    strata = pl.read_csv(ev / "strata_val.csv").join(pl.read_csv(ev / "strata_ood.csv"), on=["stratum", "n"],
                                                      suffix="_ood").rename({"rho": "ρ(erank, ID loss)",
                                                                             "rho_ood": "ρ(erank, OOD loss)"})
    rep.table("Within and across strata (equal-token runs)", strata)
    cv, co = an["corr"]["val_loss"]["erank"], an["corr"]["ood_loss"]["erank"]
    within = strata.filter(pl.col("stratum").str.starts_with("batch_size"))["ρ(erank, ID loss)"].to_list()
    rep.section("Reading the correlations", f"""
Pooled over all {an['n_tokens']} equal-token runs, erank vs in-domain loss: raw ρ = {num(cv['pooled_raw'])}, partial ρ
({', '.join(an['controls'])} controlled) = {num(cv['pooled_partial'])} (p = {num(cv['pooled_partial_p'], '.2g')}); OOD: raw
{num(co['pooled_raw'])}, partial {num(co['pooled_partial'])} (p = {num(co['pooled_partial_p'], '.2g')}). Within each batch-size
stratum ρ(erank, ID loss) = {', '.join(num(x) for x in within)}. A positive raw ρ means higher erank goes with *worse*
loss across strata (the opposite sign to the paper's −0.70): the across-strata association is carried by the number of
optimizer steps (large batches at equal tokens take few steps and stay near the near-full-rank initialization), while
the sign within a stratum is the one to compare with the paper's "best models have high rank".""")
    s, sa = an["saturation"], an["saturation_all"]
    rep.table("Saturation vs erank (counts within the saturation probe)", pl.DataFrame([
        {"": "low erank (< median)", "saturated": s["low_sat"], "not saturated": s["low_nosat"]},
        {"": "high erank", "saturated": s["high_sat"], "not saturated": s["high_nosat"]}]),
        note=f"{s['n_sat']} of {s['n_runs']} probe runs saturate; mean final erank of the unsaturated minus the saturated "
             f"runs {num(s['erank_gap_nosat_minus_sat'])} points pooled, {num(s.get('erank_gap_within_wd'))} within a weight-decay "
             f"level ({s.get('n_wd_levels_mixed', 0)} levels with both saturated and unsaturated runs); {s['n_rank_drop_late']} lose erank over the last 20%; median "
             f"final erank {num(s['median_erank'])}%. Saturated runs by design: " + ", ".join(
            f"{d} {v['n_sat']}/{v['n_runs']}" for d, v in an["saturation_by_design"].items())
        + f". Pooled over all {sa['n_runs']} runs of every design (low = below {num(sa['median_erank'])}%): low/saturated "
          f"{sa['low_sat']}, low/unsaturated {sa['low_nosat']}, high/saturated {sa['high_sat']}, high/unsaturated "
          f"{sa['high_nosat']}, gap {num(sa['erank_gap_nosat_minus_sat'])} points — not the claim's basis: the unsaturated "
          "side is then dominated by barely trained runs near the full-rank initialization, which cannot saturate.")
    if probe.height:
        rep.table("Design 3: saturation probe, per run", probe_table(probe, hist),
                  note="The probe's learning curves (below) are the recorded curves that show whether its budget "
                       "reaches the saturation regime; the probe's setting was fixed beforehand from an exploratory "
                       "curve of the same probe (params.yaml comment).")
        rep.figure("saturation_probe", fig_probe(hist, probe), "Saturation probe: in-domain val loss and erank vs step")
        ph = hist.filter(pl.col("run").is_in(probe["run"].to_list())).select("step", "run", "val_loss").sort("run", "step")
        rep.plot("saturation_probe", ph, x="step", y="val_loss", series="run",
                 title="saturation probe, in-domain val loss vs step")
    agree = pl.DataFrame([{"metric": k, "Spearman ρ with erank(W_U)": v} for k, v in an["agreement"].items()])
    rep.table("Agreement of the other geometry metrics with erank (equal-token runs)", agree)
    b = an["best"]
    rep.section("Best models", "Per seed, the main block's lowest-ID-loss run and where its erank ranks among that "
                f"seed's runs (1 = highest): {', '.join(f'{r} (rank {k})' for r, k in zip(b['best_run'], b['best_erank_rank']))}; "
                f"highest-erank run per seed: {', '.join(b['top_erank_run'])}.")
    rep.plot("erank_vs_loss", tok.select("erank", "val_loss", "ood_loss").sort("erank"), x="erank",
             y=["val_loss", "ood_loss"], title="loss vs erank (equal-token runs)")
    bym = main.group_by("batch_size", maintain_order=True).agg(pl.col("erank").mean(), pl.col("erank_sq").mean()).sort("batch_size")
    rep.plot("erank_vs_batch", bym, x="batch_size", y=["erank", "erank_sq"], title="erank vs batch size (main block)")
    dv, do = an["delta_r2"]["val_loss"]["erank"], an["delta_r2"]["ood_loss"]["erank"]
    steps = sorted({int(x) for x in main["steps"].to_list()})
    threats(rep, an, g, ini, s, dv, do, steps, probe, cfg.claims)
    deviations(rep)
    rep.section("Discussion", """
The paper trains 108 models up to 75M non-embedding parameters on 8–128B Pile tokens and finds raw ρ ≈ −0.7 between
erank and loss that drops to ≈ −0.13 (n.s.) with the hyperparameters partialled out, with ΔR² ≈ 0; saturation with rank
collapse appears in a single small model (Pythia-14M). This miniature trains two tiny byte-level widths for at most a
few hundred steps on fresh data: those runs are far from convergence, so batch size at equal tokens mostly trades the
number of optimizer steps against gradient noise (hence the matched-loss and equal-steps designs beside it), and late
saturation only appears where data is repeated (the probe). The vocabulary (256 bytes) is only 8–16× the width, unlike
the paper's 50k-vs-512, so erank sits near the maximal rank more easily. Quantization and fine-tuning evaluations are
not reproduced.
""")
    metrics = {k: an[k] for k in ("grid", "n_runs", "erank_effects", "erank_sq_effects", "corr", "delta_r2",
                                  "saturation", "saturation_all", "saturation_by_design", "agreement", "best", "init", "matched_loss",
                                  "controls", "equal_steps", "equal_steps_loss", "delta_r2_5fold", "matched_loss_steps", "dense_steps") if k in an}
    rep.finish(CLAIMS, metrics)
