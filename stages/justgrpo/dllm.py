"""The masked-diffusion LM (shared tiny transformer, bidirectional), its pretraining objective, its
samplers, the two likelihoods GRPO needs, and the two RL policies.

    model = TinyTransformer(TinyTransformerConfig(..., causal=False))
    gen, info = decode(model, prompts, gen_len=16, block_len=1, tokens_per_step=1, temperature=1.0, generator=g)
        block_len=1, k=1            AR order (JustGRPO's rollout)
        block_len=L, k=1            low-confidence arbitrary order
        block_len=B, k tokens/step  semi-AR blocks with parallel decoding (LLaDA's evaluation)
    logp = ar_logprobs(model, prompts, gen)        exact AR likelihood under the dLLM (JustGRPO)
    logp = onestep_logprobs(model, prompts, gen)   one-step masked surrogate (d1-style baseline)

Token log-probs and the sampler's confidences go through ``kernels/token_logprob``.
"""
from __future__ import annotations

from typing import Literal

import lightning as L
import numpy as np
import torch
import torch.nn as nn

from kernels.record import KernelCounter as Counter  # token_logprob calls
from kernels.token_logprob import token_logprob
from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig, gather_rows
from stages.justgrpo.task import EOS, MASK, PROMPT_LEN, answers, correct, trace_valid


NEG = -1.0e4   # logit of the MASK token at decoding (never sampled); finite so 0·z stays 0


def gen_logits(model: TinyTransformer, x: torch.Tensor, positions: slice | torch.Tensor | None = None) -> torch.Tensor:
    """Logits with the MASK token excluded (the dLLM never predicts MASK), at ``positions`` (a slice of x's
    columns, or (B, M) column indices per row) or everywhere. The shared transformer computes its last block only
    at those positions (``TinyTransformer.hidden(rows=...)``); another model computes every position and is
    sliced."""
    if isinstance(positions, slice):
        positions = torch.arange(x.shape[1], device=x.device)[positions].expand(x.shape[0], -1)
    if positions is None:
        logits = model(x)
    elif isinstance(model, TinyTransformer):
        logits = hidden_at(model, x, positions) @ model.unembed.T
    else:
        logits = gather_rows(model(x), positions)
    return logits.index_fill(-1, torch.tensor([MASK], device=x.device), NEG)


def distinct_rows(*cols: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Rows that repeat across the batch, computed once. ``cols`` are (B, ·) tensors of one batch, side by side
    the whole input of each row; returns (first, inverse): ``first`` (U,) the index of each distinct row's first
    occurrence, ``inverse`` (B,) which distinct row each row is, so ``f(x[first])[inverse]`` equals ``f(x)`` row
    by row for any row-wise f (up to float rounding of the smaller batch). None when every row is distinct.
    The n samples of one prompt share their prompt and, under a confident model, most of their prefix: with 16
    samples per prompt 60% (AR order) to 90% (arbitrary order) of the sampler's rows repeat another row of the
    batch (54–65% in a GRPO group of 8). Not for a model with active dropout: copies would share one mask
    (``dedup_exact``)."""
    key = torch.cat([c.reshape(c.shape[0], -1).long() for c in cols], 1)
    _, inverse = torch.unique(key, dim=0, return_inverse=True)
    n = int(inverse.max()) + 1 if inverse.numel() else 0
    if n == key.shape[0]:
        return None
    first = torch.full((n,), key.shape[0], dtype=torch.long, device=key.device)
    return first.scatter_reduce(0, inverse, torch.arange(key.shape[0], device=key.device), "amin"), inverse


def dedup_exact(model: nn.Module) -> bool:
    """Whether computing a repeated row once gives each copy its own law: not in training mode with dropout > 0
    (the copies would share one dropout mask: right per row, correlated across copies)."""
    return not (model.training and getattr(getattr(model, "cfg", None), "dropout", 0.0) > 0)


def repeated_rows(model: nn.Module, *cols: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``distinct_rows(*cols)`` where computing each distinct row once is exact for this model, else None."""
    return distinct_rows(*cols) if dedup_exact(model) else None


def hidden_at(model: TinyTransformer, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Final hidden states at positions ``rows`` (B, R) of x: the shared transformer's last block runs there
    only; another model's full hidden states are gathered."""
    if isinstance(model, TinyTransformer):
        return model.hidden(x, rows=rows)
    return gather_rows(model.hidden(x), rows)


# ----------------------------------------------------------------------------------------------
# pretraining: masked diffusion
# ----------------------------------------------------------------------------------------------
class MaskedDiffusionLM(L.LightningModule):
    """ALGO: masked-diffusion objective (LLaDA Eq. 3, SFT form: the prompt is never masked)
        t ~ U(0, 1],  each completion token masked with prob t,
        L(θ) = − E_t E_{x_t} [ (1/t) Σ_{i masked} log p_θ(x0_i | prompt, x_t) ] / L_gen
    """

    def __init__(self, model_cfg: TinyTransformerConfig, lr: float, weight_decay: float, seed: int,
                 counter: Counter | None = None, decay: tuple[int, int] | None = None):
        super().__init__()
        self.model = TinyTransformer(model_cfg)
        self.lr, self.weight_decay, self.seed = lr, weight_decay, seed
        self.decay = decay                      # None: constant lr; (start, n): constant, then linear to 0 over n steps
        self.counter = counter or Counter()
        self.history: list[dict[str, float]] = []
        self._gen: torch.Generator | None = None

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.model.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        if self.decay is None:
            return opt
        start, n = self.decay                   # LLaDA's warmup-stable-decay without the warmup:
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: min(1.0, max(0.0, 1.0 - (t - start) / n)))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def training_step(self, x0, batch_idx):
        if self._gen is None:
            self._gen = torch.Generator(device=self.device).manual_seed(self.seed)
        P = PROMPT_LEN
        y = x0[:, P:]                                                        # (B, L)
        B, Lg = y.shape
        t = 1e-3 + (1 - 1e-3) * torch.rand(B, generator=self._gen, device=self.device)   # t ~ U(0,1]
        m = torch.rand(B, Lg, generator=self._gen, device=self.device) < t[:, None]
        xt = torch.where(m, torch.full_like(y, MASK), y)
        logits = self.model(torch.cat([x0[:, :P], xt], 1))[:, P:]           # (B, L, V)
        logp = token_logprob(logits, y, backend=self.counter.backend)
        self.counter()
        loss = -(logp * m / t[:, None]).sum() / (B * Lg)                     # ALGO: 1/t-weighted masked CE
        self.history.append({"step": int(self.global_step), "loss": float(loss.detach())})
        self.log("pretrain/loss", loss, on_step=True, prog_bar=False)
        return loss


# ----------------------------------------------------------------------------------------------
# samplers
# ----------------------------------------------------------------------------------------------
@torch.no_grad()
def decode(model: TinyTransformer, prompts: torch.Tensor, gen_len: int, block_len: int, tokens_per_step: int,
           temperature: float, generator: torch.Generator | None = None, counter: Counter | None = None):
    """LLaDA-style decoding. Blocks of ``block_len`` left to right; inside a block each step predicts
    every masked position (Gumbel-max sample at temperature T, argmax at T = 0), scores it by the
    untempered confidence softmax(l)[x̂], and commits the ``tokens_per_step`` most confident.
    Returns (gen (B, L), info) with info["step"] (B, L) the step at which each position was decoded
    and info["entropy"] (B, L) the predictive entropy of that position at that moment, info["logp"]
    (B, L) the (untempered) log-prob of the committed token in the context it was decoded in."""
    counter = counter or Counter()
    B, P = prompts.shape
    dev = prompts.device
    x = torch.cat([prompts, torch.full((B, gen_len), MASK, dtype=prompts.dtype, device=dev)], 1)
    dec_step = torch.full((B, gen_len), -1, dtype=torch.long, device=dev)
    ent_at = torch.zeros(B, gen_len, device=dev)
    logp_at = torch.zeros(B, gen_len, device=dev)
    step = 0
    for b0 in range(0, gen_len, block_len):
        b1 = min(b0 + block_len, gen_len)
        blk = slice(P + b0, P + b1)                                           # this block's columns of x
        while True:
            masked = x[:, blk] == MASK                                        # (B, R) R = block length
            remaining = int(masked[0].sum())
            if remaining == 0:
                break
            # every row commits the same number of tokens per step, so every row has `remaining` masked block
            # positions: their offsets in the block, ascending (B, M); only they are predicted
            where = torch.sort(torch.where(masked, 0, 1) * (b1 - b0) + torch.arange(b1 - b0, device=dev),
                               dim=1).values[:, :remaining]
            dup = repeated_rows(model, x)                                     # repeated rows: one forward each
            if dup is None:
                logits = gen_logits(model, x, P + b0 + where).float()        # (B, M, V)
            else:
                first, inverse = dup
                logits = gen_logits(model, x[first], P + b0 + where[first]).float()[inverse]
            if temperature > 0:                                               # Gumbel-max sampling
                u = torch.rand(logits.shape, generator=generator, device=dev).clamp_min(1e-20)
                x0 = (logits / temperature - torch.log(-torch.log(u))).argmax(-1)
            else:
                x0 = logits.argmax(-1)
            logp, ent = token_logprob(logits, x0, with_entropy=True, backend=counter.backend)
            counter()
            k = min(tokens_per_step, remaining)
            chosen = logp.exp().topk(k, dim=1).indices                        # low-confidence remasking: (B, k)
            col = where.gather(1, chosen)                                     # their offsets in the block
            x[:, blk].scatter_(1, col, x0.gather(1, chosen))                  # (views: written in place)
            dec_step[:, b0:b1].scatter_(1, col, torch.full_like(col, step))
            ent_at[:, b0:b1].scatter_(1, col, ent.gather(1, chosen))
            logp_at[:, b0:b1].scatter_(1, col, logp.gather(1, chosen))
            step += 1
    return x[:, P:], {"step": dec_step, "entropy": ent_at, "logp": logp_at, "n_steps": step}


# ----------------------------------------------------------------------------------------------
# likelihoods for GRPO
# ----------------------------------------------------------------------------------------------
def ar_logprobs(model: TinyTransformer, prompts: torch.Tensor, gen: torch.Tensor,
                counter: Counter | None = None) -> torch.Tensor:
    """ALGO: JustGRPO exact AR likelihood: for each t, input [prompt, y_<t, MASK·(L−t)],
    logp_t = log_softmax(logits[P+t])[y_t]  — the same masked context as the block-1 rollout."""
    counter = counter or Counter()
    B, Lg = gen.shape
    P = prompts.shape[1]
    dev = gen.device
    keep = torch.arange(Lg, device=dev)[None, :] < torch.arange(Lg, device=dev)[:, None]   # (t, pos): pos < t
    ctx = torch.where(keep[None], gen[:, None, :], torch.full_like(gen[:, None, :], MASK))  # (B, L, L)
    inp = torch.cat([prompts[:, None, :].expand(B, Lg, P), ctx], -1).reshape(B * Lg, P + Lg)
    t = torch.arange(Lg, device=dev)
    rows = (P + t).repeat(B)[:, None]                                         # context (b, t) reads position P+t
    dup = repeated_rows(model, inp, rows)    # samples of one prompt share prefixes: each distinct context once
    if dup is None:
        h_t = hidden_at(model, inp, rows)
    else:
        first, inverse = dup
        h_t = hidden_at(model, inp[first], rows[first])[inverse]             # gradients sum over the copies
    h_t = h_t.view(B, Lg, -1)                                                 # (B, L, C)
    logits = (h_t @ model.unembed.T).index_fill(-1, torch.tensor([MASK], device=dev), NEG)
    counter()
    return token_logprob(logits, gen, backend=counter.backend)


def onestep_logprobs(model: TinyTransformer, prompts: torch.Tensor, gen: torch.Tensor,
                     counter: Counter | None = None) -> torch.Tensor:
    """ALGO: d1-style one-step surrogate: logp_t ≈ log p(y_t | prompt, all completion tokens masked)."""
    counter = counter or Counter()
    P = prompts.shape[1]
    x = torch.cat([prompts, torch.full_like(gen, MASK)], 1)
    dup = repeated_rows(model, x)            # a group's rows share the prompt: one forward per prompt
    if dup is None:
        logits = gen_logits(model, x, slice(P, None))
    else:
        first, inverse = dup
        logits = gen_logits(model, x[first], slice(P, None))[inverse]
    counter()
    return token_logprob(logits, gen, backend=counter.backend)


# ----------------------------------------------------------------------------------------------
# RL policies (stages.common.grpo.GRPOPolicy)
# ----------------------------------------------------------------------------------------------
class DLLMPolicy(nn.Module):
    """justgrpo: AR-order rollout (block 1, T=1) + exact AR likelihood.
    arbitrary: low-confidence arbitrary-order rollout (T=1) inside blocks of ``arbitrary_block`` (None: one block,
    the whole generation; d1 rolls out with LLaDA's semi-AR blocks) + one-step masked surrogate (d1-style)."""

    def __init__(self, model: TinyTransformer, gen_len: int, arm: Literal["justgrpo", "arbitrary"],
                 counter: Counter | None = None, arbitrary_block: int | None = None, score_active_only: bool = False):
        super().__init__()
        self.model, self.gen_len, self.arm = model, gen_len, arm
        self.arbitrary_block = arbitrary_block
        self.counter = counter or Counter()
        self.score_active_only = score_active_only

    def rollout(self, prompts, group_size, generator):
        p = prompts.repeat_interleave(group_size, 0)                          # prompt-major rows
        block = 1 if self.arm == "justgrpo" else (self.arbitrary_block or self.gen_len)
        gen, _ = decode(self.model, p, self.gen_len, block, 1, 1.0, generator, self.counter)
        # loss covers every position, EOS fill included (official grpo.py:34-50)
        return {"prompts": p, "tokens": gen, "mask": torch.ones(gen.shape, device=gen.device)}

    def token_logprobs(self, roll):
        """Per-token log-probs of the rollout. With ``score_active_only`` (valid only without a KL term) and
        advantages attached, only rows with A ≠ 0 are scored; the others get log-prob 0, no graph. Exact: the
        clipped surrogate of a row is A · (ratio or its clip), 0 with its gradient when A = 0, and the
        JustGRPO scale 1/(L · #rows with A ≠ 0) counts only scored rows — loss and gradient are unchanged
        (``tests/justgrpo/test_dllm_brute.py``), the cost of the update falls with the share of zero groups."""
        fn = ar_logprobs if self.arm == "justgrpo" else onestep_logprobs
        adv = roll.get("adv")
        if not self.score_active_only or adv is None:
            return fn(self.model, roll["prompts"], roll["tokens"], self.counter)
        active = adv != 0
        if not bool(active.any()):          # no signal in the step: score one row (A = 0) to keep a graph
            active = torch.arange(len(adv), device=adv.device) == 0
        out = torch.zeros(roll["tokens"].shape, device=roll["tokens"].device)
        return out.index_put((active,), fn(self.model, roll["prompts"][active], roll["tokens"][active],
                                           self.counter))


def reward_fn(prompts, roll) -> torch.Tensor:
    """ALGO: reward +1 if the answer after '#' is right, −1 otherwise."""
    ok = correct(roll["tokens"], answers(roll["prompts"]))
    return ok.float() * 2.0 - 1.0


@torch.no_grad()
def greedy_items(model: TinyTransformer, prompts: torch.Tensor, gen_len: int, block_len: int,
                 tokens_per_step: int, counter: Counter | None = None, batch: int = 512) -> dict[str, list[int]]:
    """Greedy (T = 0) decoding of every prompt: per-prompt 0/1 answer-level and trace-level correctness."""
    ans, trace = [], []
    for i in range(0, prompts.shape[0], batch):
        p = prompts[i:i + batch]
        gen, _ = decode(model, p, gen_len, block_len, tokens_per_step, 0.0, None, counter)
        ans += correct(gen, answers(p)).int().tolist()
        trace += trace_valid(gen, p).int().tolist()
    return {"answer": ans, "trace": trace}


def greedy_rates(model: TinyTransformer, prompts: torch.Tensor, gen_len: int, block_len: int,
                 counter: Counter | None = None) -> dict[str, float]:
    """Greedy decoding (1 token/step, semi-AR blocks of ``block_len``): answer- and trace-level accuracy."""
    items = greedy_items(model, prompts, gen_len, block_len, 1, counter)
    return {"answer": float(np.mean(items["answer"])), "trace": float(np.mean(items["trace"]))}


def greedy_accuracy(model: TinyTransformer, prompts: torch.Tensor, gen_len: int, block_len: int,
                    tokens_per_step: int, counter: Counter | None = None, batch: int = 512) -> float:
    """Answer-level greedy accuracy (share of prompts whose number after '#' is right)."""
    items = greedy_items(model, prompts, gen_len, block_len, tokens_per_step, counter, batch)["answer"]
    return sum(items) / max(1, len(items))


@torch.no_grad()
def policy_drift(model: TinyTransformer, base: TinyTransformer, prompts: torch.Tensor, gen_len: int,
                 generator: torch.Generator, counter: Counter | None = None) -> dict[str, float]:
    """On AR-order samples (block 1, T = 1) of ``model``: mean per-token predictive entropy, sampled
    trace-level pass@1, and the Monte-Carlo KL(model ‖ base) of the AR sampling distribution,
    E_y~model[Σ_t log p_model(y_t | ·) − log p_base(y_t | ·)] (both log-probs in the rollout's own masked
    contexts, ``ar_logprobs``)."""
    gen, info = decode(model, prompts, gen_len, 1, 1, 1.0, generator, counter)
    lp = ar_logprobs(model, prompts, gen, counter).sum(1)
    lb = ar_logprobs(base, prompts, gen, counter).sum(1)
    return {"entropy": float(info["entropy"].mean()), "kl_to_base": float((lp - lb).mean()),
            "sample_trace_pass1": float(trace_valid(gen, prompts).float().mean())}


__all__ = ["EOS", "MaskedDiffusionLM", "decode", "ar_logprobs", "onestep_logprobs", "DLLMPolicy",
           "reward_fn", "greedy_accuracy", "greedy_items", "greedy_rates", "policy_drift", "Counter"]
