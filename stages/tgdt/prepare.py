"""prepare@tgdt: expert + medium trajectories of every task, stored as an HF ``datasets`` table.

    python -m stages prepare tgdt [--profile smoke]

Per environment (``envs``: pointmass and/or halfcheetah) and per task (direction × speed; see
stages/tgdt/envs.py), ``expert_episodes`` episodes of the scripted expert (point mass: the one-step
velocity controller + small noise; HalfCheetah: the sinusoidal gait of a random gait bank with the
highest noise-free return on the task's reward) and ``medium_episodes`` of the same controller
with heavy action noise. Held-out tasks get trajectories too (split column ``held_out``) but train
never reads them: evaluate uses them only for text→trajectory retrieval. ``meta.json`` holds the
task list, the training vocabulary, observation statistics of the training data, and per task the
reference returns used to normalise (uniform-random policy = 0, scripted expert = 1).
"""
from __future__ import annotations

from typing import Literal

import numpy as np
from datasets import Dataset
from pydantic import Field, field_validator, model_validator

from stages.common.config import Seed, StageConfig, unique_items
from stages.common.paths import write_json
from stages.common.sources import SourceConfig, SourceError
from stages.tgdt import envs as E

EnvName = Literal["pointmass", "halfcheetah"]


class EnvData(StageConfig):
    expert_episodes: int = Field(..., ge=1, le=10_000)   # per task
    medium_episodes: int = Field(..., ge=0, le=10_000)   # per task
    max_steps: int = Field(..., ge=4, le=1000)           # episode length
    expert_noise: float = Field(0.05, ge=0.0, le=1.0)    # action noise std of the expert
    medium_noise: float = Field(0.6, ge=0.0, le=2.0)     # action noise std of the medium controller
    gaits: int = Field(32, ge=2, le=1024)                # HalfCheetah gait bank size (ignored by pointmass)


class Config(StageConfig):
    seed: Seed = 0
    envs: list[EnvName] = Field(..., min_length=1)       # which environments (an unknown name is an error)
    reference_episodes: int = Field(4, ge=1, le=1000)    # episodes per task for the random / expert returns
    pointmass: EnvData | None = None
    halfcheetah: EnvData | None = None
    source: SourceConfig = SourceConfig()                # full only: kind file, dataset = a Minari datasets root
    minari_tasks: dict[str, dict[str, str]] = Field(default_factory=dict, description="with source kind file: "
                                                    "per env, task name '<direction> <speed>' -> Minari dataset id "
                                                    "under source.dataset (every task of the env, held-out ones too)")

    @field_validator("envs")
    @classmethod
    def _distinct(cls, v):
        return unique_items(v, "envs")

    @model_validator(mode="after")
    def _blocks(self):
        for env in self.envs:
            if getattr(self, env) is None:
                raise ValueError(f"{env}: envs lists {env!r} but its block is missing")
        return self


def rollout(env, policy, seed: int, max_steps: int):
    obs, _ = env.reset(seed=seed)
    O, A, R = [], [], []
    for t in range(max_steps):
        a = np.asarray(policy(obs, t), dtype=np.float32)
        O.append(obs)
        A.append(a)
        obs, r, term, trunc, _ = env.step(a)
        R.append(r)
        if term or trunc:
            break
    return np.asarray(O, np.float32), np.asarray(A, np.float32), np.asarray(R, np.float32)


def controllers(task: E.Task, env, rng: np.random.Generator, block: EnvData, gait=None):
    """expert / medium / random policies (obs, t) -> action for one task."""
    if task.env == "pointmass":
        base = lambda o, t: env.unwrapped.expert_action(o)
    else:
        base = lambda o, t: E.gait_action(gait, t)
    noisy = lambda sd: (lambda o, t: np.clip(base(o, t) + sd * rng.standard_normal(env.action_space.shape), -1, 1))
    return {"expert": noisy(block.expert_noise), "medium": noisy(block.medium_noise),
            "random": lambda o, t: rng.uniform(-1, 1, size=env.action_space.shape)}


def gait_bank(block: EnvData, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random sinusoidal gaits, one noise-free rollout each: per-step forward velocity (G, T) and
    control cost (G, T), so that every task can pick the gait with the highest return on its reward."""
    params = np.concatenate([rng.uniform(0.2, 1.0, (block.gaits, 6)), rng.uniform(0, 2 * np.pi, (block.gaits, 6))], 1)
    probe = E.Task("halfcheetah", -1, "forward", "slow", (0.0,), False)
    env = E.make_env(probe, block.max_steps)
    vel = np.zeros((block.gaits, block.max_steps))
    ctrl = np.zeros((block.gaits, block.max_steps))
    for i, g in enumerate(params):
        env.reset(seed=0)
        for t in range(block.max_steps):
            a = E.gait_action(g, t).astype(np.float32)
            _, _, term, trunc, info = env.step(a)
            vel[i, t], ctrl[i, t] = info["x_velocity"], env.ctrl_cost * float(a.astype(np.float64) @ a)
            if term or trunc:
                break
    env.close()
    return params, vel, ctrl


def best_gait(vel: np.ndarray, ctrl: np.ndarray, target: float) -> int:
    """The gait whose rollout has the highest return Σ_t −|v_t − v*| − c_t on the task's reward
    (choosing by mean velocity alone picks strongly oscillating gaits that lose to the random policy)."""
    return int(np.argmax(-(np.abs(vel - target) + ctrl).sum(1)))


def minari_rows(cfg: Config, env: str, task: E.Task, block: EnvData) -> dict[str, list]:
    """One task's rows from its Minari dataset (stages/tgdt/minari_source.py), at most expert_episodes."""
    from stages.tgdt.minari_source import load_minari_tasks

    name = f"{task.direction} {task.speed}"
    key = f"papers.tgdt.prepare.minari_tasks.{env}"
    ref = cfg.minari_tasks.get(env, {}).get(name)
    if ref is None:
        raise SourceError(f"{key}: no Minari dataset for task {name!r} (source kind file needs every task)")
    return load_minari_tasks({name: ref}, env, root=cfg.source.dataset, key=key, max_episodes=block.expert_episodes)


def build_env(name: str, block: EnvData, cfg: Config, out) -> dict:
    rng = np.random.default_rng([cfg.seed, E.ENV_NAMES.index(name)])
    tasks = E.tasks_of(name)
    E.check_split(tasks)
    gaits = gait_bank(block, rng) if name == "halfcheetah" else None
    rows: dict[str, list] = {k: [] for k in ("task", "held_out", "quality", "obs", "action", "reward", "ret")}
    refs, gait_info = [], []
    for task in tasks:
        env = E.make_env(task, block.max_steps)
        gait = None
        if gaits is not None:
            j = best_gait(gaits[1], gaits[2], task.vector[0])
            gait = gaits[0][j]
            gait_info.append({"task": task.index, "gait": j, "gait_velocity": float(gaits[1][j].mean())})
        pol = controllers(task, env, rng, block, gait)
        if cfg.source.kind == "file":                    # the real source: this task's Minari dataset
            for k, v in minari_rows(cfg, name, task, block).items():
                rows[k] += v
        else:
            for quality, n in (("expert", block.expert_episodes), ("medium", block.medium_episodes)):
                for _ in range(n):
                    O, A, R = rollout(env, pol[quality], int(rng.integers(2**31)), block.max_steps)
                    for k, v in (("task", task.index), ("held_out", task.held_out), ("quality", quality),
                                 ("obs", O.tolist()), ("action", A.tolist()), ("reward", R.tolist()),
                                 ("ret", float(R.sum()))):
                        rows[k].append(v)
        ref = {}
        for kind in ("random", "expert"):
            rets = [rollout(env, pol[kind], int(rng.integers(2**31)), block.max_steps)[2].sum()
                    for _ in range(cfg.reference_episodes)]
            ref[kind] = float(np.mean(rets))
        refs.append(ref)
        env.close()
    ds = Dataset.from_dict(rows)
    ds.save_to_disk(str(out / name / "dataset"))
    train = ds.filter(lambda r: not r["held_out"])
    obs = np.concatenate([np.asarray(o, np.float32) for o in train["obs"]])
    vocab = E.Vocab.from_tasks(tasks)
    expert_train = [r for r, t in zip(refs, tasks) if not t.held_out]
    meta = {
        "env": name, "max_steps": block.max_steps, "obs_dim": int(obs.shape[1]),
        "act_dim": int(np.asarray(train[0]["action"]).shape[1]),
        "obs_mean": obs.mean(0).tolist(), "obs_std": (obs.std(0) + 1e-3).tolist(),
        "tasks": [{"index": t.index, "direction": t.direction, "speed": t.speed, "vector": list(t.vector),
                   "held_out": t.held_out, "ref_random": r["random"], "ref_expert": r["expert"]}
                  for t, r in zip(tasks, refs)],
        "vocab": vocab.itos, "templates": list(E.TEMPLATES),
        # DT return-to-go: R̂ in units of rtg_scale, evaluation starts from the mean training-task expert return
        "rtg_scale": float(block.max_steps),
        "target_return": float(np.mean([r["expert"] for r in expert_train])),
        "gaits": gait_info, "episodes": len(ds),
    }
    write_json(out / name / "meta.json", meta)
    return {"episodes": len(ds), "tasks": len(tasks), "held_out": sum(t.held_out for t in tasks),
            "max_steps": block.max_steps, "expert_episodes": block.expert_episodes,
            "medium_episodes": block.medium_episodes, "gaits": block.gaits if name == "halfcheetah" else None}


def run(cfg: Config, ctx) -> None:
    summary = {}
    for name in cfg.envs:
        block = getattr(cfg, name)
        (ctx.out / name).mkdir(parents=True)
        summary[name] = build_env(name, block, cfg, ctx.out)
        print(f"prepare@tgdt: {name}: {summary[name]}")
    write_json(ctx.out / "summary.json", {"envs": list(cfg.envs), **summary})
