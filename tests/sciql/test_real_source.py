"""The Minari loader (stages/sciql/minari_source.py) on a dataset written by Minari's own DataCollector on
the project's HalfCheetah-v5 (no download): episodes come back in the generators' format, the gait clock
equals the evaluation env's (GaitClock) observation, x_velocity equals what the env reported, and the
labelling + flat table run on them unchanged."""
from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest

from stages.common.sources import SourceError
from stages.sciql import data as D
from stages.sciql.envs import GaitClock, HALFCHEETAH_ID
from stages.sciql.minari_source import load_minari_episodes

pytestmark = pytest.mark.real_source


@pytest.fixture(scope="module")
def hc_dataset(tmp_path_factory):
    import minari

    root = tmp_path_factory.mktemp("minari_sciql")
    mp = pytest.MonkeyPatch()
    mp.setenv("MINARI_DATASETS_PATH", str(root))
    mp.chdir(root)                                       # MuJoCo writes MUJOCO_LOG.TXT into the working directory
    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = minari.DataCollector(gym.make(HALFCHEETAH_ID, max_episode_steps=7))
        clock = GaitClock(gym.make(HALFCHEETAH_ID, max_episode_steps=7))   # the evaluation env, same seeds
        env.action_space.seed(3)
        for ep in range(2):
            env.reset(seed=10 + ep)
            o_clock, _ = clock.reset(seed=10 + ep)
            rec = {"obs": [o_clock], "xv": []}
            for _ in range(20):
                a = env.action_space.sample()
                _, _, term, trunc, info = env.step(a)
                o_clock, *_ = clock.step(a)
                rec["obs"].append(o_clock)
                rec["xv"].append(float(env.unwrapped.data.qvel[0]))    # the root's velocity after the step
                if term or trunc:
                    break
            seen.append(rec)
        env.create_dataset(dataset_id="test/halfcheetah/sciql-v0", algorithm_name="random", author="tests",
                           author_email="tests@example.org", code_permalink="tests/sciql/test_real_source.py",
                           description="2 random HalfCheetah-v5 episodes")
        clock.close()
    yield root, seen
    mp.undo()


def test_minari_halfcheetah_into_sciql_episodes(hc_dataset):
    root, seen = hc_dataset
    eps = load_minari_episodes("test/halfcheetah/sciql-v0", "halfcheetah", root=root)
    assert len(eps) == 2
    for ep, s in zip(eps, seen):
        assert ep["obs"].shape == (8, 17 + 6) and ep["action"].shape == (7, 6) and ep["reward"].shape == (7,)
        assert np.allclose(ep["obs"], np.stack(s["obs"]), atol=1e-6)          # = GaitClock's observation
        assert np.allclose(ep["x_velocity"], s["xv"], atol=1e-6)                # no infos: qvel[0] after each step
        assert ep["terminated"] is False                                         # time limit: a truncation
    D.label_episodes("halfcheetah", eps, ["speed"])
    table = D.to_table(eps, ["speed"])
    assert table["obs"].shape == (14, 23) and table["episode"].tolist() == [0] * 7 + [1] * 7
    assert np.array_equal(table["next_obs"][:7], eps[0]["obs"][1:]) and set(table["label_speed"].tolist()) <= {0, 1, 2}


def test_minari_errors_are_one_line(hc_dataset, tmp_path):
    root, _ = hc_dataset
    with pytest.raises(SourceError, match="not found"):
        load_minari_episodes("test/halfcheetah/nothing-v0", "halfcheetah", root=root)
    with pytest.raises(SourceError, match="unknown SCIQL environment"):
        load_minari_episodes("test/halfcheetah/sciql-v0", "circle2d", root=root)


def test_prepare_reads_the_minari_source_when_full_names_it(hc_dataset):
    """prepare's HalfCheetah episodes come from the Minari dataset when source.kind is file (at most
    halfcheetah.episodes of them); a missing dataset is a one-line error naming the params key."""
    from stages.sciql import prepare

    root, seen = hc_dataset
    base = {"circle2d": {"episodes": 2, "max_steps": 10, "styles": ["speed"]},
            "halfcheetah": {"episodes": 2, "max_steps": 10, "noise": 0.1, "gaits": 4, "styles": ["speed"]}}
    cfg = prepare.Config(**base, source={"kind": "file", "dataset": str(root / "test/halfcheetah/sciql-v0")})
    eps = prepare.halfcheetah_episodes(cfg, cfg.halfcheetah)
    assert len(eps) == 2 and all(np.allclose(e["obs"], np.stack(s["obs"]), atol=1e-6) for e, s in zip(eps, seen))
    with pytest.raises(SourceError, match="papers.sciql.prepare.source.dataset"):
        bad = prepare.Config(**base, source={"kind": "file", "dataset": str(root / "missing")})
        prepare.halfcheetah_episodes(bad, bad.halfcheetah)
