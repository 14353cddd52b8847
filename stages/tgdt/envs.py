"""Environments, the compositional task family, descriptions and scripted controllers of tgdt.

* ``PointMassVel`` (gymnasium id ``tgdt/PointMassVel-v0``): a 2-D point mass with first-order
  velocity dynamics v' = ρ v + (1 − ρ) a (a ∈ [−1, 1]², ρ = 0.5), position p' = p + v'. Observation
  [x / 20, y / 20, vx, vy]. Task = target velocity v* = speed · (cos θ, sin θ): 8 compass
  directions × 3 speeds (slow 0.25, medium 0.5, fast 0.8); reward r = 1 − ‖v' − v*‖.
* ``HalfCheetah-v5`` (``gymnasium[mujoco]``, offline assets) wrapped by ``TargetVelocity``: task =
  direction (forward / backward) × speed (slow 0.5, steady 0.75, medium 1.0, brisk 1.25, fast 1.5 m/s), reward
  r = −|v_x − v*| − 0.05 ‖a‖² (cheetah_vel / cheetah_dir style), a gait clock [sin ωt, cos ωt]
  appended to the observation so that scripted sinusoidal gaits are functions of the state.

Held-out tasks are combinations whose words all occur in training tasks, and (pairwise factor
coverage) whose direction occurs in training with another speed and whose speed occurs in training
with another direction (both checked by ``check_split``). ``PointMassBatch`` steps many point masses
at once with numpy (evaluation); it equals ``PointMassVel`` episode by episode (tests/tgdt). Descriptions come from templates; the vocabulary is built from the training
descriptions only, and a word outside it is warned about and mapped to ``<unk>``.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
from gymnasium import spaces

ENV_NAMES = ("pointmass", "halfcheetah")
POINTMASS_ID = "tgdt/PointMassVel-v0"
HALFCHEETAH_ID = "HalfCheetah-v5"

PM_DIRECTIONS = ("east", "northeast", "north", "northwest", "west", "southwest", "south", "southeast")
PM_SPEEDS = {"slow": 0.25, "medium": 0.5, "fast": 0.8}
HC_DIRECTIONS = {"forward": 1.0, "backward": -1.0}
HC_SPEEDS = {"slow": 0.5, "steady": 0.75, "medium": 1.0, "brisk": 1.25, "fast": 1.5}
# held-out (direction, speed) combinations: every word also appears in some training task
HELD_OUT = {
    "pointmass": [("east", "slow"), ("northeast", "medium"), ("north", "fast"),
                  ("northwest", "slow"), ("west", "medium"), ("southwest", "fast")],
    "halfcheetah": [("forward", "steady"), ("backward", "brisk")],   # interpolating speeds, one per direction
}
TEMPLATES = ("move {d} at a {s} speed", "go {d} , {s}", "head to the {d} at {s} speed",
             "a {s} run to the {d}")
PAD, UNK, CLS = "<pad>", "<unk>", "<cls>"


@dataclass(frozen=True)
class Task:
    env: str
    index: int
    direction: str
    speed: str
    vector: tuple[float, ...]     # the true task vector (oracle input): target velocity
    held_out: bool

    def describe(self, template: int) -> str:
        return TEMPLATES[template % len(TEMPLATES)].format(d=self.direction, s=self.speed)


def tasks_of(env: str) -> list[Task]:
    if env == "pointmass":
        combos = [(d, s, (PM_SPEEDS[s] * np.cos(k * np.pi / 4), PM_SPEEDS[s] * np.sin(k * np.pi / 4)))
                  for k, d in enumerate(PM_DIRECTIONS) for s in PM_SPEEDS]
    elif env == "halfcheetah":
        combos = [(d, s, (sign * HC_SPEEDS[s],)) for d, sign in HC_DIRECTIONS.items() for s in HC_SPEEDS]
    else:
        raise ValueError(f"env: unknown environment {env!r} (known: {', '.join(ENV_NAMES)})")
    held = set(HELD_OUT[env])
    return [Task(env, i, d, s, tuple(float(v) for v in vec), (d, s) in held) for i, (d, s, vec) in enumerate(combos)]


def check_split(tasks: list[Task]) -> None:
    """Every word of every held-out description occurs in some training description, and every held-out
    (direction, speed) pair's direction occurs in training with another speed and its speed with
    another direction (pairwise factor coverage: the combination is new, each factor is not)."""
    seen = {w for t in tasks if not t.held_out for k in range(len(TEMPLATES)) for w in t.describe(k).split()}
    train = [(t.direction, t.speed) for t in tasks if not t.held_out]
    for t in tasks:
        if t.held_out:
            missing = [w for w in t.describe(0).split() if w not in seen]
            if missing:
                raise ValueError(f"held-out task {t.direction} {t.speed}: words {missing} never seen in training")
            if not any(d == t.direction and s != t.speed for d, s in train):
                raise ValueError(f"held-out task {t.direction} {t.speed}: direction {t.direction!r} never trained "
                                 "with another speed")
            if not any(s == t.speed and d != t.direction for d, s in train):
                raise ValueError(f"held-out task {t.direction} {t.speed}: speed {t.speed!r} never trained with "
                                 "another direction")


class Vocab:
    """Word-level vocabulary of the training descriptions (scratch text encoder, no hub weights)."""

    def __init__(self, words: list[str]):
        self.itos = [PAD, UNK, CLS] + sorted(set(words) - {PAD, UNK, CLS})
        self.stoi = {w: i for i, w in enumerate(self.itos)}

    @classmethod
    def from_tasks(cls, tasks: list[Task]) -> "Vocab":
        return cls([w for t in tasks if not t.held_out for k in range(len(TEMPLATES)) for w in t.describe(k).split()])

    def unknown(self, text: str) -> list[str]:
        return [w for w in text.lower().split() if w not in self.stoi]

    def encode(self, text: str, length: int, field: str = "description") -> list[int]:
        """[CLS] + word ids, padded to length + 1; a word never seen in training is warned about
        (naming the field) and mapped to <unk>."""
        words = text.lower().split()
        bad = self.unknown(text)
        if bad:
            warnings.warn(f"{field}: word(s) {bad} never seen in training descriptions; encoded as <unk>",
                          UserWarning, stacklevel=2)
        if len(words) > length:
            raise ValueError(f"{field}: {len(words)} words, more than text_len={length}")
        ids = [self.stoi[CLS]] + [self.stoi.get(w, self.stoi[UNK]) for w in words]
        return ids + [self.stoi[PAD]] * (length + 1 - len(ids))


# ----------------------------------------------------------------------------------------------
# point mass
# ----------------------------------------------------------------------------------------------
class PointMassVel(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, target=(0.5, 0.0), max_steps: int = 50, rho: float = 0.5):
        super().__init__()
        self.target = np.asarray(target, dtype=np.float64)
        self.max_steps, self.rho = int(max_steps), float(rho)
        self.action_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.observation_space = spaces.Box(-np.inf, np.inf, shape=(4,), dtype=np.float32)
        self.p, self.v, self.t = np.zeros(2), np.zeros(2), 0

    def _obs(self):
        return np.concatenate([self.p / 20.0, self.v]).astype(np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.p = self.np_random.uniform(-1, 1, size=2)
        self.v = self.np_random.uniform(-0.1, 0.1, size=2)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        a = np.clip(np.asarray(action, dtype=np.float64), -1, 1)
        self.v = self.rho * self.v + (1 - self.rho) * a           # first-order velocity dynamics
        self.p = self.p + self.v
        self.t += 1
        reward = 1.0 - float(np.linalg.norm(self.v - self.target))  # r = 1 − ‖v − v*‖
        return self._obs(), reward, False, self.t >= self.max_steps, {}

    def expert_action(self, obs):
        """Scripted expert: the action that reaches v* in one step (clipped)."""
        v = np.asarray(obs[2:4], dtype=np.float64)
        return np.clip((self.target - self.rho * v) / (1 - self.rho), -1, 1)


class PointMassBatch:
    """n point masses stepped at once (numpy); env i equals ``PointMassVel(targets[i])`` reset with
    ``seeds[i]`` (same start draws, dynamics, reward and truncation)."""

    def __init__(self, targets, max_steps: int = 50, rho: float = 0.5):
        self.target = np.asarray(targets, dtype=np.float64).reshape(-1, 2)
        self.max_steps, self.rho = int(max_steps), float(rho)
        self.n = len(self.target)
        self.p, self.v, self.t = np.zeros((self.n, 2)), np.zeros((self.n, 2)), 0

    def _obs(self):
        return np.concatenate([self.p / 20.0, self.v], 1).astype(np.float32)

    def reset(self, seeds):
        if len(seeds) != self.n:
            raise ValueError(f"seeds: {len(seeds)} seeds for {self.n} environments")
        for i, s in enumerate(seeds):        # gymnasium's np_random(seed): PCG64 of the seed, same draw order
            rng = np.random.Generator(np.random.PCG64(int(s)))
            self.p[i] = rng.uniform(-1, 1, size=2)
            self.v[i] = rng.uniform(-0.1, 0.1, size=2)
        self.t = 0
        return self._obs()

    def step(self, actions):
        a = np.clip(np.asarray(actions, dtype=np.float64).reshape(self.n, 2), -1, 1)
        self.v = self.rho * self.v + (1 - self.rho) * a
        self.p = self.p + self.v
        self.t += 1
        reward = 1.0 - np.linalg.norm(self.v - self.target, axis=1)
        return self._obs(), reward, np.full(self.n, self.t >= self.max_steps)


if POINTMASS_ID not in gym.registry:
    gym.register(POINTMASS_ID, entry_point="stages.tgdt.envs:PointMassVel")   # a string: Minari serialises the spec


# ----------------------------------------------------------------------------------------------
# HalfCheetah with a target velocity
# ----------------------------------------------------------------------------------------------
GAIT_OMEGA = 1.2


class TargetVelocity(gym.Wrapper):
    """HalfCheetah-v5 with reward −|v_x − v*| − 0.05‖a‖² and a gait clock in the observation."""

    def __init__(self, env, target: float, ctrl_cost: float = 0.05):
        super().__init__(env)
        self.target, self.ctrl_cost, self.t = float(target), float(ctrl_cost), 0
        base = env.observation_space
        self.observation_space = spaces.Box(-np.inf, np.inf, shape=(base.shape[0] + 2,), dtype=np.float32)

    def _obs(self, obs):
        ph = GAIT_OMEGA * self.t
        return np.concatenate([obs, [np.sin(ph), np.cos(ph)]]).astype(np.float32)

    def reset(self, **kwargs):
        self.t = 0
        obs, info = self.env.reset(**kwargs)
        return self._obs(obs), info

    def step(self, action):
        obs, _, term, trunc, info = self.env.step(action)
        self.t += 1
        a = np.asarray(action, dtype=np.float64)
        reward = -abs(float(info["x_velocity"]) - self.target) - self.ctrl_cost * float(a @ a)
        return self._obs(obs), reward, term, trunc, info


def _quiet_mujoco() -> None:
    import mujoco

    def handler(msg: str) -> None:
        if "settotalmass" not in msg:
            warnings.warn(f"MuJoCo: {msg}", RuntimeWarning, stacklevel=2)

    mujoco.set_mju_user_warning(handler)


def make_env(task: Task, max_steps: int):
    if task.env == "pointmass":
        return gym.make(POINTMASS_ID, target=task.vector, max_steps=max_steps, disable_env_checker=True)
    if task.env == "halfcheetah":
        _quiet_mujoco()
        return TargetVelocity(gym.make(HALFCHEETAH_ID, max_episode_steps=max_steps, disable_env_checker=True),
                              task.vector[0])
    raise ValueError(f"env: unknown environment {task.env!r} (known: {', '.join(ENV_NAMES)})")


def gait_action(params: np.ndarray, t: int) -> np.ndarray:
    """Sinusoidal gait a_j = clip(A_j sin(ω t + φ_j)); params = (A (6,), φ (6,))."""
    amp, phase = params[:6], params[6:]
    return np.clip(amp * np.sin(GAIT_OMEGA * t + phase), -1, 1)
