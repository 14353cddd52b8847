"""Minari datasets (the D4RL successor) as SCIQL episodes (issue 42): the `full` profile's real source.

    from stages.sciql.minari_source import load_minari_episodes
    eps = load_minari_episodes("mujoco/halfcheetah/medium-v0", "halfcheetah")   # id under MINARI_DATASETS_PATH
    D.label_episodes("halfcheetah", eps, ["speed"]); table = D.to_table(eps, ["speed"])

Each Minari episode (T actions / rewards / terminations / truncations, T+1 observations, optional infos;
read by stages/common/minari_io.py) becomes the episode dict the generators in stages/sciql/data.py
produce, so the labelling functions, the flat table and every later stage run on it unchanged:

- halfcheetah: ``obs`` (T+1, 17 + 2·len(GAIT_OMEGAS)) = the MuJoCo observation with the gait clock
  [sin ωt, cos ωt] appended exactly as the evaluation env (``GaitClock``) does; ``x_velocity`` (T,) from
  the recorded ``infos["x_velocity"]`` (rows 1..T: the info of each step; the env's finite difference
  Δx/dt, as the generators use) when present, else the next observation's root x-velocity (observation
  index 8 = qvel[0], the instantaneous velocity: close to but not equal to Δx/dt — Minari's MuJoCo
  releases record no infos, so the speed labels of a real dataset use qvel[0]).
- circle2d is the official generator's toy world (no Minari release): it has no real source.

``terminated`` is the last step's termination flag (time-limit truncations bootstrap, as in the generators).
A dataset whose observation width does not match the environment is a one-line ``SourceError``.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from stages.common.minari_io import load_minari
from stages.common.sources import SourceError
from stages.sciql.envs import GAIT_OMEGAS

HC_OBS = 17           # HalfCheetah-v5 observation (exclude_current_positions_from_observation=True)
HC_XVEL = 8           # qvel[0], the root's forward velocity, in that observation


def gait_clock(T1: int, omegas=GAIT_OMEGAS) -> np.ndarray:
    """(T1, 2·len(omegas)) clock features of steps t = 0..T1-1, as GaitClock.observation writes them."""
    ph = np.arange(T1, dtype=np.float64)[:, None] * np.asarray(omegas, dtype=np.float64)[None]
    return np.concatenate([np.sin(ph), np.cos(ph)], 1)


def load_minari_episodes(ref: str | Path, env: str, *, root: str | Path | None = None,
                         key: str = "prepare.source.dataset", max_episodes: int | None = None) -> list[dict]:
    """SCIQL episode dicts (see the module docstring) from a Minari dataset id or folder."""
    data = load_minari(ref, root=root, key=key, max_episodes=max_episodes)
    out = []
    for e in data.episodes:
        obs = np.asarray(e.observations, dtype=np.float64)
        if obs.ndim != 2:
            raise SourceError(f"{key}: {data.dataset_id}: episode {e.id} has observations of shape {obs.shape}; "
                              "SCIQL reads flat (Box) observations")
        T = e.length
        ep = {"action": np.asarray(e.actions, dtype=np.float32), "reward": np.asarray(e.rewards, dtype=np.float64),
              "terminated": bool(np.asarray(e.terminations)[-1]) if T else False}
        if env == "halfcheetah":
            if obs.shape[1] != HC_OBS:
                raise SourceError(f"{key}: {data.dataset_id}: observations have {obs.shape[1]} columns, "
                                  f"HalfCheetah-v5 has {HC_OBS}")
            ep["obs"] = np.concatenate([obs, gait_clock(T + 1)], 1).astype(np.float32)
            xv = e.infos.get("x_velocity") if e.infos else None
            ep["x_velocity"] = (np.asarray(xv, dtype=np.float64)[1:T + 1] if xv is not None
                                else obs[1:, HC_XVEL].copy())
        else:
            raise SourceError(f"{key}: unknown SCIQL environment {env!r} (the Minari source is HalfCheetah-v5: halfcheetah)")
        out.append(ep)
    if not out:
        raise SourceError(f"{key}: {data.dataset_id} holds no episodes")
    return out
