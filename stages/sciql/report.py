"""report@sciql: alignment / normalised return tables, trajectory and trade-off figures, claim verdicts.

    python -m stages report sciql [--profile smoke]
"""
from __future__ import annotations

import time

import matplotlib.pyplot as plt
import numpy as np
import polars as pl
from pydantic import Field

from stages.common.claims import Claim, evaluate_claims
from stages.common.config import StageConfig
from stages.common.paths import read_json
from stages.common.reporting import Report
from stages.sciql.algos import METHODS
from stages.sciql.envs import LABELLERS

LABEL = {"bc": "BC", "cbc": "CBC", "sciql": "SCIQL (style)", "gawr": "SCIQL+GAWR", "task_iql": "task-only IQL"}
COLOR = {"bc": "tab:gray", "cbc": "tab:orange", "sciql": "tab:blue", "gawr": "tab:green", "task_iql": "tab:red"}


class Config(StageConfig):
    keep_alignment_tol: float = Field(0.05, ge=0.0, le=1.0)  # "keeps alignment" = within this of SCIQL
    chance_tol: float = Field(0.1, ge=0.0, le=1.0)           # "at chance" = at most 1/#styles + this


CLAIMS = [
    Claim("sciql_beats_cbc_circle2d",
          "Circle2D: SCIQL (style-only) follows commanded styles better than CBC (higher alignment)",
          "circle2d.alignment.sciql > circle2d.alignment.cbc"),
    Claim("gawr_adds_return_circle2d",
          "Circle2D: GAWR raises normalised task return over style-only SCIQL while keeping its alignment",
          "circle2d.norm_return.gawr > circle2d.norm_return.sciql and "
          "circle2d.alignment.gawr >= circle2d.alignment.sciql - thresholds.keep_alignment_tol"),
    Claim("task_iql_return_at_chance_circle2d",
          "Circle2D: task-only IQL reaches high task return (above BC and GAWR) while its style alignment "
          "stays at chance level (at most 1/#styles + chance_tol: it ignores the command)",
          "circle2d.norm_return.task_iql > circle2d.norm_return.bc and "
          "circle2d.norm_return.task_iql >= circle2d.norm_return.gawr and "
          "circle2d.alignment.task_iql <= circle2d.chance + thresholds.chance_tol"),
    Claim("sciql_beats_cbc_halfcheetah",
          "HalfCheetah: SCIQL (style-only) has higher style alignment than CBC",
          "halfcheetah.alignment.sciql > halfcheetah.alignment.cbc"),
    Claim("gawr_adds_return_halfcheetah",
          "HalfCheetah: GAWR raises normalised task return over SCIQL while keeping its alignment",
          "halfcheetah.norm_return.gawr > halfcheetah.norm_return.sciql and "
          "halfcheetah.alignment.gawr >= halfcheetah.alignment.sciql - thresholds.keep_alignment_tol"),
]


def env_metrics(df: pl.DataFrame, env: str) -> dict:
    """Means over styles (criteria), commanded z, seeds and episodes; style criteria weigh equally."""
    d = df.filter(pl.col("env") == env)
    per_style = (d.group_by("style", "method").agg(pl.col("alignment").mean(), pl.col("norm_return").mean()))
    per_seed = (d.group_by("seed", "style", "method").agg(pl.col("alignment").mean(), pl.col("norm_return").mean())
                .group_by("seed", "method").agg(pl.col("alignment").mean(), pl.col("norm_return").mean()))
    out = {"alignment": {}, "norm_return": {}, "alignment_seed_std": {}, "norm_return_seed_std": {},
           "per_style": {}}
    for m in METHODS:
        ps = per_style.filter(pl.col("method") == m)
        sd = per_seed.filter(pl.col("method") == m)
        out["alignment"][m] = float(ps["alignment"].mean())
        out["norm_return"][m] = float(ps["norm_return"].mean())
        out["alignment_seed_std"][m] = float(sd["alignment"].std()) if len(sd) > 1 else 0.0
        out["norm_return_seed_std"][m] = float(sd["norm_return"].std()) if len(sd) > 1 else 0.0
    styles = sorted(d["style"].unique().to_list())
    for s in styles:
        ps = per_style.filter(pl.col("style") == s)
        out["per_style"][s] = {m: {"alignment": float(ps.filter(pl.col("method") == m)["alignment"][0]),
                                   "norm_return": float(ps.filter(pl.col("method") == m)["norm_return"][0])}
                               for m in METHODS}
    out["chance"] = float(np.mean([1.0 / len(LABELLERS[env][s].promptable) for s in styles]))
    seeds = per_seed.pivot(on="method", index="seed", values="alignment")
    out["seeds_sciql_above_cbc"] = int((seeds["sciql"] > seeds["cbc"]).sum())
    out["seeds"] = int(len(seeds))
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
            ax.add_patch(plt.Circle((0, 0), 10, fill=False, ls="--", color="k", lw=1))
            style_free = m == "task_iql"
            zs = lab.promptable[:1] if style_free else lab.promptable  # style-free: same rollouts for every z
            for i, z in enumerate(zs):
                key = f"{m}|{style}|{z}"
                if key not in traj:
                    continue
                for k, xy in enumerate(traj[key][:per_style]):
                    ax.plot(xy[:, 0], xy[:, 1], color="0.4" if style_free else cmap(i), lw=1.2, alpha=0.85,
                            label=("any z (ignored)" if style_free else f"z={lab.label_names[z]}") if k == 0 else None)
                    ax.plot(*xy[0], "o", ms=3, color="k")
            ax.set_xlim(-30, 30)
            ax.set_ylim(-30, 30)
            ax.set_aspect("equal")
            ax.set_title(f"{LABEL[m]} — {style}", fontsize=9)
            ax.tick_params(labelsize=7)
            if c in (0, len(methods) - 1) and ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7, loc="lower left")
    fig.suptitle("Circle2D rollouts (seed 0, first start states), coloured by commanded style; "
                 "dashed = task circle, dot = start")
    fig.tight_layout()
    return fig


def fig_tradeoff(metrics: dict, per_seed: pl.DataFrame, envs: list[str]):
    fig, axes = plt.subplots(1, len(envs), figsize=(5 * len(envs), 4), squeeze=False)
    for ax, env in zip(axes[0], envs):
        for m in METHODS:
            s = per_seed.filter((pl.col("env") == env) & (pl.col("method") == m))
            ax.scatter(s["alignment"], s["norm_return"], color=COLOR[m], alpha=0.35, s=15)
            ax.scatter([metrics[env]["alignment"][m]], [metrics[env]["norm_return"][m]], color=COLOR[m],
                       s=80, edgecolor="k", label=LABEL[m])
        ax.axvline(metrics[env]["chance"], color="k", ls=":", lw=1, label="chance alignment")
        ax.set_xlabel("style alignment (share of steps with label = commanded z)")
        ax.set_ylabel("normalised task return")
        ax.set_title(env)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def fig_per_style(df: pl.DataFrame):
    groups = df.group_by("env", "style", "z_name", "method").agg(pl.col("alignment").mean()).sort("env", "style", "z_name")
    keys = groups.select("env", "style", "z_name").unique(maintain_order=True).rows()
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(keys)), 3.5))
    width = 0.8 / len(METHODS)
    for j, m in enumerate(METHODS):
        vals = [groups.filter((pl.col("env") == e) & (pl.col("style") == s) & (pl.col("z_name") == z)
                              & (pl.col("method") == m))["alignment"].mean() for e, s, z in keys]
        ax.bar(np.arange(len(keys)) + j * width, vals, width, color=COLOR[m], label=LABEL[m])
    ax.set_xticks(np.arange(len(keys)) + 0.4 - width / 2)
    ax.set_xticklabels([f"{e}\n{s}={z}" for e, s, z in keys], fontsize=7, rotation=30, ha="right")
    ax.set_ylabel("alignment")
    ax.legend(fontsize=7, ncol=5)
    fig.tight_layout()
    return fig


def run(cfg: Config, ctx) -> None:
    prep, ev = ctx.input("prepare"), ctx.input("evaluate")
    tc = read_json(ctx.input("train") / "train_summary.json")["config"]
    df = pl.read_parquet(ev / "rollouts.parquet")
    diag = pl.read_parquet(ev / "offline_objectives.parquet")
    traj = dict(np.load(ev / "trajectories_circle2d.npz"))
    envs = [e for e in ("circle2d", "halfcheetah") if e in df["env"].unique().to_list()]
    metas = {e: read_json(prep / e / "meta.json") for e in envs}
    metrics = {e: env_metrics(df, e) for e in envs}
    metrics["thresholds"] = {"keep_alignment_tol": cfg.keep_alignment_tol, "chance_tol": cfg.chance_tol}
    metrics["sizes"] = {e: {"transitions": metas[e]["transitions"], "episodes": metas[e]["episodes"],
                            "episode_steps": metas[e]["max_steps"], "styles": metas[e]["styles"]} for e in envs}
    metrics["rollout_episodes"] = len(df)
    claims = [c for c in CLAIMS if c.name.split("_")[-1] in envs]

    rep = Report(ctx, "SCIQL: Style-Conditioned Implicit Q-Learning (miniature)",
                 "Offline RL with style labels from labelling functions: SCIQL (per-style IQL on the reward "
                 "1[label = z] − 1 with hindsight relabelling) follows commanded styles better than "
                 "conditioned behaviour cloning, and its Gated AWR actor (A = A_z + σ(A_z)·A_r) adds task "
                 "return while keeping style alignment; a task-only IQL gets return but ignores style.")
    size_rows = [{"env": e, "transitions": metas[e]["transitions"], "episodes": metas[e]["episodes"],
                  "steps/episode": metas[e]["max_steps"], "styles": ", ".join(metas[e]["styles"]),
                  "return random": metas[e]["reference_return"]["random"],
                  "return expert": metas[e]["reference_return"]["expert"]} for e in envs]
    rep.section("Setup", f"""
Environments: **Circle2D** (the paper's 2-D unicycle re-implemented as a gymnasium env: actions Δθ, speed;
task reward exp(−d²/2σ²) for the distance d to the circle of radius 10 around the origin) and
**HalfCheetah-v5** from `gymnasium[mujoco]` (mujoco 4.0; XML assets ship with gymnasium, nothing downloaded;
task reward = env reward). Datasets: scripted behaviours (Circle2D: circles of random centre/radius/direction —
30% on the task circle — lines, zig-zags, wandering; HalfCheetah: three sinusoidal gaits a = A sin(ωt + φ) —
the most backward, the closest to standing and the fastest of a random gait bank — with a gait clock
(sin/cos ωt) appended to the observation), two behaviour segments per episode, Gaussian action noise,
labelled by the labelling functions and stored with HF `datasets`.
Methods: BC, CBC (conditioned on the current label), task-only IQL, SCIQL style-only and SCIQL+GAWR. The
pipeline trains them as five actors of one `SCIQLSuite` LightningModule per (env, style criterion) via
`make_trainer` (same batches; GAWR and the task-only actor share the task IQL; BC, CBC, TaskIQL and SCIQL also
exist as standalone LightningModules, exercised by the tests). Seeds are vectorised: every network is an ensemble
with one independently initialised member per seed, each drawing its own batches. IQL: twin critics,
Polyak targets (ρ = {tc['polyak']}), expectile value τ = {tc['expectile']}, γ = {tc['discount']}, AWR β = {tc['beta']},
weight clip {tc['clip']}; style labels for the values / the actor are relabelled from the current step, a
geometric future step of the same episode (λ = {tc['geom_lambda']}) or a random dataset step with probabilities
{tc['value_relabel']} / {tc['actor_relabel']}. Training: {tc['circle2d']['steps']} (Circle2D) and
{(tc['halfcheetah'] or {}).get('steps')} (HalfCheetah) gradient steps per module, batch {tc['batch_size']},
2×{tc['hidden']} MLPs, Adam lr {tc['lr']}, seeds {tc['seeds']}.
Evaluation: mean-action rollouts from seeded start states, every promptable style commanded, {len(set(df['seed'].to_list()))} training seeds;
alignment = share of steps whose label equals the command (chance = 1/#styles); normalised return =
(R − R_random) / (R_expert − R_random) with a uniform-random policy and a scripted expert (Circle2D: the
circle-following controller; HalfCheetah: the fastest gait of the bank).
""")
    rep.table("Sizes (this profile)", pl.DataFrame(size_rows))
    rows = []
    for e in envs:
        for m in METHODS:
            rows.append({"env": e, "method": LABEL[m], "alignment": metrics[e]["alignment"][m],
                         "± seed std": metrics[e]["alignment_seed_std"][m],
                         "norm. return": metrics[e]["norm_return"][m],
                         "± seed std ": metrics[e]["norm_return_seed_std"][m],
                         "chance": metrics[e]["chance"]})
    rep.table("Results (means over style criteria, commanded styles, seeds and episodes)", pl.DataFrame(rows))
    style_rows = []
    for e in envs:
        for s, by_m in metrics[e]["per_style"].items():
            style_rows.append({"env": e, "style": s, **{f"{LABEL[m]} align": by_m[m]["alignment"] for m in METHODS},
                               **{f"{LABEL[m]} return": by_m[m]["norm_return"] for m in ("sciql", "gawr", "task_iql")}})
    rep.table("Per style criterion", pl.DataFrame(style_rows))
    per_seed = (df.group_by("env", "seed", "style", "method").agg(pl.col("alignment").mean(), pl.col("norm_return").mean())
                .group_by("env", "seed", "method").agg(pl.col("alignment").mean(), pl.col("norm_return").mean())
                .sort("env", "method", "seed"))
    rep.table("Per seed", per_seed.with_columns(pl.col("method").replace(LABEL)))
    rep.table("Offline objectives on the dataset (kernel: fused expectile / GAWR losses)",
              diag.group_by("env", "style").agg(pl.all().exclude("env", "style", "seed").mean()).sort("env", "style"),
              note="Expectile losses of the learned style and task values against the target critics, the GAWR "
                   "objective −E[w log π] of each actor, its mean weight and the share of clipped weights.")
    if "circle2d" in envs:
        rep.figure("trajectories_circle2d", fig_trajectories(traj, metas["circle2d"]["styles"]),
                   "Circle2D rollouts coloured by commanded style (3 episodes per style, seed 0)")
    rep.figure("alignment_vs_return", fig_tradeoff(metrics, per_seed, envs),
               "Style alignment vs normalised task return (large: mean; small: per seed)")
    rep.figure("alignment_per_style", fig_per_style(df), "Alignment per commanded style")
    rep.plot("alignment_vs_return", per_seed)
    cpu = {st: read_json(ctx.input(st) / "cpu_time.json")["cpu_s"] for st in ("prepare", "train", "evaluate")}
    cpu["report"] = time.process_time()
    metrics["cpu_s"] = cpu
    rep.table("CPU time per stage (process CPU seconds)", pl.DataFrame([cpu]),
              note="Wall-clock times are in the Runtime table below; on the shared 2-core machine the wall time "
                   "of a stage can exceed its CPU time when other jobs run at the same time. Every stage "
                   "uses one thread.")
    verdict_lines = []
    flat = {e: metrics[e] for e in envs}
    for v in evaluate_claims(claims, metrics):
        verdict_lines.append(f"- `{v['name']}`: {'holds' if v['holds'] else '**does not hold**'} at this scale.")
    rep.section("Reading the verdicts", "\n".join(verdict_lines) + "\n\n" + _discussion(flat, cfg))
    rep.section("Faithfulness and deviations", """
- Equations as in the card: style reward r_z = 1[label_t = z] − 1; per-style and task IQL with expectile value
  on min(Q1', Q2') of Polyak targets; TD target r + γ·mask·V(s'); GAWR gate A = A_z + σ(A_z)·A_r,
  w = min(exp(3A), 100), actor loss −E[w log π(a|s,z)] (the loss runs through `kernels/gawr_loss.py`).
- All networks of a module take one Adam step on the sum of their losses (targets/weights detached, so the
  gradients equal separate updates); the reference updates them sequentially, each with its own optimiser.
- Miniature scale: small MLPs (reference 2×256), a larger lr (reference 3e-4) and a few thousand gradient
  steps instead of 10⁶; Circle2D episodes of 100 steps (reference 1000) with observation (x, y, cos θ, sin θ)
  instead of a state history; the policy is a Gaussian with tanh mean, evaluated by its mean action.
- Baselines SORL, SCBC and BC-PMI of the paper are not reproduced; HalfCheetah data are three scripted
  sinusoidal gaits (made learnable by a gait clock in the observation), not the paper's trained-policy
  datasets, with one speed criterion (backward / slow / forward) and 200-step episodes.
- Labels: Circle2D speed is binned from the per-step displacement, position is the quadrant, turn uses a
  5-step window (the reference's windows are longer); style rewards use the label of the current step.
- The value target of the style IQL uses V(s', z) with the label z of the value relabelling; terminal masks
  are 1 − terminated (no episode terminates in either environment; time limits bootstrap).
""")
    rep.finish(claims, metrics)


def _discussion(m: dict, cfg: Config) -> str:
    parts = []
    for e, v in m.items():
        a, r = v["alignment"], v["norm_return"]
        sd_a, sd_r = v["alignment_seed_std"], v["norm_return_seed_std"]
        text = (f"**{e}**: alignment SCIQL {a['sciql']:.3f} ± {sd_a['sciql']:.3f} vs CBC {a['cbc']:.3f} ± "
                f"{sd_a['cbc']:.3f} vs BC {a['bc']:.3f} (chance {v['chance']:.3f}; SCIQL above CBC in "
                f"{v['seeds_sciql_above_cbc']}/{v['seeds']} seeds); GAWR alignment {a['gawr']:.3f}, normalised "
                f"return {r['gawr']:.3f} ± {sd_r['gawr']:.3f} vs SCIQL {r['sciql']:.3f} ± {sd_r['sciql']:.3f}; "
                f"task-only IQL return {r['task_iql']:.3f}, alignment {a['task_iql']:.3f}.")
        per = v["per_style"]
        for s, by_m in per.items():
            text += (f" Criterion `{s}`: SCIQL {by_m['sciql']['alignment']:.3f} vs CBC "
                     f"{by_m['cbc']['alignment']:.3f}.")
        if max(r.values()) < 0.5:
            text += (f" No method gets close to the scripted expert here (best normalised return "
                     f"{max(r.values()):.3f}): at this training length the learned policies do not reproduce "
                     "the expert behaviour, so the return comparisons are between weak policies.")
        if max(sd_r.values()) > 0.1:
            worst = max(sd_r, key=sd_r.get)
            text += (f" Seed spread is large for some methods (return seed std up to {sd_r[worst]:.3f} for "
                     f"{LABEL[worst]}), so differences smaller than that are not resolved by {v['seeds']} seeds.")
        parts.append(text)
    return "\n\n".join(parts)
