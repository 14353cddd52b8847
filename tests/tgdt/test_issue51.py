"""tgdt (issue 51): batched point-mass stepper equals the gymnasium env, pairwise factor coverage of the
held-out split (both families), InfoNCE pair count at default, validation / oracle-id data handling."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from stages.common.config import read_params
from stages.tgdt import envs as E
from stages.tgdt import prepare as P
from stages.tgdt import train as TR
from stages.tgdt.evaluate import policy_rollout
from stages.tgdt.report import val_tail_gain


def test_batched_pointmass_equals_gym_env():
    targets = [(0.3, -0.2), (-0.8, 0.1), (0.0, 0.55)]
    seeds = [7, 123456, 99]
    batch = E.PointMassBatch(targets, max_steps=9, rho=0.37)
    ob = batch.reset(seeds)
    envs = [E.PointMassVel(target=t, max_steps=9, rho=0.37) for t in targets]
    og = np.stack([e.reset(seed=s)[0] for e, s in zip(envs, seeds)])
    np.testing.assert_array_equal(ob, og)
    rng = np.random.default_rng(5)
    for t in range(9):
        a = rng.uniform(-1.6, 1.6, size=(3, 2))              # out of range: both clip
        ob, rb, db = batch.step(a)
        outs = [e.step(a[i]) for i, e in enumerate(envs)]
        np.testing.assert_array_equal(ob, np.stack([o[0] for o in outs]))
        np.testing.assert_allclose(rb, [o[1] for o in outs], rtol=0, atol=1e-12)
        assert list(db) == [o[2] or o[3] for o in outs]
    assert db.all() and t == 8
    with pytest.raises(ValueError, match="seeds: 2 seeds for 3"):
        batch.reset([1, 2])


def test_zero_action_rollout_by_hand():
    """policy_rollout through the batch stepper equals a hand loop over gym envs (zero action)."""
    tasks = E.tasks_of("pointmass")[:3]
    meta = {"max_steps": 6, "act_dim": 2}
    got = policy_rollout(lambda o, t: np.zeros((len(o), 2)), tasks, meta, 2, seed=4)
    for i, task in enumerate(tasks):
        for e in range(2):
            env = E.PointMassVel(target=task.vector, max_steps=6)
            env.reset(seed=4 * 100_003 + 1000 * task.index + e)
            ret = sum(env.step(np.zeros(2))[1] for _ in range(6))
            assert got[i, e] == pytest.approx(ret, abs=1e-12)


@pytest.mark.parametrize("env", E.ENV_NAMES)
def test_pairwise_factor_coverage(env):
    """Every held-out (direction, speed): its direction is trained with another speed, its speed with
    another direction; the split rule refuses a split that breaks it."""
    tasks = E.tasks_of(env)
    train = {(t.direction, t.speed) for t in tasks if not t.held_out}
    for t in tasks:
        if t.held_out:
            assert (t.direction, t.speed) not in train
            assert any(d == t.direction and s != t.speed for d, s in train)
            assert any(s == t.speed and d != t.direction for d, s in train)
    # a broken split: hold out every task with the first direction's... speed in all directions
    sp = tasks[0].speed
    bad = [E.Task(t.env, t.index, t.direction, t.speed, t.vector, t.speed == sp) for t in tasks]
    with pytest.raises(ValueError, match=f"speed '{sp}' never trained with another direction|never seen"):
        E.check_split(bad)
    d0 = tasks[0].direction
    bad = [E.Task(t.env, t.index, t.direction, t.speed, t.vector, t.direction == d0) for t in tasks]
    with pytest.raises(ValueError, match="never"):
        E.check_split(bad)


def test_halfcheetah_family_size():
    tasks = E.tasks_of("halfcheetah")
    assert len(E.HC_SPEEDS) >= 5 and len(E.HC_DIRECTIONS) == 2 and len(tasks) == 10
    held = {(t.direction, t.speed) for t in tasks if t.held_out}
    assert held == {("forward", "steady"), ("backward", "brisk")}
    assert [t.vector[0] for t in tasks if (t.direction, t.speed) == ("backward", "brisk")] == [-1.25]


def test_infonce_pairs_at_default():
    """One InfoNCE pair per training task: >= 16 at the default profile's env(s)."""
    envs = read_params()["papers"]["tgdt"]["prepare"]["envs"]
    for env in envs:
        n = sum(not t.held_out for t in E.tasks_of(env))
        assert n >= 16, (env, n)


def test_validation_and_oracle_id_episodes(tmp_path):
    block = P.EnvData(expert_episodes=3, medium_episodes=1, max_steps=8)
    cfg = P.Config(envs=["pointmass"], reference_episodes=1, pointmass=block)
    P.build_env("pointmass", block, cfg, tmp_path)
    data, meta = TR.load_env(tmp_path / "pointmass", 8, context=3)
    val, train, alleps = set(data["val_eps"].tolist()), set(data["train_eps"].tolist()), set(data["all_eps"].tolist())
    assert len(val) == 18 and not val & train and not val & alleps
    assert not bool(data["held_out"][data["train_eps"]].any())
    assert bool(data["held_out"][data["all_eps"]].any())                 # oracle_id sees held-out tasks
    assert len(alleps) + len(val) == data["task"].shape[0]
    for t, eps in data["expert_eps"].items():
        assert not set(eps.tolist()) & val
    v = data["val"]
    assert v["obs"].shape == (18 * 5, 3, 4)                               # window ends {1, 2, 4, 6, 8}
    k = 0                                                                 # first window ends at step 1
    assert v["pad"][k].tolist() == [True, True, False]
    ep = int(data["val_eps"][0])
    assert torch.equal(v["obs"][k, 2], data["obs"][ep, 0])
    # val_mse = masked action MSE over the windows (pad steps excluded), with the model left in train mode
    m = TR.build("dt", 3, meta, TR.Config(seeds=[3], steps=1, context=3, d_model=16, n_heads=2, seg_len=3))
    m.attach(data)
    m.on_fit_start()
    with torch.no_grad():
        pred = m.act(v["rtg"], v["obs"], v["act"], v["tsteps"], v["pad"], v["cond"])
    num = sum(float(((pred[b, k] - v["act"][b, k]) ** 2).sum()) for b in range(len(pred)) for k in range(3)
              if not v["pad"][b, k])
    assert m.val_mse() == pytest.approx(num / (int((~v["pad"]).sum()) * 2), rel=1e-5) and m.training
    # fewer than 2 expert episodes per task: one-line error
    block1 = P.EnvData(expert_episodes=1, medium_episodes=1, max_steps=8)
    P.build_env("pointmass", block1, P.Config(envs=["pointmass"], reference_episodes=1, pointmass=block1),
                tmp_path / "one")
    with pytest.raises(ValueError, match="expert_episodes"):
        TR.load_env(tmp_path / "one" / "pointmass", 8)


def test_val_tail_gain_by_hand():
    h = [{"step": s, "val_mse": v} for s, v in [(0, 1.0), (20, 0.5), (40, 0.4), (60, 0.3), (79, 0.24)]]
    assert val_tail_gain(h) == pytest.approx((0.3 - 0.24) / 0.3)            # ¾·79 = 59.25 -> record 60
    assert np.isnan(val_tail_gain(h[:1]))
