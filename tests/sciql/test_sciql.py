"""SCIQL: environment, labelling functions, hindsight relabelling, IQL/GAWR properties, bad input."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.optimize import brentq

from kernels.gawr_loss import expectile_loss_reference, gated_advantage, gawr_weights_reference
from stages.common.config import ConfigError, validate
from stages.sciql import algos
from stages.sciql import data as D
from stages.sciql import prepare, train
from stages.sciql.envs import LABELLERS, Circle2D, get_labeller, make_env


# ---------------------------------------------------------------------------------------------- env
def test_circle2d_passes_gymnasium_checker():
    from gymnasium.utils.env_checker import check_env

    check_env(Circle2D(max_steps=20), skip_render_check=True)


def test_circle2d_is_registered_with_gymnasium():
    import gymnasium as gym

    env = gym.make("sciql/Circle2D-v0", max_steps=3)
    env.reset(seed=0)
    for _ in range(3):
        *_, trunc, _ = env.step(env.action_space.sample())
    assert trunc


def test_circle2d_unicycle_step_and_reward():
    env = Circle2D(max_steps=5)
    env.reset(seed=0, options={"xy": (10.0, 0.0), "theta": math.pi / 2})  # on the task circle, heading north
    _, r0, *_ = env.step(np.array([0.0, -1.0]))  # no turn, min speed 0.5
    np.testing.assert_allclose(env.state[:2], [10.0, 0.5], atol=1e-9)
    assert r0 == pytest.approx(math.exp(-((math.hypot(10, 0.5) - 10) ** 2) / 50))
    _, _, _, trunc, info = env.step(np.array([1.0, 1.0]))  # turn left by π/4 then move at max speed 3
    assert info["heading"] == pytest.approx(math.pi / 2 + math.pi / 4)
    assert info["speed"] == pytest.approx(3.0) and not trunc


def test_halfcheetah_v5_runs_offline():
    env = make_env("halfcheetah", 3)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (17 + 6,)                       # + gait clock sin/cos(ωt) for 3 frequencies
    np.testing.assert_allclose(obs[17:], [0, 0, 0, 1, 1, 1], atol=1e-7)
    obs, _, _, _, info = env.step(np.zeros(6))
    np.testing.assert_allclose(obs[17:20], np.sin([1.0, 1.5, 2.0]), atol=1e-6)
    assert "x_velocity" in info
    env.close()


# ---------------------------------------------------------------------------------------------- labels
def _circle_episode(turn: float, speed_action: float, steps: int = 30):
    env = Circle2D(max_steps=steps)
    _, info = env.reset(seed=1, options={"xy": (0.0, 0.0), "theta": 0.0})
    ep = {"xy": [info["xy"]], "heading": [info["heading"]]}
    for _ in range(steps):
        _, _, _, _, info = env.step(np.array([turn, speed_action]))
        ep["xy"].append(info["xy"])
        ep["heading"].append(info["heading"])
    return {k: np.asarray(v) for k, v in ep.items()}


def test_labelling_functions_on_scripted_motion():
    left_fast = _circle_episode(turn=0.5, speed_action=1.0)
    right_slow = _circle_episode(turn=-0.5, speed_action=-1.0)
    straight = _circle_episode(turn=0.0, speed_action=0.0, steps=15)  # stays inside the ±30 walls
    lab = LABELLERS["circle2d"]
    assert (lab["turn"](left_fast) == 1).all() and (lab["turn"](right_slow) == 0).all()
    assert (lab["turn"](straight) == 2).all()                      # straight: not a promptable style
    assert (lab["speed"](left_fast) == 2).all() and (lab["speed"](right_slow) == 0).all()
    assert (lab["speed"](straight) == 1).all()
    assert (lab["direction"](straight) == 0).all()                  # heading east
    assert set(np.unique(lab["direction"](left_fast))) == {0, 1, 2, 3}
    with pytest.raises(ValueError, match="unknown labelling function 'gait'"):
        get_labeller("circle2d", "gait")


# ---------------------------------------------------------------------------------------------- relabelling
def _toy_data(n_eps=4, T=50):
    ep = torch.arange(n_eps).repeat_interleave(T)
    t = torch.arange(T).repeat(n_eps)
    n = n_eps * T
    return {"episode": ep, "t": t, "obs": torch.randn(n, 3), "action": torch.rand(n, 2) * 2 - 1,
            "reward": torch.rand(n), "next_obs": torch.randn(n, 3), "terminated": torch.zeros(n),
            "label_step": torch.arange(n)}  # label = global row index: relabelling becomes visible


def test_hindsight_current_future_random():
    data = _toy_data()
    gen = torch.Generator().manual_seed(0)
    cur = D.HindsightSampler(data, "step", [1, 0, 0], [1, 0, 0], 0.9, gen).sample(500)
    assert torch.equal(cur["value_label"], cur["cur_label"]) and torch.equal(cur["actor_label"], cur["cur_label"])
    s = D.HindsightSampler(data, "step", [0, 1, 0], [0, 1, 0], 0.9, gen)
    idx = torch.randint(0, 200, (20000,), generator=gen)
    fut = s.relabel(idx, s.value_probs)
    assert (fut >= idx).all() and (data["episode"][fut] == data["episode"][idx]).all()  # same trajectory, future
    k = (fut - idx).float()
    unclipped = idx % 50 < 5  # far from the episode end: mean offset of Geom(1 − λ) on {0,1,..} = λ/(1 − λ) = 9
    assert abs(k[unclipped].mean().item() - 9.0) < 1.0
    rnd = s.relabel(idx, torch.tensor([0.0, 0.0, 1.0]))
    assert (data["episode"][rnd] != data["episode"][idx]).float().mean() > 0.6  # mostly other episodes


# ---------------------------------------------------------------------------------------------- IQL / GAWR
def test_expectile_loss_is_minimised_at_the_tau_expectile():
    u = torch.randn(400, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    tau = 0.7
    f = lambda e: tau * (u - e).clamp(min=0).sum().item() - (1 - tau) * (e - u).clamp(min=0).sum().item()
    e = brentq(f, -5, 5)  # first-order condition of the asymmetric least squares
    def slope(x):
        v = torch.full_like(u, x, requires_grad=True)
        expectile_loss_reference(u, v, tau).backward()
        return v.grad.sum().item()
    assert abs(slope(e)) < 1e-6 and slope(e - 0.05) < -1e-3 and slope(e + 0.05) > 1e-3
    assert e > u.mean().item()  # τ > 0.5: above the mean
    torch.testing.assert_close(expectile_loss_reference(u, u * 0, 0.5), 0.5 * (u ** 2).mean().float())


def test_gawr_gate_puts_style_first():
    a_r = torch.tensor([5.0, 5.0, -5.0])
    a_z = torch.tensor([-20.0, 20.0, 20.0])
    a = gated_advantage(a_z, a_r)
    torch.testing.assert_close(a, a_z + torch.sigmoid(a_z) * a_r)
    assert a[0] == pytest.approx(-20.0, abs=1e-6)           # style advantage negative: task term gated off
    assert a[1] == pytest.approx(25.0) and a[2] == pytest.approx(15.0)
    w = gawr_weights_reference(torch.tensor([-1.0, 0.0, 10.0]), torch.zeros(3))
    torch.testing.assert_close(w, torch.tensor([math.exp(-3.0), 1.0, 100.0]))  # min(exp(3A), 100)


def _module(cls, num_labels=3, n_seeds=1):
    return cls(obs_dim=3, act_dim=2, num_labels=num_labels, obs_mean=torch.zeros(3), obs_std=torch.ones(3),
               hidden=16, n_seeds=n_seeds)


def test_polyak_update_is_exact():
    m = _module(algos.SCIQL)
    before = [p.clone() for p in m.style.target.parameters()]
    online = list(m.style.critic.parameters())
    with torch.no_grad():
        for p in online:
            p.add_(1.0)
    m.style.polyak(0.005)
    for b, p, t in zip(before, online, m.style.target.parameters()):
        torch.testing.assert_close(t, 0.995 * b + 0.005 * p)


def test_ensemble_members_are_independent():
    m = _module(algos.SCIQL)
    obs, act, z = torch.randn(1, 6, 3), torch.randn(1, 6, 2), torch.randint(0, 3, (1, 6))
    q = m.style.critic(obs, act, z)                 # (twins, seeds, batch)
    assert q.shape == (2, 1, 6)
    with torch.no_grad():
        m.style.critic.qs.weights[-1][0].add_(1.0)  # perturb twin 1 only
    q2 = m.style.critic(obs, act, z)
    assert not torch.allclose(q[0], q2[0]) and torch.equal(q[1], q2[1])


def test_seed_members_train_independently():
    """Vectorised seeds: member 0's gradients do not depend on member 1's batch."""
    data = _toy_data()
    data["label_s"] = torch.randint(0, 3, (200,))
    sampler = D.HindsightSampler(data, "s", [0.2, 0.5, 0.3], [0.2, 0.5, 0.3], 0.99, torch.Generator().manual_seed(0))
    batch = next(iter(D.BatchStream(sampler, 16, seeds=2, inner=1)))
    batch = {k: v[0] for k, v in batch.items()}      # (seeds, B, ...)
    m = _module(algos.SCIQLSuite, n_seeds=2)

    def member0_grads(b):
        m.zero_grad(set_to_none=True)
        sum(m.compute_losses(b).values()).backward()
        return [p.grad[0].clone() for p in m.parameters() if p.grad is not None and p.shape[0] in (2, 4)]

    g1 = member0_grads(batch)
    other = {k: v.clone() for k, v in batch.items()}
    other["obs"][1] += 5.0
    other["action"][1] = -other["action"][1]
    g2 = member0_grads(other)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b)


def test_losses_route_gradients_to_their_own_networks():
    data = _toy_data()
    data["label_s"] = torch.randint(0, 3, (200,))
    batch = D.HindsightSampler(data, "s", [0.2, 0.5, 0.3], [0.2, 0.5, 0.3], 0.99,
                               torch.Generator().manual_seed(0)).sample(64)
    batch = {k: v.unsqueeze(0) for k, v in batch.items()}  # one seed member
    m = _module(algos.SCIQL)
    losses = m.compute_losses(batch)
    assert set(losses) == {"style_value", "style_critic", "task_value", "task_critic", "actor_sciql", "actor_gawr"}
    losses["actor_gawr"].backward()
    assert all(p.grad is None for p in m.style.parameters()) and all(p.grad is None for p in m.task.parameters())
    sciql_member = list(m.actors).index("sciql")  # actors are members of one ensemble: (actor, seed)
    assert all(p.grad[sciql_member].abs().sum() == 0 for p in m.policies.parameters())
    gawr_member = list(m.actors).index("gawr")
    assert any(p.grad[gawr_member].abs().sum() > 0 for p in m.policies.parameters())
    m.zero_grad(set_to_none=True)
    losses["style_value"].backward()
    assert all(p.grad is None for p in m.style.critic.parameters())  # value target = frozen target critic
    assert any(p.grad is not None for p in m.style.value.parameters())


def test_style_reward_and_td_target():
    m = _module(algos.SCIQL)
    iql = m.style
    obs, act, nxt = torch.randn(1, 5, 3), torch.randn(1, 5, 2), torch.randn(1, 5, 3)
    z = torch.tensor([[0, 1, 2, 0, 1]])
    cur = torch.tensor([[0, 0, 2, 1, 1]])
    r = (cur == z).float() - 1.0
    assert torch.equal(r, torch.tensor([[0.0, -1.0, 0.0, -1.0, 0.0]]))
    z_actor = torch.tensor([[2, 2, 1, 0, 0]])
    _, critic_loss, adv = iql.losses(obs, act, nxt, r, torch.ones(1, 5), z, 0.7, 0.99, adv_label=z_actor)
    with torch.no_grad():
        target = r + 0.99 * iql.value(nxt, z)
        expected = ((iql.critic(obs, act, z) - target) ** 2).mean(-1).sum()
    torch.testing.assert_close(critic_loss, expected)
    torch.testing.assert_close(adv, iql.advantage(obs, act, z_actor))  # A = min(Q1', Q2') − V at the actor's z


@pytest.mark.parametrize("kind", ["bc", "cbc", "task_iql", "sciql"])
def test_standalone_modules_train_with_make_trainer(kind):
    data = _toy_data()
    data["label_s"] = torch.randint(0, 3, (200,))
    meta = {"obs_dim": 3, "act_dim": 2, "obs_mean": [0.0] * 3, "obs_std": [1.0] * 3, "labels": {"s": {"num_labels": 3}}}
    cfg = train.Config(seeds=[0, 1], circle2d={"steps": 5}, hidden=8, batch_size=8, inner_steps=2,
                       trainer={"enable_progress_bar": False})
    module, logged = train.fit_module(kind, "s" if kind in ("cbc", "sciql") else None, [0, 1], data, meta, cfg, 5)
    assert module.trainer.global_step == 5 and all(math.isfinite(v) for v in logged.values())  # exact step count
    assert any(k.startswith("loss/actor_") for k in logged)


# ---------------------------------------------------------------------------------------------- config errors
PREP = {"seed": 0, "circle2d": {"episodes": 4, "max_steps": 20, "styles": ["speed"]},
        "halfcheetah": {"episodes": 2, "max_steps": 20, "styles": ["speed"]}}


def test_unknown_labelling_function_fails_at_load():
    bad = {**PREP, "circle2d": {**PREP["circle2d"], "styles": ["speed", "elegance"]}}
    with pytest.raises(ConfigError, match=r"circle2d\.styles.*'elegance'"):
        validate(prepare.Config, bad, "papers.sciql.prepare")


def test_empty_style_set_fails_at_load():
    bad = {**PREP, "halfcheetah": {**PREP["halfcheetah"], "styles": []}}
    with pytest.raises(ConfigError, match=r"halfcheetah\.styles.*empty"):
        validate(prepare.Config, bad, "papers.sciql.prepare")


@pytest.mark.parametrize("tau", [0.0, 1.0, 1.5, -0.2])
def test_expectile_outside_unit_interval_fails_at_load(tau):
    block = {"seeds": [0], "circle2d": {"steps": 5}, "expectile": tau}
    with pytest.raises(ConfigError, match=r"papers\.sciql\.train\.expectile"):
        validate(train.Config, block, "papers.sciql.train")


def test_params_yaml_profiles_load():
    from stages.common.runner import load_config

    for profile in ("smoke", "default", "full"):
        for stage in ("prepare", "train", "evaluate", "report"):
            load_config("sciql", stage, profile)


# ---------------------------------------------------------------------------------------------- pipeline
def test_smoke_pipeline(smoke_run):
    import json

    out = smoke_run("sciql")
    metrics = json.loads((out["report"] / "metrics.json").read_text())
    assert set(metrics["runtime_s"]) == {"prepare", "train", "evaluate", "report"}
    assert metrics["claims"] and all({"name", "statement", "holds", "values"} <= set(c) for c in metrics["claims"])
    assert all(isinstance(c["holds"], bool) and c["values"] for c in metrics["claims"])
    for env in ("circle2d", "halfcheetah"):
        for m in algos.METHODS:
            assert 0.0 <= metrics["metrics"][env]["alignment"][m] <= 1.0
    for fig in ("trajectories_circle2d", "alignment_vs_return", "alignment_per_style"):
        assert (out["report"] / "figures" / f"{fig}.png").stat().st_size > 0
    assert (out["report"] / "plots" / "alignment_vs_return.csv").exists()
    assert "SCIQL" in (out["report"] / "report.md").read_text()
