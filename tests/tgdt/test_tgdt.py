"""tgdt: task split and vocabulary, env dynamics vs closed form, DT causality, config errors, the core
zero-shot effect at tiny scale, and the smoke pipeline end to end."""
from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch

from stages.common.config import ConfigError, read_params, validate_all_profiles
from stages.tgdt import envs as E
from stages.tgdt import prepare as P
from stages.tgdt import train as TR
from stages.tgdt.evaluate import rollout
from stages.tgdt.model import TGDT


@pytest.mark.parametrize("env", E.ENV_NAMES)
def test_held_out_words_all_seen_and_split_sizes(env):
    tasks = E.tasks_of(env)
    E.check_split(tasks)
    vocab = E.Vocab.from_tasks(tasks)
    held = [t for t in tasks if t.held_out]
    assert len(held) == len(E.HELD_OUT[env]) and 0 < len(held) < len(tasks)
    for t in held:                     # the combination is new, each word is not
        for k in range(len(E.TEMPLATES)):
            assert vocab.unknown(t.describe(k)) == []
        assert any(u.direction == t.direction and not u.held_out for u in tasks)
        assert any(u.speed == t.speed and not u.held_out for u in tasks)


def test_unknown_word_warns_naming_field_and_word():
    vocab = E.Vocab.from_tasks(E.tasks_of("pointmass"))
    with pytest.warns(UserWarning, match=r"probes\[3\].*'zoom'"):
        ids = vocab.encode("zoom north", 8, field="probes[3]")
    assert ids[1] == vocab.stoi[E.UNK] and ids[2] == vocab.stoi["north"]
    with pytest.raises(ValueError, match="text_len"):
        vocab.encode("move north " * 5, 4)


def test_unknown_environment_is_named():
    with pytest.raises(ValueError, match="env: unknown environment 'mars'"):
        E.tasks_of("mars")
    with pytest.raises(ValueError, match="env: unknown environment"):
        E.make_env(E.Task("mars", 0, "up", "slow", (0.0,), False), 10)


def test_pointmass_dynamics_closed_form_and_expert():
    """v_t = ρ^t v_0 + (1 − ρ^t) a for a constant action; the expert reaches v* (reward → 1)."""
    rho = 0.37
    env = E.PointMassVel(target=(0.3, -0.2), max_steps=30, rho=rho)
    obs, _ = env.reset(seed=3)
    v0 = obs[2:4].astype(np.float64)
    a = np.array([0.4, -0.9])
    for t in range(1, 6):
        obs, r, *_ = env.step(a)
        expect = rho ** t * v0 + (1 - rho ** t) * a
        np.testing.assert_allclose(obs[2:4], expect, atol=1e-6)
        assert math.isclose(r, 1 - np.linalg.norm(expect - env.target), abs_tol=1e-6)
    obs, _ = env.reset(seed=4)
    for _ in range(3):
        obs, r, *_ = env.step(env.expert_action(obs))
    assert r > 0.999


def test_best_gait_maximises_task_return_not_mean_velocity():
    """An oscillating gait whose MEAN velocity equals the target loses to a steady slightly-slow gait
    under r = −|v − v*| − c; the expert must be chosen by return (independent sums by hand)."""
    T = 8
    osc = np.tile([2.2, -0.2], T // 2)               # mean 1.0 = target, |v − 1| = 1.2 every step
    steady = np.full(T, 0.9)                         # |v − 1| = 0.1 every step
    fast = np.full(T, 1.0)                           # exact speed but expensive control
    vel = np.stack([osc, steady, fast])
    ctrl = np.stack([np.full(T, 0.01), np.full(T, 0.05), np.full(T, 0.2)])
    # returns: osc −(1.2+0.01)·8 = −9.68, steady −(0.1+0.05)·8 = −1.2, fast −(0+0.2)·8 = −1.6
    assert P.best_gait(vel, ctrl, 1.0) == 1
    assert P.best_gait(vel, np.zeros_like(ctrl), 1.0) == 2       # without control cost the exact one wins
    assert P.best_gait(-vel, ctrl, -1.0) == 1                     # backward targets mirror


def _params_with(**train_over):
    params = copy.deepcopy(read_params())
    params["papers"]["tgdt"]["train"].update(train_over)
    return params


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match=r"papers\.tgdt\.train\.context: .*> 0"):
        validate_all_profiles(_params_with(context=0), "tgdt", "train", TR.Config)
    with pytest.raises(ConfigError, match=r"papers\.tgdt\.train\.context"):
        validate_all_profiles(_params_with(context=-3), "tgdt", "train", TR.Config)
    params = copy.deepcopy(read_params())
    params["papers"]["tgdt"]["prepare"]["envs"] = ["pointmass", "antmaze"]
    with pytest.raises(ConfigError, match=r"papers\.tgdt\.prepare\.envs\.1"):
        validate_all_profiles(params, "tgdt", "prepare", P.Config)
    with pytest.raises(ValueError, match="context"):
        TGDT(arm="dt", obs_dim=4, act_dim=2, n_tasks=3, task_dim=2, vocab_size=9, text_len=4, context=0,
             seg_len=3, max_steps=10)


def test_dt_is_causal_and_text_changes_actions():
    torch.manual_seed(0)
    m = TGDT(arm="tgdt", obs_dim=3, act_dim=2, n_tasks=4, task_dim=2, vocab_size=11, text_len=5, context=6,
             seg_len=4, max_steps=20, d_model=16, n_layers=2, n_heads=2).eval()
    B, K = 3, 6
    rtg, obs, act = torch.randn(B, K), torch.randn(B, K, 3), torch.randn(B, K, 2)
    ts = torch.arange(K)[None].expand(B, K)
    pad = torch.zeros(B, K, dtype=torch.bool)
    cond = {"text": torch.tensor([[2, 5, 6, 0, 0, 0]] * B), "task": torch.zeros(B, dtype=torch.long)}
    a = m.act(rtg, obs, act, ts, pad, cond)
    obs2, act2 = obs.clone(), act.clone()
    obs2[:, 4:] += 5.0
    act2[:, 3:] += 5.0                              # a_3 is after s_3: â_3 must not change
    b = m.act(rtg, obs2, act2, ts, pad, cond)
    torch.testing.assert_close(a[:, :4], b[:, :4])
    assert not torch.allclose(a[:, 4:], b[:, 4:])
    cond2 = {"text": torch.tensor([[2, 7, 8, 9, 0, 0]] * B), "task": cond["task"]}
    assert not torch.allclose(a, m.act(rtg, obs, act, ts, pad, cond2))


def test_zero_shot_effect_tiny(tmp_path):
    """Core effect: TG-DT on unseen direction × speed combinations beats the no-info DT."""
    from stages.common.trainer import TrainerConfig, make_trainer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)                 # tiny matmuls: one thread is fastest on a shared CPU
    block = P.EnvData(expert_episodes=3, medium_episodes=1, max_steps=16)
    cfg = P.Config(envs=["pointmass"], reference_episodes=2, pointmass=block)
    P.build_env("pointmass", block, cfg, tmp_path)
    data, meta = TR.load_env(tmp_path / "pointmass", 8)
    assert not bool(data["held_out"][data["train_eps"]].any())     # train never sees held-out episodes
    tcfg = TR.Config(seeds=[0], steps=60, batch_size=32, context=4, seg_len=4, d_model=32, n_heads=4)
    tasks = [E.Task("pointmass", t["index"], t["direction"], t["speed"], tuple(t["vector"]), t["held_out"])
             for t in meta["tasks"]]
    rand = np.array([t["ref_random"] for t in meta["tasks"]])
    expert = np.array([t["ref_expert"] for t in meta["tasks"]])
    held = np.array([t.held_out for t in tasks])
    score = {}
    for arm in ("tgdt", "dt"):
        model = TR.build(arm, 0, meta, tcfg)
        model.attach(data)
        trainer = make_trainer(TrainerConfig(enable_progress_bar=False), None, max_steps=tcfg.steps)
        trainer.fit(model, torch.utils.data.DataLoader(range(tcfg.steps), batch_size=None))
        if arm == "tgdt":
            assert model.kernel_calls == tcfg.steps                   # InfoNCE through the kernel every step
        raw = rollout(model.eval(), tasks, data, meta, 1, 0, torch.device("cpu"))
        score[arm] = float(((raw.mean(1) - rand) / (expert - rand))[held].mean())
    torch.set_num_threads(threads)
    assert score["tgdt"] > score["dt"] + 0.2, score


def test_smoke_pipeline(smoke_run):
    outs = smoke_run("tgdt")
    doc = json.loads((smoke_run.root / "reports" / "tgdt" / "metrics.json").read_text())
    names = {c["name"] for c in doc["claims"]}
    assert {"tgdt_beats_dt_unseen_pointmass", "alignment_matters_pointmass",
            "tgdt_beats_dt_unseen_halfcheetah"} <= names
    assert all(c["verdict"] == "inconclusive" for c in doc["claims"] if "stats" in c)   # one seed at smoke
    k = doc["kernels"]["fused_infonce"]
    assert k["calls"] > 0 and k["parity_max_abs_err"] is not None and k["parity_max_abs_err"] < 1e-4
    assert "sprint" in doc["metrics"]["unknown_words"]
    assert (outs["report"] / "figures" / "return_seen_unseen.png").exists()
    assert (outs["report"] / "figures" / "similarity_pointmass.png").exists()
    assert (outs["report"] / "figures" / "similarity_halfcheetah.png").exists()
    assert (outs["report"] / "figures" / "training_curves.png").exists()
    # the learning curve continued past `steps` (smoke: 2 -> 4) and the CPU/wall table of every stage
    tsum = json.loads((outs["train"] / "train_summary.json").read_text())
    assert [h["step"] for h in tsum["long_curves"]["pointmass/tgdt/s0"]] == [0, 1, 3]
    assert [h["step"] for h in tsum["runs"]["pointmass/tgdt/s0"]["history"]] == [0, 1]
    assert (outs["report"] / "figures" / "learning_curve_long.png").exists()
    md = (outs["report"] / "report.md").read_text()
    table = md.split("## CPU and wall time per stage (this run)")[1].split("\n\n")[1].splitlines()[2:]
    assert [row.split("|")[1].strip() for row in table] == ["prepare", "train", "evaluate", "report", "total"]
    assert all(float(row.split("|")[2]) > 0 for row in table)          # cpu_s recorded by the runner
