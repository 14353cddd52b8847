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
    env.reset(seed=0, options={"xy": (5.0, 5.0), "theta": math.pi / 2})  # on the task circle (0, 5) R 5, north
    _, r0, *_ = env.step(np.array([0.0, -1.0]))  # no turn, min speed 0.5
    np.testing.assert_allclose(env.state[:2], [5.0, 5.5], atol=1e-9)
    assert r0 == pytest.approx(math.exp(-((math.hypot(5, 0.5) - 5) ** 2) / 50))
    _, _, _, trunc, info = env.step(np.array([0.5, 1.0]))  # turn left by π/2 (max turn π) then max speed 3
    assert abs(info["heading"]) == pytest.approx(math.pi) and info["speed"] == pytest.approx(3.0) and not trunc
    np.testing.assert_allclose(env.state[:2], [2.0, 5.5], atol=1e-9)
    env.reset(seed=0, options={"xy": (49.0, 0.0), "theta": 0.0})
    env.step(np.array([0.0, 1.0]))
    assert env.state[0] == pytest.approx(50.0)   # walls at ±50 clip the position


def test_circle2d_observation_stacks_the_last_states_newest_first():
    # official traj2d: a deque of the last `history` states, filled with the start state at reset, newest first
    env = Circle2D(max_steps=5, history=3)
    assert env.observation_space.shape == (12,)
    o0, _ = env.reset(seed=0, options={"xy": (10.0, -20.0), "theta": 0.0})
    s0 = [10.0 / 50, -20.0 / 50, 1.0, 0.0]
    np.testing.assert_allclose(o0, s0 * 3, atol=1e-6)
    o1, *_ = env.step(np.array([0.5, -1.0]))      # turn left π/2 (heading north), move 0.5
    s1 = [10.0 / 50, -19.5 / 50, 0.0, 1.0]
    np.testing.assert_allclose(o1, s1 + s0 + s0, atol=1e-6)
    o2, *_ = env.step(np.array([0.0, 1.0]))       # straight on at speed 3
    s2 = [10.0 / 50, -16.5 / 50, 0.0, 1.0]
    np.testing.assert_allclose(o2, s2 + s1 + s0, atol=1e-6)
    o3, *_ = env.step(np.array([0.0, 1.0]))
    np.testing.assert_allclose(o3, [10.0 / 50, -13.5 / 50, 0.0, 1.0] + s2 + s1, atol=1e-6)  # s0 drops out
    o4, _ = env.reset(seed=1, options={"xy": (0.0, 0.0), "theta": 0.0})  # reset clears the old history
    np.testing.assert_allclose(o4, [0.0, 0.0, 1.0, 0.0] * 3, atol=1e-6)
    assert make_env("circle2d", 5, history=4).observation_space.shape == (16,)
    with pytest.raises(ValueError, match="history"):
        Circle2D(history=0)
    with pytest.raises(ValueError, match="history"):
        make_env("halfcheetah", 5, history=2)


def test_dataset_observations_carry_the_history_of_their_episode():
    eps = D.generate_circle2d(2, 6, 0.1, 30.0, (3.0, 10.0), 2.0, seed=5, history=2)
    for ep in eps:
        obs = ep["obs"]
        assert obs.shape == (7, 8)
        np.testing.assert_allclose(obs[0, :4], obs[0, 4:])            # start state padded
        np.testing.assert_allclose(obs[1:, 4:], obs[:-1, :4])         # previous newest state moves back
        np.testing.assert_allclose(obs[:, 0] * 50, ep["xy"][:, 0], atol=1e-4)


def test_circle2d_evaluation_starts_follow_the_official_reset():
    env = Circle2D(max_steps=5)
    starts = np.array([env.reset(seed=s)[1]["xy"] for s in range(200)])
    assert np.abs(starts).max() <= 14.0 and np.abs(starts).max() > 12.0   # x, y ~ U(±14)
    assert env.reset(seed=3)[1]["heading"] == 0.0                           # θ = 0


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
def _circle_episode(turn: float, speed_action: float, steps: int = 30, xy=(0.0, 0.0)):
    env = Circle2D(max_steps=steps)
    _, info = env.reset(seed=1, options={"xy": xy, "theta": 0.0})
    ep = {"xy": [info["xy"]], "heading": [info["heading"]], "speed": []}
    for _ in range(steps):
        _, _, _, _, info = env.step(np.array([turn, speed_action]))
        ep["xy"].append(info["xy"])
        ep["heading"].append(info["heading"])
        ep["speed"].append(info["speed"])
    return {k: np.asarray(v) for k, v in ep.items()}


def test_labelling_functions_on_scripted_motion():
    left_fast = _circle_episode(turn=0.1, speed_action=1.0)      # Δθ = 0.1π per step, speed 3
    right_slow = _circle_episode(turn=-0.1, speed_action=-1.0)   # speed 0.5
    straight = _circle_episode(turn=0.0, speed_action=0.0, steps=15, xy=(-20.0, -3.0))  # speed 1.75, east
    lab = LABELLERS["circle2d"]
    assert (lab["turn"](left_fast) == 1).all() and (lab["turn"](right_slow) == 0).all()
    assert (lab["turn"](straight) == 2).all()                      # straight: not a promptable style
    assert (lab["speed"](left_fast) == 2).all() and (lab["speed"](right_slow) == 0).all()
    assert (lab["speed"](straight) == 1).all()
    assert (lab["direction"](straight) == 0).all()                  # heading east: bin [0°, 45°)
    # 20 steps of 18° turns: the heading sweeps every 45° bin; bins follow the heading counter-clockwise
    d = lab["direction"](left_fast)
    assert set(np.unique(d)) == set(range(8)) and d[0] == 0 and d[2] == 1 and d[5] == 2
    # position at s_t: x-bins (−∞, −15), [−15, 0), [0, 15), [15, ∞) × (y > 0): 2·bin + (y > 0)
    p = lab["position"](straight)
    assert p[0] == 0 and (p == 0).sum() == 3 and (p[3:12] == 2).all() and (p[12:] == 4).all()
    assert lab["position"]({"xy": np.array([[20.0, 1.0], [0.0, 0.0]])})[0] == 7
    # the commanded speed decides the speed label, not the displacement (a wall stops the unicycle)
    wall = _circle_episode(turn=0.0, speed_action=1.0, steps=4, xy=(49.0, 0.0))
    assert (lab["speed"](wall) == 2).all() and np.linalg.norm(np.diff(wall["xy"], axis=0), axis=-1)[-1] == 0.0
    with pytest.raises(ValueError, match="unknown labelling function 'gait'"):
        get_labeller("circle2d", "gait")


def test_turn_label_uses_a_centred_11_step_window():
    # 10 straight steps, then left turns of 0.3 rad from step 10: the centred window sees them early
    heading = np.concatenate([np.zeros(11), 0.3 * np.arange(1, 21)])
    labels = LABELLERS["circle2d"]["turn"]({"heading": heading})
    mean_dth = [np.mean(np.diff(heading)[max(0, t - 5):t + 6]) for t in range(30)]   # brute force
    np.testing.assert_array_equal(labels, np.where(np.array(mean_dth) >= 0.1, 1, 2))
    assert labels[7] == 2 and labels[8] == 1   # 4 turning steps of 0.3 in the window: mean 0.109 ≥ 0.1


def test_dataset_follows_circles_and_never_draws_the_task_circle():
    eps = D.generate_circle2d(30, 60, 0.0, 30.0, (3.0, 10.0), 2.0, seed=4)
    env = Circle2D()
    for ep in eps:
        assert np.ptp(ep["speed"]) < 1e-9                       # constant speed per episode
        assert np.abs(ep["xy"]).max() < 45.0                    # never at the ±50 walls
        assert np.mean(env.ring_distance(ep["xy"]) < 1.0) < 0.5  # not a demonstration of the task circle
        assert env.ring_distance(ep["xy"]).mean() > 1.5 * env.sigma  # far from the ring on average (issue 54)
        assert env.task_reward(ep["xy"][1:]).mean() < 0.5            # under half the on-ring per-step reward (1)
    # a circle follower without noise stays near its own circle: fit a circle to its positions
    xy = eps[0]["xy"]
    A = np.c_[2 * xy, np.ones(len(xy))]
    c = np.linalg.lstsq(A, (xy ** 2).sum(1), rcond=None)[0]
    r = np.linalg.norm(xy - c[:2], axis=1)
    assert r.std() < 0.1 * r.mean()
    assert D.near_task_circle((0.5, 5.5), 5.2, env, 2.0) and not D.near_task_circle((30, 5), 5, env, 2.0)
    # a concentric circle 8 units larger: mean ring distance 8 < 2σ = 10 (the old |Δc| + |ΔR| < 2 rule let it in)
    assert D.near_task_circle((0.0, 5.0), 13.0, env, 2.0) and not D.near_task_circle((0.0, 5.0), 13.0, env, 1.5)


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


def _hand_log_prob(mu, log_std, a):
    # independent Gaussian log-density via torch.distributions (not the kernel's formula)
    return torch.distributions.Normal(mu.double(), log_std.double().exp()).log_prob(a.double()).sum(-1)


def _expectile_by_hand(u, tau):
    # L_τ(u) = |τ − 1(u < 0)| u², written with explicit branches
    return torch.where(u < 0, (1 - tau) * u ** 2, tau * u ** 2).mean()


def test_compute_losses_whole_by_hand():
    """Every loss of SCIQLSuite.compute_losses rebuilt per seed from network outputs on one small batch with
    terminals: style reward offset, expectile τ ≠ 0.5, terminal mask, min over twin target critics, GAWR
    advantage, gate, β and the weight clip."""
    torch.manual_seed(0)
    E, B, tau, gamma, beta, clip = 2, 12, 0.8, 0.9, 2.0, 4.0
    mean, std = torch.tensor([0.5, -1.0, 2.0]), torch.tensor([2.0, 0.5, 1.5])
    m = algos.SCIQLSuite(obs_dim=3, act_dim=2, num_labels=4, obs_mean=mean, obs_std=std, n_seeds=E, hidden=8,
                         expectile=tau, discount=gamma, beta=beta, clip=clip)
    with torch.no_grad():   # targets differ from the online critics; values and advantages of both signs
        for sys in (m.style, m.task):
            for p_ in sys.target.parameters():
                p_.add_(0.5 * torch.randn_like(p_))
            for p_ in sys.value.parameters():
                p_.add_(0.3 * torch.randn_like(p_))
    g = torch.Generator().manual_seed(1)
    cur = torch.randint(0, 4, (E, B), generator=g)
    z_v = torch.where(torch.arange(B) % 2 == 0, cur, (cur + 1) % 4)       # half the rows: r_z = 0, half −1
    batch = {"obs": 2 * torch.randn(E, B, 3, generator=g), "next_obs": 2 * torch.randn(E, B, 3, generator=g),
             "action": torch.rand(E, B, 2, generator=g) * 1.8 - 0.9, "reward": 1.5 * torch.randn(E, B, generator=g),
             "mask": (torch.arange(B) % 3 != 0).float().expand(E, B).clone(),   # every third row terminal
             "cur_label": cur, "value_label": z_v, "actor_label": torch.randint(0, 4, (E, B), generator=g)}
    losses = m.compute_losses(batch)

    with torch.no_grad():
        on, nn_ = (batch["obs"] - mean) / std, (batch["next_obs"] - mean) / std
        act, mask, z_a = batch["action"], batch["mask"], batch["actor_label"]
        expected = {k: 0.0 for k in losses}
        ws = []
        for e in range(E):
            def twins(net, o, a, lab):
                q = net(o, a, lab)                                       # (2, E, B)
                return q[0, e], q[1, e]
            r_style = torch.where(cur[e] == z_v[e], 0.0, -1.0)          # r_z = 1[label = z] − 1
            adv = {}
            for sys, r, lab, lab_a in (("style", r_style, z_v, z_a), ("task", batch["reward"][e], None, None)):
                iql = getattr(m, sys)
                t1, t2 = twins(iql.target, on, act, lab)
                q_min = torch.minimum(t1, t2)
                v = iql.value(on, lab)[e]
                next_v = iql.value(nn_, lab)[e]
                expected[f"{sys}_value"] += _expectile_by_hand(q_min - v, tau)
                y = r + gamma * mask[e] * next_v                          # terminal rows: y = r
                c1, c2 = twins(iql.critic, on, act, lab)
                expected[f"{sys}_critic"] += ((c1 - y) ** 2).mean() + ((c2 - y) ** 2).mean()
                a1, a2 = twins(iql.target, on, act, lab_a)
                adv[sys] = torch.minimum(a1, a2) - iql.value(on, lab_a)[e]
            a_z, a_r = adv["style"], adv["task"]
            dists = m.policies(on, {"cbc": cur, "sciql": z_a, "gawr": z_a})
            for name, A in (("bc", None), ("cbc", None), ("sciql", a_z), ("task_iql", a_r),
                            ("gawr", a_z + torch.sigmoid(a_z) * a_r)):       # GAWR gate: style first
                w = torch.ones(B) if A is None else torch.clamp(torch.exp(beta * A), max=clip)
                if name == "gawr":
                    ws.append(w)
                mu, ls = dists[name]
                expected[f"actor_{name}"] += -(w.double() * _hand_log_prob(mu[e], ls[e], act[e])).mean()
    assert set(losses) == set(expected)
    for k in losses:
        torch.testing.assert_close(losses[k].double(), torch.as_tensor(expected[k]).double(), rtol=1e-5, atol=1e-5,
                                   msg=lambda s, k=k: f"{k}: {s}")
    w = torch.cat(ws)
    assert 0 < (w >= clip).sum() < len(w) and (w < 1).any()   # the batch exercises the clip and negative A


def test_iql_learns_analytic_style_values_on_a_chain():
    """A tiny chain MDP with analytic V_z: states 0..4 step right (4 → terminal 5); at state 0 a second action
    ends the episode. label(s) = s mod 2, r_z(s) = 1[label(s) = z] − 1, γ = 0.9, τ = 0.7. Then
    V_z(4) = r_z(4), V_z(s) = r_z(s) + γ V_z(s+1) (1 ≤ s ≤ 3) and V_z(0) = τ·max(Q+, Q−) + (1 − τ)·min(Q+, Q−)
    with Q+ = r_z(0) + γ V_z(1), Q− = r_z(0) — the τ-expectile of two equally likely actions."""
    torch.manual_seed(0)
    gamma, tau, n = 0.9, 0.7, 7
    rows = [(0, 1.0, 1, 1.0), (0, -1.0, 6, 0.0)] + [(s, 1.0, s + 1, 0.0 if s == 4 else 1.0) for s in (1, 2, 3, 4)]
    obs = torch.eye(n)[[r[0] for r in rows]].repeat(2, 1)
    act = torch.tensor([[r[1]] for r in rows]).repeat(2, 1)
    nxt = torch.eye(n)[[r[2] for r in rows]].repeat(2, 1)
    mask = torch.tensor([r[3] for r in rows]).repeat(2)
    z = torch.tensor([0] * len(rows) + [1] * len(rows))
    label = torch.tensor([r[0] % 2 for r in rows]).repeat(2)
    reward = (label == z).float() - 1.0
    iql = algos.IQL(1, n, 1, 2, 32)
    opt = torch.optim.Adam(iql.parameters(), lr=3e-3)
    u = lambda x: x.unsqueeze(0)
    for _ in range(1500):
        v_loss, q_loss, _ = iql.losses(u(obs), u(act), u(nxt), u(reward), u(mask), u(z), tau, gamma, adv_label=u(z),
                                       backend="torch")
        opt.zero_grad()
        (v_loss + q_loss).backward()
        opt.step()
        iql.polyak(0.05)

    def r(s, zz):
        return float(s % 2 == zz) - 1.0
    with torch.no_grad():
        for zz in (0, 1):
            V = {4: r(4, zz)}
            for s in (3, 2, 1):
                V[s] = r(s, zz) + gamma * V[s + 1]
            q_plus, q_minus = r(0, zz) + gamma * V[1], r(0, zz)
            V[0] = tau * max(q_plus, q_minus) + (1 - tau) * min(q_plus, q_minus)
            learned = iql.value(u(torch.eye(n)[:5]), u(torch.full((5,), zz))).squeeze(0)
            np.testing.assert_allclose(learned.numpy(), [V[s] for s in range(5)], atol=0.05)
    assert abs(V[0] - (q_plus + q_minus) / 2) > 0.1   # the expectile differs from the mean: τ is tested


@pytest.mark.parametrize("kind", ["bc", "cbc", "task_iql", "sciql"])
def test_standalone_modules_train_with_make_trainer(kind):
    data = _toy_data()
    data["label_s"] = torch.randint(0, 3, (200,))
    meta = {"obs_dim": 3, "act_dim": 2, "obs_mean": [0.0] * 3, "obs_std": [1.0] * 3, "labels": {"s": {"num_labels": 3}}}
    cfg = train.Config(seeds=[0, 1], circle2d={"steps": 5}, hidden=8, batch_size=8, inner_steps=2,
                       trainer={"enable_progress_bar": False})
    meta["max_steps"] = 50
    module, logged, extra = train.fit_module(kind, "s" if kind in ("cbc", "sciql") else None, [0, 1], data, meta,
                                             cfg, 5)
    assert extra["value_relabel"] == [0.0, 0.0, 1.0]                                   # official default
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
    with pytest.raises(ConfigError, match=r"halfcheetah\.styles.*at least 1"):
        validate(prepare.Config, bad, "papers.sciql.prepare")


@pytest.mark.parametrize("tau", [0.0, 1.0, 1.5, -0.2])
def test_expectile_outside_unit_interval_fails_at_load(tau):
    block = {"seeds": [0], "circle2d": {"steps": 5}, "expectile": tau}
    with pytest.raises(ConfigError, match=r"papers\.sciql\.train\.expectile"):
        validate(train.Config, block, "papers.sciql.train")


@pytest.mark.parametrize("block, match", [
    ({"seeds": [0, 0]}, r"seeds.*duplicate"),
    ({"value_relabel": [0.5, 0.6, 0.0]}, r"value_relabel.*sum"),
    ({"circle2d": {"steps": 10**9}}, r"circle2d\.steps"),
    ({"device": "tpu"}, r"device"),
    ({"ablation_style": "gait"}, r"ablation_style"),
])
def test_bad_train_config_fails_at_load(block, match):
    with pytest.raises(ConfigError, match=match):
        validate(train.Config, {"seeds": [0], "circle2d": {"steps": 5}, **block}, "papers.sciql.train")


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
    assert metrics["claims"] and all({"name", "statement", "holds", "verdict", "values", "refuted_by"} <= set(c)
                                     for c in metrics["claims"])
    assert all(c["refuted_by"] for c in metrics["claims"])
    assert all(c["verdict"] == "inconclusive" for c in metrics["claims"])      # smoke: one seed decides nothing
    for env in ("circle2d", "halfcheetah"):
        for m in algos.METHODS:
            assert all(0.0 <= a <= 1.0 for a in metrics["metrics"][env]["alignment"][m])
    # the GAWR / expectile kernels ran in train's loss and evaluate's batched policy loss, with parity checked
    k = metrics["kernels"]
    assert {"gawr_actor_loss", "expectile_loss", "gawr_weights"} <= set(k)
    assert k["gawr_actor_loss"]["calls"] >= 5 * 20 and k["gawr_actor_loss"]["parity_max_abs_err"] < 1e-4
    for fig in ("trajectories_circle2d", "alignment_vs_return", "learning_curves", "loss_curves"):
        assert (out["report"] / "figures" / f"{fig}.png").stat().st_size > 0
    assert (out["report"] / "plots" / "learning_curves.csv").exists()
    text = (out["report"] / "report.md").read_text()
    assert "Relabelling ablation" in text and "Deviations" in text
    names = {c["name"] for c in metrics["claims"]}
    assert {"random_relabel_beats_mixed_position", "gawr_adds_return_halfcheetah"} <= names
    assert len(metrics["metrics"]["ablation"]["alignment"]["sciql"]) == len(metrics["metrics"]["circle2d"]["seeds"])


def test_report_claims_are_seed_aware():
    """HalfCheetah return claim: inconclusive when both arms are below the random policy even with a
    consistent gap; ablation claim: holds / fails / inconclusive from per-seed lists."""
    from stages.common.claims import evaluate_claims
    from stages.sciql import report

    cfg = report.Config()
    gawr = next(c for c in report.claims_for("halfcheetah", ["speed"], cfg) if c.name == "gawr_adds_return_halfcheetah")

    def world(ret_gawr, ret_sciql, al_sciql, al_gawr):
        return {"halfcheetah": {"norm_return_items": {"gawr": ret_gawr, "sciql": ret_sciql}, "chance": 1 / 3,
                                "alignment": {"sciql": al_sciql, "gawr": al_gawr},
                                "alignment_items": {"sciql": al_sciql, "gawr": al_gawr}}}

    aligned = ([0.80, 0.82, 0.79], [0.78, 0.81, 0.77])         # SCIQL far above chance, GAWR keeps it
    below = world([-0.1, -0.11, -0.09], [-0.5, -0.52, -0.48], *aligned)
    up = ([[0.6, 0.62], [0.61, 0.6], [0.59, 0.6]], [[0.2, 0.21], [0.22, 0.2], [0.18, 0.2]])
    th = {"gawr_adds_return_*": {"min_effect": 0.05, "gate_min": 0.05},
          "random_relabel_beats_mixed_*": {"min_effect": 0.05}}
    assert gawr.kind == "finding"
    assert evaluate_claims([gawr], below, th)[0]["verdict"] == "inconclusive"
    assert evaluate_claims([gawr], world(*up, *aligned), th)[0]["verdict"] == "holds"
    # red team (issue 54): a return bought by dropping the commanded style is not GAWR's claim
    dropped = evaluate_claims([gawr], world(*up, [0.80, 0.82, 0.79], [0.35, 0.34, 0.36]), th)[0]
    assert (dropped["verdict"], dropped["return_verdict"], dropped["alignment_verdict"]) == ("fails", "holds", "fails")
    # ... and with SCIQL itself near chance there is no alignment to keep: inconclusive, not holds
    near = evaluate_claims([gawr], world(*up, [0.36, 0.43, 0.39], [0.35, 0.34, 0.36]), th)[0]
    assert near["verdict"] == "inconclusive" and near["return_verdict"] == "holds"
    claim = report.ablation_claim("position", [0.0, 0.0, 1.0], "[0.2, 0.5, 0.3]")

    def verdict(main, abl):
        m = {"circle2d": {"per_style": {"position": {"alignment": {"sciql": main}}}}, "ablation": {"alignment": {"sciql": abl}}}
        return evaluate_claims([claim], m, th)[0]["verdict"]

    assert verdict([0.5, 0.52, 0.48], [0.3, 0.31, 0.29]) == "holds"
    assert verdict([0.3, 0.31, 0.29], [0.5, 0.52, 0.48]) == "fails"
    assert verdict([0.5, 0.3, 0.4], [0.3, 0.5, 0.4]) == "inconclusive"


def test_gawr_alignment_claim_is_gated_on_sciql_above_chance():
    """issue 54: GAWR 'keeps alignment' is inconclusive unless SCIQL's own alignment is above chance by the
    gate's min effect (the same per-seed rule), even when GAWR is above SCIQL on every seed."""
    from stages.common.claims import evaluate_claims
    from stages.sciql import report

    cfg = report.Config(keep_alignment_tol=0.05)
    names = ("gawr_keeps_alignment_halfcheetah", "sciql_above_chance_halfcheetah")
    cl = [c for c in report.claims_for("halfcheetah", ["speed"], cfg) if c.name in names]
    th = {"sciql_above_chance_*": {"min_effect": 0.05}, "gawr_keeps_alignment_*": {"gate_min": 0.05}}

    def verdicts(sciql):
        gawr = [x + 0.01 for x in sciql]
        m = {"halfcheetah": {"alignment": {"sciql": sciql, "gawr": gawr}, "chance": 1 / 3,
                             "alignment_items": {"sciql": sciql, "gawr": gawr}}}
        return {v["name"]: v["verdict"] for v in evaluate_claims(cl, m, th)}

    near = verdicts([0.36, 0.42, 0.38])            # HalfCheetah's committed numbers: near chance
    assert near == {"sciql_above_chance_halfcheetah": "inconclusive", "gawr_keeps_alignment_halfcheetah": "inconclusive"}
    far = verdicts([0.80, 0.82, 0.79])
    assert far == {"sciql_above_chance_halfcheetah": "holds", "gawr_keeps_alignment_halfcheetah": "holds"}
    assert {c.name: c.kind for c in cl} == {"sciql_above_chance_halfcheetah": "check", "gawr_keeps_alignment_halfcheetah": "finding"}


def test_item_lists_pair_per_start_and_average_to_the_seed_value():
    """env_metrics' item lists: one value per evaluation start (criteria weigh equally, z averaged), whose mean
    is the seed's value in the per-seed list — by hand on a 2-criterion, 2-start, 2-seed frame."""
    import polars as pl
    from stages.sciql import report

    rows = []
    for seed in (0, 1):
        for style, zs in (("speed", (0, 1, 2)), ("position", (0, 1))):
            for z in zs:
                for e in (0, 1):
                    for m in report.METHODS:
                        val = 0.1 * seed + (0.3 if style == "speed" else 0.05) * z + 0.01 * e
                        rows.append({"env": "circle2d", "seed": seed, "style": style, "method": m, "z": z,
                                     "episode": e, "alignment": val, "norm_return": -val})
    out = report.env_metrics(pl.DataFrame(rows), "circle2d")
    # seed 0, start 0: speed mean over z of 0.3 z = 0.3, position 0.025 -> (0.3 + 0.025) / 2; start 1 adds 0.01
    assert out["alignment_items"]["sciql"][0] == pytest.approx([0.1625, 0.1725])
    assert out["alignment_items"]["sciql"][1] == pytest.approx([0.2625, 0.2725])
    for k in range(2):
        assert np.mean(out["alignment_items"]["cbc"][k]) == pytest.approx(out["alignment"]["cbc"][k])
        assert np.mean(out["norm_return_items"]["bc"][k]) == pytest.approx(out["norm_return"]["bc"][k])
    assert out["per_style"]["position"]["alignment_items"]["sciql"][0] == pytest.approx([0.025, 0.035])
