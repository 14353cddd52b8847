"""stages/justgrpo/dllm.py on a deterministic toy "dLLM" whose logits are a closed form of the context,
  logits(x)[i, v] = A[i, v] + s · sin(3 f(x)) · E[i, v],   f(x) = Σ_j [x_j ≠ MASK] (x_j + 1)(j + 1) / 60,
so that every quantity can be recomputed in plain Python loops: the decode order / committed tokens /
steps / entropies / log-probs of greedy decoding for several block and tokens-per-step settings, the
untempered log-probs of tempered (Gumbel-max) decoding and its sampling law, the exact AR likelihood and
the one-step surrogate, the masked-diffusion pretraining loss, the two RL policies, the reward, greedy
accuracy on an oracle, and the kernel-call counts. Expected values never come from dllm.py itself."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from kernels.record import KernelCounter
from stages.common.tiny_transformer import TinyTransformerConfig
from stages.justgrpo.dllm import (NEG, DLLMPolicy, MaskedDiffusionLM, ar_logprobs, decode, gen_logits,
                                  greedy_accuracy, greedy_items, onestep_logprobs, policy_drift, reward_fn)
from stages.justgrpo.task import EOS, HASH, MASK, PLUS, TIMES, VOCAB, VOCAB_SIZE

V = VOCAB_SIZE
P = 5
TMAX = 24


class Toy(torch.nn.Module):
    """logits = hidden @ unembed.T with hidden = [onehot(position), sin(3 f(x))·onehot(position)] and
    unembed = [A^T, s·E^T] (V, 2·TMAX)."""

    def __init__(self, seed=0, scale=1.0, s=2.5):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.A = (scale * torch.randn(TMAX, V, generator=g, dtype=torch.float64)).float()
        self.E = torch.randn(TMAX, V, generator=g, dtype=torch.float64).float()
        self.s = s
        self.unembed = torch.nn.Parameter(torch.cat([self.A.T, s * self.E.T], 1))
        self.inputs = []

    def hidden(self, x):
        B, T = x.shape
        j = torch.arange(T)
        f = (((x != MASK).float() * (x.float() + 1) * (j + 1).float()).sum(1) / 60.0)            # (B,)
        h = torch.zeros(B, T, 2 * TMAX)
        h[:, j, j] = 1.0
        h[:, j, TMAX + j] = torch.sin(3 * f)[:, None]
        return h

    def forward(self, x):
        self.inputs.append(x.clone())
        return self.hidden(x) @ self.unembed.T


def f_py(ctx):
    return sum((t + 1) * (j + 1) for j, t in enumerate(ctx) if t != MASK) / 60.0


def logits_py(toy, ctx, i, exclude_mask=True):
    f = math.sin(3 * f_py(ctx))
    out = [float(toy.A[i, v]) + toy.s * f * float(toy.E[i, v]) for v in range(V)]
    if exclude_mask:
        out[MASK] = -1.0e4
    return out


def logsoftmax_py(lg):
    m = max(lg)
    lse = m + math.log(sum(math.exp(z - m) for z in lg))
    return [z - lse for z in lg]


def entropy_py(lg):
    ls = logsoftmax_py(lg)
    return -sum(math.exp(z) * z for z in ls)


def decode_py(toy, prompt, L, block, k):
    """Greedy LLaDA decoding by hand: per block, per step, every masked position of the block proposes its
    argmax; the k most confident (softmax prob of the proposal) are committed together."""
    x = list(prompt) + [MASK] * L
    step_of, logp, ent = [-1] * L, [0.0] * L, [0.0] * L
    s = 0
    for b0 in range(0, L, block):
        b1 = min(b0 + block, L)
        while any(x[P + i] == MASK for i in range(b0, b1)):
            cand = []
            for i in range(b0, b1):
                if x[P + i] == MASK:
                    lg = logits_py(toy, x, P + i)
                    ls = logsoftmax_py(lg)
                    j = max(range(V), key=lambda v: lg[v])
                    cand.append((math.exp(ls[j]), i, j, ls[j], entropy_py(lg)))
            cand.sort(key=lambda c: -c[0])
            for _, i, j, lp, en in cand[:min(k, len(cand))]:
                x[P + i], step_of[i], logp[i], ent[i] = j, s, lp, en
            s += 1
    return x[P:], step_of, logp, ent, s


class Rec:
    backend = "torch"

    def __init__(self):
        self.calls = []

    def count(self, name, n):
        self.calls.append((name, n))


PROMPTS = torch.tensor([[3, PLUS, 4, TIMES, 1], [0, PLUS, 0, PLUS, 0], [4, TIMES, 4, TIMES, 4]])


def test_gen_logits_excludes_only_the_mask_token():
    toy = Toy(1)
    x = torch.tensor([[1, 2, MASK, 3, 4, MASK, 9]])
    raw = toy(x)
    out = gen_logits(toy, x)
    assert NEG == -1.0e4 and (out[..., MASK] == -1.0e4).all()
    keep = [v for v in range(V) if v != MASK]
    assert torch.equal(out[..., keep], raw[..., keep])
    sl = gen_logits(toy, x, slice(3, None))
    assert sl.shape == (1, 4, V) and torch.equal(sl[..., keep], raw[:, 3:][..., keep])


@pytest.mark.parametrize("L,block,k", [(7, 1, 1), (7, 7, 1), (7, 3, 2), (7, 7, 3), (6, 4, 4), (5, 2, 1)])
def test_greedy_decode_matches_hand_simulation(L, block, k):
    toy = Toy(2)
    rec = Rec()
    gen, info = decode(toy, PROMPTS, L, block, k, 0.0, None, KernelCounter(rec))
    n_steps = None
    for b in range(PROMPTS.shape[0]):
        g, st, lp, en, n = decode_py(toy, PROMPTS[b].tolist(), L, block, k)
        assert gen[b].tolist() == g and info["step"][b].tolist() == st, (b, g, st)
        assert info["logp"][b].tolist() == pytest.approx(lp, abs=2e-4)
        assert info["entropy"][b].tolist() == pytest.approx(en, abs=2e-4)
        n_steps = n
    assert info["n_steps"] == n_steps and rec.calls == [("token_logprob", 1)] * n_steps
    assert gen.dtype == PROMPTS.dtype and info["step"].dtype == torch.long


def test_decode_with_one_token_blocks_is_left_to_right_and_k_is_capped():
    toy = Toy(3)
    _, info = decode(toy, PROMPTS[:2], 6, 1, 5, 0.0)
    assert info["step"].tolist() == [list(range(6))] * 2 and info["n_steps"] == 6
    _, info = decode(toy, PROMPTS[:2], 6, 6, 6, 0.0)                  # all at once: one step
    assert info["step"].tolist() == [[0] * 6] * 2 and info["n_steps"] == 1


def test_tempered_decode_samples_softmax_over_T_and_scores_untempered():
    toy = Toy(4, scale=0.5)
    B = 20000
    p = PROMPTS[:1].expand(B, P).clone()
    g = torch.Generator().manual_seed(0)
    gen, info = decode(toy, p, 1, 1, 1, 0.5, g)
    freq = np.bincount(gen[:, 0].numpy(), minlength=V) / B
    lg = logits_py(toy, p[0].tolist() + [MASK], P)
    want = np.exp(logsoftmax_py([z / 0.5 for z in lg]))                 # softmax(l / T), MASK excluded
    assert freq[MASK] == 0 and np.abs(freq - want).max() < 0.015, (freq, want)
    untempered = logsoftmax_py(lg)
    assert info["logp"][:50, 0].tolist() == pytest.approx([untempered[t] for t in gen[:50, 0].tolist()], abs=1e-4)
    assert info["entropy"][0, 0].item() == pytest.approx(entropy_py(lg), abs=1e-4)


def test_tempered_decode_logp_entropy_in_their_decoding_context():
    toy = Toy(5, scale=1.0)
    p = PROMPTS
    g = torch.Generator().manual_seed(3)
    gen, info = decode(toy, p, 6, 6, 2, 0.7, g)
    assert info["n_steps"] == 3
    for b in range(p.shape[0]):
        st = info["step"][b].tolist()
        assert sorted(st) == [0, 0, 1, 1, 2, 2]
        for i in range(6):
            ctx = p[b].tolist() + [gen[b, j].item() if st[j] < st[i] else MASK for j in range(6)]
            lg = logits_py(toy, ctx, P + i)
            assert info["logp"][b, i].item() == pytest.approx(logsoftmax_py(lg)[gen[b, i].item()], abs=1e-4)
            assert info["entropy"][b, i].item() == pytest.approx(entropy_py(lg), abs=1e-4)
    again, _ = decode(toy, p, 6, 6, 2, 0.7, torch.Generator().manual_seed(3))
    other, _ = decode(toy, p, 6, 6, 2, 0.7, torch.Generator().manual_seed(4))
    assert torch.equal(again, gen) and not torch.equal(other, gen)


def test_ar_and_onestep_logprobs_by_hand():
    toy = Toy(6)
    gen = torch.tensor([[1, 4, 0, EOS, 2, 9], [HASH, 3, 3, 1, EOS, EOS], [0, 0, 7, 2, 1, 4]])
    rec = Rec()
    ar = ar_logprobs(toy, PROMPTS, gen, KernelCounter(rec))
    one = onestep_logprobs(toy, PROMPTS, gen, KernelCounter(rec))
    assert rec.calls == [("token_logprob", 1)] * 2
    for b in range(3):
        pr = PROMPTS[b].tolist()
        for t in range(6):
            ctx = pr + gen[b, :t].tolist() + [MASK] * (6 - t)            # [prompt, y_<t, MASK·(L−t)]
            assert ar[b, t].item() == pytest.approx(logsoftmax_py(logits_py(toy, ctx, P + t))[gen[b, t]], abs=1e-4)
            ctx1 = pr + [MASK] * 6
            assert one[b, t].item() == pytest.approx(logsoftmax_py(logits_py(toy, ctx1, P + t))[gen[b, t]], abs=1e-4)
    assert ar.shape == (3, 6) and (ar - one).abs().max() > 1e-2
    ar_logprobs(toy, PROMPTS, gen)                                       # a default counter works too
    onestep_logprobs(toy, PROMPTS, gen)


def test_ar_logprobs_match_the_block1_rollout_log_probs():
    toy = Toy(7, scale=1.0)
    gen, info = decode(toy, PROMPTS, 5, 1, 1, 1.0, torch.Generator().manual_seed(1))
    assert torch.allclose(ar_logprobs(toy, PROMPTS, gen), info["logp"], atol=1e-5)


def test_masked_diffusion_loss_by_hand():
    rec = Rec()
    mcfg = TinyTransformerConfig(vocab_size=V, d_model=8, n_layers=1, n_heads=2, max_seq_len=TMAX, causal=False)
    m = MaskedDiffusionLM(mcfg, lr=0.02, weight_decay=0.15, seed=3, counter=KernelCounter(rec))
    toy = Toy(8, scale=1.0)
    m.model = toy
    gen_rng = np.random.default_rng(0)
    B, Lg = 64, 8
    y = torch.tensor(gen_rng.integers(0, 15, size=(B, Lg)))
    x0 = torch.cat([PROMPTS[torch.arange(B) % 3], y], 1)
    loss = m.training_step(x0, 0)
    xt = toy.inputs[-1]
    assert torch.equal(xt[:, :P], x0[:, :P])                             # the prompt is never masked
    masked = xt[:, P:] == MASK
    assert torch.equal(xt[:, P:][~masked], y[~masked])
    # the documented draw: t ~ U(1e-3, 1] per row, then each token masked with probability t
    g = torch.Generator().manual_seed(3)
    t = 1e-3 + (1 - 1e-3) * torch.rand(B, generator=g)
    assert torch.equal(torch.rand(B, Lg, generator=g) < t[:, None], masked)
    assert 0.35 < masked.float().mean() < 0.65
    total = 0.0
    for b in range(B):
        ctx = xt[b].tolist()
        for i in range(Lg):
            if masked[b, i]:
                total += logsoftmax_py(logits_py(toy, ctx, P + i, exclude_mask=False))[y[b, i]] / float(t[b])
    assert float(loss) == pytest.approx(-total / (B * Lg), rel=1e-4)
    assert m.history == [{"step": 0, "loss": pytest.approx(float(loss))}] and rec.calls == [("token_logprob", 1)]
    loss.backward()
    assert toy.unembed.grad is not None
    opt = m.configure_optimizers()
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["lr"] == 0.02 and opt.defaults["weight_decay"] == 0.15
    assert [id(q) for grp in opt.param_groups for q in grp["params"]] == [id(toy.unembed)]
    # the generator is created once and advanced: a second step draws new masks
    m.training_step(x0, 1)
    assert not torch.equal(toy.inputs[-1], xt) and len(m.history) == 2
    m2 = MaskedDiffusionLM(mcfg, lr=0.02, weight_decay=0.0, seed=3)
    m2.model = Toy(8, scale=1.0)
    m2.training_step(x0, 0)
    assert torch.equal(m2.model.inputs[-1], xt)                          # same seed, same masks


@pytest.mark.parametrize("arm,block", [("justgrpo", 1), ("arbitrary", 6), ("arbitrary", 3)])
def test_policies_rollout_and_score(arm, block):
    toy = Toy(9, scale=1.0)
    rec = Rec()
    pol = DLLMPolicy(toy, 6, arm, KernelCounter(rec), arbitrary_block=3 if block == 3 else None)
    roll = pol.rollout(PROMPTS[:2], 3, torch.Generator().manual_seed(2))
    assert roll.keys() == {"prompts", "tokens", "mask"}
    assert roll["prompts"].tolist() == [PROMPTS[0].tolist()] * 3 + [PROMPTS[1].tolist()] * 3   # prompt-major
    assert roll["mask"].dtype == torch.float32 and (roll["mask"] == 1).all() and roll["mask"].shape == (6, 6)
    ref, info = decode(toy, roll["prompts"], 6, block, 1, 1.0, torch.Generator().manual_seed(2))
    assert torch.equal(roll["tokens"], ref) and len(rec.calls) == info["n_steps"] == 6
    other = "arbitrary" if arm == "justgrpo" else "justgrpo"
    assert not torch.equal(DLLMPolicy(toy, 6, other).rollout(PROMPTS[:2], 3, torch.Generator().manual_seed(2))["tokens"],
                           roll["tokens"])
    lp = pol.token_logprobs(roll)
    assert len(rec.calls) == 7
    for b in (0, 4):
        pr, y = roll["prompts"][b].tolist(), roll["tokens"][b].tolist()
        for t in range(6):
            ctx = pr + (y[:t] + [MASK] * (6 - t) if arm == "justgrpo" else [MASK] * 6)
            assert lp[b, t].item() == pytest.approx(logsoftmax_py(logits_py(toy, ctx, P + t))[y[t]], abs=1e-4)
    assert pol.gen_len == 6 and pol.arm == arm and pol.model is toy
    assert DLLMPolicy(toy, 6, arm).counter.rec is None


@pytest.mark.parametrize("arm", ["justgrpo", "arbitrary"])
def test_scoring_only_active_rows_leaves_loss_and_gradient_unchanged(arm):
    """score_active_only: rows with A = 0 are not scored (log-prob 0, no graph); the clipped surrogate with the
    JustGRPO 1/(L · #A≠0) scale then has the same value and the same gradient as scoring every row (non-unit,
    unequal advantages; a whole zero group and a zero row inside a live group)."""
    from stages.common.grpo import GRPOConfig, grpo_loss
    cfg = GRPOConfig(group_size=3, clip_eps=0.2, kl_coef=0.0, loss_norm="active_samples")
    grads, losses = [], []
    for only in (False, True):
        toy = Toy(11, scale=0.7)
        rec = Rec()
        pol = DLLMPolicy(toy, 6, arm, KernelCounter(rec), score_active_only=only)
        roll = pol.rollout(PROMPTS[:3], 3, torch.Generator().manual_seed(5))
        roll["adv"] = torch.tensor([0.0, 0.0, 0.0, 1.3, -0.4, 0.0, -2.1, 0.6, 1.5])
        lp = pol.token_logprobs(roll)
        assert len(rec.calls) == 6 + 1                                     # 6 decode steps + one scoring call
        if only:
            assert (lp[roll["adv"] == 0] == 0).all() and (lp[roll["adv"] != 0] < 0).all()
        loss, _ = grpo_loss(lp, lp.detach(), roll["adv"], roll["mask"], cfg)
        loss.backward()
        losses.append(float(loss))
        grads.append(toy.unembed.grad.clone())
    assert losses[1] == pytest.approx(losses[0], rel=1e-6) and abs(losses[0]) > 1e-3
    assert torch.allclose(grads[1], grads[0], rtol=1e-5, atol=1e-7) and grads[0].abs().max() > 1e-3
    # without advantages (evaluation) or with the flag off, every row is scored
    toy = Toy(11, scale=0.7)
    pol = DLLMPolicy(toy, 6, arm, score_active_only=True)
    roll = pol.rollout(PROMPTS[:3], 3, torch.Generator().manual_seed(5))
    assert (pol.token_logprobs(roll) < 0).all()
    roll["adv"] = torch.zeros(9)                            # a step without signal: one row keeps the graph
    lp = pol.token_logprobs(roll)
    assert (lp[1:] == 0).all() and (lp[0] < 0).all() and lp.requires_grad


def _ids(text: str, n: int) -> list[int]:
    ids = [VOCAB.index(ch) for ch in text]
    return ids + [EOS] * (n - len(ids))


def test_reward_fn_plus_minus_one():
    p = torch.tensor([[4, 7, PLUS, 3, 8], [0, 5, PLUS, 0, 5], [9, 9, PLUS, 9, 9]])   # 85, 10, 198
    gen = torch.tensor([_ids("#85", 5), _ids("#10", 5), _ids("#197", 5)])
    r = reward_fn(None, {"prompts": p, "tokens": gen})
    assert r.tolist() == [1.0, 1.0, -1.0] and r.dtype == torch.float32


def _trace(a, b, c, d):
    """An independent rendering of the column-by-column solution (prompt order) and the true sum."""
    ones = b + d
    tens = a + c + ones // 10
    carry = "+1" if ones >= 10 else ""
    return f"{b}+{d}={ones};{a}+{c}{carry}={tens};#{10 * tens + ones % 10}", 10 * a + b + 10 * c + d


class Oracle(torch.nn.Module):
    """Greedy output: the full column-by-column trace of the true sum, except when a = 0 (the answer after '#'
    is off by one: answer and trace wrong) and when a = 1 and the ones column carries (the '+1' is left out:
    the right answer after a wrong step). Margins of 0.5 only, so sampling instead of argmax goes wrong often."""

    def forward(self, x):
        B, T = x.shape
        logits = torch.zeros(B, T, V)
        for r, (a, b, _, c, d) in enumerate(x[:, :5].tolist()):
            text, y = _trace(a, b, c, d)
            if a == 0:
                text = text.split("#")[0] + f"#{y + 1}"
            if a == 1 and b + d >= 10:
                text = text.replace("+1=", "=")
            for i, tok in enumerate(_ids(text, T - 5)):
                logits[r, 5 + i, tok] = 0.5
        return logits


ROWS = torch.tensor([[0, 1, PLUS, 1, 2], [1, 2, PLUS, 2, 3], [1, 7, PLUS, 3, 4], [2, 3, PLUS, 0, 4],
                     [4, 4, PLUS, 4, 9], [3, 0, PLUS, 0, 1], [0, 9, PLUS, 2, 2]] * 4)
# a = 0: rows 0, 6 (answer and trace wrong); a = 1 with a carry: row 2 (answer right, trace wrong)


def test_greedy_accuracy_on_an_oracle():
    rec = Rec()
    acc = greedy_accuracy(Oracle(), ROWS, 20, 4, 1, KernelCounter(rec), batch=3)
    assert acc == pytest.approx(20 / 28)                                 # 5 of 7 rows have a ≠ 0
    assert len(rec.calls) == 10 * 20                                    # 10 batches × 20 one-token steps
    assert greedy_accuracy(Oracle(), ROWS, 20, 20, 5) == pytest.approx(20 / 28)
    assert greedy_accuracy(Oracle(), ROWS[1:2], 20, 5, 1) == 1.0
    assert greedy_accuracy(Oracle(), ROWS[:0], 20, 4, 1) == 0.0


def test_greedy_items_judge_answers_and_traces_per_prompt():
    items = greedy_items(Oracle(), ROWS, 20, 5, 2)
    assert items["answer"] == [0, 1, 1, 1, 1, 1, 0] * 4
    assert items["trace"] == [0, 1, 0, 1, 1, 1, 0] * 4                   # the dropped carry is a wrong step


def test_policy_drift_is_zero_against_itself_and_the_mc_kl_otherwise():
    toy, other = Toy(3, scale=1.0), Toy(4, scale=1.0)
    g = torch.Generator().manual_seed(7)
    d0 = policy_drift(toy, toy, PROMPTS[:3], 6, g)
    assert d0["kl_to_base"] == 0.0 and d0["sample_trace_pass1"] == 0.0 and d0["entropy"] > 0
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    d = policy_drift(toy, other, PROMPTS[:3], 6, g1)
    gen, info = decode(toy, PROMPTS[:3], 6, 1, 1, 1.0, g2)                # the same samples
    kl = 0.0
    for bi in range(3):                                                  # Σ_t log p_toy − log p_other, by hand
        pr, y = PROMPTS[bi].tolist(), gen[bi].tolist()
        for t in range(6):
            ctx = pr + y[:t] + [MASK] * (6 - t)
            kl += logsoftmax_py(logits_py(toy, ctx, P + t))[y[t]] - logsoftmax_py(logits_py(other, ctx, P + t))[y[t]]
    assert d["kl_to_base"] == pytest.approx(kl / 3, abs=1e-4)
    assert d["entropy"] == pytest.approx(float(info["entropy"].mean()), abs=1e-6)


def test_pretraining_logs_the_per_step_loss_through_the_trainer():
    from stages.common.trainer import TrainerConfig, make_trainer
    mcfg = TinyTransformerConfig(vocab_size=V, d_model=8, n_layers=1, n_heads=2, max_seq_len=TMAX, causal=False)
    m = MaskedDiffusionLM(mcfg, lr=0.01, weight_decay=0.0, seed=1)
    m.model = Toy(10)
    y = torch.tensor(np.random.default_rng(1).integers(0, 15, size=(16, 6)))
    x0 = torch.cat([PROMPTS[torch.arange(16) % 3], y], 1)
    trainer = make_trainer(TrainerConfig(enable_progress_bar=False), None, max_epochs=1)
    trainer.fit(m, torch.utils.data.DataLoader(x0, batch_size=8))
    assert [h["step"] for h in m.history] == [0, 1] and m.history[0]["loss"] != m.history[1]["loss"]
    assert float(trainer.callback_metrics["pretrain/loss"]) == pytest.approx(m.history[-1]["loss"], rel=1e-6)


def test_pretraining_lr_is_stable_then_decays_to_zero():
    """decay (start, n): lr for t < start, then lr · (1 − (t − start)/n), 0 from start + n (hand values at lr 0.03,
    start 2, n 4; and the window from `pretrain.lr_decay_frac`); without it a plain AdamW at a constant lr."""
    from stages.justgrpo.train import decay_window
    mcfg = TinyTransformerConfig(vocab_size=V, d_model=8, n_layers=1, n_heads=2, max_seq_len=TMAX, causal=False)
    out = MaskedDiffusionLM(mcfg, lr=0.03, weight_decay=0.0, seed=1, decay=(2, 4)).configure_optimizers()
    opt, sched = out["optimizer"], out["lr_scheduler"]["scheduler"]
    assert out["lr_scheduler"]["interval"] == "step"
    seen = []
    for _ in range(8):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([0.03, 0.03, 0.03, 0.0225, 0.015, 0.0075, 0.0, 0.0])
    assert isinstance(MaskedDiffusionLM(mcfg, lr=0.03, weight_decay=0.0, seed=1).configure_optimizers(),
                      torch.optim.AdamW)
    assert decay_window(3000, 0.2) == (2400, 600) and decay_window(3000, 0.0) is None
    assert decay_window(10, 1.0) == (0, 10)


class FullPass(torch.nn.Module):
    """The shared transformer behind an opaque wrapper: every call computes every position (the path any
    other model takes), the reference for the last-block-at-the-needed-rows path."""

    def __init__(self, model):
        super().__init__()
        self.m = model

    def hidden(self, x):
        return self.m.hidden(x)

    def forward(self, x):
        return self.m(x)

    @property
    def unembed(self):
        return self.m.unembed


@pytest.mark.parametrize("block,k,temp", [(1, 1, 1.0), (4, 2, 0.0), (7, 1, 0.8)])
def test_needed_rows_path_equals_the_full_pass(block, k, temp):
    """decode / ar_logprobs / onestep_logprobs on a TinyTransformer (last block at the needed positions only)
    give what the full forward pass gives."""
    from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig
    torch.manual_seed(11)
    tt = TinyTransformer(TinyTransformerConfig(vocab_size=V, d_model=24, n_layers=2, n_heads=4, max_seq_len=P + 7,
                                               causal=False, init_std=0.6)).eval()   # varied predictions
    full = FullPass(tt)
    p = PROMPTS.repeat(6, 1)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    a, ia = decode(tt, p, 7, block, k, temp, g1)
    b, ib = decode(full, p, 7, block, k, temp, g2)
    assert torch.equal(a, b) and torch.equal(ia["step"], ib["step"]) and len(set(a.flatten().tolist())) >= 3
    torch.testing.assert_close(ia["logp"], ib["logp"], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ia["entropy"], ib["entropy"], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ar_logprobs(tt, p, a), ar_logprobs(full, p, a), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(onestep_logprobs(tt, p, a), onestep_logprobs(full, p, a), atol=1e-4, rtol=1e-4)


def test_distinct_rows_against_a_dictionary_of_tuples():
    """first / inverse from a plain-Python dictionary of row tuples; the key is every column side by side."""
    from stages.justgrpo.dllm import distinct_rows
    g = torch.Generator().manual_seed(3)
    x = torch.randint(0, 3, (40, 4), generator=g)                         # 81 possible rows: repeats certain
    r = torch.randint(0, 2, (40, 1), generator=g)
    first, inverse = distinct_rows(x, r)
    seen: dict[tuple, int] = {}
    for i in range(40):
        seen.setdefault(tuple(x[i].tolist()) + tuple(r[i].tolist()), i)
    assert sorted(first.tolist()) == sorted(seen.values()) and len(first) < 40
    for i in range(40):                                                  # each row maps to its first copy
        assert first[inverse[i]].item() == seen[tuple(x[i].tolist()) + tuple(r[i].tolist())]
    # rows equal in x but not in r are distinct rows
    a = torch.tensor([[1, 2], [1, 2]])
    assert distinct_rows(a, torch.tensor([[0], [1]])) is None
    assert distinct_rows(a)[0].tolist() == [0] and distinct_rows(a)[1].tolist() == [0, 0]


@pytest.mark.parametrize("block,temp", [(1, 1.0), (7, 1.0), (3, 0.0)])
def test_repeated_rows_are_computed_once_with_the_same_result(monkeypatch, block, temp):
    """8 samples per prompt (prompt-major, as the samplers and GRPO groups lay them out): decode, ar_logprobs and
    onestep_logprobs with repeated rows computed once give the tokens, log-probs and gradients of the plain
    batch; the shared transformer sees fewer rows than the batch has."""
    import stages.justgrpo.dllm as dllm
    from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig
    torch.manual_seed(4)
    tt = TinyTransformer(TinyTransformerConfig(vocab_size=V, d_model=24, n_layers=2, n_heads=4, max_seq_len=P + 7,
                                               causal=False, init_std=0.3))
    p = PROMPTS.repeat_interleave(8, 0)
    sizes = []
    hidden = tt.hidden
    monkeypatch.setattr(tt, "hidden", lambda x, *a, **k: sizes.append(x.shape[0]) or hidden(x, *a, **k))
    a, ia = decode(tt, p, 7, block, 1, temp, torch.Generator().manual_seed(6))
    deduped = list(sizes)
    sizes.clear()
    lp_a = ar_logprobs(tt, p, a)
    os_a = onestep_logprobs(tt, p, a)
    assert sizes[0] < len(p) * 7 and sizes[1] == len(PROMPTS)     # distinct contexts; one surrogate row per prompt
    grads_a = torch.autograd.grad((lp_a.sum() + 0.5 * os_a.sum()), list(tt.parameters()))
    monkeypatch.setattr(dllm, "distinct_rows", lambda *cols: None)
    sizes.clear()
    b, ib = decode(tt, p, 7, block, 1, temp, torch.Generator().manual_seed(6))
    assert set(sizes) == {len(p)} and min(deduped) < len(p) and sum(deduped) < sum(sizes)
    assert torch.equal(a, b) and torch.equal(ia["step"], ib["step"])
    torch.testing.assert_close(ia["logp"], ib["logp"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ia["entropy"], ib["entropy"], atol=1e-5, rtol=1e-5)
    lp_b, os_b = ar_logprobs(tt, p, a), onestep_logprobs(tt, p, a)
    torch.testing.assert_close(lp_a, lp_b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(os_a, os_b, atol=1e-5, rtol=1e-5)
    grads_b = torch.autograd.grad((lp_b.sum() + 0.5 * os_b.sum()), list(tt.parameters()))
    for ga, gb in zip(grads_a, grads_b):
        torch.testing.assert_close(ga, gb, atol=1e-4, rtol=1e-4)


def test_no_row_sharing_under_active_dropout(monkeypatch):
    """With dropout > 0 in training mode copies of a row would share one dropout mask: every row is computed;
    in eval mode (dropout off) repeated rows are computed once."""
    from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig
    from stages.justgrpo.dllm import dedup_exact
    torch.manual_seed(2)
    tt = TinyTransformer(TinyTransformerConfig(vocab_size=V, d_model=16, n_layers=1, n_heads=2, max_seq_len=P + 5,
                                               causal=False, dropout=0.3))
    p = PROMPTS.repeat_interleave(4, 0)
    gen = torch.randint(0, 10, (len(p), 5))
    sizes = []
    hidden = tt.hidden
    monkeypatch.setattr(tt, "hidden", lambda x, *a, **k: sizes.append(x.shape[0]) or hidden(x, *a, **k))
    tt.train()
    assert not dedup_exact(tt)
    onestep_logprobs(tt, p, gen)
    ar_logprobs(tt, p, gen)
    assert sizes == [len(p), len(p) * 5]
    tt.eval()
    sizes.clear()
    assert dedup_exact(tt)
    onestep_logprobs(tt, p, gen)
    assert sizes == [len(PROMPTS)]
