"""PLANTAIN on the shared tiny causal transformer: batched sampling (temperature, top-p), streaming
decoding with a KV cache (time to first visible token), the SFT loss's log-probs and schedule (the
LightningModule is ``lit.SFTModule``), the GRPO policy for ``stages.common.grpo`` and Rewind-and-Repeat at plan
level vs answer level.

Every per-token log-prob goes through ``kernels/token_logprob`` (counted in a KernelRecord).
"""
from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn as nn

from kernels.record import KernelCounter as Counter  # token_logprob calls
from kernels.token_logprob import token_logprob
from stages.common.tiny_transformer import TinyTransformer
from stages.plantain.task import (ANS, EANS, EOS, ETHINK, plan_pairs, PAD, PROMPT_LEN, THINK, Problem, TraceError, parse_trace,
                                  problem_from_prompt, reward, steps_follow_plan, validate_plan, visible_mask)

IGNORE = -100


def seq_logprobs(model: TinyTransformer, seqs: torch.Tensor, mask: torch.Tensor, counter: Counter) -> torch.Tensor:
    """log π(y_t | y_<t) of tokens seqs[:, P:] (B, Lg) under teacher forcing; 0 where mask = 0."""
    P = PROMPT_LEN
    logits = model(seqs[:, :-1])[:, P - 1:]                                  # (B, Lg, V)
    tgt = torch.where(mask > 0, seqs[:, P:], torch.full_like(seqs[:, P:], IGNORE))
    counter()
    return token_logprob(logits, tgt, ignore_index=IGNORE, backend=counter.backend)   # (B, Lg)


# ----------------------------------------------------------------------------------------------
# sampling
# ----------------------------------------------------------------------------------------------
def sample_next(logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator | None) -> torch.Tensor:
    """(B, V) -> (B,): argmax at T = 0, else nucleus sampling of softmax(logits / T)."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, -1)
    if top_p < 1.0:
        sp, si = probs.sort(-1, descending=True)
        keep = sp.cumsum(-1) - sp < top_p                                    # smallest prefix with mass ≥ p
        sp = torch.where(keep, sp, torch.zeros_like(sp))
        probs = torch.zeros_like(probs).scatter_(-1, si, sp)
    return torch.multinomial(probs, 1, generator=gen).squeeze(-1)


@torch.no_grad()
def sample_batch(model: TinyTransformer, prompts: torch.Tensor, max_new: int, temperature: float,
                 top_p: float = 1.0, gen: torch.Generator | None = None, plan_temperature: float | None = None,
                 plan_top_p: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode every prompt (B, PROMPT_LEN) until <eos> with a KV cache (all prompts have the same
    length). With ``plan_temperature`` the tokens up to and including the first </ans> (the pre-plan
    thought and the plan of a plan-first trace) are sampled at that temperature / nucleus mass and the
    rest at ``temperature``. Returns right-padded (B, PROMPT_LEN + max_new) sequences and lengths."""
    B = prompts.shape[0]
    dev = prompts.device
    seqs = torch.full((B, PROMPT_LEN + max_new), PAD, dtype=torch.long, device=dev)
    seqs[:, :PROMPT_LEN] = prompts
    lens = torch.full((B,), PROMPT_LEN, dtype=torch.long, device=dev)
    active = torch.ones(B, dtype=torch.bool, device=dev)
    in_plan = torch.ones(B, dtype=torch.bool, device=dev)
    cache = model.new_cache()
    logits = model(prompts, cache)[:, -1]                                    # (B, V)
    for t in range(max_new):
        nxt = sample_next(logits, temperature, top_p, gen)
        if plan_temperature is not None:
            nxt_plan = sample_next(logits, plan_temperature, plan_top_p, gen)
            nxt = torch.where(in_plan, nxt_plan, nxt)
            in_plan &= nxt != EANS
        nxt = torch.where(active, nxt, torch.full_like(nxt, PAD))
        seqs[:, PROMPT_LEN + t] = nxt
        lens += active.long()
        active &= nxt != EOS
        if not bool(active.any()) or t == max_new - 1:
            break
        logits = model(nxt[:, None], cache)[:, -1]
    return seqs, lens


def generated(seqs: torch.Tensor, lens: torch.Tensor, i: int) -> list[int]:
    return seqs[i, PROMPT_LEN:int(lens[i])].tolist()


@torch.no_grad()
def greedy_traces(model: TinyTransformer, prompts: torch.Tensor, max_new: int, batch: int = 512) -> list[list[int]]:
    out = []
    for i in range(0, prompts.shape[0], batch):
        seqs, lens = sample_batch(model, prompts[i:i + batch], max_new, 0.0)
        out += [generated(seqs, lens, j) for j in range(seqs.shape[0])]
    return out


@torch.no_grad()
def stream_ttfr(model: TinyTransformer, prompt: torch.Tensor, max_new: int) -> dict[str, float]:
    """Streaming greedy decode of ONE prompt with a KV cache, token by token as a server would
    stream them: the number of tokens before the first visible token and the wall time (s) to it
    (wall time is reported only; it depends on machine load)."""
    t0 = time.perf_counter()
    cache = model.new_cache()
    logits = model(prompt[None], cache)[:, -1]
    toks, first_tok, first_wall = [], None, None
    inside = False
    for _ in range(max_new):
        nxt = logits.argmax(-1)
        t = int(nxt)
        toks.append(t)
        if inside and t != EANS and first_tok is None:
            first_tok, first_wall = len(toks) - 1, time.perf_counter() - t0
        if t == EANS:
            inside = False
        if t == ANS:
            inside = True
        if t == EOS or PROMPT_LEN + len(toks) >= model.cfg.max_seq_len:
            break
        logits = model(nxt[:, None], cache)[:, -1]
    total = time.perf_counter() - t0
    if first_tok is None:
        first_tok, first_wall = len(toks), total
    return {"ttfr_tokens": first_tok, "ttfr_wall_s": first_wall, "total_wall_s": total, "tokens": len(toks)}


# ----------------------------------------------------------------------------------------------
# SFT
# ----------------------------------------------------------------------------------------------
def wsd_factor(step: int, steps: int, decay_frac: float) -> float:
    """Warmup-free warmup-stable-decay: lr × 1 for the first (1 − decay_frac)·steps steps, then linearly to 0 at
    ``steps`` (the factor of the lr at optimizer step ``step``, 0-based)."""
    start = int(round(steps * (1.0 - decay_frac)))
    return 1.0 if step < start else max(0.0, (steps - step) / max(steps - start, 1))


def sft_tensor(traces: list[list[int]], prompts: list[list[int]], max_new: int) -> torch.Tensor:
    """(N, 3, PROMPT_LEN + max_new): sequences, loss mask (trace tokens), visible mask."""
    N = len(traces)
    out = torch.zeros(N, 3, PROMPT_LEN + max_new, dtype=torch.long)
    out[:, 0] = PAD
    for i, (p, t) in enumerate(zip(prompts, traces)):
        out[i, 0, :PROMPT_LEN] = torch.tensor(p)
        out[i, 0, PROMPT_LEN:PROMPT_LEN + len(t)] = torch.tensor(t)
        out[i, 1, PROMPT_LEN:PROMPT_LEN + len(t)] = 1
        out[i, 2, PROMPT_LEN:PROMPT_LEN + len(t)] = torch.tensor(visible_mask(t), dtype=torch.long)
    return out


# ----------------------------------------------------------------------------------------------
# GRPO policy (stages.common.grpo.GRPOPolicy)
# ----------------------------------------------------------------------------------------------
class TracePolicy(nn.Module):
    """Samples whole traces (T = rollout temperature) from the prompt; the loss covers every
    generated token through <eos>."""

    def __init__(self, model: TinyTransformer, max_new: int, temperature: float, counter: Counter):
        super().__init__()
        self.model, self.max_new, self.temperature, self.counter = model, max_new, temperature, counter

    def rollout(self, prompts, group_size, generator):
        p = prompts.repeat_interleave(group_size, 0)                         # prompt-major rows
        seqs, lens = sample_batch(self.model, p, self.max_new, self.temperature, 1.0, generator)
        pos = torch.arange(self.max_new, device=p.device)[None]
        mask = (pos < (lens - PROMPT_LEN)[:, None]).float()
        return {"seqs": seqs, "lens": lens, "mask": mask}

    def token_logprobs(self, roll):
        return seq_logprobs(self.model, roll["seqs"], roll["mask"], self.counter)


def make_reward_fn(fmt: str, w_correct: float, w_helpful: float, judge=None, tta_process_reward: bool = False,
                   log: list | None = None):
    """The PLANTAIN reward of every rollout row (``task.reward``; ``judge`` scores plans, default rule-based).
    With ``log``, one row per call (one GRPO step): the share of rollouts whose plan the judge accepts (the r_helpful
    indicator, also where its weight is 0), the share whose plan is right (rule-based check), and the judge's
    false-acceptance rate on the wrong plans — a policy learning to pass a fallible judge shows as the first rising
    while the second does not."""
    def reward_fn(prompts, roll) -> torch.Tensor:
        seqs, lens = roll["seqs"], roll["lens"]
        out, accepted, right = [], [], []
        for i in range(seqs.shape[0]):
            prob = problem_from_prompt(seqs[i, :PROMPT_LEN].tolist())
            toks = generated(seqs, lens, i)
            r = reward(prob, toks, fmt, w_correct, w_helpful, judge, tta_process_reward)
            out.append(r["r"])
            if log is not None:
                plan = trace_plan(toks, fmt)
                accepted.append(bool(r["r_helpful"]))
                right.append(plan is not None and validate_plan(prob, plan))
        if log is not None:
            wrong = [a for a, t in zip(accepted, right) if not t]
            log.append({"judge_accept": float(np.mean(accepted)), "plan_right": float(np.mean(right)),
                        "judge_false_accept": float(np.mean(wrong)) if wrong else float("nan")})
        return torch.tensor(out, device=seqs.device)
    return reward_fn


def trace_answer(toks: list[int], fmt: str) -> int | None:
    try:
        return parse_trace(toks, fmt)["answer"]
    except TraceError:
        return None


def trace_plan(toks: list[int], fmt: str):
    try:
        return parse_trace(toks, fmt)["plan"]
    except TraceError:
        return None


# ----------------------------------------------------------------------------------------------
# Rewind-and-Repeat
# ----------------------------------------------------------------------------------------------
@torch.no_grad()
def rewind_and_repeat(model: TinyTransformer, prompts: torch.Tensor, problems: list[Problem], max_new: int,
                      max_retries: int, t_plan: float, top_p: float, t_rest: float, seed: int,
                      judges: dict | None = None) -> dict:
    """Plan-first model, both Rewind-and-Repeat levels with up to ``max_retries`` retries, for every plan judge in
    ``judges`` (name -> ``judge(problem, plan) -> bool`` or an object with batched ``accept(problems, plans)``;
    default {"oracle": task.validate_plan}) on the SAME sampled attempts.

    Attempt k of every row uses its own generator (seed, k), so attempt 0 is the same sample for
    both levels and a run with R retries is a prefix of a run with more.
      plan level:   sample the pre-plan thought + plan (first <ans> … </ans>) at T = t_plan, top-p;
                    the judge rejects a bad plan, which is re-sampled (ALGO: R&R, plan level);
                    after the last retry the last plan is kept; the rest is decoded once at T = t_rest
                    (one decoding pass per attempt serves both levels: a plan's continuation is the
                    same sample whether the plan was kept by the plan-level or the answer-level loop).
      answer level: sample the whole trace (plan at t_plan, rest at t_rest); the whole-trace judge (the plan judge
                    on its plan AND ``task.steps_follow_plan``: the steps execute that plan through to the answer)
                    checks it; a rejected trace is re-sampled whole.
    Tokens count every attempt. Returns, per judge, per-R accuracy and mean tokens for both levels, the plan
    acceptance rate of attempt 0, and the judge's agreement with the rule-based oracle on every sampled plan
    (``judge_quality``: accuracy, precision, recall; positive = the plan is right)."""
    judges = {"oracle": validate_plan} if judges is None else judges
    dev = prompts.device
    B = prompts.shape[0]
    K = max_retries + 1
    plan_tok = torch.zeros(K, B, dtype=torch.long)
    full_tok = torch.zeros(K, B, dtype=torch.long)
    steps_ok = torch.zeros(K, B, dtype=torch.bool)        # the trace executes its own plan correctly
    correct = torch.zeros(K, B, dtype=torch.bool)         # final answer right (attempt k's plan kept)
    plans: list[list] = []                                # plans[k][i]: the parsed plan prefix (None: none)
    for k in range(K):
        g = torch.Generator(device=dev).manual_seed(seed * 1000 + k)
        seqs, lens = sample_batch(model, prompts, max_new, t_rest, 1.0, g, plan_temperature=t_plan,
                                  plan_top_p=top_p)
        row = []
        for i in range(B):
            toks = generated(seqs, lens, i)
            plan_tok[k, i] = toks.index(EANS) + 1 if EANS in toks else len(toks)   # pre-plan thought + plan
            row.append(_plan_prefix(toks))
            full_tok[k, i] = len(toks)
            steps_ok[k, i] = steps_follow_plan(problems[i], toks, "pf")
            correct[k, i] = trace_answer(toks, "pf") == problems[i].answer
        plans.append(row)
    rest_tok = full_tok - plan_tok
    flat_probs = [problems[i] for _ in range(K) for i in range(B)]
    flat_plans = [plans[k][i] for k in range(K) for i in range(B)]
    truth = torch.tensor([validate_plan(p, q) for p, q in zip(flat_probs, flat_plans)]).view(K, B)
    ar = torch.arange(B)
    results = {}
    for name, judge in judges.items():
        acc_flat = (judge.accept(flat_probs, flat_plans) if hasattr(judge, "accept")
                    else [q is not None and bool(judge(p, q)) for p, q in zip(flat_probs, flat_plans)])
        plan_ok = torch.as_tensor(acc_flat, dtype=torch.bool).view(K, B)
        full_ok = plan_ok & steps_ok                                         # whole-trace judge
        out = {"plan": {"acc": [], "tokens": []}, "answer": {"acc": [], "tokens": []}}
        for R in range(K):
            for level, ok in (("plan", plan_ok), ("answer", full_ok)):
                acc_k = ok[:R + 1].clone()
                acc_k[R] = True                                              # after the last retry: keep it
                kept = acc_k.float().argmax(0)                               # first accepted attempt (or R)
                used = torch.arange(K)[:, None] <= kept[None]                # attempts spent
                if level == "plan":
                    tokens = (plan_tok * used).sum(0) + rest_tok[kept, ar]  # plans tried + one rest
                else:
                    tokens = (full_tok * used).sum(0)
                out[level]["acc"].append(float(correct[kept, ar].float().mean()))
                out[level]["tokens"].append(float(tokens.float().mean()))
        tp = float((plan_ok & truth).sum())
        out["plan_accept_rate"] = float(plan_ok[0].float().mean())
        out["trace_accept_rate"] = float(full_ok[0].float().mean())
        out["attempt0_acc"] = float(correct[0].float().mean())
        out["judge_quality"] = {"accuracy": float((plan_ok == truth).float().mean()),
                                "precision": tp / max(1.0, float(plan_ok.sum())),
                                "recall": tp / max(1.0, float(truth.sum())), "n": int(truth.numel()),
                                "right_share": float(truth.float().mean())}
        results[name] = out
    return results


def _plan_prefix(toks: list[int]):
    """The plan of a (possibly unfinished) plan-first trace: the first <ans> … </ans>, right after the pre-plan
    thought ``<think> n [draft] </think>``."""
    if len(toks) < 4 or toks[0] != THINK or ETHINK not in toks[2:]:
        return None
    a = toks.index(ETHINK, 2) + 1                         # the plan's <ans>
    if a >= len(toks) or toks[a] != ANS or EANS not in toks[a + 1:]:
        return None
    return plan_pairs(toks[a + 1:a + 1 + toks[a + 1:].index(EANS)])


def tokens_to_target(tokens: list[float], acc: list[float], target: float) -> float:
    """Mean tokens at which an accuracy-vs-tokens curve (points in retry order) first reaches
    ``target`` (linear interpolation between the points around the crossing; inf if never)."""
    for r, (t, a) in enumerate(zip(tokens, acc)):
        if a >= target:
            if r == 0:
                return float(t)
            t0, a0 = tokens[r - 1], acc[r - 1]
            return float(t0 + (target - a0) / (a - a0) * (t - t0))
    return float("inf")
