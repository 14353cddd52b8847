"""The shared GRPO trainer and the token log-prob kernel on a Hugging Face model (issue 41).

* One GRPOModule step (Lightning, float64) with ``stages.common.hf.HFCausalPolicy`` on a tiny random GQA
  ``LlamaForCausalLM`` (and a GPT-2, whose absolute positions make left-padding errors visible; RoPE is
  shift-invariant) and a tokenizer trained at test time, against a hand-written loop: per-row
  sampling on the *unpadded* prompt without a KV cache (same uniforms), rewards, group advantages from
  numpy, the JustGRPO loss from log_softmax, the grad-norm clip and AdamW's first step written out
  (float64 model; the trainer keeps rewards/advantages in float32, so agreement is to ~1e-6 relative).
* The kernel's log-probs on HF logits against log_softmax + gather: torch reference on all rows,
  Triton (TRITON_INTERPRET=1) on a small slice, values and gradients.
"""
from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from kernels.token_logprob import token_logprob
from stages.common.grpo import GRPOConfig, GRPOModule, PromptLoader
from stages.common.hf import HFCausalPolicy, TinyLMConfig, left_pad, tiny_causal_lm, train_tokenizer
from stages.common.trainer import TrainerConfig, make_trainer

pytestmark = pytest.mark.real_source

TEXTS = ["the cat sat on the mat", "a dog ran far away from the house", "birds sing in the early morning",
         "seven times six is forty two", "the quick brown fox jumps over the lazy dog"]
PROMPTS = ["the cat", "a dog ran far away", "birds sing in the"]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return train_tokenizer(TEXTS * 2, tmp_path_factory.mktemp("tok") / "tokenizer.json", vocab_size=290)


def _model(tok, arch):
    kv = 2 if arch == "llama" else None                                 # GQA on Llama; GPT-2: absolute positions
    cfg = TinyLMConfig(arch=arch, d_model=32, n_layers=2, n_heads=4, n_kv_heads=kv, d_ff=48, max_positions=64)
    return tiny_causal_lm(cfg, len(tok), seed=3, dtype=torch.float64, pad_token_id=tok.pad_token_id,
                          bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)


@pytest.fixture(scope="module")
def setup(tok):
    return tok, _model(tok, "llama")


def _reward(tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Fraction of the completion's tokens with an id divisible by 3, minus 0.25 per token past the first two."""
    m = mask.double()
    hits = ((tokens % 3 == 0).double() * m).sum(1)
    n = m.sum(1)
    return hits / n.clamp_min(1) - 0.25 * (n - 2).clamp_min(0)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])   # RoPE is shift-invariant; GPT-2 checks the left-pad positions
def test_one_grpo_step_on_hf_llama_equals_hand_loop(tok, arch):
    model = _model(tok, arch)
    pad = tok.pad_token_id
    ids, am = left_pad(tok, PROMPTS)
    G, T, max_new, lr, wd, clip, seed, loader_seed = 4, 0.9, 6, 3e-3, 0.05, 0.5, 11, 5
    idx = torch.randint(0, len(PROMPTS), (2,), generator=torch.Generator().manual_seed(loader_seed))
    # the stop token: what the untrained model samples at step 3 of row 0 (a random-init model almost never
    # samples its own EOS), so that row 0 - and any row sampling it earlier - stops and the mask has zeros
    probe = HFCausalPolicy(copy.deepcopy(model), ids, am, max_new_tokens=max_new, eos_token_id=-1,
                           pad_token_id=pad, temperature=T, backend="torch")
    eos = int(probe.rollout(idx, G, torch.Generator().manual_seed(seed))["tokens"][0, 2])
    hand_model = copy.deepcopy(model)
    policy = HFCausalPolicy(model, ids, am, max_new_tokens=max_new, eos_token_id=eos, pad_token_id=pad,
                            temperature=T, backend="torch")
    seen = {}

    def reward_fn(prompts, roll):
        seen.update(roll)
        return _reward(roll["tokens"], roll["mask"])

    cfg = GRPOConfig(group_size=G, grad_clip=clip)
    module = GRPOModule(policy, reward_fn, cfg, lr=lr, weight_decay=wd, seed=seed)
    trainer = make_trainer(TrainerConfig(enable_progress_bar=False, precision="64-true"), None, max_steps=1)
    trainer.fit(module, PromptLoader(torch.arange(len(PROMPTS)), batch=2, steps=1, seed=loader_seed))

    # ---- the hand-written loop ----
    rows = [tok(PROMPTS[int(i)], add_special_tokens=False)["input_ids"] for i in idx for _ in range(G)]
    B, V = len(rows), len(tok)
    gen = torch.Generator().manual_seed(seed)
    done = [False] * B
    comp: list[list[int]] = [[] for _ in range(B)]
    msk: list[list[float]] = [[] for _ in range(B)]
    for _ in range(max_new):
        u = torch.rand((B, V), generator=gen, dtype=torch.float64)
        for b in range(B):
            if done[b]:
                comp[b].append(pad)
                msk[b].append(0.0)
                continue
            with torch.no_grad():
                z = hand_model(input_ids=torch.tensor([rows[b] + comp[b]])).logits[0, -1] / T
            y = int(torch.argmax(z - torch.log(-torch.log(u[b].clamp_min(1e-30)))))
            comp[b].append(y)
            msk[b].append(1.0)
            done[b] = y == eos
        if all(done):
            break
    tokens, mask = torch.tensor(comp), torch.tensor(msk, dtype=torch.float64)
    assert torch.equal(seen["tokens"], tokens) and torch.equal(seen["mask"].double(), mask)
    assert 0 < float(mask.sum()) < mask.numel()                          # some rows stopped at EOS
    r = _reward(tokens, mask).numpy()
    rg = r.reshape(-1, G)
    adv = ((rg - rg.mean(1, keepdims=True)) / (rg.std(1, ddof=1, keepdims=True) + 1e-4)).reshape(-1)
    # the trainer casts rewards (hence advantages) to float32: agreement to float32 precision from here on
    assert module.history[-1]["reward_mean"] == pytest.approx(float(r.mean()), rel=1e-6, abs=1e-7)
    Lc = tokens.shape[1]
    total = torch.zeros((), dtype=torch.float64)
    for b in range(B):
        seq = torch.tensor([rows[b] + comp[b]])
        logsm = torch.log_softmax(hand_model(input_ids=seq).logits[0] / T, -1)    # (len, V)
        for t in range(Lc):
            if msk[b][t]:
                total = total - float(adv[b]) * logsm[len(rows[b]) + t - 1, comp[b][t]]
    scale = Lc * int((adv != 0).sum())                                  # JustGRPO scale 1/(L·#active)
    # on-policy, ratio ≡ 1: the loss value is −Σ mask·A / scale, its gradient that of −Σ mask·A·logp / scale
    value = -sum(float(adv[b]) * sum(msk[b]) for b in range(B)) / scale
    assert module.history[-1]["loss"] == pytest.approx(value, rel=1e-6, abs=1e-9)
    (total / scale).backward()
    params = dict(hand_model.named_parameters())
    norm = math.sqrt(sum(float((p.grad ** 2).sum()) for p in params.values() if p.grad is not None))
    coef = min(1.0, clip / (norm + 1e-6))
    assert norm > clip                                                  # the clip is live
    got = dict(module.policy.model.named_parameters())
    for name, p in params.items():
        g = (p.grad if p.grad is not None else torch.zeros_like(p)) * coef
        # float32 advantages: entries agree to 1e-6 of the largest gradient entry (a wrong mask, token,
        # scale or clip would be off by O(1))
        assert torch.allclose(got[name].grad, g, rtol=1e-5, atol=1e-6 * float(g.abs().max())), name
        # AdamW, first step, from the trainer's own (clipped) gradient: m̂ = g, v̂ = g²,
        # p ← p − lr·wd·p − lr·g/(|g| + ε)
        gm = got[name].grad
        new = p.detach() - lr * wd * p.detach() - lr * gm / (gm.abs() + 1e-8)
        assert torch.allclose(got[name].detach(), new, rtol=0, atol=1e-12), name
    head = "lm_head.weight" if "lm_head.weight" in got else next(iter(got))
    assert not torch.equal(got[head].detach(), params[head].detach())


def test_kernel_logprobs_on_hf_logits(setup):
    tok, model = setup
    ids, am = left_pad(tok, PROMPTS)
    pol = HFCausalPolicy(model, ids, am, max_new_tokens=4, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, temperature=0.7, backend="torch")
    roll = pol.rollout(torch.tensor([0, 1, 2]), 2, torch.Generator().manual_seed(3))
    Lc = roll["tokens"].shape[1]
    logits = pol.logits(roll["input_ids"], roll["attention_mask"]).float()[:, -Lc - 1:-1]
    expect = torch.log_softmax(logits / 0.7, -1).gather(-1, roll["tokens"][..., None]).squeeze(-1) * roll["mask"]
    got = pol.token_logprobs(roll)
    assert torch.allclose(got.float(), expect, atol=1e-5, rtol=0)
    ref = token_logprob(logits, roll["tokens"], temperature=0.7, backend="torch")
    assert torch.allclose(ref * roll["mask"], expect, atol=1e-6, rtol=0)
    # Triton path (interpreter on CPU) on a slice: 2 rows x 3 completion positions, values and gradients
    x = logits[:2, :3].detach().clone().requires_grad_(True)
    y = roll["tokens"][:2, :3]
    tri = token_logprob(x, y, temperature=0.7, backend="triton")
    xr = logits[:2, :3].detach().clone().requires_grad_(True)
    lsm = torch.log_softmax(xr / 0.7, -1).gather(-1, y[..., None]).squeeze(-1)
    assert torch.allclose(tri, lsm, atol=1e-5, rtol=0)
    w = torch.linspace(-1.0, 2.0, y.numel()).view_as(tri)
    (tri * w).sum().backward()
    (lsm * w).sum().backward()
    assert torch.allclose(x.grad, xr.grad, atol=1e-5, rtol=0)
    assert np.isfinite(float(tri.sum()))
