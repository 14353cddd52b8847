"""Parity of the fused token log-prob kernel (Triton under TRITON_INTERPRET=1) with its torch
reference on odd shapes (values, gradients, temperature ≠ 1, ignore_index, entropy), plus
independent checks of the reference against a hand computation."""
from __future__ import annotations

import math

import pytest
import torch

from kernels.testing import assert_close, check_parity
from kernels.token_logprob import token_logprob, token_logprob_reference


def _inputs(shape, v, seed, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    logits = scale * torch.randn(*shape, v, generator=g)
    targets = torch.randint(0, v, shape, generator=g)
    return logits, targets


@pytest.mark.parametrize("shape,v,temp", [((1,), 1, 1.0), ((5,), 7, 0.7), ((3, 11), 37, 1.3),
                                          ((2, 3, 5), 130, 1.0), ((19,), 301, 2.5)])
def test_value_and_grad_parity(shape, v, temp):
    logits, targets = _inputs(shape, v, seed=v + len(shape))
    check_parity(lambda x: token_logprob(x, targets, temperature=temp, backend="triton"),
                 lambda x: token_logprob_reference(x, targets, temperature=temp), [logits],
                 atol=2e-5, rtol=1e-4)


def test_ignore_index_rows_are_zero_with_zero_grad():
    logits, targets = _inputs((9,), 23, seed=3)
    targets[[1, 4]] = -100
    x = logits.clone().requires_grad_(True)
    out = token_logprob(x, targets, backend="triton")
    assert out[1] == 0 and out[4] == 0
    out.sum().backward()
    assert x.grad[[1, 4]].abs().max() == 0
    check_parity(lambda z: token_logprob(z, targets, backend="triton"),
                 lambda z: token_logprob_reference(z, targets), [logits], atol=2e-5, rtol=1e-4)


def test_entropy_parity_and_hand_value():
    logits, targets = _inputs((4, 6), 45, seed=9)
    lp_t, ent_t = token_logprob(logits, targets, temperature=0.8, with_entropy=True, backend="triton")
    lp_r, ent_r = token_logprob_reference(logits, targets, temperature=0.8, with_entropy=True)
    assert_close(lp_t, lp_r, 2e-5, 1e-4, "logp")
    assert_close(ent_t, ent_r, 2e-5, 1e-4, "entropy")
    # uniform logits: H = log V exactly
    _, ent = token_logprob(torch.zeros(3, 45), torch.zeros(3, dtype=torch.long), with_entropy=True,
                           backend="triton")
    assert torch.allclose(ent, torch.full((3,), math.log(45)), atol=1e-5)


def test_reference_against_hand_computation():
    logits = torch.tensor([[1.0, 2.0, 4.0]])
    t = 2.0
    z = [0.5, 1.0, 2.0]
    lse = math.log(sum(math.exp(v) for v in z))
    out = token_logprob_reference(logits, torch.tensor([1]), temperature=t)
    assert abs(float(out) - (1.0 - lse)) < 1e-6
    # gradient = (onehot − softmax) / T
    x = logits.clone().requires_grad_(True)
    token_logprob(x, torch.tensor([1]), temperature=t, backend="triton").sum().backward()
    p = [math.exp(v - lse) for v in z]
    expect = torch.tensor([[(0 - p[0]) / t, (1 - p[1]) / t, (0 - p[2]) / t]])
    assert torch.allclose(x.grad, expect, atol=1e-6)


def test_non_contiguous_and_half_inputs():
    logits, targets = _inputs((6,), 40, seed=5)
    wide = torch.randn(6, 80)
    wide[:, ::2] = logits
    view = wide[:, ::2]                      # stride 2 in the vocabulary dim
    assert_close(token_logprob(view, targets, backend="triton"), token_logprob_reference(logits, targets),
                 2e-5, 1e-4, "strided")
    half = logits.to(torch.bfloat16)
    assert_close(token_logprob(half, targets, backend="triton"), token_logprob_reference(half, targets),
                 1e-4, 1e-4, "bf16")


def test_bad_shapes():
    with pytest.raises(ValueError, match="must agree"):
        token_logprob(torch.zeros(3, 5), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="temperature"):
        token_logprob(torch.zeros(3, 5), torch.zeros(3, dtype=torch.long), temperature=0.0)


def test_bench_entries_run_small():
    from kernels.token_logprob import BENCHMARKS_SMALL

    for _, make, kern, ref, _, _ in BENCHMARKS_SMALL:
        inputs = make("cpu")
        kern(*inputs)
        ref(*inputs)
