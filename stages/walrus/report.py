"""report: per-group jitter findings (long-horizon VRMSE, patch-line artifact), bands, transfer, checks,
VRMSE vs horizon with seed bands, the learning curve, patch-line statistic vs horizon, spectra, frames.

Claims read per-seed metrics built here from evaluate.json (no threshold is computed: every min effect,
band and level is under papers.walrus.report.claims in params.yaml; the horizon of the patch finding
and the transfer window are report.patch_horizon / report.transfer_window). Per-group claims are
generated for every pretraining group; a pooled claim uses the per-seed mean over groups only when every
group's mean gap has the same sign (otherwise its values are null and it is inconclusive).

    python -m stages report walrus
"""
from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import polars as pl  # noqa: E402
from pydantic import Field  # noqa: E402

from stages.common.claims import Better, Bound, Near  # noqa: E402
from stages.common.config import ReportConfig  # noqa: E402
from stages.common.paths import read_json  # noqa: E402
from stages.common.reporting import Report  # noqa: E402
from stages.common.runner import StageContext  # noqa: E402

PERIODIC_NAME = "periodic"


class Config(ReportConfig):
    patch_horizon: int = Field(60, ge=1, le=1000, description="rollout step at which the patch-line findings "
                                                              "read the artifact statistic (one of evaluate.patch_horizons)")
    transfer_window: int = Field(10, ge=1, le=1000, description="transfer finding: mean VRMSE over the first "
                                                                "this many rollout steps on the held-out scenario")


# ---------------------------------------------------------------------------------------------
# metrics: per-seed (and per-item) values the claims read
# ---------------------------------------------------------------------------------------------
def _per_seed(res: dict, arm: str, group: str, field: str, seeds: list[str]):
    return [res["groups"][arm][group][s][field] for s in seeds]


def pooled_gap(per_group_a: dict[str, list[float]], per_group_b: dict[str, list[float]], lower_is_better: bool):
    """Per-seed values of a and b averaged over groups, or None per seed when the groups' mean gaps
    (b - a for lower-is-better) do not all have the same sign."""
    signs = set()
    for g in per_group_a:
        gap = float(np.mean(per_group_b[g]) - np.mean(per_group_a[g]))
        gap = gap if lower_is_better else -gap
        signs.add(np.sign(gap))
    n = len(next(iter(per_group_a.values())))
    if len(signs) != 1 or 0 in signs:
        return [None] * n, [None] * n, False
    a = [float(np.mean([per_group_a[g][k] for g in per_group_a])) for k in range(n)]
    b = [float(np.mean([per_group_b[g][k] for g in per_group_b])) for k in range(n)]
    return a, b, True


def build_metrics(res: dict, tinfo: dict, cfg: Config) -> dict:
    groups = res["pretrain_groups"]
    arms = list(res["groups"])
    seeds = {a: [str(e["seed"]) for e in tinfo["arms"][a]] for a in arms}
    h = str(cfg.patch_horizon)
    m: dict = {"groups": {}, "pooled": {}, "rel": {}, "persistence": {}, "transfer": {}, "seeds": seeds,
               "rollout_steps": res["rollout_steps"], "patch_horizon": cfg.patch_horizon}
    for g in groups:
        m["groups"][g] = {"arms": {}}
        for a in arms:
            s = seeds[a]
            log_long = _per_seed(res, a, g, "log_long", s)
            m["groups"][g]["arms"][a] = {
                "log_long": log_long,                                       # seeds x test trajectories
                "long": [float(np.mean(10 ** np.array(x))) for x in log_long],
                "one_step": [float(np.mean(x)) for x in _per_seed(res, a, g, "one_step", s)],
                "patch": [r[h] for r in _per_seed(res, a, g, "patch", s)]}
        p = res["persistence"][g]
        m["persistence"][g] = {"one_step": float(np.mean(p["one_step"])), "long": float(np.mean(10 ** np.array(p["log_long"])))}
    # pooled over groups (per seed), only when every group agrees in sign
    for a, b in (("jitter_on", "jitter_off"), ("jitter_patch", "jitter_off")):
        if a not in arms or b not in arms:
            continue
        n = min(len(seeds[a]), len(seeds[b]))
        for field in ("log_long", "patch"):
            ga = {g: [float(np.mean(v)) for v in m["groups"][g]["arms"][a][field][:n]] for g in groups}
            gb = {g: [float(np.mean(v)) for v in m["groups"][g]["arms"][b][field][:n]] for g in groups}
            pa, pb, agree = pooled_gap(ga, gb, lower_is_better=True)
            m["pooled"].setdefault(f"{a}_vs_{b}", {})[field] = {"a": pa, "b": pb, "groups_agree": agree}
    for a in arms:
        n = len(seeds[a])
        m["pooled"].setdefault(a, {})["one_step"] = [
            float(np.mean([m["groups"][g]["arms"][a]["one_step"][k] for g in groups])) for k in range(n)]
        m["pooled"][a]["long"] = [float(np.mean([m["groups"][g]["arms"][a]["long"][k] for g in groups]))
                                  for k in range(n)]
    m["persistence"]["pooled"] = {k: float(np.mean([m["persistence"][g][k] for g in groups]))
                                  for k in ("one_step", "long")}
    # relative one-step change and skill over persistence (per seed)
    if "jitter_on" in arms and "jitter_off" in arms:
        on, off = m["pooled"]["jitter_on"]["one_step"], m["pooled"]["jitter_off"]["one_step"]
        m["rel"]["one_step_on_vs_off"] = [x / y - 1 for x, y in zip(on, off)]
        pers = m["persistence"]["pooled"]
        m["rel"]["skill_off"] = [1 - x / pers["one_step"] for x in off]
        m["rel"]["off_long_over_persistence"] = [x / pers["long"] for x in m["pooled"]["jitter_off"]["long"]]
    if "fixed_tok" in arms and "jitter_on" in arms:
        hi = [g for g in groups if int(g.rsplit("_", 1)[1]) == max(int(x.rsplit("_", 1)[1]) for x in groups)]
        n = len(seeds["fixed_tok"])
        ada = [float(np.mean([m["groups"][g]["arms"]["jitter_on"]["one_step"][k] for g in hi])) for k in range(n)]
        fix = [float(np.mean([m["groups"][g]["arms"]["fixed_tok"]["one_step"][k] for g in hi])) for k in range(n)]
        m["rel"]["one_step_adaptive_vs_fixed_hi"] = [x / y - 1 for x, y in zip(ada, fix)]
        m["hi_groups"] = hi
    # transfer: log10 of the mean VRMSE over the first transfer_window steps, per held-out test trajectory
    for kind, per_group in res["transfer"].items():
        held = res["held_groups"]
        w = cfg.transfer_window
        seeds_t = sorted(per_group[held[0]], key=int)
        items = [[math.log10(float(np.mean(traj[:w]))) for g in held for traj in per_group[g][s]["items"]]
                 for s in seeds_t]
        m["transfer"][kind] = {"log_short": items,
                               "short": [float(np.mean(10 ** np.array(x))) for x in items]}
    if res["transfer"]:
        m["persistence"]["held_out"] = {"short": float(np.mean([np.mean(res["persistence"][g]["curve"][:cfg.transfer_window])
                                                                 for g in res["held_groups"]]))}
    return m


# ---------------------------------------------------------------------------------------------
# claims
# ---------------------------------------------------------------------------------------------
def claims(groups: list[str], arms: list[str], has_transfer: bool, bcs: dict) -> list:
    out = []
    wall = [g for g in groups if any(pair[0] != PERIODIC_NAME for pair in bcs[g])]
    if "jitter_on" in arms and "jitter_off" in arms:
        for g in groups:
            kind_txt = "wall-bounded" if g in wall else "periodic"
            out.append(Better(
                f"jitter_lowers_long_vrmse_{g}", f"Patch jittering lowers long-horizon rollout VRMSE on {g} "
                f"({kind_txt})", kind="finding",
                a=f"groups.{g}.arms.jitter_on.log_long", b=f"groups.{g}.arms.jitter_off.log_long",
                higher_is_better=False,
                refuted_by="jitter_on's log10 long-window VRMSE (per test trajectory, paired) not below jitter_off's "
                           "by the min effect; fails when the upper t-bound of the gain is below it"))
            out.append(Better(
                f"jitter_suppresses_patch_lines_{g}", f"Jittering lowers the excess power on the patch-frequency "
                f"lines k = m·N/p (relative to the neighbouring lines, prediction minus truth) on {g}", kind="finding",
                a=f"groups.{g}.arms.jitter_on.patch", b=f"groups.{g}.arms.jitter_off.patch", higher_is_better=False,
                refuted_by="jitter_on's patch-line excess (log10) not below jitter_off's by the min effect at the "
                           "fixed horizon"))
        out.append(Better(
            "jitter_lowers_long_vrmse", "Pooled over groups (only when every group agrees in sign): patch "
            "jittering lowers long-horizon rollout VRMSE", kind="finding",
            a="pooled.jitter_on_vs_jitter_off.log_long.a", b="pooled.jitter_on_vs_jitter_off.log_long.b",
            higher_is_better=False,
            refuted_by="a pooled gain below the min effect (upper t-bound); null (inconclusive) when the groups disagree"))
        out.append(Better(
            "jitter_suppresses_patch_lines", "Pooled over groups (only when every group agrees in sign): "
            "jittering lowers the patch-line excess", kind="finding",
            a="pooled.jitter_on_vs_jitter_off.patch.a", b="pooled.jitter_on_vs_jitter_off.patch.b",
            higher_is_better=False,
            refuted_by="a pooled reduction below the min effect; null (inconclusive) when the groups disagree"))
        out.append(Near(
            "one_step_nearly_unchanged", "One-step error is nearly unchanged by jittering (relative change of "
            "one-step VRMSE within the band)", kind="finding", value="rel.one_step_on_vs_off",
            refuted_by="jitter_on's one-step VRMSE differing from jitter_off's by more than the relative band"))
        out.append(Bound(
            "one_step_band_narrower_than_skill", "The one-step band is narrower than the model's relative gain "
            "over persistence at one step (so 'nearly unchanged' is not wider than the effect it bounds)",
            kind="check", value="rel.skill_off",
            refuted_by="jitter_off's one-step skill over persistence not above the band"))
        out.append(Bound(
            "unjittered_rollouts_unstable", "Regime: the unjittered model's long-horizon VRMSE exceeds the "
            "trivial persistence predictor's by the factor in params (its rollouts drift off the data)",
            kind="check", value="rel.off_long_over_persistence",
            refuted_by="jitter_off's long-window VRMSE not above the given multiple of persistence's: the horizon "
                       "or training budget does not reach the regime the jitter finding is about"))
        out.append(Better(
            "model_beats_persistence", "Baseline sanity: the unjittered model beats persistence at one step",
            kind="check", a="pooled.jitter_off.one_step", b="persistence.pooled.one_step", higher_is_better=False,
            refuted_by="one-step VRMSE no better than repeating the last frame"))
    if "jitter_patch" in arms and "jitter_off" in arms:
        out.append(Better(
            "patch_jitter_lowers_long_vrmse", "The paper's patch-scale jitter (official non-fixed jitterer, "
            "U{-(p/2-1)..p/2-1}) lowers long-horizon VRMSE, pooled (only when every group agrees in sign)",
            kind="finding", a="pooled.jitter_patch_vs_jitter_off.log_long.a",
            b="pooled.jitter_patch_vs_jitter_off.log_long.b", higher_is_better=False,
            refuted_by="a pooled gain below the min effect; null (inconclusive) when the groups disagree"))
    if "fixed_tok" in arms and "jitter_on" in arms:
        out.append(Near(
            "adaptive_tok_matches_fixed", "Compute-adaptive tokenization (a fixed token count per axis) keeps "
            "one-step VRMSE on the highest resolution within a relative band of fixed-patch tokenization, which "
            "spends 4x the tokens there", kind="finding", value="rel.one_step_adaptive_vs_fixed_hi",
            refuted_by="a relative one-step VRMSE difference outside the band"))
    if has_transfer:
        out.append(Better(
            "pretraining_transfers", "Multi-scenario pretraining + fine-tune beats training from scratch on a "
            "held-out scenario (short-horizon rollout VRMSE)", kind="finding",
            a="transfer.finetune.log_short", b="transfer.scratch.log_short", higher_is_better=False,
            refuted_by="fine-tuned log10 VRMSE over the transfer window not below scratch's by the min effect"))
    return out


# ---------------------------------------------------------------------------------------------
def _band(ax, x, c, label, **kw):
    c = np.asarray(c, dtype=float)
    line = ax.plot(x, c.mean(0), label=label, **kw)[0]
    if len(c) > 1:
        ax.fill_between(x, c.min(0), c.max(0), alpha=0.15, color=line.get_color())
    return line


def run(cfg: Config, ctx: StageContext) -> None:
    prep, trn, ev = ctx.input("prepare"), ctx.input("train"), ctx.input("evaluate")
    meta, tinfo, res = read_json(prep / "meta.json"), read_json(trn / "train.json"), read_json(ev / "evaluate.json")
    stats = read_json(prep / "stats.json")
    from stages.common.config import ConfigError
    if str(cfg.patch_horizon) not in map(str, res["patch_horizons"]):
        raise ConfigError(f"papers.walrus.report.patch_horizon: {cfg.patch_horizon} is not one of "
                          f"evaluate.patch_horizons {res['patch_horizons']}")
    R = res["rollout_steps"]
    if cfg.transfer_window > R:
        raise ConfigError(f"papers.walrus.report.transfer_window: {cfg.transfer_window} exceeds rollout_steps ({R})")
    groups, arms = res["pretrain_groups"], list(res["groups"])
    has_transfer = bool(res["transfer"])
    metrics = build_metrics(res, tinfo, cfg)
    rep = Report(ctx, "Walrus: patch jittering for stable long rollouts (miniature)",
                 "Randomly rolling the patch grid (patch jittering) before the hMLP encoder and undoing it after "
                 "the decoder breaks the aliasing that a fixed downsampling grid accumulates at the patch "
                 "frequency; it improves long-horizon rollout stability (17 of 19 datasets) while leaving "
                 "one-step error nearly unchanged. Multi-scenario pretraining transfers to new physics.")
    tc = tinfo["config"]
    wall = [g for g in groups if any(p[0] != PERIODIC_NAME for p in res["bcs"][g])]
    rep.section("Setup", f"""
Data: pseudo-spectral torch solvers (IF-RK4, 2/3 dealiasing) for {', '.join(meta['scenarios'])} at
{' and '.join(f'{n}²' for n in meta['resolutions'])}; {meta['n_train']} train / {meta['n_val']} validation /
{meta['n_test']} test trajectories of {meta['n_frames']} frames per group, two fields each, stored as an HF
`datasets` DatasetDict. Boundary conditions per group (rows; columns): {'; '.join(f'`{g}` ' + ' / '.join(p[0] for p in res['bcs'][g]) for g in sorted(res['bcs']))}.
`channel` is the wall-bounded scenario (a forced flow between free-slip walls): the model takes the
non-periodic jitter branch there (constant pad p/2 + e, wall flag channel, roll within the pad, no
token roll along the wall axis). Model: hMLP encoder (conv k8, conv k4, RMS-norm + SiLU, no bias, strides
for {meta['tokens_per_axis']} tokens per axis; 3 flag channels: bias, wall, open), {tc['depth']} space-time
blocks, d = {tc['d']}, mirrored decoder; context {meta['context']} frames; Δu prediction with per-sample
per-field RMS normalisation, L1 on normalised deltas. Arms and seeds: {', '.join(f'{a} ({len(metrics["seeds"][a])})' for a in arms)},
each arm's seeds trained together as one vectorized ensemble (member k = the solo run of seed k); {tinfo['steps']}
steps of batch {tinfo['batch_size']}, pretraining on {', '.join(groups)}; held-out scenario `{tinfo['held_out']}`
for transfer. Test rollouts of {R} steps from the first {meta['context']} frames of each of {res['n_eval']}
test trajectories per group, jitter on at evaluation (as the official code).""")

    # ---- results table per group
    rows = []
    for g in groups:
        for a in arms:
            v = metrics["groups"][g]["arms"][a]
            rows.append({"group": g, "arm": a, "seeds": len(v["one_step"]), "one_step": float(np.mean(v["one_step"])),
                         "long": float(np.mean(v["long"])), "long_sd": float(np.std(v["long"])),
                         f"patch@{cfg.patch_horizon}": float(np.mean(v["patch"])),
                         "patch_sd": float(np.std(v["patch"]))})
        p = metrics["persistence"][g]
        rows.append({"group": g, "arm": "persistence", "seeds": None, "one_step": p["one_step"], "long": p["long"],
                     "long_sd": None, f"patch@{cfg.patch_horizon}": None, "patch_sd": None})
    rep.table("Results per group", pl.DataFrame(rows, infer_schema_length=None),
              note=f"Mean over seeds (sd over seeds) of the per-seed means over {res['n_eval']} test trajectories. "
                   f"`long` = mean VRMSE over the last {res['long_window']} of {R} rollout steps; `patch@h` = the "
                   f"patch-line excess at step {cfg.patch_horizon}: log10 of the power on the lines m·N/p relative "
                   "to the lines m·N/p ± 1, prediction minus truth (> 0: excess power on the patch frequency).")

    # ---- figure: VRMSE vs horizon per group, per arm with seed bands
    steps = np.arange(1, R + 1)
    ncol = len(groups) + (1 if has_transfer else 0)
    fig, axes = plt.subplots(1, ncol, figsize=(3.8 * ncol, 3.6), squeeze=False)
    long_rows = []
    for ax, g in zip(axes[0], groups):
        for a in arms:
            curves = [res["groups"][a][g][s]["curve"] for s in metrics["seeds"][a]]
            _band(ax, steps, curves, a)
        ax.plot(steps, res["persistence"][g]["curve"], "k--", lw=1, label="persistence")
        ax.set(title=g + (" (walls)" if g in wall else ""), xlabel="rollout step", yscale="log")
    for a in arms:
        pooled = np.mean([[res["groups"][a][g][s]["curve"] for g in groups] for s in metrics["seeds"][a]], axis=(0, 1))
        long_rows += [{"step": int(t), "series": a, "vrmse": float(v)} for t, v in zip(steps, pooled)]
    pc = np.mean([res["persistence"][g]["curve"] for g in groups], 0)
    long_rows += [{"step": int(t), "series": "persistence", "vrmse": float(v)} for t, v in zip(steps, pc)]
    if has_transfer:
        ax = axes[0, -1]
        for kind, per_group in res["transfer"].items():
            curves = [np.mean([per_group[g][s]["curve"] for g in res["held_groups"]], 0) for s in per_group[res["held_groups"][0]]]
            _band(ax, steps, curves, kind)
            long_rows += [{"step": int(t), "series": f"held-out {kind}", "vrmse": float(v)}
                          for t, v in zip(steps, np.mean(curves, 0))]
        ax.plot(steps, np.mean([res["persistence"][g]["curve"] for g in res["held_groups"]], 0), "k--", lw=1,
                label="persistence")
        ax.set(title=f"held-out {tinfo['held_out']}: transfer", xlabel="rollout step", yscale="log")
    axes[0, 0].set_ylabel("VRMSE")
    axes[0, 0].legend(fontsize=7)
    if has_transfer:
        axes[0, -1].legend(fontsize=7)
    rep.figure("vrmse_vs_step", fig, "Test VRMSE vs rollout step per group and arm: mean over seeds, band = "
                                     "range over seeds; dashed: persistence.")
    rep.plot("vrmse_vs_step", pl.DataFrame(long_rows), x="step", y="vrmse", series="series",
             title="VRMSE vs rollout step (mean over pretraining groups and seeds)")

    # ---- learning curve (validation), recorded by the train stage
    if tinfo.get("curves"):
        fig, axs = plt.subplots(1, 2, figsize=(10, 3.6))
        lc_rows = []
        for a, pts in tinfo["curves"].items():
            st = np.array([p["step"] for p in pts])
            for ax, key in zip(axs, ("one_step", "long")):
                _band(ax, st, np.array([p[key] for p in pts]).T, a, marker="o", ms=3)
            lc_rows += [{"step": int(p["step"]), "series": f"{a} long", "vrmse": float(np.mean(p["long"]))} for p in pts]
            lc_rows += [{"step": int(p["step"]), "series": f"{a} one-step", "vrmse": float(np.mean(p["one_step"]))}
                        for p in pts]
        axs[0].set(title="validation one-step VRMSE", xlabel="training step", yscale="log")
        axs[1].set(title=f"validation VRMSE, last {tinfo['curve_long_window']} of {tinfo['curve_horizon']} rollout steps",
                   xlabel="training step", yscale="log")
        axs[0].legend(fontsize=7)
        rep.figure("learning_curve", fig, "Learning curve recorded by the train stage on the validation trajectories "
                                          "(mean over seeds, band = range): the training length and the rollout horizon "
                                          "in params.yaml were fixed from this curve.")
        rep.plot("learning_curve", pl.DataFrame(lc_rows), x="step", y="vrmse", series="series",
                 title="validation VRMSE vs training step")

    # ---- patch-line statistic vs horizon, per group
    hs = [int(h) for h in res["patch_horizons"]]
    fig, axes = plt.subplots(1, len(groups), figsize=(3.8 * len(groups), 3.4), squeeze=False)
    patch_rows = []
    for ax, g in zip(axes[0], groups):
        for a in arms:
            vals = np.array([[res["groups"][a][g][s]["patch"][str(h)] for h in hs] for s in metrics["seeds"][a]])
            _band(ax, hs, vals, a, marker="o", ms=3)
            patch_rows += [{"horizon": h, "series": f"{a} {g}", "excess": float(v)} for h, v in zip(hs, vals.mean(0))]
        ax.axhline(0, color="k", lw=1)
        ax.axvline(cfg.patch_horizon, color="grey", ls=":", lw=1)
        ax.set(title=g, xlabel="rollout step")
    axes[0, 0].set_ylabel("patch-line excess, log10 (pred − truth)")
    axes[0, 0].legend(fontsize=7)
    rep.figure("patch_line_excess", fig, "Patch-line statistic per group vs horizon: log10 power on the lines "
                                         "m·N/p over the neighbouring lines, prediction minus truth (0: no artifact); "
                                         "dotted: the horizon the findings read.")
    rep.plot("patch_line_excess", pl.DataFrame(patch_rows), x="horizon", y="excess", series="series",
             title="patch-line excess vs horizon (arm, group)")

    # ---- energy spectra with the patch frequency marked (square periodic groups)
    sq = [g for g in groups if g in res["spectra"].get(arms[0], {})]
    if sq:
        fig, axes = plt.subplots(1, len(sq), figsize=(3.6 * len(sq), 3.4), squeeze=False)
        for ax, g in zip(axes[0], sq):
            t = res["spectra"]["truth"][g]
            ax.loglog(np.arange(1, len(t)), t[1:], "k", lw=2, label="truth")
            for a in arms:
                sp = np.mean([res["spectra"][a][g][s] for s in res["spectra"][a][g]], 0)
                ax.loglog(np.arange(1, len(sp)), sp[1:], label=a)
            n_tok = next(iter(res["groups"][arms[0]][g].values()))["n_tok"][1]
            n = int(g.rsplit("_", 1)[1])
            for mm in range(1, n // 2 // n_tok + 1):
                ax.axvline(mm * n_tok, color="r", ls=":", lw=1)
            ax.set(title=g, xlabel="k")
        axes[0, 0].set_ylabel("E(k), last steps")
        axes[0, 0].legend(fontsize=7)
        rep.figure("energy_spectra", fig, "Isotropic energy spectra at the end of the rollout; red dotted: "
                                          "multiples of the patch frequency N/p.")

    # ---- rollout frames
    fr = np.load(ev / "frames.npz")
    rows_ = [k for k in ("truth", "jitter_off", "jitter_on") if k in fr.files]
    if len(rows_) > 1:
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
        rep.figure("rollout_frames", fig, f"First field of test trajectory 0 of {res['frame_group']} (first seed): "
                                          "truth / jitter off / jitter on.")
    rep.table("Data statistics (train split, per field)", pl.DataFrame([
        {"group": k, "bcs": " / ".join(p[0] for p in v["bcs"]), "fields": "/".join(v["fields"]),
         "rms": " / ".join(f"{x:.3g}" for x in v["rms"]),
         "delta_rms": " / ".join(f"{x:.3g}" for x in v["delta_rms"])} for k, v in stats.items()]))
    deviations(rep, meta, tinfo, res)
    reading(rep, metrics, res, tinfo, cfg, groups, arms)
    rep.section("Threats to validity", THREATS)
    rep.section("Discussion", DISCUSSION)
    rep.finish(claims(groups, arms, has_transfer, res["bcs"]), metrics)


def deviations(rep, meta, tinfo, res):
    tc = tinfo["config"]
    multi = meta.get("multires_scenarios")
    rep.section("Deviations", f"""
| what | paper / official code | here | why |
| --- | --- | --- | --- |
| data | 19 scenarios of The Well etc., up to 3D | {len(meta['scenarios'])} 2D spectral-solver scenarios (4 periodic, `channel` wall-bounded with free-slip walls), 2 fields each; {meta['n_train']} train trajectories of {meta['n_frames']} frames per group; The Well's HDF5 only at the `full` profile (loader tested on a fixture) | laptop scale, no downloads |
| resolutions | many per dataset | {' and '.join(f'{n}²' for n in meta['resolutions'])}; the second only for {', '.join(multi) if multi else 'every scenario'} | what compute-adaptive vs fixed tokenization needs |
| size | d 1408, 40 blocks, 16 heads, 6 frames, 32 tokens/axis | d {tc['d']}, {tc['depth']} blocks, {tc['heads']} heads, {meta['context']} frames, {meta['tokens_per_axis']} tokens/axis (patch N/4) | 2 CPU cores; large patches also make the patch-frequency lines low wavenumbers inside the resolved band |
| training | 201 epochs x 2000 batches of 2x4, AdamW 2e-4, inverse-sqrt LR, Rot90, loss x100 | {tinfo['steps']} steps of batch {tinfo['batch_size']} per seed (seeds as one vectorized ensemble), AdamW 2e-3, warmup + inverse-sqrt, no augmentation, loss x1 | budget; steps fixed from the learning curve this pipeline records (figure above) |
| batches | one dataset per batch, uniform | one group per step from a schedule shared by all seeds and arms (needed to stack the ensemble); windows and jitter draws per seed | vectorized seeds |
| jitter (on) | FixedPatchJittererBoundaryPad: periodic shift U{{-(N/2-1)..N/2-1}}, walls: zero pad p/2+e, shift within it, 3 flag channels; per-block token roll on periodic axes; on at eval | same (index maps equal the official pad/roll order on every shift, tests) | — |
| jitter (patch arm) | PatchJittererBoundaryPad: pad, then roll the padded grid U{{-(p/2-1)..p/2-1}}; un-jitter: roll back, crop | same (tests on every shift) | the paper's description of the method |
| hMLP strides | N//32 -> {{4:(2,2), 8:(4,2), 16:(4,4)}}, kernels (8,4) | same table with N//{meta['tokens_per_axis']} | fewer tokens |
| learned boundary tokens | the official jitterer's padding is constant 0 plus flag channels | same | — |
| RoPE / time bias | axial RoPE linspace(-1,1); T5 bucketed bias | axial RoPE with frequencies π·(1..hd/4); one learned bias per lag | simpler |
| fine-tune | dataset-level RMS normalisation, lr 1e-4, 51 epochs | per-sample RMS as pretraining, {tinfo.get('ft_steps', '?')} steps on {tinfo.get('ft_traj', '?')} trajectories | budget |
| eval | batch 1, start t=17, 200 steps | {res['n_eval']} test trajectories per group, start t=0, {res['rollout_steps']} steps | short trajectories |
""")


def reading(rep, metrics, res, tinfo, cfg, groups, arms):
    lines = []
    if "jitter_on" in arms and "jitter_off" in arms:
        for g in groups:
            on, off = metrics["groups"][g]["arms"]["jitter_on"], metrics["groups"][g]["arms"]["jitter_off"]
            lines.append(f"- `{g}`: long-window VRMSE {np.mean(off['long']):.3g} (off) vs {np.mean(on['long']):.3g} "
                         f"(on), persistence {metrics['persistence'][g]['long']:.3g}; patch-line excess at step "
                         f"{cfg.patch_horizon}: {np.mean(off['patch']):+.3f} (off) vs {np.mean(on['patch']):+.3f} (on).")
        for field, what in (("log_long", "long-horizon VRMSE"), ("patch", "patch-line excess")):
            agree = metrics["pooled"]["jitter_on_vs_jitter_off"][field]["groups_agree"]
            lines.append(f"- Pooled {what}: the groups {'agree' if agree else 'do not agree'} in the sign of the "
                         f"jitter effect{'' if agree else ', so the pooled claim reads null and is inconclusive by rule'}.")
    lines.append(f"- Rollouts that became non-finite (counted at the VRMSE cap): {res['nonfinite_rollouts']}.")
    rep.section("Reading the numbers", "\n".join(lines))


THREATS = """
Red-team pass on this design (what was fixed is in the design; what remains is listed):

- **Scale.** Tiny models (d 32, 2 blocks) trained for a few hundred steps on 8 trajectories per group:
  their rollout error is dominated by model error, not by the slow accumulation of patch-frequency
  aliasing over hundreds of steps the paper targets. A null or reversed verdict here says little about
  the full-scale effect; the `full` profile runs the same code at a larger size and on The Well.
- **Regime.** The jitter findings are only meaningful where the unjittered rollouts actually degrade;
  the check `unjittered_rollouts_unstable` states whether the committed budget reaches that regime. A
  probe outside this run (`reports/studies/walrus_regime_probe.md`: the train stage's own code and
  learning curve, 200-step horizon) found no unstable regime at this scale: with 5x the training
  (2,500 steps), a 3.3x longer horizon, or a model with ~8x the parameters (d 64, 4 blocks), the
  unjittered rollouts stay bounded and end at or just below persistence's error on every group, while
  one-step error keeps falling. So the long-horizon jitter verdicts here are read in a regime where
  rollouts decorrelate without blowing up, not the one the paper's claim is about; only the `full`
  profile's scale could reach it.
- **Patch-line statistic.** It reads the marginal spectrum on the lines m·N/p against their neighbours
  m·N/p ± 1 inside the solvers' resolved band; a wall-bounded axis is not periodic, so its FFT leaks
  power across all lines (equally for truth and prediction, which the difference removes only to first
  order). Power is pooled over test trajectories per seed, so its item noise is not in the verdict.
- **Shared group schedule.** All seeds and arms see the same sequence of groups (needed to stack the
  ensemble); seeds differ in windows, jitter draws and initialisation, so between-seed variance omits
  schedule variance.
- **Pooled claims** use the per-seed mean over groups; the sign-agreement rule is the issue's, and a
  pooled verdict carries no more evidence than the weakest group.
- **Relative bands** (one-step, tokenization) are fixed from the paper's wording ("nearly unchanged")
  as a few percent, not from a number the paper states; the check `one_step_band_narrower_than_skill`
  guards against a band wider than the model's gain over persistence.
"""

DISCUSSION = """
The paper pretrains a 1.3B-parameter model on 19 datasets and finds that patch jittering improves
long-horizon stability on 17 of them, removing spectral spikes at the patch frequency that a fixed
patch grid accumulates. This miniature keeps the mechanism exactly (the official fixed jitterer with
constant padding and boundary-flag channels on wall-bounded axes, the per-block token roll on periodic
axes, jitter on at evaluation, per-sample RMS normalisation, L1 on normalised deltas, VRMSE on raw
fields), adds the paper's patch-scale variant (the official non-fixed jitterer) and a wall-bounded
scenario, reads the artifact per group on the patch lines themselves, and trains every arm's seeds as
one vectorized ensemble. It does not reproduce the paper's scale, datasets, 3D data, or pretraining
length.
"""
