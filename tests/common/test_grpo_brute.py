"""stages/common/grpo.py against independent brute force: group advantages from numpy (ddof 1/0, P·G layout),
the clipped surrogate / k3 / every loss normaliser and the stats from plain loops, config bounds and
messages, the replay buffer's FIFO and seeding, the prompt loader, and whole ``training_step``s through
the Lightning trainer on a toy policy whose parameter update is rebuilt by hand (SGD, so the update is
the clipped gradient itself): on-policy REINFORCE, NaN/±inf gradient scrubbing, the grad-norm clip,
PPO epochs with frozen old log-probs, the KL term to an explicit reference, and replay mixing."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from stages.common.grpo import (GRPOConfig, GRPOModule, PromptLoader, ReplayBuffer, clipped_surrogate,
                                concat_rollouts, group_advantages, grpo_loss, kl_k3)
from stages.common.trainer import TrainerConfig, make_trainer


# ----------------------------------------------------------------------------------------------
# config
# ----------------------------------------------------------------------------------------------
def test_config_defaults():
    c = GRPOConfig()
    assert (c.group_size, c.clip_eps, c.clip_eps_high, c.adv_eps, c.std, c.kl_coef, c.loss_norm, c.ppo_epochs,
            c.replay_size, c.replay_groups, c.grad_clip) == (8, 0.2, None, 1e-4, "unbiased", 0.0, "active_samples",
                                                              1, 0, 0, 1.0)


@pytest.mark.parametrize("key,ok,bad", [
    ("group_size", [2, 1024], [1, 1025]),
    ("clip_eps", [1e-9, 10.0], [0.0, 10.01]),
    ("clip_eps_high", [1e-9, 10.0, None], [0.0, 10.01]),
    ("adv_eps", [1e-9, 1.0], [0.0, 1.01]),
    ("kl_coef", [0.0, 100.0], [-1e-9, 100.01]),
    ("ppo_epochs", [1, 64], [0, 65]),
    ("replay_size", [0, 100_000], [-1, 100_001]),
    ("grad_clip", [1e-9, 1e6, None], [0.0, 1e6 + 1]),
    ("std", ["unbiased", "biased", "none"], ["std"]),
    ("loss_norm", ["active_samples", "tokens", "samples"], ["mean"]),
])
def test_config_bounds(key, ok, bad):
    for v in ok:
        assert getattr(GRPOConfig(**{key: v}), key) == v
    for v in bad:
        with pytest.raises(Exception, match=key):
            GRPOConfig(**{key: v})


def test_config_replay_rules():
    assert GRPOConfig(replay_size=3, replay_groups=3).replay_groups == 3          # equal: allowed
    assert GRPOConfig(replay_size=1024, replay_groups=1024).replay_groups == 1024
    assert GRPOConfig(replay_size=5).replay_groups == 0
    with pytest.raises(Exception, match="replay_groups: 2 needs replay_size > 0"):
        GRPOConfig(replay_groups=2)
    with pytest.raises(Exception, match="replay_groups: 4 exceeds replay_size 3"):
        GRPOConfig(replay_size=3, replay_groups=4)
    with pytest.raises(Exception, match="replay_groups"):
        GRPOConfig(replay_size=2000, replay_groups=1025)


# ----------------------------------------------------------------------------------------------
# pure functions
# ----------------------------------------------------------------------------------------------
R6 = [2.0, 0.5, -1.0, 4.0, 4.0, 1.0]            # two groups of 3, prompt-major


def _adv_numpy(r, G, eps, ddof):
    r = np.asarray(r, dtype=np.float64).reshape(-1, G)
    out = []
    for row in r:
        m = row.mean()
        s = math.sqrt(sum((x - m) ** 2 for x in row) / (len(row) - ddof)) if ddof is not None else None
        out += [(x - m) / (s + eps) if s is not None else x - m for x in row]
    return np.array(out)


def test_group_advantages_against_numpy():
    r = torch.tensor(R6)
    assert np.allclose(group_advantages(r, 3).numpy(), _adv_numpy(R6, 3, 1e-4, 1), atol=1e-6)    # defaults
    assert np.allclose(group_advantages(r, 3, 0.3).numpy(), _adv_numpy(R6, 3, 0.3, 1), atol=1e-6)
    assert np.allclose(group_advantages(r, 3, 0.3, "biased").numpy(), _adv_numpy(R6, 3, 0.3, 0), atol=1e-6)
    assert np.allclose(group_advantages(r, 3, 0.3, "none").numpy(), _adv_numpy(R6, 3, 0.3, None), atol=1e-6)
    assert np.allclose(group_advantages(r, 2, 0.3).numpy(), _adv_numpy(R6, 2, 0.3, 1), atol=1e-6)
    # hand check of group 1 of size 3: mean 0.5, centred (1.5, 0, −1.5), unbiased var (2.25·2)/2 = 2.25 → std 1.5
    assert group_advantages(r, 3, 0.5)[:3].tolist() == pytest.approx([1.5 / 2.0, 0.0, -1.5 / 2.0])
    ints = group_advantages(torch.tensor([1, 3, 3, 3]), 2, 1.0, "none")
    assert ints.dtype == torch.float32 and ints.tolist() == [-1.0, 1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match=r"^group_size: 1 < 2 \(a group-relative advantage needs two samples\)$"):
        group_advantages(r, 1)
    with pytest.raises(ValueError, match=r"^group_advantages: 6 rewards do not split into groups of 4$"):
        group_advantages(r, 4)


def _surrogate_loop(logp, old, adv, lo, hi):
    loss, clip = np.zeros_like(logp), np.zeros_like(logp)
    for b in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            rho = math.exp(logp[b, t] - old[b, t])
            u = rho * adv[b]
            c = min(max(rho, 1 - lo), 1 + hi) * adv[b]
            loss[b, t] = -min(u, c)
            clip[b, t] = float(c < u)
    return loss, clip


LOGP = np.log(np.array([[0.5, 0.2, 0.9, 0.3], [0.6, 0.1, 0.3, 0.8], [0.4, 0.45, 0.05, 0.7]]))
OLD = np.log(np.array([[0.4, 0.3, 0.5, 0.3], [0.9, 0.05, 0.31, 0.5], [0.4, 0.6, 0.04, 0.3]]))


def test_clipped_surrogate_batch_against_loops():
    adv = np.array([1.3, -0.7, 0.4])
    for lo, hi in [(0.2, None), (0.1, 0.45), (0.35, 0.05)]:
        args = (torch.tensor(LOGP), torch.tensor(OLD), torch.tensor(adv), lo) + ((hi,) if hi is not None else ())
        loss, clip = clipped_surrogate(*args)
        el, ec = _surrogate_loop(LOGP, OLD, adv, lo, lo if hi is None else hi)
        assert np.allclose(loss.numpy(), el, atol=1e-9) and np.array_equal(clip.numpy(), ec)
        assert ec.sum() > 0 and ec.sum() < ec.size                   # both branches occur
        assert clip.is_floating_point()


def test_kl_k3_values():
    # q = ref − logp: q = ln 2 → 2 − ln 2 − 1; q = −1 → e^−1 + 1 − 1; q = 0 → 0
    got = kl_k3(torch.tensor([0.0, 1.0, -0.3]), torch.tensor([math.log(2), 0.0, -0.3]))
    assert got.tolist() == pytest.approx([1 - math.log(2), math.exp(-1), 0.0], abs=1e-7)


def _loss_loop(logp, old, adv, mask, cfg, ref=None):
    per, clip = _surrogate_loop(logp, old, adv, cfg.clip_eps, cfg.clip_eps_high or cfg.clip_eps)
    kl = np.zeros_like(per)
    if cfg.kl_coef > 0:
        for b in range(per.shape[0]):
            for t in range(per.shape[1]):
                q = ref[b, t] - logp[b, t]
                kl[b, t] = math.exp(q) - q - 1
                per[b, t] += cfg.kl_coef * kl[b, t]
    B, L = per.shape
    total = sum(per[b, t] * mask[b, t] for b in range(B) for t in range(L))
    if cfg.loss_norm == "active_samples":
        loss = total / (L * max(1, sum(a != 0 for a in adv)))
    elif cfg.loss_norm == "tokens":
        loss = total / max(1.0, mask.sum())
    else:
        loss = np.mean([sum(per[b] * mask[b]) / max(1.0, mask[b].sum()) for b in range(B)])
    n = max(1.0, mask.sum())
    ratio = np.exp(logp - old)
    return loss, {"clip_frac": (clip * mask).sum() / n, "kl": (kl * mask).sum() / n,
                  "ratio_mean": (ratio * mask).sum() / n}


MASK = np.array([[1, 1, 0, 1], [1, 0, 0, 0], [1, 1, 1, 1]], dtype=np.float64)
REF = np.log(np.array([[0.3, 0.3, 0.3, 0.6], [0.2, 0.2, 0.7, 0.1], [0.5, 0.5, 0.2, 0.2]]))


@pytest.mark.parametrize("norm", ["active_samples", "tokens", "samples"])
@pytest.mark.parametrize("kl", [0.0, 0.35])
@pytest.mark.parametrize("adv", [[1.3, 0.0, -0.4], [0.0, 0.0, 0.0], [0.0, 0.9, 0.0]])
def test_grpo_loss_against_loops(norm, kl, adv):
    cfg = GRPOConfig(group_size=3, clip_eps=0.15, clip_eps_high=0.3, kl_coef=kl, loss_norm=norm)
    adv = np.array(adv)
    mask = MASK.copy()
    loss, st = grpo_loss(torch.tensor(LOGP), torch.tensor(OLD), torch.tensor(adv), torch.tensor(mask).int(), cfg,
                         torch.tensor(REF))
    el, est = _loss_loop(LOGP, OLD, adv, mask, cfg, REF)
    assert float(loss) == pytest.approx(el, abs=1e-9)
    assert st.keys() == est.keys() and all(st[k] == pytest.approx(est[k], abs=1e-9) for k in st)
    assert isinstance(st["clip_frac"], float)


def test_grpo_loss_empty_masks_and_kl_needs_ref():
    cfg = GRPOConfig(group_size=3, loss_norm="tokens")
    z = torch.zeros(3, 4)
    loss, st = grpo_loss(torch.tensor(LOGP), torch.tensor(OLD), torch.tensor([1.0, 2.0, 3.0]), z, cfg)
    assert float(loss) == 0.0 and st == {"clip_frac": 0.0, "kl": 0.0, "ratio_mean": 0.0}
    # a single masked token: each normaliser clamps at 1, not above (ratio e^0.1, A = −0.5, not clipped)
    one = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    lp, old = torch.full((1, 4), 0.1), torch.zeros(1, 4)
    for norm, scale in [("tokens", 1.0), ("samples", 1.0), ("active_samples", 4.0)]:
        loss, st = grpo_loss(lp, old, torch.tensor([-0.5]), one, GRPOConfig(loss_norm=norm))
        assert float(loss) == pytest.approx(0.5 * math.exp(0.1) / scale, rel=1e-6)
        assert st == {"clip_frac": 0.0, "kl": 0.0, "ratio_mean": pytest.approx(math.exp(0.1), rel=1e-6)}
    # samples: a row with no tokens contributes 0 to the mean over rows
    cfg = GRPOConfig(group_size=3, loss_norm="samples", clip_eps=5.0)
    m = torch.tensor([[1.0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]])
    loss, _ = grpo_loss(torch.zeros(3, 4), torch.zeros(3, 4), torch.tensor([0.6, 1.0, 1.0]), m, cfg)
    assert float(loss) == pytest.approx(-0.6 / 3)
    with pytest.raises(ValueError, match=r"^kl_coef > 0 needs ref_logp$"):
        grpo_loss(torch.zeros(3, 4), torch.zeros(3, 4), torch.ones(3), torch.ones(3, 4), GRPOConfig(kl_coef=0.1))
    # kl_coef = 0: a given reference is ignored
    loss0, st0 = grpo_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1), torch.ones(1, 2),
                           GRPOConfig(loss_norm="tokens"), torch.ones(1, 2))
    assert float(loss0) == -1.0 and st0["kl"] == 0.0


# ----------------------------------------------------------------------------------------------
# replay buffer, concat, loader
# ----------------------------------------------------------------------------------------------
def test_replay_buffer_fifo_detach_and_seeded_sampling():
    buf = ReplayBuffer(3, seed=4)
    w = torch.tensor([1.0], requires_grad=True)
    b1 = {"adv": torch.tensor([0.0, 0.0, 1.0, -1.0, 0.0, 0.5]), "id": torch.arange(6) * w}
    buf.add(b1, 2)
    assert len(buf) == 2 and [g["id"].tolist() for g in buf.groups] == [[2.0, 3.0], [4.0, 5.0]]
    assert all(not g["id"].requires_grad for g in buf.groups)
    buf.add({"adv": torch.tensor([2.0, 2.0, 0.0, 0.0]), "id": torch.tensor([6.0, 7.0, 8.0, 9.0])}, 2)
    assert [g["id"].tolist() for g in buf.groups] == [[2.0, 3.0], [4.0, 5.0], [6.0, 7.0]]   # zero group skipped
    buf.add({"adv": torch.tensor([0.0, -1.0]), "id": torch.tensor([10.0, 11.0])}, 2)
    assert [g["id"].tolist() for g in buf.groups] == [[4.0, 5.0], [6.0, 7.0], [10.0, 11.0]]   # oldest dropped
    assert len(buf.sample(5)) == 3 and len(buf.sample(2)) == 2 and buf.sample(0) == []
    s = buf.sample(2)
    assert s[0] is not s[1] and all(any(g is h for h in buf.groups) for g in s)

    def draws(seed):
        b = ReplayBuffer(10, seed=seed)
        b.add({"adv": torch.arange(1.0, 21.0), "id": torch.arange(20.0)}, 2)
        return [tuple(g["id"][0].item() for g in b.sample(3)) for _ in range(5)]
    assert draws(7) == draws(7) and draws(7) != draws(8)
    assert ReplayBuffer(5).rng.random() == ReplayBuffer(5, seed=0).rng.random()


def test_concat_rollouts():
    a = {"x": torch.tensor([[1, 2]]), "m": torch.tensor([1.0])}
    b = {"x": torch.tensor([[3, 4], [5, 6]]), "m": torch.tensor([2.0, 3.0])}
    assert concat_rollouts([b])["x"].tolist() == [[3, 4], [5, 6]]                  # a single part
    out = concat_rollouts([a, b])
    assert out.keys() == {"x", "m"} and out["x"].tolist() == [[1, 2], [3, 4], [5, 6]] and out["m"].tolist() == [1, 2, 3]


def test_prompt_loader():
    prompts = torch.arange(5) * 10
    loader = PromptLoader(prompts, batch=4, steps=300, seed=3)
    batches = list(loader)
    assert len(loader) == 300 and len(batches) == 300 and all(b.shape == (4,) for b in batches)
    seen = set(torch.cat(batches).tolist())
    assert seen == {0, 10, 20, 30, 40}                                  # every row, nothing else
    assert [b.tolist() for b in PromptLoader(prompts, 4, 300, seed=3)] == [b.tolist() for b in batches]
    assert [b.tolist() for b in PromptLoader(prompts, 4, 300, seed=4)] != [b.tolist() for b in batches]
    assert [b.tolist() for b in PromptLoader(prompts, 4, 5)] == [b.tolist() for b in PromptLoader(prompts, 4, 5, 0)]


# ----------------------------------------------------------------------------------------------
# the Lightning module
# ----------------------------------------------------------------------------------------------
L_, V_ = 3, 4


class Toy(torch.nn.Module):
    """Independent per-position categorical policy; records every call. Two extra scalar parameters sit at 0
    behind sqrt (forward value 0): one gets a NaN gradient, the other ±inf on one token."""

    def __init__(self, seed=0, scale=1.0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w = torch.nn.Parameter(scale * torch.randn(L_, V_, generator=g, dtype=torch.float64))
        self.z_nan = torch.nn.Parameter(torch.zeros((), dtype=torch.float64))
        self.z_pos = torch.nn.Parameter(torch.zeros((), dtype=torch.float64))
        self.z_neg = torch.nn.Parameter(torch.zeros((), dtype=torch.float64))
        self.frozen = torch.nn.Parameter(torch.ones(2, dtype=torch.float64), requires_grad=False)
        self.rolls, self.scored = [], []
        self.inf_rows = None

    def rollout(self, prompts, group_size, generator):
        p = prompts.repeat_interleave(group_size)
        probs = torch.softmax(self.w.detach(), -1).expand(p.shape[0], L_, V_).reshape(-1, V_)
        y = torch.multinomial(probs, 1, generator=generator).view(p.shape[0], L_)
        mask = torch.ones(p.shape[0], L_, dtype=torch.float64)
        mask[1::2, -1] = 0.0
        roll = {"prompt": p, "tokens": y, "mask": mask}
        self.rolls.append({"roll": {k: v.clone() for k, v in roll.items()}, "training": self.training,
                           "grad": torch.is_grad_enabled(), "w": self.w.detach().clone()})
        return roll

    def token_logprobs(self, roll):
        lp = torch.log_softmax(self.w, -1)[torch.arange(L_), roll["tokens"]]
        lp = lp + 0.0 * torch.sqrt(self.z_nan)                           # d/dz = 0·∞ = NaN
        if self.inf_rows is not None:
            lo, hi = self.inf_rows
            sel_lo = torch.zeros_like(lp, dtype=torch.bool)
            sel_lo[lo, 0] = True
            sel_hi = torch.zeros_like(lp, dtype=torch.bool)
            sel_hi[hi, 0] = True
            lp = lp + torch.where(sel_lo, torch.sqrt(self.z_pos), 0.0) + torch.where(sel_hi, torch.sqrt(self.z_neg), 0.0)
        self.scored.append({"n": roll["tokens"].shape[0], "training": self.training, "grad": torch.is_grad_enabled(),
                            "keys": set(roll)})
        return lp


def rank_reward(prompts, roll):
    """r_b = (b mod G) + 0.5·[y_b0 = 0] + prompt: distinct within a group; row 0 lowest, row G−1 highest."""
    G = 3
    b = torch.arange(roll["tokens"].shape[0])
    return (b % G).double() + 0.5 * (roll["tokens"][:, 0] == 0).double() + roll["prompt"].double()


class SGDModule(GRPOModule):
    """GRPOModule with plain SGD, so that one update is exactly −lr · (scrubbed, clipped) gradient."""

    def configure_optimizers(self):
        return torch.optim.SGD([p for p in self.policy.parameters() if p.requires_grad], lr=self.lr)


def _fit(module, steps, batches=None, prompts=torch.tensor([0, 2])):
    trainer = make_trainer(TrainerConfig(enable_progress_bar=False), None, max_steps=steps)
    trainer.fit(module, PromptLoader(prompts, batch=2, steps=batches or steps + 3, seed=1))
    return trainer


def _adv(rewards, G, eps):
    return torch.tensor(_adv_numpy(rewards.tolist(), G, eps, 1))


def _hand_grad(w0, tokens, mask, adv, old_w=None, clip=(0.2, 0.2), kl=0.0, ref_w=None, L=L_):
    """d/dw of the GRPO loss (active_samples) written out independently with autograd on a fresh leaf."""
    w = w0.clone().requires_grad_(True)
    lp = torch.log_softmax(w, -1)[torch.arange(L), tokens]
    old = lp.detach() if old_w is None else torch.log_softmax(old_w, -1)[torch.arange(L), tokens]
    rho = torch.exp(lp - old)
    a = adv[:, None]
    per = -torch.minimum(rho * a, torch.clamp(rho, 1 - clip[0], 1 + clip[1]) * a)
    if kl:
        q = torch.log_softmax(ref_w, -1)[torch.arange(L), tokens] - lp
        per = per + kl * (torch.exp(q) - q - 1)
    loss = (per * mask).sum() / (L * max(1, int((adv != 0).sum())))
    loss.backward()
    return w.grad, float(loss)


def test_training_step_reinforce_update_scrub_and_clip_by_hand():
    torch.manual_seed(0)
    pol = Toy(seed=1)
    pol.inf_rows = ([0, 3], [2, 5])                       # row 0 of each group has A < 0, row 2 has A > 0
    cfg = GRPOConfig(group_size=3, adv_eps=0.25, grad_clip=0.05)
    evals = []

    def eval_fn(module, step):
        evals.append((step, module.policy.training, torch.is_grad_enabled()))
        return {"ev": 10.0 + step}

    m = SGDModule(pol, rank_reward, cfg, lr=0.7, seed=11, eval_fn=eval_fn, eval_every=2)
    assert m.automatic_optimization is False and m.ref_policy is None and m.buffer is None and m.rl_step == 0
    trainer = _fit(m, 3)
    assert m.rl_step == 3 and [h["step"] for h in m.history] == [0, 1, 2, 3]
    assert m.history[0] == {"step": 0, "ev": 10.0}
    assert "ev" not in m.history[1] and m.history[2]["ev"] == 12.0 and "ev" not in m.history[3]
    assert evals == [(0, False, False), (2, False, False)]
    # rollouts: policy in eval mode, no grad, sampled with the module's seeded generator
    g = torch.Generator().manual_seed(11)
    for i, rec in enumerate(pol.rolls):
        assert rec["training"] is False and rec["grad"] is False
        probs = torch.softmax(rec["w"], -1).expand(6, L_, V_).reshape(-1, V_)
        assert torch.equal(torch.multinomial(probs, 1, generator=g).view(6, L_), rec["roll"]["tokens"])
    # scoring: one pass per step (on-policy: no separate old-logp pass), in train mode with grad
    assert [s["n"] for s in pol.scored] == [6, 6, 6] and all(s["training"] and s["grad"] for s in pol.scored)
    assert all("old_logp" not in s["keys"] and "ref_logp" not in s["keys"] for s in pol.scored)
    for i, rec in enumerate(pol.rolls):
        roll, w0 = rec["roll"], rec["w"]
        rewards = rank_reward(None, roll)
        adv = _adv(rewards, 3, 0.25)
        assert (adv[[0, 3]] < 0).all() and (adv[[2, 5]] > 0).all()
        grad, loss = _hand_grad(w0, roll["tokens"], roll["mask"], adv)
        norm = float(grad.norm())                                        # scrubbed NaN/inf grads count as 0
        coef = min(1.0, 0.05 / (norm + 1e-6))
        assert coef < 1.0                                                # the clip is active
        w1 = pol.rolls[i + 1]["w"] if i + 1 < len(pol.rolls) else pol.w.detach()
        assert torch.allclose(w1, w0 - 0.7 * coef * grad, atol=1e-10), i
        h = m.history[i + 1]
        assert h["reward_mean"] == pytest.approx(float(rewards.mean()))
        assert h["loss"] == pytest.approx(loss, rel=1e-4)
        assert h["active_frac"] == pytest.approx(float((adv != 0).double().mean())) and h["active_frac"] >= 4 / 6
        assert h["clip_frac"] == 0.0 and h["kl"] == 0.0 and h["ratio_mean"] == 1.0
    for z in (pol.z_nan, pol.z_pos, pol.z_neg):
        assert float(z) == 0.0                                           # their NaN/±inf grads were zeroed
    assert torch.equal(pol.frozen, torch.ones(2, dtype=torch.float64))
    logged = trainer.callback_metrics
    assert "grpo/reward_mean" in logged and "grpo/step" not in logged
    assert float(logged["grpo/loss"]) == pytest.approx(m.history[-1]["loss"], abs=1e-6)


def test_training_step_without_grad_clip_and_zero_signal_groups():
    pol = Toy(seed=2)
    cfg = GRPOConfig(group_size=3, adv_eps=0.5, grad_clip=None)

    def reward(prompts, roll):                                  # prompt 0: all equal (no signal); prompt 2: ranked
        r = rank_reward(prompts, roll)
        return torch.where(roll["prompt"] == 0, torch.full_like(r, 3.0), r)

    m = SGDModule(pol, reward, cfg, lr=0.3, seed=5)
    _fit(m, 2, prompts=torch.tensor([0, 2]))
    assert len(m.history) == 2 and m.history[0]["step"] == 1
    for i, rec in enumerate(pol.rolls):
        roll, w0 = rec["roll"], rec["w"]
        adv = _adv(reward(None, roll), 3, 0.5)
        grad, loss = _hand_grad(w0, roll["tokens"], roll["mask"], adv)
        w1 = pol.rolls[i + 1]["w"] if i + 1 < len(pol.rolls) else pol.w.detach()
        assert torch.allclose(w1, w0 - 0.3 * grad, atol=1e-10)           # no clip: the raw gradient
        frac = float((adv != 0).double().mean())
        assert m.history[i]["active_frac"] == pytest.approx(frac) and frac < 1
        assert m.history[i]["loss"] == pytest.approx(loss, rel=1e-4)


def test_ppo_epochs_reuse_frozen_old_logp_and_count_one_trainer_step():
    pol = Toy(seed=3, scale=0.3)
    cfg = GRPOConfig(group_size=3, ppo_epochs=3, clip_eps=0.02, clip_eps_high=0.04, adv_eps=0.1, grad_clip=None)
    m = SGDModule(pol, rank_reward, cfg, lr=2.0, seed=2)
    _fit(m, 2)
    assert m.rl_step == 2 and len(m.history) == 2                       # 3 updates per trainer step
    # per step: one scoring pass for logp_old (eval mode, no grad) then 3 updates (train mode, grad)
    assert [(s["training"], s["grad"]) for s in pol.scored] == [(False, False)] + [(True, True)] * 3 + \
        [(False, False)] + [(True, True)] * 3
    assert all("old_logp" in s["keys"] for s in pol.scored[1:4])
    for i, rec in enumerate(pol.rolls):
        roll, w = rec["roll"], rec["w"]
        adv = _adv(rank_reward(None, roll), 3, 0.1)
        w_old = w.clone()
        for _ in range(3):
            grad, loss = _hand_grad(w, roll["tokens"], roll["mask"], adv, old_w=w_old, clip=(0.02, 0.04))
            w = w - 2.0 * grad
        w1 = pol.rolls[i + 1]["w"] if i + 1 < len(pol.rolls) else pol.w.detach()
        assert torch.allclose(w1, w, atol=1e-9)
        assert m.history[i]["loss"] == pytest.approx(loss, rel=1e-4)   # the last epoch's loss
        assert 0 < m.history[i]["clip_frac"] < 1 and m.history[i]["ratio_mean"] != 1.0


def test_kl_term_to_an_explicit_reference():
    pol, ref = Toy(seed=4), Toy(seed=5)
    ref_w = ref.w.detach().clone()
    cfg = GRPOConfig(group_size=3, kl_coef=0.6, adv_eps=0.2, grad_clip=None, std="biased")
    seen = []

    def reward(prompts, roll):                                  # gets the loader's prompt batch (P rows)
        seen.append(prompts.tolist())
        return rank_reward(prompts, roll)

    m = SGDModule(pol, reward, cfg, lr=0.5, seed=3, ref_policy=ref)
    assert m.ref_policy is ref and not any(p.requires_grad for p in ref.parameters())
    _fit(m, 2)
    assert [s["grad"] for s in ref.scored] == [False, False]                 # scored under no_grad
    assert len(seen) == 2 and all(len(b) == 2 and set(b) <= {0, 2} for b in seen)
    assert [r["roll"]["prompt"][::3].tolist() for r in pol.rolls] == seen
    assert all("ref_logp" in s["keys"] for s in pol.scored)
    for i, rec in enumerate(pol.rolls):
        roll, w0 = rec["roll"], rec["w"]
        adv = torch.tensor(_adv_numpy(rank_reward(None, roll).tolist(), 3, 0.2, 0))   # biased std
        grad, loss = _hand_grad(w0, roll["tokens"], roll["mask"], adv, kl=0.6, ref_w=ref_w)
        w1 = pol.rolls[i + 1]["w"] if i + 1 < len(pol.rolls) else pol.w.detach()
        assert torch.allclose(w1, w0 - 0.5 * grad, atol=1e-10)
        lp = torch.log_softmax(w0, -1)[torch.arange(L_), roll["tokens"]]
        q = torch.log_softmax(ref_w, -1)[torch.arange(L_), roll["tokens"]] - lp
        k3 = float(((torch.exp(q) - q - 1) * roll["mask"]).sum() / roll["mask"].sum())
        assert m.history[i]["kl"] == pytest.approx(k3, abs=1e-9) and k3 > 0.01
    assert torch.equal(ref.w, ref_w)                                     # the reference never moves


def test_module_init_reference_buffer_optimizer_generator_and_evaluate():
    pol = Toy(seed=6)
    m = GRPOModule(pol, rank_reward, GRPOConfig(group_size=3, kl_coef=0.2), lr=0.01)
    assert m.ref_policy is not None and m.ref_policy is not pol
    assert torch.equal(m.ref_policy.w, pol.w) and not any(p.requires_grad for p in m.ref_policy.parameters())
    assert pol.w.requires_grad                                          # only the copy is frozen
    given = Toy()
    m0 = GRPOModule(pol, rank_reward, GRPOConfig(group_size=3), lr=0.01, ref_policy=given)
    assert given.w.requires_grad                                        # kl_coef = 0: the reference is untouched
    assert m0.ref_policy is None and m0.buffer is None and m0.history == [] and m0._evaluate(3) == {}
    mb = GRPOModule(pol, rank_reward, GRPOConfig(group_size=3, replay_size=7, replay_groups=2), lr=0.01, seed=9)
    assert isinstance(mb.buffer, ReplayBuffer) and mb.buffer.groups.maxlen == 7
    assert mb.buffer.rng.random() == ReplayBuffer(1, seed=9).rng.random()
    opt = GRPOModule(pol, rank_reward, GRPOConfig(group_size=3), lr=0.03, weight_decay=0.25).configure_optimizers()
    assert isinstance(opt, torch.optim.AdamW)
    assert opt.defaults["lr"] == 0.03 and opt.defaults["weight_decay"] == 0.25
    ids = {id(p) for grp in opt.param_groups for p in grp["params"]}
    assert ids == {id(pol.w), id(pol.z_nan), id(pol.z_pos), id(pol.z_neg)}          # not the frozen one
    assert GRPOModule(pol, rank_reward, GRPOConfig(group_size=3), lr=0.1).configure_optimizers().defaults[
        "weight_decay"] == 0.0
    mg = GRPOModule(pol, rank_reward, GRPOConfig(group_size=3), lr=0.1, seed=21)
    g = mg.generator()
    assert mg.generator() is g
    assert torch.equal(torch.rand(4, generator=g), torch.rand(4, generator=torch.Generator().manual_seed(21)))
    assert torch.equal(torch.rand(2, generator=GRPOModule(pol, rank_reward, GRPOConfig(group_size=3), lr=0.1)
                                  .generator()), torch.rand(2, generator=torch.Generator().manual_seed(0)))
    seen = []
    me = GRPOModule(pol, rank_reward, GRPOConfig(group_size=3), lr=0.1,
                    eval_fn=lambda mod, s: seen.append((s, mod.policy.training, torch.is_grad_enabled())) or {"a": 1.0})
    for mode in (True, False):
        pol.train(mode)
        assert me._evaluate(4) == {"a": 1.0} and pol.training is mode
    assert seen == [(4, False, False), (4, False, False)]
    me.on_train_start()
    assert me.history == []                                             # eval_every = 0: no step-0 row
    no_fn = GRPOModule(pol, rank_reward, GRPOConfig(group_size=3), lr=0.1, eval_every=3)
    no_fn.on_train_start()
    assert no_fn.history == []                                          # no eval_fn: no step-0 row
    me.eval_every = 5
    me.on_train_start()
    assert me.history == [{"step": 0, "a": 1.0}]


def test_replay_mixes_buffered_groups_into_the_update():
    pol = Toy(seed=7)
    cfg = GRPOConfig(group_size=3, replay_size=4, replay_groups=1, adv_eps=0.3, grad_clip=None)
    m = SGDModule(pol, rank_reward, cfg, lr=0.4, seed=6)
    _fit(m, 3)
    # step 1: empty buffer (the current groups are added after sampling): 6 rows; then 6 + 3 replayed rows
    assert [s["n"] for s in pol.scored] == [6, 6, 6, 9, 6, 9]
    assert len(m.buffer) == 4                                            # 3 steps × 2 groups, capacity 4
    # step 2's update, rebuilt by hand: the replayed group keeps its step-1 advantage and old log-probs
    r1, r2 = pol.rolls[0], pol.rolls[1]
    adv1, adv2 = _adv(rank_reward(None, r1["roll"]), 3, 0.3), _adv(rank_reward(None, r2["roll"]), 3, 0.3)
    cands = []
    for g in range(2):
        sl = slice(3 * g, 3 * g + 3)
        w = r2["w"].clone().requires_grad_(True)
        lp_new = torch.log_softmax(w, -1)[torch.arange(L_), r2["roll"]["tokens"]]
        lp_rep = torch.log_softmax(w, -1)[torch.arange(L_), r1["roll"]["tokens"][sl]]
        old_rep = torch.log_softmax(r1["w"], -1)[torch.arange(L_), r1["roll"]["tokens"][sl]]
        old_new = torch.log_softmax(r2["w"], -1)[torch.arange(L_), r2["roll"]["tokens"]]
        lp, old = torch.cat([lp_new, lp_rep]), torch.cat([old_new, old_rep])
        adv = torch.cat([adv2, adv1[sl]])
        mask = torch.cat([r2["roll"]["mask"], r1["roll"]["mask"][sl]])
        rho = torch.exp(lp - old)
        per = -torch.minimum(rho * adv[:, None], torch.clamp(rho, 0.8, 1.2) * adv[:, None])
        ((per * mask).sum() / (L_ * (adv != 0).sum())).backward()
        cands.append(r2["w"] - 0.4 * w.grad)
    assert any(torch.allclose(pol.rolls[2]["w"], c, atol=1e-10) for c in cands)
    assert not torch.allclose(cands[0], cands[1])
