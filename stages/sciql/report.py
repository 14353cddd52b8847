"""report@sciql: alignment / normalised return tables, trajectory and trade-off figures, claim verdicts.

    python -m stages report sciql [--profile smoke]
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Mapping

import matplotlib.pyplot as plt
import numpy as np
import polars as pl
from pydantic import Field

from kernels.record import merge_records
from stages.common.claims import _no_number_in_code, gap_verdict, Better, evaluate_claims, Param
from stages.common.config import ReportConfig
from stages.common.paths import read_json
from stages.common.reporting import Report
from stages.sciql.algos import METHODS
from stages.sciql.envs import LABELLERS

LABEL = {"bc": "BC", "cbc": "CBC", "sciql": "SCIQL (style)", "gawr": "SCIQL+GAWR", "task_iql": "task-only IQL"}
COLOR = {"bc": "tab:gray", "cbc": "tab:orange", "sciql": "tab:blue", "gawr": "tab:green", "task_iql": "tab:red"}


class Config(ReportConfig):
    keep_alignment_tol: float = Field(0.05, ge=0.0, le=1.0)    # "keeps alignment": GAWR ≥ SCIQL − this, per seed
    ignores_style_margin: float = Field(0.2, ge=0.0, le=1.0)   # task-IQL alignment this far below SCIQL's
    constant_label_styles: list[str] = Field(default_factory=list, max_length=16,
                                             description="Circle2D criteria whose label is set by a per-episode "
                                                         "generator parameter (a property of the data generator): "
                                                         "their per-criterion comparison is a check (saturated)")


@dataclass(frozen=True)
class ReturnBetter(Better):
    """Better on normalised returns, but ``inconclusive`` when both arms average below 0 (worse than the
    uniform-random policy): a comparison between two policies that fail the task says nothing about it."""

    def evaluate(self, env: Mapping[str, Any]) -> dict[str, Any]:
        out = super().evaluate(env)
        a, b = out["values"][self.a], out["values"][str(self.b)]
        if np.mean(a) < 0 and np.mean(b) < 0:
            out.update(verdict="inconclusive", holds=False)
            out["check"] += "; inconclusive when both mean normalised returns are below 0 (below random)"
        return out


@dataclass(frozen=True)
class AlignmentGated(Better):
    """Better on alignment, but ``inconclusive`` unless style-only SCIQL's alignment on the env is above the
    chance level (1 / #promptable labels, mean over criteria) by ``gate_min`` under the shared rule (the
    check ``sciql_above_chance_<env>``): "keeps alignment" needs an alignment to keep."""
    gate: str = ""                      # the env prefix: reads <gate>.alignment.sciql and <gate>.chance
    gate_min: float | None = None       # from params, = sciql_above_chance_<env>.min_effect
    PARAMS = ("b", "min_effect", "gate_min")
    REQUIRED = ("min_effect", "gate_min")

    def __post_init__(self):
        super().__post_init__()
        _no_number_in_code(self, "gate_min")

    def evaluate(self, env: Mapping[str, Any]) -> dict[str, Any]:
        out = super().evaluate(env)
        sciql, chance = env[f"{self.gate}.alignment.sciql"], float(env[f"{self.gate}.chance"])
        gate, _ = gap_verdict([float(x) - chance for x in sciql], float(self.gate_min))
        out["gate"] = gate
        if gate != "holds":
            out.update(verdict="inconclusive", holds=False)
        out["check"] += (f"; inconclusive unless SCIQL's alignment is above chance ({chance:.3g}) by "
                         f"{float(self.gate_min):g} (gate: {gate})")
        return out


@dataclass(frozen=True)
class ReturnWhileAligned(ReturnBetter):
    """GAWR's return gain over SCIQL counts only with its style alignment kept (the paper: GAWR adds task return
    *while keeping* alignment). A policy that drops the commanded style gains return by construction (the
    return is averaged over commands, some of which oppose the task), so: fails when the return gain fails or
    the kept-alignment test (``AlignmentGated`` with ``keep_min`` and ``gate_min``) fails; holds only when both
    hold; inconclusive otherwise (including when SCIQL's own alignment is not above chance)."""
    gate: str = ""
    keep_min: float | None = None
    gate_min: float | None = None
    PARAMS = ("b", "min_effect", "keep_min", "gate_min")
    REQUIRED = ("min_effect", "gate_min")

    def __post_init__(self):
        super().__post_init__()
        _no_number_in_code(self, "gate_min")

    def evaluate(self, env: Mapping[str, Any]) -> dict[str, Any]:
        out = super().evaluate(env)
        keep = AlignmentGated(self.name + "/alignment", "", kind=self.kind, a=f"{self.gate}.alignment_items.gawr",
                              b=f"{self.gate}.alignment_items.sciql", gate=self.gate,   # thresholds bound here:
                              min_effect=Param(float(self.keep_min), f"report.claims.{self.name}.keep_min"),
                              gate_min=Param(float(self.gate_min), f"report.claims.{self.name}.gate_min")).evaluate(env)
        ret = out["verdict"]
        out["return_verdict"], out["alignment_verdict"] = ret, keep["verdict"]
        joint = ("fails" if "fails" in (ret, keep["verdict"]) else
                 "holds" if ret == keep["verdict"] == "holds" else "inconclusive")
        out.update(verdict=joint, holds=joint == "holds")
        out["check"] += (f"; AND GAWR's alignment at least SCIQL's {float(self.keep_min):+g} (per seed, t-bound; "
                         f"gated on SCIQL above chance by {float(self.gate_min):g}): return {ret}, alignment "
                         f"{keep['verdict']} (gate {keep.get('gate')})")
        return out


def claims_for(env: str, styles: list[str], cfg: Config) -> list:
    E = "HalfCheetah" if env == "halfcheetah" else "Circle2D"
    out = [
        Better(f"sciql_beats_cbc_{env}",
               f"{E}: SCIQL (style-only) follows commanded styles better than CBC (alignment averaged over the "
               f"criteria {', '.join(styles)})",
               a=f"{env}.alignment_items.sciql", b=f"{env}.alignment_items.cbc",
               refuted_by="CBC's alignment above SCIQL's by more than 2 s.e. on most seeds (fails); a gap within "
                          "2 s.e. or a split of seeds (inconclusive)", kind="finding"),
        ReturnWhileAligned(f"gawr_adds_return_{env}",
                     f"{E}: GAWR raises normalised task return over style-only SCIQL while keeping its style "
                     f"alignment (at least SCIQL's minus {cfg.keep_alignment_tol:g}, per seed)",
                     a=f"{env}.norm_return_items.gawr", b=f"{env}.norm_return_items.sciql",
                     keep_min=Param(-cfg.keep_alignment_tol, "report.keep_alignment_tol (negated)"), gate=env,
                     refuted_by="GAWR's return below SCIQL's beyond 2 s.e. on most seeds, or its alignment more "
                                f"than {cfg.keep_alignment_tol:g} below SCIQL's (a return bought by dropping the "
                                "commanded style) (fails); inconclusive when within noise, when both returns are "
                                "below the random policy, or when SCIQL itself is not above chance", kind="finding"),
        Better(f"sciql_above_chance_{env}",
               f"{E}: style-only SCIQL follows commanded styles above chance (1 / #promptable labels, mean over "
               "criteria): the precondition of the GAWR alignment claim",
               a=f"{env}.alignment.sciql", b=f"{env}.chance",
               refuted_by="SCIQL's alignment not above chance by the min effect (then GAWR has no alignment to keep)",
               kind="check"),
        AlignmentGated(f"gawr_keeps_alignment_{env}",
               f"{E}: GAWR keeps style alignment (at least SCIQL's minus {cfg.keep_alignment_tol:g}, per seed)",
               a=f"{env}.alignment_items.gawr", b=f"{env}.alignment_items.sciql", min_effect=Param(-cfg.keep_alignment_tol, "report.keep_alignment_tol (negated)"),
               refuted_by=f"GAWR's alignment more than {cfg.keep_alignment_tol:g} below SCIQL's beyond 2 s.e. "
                          "on most seeds; inconclusive when SCIQL itself is not above chance", kind="finding", gate=env),
    ]
    if env == "circle2d":
        out += [
            Better("task_iql_ignores_style_circle2d",
                   f"Circle2D: task-only IQL ignores the commanded style: its alignment is at least "
                   f"{cfg.ignores_style_margin:g} below SCIQL's, per seed (task-IQL's mean over commands is the "
                   "chance level by construction; the claim can fail through SCIQL)",
                   a="circle2d.alignment_items.sciql", b="circle2d.alignment_items.task_iql", min_effect=Param(cfg.ignores_style_margin, "report.ignores_style_margin"),
                   refuted_by=f"SCIQL's alignment less than {cfg.ignores_style_margin:g} above task-IQL's beyond "
                              "2 s.e. on most seeds", kind="check"),
            ReturnBetter("task_iql_return_above_bc_circle2d",
                         "Circle2D: task-only IQL reaches a higher normalised task return than BC (it optimises "
                         "the task reward the dataset never demonstrates; BC imitates random circles)",
                         a="circle2d.norm_return_items.task_iql", b="circle2d.norm_return_items.bc",
                         refuted_by="BC's return above task-IQL's beyond 2 s.e. on most seeds (fails); inconclusive "
                                    "within noise or when both are below random", kind="check"),
        ]
        out += [Better(f"sciql_beats_cbc_circle2d_{s}", f"Circle2D, criterion `{s}` alone: SCIQL alignment > CBC"
                       + (" (label set by a per-episode generator parameter — commanded speed, circle direction — "
                          "so both methods can saturate at 1: a check of the machinery, not a test of the paper)" if s in cfg.constant_label_styles
                          else ""),
                       a=f"circle2d.per_style.{s}.alignment_items.sciql", b=f"circle2d.per_style.{s}.alignment_items.cbc",
                       refuted_by="CBC above SCIQL on this criterion beyond 2 s.e. on most seeds",
                       kind="check" if s in cfg.constant_label_styles else "finding")
                for s in styles]
    return out


def ablation_claim(style: str, main_relabel, ablation_relabel: str) -> Better:
    """The official 100% random relabelling vs the ablation's mixture, on the same criterion, seeds and steps."""
    return Better(f"random_relabel_beats_mixed_{style}",
                  f"Circle2D, criterion `{style}`: SCIQL trained with the official relabelling {list(main_relabel)} "
                  f"(P(current, future, random)) follows commanded styles better than with {ablation_relabel}",
                  a=f"circle2d.per_style.{style}.alignment.sciql", b="ablation.alignment.sciql",
                  refuted_by=f"the {ablation_relabel} suite's SCIQL alignment above the main run's beyond 2 s.e. "
                             "on most seeds (fails); within 2 s.e. or a split of seeds (inconclusive)", kind="finding")


def _per_seed(d: pl.DataFrame, seeds: list[int], method: str, col: str) -> list[float]:
    s = d.filter(pl.col("method") == method)
    return [float(s.filter(pl.col("seed") == k)[col].mean()) for k in seeds]


def _items(d: pl.DataFrame, seeds: list[int], method: str, col: str) -> list[list[float]]:
    """Per seed, one value per evaluation start (episode index; the same starts for every method, so the
    lists pair per item): the mean over criteria (each weighing equally) of the mean over commanded z. The
    mean of a seed's list is that seed's value in the per-seed lists."""
    per = (d.filter(pl.col("method") == method).group_by("seed", "style", "episode").agg(pl.col(col).mean())
           .group_by("seed", "episode").agg(pl.col(col).mean()).sort("seed", "episode"))
    return [per.filter(pl.col("seed") == k)[col].to_list() for k in seeds]


def env_metrics(df: pl.DataFrame, env: str) -> dict:
    """Per-seed lists (same seed order everywhere): a seed's value is its mean over style criteria (each
    criterion weighs equally), commanded z and episodes."""
    d = df.filter(pl.col("env") == env)
    seeds = sorted(d["seed"].unique().to_list())
    per_style_seed = d.group_by("seed", "style", "method", maintain_order=True).agg(pl.col("alignment").mean(), pl.col("norm_return").mean())
    per_seed = per_style_seed.group_by("seed", "method", maintain_order=True).agg(pl.col("alignment").mean(), pl.col("norm_return").mean())
    styles = sorted(d["style"].unique().to_list())
    out: dict[str, Any] = {"seeds": seeds, "alignment": {}, "norm_return": {}, "mean": {}, "per_style": {},
                           "alignment_items": {}, "norm_return_items": {}}
    for m in METHODS:
        out["alignment"][m] = _per_seed(per_seed, seeds, m, "alignment")
        out["norm_return"][m] = _per_seed(per_seed, seeds, m, "norm_return")
        out["alignment_items"][m] = _items(d, seeds, m, "alignment")       # seeds x evaluation starts (paired)
        out["norm_return_items"][m] = _items(d, seeds, m, "norm_return")
        out["mean"][m] = {"alignment": float(np.mean(out["alignment"][m])),
                          "norm_return": float(np.mean(out["norm_return"][m])),
                          "alignment_seed_std": float(np.std(out["alignment"][m], ddof=1)) if len(seeds) > 1 else 0.0,
                          "norm_return_seed_std": float(np.std(out["norm_return"][m], ddof=1)) if len(seeds) > 1 else 0.0}
    for s in styles:
        ps = per_style_seed.filter(pl.col("style") == s)
        out["per_style"][s] = {"alignment": {m: _per_seed(ps, seeds, m, "alignment") for m in METHODS},
                               "norm_return": {m: _per_seed(ps, seeds, m, "norm_return") for m in METHODS},
                               "alignment_items": {m: _items(d.filter(pl.col("style") == s), seeds, m, "alignment")
                                                   for m in METHODS}}
    out["chance"] = float(np.mean([1.0 / len(LABELLERS[env][s].promptable) for s in styles]))
    return out


def fig_trajectories(traj: dict, styles: list[str], per_style: int = 2):
    methods = ["cbc", "sciql", "gawr", "task_iql"]
    fig, axes = plt.subplots(len(styles), len(methods), figsize=(3.2 * len(methods), 3.2 * len(styles)),
                             squeeze=False)
    for r, style in enumerate(styles):
        lab = LABELLERS["circle2d"][style]
        cmap = plt.get_cmap("viridis", len(lab.promptable))
        for c, m in enumerate(methods):
            ax = axes[r][c]
            ax.add_patch(plt.Circle((0, 5), 5, fill=False, ls="--", color="k", lw=1))
            style_free = m == "task_iql"
            zs = lab.promptable[:1] if style_free else lab.promptable  # style-free: same rollouts for every z
            for i, z in enumerate(zs):
                key = f"{m}|{style}|{z}"
                if key not in traj:
                    continue
                for k, xy in enumerate(traj[key][:per_style]):
                    ax.plot(xy[:, 0], xy[:, 1], color="0.4" if style_free else cmap(i), lw=1.0, alpha=0.85,
                            label=("any z (ignored)" if style_free else f"{lab.label_names[z]}") if k == 0 else None)
                    ax.plot(*xy[0], "o", ms=3, color="k")
            ax.set_xlim(-40, 40)
            ax.set_ylim(-40, 40)
            ax.set_aspect("equal")
            ax.set_title(f"{LABEL[m]} — {style}", fontsize=9)
            ax.tick_params(labelsize=7)
            if c in (0, len(methods) - 1) and ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=6, loc="lower left", ncol=2)
    fig.suptitle(f"Circle2D rollouts (seed 0, first {per_style} start states per command), coloured by commanded "
                 "style; dashed = task circle, dot = start")
    fig.tight_layout()
    return fig


def fig_tradeoff(metrics: dict, per_seed: pl.DataFrame, envs: list[str]):
    fig, axes = plt.subplots(1, len(envs), figsize=(5 * len(envs), 4), squeeze=False)
    for ax, env in zip(axes[0], envs):
        for m in METHODS:
            s = per_seed.filter((pl.col("env") == env) & (pl.col("method") == m))
            ax.scatter(s["alignment"], s["norm_return"], color=COLOR[m], alpha=0.35, s=15)
            ax.scatter([metrics[env]["mean"][m]["alignment"]], [metrics[env]["mean"][m]["norm_return"]],
                       color=COLOR[m], s=80, edgecolor="k", label=LABEL[m])
        ax.axvline(metrics[env]["chance"], color="k", ls=":", lw=1, label="chance alignment")
        ax.axhline(0.0, color="k", ls="--", lw=0.8, label="uniform-random return")
        ax.set_xlabel("style alignment (share of steps with label = commanded z)")
        ax.set_ylabel("normalised task return")
        ax.set_title(env)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def curve_frame(curves: pl.DataFrame) -> pl.DataFrame:
    """Learning curves: per (env, step, method, seed) the mean over criteria of the mean over commands."""
    return (curves.group_by("env", "step", "method", "seed", "style", maintain_order=True)
            .agg(pl.col("alignment").mean(), pl.col("norm_return").mean())
            .group_by("env", "step", "method", "seed", maintain_order=True).agg(pl.col("alignment").mean(), pl.col("norm_return").mean())
            .sort("env", "method", "seed", "step"))


def curve_tail(curves: pl.DataFrame, env: str, methods: tuple[str, ...], k: int = 3) -> tuple[str, str]:
    """(the last k snapshot steps, per criterion "`style` SCIQL a → b → c vs CBC ...") from the learning curves:
    the mean alignment over seeds, commands and episodes at each of the last k snapshots."""
    c = curves.filter(pl.col("env") == env) if len(curves) else curves
    if not len(c):
        return "n/a", "no learning curves recorded"
    steps = sorted(c["step"].unique().to_list())[-k:]
    c = c.filter(pl.col("step").is_in(steps)).group_by("style", "method", "step").agg(pl.col("alignment").mean())
    parts = []
    for style in sorted(c["style"].unique().to_list()):
        seq = []
        for m in methods:
            v = c.filter((pl.col("style") == style) & (pl.col("method") == m)).sort("step")["alignment"].to_list()
            seq.append(f"{LABEL[m]} " + " → ".join(f"{x:.3f}" for x in v))
        parts.append(f"`{style}` " + " vs ".join(seq))
    return ", ".join(str(s) for s in steps), "; ".join(parts)


def fig_curves(cf: pl.DataFrame, envs: list[str]):
    fig, axes = plt.subplots(len(envs), 2, figsize=(10, 3.4 * len(envs)), squeeze=False)
    for r, env in enumerate(envs):
        d = cf.filter(pl.col("env") == env)
        for c, col in enumerate(("alignment", "norm_return")):
            ax = axes[r][c]
            for m in METHODS:
                g = d.filter(pl.col("method") == m).group_by("step", maintain_order=True).agg(
                    pl.col(col).mean().alias("mean"), pl.col(col).min().alias("lo"), pl.col(col).max().alias("hi")).sort("step")
                if len(g):
                    ax.plot(g["step"], g["mean"], marker="o", ms=3, color=COLOR[m], label=LABEL[m])
                    ax.fill_between(g["step"], g["lo"], g["hi"], color=COLOR[m], alpha=0.12)
            ax.set_xlabel("Adam steps")
            ax.set_ylabel(col.replace("_", " "))
            ax.set_title(f"{env}: {col.replace('_', ' ')} (mean over seeds; band = seed min-max)", fontsize=9)
            if c == 0:
                ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def fig_loss_curves(loss_rows: pl.DataFrame):
    keys = [k for k in ("style_critic", "style_value", "task_critic", "task_value", "actor_sciql", "actor_gawr")
            if k in loss_rows.columns]
    fig, axes = plt.subplots(1, len(keys), figsize=(2.8 * len(keys), 2.8), squeeze=False)
    for ax, k in zip(axes[0], keys):
        for (env, style), g in loss_rows.group_by("env", "style", maintain_order=True):
            ax.plot(g["step"], g[k], marker=".", label=f"{env}/{style}")
        ax.set_title(k, fontsize=9)
        ax.set_xlabel("Adam steps", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    return fig


def run(cfg: Config, ctx) -> None:
    import torch

    prep, ev, tr = ctx.input("prepare"), ctx.input("evaluate"), ctx.input("train")
    tsum = read_json(tr / "train_summary.json")
    tc = tsum["config"]
    df = pl.read_parquet(ev / "rollouts.parquet")
    curves = pl.read_parquet(ev / "curves.parquet")
    ablation = pl.read_parquet(ev / "ablation.parquet")
    diag = pl.read_parquet(ev / "offline_objectives.parquet")
    traj = dict(np.load(ev / "trajectories_circle2d.npz"))
    envs = [e for e in ("circle2d", "halfcheetah") if e in df["env"].unique().to_list()]
    metas = {e: read_json(prep / e / "meta.json") for e in envs}
    metrics: dict[str, Any] = {e: env_metrics(df, e) for e in envs}
    metrics["thresholds"] = {"keep_alignment_tol": cfg.keep_alignment_tol,
                             "ignores_style_margin": cfg.ignores_style_margin}
    metrics["sizes"] = {e: {"transitions": metas[e]["transitions"], "episodes": metas[e]["episodes"],
                            "episode_steps": metas[e]["max_steps"], "styles": metas[e]["styles"],
                            "train_steps": tc[e]["steps"]} for e in envs}
    metrics["rollout_episodes"] = len(df)
    if "circle2d" in envs:
        metrics["circle2d"]["wall_step_share_dataset"] = metas["circle2d"].get("wall_step_share")
    claims = [c for e in envs for c in claims_for(e, metas[e]["styles"], cfg)]

    # loss curves recorded by train
    loss_rows = []
    for e in envs:
        for s in metas[e]["styles"]:
            ck = torch.load(tr / e / f"suite_{s}.pt", weights_only=False, map_location="cpu")
            loss_rows += [{"env": e, "style": s, **row} for row in ck["curve"]]
    loss_df = pl.DataFrame(loss_rows) if loss_rows else pl.DataFrame()
    cf = curve_frame(curves) if len(curves) else curves

    rep = Report(ctx, "SCIQL: Style-Conditioned Implicit Q-Learning (miniature)",
                 "Offline RL with style labels from labelling functions: SCIQL (per-style IQL on the reward "
                 "1[label = z] − 1 with hindsight relabelling) follows commanded styles better than "
                 "conditioned behaviour cloning, and its Gated AWR actor (A = A_z + σ(A_z)·A_r) adds task "
                 "return while keeping style alignment; a task-only IQL gets return but ignores style.")
    size_rows = [{"env": e, "transitions": metas[e]["transitions"], "episodes": metas[e]["episodes"],
                  "steps/episode": metas[e]["max_steps"], "styles": ", ".join(metas[e]["styles"]),
                  "train steps": tc[e]["steps"],
                  "return random": metas[e]["reference_return"]["random"],
                  "return expert": metas[e]["reference_return"]["expert"],
                  "dataset return mean": metas[e]["dataset_return"]["mean"]} for e in envs]
    hc_txt = (f"run in this profile: {metas['halfcheetah']['episodes']} episodes of {metas['halfcheetah']['max_steps']} "
              f"steps, criteria {', '.join(metas['halfcheetah']['styles'])}" if "halfcheetah" in envs
              else "not run in this profile")
    relabel_txt = (f"value labels {tc['value_relabel']} and actor labels {tc['actor_relabel']} "
                   "(P(current, future-geometric, random dataset label))")
    rep.section("Setup", f"""
**Circle2D** follows the official traj2d setup: a unicycle with actions (Δθ, speed) mapped to Δθ ∈ [−π, π] and
speed ∈ [0.5, 3], walls at ±50, task reward exp(−d²/2·5²) for the distance d to the task circle (centre (0, 5),
R = 5); evaluation starts x, y ~ U(±14), θ = 0. Dataset: one circle-follower per episode (centre U(±30)², radius
U(3, 10), direction ±1, constant speed U(0.5, 3), turn-noise std U(0, 0.2) rad, starting on its circle); circles
whose mean distance to the task ring is below 2σ (σ = 5, the reward width) are redrawn, so **no episode demonstrates
the task** (share of dataset steps at a wall: {metas['circle2d'].get('wall_step_share', float('nan')) if 'circle2d' in metas else 'n/a'}).
Observation: the last {metas['circle2d'].get('history', 1) if 'circle2d' in metas else 'n/a'} state(s), newest first
(x/50, y/50, cos θ, sin θ each; the start state repeated at reset), as the official `history: 4`. Labelling
functions: speed (commanded speed, edges 1.333 / 2.167), turn (mean Δθ over a centred 11-step window, ±0.1 rad;
"straight" not promptable), direction (8 bins of 45°), position (4 x-bins with edges −15, 0, 15 × sign y = 8 cells,
at s_t). **HalfCheetah-v5** ({hc_txt};
`gymnasium[mujoco]`, assets offline): three scripted sinusoidal gaits (the most
backward, the closest to standing and the fastest of a random gait bank) with a gait clock in the observation,
labelled backward / slow / forward by forward velocity.
Methods: BC, CBC (conditioned on the current label), task-only IQL, SCIQL style-only and SCIQL+GAWR, as five
actors of one `SCIQLSuite` LightningModule per (env, criterion) trained by `make_trainer` on the same batches
(GAWR and task-only IQL share the task IQL). Seeds {tc['seeds']} are vectorised (one ensemble member per seed,
own init, own batches). IQL: twin critics, Polyak ρ = {tc['polyak']}, expectile τ = {tc['expectile']},
γ = {tc['discount']}, β = {tc['beta']}, clip {tc['clip']}; relabelling: {relabel_txt}; task rewards scaled by
horizon / (max − min episode return) as the official sampler does: {tc['normalize_task_reward']}.
Relabelling ablation: {f"a second suite on `{tc['ablation_style']}` trained with {tc['ablation_relabel']} for values and actor, same seeds and steps" if tc.get('ablation_relabel') else "not run in this profile"}.
Training: {tc['circle2d']['steps']} (Circle2D){f" / {tc['halfcheetah']['steps']} (HalfCheetah)" if 'halfcheetah' in envs else ''} Adam
steps per module, batch {tc['batch_size']}, 2×{tc['hidden']} MLPs, lr {tc['lr']}.
Evaluation: mean-action rollouts from seeded starts, every promptable style commanded; alignment = share of steps
whose label equals the command; normalised return = (R − R_random) / (R_expert − R_random) (uniform-random policy;
scripted expert = the circle-following controller on the task circle / the fastest gait).
Verdicts are seed-aware: a claim holds when the per-seed gap exceeds 2 standard errors and wins on a majority of
seeds, fails when the reverse holds, and is inconclusive otherwise.
""")
    rep.table("Sizes (this profile)", pl.DataFrame(size_rows))
    rows = []
    for e in envs:
        for m in METHODS:
            mm = metrics[e]["mean"][m]
            rows.append({"env": e, "method": LABEL[m], "alignment": mm["alignment"], "± seed std": mm["alignment_seed_std"],
                         "norm. return": mm["norm_return"], "± seed std ": mm["norm_return_seed_std"],
                         "chance": metrics[e]["chance"]})
    rep.table("Results (per-seed means over criteria, commands and episodes; then mean and std over seeds)",
              pl.DataFrame(rows))
    style_rows = []
    for e in envs:
        for s, by in metrics[e]["per_style"].items():
            style_rows.append({"env": e, "style": s,
                               **{f"{LABEL[m]} align": float(np.mean(by["alignment"][m])) for m in METHODS},
                               **{f"{LABEL[m]} return": float(np.mean(by["norm_return"][m]))
                                  for m in ("sciql", "gawr", "task_iql")}})
    rep.table("Per style criterion (means over seeds)", pl.DataFrame(style_rows))
    per_seed = (df.group_by("env", "seed", "style", "method", maintain_order=True).agg(pl.col("alignment").mean(), pl.col("norm_return").mean())
                .group_by("env", "seed", "method", maintain_order=True).agg(pl.col("alignment").mean(), pl.col("norm_return").mean())
                .sort("env", "method", "seed"))
    rep.table("Per seed", per_seed.with_columns(pl.col("method").replace(LABEL)))
    if len(ablation):
        ab = (ablation.group_by("seed", "style", "method", maintain_order=True).agg(pl.col("alignment").mean(), pl.col("norm_return").mean()))
        main = (df.filter((pl.col("env") == "circle2d") & pl.col("style").is_in(ab["style"].unique().to_list())
                          & pl.col("method").is_in(["cbc", "sciql", "gawr"]))
                .group_by("seed", "style", "method", maintain_order=True).agg(pl.col("alignment").mean(), pl.col("norm_return").mean()))
        abl = (pl.concat([main.with_columns(pl.lit(str(tc["value_relabel"])).alias("relabel")),
                          ab.with_columns(pl.lit(str(ablation["relabel"][0])).alias("relabel"))])
               .group_by("relabel", "style", "method", maintain_order=True).agg(pl.col("alignment").mean(), pl.col("norm_return").mean())
               .sort("style", "method", "relabel"))
        ab_style = str(ablation["style"][0])
        metrics["ablation"] = {"relabel": str(ablation["relabel"][0]), "style": ab_style,
                               "alignment": {m: _per_seed(ab, metrics["circle2d"]["seeds"], m, "alignment")
                                             for m in ("cbc", "sciql", "gawr")},
                               "norm_return": {m: _per_seed(ab, metrics["circle2d"]["seeds"], m, "norm_return")
                                               for m in ("cbc", "sciql", "gawr")}}
        claims.append(ablation_claim(ab_style, tc["value_relabel"], metrics["ablation"]["relabel"]))
        rep.table("Relabelling ablation (Circle2D)", abl.with_columns(pl.col("method").replace(LABEL)),
                  note="Main run: the official 100% random relabelling. Ablation: the same suite trained with "
                       "P(current, future, random) as listed, evaluated the same way.")
    rep.table("Batched policy-loss evaluation on the dataset (kernels/gawr_loss.py)",
              diag.group_by("env", "style", maintain_order=True).agg(pl.all().exclude("env", "style", "seed").mean()).sort("env", "style"),
              note="GAWR objective −E[w log π] of each actor over the dataset rows with labels relabelled as in "
                   "training, mean weight and share of clipped weights, expectile losses of the values.")
    if len(cf):
        rep.figure("learning_curves", fig_curves(cf, envs),
                   f"Learning curves: alignment and normalised return of the actor snapshots "
                   f"({tc['curve_points']} per module) rolled out with fewer episodes than the final evaluation")
        lc = (cf.group_by("env", "method", "step").agg(pl.col("alignment").mean())
              .with_columns((pl.col("env") + "/" + pl.col("method")).alias("run")).sort("run", "step"))
        rep.plot("learning_curves", lc, x="step", y="alignment", series="run",
                 title="style alignment vs Adam steps per env/method (mean over seeds)")
    if len(loss_df):
        rep.figure("loss_curves", fig_loss_curves(loss_df), "Training losses (mean over seeds) at the snapshot steps")
    if "circle2d" in envs:
        rep.figure("trajectories_circle2d", fig_trajectories(traj, metas["circle2d"]["styles"]),
                   "Circle2D rollouts coloured by commanded style (2 episodes per style, seed 0)")
    rep.figure("alignment_vs_return", fig_tradeoff(metrics, per_seed, envs),
               "Style alignment vs normalised task return (large: mean; small: per seed)")
    rep.plot("alignment_vs_return", per_seed, x="alignment", y="norm_return", template="scatter",
             title="normalised task return vs style alignment (one point per env, method, seed)")
    kernels = merge_records(tr, ev)
    cpu = {st: read_json(ctx.input(st) / "cpu_time.json")["cpu_s"] for st in ("prepare", "train", "evaluate")}
    cpu["report"] = time.process_time()
    metrics["cpu_s"] = cpu
    metrics["kernel_calls"] = {k: v["calls"] for k, v in kernels.items()}
    rep.table("CPU time per stage (CPU seconds of the stage process and its pool workers)", pl.DataFrame([cpu]),
              note="Budgets are step counts; wall-clock times (Runtime table) depend on the machine's load.")
    verdicts = evaluate_claims(claims, metrics, cfg.claims, "papers.sciql.report")
    lines = [f"- `{v['name']}`: **{v['verdict']}** ({v['check']}); refuted by: {v['refuted_by']}" for v in verdicts]
    rep.section("Reading the verdicts", "\n".join(lines) + "\n\n" + _discussion(metrics, envs))
    rep.table("Deviations from the paper / official code", pl.DataFrame(deviations(metas, tc, read_json(ev / "summary.json")), schema=["what", "here", "reference", "why"],
                                                                    orient="row"))
    rep.section("Discussion: what the paper did at full scale", """
The paper trains each method for 10⁶ gradient steps with 2×256 MLPs on 1000-step episodes (Circle2D with a state
history and the start state in the observation) and on MuJoCo datasets of trained, style-diverse policies, with
SORL, SCBC and BC-PMI as further baselines, and reports alignment per criterion and normalised returns over many
evaluation episodes. This miniature keeps the objective (style reward, expectile IQL on min(Q1', Q2'), GAWR gate,
relabelling, the official Circle2D settings and dataset generator) but trains {steps} steps with 2×{hidden}
networks on 100-step episodes, so absolute numbers — and especially task returns, which need stitching across
circles the dataset never draws on the task — are far from converged values; the learning curves show where
training stands. The full profile (`-S profile=full`) runs the reference scale on a GPU machine.
""".format(steps=tc["circle2d"]["steps"], hidden=tc["hidden"]))
    tail_steps, tail_text = curve_tail(curves, "circle2d", ("sciql", "cbc"))
    ev_cfg_starts = read_json(ev / "summary.json")["episodes_per_style"]
    rep.section("Threats to validity", """
Red-team pass on this design (what was fixed is in the design; what remains is listed):

- **Scale.** A few thousand Adam steps with 2×64 networks on 100-step episodes: alignment and especially task
  return (which needs stitching) are far from converged; a null verdict says little about the full scale.
- **No demonstration of the task.** Behaviour circles whose mean distance to the task ring is below 2σ are
  redrawn (issue 54: the earlier |Δc| + |ΔR| < 2 rule let near-task circles in); a test bounds every generated
  episode's mean per-step task reward below half the on-ring reward. Circles that cross the ring still earn
  some reward on part of the episode.
- **Saturated criteria.** `speed` and `turn` labels are set by per-episode generator parameters, so both
  methods can reach 1.0: their per-criterion comparisons are checks, not findings.
- **HalfCheetah.** Scripted open-loop gaits (with a gait clock in the observation), one criterion (speed):
  SCIQL's alignment there may sit near chance; the GAWR "keeps alignment" finding is inconclusive unless the
  check `sciql_above_chance_halfcheetah` holds.
- **Item noise.** The findings read per-seed lists over evaluation starts (each start averaged over criteria
  and commanded styles; the same starts for every method, so the shared rule pairs them per item). Only
  {n_starts} evaluation starts, the same for every seed: the verdicts generalise over seeds, not over many starts.
  The relabelling ablation uses the same starts and batches (its CBC equals the main run's) but compares per-seed
  means, without the per-start pairing.
- **Budget decides the per-criterion fails.** SCIQL's alignment at the last three learning-curve snapshots
  (steps {tail_steps}; mean over seeds, commands and the curve episodes) against CBC's: {tail_text}. A criterion
  still rising at the last step, or never above chance, is a fail of this training length, not a measured
  ordering at convergence.
- **Walls.** Evaluation rollouts that follow a commanded direction reach the walls at ±50 within 100 steps; a
  step pinned at a wall moves along it, so its direction label rarely matches. A reviewer counted 44.5% of CBC's
  and 34.4% of SCIQL's seed-0 direction-rollout steps at a wall (the dataset's share is the one in Setup): the
  direction metric partly rewards reaching the wall later.
- **GAWR's return gain** counts only with kept alignment (`gawr_adds_return_*` is a joint test): with the style
  ignored, a policy gains return by construction (the return is averaged over commands, some of which oppose
  the task).
- **Observation.** As in the official Circle2D, the observation stacks the last 4 states (issue 54: earlier runs
  used the current state only), so the policy can read the behaviour's speed and turning from it; the state
  encoding differs (Deviations).
- **Thresholds** (min effects, the keep-alignment tolerance, the gate) were fixed in params before the run.
""".format(n_starts=ev_cfg_starts, tail_steps=tail_steps, tail_text=tail_text))
    rep.finish(claims, metrics)


DEVIATIONS = [
    ("training length", "3000 Adam steps (default profile)", "1M steps", "5-minute CPU budget; full profile restores it"),
    ("networks", "2×64 MLPs, lr 1e-3, batch 128", "2×256, lr 3e-4, batch 256", "CPU budget"),
    ("updates", "all networks take one Adam step on the sum of their (detached-target) losses",
     "separate optimisers, sequential updates", "one optimiser step per batch; gradients are the same"),
    ("Circle2D episodes", "100 steps, 300 episodes", "1000 steps", "CPU budget"),
    ("no-demonstration filter", "redraw behaviour circles whose mean distance to the task ring is below "
     "2σ (σ = 5, the reward width): no dataset episode earns half the on-ring per-step reward",
     "(not stated: the official generator draws random circles)",
     "the task return must come from stitching; the earlier |Δc| + |ΔR| < 2 rule let near-task circles in"),
    ("baselines", "BC, CBC, task-only IQL", "also SORL, SCBC, BC-PMI", "not reproduced"),
    ("task-return normalisation", "(R − R_random) / (R_expert − R_random), expert = circle controller on the task circle",
     "the paper's return bounds", "no reference bounds offline; the random policy stays near the start (close to "
     "the task circle), so it is a strong floor"),
    ("direction label", "8 bins, no 'undetermined' label", "9th label for steps shorter than 0.1",
     "speed ≥ 0.5 per step: only at a wall"),
    ("terminal masks", "1 − terminated; time limits bootstrap", "terminate_on_end option", "no episode terminates"),
]


def deviations(metas: dict, tc: dict, ev_summary: dict) -> list[tuple]:
    """DEVIATIONS plus the rows whose numbers come from this profile's parameters."""
    rows = list(DEVIATIONS)
    h = metas["circle2d"].get("history", 1) if "circle2d" in metas else None
    if h is not None:
        rows.insert(4, ("Circle2D observation", f"the last {h} state(s), newest first (start state repeated at reset), "
                        "each encoded as (x/50, y/50, cos θ, sin θ)",
                        "the last 4 states (x, y, θ), newest first, no start state (official yaml: `history: 4, "
                        "include_start_state: False`)",
                        "history matched" if h == 4 else f"history {h} instead of 4 (this profile's params)"
                        + "; state encoding: normalised position and heading as cos/sin (no wrap-around jump)"))
    if "halfcheetah" in metas:
        hc = metas["halfcheetah"]
        rows.append(("HalfCheetah scale", f"{hc['episodes']} episodes × {hc['max_steps']} steps, criteria "
                     f"{', '.join(hc['styles'])}, {tc['halfcheetah']['steps']} Adam steps",
                     "1000-step episodes, several criteria, 1M steps",
                     "CPU budget (the whole default profile ≤ 5 CPU minutes on 2 cores); full profile: 1000 × 1000"))
    else:
        rows.append(("HalfCheetah", "not run in this profile", "part of the paper", "profile choice"))
    rows.append(("HalfCheetah data", "3 scripted sinusoidal gaits + gait clock + action noise",
                 "trained diverse policies", "no pretrained policies offline"))
    if tc.get("ablation_relabel"):
        rows.append(("relabelling ablation", f"one criterion (`{tc['ablation_style']}`), {tc['ablation_relabel']} vs "
                     f"the main {tc['value_relabel']}, {tc['circle2d']['steps']} steps, 3 actors evaluated",
                     "ablation over criteria and tasks", "CPU budget"))
    rows.append(("evaluation", f"{ev_summary['episodes_per_style']} episodes per command, seed and method; "
                 f"{ev_summary['curve_episodes_per_style']} per learning-curve snapshot", "many episodes", "CPU budget"))
    return rows


def _discussion(m: dict, envs: list[str]) -> str:
    parts = []
    for e in envs:
        v = m[e]
        mean = {k: x["alignment"] for k, x in v["mean"].items()}
        ret = {k: x["norm_return"] for k, x in v["mean"].items()}
        text = (f"**{e}**: alignment SCIQL {mean['sciql']:.3f} vs CBC {mean['cbc']:.3f} vs BC {mean['bc']:.3f} "
                f"(chance {v['chance']:.3f}); GAWR alignment {mean['gawr']:.3f}; normalised return GAWR "
                f"{ret['gawr']:.3f}, SCIQL {ret['sciql']:.3f}, task-only IQL {ret['task_iql']:.3f}, BC {ret['bc']:.3f}.")
        cbc_seeds = [float(x) for x in v["alignment"]["cbc"]]
        n_above = sum(x > v["chance"] for x in cbc_seeds)
        text += (" CBC's mean alignment is " + ("above" if mean["cbc"] > v["chance"] else "**not** above")
                 + f" chance ({mean['cbc']:.3f} vs {v['chance']:.3f}; above it on {n_above} of {len(cbc_seeds)} "
                 "seeds" + ("" if n_above == len(cbc_seeds) else ": the baseline is not shown to be non-degenerate")
                 + "); task-only IQL's return is "
                 + ("above" if ret["task_iql"] > 0 else "**below**") + " the uniform-random policy's.")
        per = v["per_style"]
        text += " Per criterion, SCIQL − CBC alignment: " + ", ".join(
            f"`{s}` {np.mean(by['alignment']['sciql']) - np.mean(by['alignment']['cbc']):+.3f}" for s, by in per.items()) + "."
        sat = [s for s, by in per.items() if min(np.mean(by["alignment"]["sciql"]), np.mean(by["alignment"]["cbc"])) >= 0.95]
        if sat:
            text += (f" Criteria {', '.join(f'`{s}`' for s in sat)} are saturated (SCIQL and CBC both ≥ 0.95: the label is a "
                     "direct function of the current action, so conditioned cloning already follows it); the "
                     "comparison is decided by the criteria that depend on where the trajectory goes.")
        if max(ret.values()) < 0.5:
            text += (f" No method gets close to the scripted expert (best normalised return {max(ret.values()):.3f}):"
                     " return comparisons are between weak policies at this training length.")
        parts.append(text)
    if "ablation" in m:
        ab, st = m["ablation"], m["ablation"]["style"]
        main_al = np.mean(m["circle2d"]["per_style"][st]["alignment"]["sciql"])
        abl_al = np.mean(ab["alignment"]["sciql"])
        text = (f"**Relabelling ablation** (`{st}`): SCIQL alignment {main_al:.3f} with the official 100% random labels vs "
                f"{abl_al:.3f} with {ab['relabel']} (CBC in the ablation suite {np.mean(ab['alignment']['cbc']):.3f}).")
        if abl_al > main_al:
            text += (" Here the mixture with current / future labels follows the commanded criterion better, contrary to"
                     " the official choice. A plausible reason (not tested here): with 100-step episodes and 3000 steps, a"
                     " random dataset label is often one the agent cannot reach from its state, so the style values see"
                     " few positive rewards; the official setting was chosen at 1000-step episodes and 10⁶ steps.")
        parts.append(text)
    return "\n\n".join(parts)
