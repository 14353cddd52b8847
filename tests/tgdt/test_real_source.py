"""The Minari loader (stages/tgdt/minari_source.py) on datasets written by Minari's own DataCollector (no
download): one dataset per task on the project's point mass (expert controller) and on HalfCheetah-v5;
rows come back in prepare's table schema, equal to what the env loop saw; the HalfCheetah clock equals
the evaluation env's observation and the reward is the task's, recomputed; errors are one line."""
from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest

from stages.common.sources import SourceError
from stages.tgdt import envs as E
from stages.tgdt.minari_source import load_minari_tasks

pytestmark = pytest.mark.real_source


def _task(env, name):
    return next(t for t in E.tasks_of(env) if f"{t.direction} {t.speed}" == name)


@pytest.fixture(scope="module")
def minari_root(tmp_path_factory):
    import minari

    root = tmp_path_factory.mktemp("minari_tgdt")
    mp = pytest.MonkeyPatch()
    mp.setenv("MINARI_DATASETS_PATH", str(root))
    mp.chdir(root)                                   # MuJoCo writes MUJOCO_LOG.TXT into the working directory
    seen = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in ("north fast", "west slow"):     # point mass: the scripted expert, 2 episodes of 6 steps
            task = _task("pointmass", name)
            env = minari.DataCollector(E.make_env(task, 6))
            eps = []
            for k in range(2):
                obs, _ = env.reset(seed=20 + k)
                rec = {"obs": [], "act": [], "rew": []}
                while True:
                    a = env.unwrapped.expert_action(obs).astype(np.float32)
                    rec["obs"].append(obs)
                    rec["act"].append(a)
                    obs, r, term, trunc, _ = env.step(a)
                    rec["rew"].append(r)
                    if term or trunc:
                        break
                eps.append(rec)
            seen[name] = eps
            env.create_dataset(dataset_id=f"test/pointmass/{name.replace(' ', '-')}-v0", algorithm_name="expert",
                               author="tests", author_email="tests@example.org",
                               code_permalink="tests/tgdt/test_real_source.py", description=f"point mass {name}")
        task = _task("halfcheetah", "backward fast")     # HalfCheetah-v5 raw, vs the evaluation env on the same seed
        hc = minari.DataCollector(gym.make(E.HALFCHEETAH_ID, max_episode_steps=5))
        ev = E.make_env(task, 5)
        hc.action_space.seed(1)
        hc.reset(seed=3)
        o_ev, _ = ev.reset(seed=3)
        rec = {"obs": [], "rew": []}
        for _ in range(5):
            a = hc.action_space.sample()
            rec["obs"].append(o_ev)
            _, _, term, trunc, _ = hc.step(a)
            o_ev, *_ = ev.step(a)
            v = float(hc.unwrapped.data.qvel[0])
            rec["rew"].append(-abs(v - task.vector[0]) - 0.05 * float(a.astype(np.float64) @ a.astype(np.float64)))
            if term or trunc:
                break
        seen["backward fast"] = [rec]
        hc.create_dataset(dataset_id="test/halfcheetah/backward-fast-v0", algorithm_name="random", author="tests",
                          author_email="tests@example.org", code_permalink="tests/tgdt/test_real_source.py",
                          description="1 random HalfCheetah-v5 episode")
        ev.close()
    yield root, seen
    mp.undo()


def test_minari_pointmass_tasks_into_prepare_rows(minari_root):
    root, seen = minari_root
    rows = load_minari_tasks({"north fast": "test/pointmass/north-fast-v0", "west slow": "test/pointmass/west-slow-v0"},
                             "pointmass", root=root)
    assert set(rows) == {"task", "held_out", "quality", "obs", "action", "reward", "ret"}
    nf, ws = _task("pointmass", "north fast"), _task("pointmass", "west slow")
    assert rows["task"] == [nf.index] * 2 + [ws.index] * 2 and rows["held_out"] == [nf.held_out] * 2 + [ws.held_out] * 2
    for i, rec in enumerate(seen["north fast"] + seen["west slow"]):
        assert np.allclose(rows["obs"][i], np.stack(rec["obs"]), atol=1e-7)      # the observation before each action
        assert np.allclose(rows["action"][i], np.stack(rec["act"]), atol=1e-7)
        assert np.allclose(rows["reward"][i], rec["rew"], atol=1e-6)
        assert rows["ret"][i] == pytest.approx(sum(rec["rew"]), abs=1e-5)
        assert np.asarray(rows["obs"][i]).shape == (6, 4)


def test_minari_halfcheetah_clock_and_task_reward(minari_root):
    root, seen = minari_root
    rows = load_minari_tasks({"backward fast": "test/halfcheetah/backward-fast-v0"}, "halfcheetah", root=root)
    rec = seen["backward fast"][0]
    assert np.asarray(rows["obs"][0]).shape == (5, 19)
    assert np.allclose(rows["obs"][0], np.stack(rec["obs"]), atol=1e-6)          # = TargetVelocity's observation
    assert np.allclose(rows["reward"][0], rec["rew"], atol=1e-5)                  # −|qvel0 − v*| − 0.05‖a‖²


def test_minari_errors_are_one_line(minari_root):
    root, _ = minari_root
    with pytest.raises(SourceError, match="not a pointmass task"):
        load_minari_tasks({"up very fast": "test/pointmass/north-fast-v0"}, "pointmass", root=root)
    with pytest.raises(SourceError, match="columns"):
        load_minari_tasks({"forward fast": "test/pointmass/north-fast-v0"}, "halfcheetah", root=root)
    with pytest.raises(SourceError, match="not found"):
        load_minari_tasks({"north fast": "test/pointmass/nothing-v0"}, "pointmass", root=root)


def test_prepare_rows_from_minari_when_full_names_it(minari_root):
    """prepare's per-task rows come from the task's Minari dataset when source.kind is file; a task without
    a dataset is a one-line error naming the params key."""
    from stages.tgdt import prepare

    root, seen = minari_root
    block = {"expert_episodes": 1, "medium_episodes": 0, "max_steps": 6}
    cfg = prepare.Config(envs=["pointmass"], pointmass=block, source={"kind": "file", "dataset": str(root)},
                         minari_tasks={"pointmass": {"north fast": "test/pointmass/north-fast-v0"}})
    task = _task("pointmass", "north fast")
    rows = prepare.minari_rows(cfg, "pointmass", task, cfg.pointmass)
    assert rows["task"] == [task.index] and np.allclose(rows["obs"][0], np.stack(seen["north fast"][0]["obs"]), atol=1e-7)
    with pytest.raises(SourceError, match="papers.tgdt.prepare.minari_tasks.pointmass"):
        prepare.minari_rows(cfg, "pointmass", _task("pointmass", "west slow"), cfg.pointmass)
