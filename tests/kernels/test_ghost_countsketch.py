"""kernels/ghost_countsketch.py: Triton (interpreter) vs reference, exactness vs dense, unbiasedness, ghost identity."""
from __future__ import annotations

import pytest
import torch
from torch.func import functional_call, grad, vmap

from kernels.ghost_countsketch import (BENCHMARKS, BENCHMARKS_SMALL, countsketch, ghost_countsketch,
                                       ghost_countsketch_reference, make_countsketch)
from kernels.testing import assert_close, check_parity


def _inputs(b, t, di, do, m, seed):
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(b, t, di, generator=gen)
    g = torch.randn(b, t, do, generator=gen)
    d = torch.rand(do, di, generator=gen) + 0.1
    h, s = make_countsketch(do, di, m, gen)
    return a, g, d, h, s


@pytest.mark.parametrize("b,t,di,do,m", [(3, 19, 37, 45, 53), (1, 1, 5, 3, 1), (5, 33, 70, 17, 7), (2, 7, 33, 65, 300)])
def test_triton_matches_reference_odd_shapes(b, t, di, do, m):
    a, g, d, h, s = _inputs(b, t, di, do, m, seed=b * 1000 + t)
    check_parity(lambda a, g, d: ghost_countsketch(a, g, d, h, s, m, backend="triton"),
                 lambda a, g, d: ghost_countsketch(a, g, d, h, s, m, backend="torch"),
                 [a, g, d], atol=1e-4, rtol=1e-4, grads=False)


def test_triton_handles_strided_inputs():
    a, g, d, h, s = _inputs(4, 12, 40, 24, 16, seed=7)
    a_t = a.transpose(0, 1).contiguous().transpose(0, 1)  # same values, non-contiguous strides
    assert not a_t.is_contiguous()
    assert_close(ghost_countsketch(a_t, g, d, h, s, 16, backend="triton"),
                 ghost_countsketch_reference(a, g, d, h, s, 16), 1e-4, 1e-4)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_sketch_equals_countsketch_of_dense_preconditioned_gradients(backend):
    a, g, d, h, s = _inputs(4, 9, 11, 13, 5, seed=3)
    dense = torch.einsum("bto,bti->boi", g, a) * d  # D ⊙ Σ_t g_t a_tᵀ per sample
    manual = torch.zeros(4, 5)
    for b in range(4):
        for i in range(13):
            for j in range(11):
                manual[b, h[i, j]] += s[i, j] * dense[b, i, j]
    assert_close(ghost_countsketch(a, g, d, h, s, 5, backend=backend), manual, 1e-4, 1e-4)
    assert_close(countsketch(dense, h, s, 5), manual, 1e-4, 1e-4)


def test_countsketch_inner_product_is_unbiased():
    gen = torch.Generator().manual_seed(0)
    u, v = torch.randn(6, 7, generator=gen), torch.randn(6, 7, generator=gen)
    v = v + 0.8 * u  # correlated, so <u, v> is far from 0
    draws = []
    for _ in range(3000):
        h, s = make_countsketch(6, 7, 5, gen)
        draws.append(float(countsketch(u, h, s, 5) @ countsketch(v, h, s, 5)))
    draws = torch.tensor(draws)
    exact = float((u * v).sum())
    stderr = float(draws.std() / len(draws) ** 0.5)
    assert abs(float(draws.mean()) - exact) < 4 * stderr, (float(draws.mean()), exact, stderr)
    # a single sketch is not exact (m = 5 < 42 entries), so the check above is not vacuous
    assert float(draws.std()) > 0.05 * abs(exact)


def test_kernel_on_hooked_activations_equals_torch_func_per_sample_gradients():
    """Ghost capture (a, b of a linear layer) + kernel == CountSketch of torch.func per-sample grads."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 9, bias=False), torch.nn.Tanh(), torch.nn.Linear(9, 4, bias=False))
    x = torch.randn(5, 3, 6)  # (B, T, d_in)
    y = torch.randn(5, 3, 4)
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss_one(p, xb, yb):
        return ((functional_call(model, p, (xb,)) - yb) ** 2).sum()

    per_sample = vmap(grad(loss_one), in_dims=(None, 0, 0))(params, x, y)  # torch.func reference
    acts = {}
    hooks = [model[i].register_forward_hook(lambda m, inp, out, i=i: acts.__setitem__(i, (inp[0], out))) for i in (0, 2)]
    out = model(x)
    for hk in hooks:
        hk.remove()
    loss = ((out - y) ** 2).sum()
    grads = torch.autograd.grad(loss, [acts[0][1], acts[2][1]])
    gen = torch.Generator().manual_seed(1)
    for layer, b in zip((0, 2), grads):
        a = acts[layer][0].detach()
        w = model[layer].weight
        d = torch.rand_like(w) + 0.5
        h, s = make_countsketch(*w.shape, 11, gen)
        want = countsketch(per_sample[f"{layer}.weight"] * d, h, s, 11)
        for backend in ("torch", "triton"):
            assert_close(ghost_countsketch(a, b, d, h, s, 11, backend=backend), want, 1e-4, 1e-4, f"layer {layer}")


def test_bad_shapes_and_sizes_fail_clearly():
    a, g, d, h, s = _inputs(2, 3, 4, 5, 6, seed=0)
    with pytest.raises(ValueError, match="precond"):
        ghost_countsketch(a, g, d.T, h, s, 6)
    with pytest.raises(ValueError, match="sketch size"):
        ghost_countsketch(a, g, d, h, s, 0)
    with pytest.raises(ValueError, match="sketch size"):
        make_countsketch(3, 3, 0)


def test_benchmark_cases_are_declared():
    assert BENCHMARKS and BENCHMARKS_SMALL
    label, make, kern, ref, nbytes, flops = BENCHMARKS_SMALL[0]
    inputs = make("cpu")
    assert_close(kern(*inputs), ref(*inputs), 1e-4, 1e-4)
    assert nbytes > 0 and flops > 0
