"""stages/common/minari_io.py on datasets written by Minari's own DataCollector (no download): HalfCheetah-v5
(the project's MuJoCo env; time-limit truncations) and CartPole-v1 with recorded infos (terminations),
into a temporary MINARI_DATASETS_PATH, read back and compared exactly with what the env loop saw;
flat transitions, the per-step frame, episode subsets and the one-line errors."""
from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest

from stages.common.minari_io import find_minari_data, load_minari
from stages.common.sources import SourceError

pytestmark = pytest.mark.real_source


class StepInfo(gym.Wrapper):
    """Adds the same info keys on reset and step (Minari needs a fixed info structure)."""

    def reset(self, **kw):
        obs, info = self.env.reset(**kw)
        self.t = 0
        return obs, {"t": np.int64(0), "pole": np.float64(obs[2])}

    def step(self, action):
        obs, r, term, trunc, _ = self.env.step(action)
        self.t += 1
        return obs, r, term, trunc, {"t": np.int64(self.t), "pole": np.float64(obs[2])}


def _collect(env, n_episodes, max_steps, seed):
    """Run a random policy through a DataCollector; return what the loop saw, per episode."""
    env.action_space.seed(seed)
    seen = []
    for ep in range(n_episodes):
        obs, info = env.reset(seed=seed + ep)
        e = {"obs": [obs], "act": [], "rew": [], "term": [], "trunc": [], "info": [info]}
        for _ in range(max_steps):
            a = env.action_space.sample()
            obs, r, term, trunc, info = env.step(a)
            for k, v in (("obs", obs), ("act", a), ("rew", r), ("term", term), ("trunc", trunc), ("info", info)):
                e[k].append(v)
            if term or trunc:
                break
        seen.append(e)
    return seen


@pytest.fixture(scope="module")
def minari_root(tmp_path_factory):
    import minari

    root = tmp_path_factory.mktemp("minari")
    mp = pytest.MonkeyPatch()
    mp.setenv("MINARI_DATASETS_PATH", str(root))
    mp.chdir(root)                                  # MuJoCo writes MUJOCO_LOG.TXT into the working directory
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hc = minari.DataCollector(gym.make("HalfCheetah-v5", max_episode_steps=9))
        seen_hc = _collect(hc, 3, 50, seed=40)
        hc.create_dataset(dataset_id="test/halfcheetah/random-v0", algorithm_name="random", author="tests",
                          author_email="tests@example.org", code_permalink="tests/common/test_minari_io.py",
                          description="3 random HalfCheetah episodes")
        cp = minari.DataCollector(StepInfo(gym.make("CartPole-v1", max_episode_steps=200)), record_infos=True)
        seen_cp = _collect(cp, 4, 200, seed=7)
        cp.create_dataset(dataset_id="test/cartpole/random-v0", algorithm_name="random", author="tests",
                          author_email="tests@example.org", code_permalink="tests/common/test_minari_io.py",
                          description="4 random CartPole episodes with infos")
    yield root, seen_hc, seen_cp
    mp.undo()


def _same(e, s):
    assert np.array_equal(e.observations, np.stack(s["obs"]))
    assert np.array_equal(e.actions, np.stack(s["act"]) if np.ndim(s["act"][0]) else np.array(s["act"]))
    assert np.array_equal(e.rewards, np.array(s["rew"], dtype=np.float64))
    assert np.array_equal(e.terminations, np.array(s["term"])) and np.array_equal(e.truncations, np.array(s["trunc"]))


def test_halfcheetah_episodes_read_back_exactly(minari_root):
    root, seen, _ = minari_root
    data = load_minari("test/halfcheetah/random-v0")                 # by id under MINARI_DATASETS_PATH
    assert data.env_id == "HalfCheetah-v5" and data.dataset_id == "test/halfcheetah/random-v0"
    assert [e.id for e in data.episodes] == [0, 1, 2] and data.total_steps == 27
    for e, s in zip(data.episodes, seen):
        _same(e, s)
        assert e.observations.shape == (10, 17) and e.actions.shape == (9, 6)
        assert e.truncations[-1] and not e.terminations.any()             # time limit, not a terminal state
    flat = data.transitions()
    assert flat["observations"].shape == (27, 17) and flat["actions"].shape == (27, 6)
    e1 = data.episodes[1]
    rows = flat["episode"] == 1
    assert np.array_equal(flat["observations"][rows], e1.observations[:-1])
    assert np.array_equal(flat["next_observations"][rows], e1.observations[1:])
    assert flat["t"][rows].tolist() == list(range(9)) and flat["timeouts"].sum() == 3
    frame = data.frame()
    r = np.array(seen[2]["rew"])
    got = frame.filter(frame["episode"] == 2)["return_to_go"].to_numpy()
    assert np.allclose(got, [r[t:].sum() for t in range(len(r))], rtol=0, atol=1e-12)
    by_path = load_minari(root / "test/halfcheetah/random-v0", episode_ids=[2])   # by folder, a subset
    assert [e.id for e in by_path.episodes] == [2]
    _same(by_path.episodes[0], seen[2])


def test_cartpole_terminations_and_infos(minari_root):
    root, _, seen = minari_root
    data = load_minari("test/cartpole/random-v0", root=root, max_episodes=3)
    assert len(data.episodes) == 3
    for e, s in zip(data.episodes, seen):
        _same(e, s)
        assert e.terminations[-1] and e.terminations.sum() == 1             # the pole fell once, at the end
        assert e.infos["t"].tolist() == list(range(e.length + 1))
        assert np.array_equal(e.infos["pole"], e.observations[:, 2])
    assert data.transitions()["terminals"].sum() == 3


def test_missing_and_bad_datasets(minari_root, tmp_path):
    root, _, _ = minari_root
    with pytest.raises(SourceError, match=r"^papers\.sciql\.prepare\.source\.dataset: Minari dataset "
                                          r"'mujoco/halfcheetah/medium-v0' not found under .*local: "
                                          r"test/cartpole/random-v0, test/halfcheetah/random-v0\).*minari download"):
        load_minari("mujoco/halfcheetah/medium-v0", key="papers.sciql.prepare.source.dataset")
    with pytest.raises(SourceError, match=r"episode ids \[7\] not in test/halfcheetah/random-v0"):
        load_minari("test/halfcheetah/random-v0", episode_ids=[0, 7])
    bad = tmp_path / "broken" / "data"
    bad.mkdir(parents=True)
    (bad / "metadata.json").write_text("{}")
    assert find_minari_data(tmp_path / "broken") == bad
    with pytest.raises(SourceError, match=r"is not a readable Minari dataset"):
        load_minari(tmp_path / "broken")
