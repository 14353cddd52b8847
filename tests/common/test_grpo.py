"""The shared GRPO trainer (stages/common/grpo.py): advantages by hand, clip boundaries with
non-unit ε, the KL term against a hand computation, the JustGRPO loss scale, and a tiny sequence
bandit on which GRPO (through the Lightning trainer factory) must raise the reward."""
from __future__ import annotations

import math

import pytest
import torch

from kernels.token_logprob import token_logprob
from stages.common.grpo import (GRPOConfig, GRPOModule, PromptLoader, ReplayBuffer, clipped_surrogate,
                                group_advantages, grpo_loss, kl_k3)
from stages.common.trainer import TrainerConfig, make_trainer


def test_group_advantages_by_hand():
    r = torch.tensor([1.0, -1.0, -1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 3.0, 0.0, 0.0, 1.0])
    a = group_advantages(r, 4, eps=1e-4)
    s1 = math.sqrt(4 / 3)                       # unbiased std of (1,-1,-1,1)
    assert torch.allclose(a[:4], torch.tensor([1, -1, -1, 1]) / (s1 + 1e-4))
    assert torch.all(a[4:8] == 0)               # identical rewards: no signal
    g3 = [3.0, 0.0, 0.0, 1.0]
    m = sum(g3) / 4
    s3 = math.sqrt(sum((x - m) ** 2 for x in g3) / 3)
    assert torch.allclose(a[8:], torch.tensor([(x - m) / (s3 + 1e-4) for x in g3]), atol=1e-6)
    b = group_advantages(r, 4, eps=0.5, std="biased")
    assert torch.allclose(b[:4], torch.tensor([1, -1, -1, 1]) / (1.0 + 0.5))
    with pytest.raises(ValueError, match="group_size"):
        group_advantages(r, 1)
    with pytest.raises(ValueError, match="groups of 5"):
        group_advantages(r, 5)


@pytest.mark.parametrize("adv", [2.0, -1.5])
def test_clip_boundaries_non_unit_eps(adv):
    eps_lo, eps_hi = 0.3, 0.5
    ratios = torch.tensor([0.6, 0.69, 0.71, 1.0, 1.49, 1.51, 2.0])
    old = torch.zeros(1, 7)
    logp = torch.log(ratios)[None].clone().requires_grad_(True)
    loss, clipped = clipped_surrogate(logp, old, torch.tensor([adv]), eps_lo, eps_hi)
    loss.sum().backward()
    for i, rho in enumerate(ratios.tolist()):
        expect = -min(rho * adv, min(max(rho, 1 - eps_lo), 1 + eps_hi) * adv)
        assert abs(float(loss[0, i].detach()) - expect) < 1e-6
        # gradient flows only where the unclipped term is the minimum
        outside = (adv > 0 and rho > 1 + eps_hi) or (adv < 0 and rho < 1 - eps_lo)
        assert bool(clipped[0, i]) == outside
        g = float(logp.grad[0, i])
        assert (g == 0.0) if outside else abs(g - (-rho * adv)) < 1e-5


def test_kl_k3_by_hand_and_unbiased():
    assert abs(float(kl_k3(torch.tensor(math.log(0.5)), torch.tensor(math.log(0.25))))
               - (0.5 + math.log(2) - 1)) < 1e-6
    # E_{y~π}[k3] = KL(π‖ref) exactly: compare with the closed form on a categorical
    pi = torch.tensor([0.5, 0.3, 0.2])
    ref = torch.tensor([0.2, 0.2, 0.6])
    expect = float((pi * (pi / ref).log()).sum())
    got = float((pi * kl_k3(pi.log(), ref.log())).sum())
    assert abs(got - expect) < 1e-6


def test_grpo_loss_scale_and_kl_term():
    cfg = GRPOConfig(group_size=2, clip_eps=0.2, kl_coef=0.0, loss_norm="active_samples")
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.5], [0.4, 0.1, 0.9], [0.3, 0.3, 0.3], [0.2, 0.2, 0.2]]))
    adv = torch.tensor([1.0, -1.0, 0.0, 0.0])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1], [1, 1, 1]]).float()
    loss, st = grpo_loss(logp, logp.detach(), adv, mask, cfg)
    # ratio ≡ 1: loss = Σ_t mask·(−A) / (L · #(A≠0)) = (−2 + 3) / (3 · 2)
    assert abs(float(loss) - 1 / 6) < 1e-6 and st["clip_frac"] == 0
    cfg_kl = GRPOConfig(group_size=2, kl_coef=0.3, loss_norm="tokens")
    ref = logp + 0.2
    loss_kl, st = grpo_loss(logp, logp.detach(), adv, mask, cfg_kl, ref_logp=ref)
    k3 = math.exp(0.2) - 0.2 - 1
    expect = ((-1) * 2 + 1 * 3 + 0.3 * k3 * 11) / 11
    assert abs(float(loss_kl) - expect) < 1e-6 and abs(st["kl"] - k3) < 1e-6


def test_config_errors():
    with pytest.raises(Exception, match="group_size"):
        GRPOConfig(group_size=1)
    with pytest.raises(Exception, match="replay_groups"):
        GRPOConfig(replay_groups=2)


class SeqBandit(torch.nn.Module):
    """A length-L sequence policy with independent per-position logits, conditioned on the prompt
    (one of P prompts): reward = fraction of positions equal to the prompt's target sequence."""

    def __init__(self, n_prompts=3, length=4, vocab=5):
        super().__init__()
        self.logits = torch.nn.Parameter(torch.zeros(n_prompts, length, vocab))
        self.targets = torch.arange(n_prompts * length).view(n_prompts, length) % vocab

    def rollout(self, prompts, group_size, generator):
        p = prompts.repeat_interleave(group_size)                       # prompt-major rows
        probs = torch.softmax(self.logits[p], -1)                       # (B, L, V)
        y = torch.multinomial(probs.view(-1, probs.shape[-1]), 1, generator=generator).view(p.shape[0], -1)
        return {"prompt": p, "tokens": y, "mask": torch.ones(y.shape)}

    def token_logprobs(self, roll):
        return token_logprob(self.logits[roll["prompt"]], roll["tokens"], backend="torch")


def reward(prompts, roll):
    targets = SeqBandit().targets[roll["prompt"]]                       # (B, L)
    return 2.0 * (roll["tokens"] == targets).float().mean(1) - 1.0      # in [-1, 1]


@pytest.mark.parametrize("extra", [{}, {"ppo_epochs": 3, "clip_eps": 0.1, "kl_coef": 0.05},
                                   {"replay_size": 8, "replay_groups": 2}])
def test_grpo_raises_reward_on_sequence_bandit(extra):
    torch.manual_seed(0)
    policy = SeqBandit()
    cfg = GRPOConfig(group_size=6, **extra)
    evals = []

    def eval_fn(module, step):
        p = torch.arange(3)
        probs = torch.softmax(module.policy.logits, -1)
        exp_r = probs.gather(-1, module.policy.targets[..., None]).squeeze(-1).mean()
        evals.append(float(exp_r))
        return {"expected_match": float(exp_r), "n": int(p.numel())}

    module = GRPOModule(policy, reward, cfg, lr=0.1, seed=1, eval_fn=eval_fn, eval_every=10)
    trainer = make_trainer(TrainerConfig(enable_progress_bar=False), None, max_steps=40)
    trainer.fit(module, PromptLoader(torch.arange(3), batch=3, steps=40, seed=2))
    assert len(module.history) == 41 and module.history[0]["step"] == 0
    assert evals[0] == pytest.approx(0.2)                                # uniform start: 1/V
    assert evals[-1] > 0.6, evals                                        # GRPO learned the targets
    rewards = [h["reward_mean"] for h in module.history[1:]]
    assert sum(rewards[-10:]) / 10 > sum(rewards[:10]) / 10 + 0.3
    if extra.get("ppo_epochs", 1) > 1:
        assert any(h["clip_frac"] > 0 for h in module.history[1:])      # the clip is live


def test_replay_buffer_keeps_only_signal_groups():
    buf = ReplayBuffer(3, seed=0)
    batch = {"adv": torch.tensor([0.0, 0.0, 1.0, -1.0, 0.5, -0.5]), "x": torch.arange(6)}
    buf.add(batch, 2)
    assert len(buf) == 2 and all(bool((g["adv"] != 0).any()) for g in buf.groups)
    buf.add(batch, 2)
    assert len(buf) == 3                                                 # FIFO capacity
