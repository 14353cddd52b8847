"""Minari datasets (the D4RL successor) as plain numpy / polars episode arrays (issue 42: sciql, tgdt).

    from stages.common.minari_io import load_minari
    data = load_minari("mujoco/halfcheetah/medium-v0")            # id under MINARI_DATASETS_PATH, or a folder
    data.episodes[0].observations                                  # (T+1, obs_dim): o_0 .. o_T
    flat = data.transitions()                                      # D4RL-style flat arrays (obs, next_obs, ...)
    frame = data.frame()                                           # one polars row per step

The Minari layout (``<root>/<namespace>/<name>-v<k>/data/{metadata.json, main_data.hdf5 | arrow}``) is read
through ``minari.MinariDataset`` (never ``download=True``: a dataset that is not on disk is a one-line
``SourceError`` naming the key and how to fetch it). Per episode Minari stores T actions, rewards,
terminations and truncations, and T+1 observations (the reset observation and every next observation);
``infos`` (when recorded) are dicts of arrays with T+1 rows. Dict observation spaces (goal-conditioned
envs) come back as dicts of arrays; ``transitions(obs_keys=...)`` concatenates the chosen keys.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from stages.common.sources import SourceError

__all__ = ["MinariEpisode", "MinariData", "minari_root", "find_minari_data", "load_minari"]

Obs = np.ndarray | dict[str, Any]


@dataclass
class MinariEpisode:
    id: int
    observations: Obs            # (T+1, ...) or a dict of such arrays
    actions: np.ndarray          # (T, ...)
    rewards: np.ndarray          # (T,) float
    terminations: np.ndarray     # (T,) bool: the MDP ended (no bootstrap)
    truncations: np.ndarray      # (T,) bool: cut by a time limit (bootstrap)
    infos: dict[str, Any] = field(default_factory=dict)   # (T+1, ...) arrays when recorded

    @property
    def length(self) -> int:
        return int(self.actions.shape[0])


@dataclass
class MinariData:
    dataset_id: str
    env_id: str | None
    observation_space: str       # gymnasium space, as Minari's metadata serialises it
    action_space: str
    episodes: list[MinariEpisode]
    path: str                    # the data folder read

    @property
    def total_steps(self) -> int:
        return sum(e.length for e in self.episodes)

    def _obs(self, obs: Obs, obs_keys: tuple[str, ...] | None) -> np.ndarray:
        if isinstance(obs, dict):
            keys = obs_keys or tuple(sorted(obs))
            missing = [k for k in keys if k not in obs]
            if missing:
                raise ValueError(f"obs_keys: {missing[0]!r} not in the observation dict ({', '.join(sorted(obs))})")
            parts = [np.asarray(obs[k]).reshape(len(np.asarray(obs[k])), -1) for k in keys]
            return np.concatenate(parts, axis=1)
        return np.asarray(obs)

    def transitions(self, obs_keys: tuple[str, ...] | None = None) -> dict[str, np.ndarray]:
        """Flat arrays over every step: observations / next_observations (N, ...), actions, rewards,
        terminals (terminations), timeouts (truncations), episode (Minari episode id) and t (step index)."""
        cols: dict[str, list[np.ndarray]] = {k: [] for k in ("observations", "next_observations", "actions", "rewards",
                                                             "terminals", "timeouts", "episode", "t")}
        for e in self.episodes:
            o = self._obs(e.observations, obs_keys)
            T = e.length
            cols["observations"].append(o[:T])
            cols["next_observations"].append(o[1:T + 1])
            cols["actions"].append(np.asarray(e.actions))
            cols["rewards"].append(np.asarray(e.rewards, dtype=np.float64))
            cols["terminals"].append(np.asarray(e.terminations, dtype=bool))
            cols["timeouts"].append(np.asarray(e.truncations, dtype=bool))
            cols["episode"].append(np.full(T, e.id, dtype=np.int64))
            cols["t"].append(np.arange(T, dtype=np.int64))
        return {k: np.concatenate(v) if v else np.zeros(0) for k, v in cols.items()}

    def frame(self):
        """One polars row per step: episode, t, reward, terminated, truncated, return_to_go (undiscounted)."""
        import polars as pl

        rows = []
        for e in self.episodes:
            r = np.asarray(e.rewards, dtype=np.float64)
            rtg = np.cumsum(r[::-1])[::-1]
            rows.append(pl.DataFrame({"episode": np.full(e.length, e.id, dtype=np.int64),
                                      "t": np.arange(e.length, dtype=np.int64), "reward": r,
                                      "terminated": np.asarray(e.terminations, dtype=bool),
                                      "truncated": np.asarray(e.truncations, dtype=bool), "return_to_go": rtg}))
        return pl.concat(rows) if rows else pl.DataFrame()


def minari_root() -> Path:
    """MINARI_DATASETS_PATH, else Minari's default ~/.minari/datasets (not created here)."""
    env = os.environ.get("MINARI_DATASETS_PATH")
    return Path(env).expanduser() if env else Path.home() / ".minari" / "datasets"


def find_minari_data(ref: str | Path, *, root: str | Path | None = None, key: str = "source.dataset") -> Path:
    """The ``data`` folder (metadata.json + the episodes) of a dataset id under ``root`` (default
    ``minari_root()``), of a dataset folder, or the data folder itself."""
    p = Path(ref).expanduser()
    for cand in (p, p / "data"):
        if (cand / "metadata.json").is_file():
            return cand
    base = Path(root).expanduser() if root is not None else minari_root()
    cand = base / str(ref) / "data"
    if (cand / "metadata.json").is_file():
        return cand
    local = sorted(str(m.parent.parent.relative_to(base)) for m in base.rglob("data/metadata.json")) \
        if base.is_dir() else []
    raise SourceError(f"{key}: Minari dataset {str(ref)!r} not found under {base} (local: "
                      f"{', '.join(local[:5]) or 'none'}); fetch it on a machine with network with "
                      f"`minari download {ref}` and set MINARI_DATASETS_PATH")


def load_minari(ref: str | Path, *, root: str | Path | None = None, key: str = "source.dataset",
                episode_ids: list[int] | None = None, max_episodes: int | None = None) -> MinariData:
    """Read a Minari dataset (id or folder) into numpy episodes; ``episode_ids`` / ``max_episodes`` pick a
    subset (in id order). One-line ``SourceError`` for a missing or unreadable dataset."""
    import minari

    data_path = find_minari_data(ref, root=root, key=key)
    try:
        meta = json.loads((data_path / "metadata.json").read_text())
        ds = minari.MinariDataset(data_path)
    except Exception as err:  # noqa: BLE001 - h5py/arrow/json raise many types
        raise SourceError(f"{key}: {data_path} is not a readable Minari dataset "
                          f"({type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''})") from None
    ids = [int(i) for i in ds.episode_indices]
    if episode_ids is not None:
        unknown = sorted(set(episode_ids) - set(ids))
        if unknown:
            raise SourceError(f"{key}: episode ids {unknown[:5]} not in {meta.get('dataset_id', ref)} "
                              f"({len(ids)} episodes)")
        ids = sorted(set(episode_ids))
    if max_episodes is not None:
        ids = ids[:max_episodes]
    if not ids:
        raise SourceError(f"{key}: {meta.get('dataset_id', ref)} has no episodes")
    episodes = []
    for e in ds.iterate_episodes(episode_indices=ids):
        episodes.append(MinariEpisode(id=int(e.id), observations=_np(e.observations), actions=_np(e.actions),
                                      rewards=np.asarray(e.rewards, dtype=np.float64),
                                      terminations=np.asarray(e.terminations, dtype=bool),
                                      truncations=np.asarray(e.truncations, dtype=bool), infos=_np(e.infos or {})))
    env_spec = meta.get("env_spec")
    env_id = json.loads(env_spec).get("id") if isinstance(env_spec, str) else None
    return MinariData(dataset_id=str(meta.get("dataset_id", ref)), env_id=env_id,
                      observation_space=str(meta.get("observation_space", "")),
                      action_space=str(meta.get("action_space", "")), episodes=episodes, path=str(data_path))


def _np(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _np(v) for k, v in x.items()}
    if isinstance(x, tuple):                                                 # Tuple spaces: one array per part
        return {str(i): _np(v) for i, v in enumerate(x)}
    return np.asarray(x)
