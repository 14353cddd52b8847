"""evaluate@sciql: rollouts in Circle2D / HalfCheetah-v5 commanded with each style; offline objectives.

    python -m stages evaluate sciql [--profile smoke]

For every env, seed, style criterion and method, the policy (mean action) is rolled out from the same
seeded start states once per commanded style z (promptable labels); style-free policies (BC,
task-only IQL) are rolled out once and scored against every z (their mean alignment over z is the
chance level by construction; the claims compare it with SCIQL's, never with chance). Per episode:
    alignment(z)   = share of timesteps whose label (the labelling function on the rollout) equals z
    norm_return    = (R − R_random) / (R_expert − R_random)   (prepare's reference returns)
Learning curves: the actor snapshots saved by train are rolled out the same way with fewer episodes.
The batched policy-loss evaluation — every actor's GAWR objective −E[w log π] and the expectile
losses of the values over ``diagnostic_rows`` dataset rows, labels relabelled with the probabilities
train used — runs through kernels/gawr_loss.py (recorded in kernels.json).

Each trained suite (and ablation suite) is evaluated by ``eval_run`` in a pool of ``workers`` single-threaded
processes (``stages.common.jobs``): its rollouts start from fixed seeded states and its policy-loss sample has
its own generator, so its rows do not depend on the pool; the parent joins them in the serial order.
"""
from __future__ import annotations

import os
import numpy as np
import polars as pl
import torch
from pydantic import Field

from kernels.gawr_loss import expectile_loss, gawr_actor_loss, gawr_weights
from kernels.record import KernelRecord
from stages.common.config import Seed, StageConfig
from stages.common.device import DeviceName, pick_device
from stages.common.jobs import payload, run_jobs
from stages.common.paths import read_json, write_json
from stages.sciql import algos
from stages.sciql import data as D
from stages.sciql.envs import LABELLERS, make_env

CONDITIONED = ("cbc", "sciql", "gawr")
METHODS = algos.METHODS


class Config(StageConfig):
    seed: Seed = 1234
    workers: int = Field(1, ge=1, le=64, description=(
        "processes for the independent suite evaluations, one intra-op thread each (1: in this process, same results)"))
    device: DeviceName = "auto"
    episodes: int = Field(6, ge=1, le=1000)              # rollouts per commanded style, seed and method
    curve_episodes: int = Field(2, ge=1, le=1000)        # ... per learning-curve snapshot
    diagnostic_rows: int = Field(8192, ge=64, le=10_000_000)  # dataset rows for the batched policy loss


def load_module(path, device="cpu"):
    ckpt = torch.load(path, weights_only=False, map_location=device)
    hp = dict(ckpt["hparams"])
    module = algos.MODULES[ckpt["kind"]](obs_mean=torch.tensor(ckpt["obs_mean"]),
                                         obs_std=torch.tensor(ckpt["obs_std"]), **hp)
    module.load_state_dict(ckpt["state_dict"])
    module.ckpt = ckpt
    return module.to(device).eval()


def rollout(envs, env_name: str, policy, labels: np.ndarray, seeds: list[int], device="cpu") -> list[dict]:
    """Run len(seeds) episodes in lockstep; policy(obs (N, obs_dim), labels (N,)) -> actions (N, act_dim)."""
    n = len(seeds)
    obs, episodes = [], []
    for env, s in zip(envs[:n], seeds):
        o, info = env.reset(seed=int(s))
        obs.append(o)
        ep = {"reward": []}
        if env_name == "circle2d":
            ep.update(xy=[info["xy"]], heading=[info["heading"]], speed=[])
        else:
            ep.update(x_velocity=[])
        episodes.append(ep)
    done = np.zeros(n, dtype=bool)
    lab = torch.as_tensor(np.asarray(labels), dtype=torch.long, device=device)
    while not done.all():
        act = policy(torch.as_tensor(np.stack(obs), dtype=torch.float32, device=device), lab).clamp(-1, 1).cpu().numpy()
        for i in np.flatnonzero(~done):
            o, r, term, trunc, info = envs[i].step(act[i])
            obs[i] = o
            ep = episodes[i]
            ep["reward"].append(r)
            if env_name == "circle2d":
                ep["xy"].append(info["xy"])
                ep["heading"].append(info["heading"])
                ep["speed"].append(info["speed"])
            else:
                ep["x_velocity"].append(info["x_velocity"])
            done[i] = term or trunc
    return [{k: np.asarray(v) for k, v in ep.items()} for ep in episodes]


@torch.no_grad()
def offline_objectives(module, data: dict, style: str, cfg: Config, rec: KernelRecord, chunk: int = 4096) -> dict:
    """Batched policy-loss evaluation over ``cfg.diagnostic_rows`` dataset rows, all seed members at once:
    each actor's GAWR objective −E[w log π(a|s,z)], its mean weight and clipped share, and the expectile
    losses of the style / task values. Labels are relabelled with the probabilities train used."""
    hp, ckpt = dict(module.hparams), module.ckpt
    device = next(module.parameters()).device
    gen = torch.Generator().manual_seed(cfg.seed)
    sampler = D.HindsightSampler(data, style, ckpt["value_relabel"], ckpt["actor_relabel"], ckpt["geom_lambda"],
                                 gen, reward_scale=ckpt["reward_scale"])
    E = hp["n_seeds"]
    rows = torch.randperm(sampler.n, generator=gen)[:cfg.diagnostic_rows]
    sums: dict[str, torch.Tensor] = {}
    flat = lambda x: x.reshape(-1, *x.shape[2:])
    per_seed = lambda x: x.view(E, -1)
    for start in range(0, len(rows), chunk):
        idx = rows[start:start + chunk]
        n = len(idx)
        rep = lambda x: x.to(device).unsqueeze(0).expand(E, *x.shape)
        obs, act = rep(module.norm(data["obs"][idx].to(device))), rep(data["action"][idx])
        z_v, z_a = rep(sampler.relabel(idx, sampler.value_probs)), rep(sampler.relabel(idx, sampler.actor_probs))
        out = {}
        for sys, label in (("style", z_v), ("task", None)):
            iql = getattr(module, sys)
            q, v = iql.target(obs, act, label).min(0).values, iql.value(obs, label)
            # per-row expectile loss of every seed member in one kernel call (a mean over n rows per seed)
            out[f"{sys}_expectile_loss"] = torch.stack([rec.call("expectile_loss", expectile_loss, q[e], v[e],
                                                                 hp["expectile"]) for e in range(E)])
        a_z, a_r = module.style.advantage(obs, act, z_a), module.task.advantage(obs, act)
        dists = module.policies(obs, {nm: z_a for nm, (c, _) in module.actors.items() if c})
        for name, gated in (("sciql", False), ("gawr", True)):
            mu, log_std = dists[name]
            adv_r = a_r if gated else torch.zeros_like(a_r)
            # ALGO: GAWR objective −E[w log π], w = min(exp(β(A_z + σ(A_z)A_r)), clip): one fused call per seed
            out[f"{name}_gawr_objective"] = torch.stack([
                rec.call("gawr_actor_loss", gawr_actor_loss, mu[e], log_std[e], act[e], a_z[e], adv_r[e],
                         hp["beta"], hp["clip"], gated) for e in range(E)])
            w = per_seed(rec.call("gawr_weights", gawr_weights, flat(a_z), flat(adv_r), hp["beta"], hp["clip"], gated))
            out[f"{name}_weight_mean"] = w.mean(1)
            out[f"{name}_weight_clipped_frac"] = (w >= hp["clip"]).float().mean(1)
        if start == 0:  # Triton vs reference on the first 64 real rows of this batch (seed member 0)
            where = f"first 64 relabelled dataset rows of {style}, seed member 0"
            rec.parity("gawr_actor_loss", gawr_actor_loss, mu[0, :64], log_std[0, :64], act[0, :64], a_z[0, :64],
                       a_r[0, :64], hp["beta"], hp["clip"], True, slice=where)
            rec.parity("gawr_weights", gawr_weights, a_z[0, :64], a_r[0, :64], hp["beta"], hp["clip"], True,
                       slice=where)
            rec.parity("expectile_loss", expectile_loss, q[0, :64], v[0, :64], hp["expectile"], slice=where)
        for k, val in out.items():
            sums[k] = sums.get(k, 0.0) + val * n
    return {k: v / len(rows) for k, v in sums.items()}


def evaluate_suite(module, envs, env_name: str, style: str, seed_index: int, starts: list[int], ref: dict,
                   device, methods=METHODS) -> list[dict]:
    """Roll out every method of one suite (one seed member) with every promptable command; rows per episode."""
    lab = LABELLERS[env_name][style]
    promptable = list(lab.promptable)
    rows, traj = [], {}

    def record(method, eps, z):
        for e, ep in enumerate(eps):
            ret = float(ep["reward"].sum())
            rows.append({"style": style, "method": method, "z": int(z), "z_name": lab.label_names[int(z)],
                         "episode": e, "alignment": float(np.mean(lab(ep) == z)), "return": ret,
                         "norm_return": (ret - ref["random"]) / (ref["expert"] - ref["random"])})

    for method in methods:
        if method in CONDITIONED:
            cmd = np.repeat(promptable, len(starts))
            eps = rollout(envs, env_name, lambda o, z: module.act(method, o, z, seed_index), cmd,
                          starts * len(promptable), device)
            for z in promptable:
                sel = [eps[i] for i in range(len(eps)) if cmd[i] == z]
                record(method, sel, z)
                traj[f"{method}|{style}|{z}"] = np.stack([ep["xy"] for ep in sel]) if env_name == "circle2d" else None
        else:  # style-free: one rollout set, scored against every z
            eps = rollout(envs, env_name, lambda o, z: module.act(method, o, None, seed_index),
                          np.zeros(len(starts)), starts, device)
            for z in promptable:
                record(method, eps, z)
                traj[f"{method}|{style}|{z}"] = np.stack([ep["xy"] for ep in eps]) if env_name == "circle2d" else None
    return rows, traj


def merge_into(rec: KernelRecord, entries: dict) -> None:
    """Add a job's KernelRecord entries to ``rec`` as if its calls had been made on ``rec`` (calls add up; the
    job's parity, when it checked one, is the latest slice; the worst error is kept)."""
    for name, e in entries.items():
        o = rec._entry(name)
        o["calls"] += e["calls"]
        if e["slice"] is not None:
            o["slice"] = e["slice"]
        if e["parity_backend"] is not None:
            o["parity_backend"] = e["parity_backend"]
        if e["parity_max_abs_err"] is not None:
            prev = o["parity_max_abs_err"]
            o["parity_max_abs_err"] = e["parity_max_abs_err"] if prev is None else max(prev, e["parity_max_abs_err"])


def eval_run(job: tuple) -> dict:
    """Evaluate one trained suite (a job of ``jobs.run_jobs``: kind "suite" or "ablation", env, style,
    checkpoint; inputs from its payload): rollout rows, learning-curve rows, ablation rows, offline objectives,
    Circle2D trajectories of seed 0, and its kernel record."""
    kind, env_name, _, path = job
    p = payload()
    cfg, device, seeds = Config.model_validate(p["cfg"]), torch.device(p["device"]), p["seeds"]
    meta = p["meta"][env_name]
    rec = KernelRecord(device)
    ref, styles = meta["reference_return"], meta["styles"]
    n_max = max(cfg.episodes, cfg.curve_episodes) * max(len(LABELLERS[env_name][s].promptable) for s in styles)
    envs = [make_env(env_name, meta["max_steps"], meta.get("history", 1)) for _ in range(n_max)]
    starts = [cfg.seed + 7919 * e for e in range(cfg.episodes)]
    curve_starts = [cfg.seed + 104729 + 7919 * e for e in range(cfg.curve_episodes)]
    module = load_module(path, device)
    style = module.ckpt["style"]
    out = {"rows": [], "curves": [], "ablation": [], "diagnostics": [], "trajectories": {}}
    if kind == "suite":
        print(f"evaluate@sciql: {env_name} {style}: rollouts of {len(seeds)} seeds, "
              f"{len(module.ckpt['snapshots'])} learning-curve snapshots", flush=True)
        final_policy = {k: v.clone() for k, v in module.policies.state_dict().items()}
        for e, seed in enumerate(seeds):
            r, traj = evaluate_suite(module, envs, env_name, style, e, starts, ref, device)
            out["rows"] += [{"env": env_name, "seed": seed, **x} for x in r]
            if e == 0 and env_name == "circle2d":
                out["trajectories"].update(traj)
        for step, weights in sorted(module.ckpt["snapshots"].items()):
            module.policies.load_state_dict(weights)
            for e, seed in enumerate(seeds):
                r, _ = evaluate_suite(module, envs, env_name, style, e, curve_starts, ref, device)
                out["curves"] += [{"env": env_name, "seed": seed, "step": int(step), **x} for x in r]
        module.policies.load_state_dict(final_policy)
        diag = offline_objectives(module, p["data"][env_name], style, cfg, rec)
        for e, seed in enumerate(seeds):
            out["diagnostics"].append({"env": env_name, "style": style, "seed": seed,
                                       **{k: float(v[e]) for k, v in diag.items()}})
    else:
        print(f"evaluate@sciql: {env_name} {style}: relabelling ablation {module.ckpt['value_relabel']}", flush=True)
        for e, seed in enumerate(seeds):
            r, _ = evaluate_suite(module, envs, env_name, style, e, starts, ref, device,
                                  methods=("cbc", "sciql", "gawr"))
            out["ablation"] += [{"env": env_name, "seed": seed, "relabel": str(module.ckpt["value_relabel"]), **x}
                                for x in r]
    for env in envs:
        env.close()
    out["kernels"] = rec.to_dict()
    return out


def run(cfg: Config, ctx) -> None:
    torch.set_num_threads(1)
    device = pick_device(cfg.device)
    rec = KernelRecord(device)
    prep, trained = ctx.input("prepare"), ctx.input("train")
    seeds = read_json(trained / "train_summary.json")["config"]["seeds"]
    metas, datas, jobs = {}, {}, []
    for env_name in ("circle2d", "halfcheetah"):
        if not (trained / env_name).exists():
            continue
        metas[env_name] = read_json(prep / env_name / "meta.json")
        datas[env_name] = D.load_dataset(prep / env_name, metas[env_name]["styles"])
        jobs += [("suite", env_name, style, str(trained / env_name / f"suite_{style}.pt"))
                 for style in metas[env_name]["styles"]]
        jobs += [("ablation", env_name, path.stem.split("_", 1)[1], str(path))
                 for path in sorted((trained / env_name).glob("ablation_*.pt"))]
    # the longest first (as measured): full suites (rollouts, learning curves, policy loss) before the ablations
    # (3 methods' final rollouts), HalfCheetah (MuJoCo steps) before Circle2D, then the most commandable labels
    # (a rollout set per label); ties keep the serial order
    order = sorted(range(len(jobs)), key=lambda i: (jobs[i][0] != "suite", jobs[i][1] != "halfcheetah",
                                                     -len(LABELLERS[jobs[i][1]][jobs[i][2]].promptable)))
    data = {"cfg": cfg.model_dump(mode="json"), "device": str(device), "seeds": seeds, "meta": metas, "data": datas}
    done = run_jobs(eval_run, [jobs[i] for i in order], data, cfg.workers)
    results = [None] * len(jobs)
    for i, r in zip(order, done):
        results[i] = r
    rows, curves, ablation, diagnostics, trajectories = [], [], [], [], {}
    for r in results:                                          # the serial order
        rows += r["rows"]
        curves += r["curves"]
        ablation += r["ablation"]
        diagnostics += r["diagnostics"]
        trajectories.update(r["trajectories"])
        merge_into(rec, r["kernels"])
    pl.DataFrame(rows).write_parquet(ctx.out / "rollouts.parquet")
    pl.DataFrame(curves, schema_overrides={"step": pl.Int64}).write_parquet(ctx.out / "curves.parquet")
    pl.DataFrame(ablation).write_parquet(ctx.out / "ablation.parquet")
    pl.DataFrame(diagnostics).write_parquet(ctx.out / "offline_objectives.parquet")
    np.savez_compressed(ctx.out / "trajectories_circle2d.npz", **trajectories)
    rec.save(ctx.out)
    write_json(ctx.out / "summary.json", {"rollout_episodes": len(rows), "episodes_per_style": cfg.episodes,
                                          "curve_episodes_per_style": cfg.curve_episodes})
    t = os.times()   # CPU seconds of this process and of the pool's (finished) workers
    write_json(ctx.out / "cpu_time.json", {"cpu_s": t.user + t.system + t.children_user + t.children_system})
