"""report: claims, VRMSE-vs-step per arm, energy spectra with the patch frequency, a rollout frame grid.

    python -m stages report walrus
"""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import polars as pl  # noqa: E402
from pydantic import Field  # noqa: E402

from stages.common.claims import Better, Param, Within  # noqa: E402
from stages.common.config import ReportConfig  # noqa: E402
from stages.common.paths import read_json  # noqa: E402
from stages.common.reporting import Report  # noqa: E402
from stages.common.runner import StageContext  # noqa: E402


class Config(ReportConfig):
    one_step_delta: float = Field(0.05, gt=0, le=10.0, description="'nearly unchanged' one-step VRMSE band")
    tok_delta: float = Field(0.1, gt=0, le=10.0, description="band for 'adaptive tokenization matches fixed' "
                                                            "(long-horizon VRMSE on the highest resolution)")


def ablation_claims(cfg: Config, arms) -> list:
    """Each ablation against the official configuration (jitter_on), seed-aware, on long-horizon VRMSE."""
    out = []
    if "jitter_on" not in arms:
        return out
    if "jitter_patch" in arms:
        out.append(Better("domain_shift_beats_patch_shift", "The official whole-domain shift U{-(N/2-1)..N/2-1} "
                          "gives lower long-horizon VRMSE than a patch-scale shift U{-(p/2-1)..p/2-1}",
                          a="arms.jitter_on.long", b="arms.jitter_patch.long", higher_is_better=False,
                          refuted_by="jitter_patch's long-horizon VRMSE below jitter_on's beyond 2 s.e. on a "
                                     "majority of seeds", kind="finding"))
    if "jitter_no_roll" in arms:
        out.append(Better("token_roll_helps", "The per-block token roll lowers long-horizon VRMSE (vs the same "
                          "domain shift without it)",
                          a="arms.jitter_on.long", b="arms.jitter_no_roll.long", higher_is_better=False,
                          refuted_by="jitter_no_roll's long-horizon VRMSE below jitter_on's beyond 2 s.e. on a "
                                     "majority of seeds", kind="finding"))
    if "fixed_tok" in arms:
        out.append(Within("adaptive_tok_matches_fixed", f"Compute-adaptive tokenization (fixed token count per "
                          f"axis) keeps long-horizon VRMSE at the highest resolution within {cfg.tok_delta} of "
                          f"fixed patch tokenization, which spends 4x the tokens there",
                          a="arms.jitter_on.long_hi", b="arms.fixed_tok.long_hi", delta=Param(cfg.tok_delta, "report.tok_delta"),
                          refuted_by=f"long-horizon VRMSE on the highest-resolution groups differing by more "
                                     f"than {cfg.tok_delta} between adaptive and fixed tokenization", kind="finding"))
    return out


def claims(cfg: Config, has_transfer: bool, arms=("jitter_off", "jitter_on")):
    out = [
        Better("jitter_lowers_long_vrmse", "Patch jittering lowers long-horizon rollout VRMSE",
               a="arms.jitter_on.long", b="arms.jitter_off.long", higher_is_better=False,
               refuted_by="jitter_on's mean VRMSE over the last rollout steps above jitter_off's beyond 2 s.e. "
                          "on a majority of seeds", kind="finding"),
        Better("jitter_suppresses_patch_peaks", "Jittering suppresses spectral power error at the patch frequency",
               a="arms.jitter_on.patch_excess", b="arms.jitter_off.patch_excess", higher_is_better=False,
               refuted_by="a larger |log10 P_pred/P_true| on the N/p Fourier lines with jitter than without", kind="finding"),
        Within("one_step_nearly_unchanged", "One-step error is nearly unchanged by jittering",
               a="arms.jitter_on.one_step", b="arms.jitter_off.one_step", delta=Param(cfg.one_step_delta, "report.one_step_delta"),
               refuted_by=f"one-step VRMSE differing by more than {cfg.one_step_delta} between the arms", kind="finding"),
        Better("model_beats_persistence", "The trained model beats the trivial persistence predictor at one step",
               a="arms.jitter_on.one_step", b="persistence.pretrain.one_step", higher_is_better=False,
               refuted_by="one-step VRMSE no better than repeating the last frame", kind="finding"),
    ]
    if has_transfer:
        out.append(Better("pretraining_transfers", "Multi-scenario pretraining + fine-tune beats training from "
                          "scratch on a held-out scenario",
                          a="transfer.finetune.mean", b="transfer.scratch.mean", higher_is_better=False,
                          refuted_by="fine-tuned rollout VRMSE (mean over steps) not below scratch's", kind="finding"))
    return out + ablation_claims(cfg, arms)


def run(cfg: Config, ctx: StageContext) -> None:
    prep, trn, ev = ctx.input("prepare"), ctx.input("train"), ctx.input("evaluate")
    meta, tinfo, res = read_json(prep / "meta.json"), read_json(trn / "train.json"), read_json(ev / "evaluate.json")
    stats = read_json(prep / "stats.json")
    R = res["rollout_steps"]
    has_transfer = bool(res["transfer"])
    metrics = {"arms": res["arms"], "transfer": res["transfer"], "persistence": res["persistence"],
               "seeds": [e["seed"] for e in next(iter(tinfo["arms"].values()))], "rollout_steps": R}
    rep = Report(ctx, "Walrus: patch jittering for stable long rollouts (miniature)",
                 "Randomly rolling the patch grid (patch jittering) before the hMLP encoder and undoing it after "
                 "the decoder breaks the aliasing that a fixed downsampling grid accumulates at the patch "
                 "frequency; it improves long-horizon rollout stability (17 of 19 datasets) while leaving "
                 "one-step error nearly unchanged. Multi-scenario pretraining transfers to new physics.")
    rep.section("Setup", f"""
Data: pseudo-spectral torch solvers (IF-RK4, 2/3 dealiasing) for {', '.join(meta['scenarios'])} on the periodic
square at {' and '.join(f'{n}²' for n in meta['resolutions'])}; {meta['n_train']} train / {meta['n_test']} test
trajectories of {meta['n_frames']} frames per (scenario, resolution), two fields each, stored as an HF
`datasets` DatasetDict with per-field statistics. Model: hMLP encoder (conv k8, conv k4, RMS-norm + SiLU,
no bias; strides chosen so {meta['tokens_per_axis']} tokens per axis at every resolution), {tinfo['config']['depth']}
space-time blocks (causal time attention with relative bias and QK-norm, then space attention ∥ SwiGLU
with axial RoPE and QK-norm), d = {tinfo['config']['d']}, mirrored decoder; context {meta['context']} frames;
Δu prediction with per-sample per-field RMS normalisation and L1 on the normalised deltas. Arms:
{', '.join(tinfo['arms'])}, seeds {metrics['seeds']}; pretraining on {', '.join(tinfo['pretrain_groups'])};
held-out scenario `{tinfo['held_out']}` for transfer. Rollouts of {R} steps from the first {meta['context']}
frames of each test trajectory, jitter on at evaluation (as the official code).""")
    rows = []
    for arm, s in {**res["arms"], **{f"transfer:{k}": v for k, v in res["transfer"].items()}}.items():
        rows.append({"arm": arm, **{k: float(np.mean(v)) for k, v in s.items()},
                     **{f"{k}_sd": float(np.std(v)) for k, v in s.items() if k in ("long", "one_step")}})
    for name, s in res["persistence"].items():
        rows.append({"arm": f"persistence ({name})", **s})
    rep.table("Results", pl.DataFrame(rows, infer_schema_length=None),
              note="VRMSE averaged over groups, test trajectories and seeds (sd over seeds). `long` = mean of the "
                   "last rollout steps; `patch_excess` = |log10 P_pred/P_true| on the Fourier lines kx or ky = m·N/p; "
                   "`spectrum_err` = mean_k |log10 E_pred(k)/E_true(k)| at the last steps.")
    rep.table("Data statistics (train split, per field)", pl.DataFrame([
        {"group": k, "fields": "/".join(v["fields"]), "rms": " / ".join(f"{x:.3g}" for x in v["rms"]),
         "delta_rms": " / ".join(f"{x:.3g}" for x in v["delta_rms"]), "frame_dt": v["frame_dt"]}
        for k, v in stats.items()]))

    # figure 1: VRMSE vs step per arm
    steps = np.arange(1, R + 1)
    fig, ax = plt.subplots(1, 2 if has_transfer else 1, figsize=(11 if has_transfer else 6, 4), squeeze=False)
    plot_cols = {"step": steps}
    for name, curves in res["curves"].items():
        c = np.array(curves)
        target = ax[0, 1] if (has_transfer and (name in res["transfer"] or name == "persistence_held_out")) else ax[0, 0]
        if name == "persistence_held_out" and not has_transfer:
            continue
        target.plot(steps, c.mean(0), label=name, ls="--" if name.startswith("persistence") else "-")
        if len(c) > 1:
            target.fill_between(steps, c.min(0), c.max(0), alpha=0.15)
        plot_cols[name] = c.mean(0)
    for a, t in zip(ax[0], ["pretraining scenarios", f"held-out: {tinfo['held_out']}"]):
        a.set(xlabel="rollout step", ylabel="VRMSE", title=t, yscale="log")
        a.legend(fontsize=7)
    rep.figure("vrmse_vs_step", fig, "VRMSE(t) per arm (mean over seeds, band = seed range); dashed: persistence.")
    if "jitter_on" in res["arms"] and len(res["arms"]) > 1:
        # figure 1b: each arm relative to jitter_on, paired per seed (the ablations are small against VRMSE(t))
        fig, a = plt.subplots(figsize=(6.5, 4))
        ref = np.array(res["curves"]["jitter_on"])
        for name in res["arms"]:
            if name == "jitter_on":
                continue
            r = np.array(res["curves"][name]) / ref                     # (seeds, R), same seed order
            a.plot(steps, r.mean(0), label=name)
            if len(r) > 1:
                a.fill_between(steps, r.min(0), r.max(0), alpha=0.15)
            plot_cols[f"{name}_over_jitter_on"] = r.mean(0)
        a.axhline(1.0, color="k", lw=1)
        a.set(xlabel="rollout step", ylabel="VRMSE(arm) / VRMSE(jitter_on)", title="ablations vs jitter_on (pretraining scenarios)")
        a.legend(fontsize=7)
        rep.figure("vrmse_ratio_vs_step", fig, "VRMSE(t) of each arm divided by jitter_on's, per seed, then mean "
                                              "over seeds (band = seed range); above 1 = worse than jitter_on.")
    rep.plot("vrmse_vs_step", pl.DataFrame({k: list(map(float, v)) for k, v in plot_cols.items()}), x="step",
             title="VRMSE vs rollout step")

    # figure 2: energy spectra with the patch frequency marked
    groups = res["pretrain_groups"]
    fig, axes = plt.subplots(1, len(groups), figsize=(3.6 * len(groups), 3.4), squeeze=False)
    for a, g in zip(axes[0], groups):
        a.loglog(np.arange(1, len(res["spectra"]["truth"][g])), res["spectra"]["truth"][g][1:], "k", lw=2, label="truth")
        for arm in res["arms"]:
            sp = np.mean([res["spectra"][arm][s][g] for s in res["spectra"][arm]], 0)
            a.loglog(np.arange(1, len(sp)), sp[1:], label=arm)
        n_tok = next(iter(res["groups"]["jitter_on" if "jitter_on" in res["groups"] else next(iter(res["groups"]))].values()))[g]["n_tok"]
        n = int(g.rsplit("_", 1)[1])
        for m in range(1, n // 2 // n_tok + 1):
            a.axvline(m * n_tok, color="r", ls=":", lw=1)
        a.set(title=g, xlabel="k")
    axes[0, 0].set_ylabel("E(k), last steps")
    axes[0, 0].legend(fontsize=7)
    rep.figure("energy_spectra", fig, "Isotropic energy spectra at the end of the rollout; red dotted: "
                                      "multiples of the patch frequency N/p.")

    # figure 3: rollout frame grid
    fr = np.load(ev / "frames.npz")
    rows_ = [k for k in ("truth", "jitter_off", "jitter_on") if k in fr.files]
    fsteps = fr["steps"]
    fig, axes = plt.subplots(len(rows_), len(fsteps), figsize=(2.2 * len(fsteps), 2.2 * len(rows_)), squeeze=False)
    vmax = float(np.abs(fr["truth"]).max())
    for i, k in enumerate(rows_):
        for j, s in enumerate(fsteps):
            axes[i, j].imshow(fr[k][j], cmap="RdBu_r", vmin=-vmax, vmax=vmax)
            axes[i, j].set_xticks([]), axes[i, j].set_yticks([])
            if i == 0:
                axes[i, j].set_title(f"step {s}")
        axes[i, 0].set_ylabel(k)
    rep.figure("rollout_frames", fig, f"First field of test trajectory 0 of {res['frame_group']} (seed "
                                      f"{metrics['seeds'][0]}): truth / jitter off / jitter on.")

    tc = tinfo["config"]
    multi = meta.get("multires_scenarios")
    hi_note = ("every scenario" if multi is None else ", ".join(multi) + " only")
    rep.section("Deviations", f"""
| what | paper / official code | here | why |
| --- | --- | --- | --- |
| data | 19 scenarios of The Well etc., up to 3D | 4 periodic 2D spectral-solver scenarios, 2 fields each (Kolmogorov stored as velocity); {meta['n_train']} train / {meta['n_test']} test trajectories of {meta['n_frames']} frames per group | laptop scale, no downloads |
| resolutions | many per dataset | {' and '.join(f'{n}²' for n in meta['resolutions'])}; the second resolution for {hi_note} | the 64² data exists for what needs it: compute-adaptive vs fixed tokenization; the rest costs CPU without testing anything new |
| size | d 1408, 40 blocks, 16 heads, 6 frames, 32 tokens/axis | d {tc['d']}, {tc['depth']} blocks, {tc['heads']} heads, {meta['context']} frames, {meta['tokens_per_axis']} tokens/axis | 2 CPU cores, minutes |
| training | 201 epochs x 2000 batches of 2x4, AdamW 2e-4, inverse-sqrt LR, Rot90 aug, loss x100 | {tinfo.get('steps', '?')} steps of batch {tinfo.get('batch_size', '?')} per arm x seed, AdamW, warmup + inverse-sqrt, no augmentation, loss x1 | budget; the step count was chosen from a learning curve measured outside the pipeline (one seed): long-horizon VRMSE of both jitter arms was lowest near 500 steps and rose again by 1000-1500 steps (Kolmogorov-32 rollouts blow up) while one-step error kept falling |
| jitter | periodic fixed jitter U{{-(N/2-1)..N/2-1}} + per-block token roll, on at eval | same; ablations: patch-scale shift, no token roll, fixed tokenization | — |
| hMLP strides | N//32 -> {{4:(2,2), 8:(4,2), 16:(4,4)}}, kernels (8,4) | same table with N//8 | fewer tokens |
| RoPE / time bias | axial RoPE linspace(-1,1); T5 bucketed bias | axial RoPE with frequencies π·(1..hd/4); one learned bias per lag | simpler |
| fine-tune | dataset-level RMS normalisation, lr 1e-4, 51 epochs | same per-sample RMS as pretraining, {tinfo.get('ft_steps', '?')} steps on {tinfo.get('ft_traj', '?')} trajectories | budget |
| eval | batch 1, start t=17, 200 steps | {meta['n_test']} test trajectories per group, start t=0, {R} steps | short trajectories |
""")
    arm_ref = "jitter_on" if "jitter_on" in res["arms"] else next(iter(res["arms"]))
    pers = res["persistence"].get("pretrain", {})
    gain = {k: 100 * (1 - float(np.mean(res["arms"][arm_ref][k])) / pers[k]) for k in ("one_step", "long")} if pers else {}
    pc = np.array(res["curves"].get("persistence_pretrain", [[0.0]])[0])
    cross = int(np.argmax(pc >= 1.0)) + 1 if (pc >= 1.0).any() else f"> {R} (never)"
    runtime = ctx.upstream_runtimes()
    total = sum(v for v in runtime.values() if v is not None)
    rep.section("Reading the numbers", (
        f"`{arm_ref}` improves on persistence by {gain.get('one_step', float('nan')):.1f}% at one step and "
        f"{gain.get('long', float('nan')):.1f}% over the long-horizon window (last {res.get('long_window', '')} steps) of the "
        f"{R}-step rollouts. Averaged over the pretraining groups, persistence VRMSE passes 1 at step "
        f"{cross} (the flows decorrelate from their start), so the long-horizon number mostly measures whether a rollout stays "
        f"bounded and keeps the right variance, not whether it tracks the truth. All five arms train at this "
        f"profile with the same seeds, data stream and step count; the ablation verdicts compare each with "
        f"`jitter_on` seed by seed. Upstream stages took {total:.0f} s of wall time here (a 2-core machine "
        f"shared with other jobs).") if gain else "")
    if res["transfer"] and res["persistence"].get("held_out"):
        ph = res["persistence"]["held_out"]
        worse = [k for k, v in res["transfer"].items() if float(np.mean(v["long"])) > ph["long"]]
        rep.section("Transfer against the trivial predictor", (
            f"On the held-out `{tinfo['held_out']}` scenario, persistence has long-horizon VRMSE {ph['long']:.3g}; "
            + ("; ".join(f"`{k}` {float(np.mean(v['long'])):.3g}" for k, v in res["transfer"].items()))
            + (f". {' and '.join(worse)} do not beat persistence over the long-horizon window (they do at one step: "
               + "; ".join(f"`{k}` {float(np.mean(v['one_step'])):.3g}" for k, v in res["transfer"].items())
               + f" vs {ph['one_step']:.3g})." if worse else ".")))
    rep.section("Discussion", """
The paper pretrains a 1.3B-parameter model on 19 datasets and finds that patch jittering improves
long-horizon stability on 17 of them, removing the spectral spikes at the patch frequency that a fixed
patch grid accumulates. This miniature keeps the mechanism exactly (official periodic fixed jitter with
the per-block token roll, jitter on at evaluation, per-sample RMS normalisation, L1 on normalised deltas,
VRMSE on raw fields) and ablates its parts (patch-scale instead of whole-domain shift, no per-block token
roll, fixed instead of compute-adaptive tokenization), but trains tiny models for a few hundred CPU steps
on four simple periodic scenarios from a few trajectories each. Their rollout errors are dominated by
model error and overfitting to eight training trajectories, not by the slow accumulation of
patch-frequency aliasing over hundreds of steps that the paper targets, so a null or reversed verdict
here says little about the full-scale effect; the `full` profile scales the same code up (bigger model,
64 trajectories per group, all scenarios at both resolutions, 100-step rollouts).
""")
    rep.finish(claims(cfg, has_transfer, list(res["arms"])), metrics)
