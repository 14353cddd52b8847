"""Scripted, diverse behaviour generators, labelling, HF ``datasets`` storage, hindsight sampling.

Datasets are flat transition tables (one row per step) with columns
``episode, t, obs, action, reward, next_obs, terminated, label_<style>`` stored with
``datasets.Dataset.save_to_disk``. A Circle2D episode is one noisy circle-follower (the official
traj2d data); a HalfCheetah episode is two gait segments with Gaussian action noise (so a future index
of the same trajectory can carry a different style than the current one).

The ``HindsightSampler`` draws SCIQL batches: for each sampled transition t the style label z used
by the value functions and by the actor is (ALGO: hindsight relabelling)
    the current label  label_t                     with prob p_cur,
    a future label     label_{t+k}, k ~ Geom(1-λ)  with prob p_future (clipped to the episode end),
    a random label     label_j, j ~ U(dataset)     with prob p_random.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from stages.sciql.envs import GAIT_OMEGAS, LABELLERS, Circle2D, make_env, wrap_angle


# ----------------------------------------------------------------------------------------------
# Circle2D behaviours
# ----------------------------------------------------------------------------------------------
def circle_controller(xy, theta, center, radius, direction, max_dtheta, gain=1.5):
    """Δθ action steering onto a circle (direction +1 counter-clockwise, −1 clockwise)."""
    rel = xy - center
    dist = max(np.linalg.norm(rel), 1e-6)
    u = rel / dist
    tangent = np.array([-u[1], u[0]]) * direction
    err = (dist - radius) / radius
    theta_des = np.arctan2(tangent[1], tangent[0]) + direction * np.arctan(gain * err)
    return float(np.clip(wrap_angle(theta_des - theta) / max_dtheta, -1, 1))


def speed_action(speed: float, env: Circle2D) -> float:
    """Normalised speed action in [-1, 1] for a speed in [min_speed, max_speed] (inverse of env.speed_of)."""
    return 2.0 * (speed - env.min_speed) / (env.max_speed - env.min_speed) - 1.0


def near_task_circle(center, radius, env: Circle2D, margin: float) -> bool:
    """A behaviour circle close enough to the task ring to demonstrate it: the mean distance of its points
    (64 equally spaced) to the task ring is below ``margin`` reward widths σ (the reward is exp(−d²/2σ²),
    so a circle at mean distance 2σ earns ≈ e⁻² ≈ 0.14 per step)."""
    phi = np.linspace(0.0, 2 * np.pi, 64, endpoint=False)
    pts = np.asarray(center, dtype=np.float64) + radius * np.stack([np.cos(phi), np.sin(phi)], 1)
    return float(env.ring_distance(pts).mean()) < margin * env.sigma


def generate_circle2d(n_episodes: int, max_steps: int, turn_noise_max: float, center_box: float,
                      radius_range: tuple[float, float], task_margin: float, seed: int,
                      history: int = 1) -> list[dict]:
    """Official traj2d data: one circle-follower per episode — centre U(±center_box)², radius
    U(radius_range), direction ±1, constant speed U(0.5, 3), turn noise std U(0, turn_noise_max)
    (radians, on Δθ), starting on its circle heading along it. Circles whose mean distance to the task
    ring is below ``task_margin`` reward widths σ are redrawn: the dataset holds no demonstration of the task, so task return must
    come from stitching. ``history``: states stacked in each observation (official traj2d: 4)."""
    rng = np.random.default_rng(seed)
    env = Circle2D(max_steps=max_steps, history=history)
    episodes = []
    for ep in range(n_episodes):
        while True:
            center = rng.uniform(-center_box, center_box, size=2)
            radius = rng.uniform(*radius_range)
            if not near_task_circle(center, radius, env, task_margin):
                break
        direction = rng.choice([-1.0, 1.0])
        speed = rng.uniform(env.min_speed, env.max_speed)
        noise = rng.uniform(0.0, turn_noise_max)
        phi = rng.uniform(-np.pi, np.pi)
        start = center + radius * np.array([np.cos(phi), np.sin(phi)])
        obs, info = env.reset(seed=int(rng.integers(2**31)),
                              options={"xy": start, "theta": phi + direction * np.pi / 2})
        rec = {"obs": [obs], "action": [], "reward": [], "xy": [info["xy"]], "heading": [info["heading"]],
               "speed": []}
        for t in range(max_steps):
            turn = circle_controller(env.state[:2], env.state[2], center, radius, direction, env.max_delta_theta)
            turn = turn + noise * rng.normal() / env.max_delta_theta
            a = np.clip([turn, speed_action(speed, env)], -1, 1).astype(np.float32)
            obs, r, term, trunc, info = env.step(a)
            rec["obs"].append(obs)
            rec["action"].append(a)
            rec["reward"].append(r)
            rec["xy"].append(info["xy"])
            rec["heading"].append(info["heading"])
            rec["speed"].append(info["speed"])
            if term or trunc:
                break
        episodes.append(_finish(rec))
    return episodes


# ----------------------------------------------------------------------------------------------
# HalfCheetah behaviours: open-loop sinusoidal gaits (a bank searched at prepare time)
# ----------------------------------------------------------------------------------------------
def sinusoid_action(gait: dict, t: int) -> np.ndarray:
    return np.clip(gait["amp"] * np.sin(gait["omega"] * t + gait["phase"]), -1, 1)


def search_gaits(n_gaits: int, steps: int, seed: int) -> list[dict]:
    """Random sinusoidal gaits with their measured mean forward velocity (sorted by velocity)."""
    rng = np.random.default_rng(seed)
    env = make_env("halfcheetah", steps)
    gaits = []
    for i in range(n_gaits):
        gait = {"omega": float(rng.choice(GAIT_OMEGAS)), "amp": rng.uniform(0.3, 1.0),
                "phase": rng.uniform(0, 2 * np.pi, 6)}
        env.reset(seed=int(rng.integers(2**31)))
        vel = []
        for t in range(steps):
            _, _, term, trunc, info = env.step(sinusoid_action(gait, t))
            vel.append(info["x_velocity"])
        gait["velocity"] = float(np.mean(vel[steps // 4:]))
        gaits.append(gait)
    env.close()
    return sorted(gaits, key=lambda g: g["velocity"])


def gait_bank(n_gaits: int, seed: int) -> list[dict]:
    """The gait bank of a dataset (deterministic in seed); its fastest gait is the task expert."""
    return search_gaits(n_gaits, 100, seed + 1)


def representative_gaits(bank: list[dict]) -> list[dict]:
    """One gait per speed bin: min velocity, velocity closest to 0, max velocity."""
    vel = np.array([g["velocity"] for g in bank])
    return [bank[int(vel.argmin())], bank[int(np.abs(vel).argmin())], bank[int(vel.argmax())]]


def generate_halfcheetah(n_episodes: int, max_steps: int, noise: float, n_gaits: int, seed: int) -> list[dict]:
    """Episodes of two gait segments, each a representative gait of a uniformly drawn speed bin
    (backward: the slowest gait of the bank; slow: the one closest to standing; forward: the fastest)."""
    rng = np.random.default_rng(seed)
    gaits = representative_gaits(gait_bank(n_gaits, seed))
    env = make_env("halfcheetah", max_steps)
    episodes = []
    for ep in range(n_episodes):
        obs, _ = env.reset(seed=int(rng.integers(2**31)))
        switch = int(rng.integers(max_steps // 4, 3 * max_steps // 4))
        chosen = [gaits[int(rng.integers(len(gaits)))] for _ in range(2)]
        rec = {"obs": [obs], "action": [], "reward": [], "x_velocity": []}
        for t in range(max_steps):
            gait = chosen[0] if t < switch else chosen[1]
            a = np.clip(sinusoid_action(gait, t) + noise * rng.normal(size=6), -1, 1).astype(np.float32)
            obs, r, term, trunc, info = env.step(a)
            rec["obs"].append(obs)
            rec["action"].append(a)
            rec["reward"].append(r)
            rec["x_velocity"].append(info["x_velocity"])
            if term or trunc:
                break
        rec["terminated"] = bool(term)
        episodes.append(_finish(rec))
    env.close()
    return episodes


def _finish(rec: dict) -> dict:
    out = {k: np.asarray(v) for k, v in rec.items() if k != "terminated"}
    out["terminated"] = bool(rec.get("terminated", False))
    return out


# ----------------------------------------------------------------------------------------------
# Labelling + flat table + HF datasets
# ----------------------------------------------------------------------------------------------
def label_episodes(env: str, episodes: list[dict], styles: list[str]) -> None:
    for ep in episodes:
        for style in styles:
            labels = LABELLERS[env][style](ep)
            if labels.shape != ep["action"].shape[:1]:
                raise ValueError(f"labelling function {env}.{style} returned {labels.shape} labels "
                                 f"for an episode of {len(ep['action'])} steps")
            ep[f"label_{style}"] = labels


def to_table(episodes: list[dict], styles: list[str]) -> dict[str, np.ndarray]:
    cols: dict[str, list] = {k: [] for k in ["episode", "t", "obs", "action", "reward", "next_obs", "terminated",
                                             *[f"label_{s}" for s in styles]]}
    for i, ep in enumerate(episodes):
        T = len(ep["action"])
        cols["episode"].append(np.full(T, i))
        cols["t"].append(np.arange(T))
        cols["obs"].append(ep["obs"][:-1])
        cols["next_obs"].append(ep["obs"][1:])
        cols["action"].append(ep["action"])
        cols["reward"].append(ep["reward"])
        term = np.zeros(T, dtype=bool)
        term[-1] = ep["terminated"]
        cols["terminated"].append(term)
        for s in styles:
            cols[f"label_{s}"].append(ep[f"label_{s}"])
    return {k: np.concatenate(v) for k, v in cols.items()}


def save_dataset(table: dict[str, np.ndarray], path: Path) -> None:
    from datasets import Dataset

    data = {k: (v.astype(np.float32).tolist() if v.ndim == 2 else v.tolist()) for k, v in table.items()}
    Dataset.from_dict(data).save_to_disk(str(path))


def load_dataset(path: Path, styles: list[str]) -> dict[str, torch.Tensor]:
    from datasets import load_from_disk

    ds = load_from_disk(str(path)).with_format("numpy")
    required = ["episode", "t", "obs", "action", "reward", "next_obs", "terminated", *[f"label_{s}" for s in styles]]
    missing = [c for c in required if c not in ds.column_names]
    if missing:
        raise ValueError(f"{path}: dataset lacks column(s) {', '.join(missing)}")
    out = {}
    for col in required:
        arr = np.asarray(ds[col])
        if arr.dtype == object:
            arr = np.stack(arr)
        out[col] = torch.as_tensor(arr.astype(np.float32) if arr.dtype.kind == "f" else arr.astype(np.int64))
    out["terminated"] = out["terminated"].float()
    return out


# ----------------------------------------------------------------------------------------------
# Hindsight relabelling sampler
# ----------------------------------------------------------------------------------------------
class HindsightSampler:
    """Batches for SCIQL: observations, actions, task rewards, current / value / actor labels."""

    def __init__(self, data: dict[str, torch.Tensor], style: str | None, value_probs, actor_probs,
                 geom_lambda: float, generator: torch.Generator, reward_scale: float = 1.0):
        self.data = data
        self.reward_scale = float(reward_scale)
        self.n = len(data["reward"])
        self.gen = generator
        self.geom_lambda = geom_lambda
        self.labels = data[f"label_{style}"] if style is not None else torch.zeros(self.n, dtype=torch.long)
        ep, t = data["episode"], data["t"]
        # index of the last step of each row's episode (future samples are clipped to it)
        ends = torch.zeros(int(ep.max()) + 1, dtype=torch.long)
        ends.scatter_reduce_(0, ep, torch.arange(self.n), reduce="amax", include_self=False)
        self.last = ends[ep]
        self.value_probs = torch.tensor(value_probs, dtype=torch.float32)
        self.actor_probs = torch.tensor(actor_probs, dtype=torch.float32)

    def relabel(self, idx: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        B = len(idx)
        source = torch.multinomial(probs, B, replacement=True, generator=self.gen)  # 0 cur, 1 future, 2 random
        # ALGO: future index t + k, k ~ Geometric(1 − λ) (k ≥ 0), clipped to the trajectory end
        u = torch.rand(B, generator=self.gen).clamp_min(1e-12)
        k = torch.floor(torch.log(u) / np.log(self.geom_lambda)).long()
        future = torch.minimum(idx + k, self.last[idx])
        rand = torch.randint(0, self.n, (B,), generator=self.gen)
        pick = torch.where(source == 0, idx, torch.where(source == 1, future, rand))
        return self.labels[pick]

    def sample(self, batch_size: int) -> dict[str, torch.Tensor]:
        idx = torch.randint(0, self.n, (batch_size,), generator=self.gen)
        d = self.data
        return {"obs": d["obs"][idx], "action": d["action"][idx], "next_obs": d["next_obs"][idx],
                "reward": d["reward"][idx] * self.reward_scale, "mask": 1.0 - d["terminated"][idx],
                "cur_label": self.labels[idx],
                "value_label": self.relabel(idx, self.value_probs),
                "actor_label": self.relabel(idx, self.actor_probs)}


def return_scale(data: dict[str, torch.Tensor], horizon: int) -> float:
    """Official sampler's task-reward normalisation (normalize_reward_by_returns): rewards are divided by
    (max − min episode return) / horizon, so episode returns span ``horizon`` (1000 in the reference)."""
    returns = torch.zeros(int(data["episode"].max()) + 1).index_add_(0, data["episode"], data["reward"].double().float())
    span = float(returns.max() - returns.min())
    return horizon / span if span > 0 else 1.0


class BatchStream(torch.utils.data.IterableDataset):
    """An endless stream for Lightning (``DataLoader(batch_size=None)``): each item holds
    (inner, seeds, batch, ...) tensors — ``inner`` updates, each with an independent batch per seed."""

    def __init__(self, sampler: HindsightSampler, batch_size: int, seeds: int = 1, inner: int = 1):
        self.sampler, self.batch_size, self.seeds, self.inner = sampler, batch_size, seeds, inner

    def __iter__(self):
        lead = (self.inner, self.seeds, self.batch_size)
        while True:
            b = self.sampler.sample(self.inner * self.seeds * self.batch_size)
            yield {k: v.view(*lead, *v.shape[1:]) for k, v in b.items()}
