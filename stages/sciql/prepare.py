"""prepare@sciql: scripted diverse behaviour datasets for Circle2D and HalfCheetah-v5, labelled.

    python -m stages prepare sciql [--profile smoke]

Per environment: episodes of two scripted behaviour segments plus Gaussian action noise, labelled
by the configured labelling functions (``styles``), stored as an HF ``datasets`` table under
``<out>/<env>/``; ``meta.json`` holds observation statistics, label vocabularies and the reference
returns used to normalise task return (uniform-random policy = 0, scripted expert = 1).
"""
from __future__ import annotations

import time

import numpy as np
from pydantic import Field, model_validator

from stages.common.config import StageConfig
from stages.common.paths import write_json
from stages.sciql import data as D
from stages.sciql.envs import LABELLERS, make_env


class EnvData(StageConfig):
    episodes: int = Field(..., ge=2)
    max_steps: int = Field(..., ge=10)
    noise: float = Field(0.1, ge=0.0, le=1.0)       # std of Gaussian noise on normalised actions
    styles: list[str]                               # labelling-function names (see stages/sciql/envs.py)


class Circle2DData(EnvData):
    target_prob: float = Field(0.3, ge=0.0, le=1.0)  # share of circle segments drawn on the task circle


class HalfCheetahData(EnvData):
    gaits: int = Field(48, ge=4)                    # size of the random sinusoidal gait bank


class Config(StageConfig):
    seed: int = 0
    reference_episodes: int = Field(8, ge=1)        # episodes to measure the random / expert returns
    circle2d: Circle2DData
    halfcheetah: HalfCheetahData | None = None      # null drops the MuJoCo part

    @model_validator(mode="after")
    def _styles_exist(self):
        for env in ("circle2d", "halfcheetah"):
            block = getattr(self, env)
            if block is None:
                continue
            if not block.styles:
                raise ValueError(f"{env}.styles: the style set is empty; name at least one labelling "
                                 f"function ({', '.join(LABELLERS[env])})")
            unknown = [s for s in block.styles if s not in LABELLERS[env]]
            if unknown:
                raise ValueError(f"{env}.styles: unknown labelling function {unknown[0]!r} "
                                 f"(known for {env}: {', '.join(LABELLERS[env])})")
            if len(set(block.styles)) != len(block.styles):
                raise ValueError(f"{env}.styles: duplicate labelling function in {block.styles}")
        return self


def reference_returns(env_name: str, max_steps: int, episodes: int, seed: int, best_gait=None) -> dict[str, float]:
    """Mean return of the uniform-random policy and of a scripted task expert (circle2d: the
    circle-following controller on the task circle; halfcheetah: the dataset's fastest gait)."""
    rng = np.random.default_rng(seed)
    env = make_env(env_name, max_steps)
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
            episodes = D.generate_circle2d(block.episodes, block.max_steps, block.noise, block.target_prob, cfg.seed)
            act_dim = 2
        else:
            episodes = D.generate_halfcheetah(block.episodes, block.max_steps, block.noise, block.gaits, cfg.seed)
            act_dim = 6
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
        refs = reference_returns(env_name, block.max_steps, cfg.reference_episodes, cfg.seed + 100, best)
        ep_returns = [float(ep["reward"].sum()) for ep in episodes]
        meta = {"env": env_name, "styles": block.styles, "labels": labels, "obs_dim": int(table["obs"].shape[1]),
                "act_dim": act_dim, "max_steps": block.max_steps, "transitions": int(len(table["reward"])),
                "episodes": block.episodes, "obs_mean": table["obs"].mean(0).tolist(),
                "obs_std": table["obs"].std(0).tolist(), "reference_return": refs,
                "dataset_return": {"mean": float(np.mean(ep_returns)), "max": float(np.max(ep_returns))}}
        write_json(ctx.out / env_name / "meta.json", meta)
        print(f"  {meta['transitions']} transitions; label counts "
              + "; ".join(f"{s}: {labels[s]['counts']}" for s in block.styles)
              + f"; returns random {refs['random']:.1f} expert {refs['expert']:.1f} dataset mean "
              f"{meta['dataset_return']['mean']:.1f}")
    write_json(ctx.out / "cpu_time.json", {"cpu_s": time.process_time()})
