"""GSPO (``GRPOConfig.ratio_level = "sequence"``) in stages/common/grpo.py against a hand-written
sequence-level loop: the loss, its stats and its gradient from plain Python loops over sequences and
tokens (clip on both sides with asymmetric ε, an empty-mask row, the KL term), the config rule, and
whole ``training_step``s with ≥ 2 updates per batch whose parameter updates are rebuilt by hand (SGD).
The token-level default is checked to give the same numbers as before the option existed."""
from __future__ import annotations

import math

import pytest
import torch

from stages.common.grpo import GRPOConfig, grpo_loss, gspo_loss
from tests.common.test_grpo_brute import L_, SGDModule, Toy, _adv, _fit, rank_reward


def _loop_gspo(logp, old, adv, mask, eps_lo, eps_hi, kl=0.0, ref=None):
    """GSPO objective written sequence by sequence, token by token (torch scalars, so autograd works)."""
    B, L = logp.shape
    total = 0.0
    clipped_rows = 0
    ratios = []
    for i in range(B):
        n = sum(float(mask[i, t]) for t in range(L))
        acc = 0.0
        for t in range(L):
            if float(mask[i, t]) != 0.0:
                acc = acc + float(mask[i, t]) * (logp[i, t] - old[i, t])
        s = torch.exp(torch.as_tensor(acc) / max(n, 1.0))                  # (π/π_old)^(1/|y|)
        ratios.append(float(s.detach()))
        a = float(adv[i])
        lo, hi = 1.0 - eps_lo, 1.0 + eps_hi
        s_c = torch.clamp(s, lo, hi)
        term = torch.minimum(s * a, s_c * a)
        if float(s_c * a) < float(s * a):
            clipped_rows += 1
        row = -term
        if kl:
            k = 0.0
            for t in range(L):
                if float(mask[i, t]) != 0.0:
                    q = ref[i, t] - logp[i, t]
                    k = k + float(mask[i, t]) * (torch.exp(q) - q - 1.0)
            row = row + kl * (torch.as_tensor(k) / max(n, 1.0))
        total = total + row
    return total / B, clipped_rows / B, sum(ratios) / B


@pytest.mark.parametrize("kl", [0.0, 0.7])
def test_gspo_loss_against_sequence_loop(kl):
    g = torch.Generator().manual_seed(3)
    B, L = 7, 5
    old = -torch.rand(B, L, generator=g, dtype=torch.float64) * 2
    shift = torch.tensor([0.9, -0.9, 0.05, -0.05, 0.4, -0.6, 0.3], dtype=torch.float64)  # per-row log-ratio
    logp = (old + shift[:, None] + 0.01 * torch.randn(B, L, generator=g, dtype=torch.float64)).requires_grad_(True)
    adv = torch.tensor([1.5, 1.5, -0.8, 0.6, -1.2, -0.4, 0.0], dtype=torch.float64)
    mask = torch.ones(B, L, dtype=torch.float64)
    mask[1, 3:] = 0
    mask[4, 1:] = 0
    mask[6] = 0                                                            # empty row: s = 1, no KL
    ref = old - 0.3 * torch.rand(B, L, generator=g, dtype=torch.float64) if kl else None
    cfg = GRPOConfig(clip_eps=0.1, clip_eps_high=0.25, loss_norm="samples", ratio_level="sequence", kl_coef=kl)
    loss, stats = grpo_loss(logp, old, adv, mask, cfg, ref)
    (grad,) = torch.autograd.grad(loss, logp)
    logp2 = logp.detach().clone().requires_grad_(True)
    ref_loss, clip_frac, ratio_mean = _loop_gspo(logp2, old, adv, mask, 0.1, 0.25, kl, ref)
    (ref_grad,) = torch.autograd.grad(ref_loss, logp2)
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-12, abs=1e-14)
    assert torch.allclose(grad, ref_grad, atol=1e-12)
    assert stats["clip_frac"] == pytest.approx(clip_frac) and 0 < clip_frac < 1
    assert stats["ratio_mean"] == pytest.approx(ratio_mean, rel=1e-12)
    # rows whose ratio left the band in the direction of their advantage get no surrogate gradient
    s = torch.exp(((logp.detach() - old) * mask).sum(1) / mask.sum(1).clamp_min(1))
    dead = ((s > 1.25) & (adv > 0)) | ((s < 0.9) & (adv < 0))
    assert bool(dead.any()) and bool((grad[dead] == 0).all()) == (kl == 0)
    assert bool((grad[6] == 0).all())                                      # empty row contributes nothing
    # the sequence ratio is the length-normalised one: a row's ratio ignores masked positions
    assert float(s[4]) == pytest.approx(math.exp(float(logp[4, 0] - old[4, 0])), rel=1e-12)
    assert gspo_loss(logp, old, adv, mask, cfg, ref)[0].item() == pytest.approx(float(loss), rel=1e-15)


def test_gspo_differs_from_token_level_and_default_is_unchanged():
    g = torch.Generator().manual_seed(5)
    logp = -torch.rand(4, 6, generator=g, dtype=torch.float64)
    old = logp + 0.3 * torch.randn(4, 6, generator=g, dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5], dtype=torch.float64)
    mask = torch.ones(4, 6, dtype=torch.float64)
    tok, _ = grpo_loss(logp, old, adv, mask, GRPOConfig(loss_norm="samples"))
    seq, _ = grpo_loss(logp, old, adv, mask, GRPOConfig(loss_norm="samples", ratio_level="sequence"))
    assert float(tok) != pytest.approx(float(seq))
    # token level by hand (the path every other paper uses, untouched by the option)
    rho = torch.exp(logp - old)
    per = -torch.minimum(rho * adv[:, None], torch.clamp(rho, 0.8, 1.2) * adv[:, None])
    assert float(tok) == pytest.approx(float(per.mean(1).mean()), rel=1e-12)
    assert GRPOConfig().ratio_level == "token"


def test_gspo_config_rule():
    assert GRPOConfig(ratio_level="sequence", loss_norm="samples").ratio_level == "sequence"
    for norm in ("tokens", "active_samples"):
        with pytest.raises(Exception, match="loss_norm"):
            GRPOConfig(ratio_level="sequence", loss_norm=norm)
    with pytest.raises(Exception, match="ratio_level"):
        GRPOConfig(ratio_level="sentence", loss_norm="samples")


def _hand_gspo_grad(w0, tokens, mask, adv, old_w, clip):
    """d/dw of the GSPO loss on the Toy policy, from the sequence loop."""
    w = w0.clone().requires_grad_(True)
    lp = torch.log_softmax(w, -1)[torch.arange(L_), tokens]
    old = torch.log_softmax(old_w, -1)[torch.arange(L_), tokens]
    loss, _, _ = _loop_gspo(lp, old, adv, mask, clip[0], clip[1])
    loss.backward()
    return w.grad, float(loss)


def test_training_step_gspo_two_updates_per_batch_by_hand():
    pol = Toy(seed=7, scale=0.4)
    cfg = GRPOConfig(group_size=3, ppo_epochs=2, clip_eps=0.03, clip_eps_high=0.05, adv_eps=0.1, grad_clip=None,
                     loss_norm="samples", ratio_level="sequence")
    m = SGDModule(pol, rank_reward, cfg, lr=3.0, seed=4)
    _fit(m, 3)
    assert m.rl_step == 3 and len(m.history) == 3                        # 2 updates, one trainer step
    # per step: one frozen old-logp pass (no grad) then two updates (grad)
    assert [(s["training"], s["grad"]) for s in pol.scored] == ([(False, False)] + [(True, True)] * 2) * 3
    clipped_any = False
    for i, rec in enumerate(pol.rolls):
        roll, w = rec["roll"], rec["w"]
        adv = _adv(rank_reward(None, roll), 3, 0.1)
        w_old = w.clone()
        for _ in range(2):
            grad, loss = _hand_gspo_grad(w, roll["tokens"], roll["mask"], adv, w_old, (0.03, 0.05))
            w = w - 3.0 * grad
        w1 = pol.rolls[i + 1]["w"] if i + 1 < len(pol.rolls) else pol.w.detach()
        assert torch.allclose(w1, w, atol=1e-9), i
        assert m.history[i]["loss"] == pytest.approx(loss, rel=1e-4)      # the second update's loss
        assert m.history[i]["ratio_mean"] != 1.0                          # the second update is off-policy
        clipped_any |= m.history[i]["clip_frac"] > 0
    assert clipped_any                                                    # the sequence clip is live
