"""The two environments of the miniature SCIQL study and their style labelling functions.

* ``Circle2D`` — the paper's 2-D unicycle ("traj2d" / circle drawing) re-implemented as a
  gymnasium ``Env`` with the official settings: state (x, y, θ); action (Δθ, speed) in [-1, 1]²
  mapped to Δθ ∈ [-π, π] (max turn π per step) and speed ∈ [0.5, 3]; the unicycle turns by Δθ
  then moves forward; walls at ±50 (positions are clipped). Task reward r = exp(-d² / 2σ²) with
  d = | ‖p − c‖ − R | the distance to the task circle (c = (0, 5), R = 5, σ = 5).
  Evaluation starts: x, y ~ U(±14), θ = 0 (the official reset: 0.7 × 20).
* ``HalfCheetah-v5`` from ``gymnasium[mujoco]`` (its XML assets ship with the package; nothing is
  downloaded), with a gait clock appended to its observation (``GaitClock``). Task reward = the
  env's reward (forward velocity − control cost).

Labelling functions map one episode (arrays over its T steps) to one integer label per step.
Each has ``num_labels`` (all labels it can emit) and ``promptable`` (the styles a policy can be
commanded to follow; e.g. "straight" is a turn label but not a commandable style).

    env = make_env("circle2d", max_steps=100)
    labeller = LABELLERS["circle2d"]["speed"]
    labels = labeller(episode)      # episode: dict of numpy arrays (see Episode keys below)

Episode arrays (T = steps): ``xy`` (T+1, 2) positions, ``heading`` (T+1,) θ and ``speed`` (T,) the
commanded speed of each step (circle2d only), ``x_velocity`` (T,) forward velocity (halfcheetah only).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable

import gymnasium as gym
import numpy as np
from gymnasium import spaces

ENV_NAMES = ("circle2d", "halfcheetah")
HALFCHEETAH_ID = "HalfCheetah-v5"


def wrap_angle(theta):
    return (np.asarray(theta) + np.pi) % (2 * np.pi) - np.pi


class Circle2D(gym.Env):
    """2-D unicycle that should draw a target circle (re-implementation of the paper's traj2d)."""

    metadata = {"render_modes": []}

    def __init__(self, max_steps: int = 100, center=(0.0, 5.0), radius: float = 5.0,
                 sigma_reward: float = 5.0, min_speed: float = 0.5, max_speed: float = 3.0,
                 max_delta_theta: float = np.pi, limit: float = 50.0, start_box: float = 14.0,
                 history: int = 1):
        super().__init__()
        if int(history) < 1:
            raise ValueError(f"circle2d.history: must be at least 1 (got {history})")
        self.max_steps = int(max_steps)
        self.history = int(history)
        self.center = np.asarray(center, dtype=np.float64)
        self.radius = float(radius)
        self.sigma = float(sigma_reward)
        self.min_speed, self.max_speed = float(min_speed), float(max_speed)
        self.max_delta_theta = float(max_delta_theta)
        self.limit = float(limit)
        self.start_box = float(start_box)
        self.action_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        # observation: the last ``history`` states [x / limit, y / limit, cos θ, sin θ], newest first
        # (official traj2d: a deque of the last `history` states, filled with the start state at reset)
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(4 * self.history,), dtype=np.float32)
        self.state = np.zeros(3)
        self.t = 0
        self._past: deque = deque(maxlen=self.history)

    # dynamics shared with the dataset generator (vectorised over leading dims)
    def speed_of(self, a_speed):
        return self.min_speed + (np.clip(a_speed, -1, 1) + 1.0) * 0.5 * (self.max_speed - self.min_speed)

    def ring_distance(self, xy):
        return np.abs(np.linalg.norm(np.asarray(xy) - self.center, axis=-1) - self.radius)

    def task_reward(self, xy):
        d = self.ring_distance(xy)
        return np.exp(-d ** 2 / (2 * self.sigma ** 2))  # r = exp(-d² / 2σ²)

    def state_features(self):
        x, y, th = self.state
        return np.array([x / self.limit, y / self.limit, np.cos(th), np.sin(th)], dtype=np.float32)

    def observe(self):
        return np.concatenate(list(reversed(self._past))).astype(np.float32)  # newest first

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        options = options or {}
        xy = options.get("xy")
        if xy is None:
            xy = self.np_random.uniform(-self.start_box, self.start_box, size=2)
        theta = options.get("theta", 0.0)
        self.state = np.array([xy[0], xy[1], wrap_angle(theta)], dtype=np.float64)
        self.t = 0
        self._past.clear()
        self._past.extend([self.state_features()] * self.history)
        return self.observe(), {"xy": self.state[:2].copy(), "heading": float(self.state[2])}

    def step(self, action):
        a = np.clip(np.asarray(action, dtype=np.float64), -1.0, 1.0)
        theta = wrap_angle(self.state[2] + a[0] * self.max_delta_theta)  # turn by Δθ ...
        speed = self.speed_of(a[1])
        xy = self.state[:2] + speed * np.array([np.cos(theta), np.sin(theta)])  # ... then move
        xy = np.clip(xy, -self.limit, self.limit)
        self.state = np.array([xy[0], xy[1], theta])
        self._past.append(self.state_features())
        self.t += 1
        reward = float(self.task_reward(xy))
        truncated = self.t >= self.max_steps
        return self.observe(), reward, False, truncated, {"xy": xy.copy(), "heading": float(theta),
                                                           "speed": float(speed)}


CIRCLE2D_ID = "sciql/Circle2D-v0"
if CIRCLE2D_ID not in gym.registry:  # gymnasium.make("sciql/Circle2D-v0", max_steps=...) after import
    gym.register(CIRCLE2D_ID, entry_point=Circle2D)


def _quiet_mujoco() -> None:
    """Route MuJoCo warnings to Python (otherwise MuJoCo writes MUJOCO_LOG.TXT into the cwd);
    the HalfCheetah XML's deprecated 'settotalmass' attribute warning is dropped."""
    import warnings

    import mujoco

    def handler(msg: str) -> None:
        if "settotalmass" not in msg:
            warnings.warn(f"MuJoCo: {msg}", RuntimeWarning, stacklevel=2)

    mujoco.set_mju_user_warning(handler)


GAIT_OMEGAS = (1.0, 1.5, 2.0)  # gait frequencies (rad / step) of the scripted HalfCheetah behaviours


class GaitClock(gym.ObservationWrapper):
    """Appends a gait clock [sin ωt, cos ωt for ω in GAIT_OMEGAS] to the observation, so that the
    scripted sinusoidal gaits a_t = A sin(ωt + φ) are a (linear) function of the observation."""

    def __init__(self, env, omegas=GAIT_OMEGAS):
        super().__init__(env)
        self.omegas = np.asarray(omegas, dtype=np.float64)
        base = env.observation_space
        k = 2 * len(self.omegas)
        self.observation_space = spaces.Box(np.concatenate([base.low, -np.ones(k)]).astype(np.float32),
                                            np.concatenate([base.high, np.ones(k)]).astype(np.float32),
                                            dtype=np.float32)
        self.t = 0

    def reset(self, **kwargs):
        self.t = 0
        return super().reset(**kwargs)

    def step(self, action):
        self.t += 1
        return super().step(action)

    def observation(self, obs):
        ph = self.omegas * self.t
        return np.concatenate([obs, np.sin(ph), np.cos(ph)]).astype(np.float32)


def make_env(name: str, max_steps: int, history: int = 1):
    """A gymnasium env by study name; HalfCheetah-v5 comes from gymnasium[mujoco] (offline assets),
    wrapped with a gait clock. ``history``: Circle2D's number of stacked states (HalfCheetah: 1 only)."""
    if name == "circle2d":
        return Circle2D(max_steps=max_steps, history=history)
    if history != 1:
        raise ValueError(f"{name}: history must be 1 (only circle2d stacks states), got {history}")
    if name == "halfcheetah":
        _quiet_mujoco()
        return GaitClock(gym.make(HALFCHEETAH_ID, max_episode_steps=max_steps))
    raise ValueError(f"env: unknown environment {name!r} (known: {', '.join(ENV_NAMES)})")


# ----------------------------------------------------------------------------------------------
# Labelling functions (ALGO: style = labels of subtrajectory labelling functions)
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Labeller:
    name: str
    num_labels: int
    promptable: tuple[int, ...]
    label_names: tuple[str, ...]
    fn: Callable[[dict], np.ndarray]

    def __call__(self, episode: dict) -> np.ndarray:
        labels = np.asarray(self.fn(episode), dtype=np.int64)
        return labels


def _c2d_speed(ep, edges=(1.333, 2.167)):
    # commanded speed (true speed of the action, not the displacement) in 3 bins over [0.5, 3]
    return np.digitize(ep["speed"], edges)


def _c2d_turn(ep, window=11, min_rot=0.1):
    # mean turning rate over a centred 11-step window of Δθ (truncated at the episode ends):
    # right (0) / left (1) / straight (2, not promptable)
    dth = np.diff(np.unwrap(ep["heading"]))  # (T,) Δθ of each step
    c = np.concatenate([[0.0], np.cumsum(dth)])
    half, T = window // 2, len(dth)
    lo, hi = np.clip(np.arange(T) - half, 0, T), np.clip(np.arange(T) + half + 1, 0, T)
    avg = (c[hi] - c[lo]) / (hi - lo)
    out = np.full(dth.shape, 2)
    out[avg >= min_rot] = 1
    out[avg <= -min_rot] = 0
    return out


def _c2d_direction(ep, bins=8):
    # movement direction of the step in 8 bins of 45° (bin 0 = [0°, 45°), counter-clockwise)
    d = np.diff(ep["xy"], axis=0)
    ang = np.arctan2(d[:, 1], d[:, 0]) % (2 * np.pi)
    return np.minimum((ang // (2 * np.pi / bins)).astype(np.int64), bins - 1)


def _c2d_position(ep, x_edges=(-15.0, 0.0, 15.0)):
    # cell of the position s_t: 4 x-bins (edges −15, 0, 15) × sign of y  ->  2 · x_bin + (y > 0)
    xy = ep["xy"][:-1]
    return 2 * np.digitize(xy[:, 0], x_edges) + (xy[:, 1] > 0)


HC_SPEED_EDGES = (-0.5, 0.5)


def _hc_speed(ep, edges=HC_SPEED_EDGES):
    # forward velocity bins: backward / slow / forward
    return np.digitize(ep["x_velocity"], edges)


def _hc_direction(ep, dead=0.2):
    # backward (0) / forward (1) / standing (2, not promptable)
    v = ep["x_velocity"]
    return np.where(v > dead, 1, np.where(v < -dead, 0, 2))


LABELLERS: dict[str, dict[str, Labeller]] = {
    "circle2d": {
        "speed": Labeller("speed", 3, (0, 1, 2), ("slow", "medium", "fast"), _c2d_speed),
        "turn": Labeller("turn", 3, (0, 1), ("right", "left", "straight"), _c2d_turn),
        "direction": Labeller("direction", 8, tuple(range(8)), ("E", "NE", "N", "NW", "W", "SW", "S", "SE"),
                              _c2d_direction),
        "position": Labeller("position", 8, tuple(range(8)),
                             tuple(f"x{i}{'y+' if j else 'y-'}" for i in range(4) for j in range(2)), _c2d_position),
    },
    "halfcheetah": {
        "speed": Labeller("speed", 3, (0, 1, 2), ("backward", "slow", "forward"), _hc_speed),
        "direction": Labeller("direction", 3, (0, 1), ("backward", "forward", "standing"), _hc_direction),
    },
}


def get_labeller(env: str, name: str) -> Labeller:
    if env not in LABELLERS:
        raise ValueError(f"env: unknown environment {env!r} (known: {', '.join(LABELLERS)})")
    if name not in LABELLERS[env]:
        raise ValueError(f"{env}.styles: unknown labelling function {name!r} "
                         f"(known for {env}: {', '.join(LABELLERS[env])})")
    return LABELLERS[env][name]
