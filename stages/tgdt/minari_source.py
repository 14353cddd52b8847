"""Minari datasets (the D4RL successor) as TG-DT trajectory rows (issue 42): the `full` profile's real source.

    from stages.tgdt.minari_source import load_minari_tasks
    rows = load_minari_tasks({"forward fast": "mujoco/halfcheetah/expert-v0"}, "halfcheetah")

Minari has no task descriptions: a task family is one dataset per task, named by the task's words
("<direction> <speed>", as stages/tgdt/envs.py lists them). Each Minari episode (read by
stages/common/minari_io.py; T actions / rewards, T+1 observations) becomes one row of the table prepare
writes — ``task`` (index), ``held_out``, ``quality``, ``obs`` (T, d: the observation before each action),
``action`` (T, act_dim), ``reward`` (T,), ``ret`` — so train/evaluate read it unchanged:

- pointmass (the project's PointMassVel, collected with Minari's DataCollector): rewards as stored.
- halfcheetah: the MuJoCo observation (17) gets the gait clock [sin 1.2t, cos 1.2t] that the evaluation
  env (``TargetVelocity``) appends, and the reward is the task's, recomputed per step:
  −|v_x − v*| − 0.05‖a‖² with v_x from the recorded ``infos["x_velocity"]`` when present, else the next
  observation's root velocity (index 8 = qvel[0]; Minari's MuJoCo releases record no infos).

A task name that the environment does not list, or an observation width that does not match, is a
one-line ``SourceError`` naming the key.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from stages.common.minari_io import load_minari
from stages.common.sources import SourceError
from stages.tgdt import envs as E

HC_OBS, HC_XVEL, HC_CTRL = 17, 8, 0.05
OBS_DIM = {"pointmass": 4, "halfcheetah": HC_OBS}


def load_minari_tasks(datasets: dict[str, str | Path], env: str, *, quality: str = "expert",
                      root: str | Path | None = None, key: str = "prepare.source.dataset",
                      max_episodes: int | None = None) -> dict[str, list]:
    """Rows (column -> list, the prepare table's schema) from one Minari dataset per task name."""
    if env not in OBS_DIM:
        raise SourceError(f"{key}: unknown TG-DT environment {env!r} ({', '.join(OBS_DIM)})")
    by_name = {f"{t.direction} {t.speed}": t for t in E.tasks_of(env)}
    rows: dict[str, list] = {k: [] for k in ("task", "held_out", "quality", "obs", "action", "reward", "ret")}
    for name, ref in datasets.items():
        task = by_name.get(name)
        if task is None:
            raise SourceError(f"{key}: task {name!r} is not a {env} task (known: {', '.join(sorted(by_name))})")
        data = load_minari(ref, root=root, key=f"{key}[{name!r}]", max_episodes=max_episodes)
        for e in data.episodes:
            obs = np.asarray(e.observations, dtype=np.float64)
            if obs.ndim != 2 or obs.shape[1] != OBS_DIM[env]:
                raise SourceError(f"{key}[{name!r}]: {data.dataset_id}: observations of shape {obs.shape}, "
                                  f"{env} has {OBS_DIM[env]} columns")
            T = e.length
            act = np.asarray(e.actions, dtype=np.float64)
            if env == "halfcheetah":
                t = np.arange(T, dtype=np.float64)
                O = np.concatenate([obs[:T], np.sin(E.GAIT_OMEGA * t)[:, None], np.cos(E.GAIT_OMEGA * t)[:, None]], 1)
                xv = e.infos.get("x_velocity") if e.infos else None
                v = np.asarray(xv, dtype=np.float64)[1:T + 1] if xv is not None else obs[1:, HC_XVEL]
                R = -np.abs(v - task.vector[0]) - HC_CTRL * (act * act).sum(1)
            else:
                O, R = obs[:T], np.asarray(e.rewards, dtype=np.float64)
            for k, val in (("task", task.index), ("held_out", task.held_out), ("quality", quality),
                           ("obs", O.astype(np.float32).tolist()), ("action", act.astype(np.float32).tolist()),
                           ("reward", R.astype(np.float32).tolist()), ("ret", float(R.astype(np.float32).sum()))):
                rows[k].append(val)
    if not rows["task"]:
        raise SourceError(f"{key}: no episodes in {', '.join(map(str, datasets.values())) or 'no datasets'}")
    return rows
