"""Batched ISTA Lasso: Triton kernel (interpreter) vs torch reference vs scikit-learn's Lasso."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.linear_model import Lasso

from kernels.batched_lasso import MAX_D, BENCHMARKS_SMALL, batched_lasso, soft_threshold


def random_problems(P: int, d: int, n: int, seed: int, dtype=torch.float64):
    """Gram statistics G = XᵀX/n, b = Xᵀy/n of P random regressions with sparse truth, plus X, y."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(P, n, d, generator=gen, dtype=torch.float64)
    beta = torch.randn(P, d, generator=gen, dtype=torch.float64) * (torch.rand(P, d, generator=gen) < 0.4)
    y = (x @ beta[..., None])[..., 0] + torch.randn(P, n, generator=gen, dtype=torch.float64)
    gram = x.transpose(1, 2) @ x / n
    xty = (x.transpose(1, 2) @ y[..., None])[..., 0] / n
    alpha = torch.rand(P, generator=gen, dtype=torch.float64) * 0.3
    return gram.to(dtype), xty.to(dtype), alpha.to(dtype), x, y


@pytest.mark.parametrize("P,d,n", [(1, 1, 5), (5, 3, 9), (19, 10, 40), (7, 17, 70), (3, 33, 150), (2, 64, 300)])
def test_triton_matches_reference_odd_shapes(P, d, n):
    seed = int(torch.randint(0, 2**31 - 1, ()).item())  # fresh inputs every run
    gram, xty, alpha, _, _ = random_problems(P, d, n, seed)
    alpha[0] = 0.0  # include an unpenalised problem
    # a capped iteration budget: parity of the iteration itself, converged or not
    bk, ik = batched_lasso(gram, xty, alpha, max_iter=60, backend="triton", return_iters=True)
    br, ir = batched_lasso(gram, xty, alpha, max_iter=60, backend="torch", return_iters=True)
    torch.testing.assert_close(bk, br, atol=1e-9, rtol=1e-9)
    assert torch.equal(ik, ir), "kernel and reference must run the same number of ISTA steps"


def test_triton_matches_reference_float32():
    gram, xty, alpha, _, _ = random_problems(13, 6, 25, seed=3, dtype=torch.float32)
    bk = batched_lasso(gram, xty, alpha, tol=1e-6, backend="triton")
    br = batched_lasso(gram, xty, alpha, tol=1e-6, backend="torch")
    assert bk.dtype == torch.float32
    torch.testing.assert_close(bk, br, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_matches_sklearn_lasso(backend):
    gram, xty, alpha, x, y = random_problems(6, 8, 60, seed=11)
    alpha = alpha + 0.02
    beta = batched_lasso(gram, xty, alpha, tol=1e-13, max_iter=100_000, backend=backend)
    for p in range(6):
        ref = Lasso(alpha=float(alpha[p]), fit_intercept=False, tol=1e-14, max_iter=1_000_000)
        ref.fit(x[p].numpy(), y[p].numpy())
        np.testing.assert_allclose(beta[p].numpy(), ref.coef_, atol=1e-6, rtol=0)
        assert np.array_equal(beta[p].numpy() != 0, ref.coef_ != 0), f"problem {p}: supports differ"
    assert (beta == 0).any() and (beta != 0).any(), "test should exercise both active and inactive coordinates"


def test_kkt_conditions_hold():
    gram, xty, alpha, _, _ = random_problems(16, 12, 80, seed=5)
    beta = batched_lasso(gram, xty, alpha, tol=1e-13, max_iter=100_000)
    grad = torch.einsum("pij,pj->pi", gram, beta) - xty
    active = beta != 0
    # stationarity: G β − b = −α sign(β) on the support, |G β − b| <= α off it
    assert torch.allclose(grad[active], -(alpha[:, None].expand_as(beta) * beta.sign())[active], atol=1e-9)
    assert bool((grad[~active].abs() <= alpha[:, None].expand_as(beta)[~active] + 1e-9).all())


def test_limits_zero_penalty_is_least_squares_and_large_penalty_is_zero():
    gram, xty, _, _, _ = random_problems(4, 5, 30, seed=2)
    ols = torch.linalg.solve(gram, xty[..., None])[..., 0]
    torch.testing.assert_close(batched_lasso(gram, xty, 0.0, tol=1e-14, max_iter=100_000), ols, atol=1e-9, rtol=0)
    big = xty.abs().amax(-1) * 1.0001  # α >= ‖b‖∞ makes β = 0 optimal
    assert bool((batched_lasso(gram, xty, big) == 0).all())


def test_soft_threshold():
    z = torch.tensor([-3.0, -0.5, 0.0, 0.2, 2.0])
    assert torch.equal(soft_threshold(z, torch.tensor(1.0)), torch.tensor([-2.0, 0.0, 0.0, 0.0, 1.0]))


def test_bad_inputs_raise_clear_errors():
    gram, xty, alpha, _, _ = random_problems(3, 4, 10, seed=0)
    with pytest.raises(ValueError, match="alpha.*>= 0"):
        batched_lasso(gram, xty, -0.1)
    with pytest.raises(ValueError, match="xty"):
        batched_lasso(gram, xty[:, :3], alpha)
    with pytest.raises(ValueError, match="alpha"):
        batched_lasso(gram, xty, alpha[:2])
    with pytest.raises(ValueError, match="gram"):
        batched_lasso(gram[:, :, :3], xty, alpha)
    big = torch.eye(MAX_D + 1, dtype=torch.float64)[None]
    with pytest.raises(ValueError, match=f"d <= {MAX_D}"):
        batched_lasso(big, torch.ones(1, MAX_D + 1, dtype=torch.float64), 0.1, backend="triton")


def test_small_benchmark_cases_run():
    for _, make, kern, ref, nbytes, flops in BENCHMARKS_SMALL:
        inputs = make("cpu")
        torch.testing.assert_close(kern(*inputs), ref(*inputs), atol=1e-9, rtol=1e-9)
        assert nbytes > 0 and flops > 0


def test_step_sizes_in_chunks_equal_one_call(monkeypatch):
    """ista_step_sizes computes the eigenvalues EIGH_CHUNK problems at a time (cuSOLVER's batched syev failed on
    65,536 problems in one call on an H200): chunked and unchunked agree, also when P is not a multiple of the chunk."""
    import kernels.batched_lasso as bl

    g = torch.Generator().manual_seed(3)
    x = torch.randn(11, 9, 5, generator=g, dtype=torch.float64)
    gram = x.transpose(1, 2) @ x * 1.7
    want = 1.0 / torch.linalg.eigvalsh(gram).amax(-1)
    monkeypatch.setattr(bl, "EIGH_CHUNK", 4)
    torch.testing.assert_close(bl.ista_step_sizes(gram), want, rtol=1e-12, atol=0)
    assert bl.ista_step_sizes(gram[:0]).shape == (0,)
