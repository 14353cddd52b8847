"""justgrpo: task correctness against Python's own arithmetic, the samplers' order semantics, the
exactness of the AR likelihood under the dLLM (vs the rollout's own log-probs), the unbiased pass@k
estimator against brute-force enumeration, the flexibility-trap mechanism on a stub dLLM, the
smoke pipeline end to end, and bad-input errors at config load."""
from __future__ import annotations

import itertools
import json
from math import ceil

import numpy as np
import pytest
import torch

from stages.common.config import ConfigError, validate
from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig
from stages.justgrpo import evaluate, prepare, train
from stages.justgrpo.dllm import ar_logprobs, decode, onestep_logprobs, reward_fn
from stages.justgrpo.task import (EOS, HASH, MASK, PLUS, TIMES, VOCAB_SIZE, all_prompts, answers, extract_answer,
                                  MOD, is_fork, solution, valid_orders, value)

OPS = {PLUS: "+", TIMES: "*"}


def test_task_values_and_solutions_match_python_arithmetic():
    rows = all_prompts()
    assert len(rows) == 2 * 2 * MOD ** 3
    for a, o1, b, o2, c in rows[::7].tolist():
        truth = eval(f"{a}{OPS[o1]}{b}{OPS[o2]}{c}") % MOD            # independent reference
        assert value(a, o1, b, o2, c) == truth
        for order in valid_orders(o1, o2):
            sol = solution(a, o1, b, o2, c, order, 16)
            assert len(sol) == 16 and sol[-2:] == [EOS, EOS]
            # each written step "x o y = z" is right mod 10, and the answer after '#' is the truth
            for s in (sol[0:5], sol[6:11]):
                assert eval(f"{s[0]}{OPS[s[1]]}{s[2]}") % MOD == s[4]
            assert int(extract_answer(torch.tensor([sol]))[0]) == truth


def test_forks_are_exactly_the_two_order_prompts():
    rows = torch.as_tensor(all_prompts())
    fork = is_fork(rows)
    for r, f in zip(rows.tolist()[::11], fork.tolist()[::11]):
        firsts = {solution(*r, o, 14)[0] for o in valid_orders(r[1], r[3])}
        assert f == (len(firsts) == 2)


def test_extract_answer_and_reward():
    gen = torch.tensor([[1, HASH, 2, EOS], [HASH, MASK, 3, 3], [1, 2, 3, 4]])
    assert extract_answer(gen).tolist() == [2, -1, -1]
    p = torch.tensor([[3, PLUS, 4, TIMES, 1]] * 3)               # 3 + 4 = 7 = 2 mod 5
    assert reward_fn(None, {"prompts": p, "tokens": gen}).tolist() == [1.0, -1.0, -1.0]


def _model(seed=0, std=0.3):
    torch.manual_seed(seed)
    return TinyTransformer(TinyTransformerConfig(vocab_size=VOCAB_SIZE, d_model=24, n_layers=2, n_heads=2,
                                                 max_seq_len=21, causal=False, init_std=std)).eval()


def test_ar_likelihood_is_exact_for_block1_rollouts():
    """JustGRPO's loss likelihood equals the log-prob each token had when the AR rollout sampled it;
    the one-step surrogate does not (the gap the baseline ignores)."""
    m = _model()
    p = torch.as_tensor(all_prompts()[[3, 50, 123, 499, 17]])
    g = torch.Generator().manual_seed(5)
    gen, info = decode(m, p, 16, 1, 1, 1.0, g)
    assert torch.equal(info["step"], torch.arange(16).expand(5, 16))  # strictly left to right
    torch.testing.assert_close(ar_logprobs(m, p, gen), info["logp"], atol=1e-5, rtol=1e-5)
    # brute force for one position: rebuild [prompt, y_<t, MASK...] by hand
    t = 6
    x = torch.cat([p[1], gen[1, :t], torch.full((16 - t,), MASK)])[None]
    logits = m(x)[0, 5 + t].clone()
    logits[MASK] = -1e4
    assert abs(float(torch.log_softmax(logits, -1)[gen[1, t]]) - float(ar_logprobs(m, p, gen)[1, t])) < 1e-5
    assert (onestep_logprobs(m, p, gen) - info["logp"]).abs().max() > 1e-2


@pytest.mark.parametrize("gen_len,block,k", [(14, 7, 1), (14, 7, 2), (14, 7, 4), (16, 16, 3), (15, 4, 4)])
def test_semi_ar_blocks_and_tokens_per_step(gen_len, block, k):
    m = _model(1)
    p = torch.as_tensor(all_prompts()[:3])
    gen, info = decode(m, p, gen_len, block, k, 0.0)
    sizes = [min(block, gen_len - b0) for b0 in range(0, gen_len, block)]
    assert info["n_steps"] == sum(ceil(s / k) for s in sizes)
    assert (gen != MASK).all()
    step = info["step"]
    for i, b0 in enumerate(range(block, gen_len, block)):          # block j only after block j-1 is done
        assert (step[:, b0:].min(1).values > step[:, :b0].max(1).values).all()
    counts = torch.stack([(step == s).sum(1) for s in range(info["n_steps"])], 1)
    assert counts.max() <= k


class StubDLLM(torch.nn.Module):
    """A 'dLLM' whose position 0 is a fork (two equally likely digits) and every other position
    is confident, whatever the context: low-confidence decoding must postpone the fork."""

    def forward(self, x):
        B, T = x.shape
        logits = torch.full((B, T, VOCAB_SIZE), -40.0)
        logits[:, :, 1] = 5.0
        logits[:, 5, 1] = 0.0
        logits[:, 5, 2] = 0.0
        return logits


def test_flexibility_trap_mechanism_on_stub():
    p = torch.zeros(64, 5, dtype=torch.long)
    g = torch.Generator().manual_seed(0)
    _, ar = decode(StubDLLM(), p, 14, 1, 1, 1.0, g)
    _, arb = decode(StubDLLM(), p, 14, 14, 1, 1.0, g)
    assert (ar["step"][:, 0] == 0).all()
    assert (arb["step"][:, 0] == 13).all()                          # the fork is decoded last
    assert torch.allclose(ar["entropy"][:, 0], torch.full((64,), float(np.log(2))), atol=1e-3)


def test_pass_at_k_matches_enumeration():
    for n, c, k in [(6, 2, 3), (7, 0, 2), (5, 5, 5), (8, 3, 1), (9, 4, 6)]:
        samples = [1] * c + [0] * (n - c)
        subsets = list(itertools.combinations(range(n), k))
        brute = sum(any(samples[i] for i in s) for s in subsets) / len(subsets)
        assert abs(evaluate.pass_at_k(n, np.array([c]), k)[0] - brute) < 1e-12


@pytest.mark.parametrize("cfg_cls,block,needle", [
    (prepare.Config, {"gen_len": 10}, "gen_len"),
    (train.Config, {"rl": {"grpo": {"group_size": 1}}}, "rl.grpo.group_size"),
    (evaluate.Config, {"n_samples": 16, "ks": [1, 4, 64]}, "ks"),
    (evaluate.Config, {"tokens_per_step": [1, 8], "eval_block": 4}, "tokens_per_step"),
    (train.Config, {"model": {"d_model": 48, "n_heads": 5}}, "n_heads"),
    (prepare.Config, {"seeds": [1, 1]}, "seeds"),
])
def test_bad_params_name_the_key(cfg_cls, block, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        validate(cfg_cls, block, "papers.justgrpo.x")


def test_smoke_pipeline(smoke_run):
    out = smoke_run("justgrpo")
    metrics = json.loads((out["report"] / "metrics.json").read_text())
    names = {c["name"] for c in metrics["claims"]}
    assert {"ar_coverage_at_large_k", "justgrpo_beats_arbitrary_grpo", "gain_survives_parallel"} <= names
    assert metrics["kernels"]["token_logprob"]["calls"] > 0
    assert (out["report"] / "figures" / "passk_curves.png").exists()
    ev = metrics["metrics"]
    assert set(ev["acc"]) == {"base", "justgrpo", "arbitrary"} and set(ev["acc"]["base"]) == {"tps1", "tps2", "tps4"}
