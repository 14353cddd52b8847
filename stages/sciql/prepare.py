"""prepare@sciql: scripted diverse behaviour datasets for Circle2D and HalfCheetah-v5, labelled.

    python -m stages prepare sciql [--profile smoke]

Circle2D: the official traj2d data — one circle-follower per episode (random centre, radius,
direction, constant speed, turn noise), none on the task circle. HalfCheetah: episodes of two
scripted sinusoidal gait segments plus Gaussian action noise. Both are labelled by the configured
labelling functions (``styles``) and stored as an HF ``datasets`` table under
``<out>/<env>/``; ``meta.json`` holds observation statistics, label vocabularies and the reference
returns used to normalise task return (uniform-random policy = 0, scripted expert = 1).
"""
from __future__ import annotations

import time

import numpy as np
from typing import Literal

from pydantic import Field, model_validator

from stages.common.config import Seed, StageConfig
from stages.common.sources import SourceConfig
from stages.common.paths import write_json
from stages.sciql import data as D
from stages.sciql.envs import LABELLERS, make_env


C2D_STYLES = Literal["speed", "turn", "direction", "position"]
HC_STYLES = Literal["speed", "direction"]


class EnvData(StageConfig):
    episodes: int = Field(..., ge=2, le=100_000)
    max_steps: int = Field(..., ge=10, le=1000)     # episode length (the reference: 1000)


class Circle2DData(EnvData):
    styles: list[C2D_STYLES] = Field(..., min_length=1)      # labelling functions (stages/sciql/envs.py)
    turn_noise_max: float = Field(0.2, ge=0.0, le=1.0)       # per-episode turn-noise std ~ U(0, this), rad
    center_box: float = Field(30.0, gt=0.0, le=40.0)         # behaviour circle centres ~ U(±this)²
    radius_min: float = Field(3.0, gt=0.0, le=10.0)          # behaviour radii ~ U(radius_min, radius_max)
    radius_max: float = Field(10.0, gt=0.0, le=10.0)         # (centre_box + radius_max < walls at 50)
    task_margin: float = Field(2.0, ge=0.0, le=10.0)         # redraw circles whose mean distance to the task ring < this·σ
    history: int = Field(4, ge=1, le=16)                     # states stacked per observation, newest first (official yaml: 4)


class HalfCheetahData(EnvData):
    styles: list[HC_STYLES] = Field(..., min_length=1)
    noise: float = Field(0.1, ge=0.0, le=1.0)       # std of Gaussian noise on normalised actions
    gaits: int = Field(48, ge=4, le=1024)           # size of the random sinusoidal gait bank


class Config(StageConfig):
    seed: Seed = 0
    reference_episodes: int = Field(8, ge=1, le=1000)  # episodes to measure the random / expert returns
    circle2d: Circle2DData
    halfcheetah: HalfCheetahData | None = None      # null drops the MuJoCo part
    source: SourceConfig = SourceConfig()            # full only: kind file, dataset = a Minari HalfCheetah id/folder

    @model_validator(mode="after")
    def _styles_exist(self):
        for env in ("circle2d", "halfcheetah"):
            block = getattr(self, env)
            if block is None:
                continue
            if len(set(block.styles)) != len(block.styles):
                raise ValueError(f"{env}.styles: duplicate labelling function in {block.styles}")
        if self.circle2d.radius_min > self.circle2d.radius_max:
            raise ValueError("circle2d.radius_min: must not exceed circle2d.radius_max")
        return self


def halfcheetah_episodes(cfg: "Config", block: "HalfCheetahData") -> list[dict]:
    """The HalfCheetah episodes: the scripted generator (toy source) or a Minari dataset (kind file, the
    `full` profile's real source; at most ``block.episodes`` episodes, labelled like the generator's)."""
    if cfg.source.kind == "file":
        from stages.sciql.minari_source import load_minari_episodes

        return load_minari_episodes(cfg.source.dataset, "halfcheetah", key="papers.sciql.prepare.source.dataset",
                                    max_episodes=block.episodes)
    return D.generate_halfcheetah(block.episodes, block.max_steps, block.noise, block.gaits, cfg.seed)


def reference_returns(env_name: str, max_steps: int, episodes: int, seed: int, best_gait=None,
                      history: int = 1) -> dict[str, float]:
    """Mean return of the uniform-random policy and of a scripted task expert (circle2d: the
    circle-following controller on the task circle; halfcheetah: the dataset's fastest gait)."""
    rng = np.random.default_rng(seed)
    env = make_env(env_name, max_steps, history)
    out = {}
    for kind in ("random", "expert"):
        rets = []
        for ep in range(episodes):
            obs, _ = env.reset(seed=int(rng.integers(2**31)))
            total = 0.0
            for t in range(max_steps):
                if kind == "random":
                    a = rng.uniform(-1, 1, size=env.action_space.shape)
                elif env_name == "circle2d":
                    a = np.array([D.circle_controller(env.state[:2], env.state[2], env.center, env.radius, 1.0,
                                                      env.max_delta_theta), 0.0])
                else:
                    a = D.sinusoid_action(best_gait, t)
                obs, r, term, trunc, _ = env.step(a)
                total += r
                if term or trunc:
                    break
            rets.append(total)
        out[kind] = float(np.mean(rets))
    env.close()
    return out


def run(cfg: Config, ctx) -> None:
    for env_name in ("circle2d", "halfcheetah"):
        block = getattr(cfg, env_name)
        if block is None:
            continue
        print(f"prepare@sciql: generating {block.episodes} {env_name} episodes of {block.max_steps} steps")
        if env_name == "circle2d":
            episodes = D.generate_circle2d(block.episodes, block.max_steps, block.turn_noise_max, block.center_box,
                                           (block.radius_min, block.radius_max), block.task_margin, cfg.seed,
                                           block.history)
            act_dim = 2
            history = block.history
        else:
            episodes = halfcheetah_episodes(cfg, block)
            act_dim = 6
            history = 1
        D.label_episodes(env_name, episodes, block.styles)
        table = D.to_table(episodes, block.styles)
        D.save_dataset(table, ctx.out / env_name)
        labels = {}
        for s in block.styles:
            lab = LABELLERS[env_name][s]
            counts = np.bincount(table[f"label_{s}"], minlength=lab.num_labels)
            labels[s] = {"num_labels": lab.num_labels, "promptable": list(lab.promptable),
                         "names": list(lab.label_names), "counts": counts.tolist()}
        best = D.gait_bank(block.gaits, cfg.seed)[-1] if env_name == "halfcheetah" else None
        refs = reference_returns(env_name, block.max_steps, cfg.reference_episodes, cfg.seed + 100, best, history)
        ep_returns = [float(ep["reward"].sum()) for ep in episodes]
        extra = {}
        if env_name == "circle2d":  # share of dataset steps pinned at a wall (the official walls at ±50)
            lim = make_env("circle2d", 1).limit
            extra["wall_step_share"] = float(np.mean([np.mean(np.abs(ep["xy"][1:]).max(-1) >= lim) for ep in episodes]))
        meta = {"env": env_name, "styles": block.styles, "labels": labels, "obs_dim": int(table["obs"].shape[1]),
                "act_dim": act_dim, "max_steps": block.max_steps, "history": history, "transitions": int(len(table["reward"])),
                "episodes": len(episodes), "obs_mean": table["obs"].mean(0).tolist(),
                "obs_std": table["obs"].std(0).tolist(), "reference_return": refs,
                "dataset_return": {"mean": float(np.mean(ep_returns)), "max": float(np.max(ep_returns)),
                                   "min": float(np.min(ep_returns))}, **extra}
        write_json(ctx.out / env_name / "meta.json", meta)
        print(f"  {meta['transitions']} transitions; label counts "
              + "; ".join(f"{s}: {labels[s]['counts']}" for s in block.styles)
              + f"; returns random {refs['random']:.1f} expert {refs['expert']:.1f} dataset mean "
              f"{meta['dataset_return']['mean']:.1f}")
    write_json(ctx.out / "cpu_time.json", {"cpu_s": time.process_time()})
