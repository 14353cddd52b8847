"""evaluate@sciql: rollouts in Circle2D / HalfCheetah-v5 commanded with each style; offline objectives.

    python -m stages evaluate sciql [--profile smoke]

For every env, seed, style criterion and method, the policy (mean action) is rolled out from the same
seeded start states once per commanded style z (promptable labels); style-free policies (BC,
task-only IQL) are rolled out once and scored against every z. Per episode:
    alignment(z)   = share of timesteps whose label (the labelling function on the rollout) equals z
    norm_return    = (R − R_random) / (R_expert − R_random)   (prepare's reference returns)
The offline diagnostics — expectile losses of the learned values and each actor's GAWR objective on
the dataset with hindsight-relabelled styles — run through kernels.gawr_loss (the hot loop).
"""
from __future__ import annotations

import time
from typing import Literal

import numpy as np
import polars as pl
import torch
from pydantic import Field

from stages.common.config import StageConfig
from stages.common.paths import read_json, write_json
from kernels.gawr_loss import expectile_loss, gawr_actor_loss, gawr_weights
from stages.sciql import algos
from stages.sciql import data as D
from stages.sciql.envs import LABELLERS, make_env

CONDITIONED = ("cbc", "sciql", "gawr")


class Config(StageConfig):
    seed: int = 1234
    episodes: int = Field(6, ge=1)       # rollouts per commanded style, seed and method
    diagnostic_rows: int = Field(8192, ge=1)  # dataset rows for the offline objectives
    kernel_backend: Literal["auto", "triton", "torch"] = "auto"


def load_module(path):
    ckpt = torch.load(path, weights_only=False)
    hp = dict(ckpt["hparams"])
    module = algos.MODULES[ckpt["kind"]](obs_mean=torch.tensor(ckpt["obs_mean"]),
                                         obs_std=torch.tensor(ckpt["obs_std"]), **hp)
    module.load_state_dict(ckpt["state_dict"])
    return module.eval()


def rollout(envs, env_name: str, policy, labels: np.ndarray, seeds: list[int]) -> list[dict]:
    """Run len(seeds) episodes in lockstep; policy(obs (N, obs_dim), labels (N,)) -> actions (N, act_dim)."""
    n = len(seeds)
    obs, episodes = [], []
    for env, s in zip(envs[:n], seeds):
        o, info = env.reset(seed=int(s))
        obs.append(o)
        ep = {"reward": []}
        if env_name == "circle2d":
            ep.update(xy=[info["xy"]], heading=[info["heading"]])
        else:
            ep.update(x_velocity=[])
        episodes.append(ep)
    done = np.zeros(n, dtype=bool)
    lab = torch.as_tensor(labels, dtype=torch.long)
    while not done.all():
        act = policy(torch.as_tensor(np.stack(obs), dtype=torch.float32), lab).clamp(-1, 1).numpy()
        for i in np.flatnonzero(~done):
            o, r, term, trunc, info = envs[i].step(act[i])
            obs[i] = o
            ep = episodes[i]
            ep["reward"].append(r)
            if env_name == "circle2d":
                ep["xy"].append(info["xy"])
                ep["heading"].append(info["heading"])
            else:
                ep["x_velocity"].append(info["x_velocity"])
            done[i] = term or trunc
    return [{k: np.asarray(v) for k, v in ep.items()} for ep in episodes]


@torch.no_grad()
def offline_objectives(module, data: dict, style: str, cfg: Config, train_hp: dict, chunk: int = 2048) -> dict:
    """Per seed member: expectile losses of the style / task values and each actor's GAWR objective on
    ``cfg.diagnostic_rows`` dataset rows (labels hindsight-relabelled as in training), via the fused kernels."""
    gen = torch.Generator().manual_seed(cfg.seed)
    sampler = D.HindsightSampler(data, style, [0.2, 0.5, 0.3], [0.2, 0.5, 0.3], 0.99, gen)
    E = train_hp["n_seeds"]
    sums: dict[str, torch.Tensor] = {}
    rows = torch.randperm(sampler.n, generator=gen)[:cfg.diagnostic_rows]
    n_total = len(rows)
    for start in range(0, n_total, chunk):
        idx = rows[start:start + chunk]
        rep = lambda x: x.unsqueeze(0).expand(E, *x.shape)
        obs, act = rep(module.norm(data["obs"][idx])), rep(data["action"][idx])
        z_v, z_a = rep(sampler.relabel(idx, sampler.value_probs)), rep(sampler.relabel(idx, sampler.actor_probs))
        out = {}
        for sys, label in (("style", z_v), ("task", None)):
            iql = getattr(module, sys)
            q, v = iql.target(obs, act, label).min(0).values, iql.value(obs, label)
            out[f"{sys}_expectile_loss"] = torch.stack([
                expectile_loss(q[e], v[e], train_hp["expectile"], backend=cfg.kernel_backend) for e in range(E)])
        a_z, a_r = module.style.advantage(obs, act, z_a), module.task.advantage(obs, act)
        dists = module.policies(obs, {n: z_a for n, (c, _) in module.actors.items() if c})
        for name, gated in (("sciql", False), ("gawr", True)):
            mu, log_std = dists[name]
            adv_r = a_r if gated else torch.zeros_like(a_r)
            out[f"{name}_gawr_objective"] = torch.stack([
                gawr_actor_loss(mu[e], log_std[e], act[e], a_z[e], adv_r[e], train_hp["beta"], train_hp["clip"],
                                gated, backend=cfg.kernel_backend) for e in range(E)])
            w = torch.stack([gawr_weights(a_z[e], adv_r[e], train_hp["beta"], train_hp["clip"], gated,
                                          backend=cfg.kernel_backend) for e in range(E)])
            out[f"{name}_weight_mean"] = w.mean(1)
            out[f"{name}_weight_clipped_frac"] = (w >= train_hp["clip"]).float().mean(1)
        for k, v in out.items():
            sums[k] = sums.get(k, 0.0) + v * len(idx)
    return {k: v / n_total for k, v in sums.items()}


def run(cfg: Config, ctx) -> None:
    torch.set_num_threads(1)
    prep, trained = ctx.input("prepare"), ctx.input("train")
    rows, diagnostics, trajectories = [], [], {}
    for env_name in ("circle2d", "halfcheetah"):
        if not (trained / env_name).exists():
            continue
        meta = read_json(prep / env_name / "meta.json")
        data = D.load_dataset(prep / env_name, meta["styles"])
        ref = meta["reference_return"]
        styles = meta["styles"]
        suites = {s: load_module(trained / env_name / f"suite_{s}.pt") for s in styles}
        seeds = read_json(trained / "train_summary.json")["config"]["seeds"]
        n_max = cfg.episodes * max(len(LABELLERS[env_name][s].promptable) for s in styles)
        envs = [make_env(env_name, meta["max_steps"]) for _ in range(n_max)]
        starts = [cfg.seed + 7919 * e for e in range(cfg.episodes)]

        def record(seed, method, style, z, eps, cmd_per_ep):
            lab = LABELLERS[env_name][style]
            for e, (ep, zc) in enumerate(zip(eps, cmd_per_ep)):
                labels = lab(ep)
                ret = float(ep["reward"].sum())
                rows.append({"env": env_name, "style": style, "seed": seed, "method": method,
                             "z": int(zc), "z_name": lab.label_names[int(zc)], "episode": e % cfg.episodes,
                             "alignment": float(np.mean(labels == zc)), "return": ret,
                             "norm_return": (ret - ref["random"]) / (ref["expert"] - ref["random"])})

        for e, seed in enumerate(seeds):
            print(f"evaluate@sciql: {env_name} seed {seed}: rollouts")
            for style in styles:
                module = suites[style]
                promptable = list(LABELLERS[env_name][style].promptable)
                for method in ("bc", "task_iql"):  # style-free: one rollout set, scored against every z
                    eps = rollout(envs, env_name, lambda o, z: module.act(method, o, None, e),
                                  np.zeros(cfg.episodes), starts)
                    for z in promptable:
                        record(seed, method, style, z, eps, [z] * len(eps))
                        if env_name == "circle2d" and e == 0:
                            trajectories[f"{method}|{style}|{z}"] = np.stack([ep["xy"] for ep in eps])
                cmd = np.repeat(promptable, cfg.episodes)
                ep_seeds = starts * len(promptable)
                for method in CONDITIONED:
                    eps = rollout(envs, env_name, lambda o, z: module.act(method, o, z, e), cmd, ep_seeds)
                    for z in promptable:
                        sel = [i for i in range(len(eps)) if cmd[i] == z]
                        record(seed, method, style, z, [eps[i] for i in sel], [z] * len(sel))
                        if env_name == "circle2d" and e == 0:
                            trajectories[f"{method}|{style}|{z}"] = np.stack([eps[i]["xy"] for i in sel])
        for style in styles:
            diag = offline_objectives(suites[style], data, style, cfg, dict(suites[style].hparams))
            for e, seed in enumerate(seeds):
                diagnostics.append({"env": env_name, "style": style, "seed": seed,
                                    **{k: float(v[e]) for k, v in diag.items()}})
        for env in envs:
            env.close()
    pl.DataFrame(rows).write_parquet(ctx.out / "rollouts.parquet")
    pl.DataFrame(diagnostics).write_parquet(ctx.out / "offline_objectives.parquet")
    np.savez_compressed(ctx.out / "trajectories_circle2d.npz", **trajectories)
    write_json(ctx.out / "summary.json", {"rollout_episodes": len(rows), "episodes_per_style": cfg.episodes,
                                          "kernel_backend": cfg.kernel_backend})
    write_json(ctx.out / "cpu_time.json", {"cpu_s": time.process_time()})
