"""Batched FTRL dynamics kernel: Triton (interpreter) vs torch reference on odd shapes; the
regularized responses against independent solvers (scipy) and closed forms."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from kernels.ftrl_dynamics import (BENCHMARKS_SMALL, ftrl_run, logbarrier_response, ne_gap, ne_gap_reference,
                                   project_simplex, regularized_response)


def _inputs(B, n, seed, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    A = torch.rand(B, n, n, generator=gen, dtype=torch.float64) * 2 - 1
    ux = torch.randn(B, n, generator=gen, dtype=torch.float64) * scale
    uy = torch.randn(B, n, generator=gen, dtype=torch.float64) * scale
    eta = torch.rand(B, generator=gen, dtype=torch.float64) * 2 + 0.2      # η ≠ 1
    return A, ux, uy, eta


@pytest.mark.parametrize("reg,steps,B,n", [("entropic", 5, 3, 5), ("fp", 5, 2, 11), ("euclidean", 2, 2, 7),
                                          ("logbarrier", 2, 3, 5)])
def test_triton_matches_reference(reg, steps, B, n):
    seed = int(torch.randint(0, 2**31 - 1, ()).item())  # fresh inputs every run
    A, ux, uy, eta = _inputs(B, n, seed)
    eps = torch.full((B,), 1e-9, dtype=torch.float64)
    for schedule, alt in (("constant", False), ("sqrt", True)):
        k = ftrl_run(A, ux, uy, eta, eps, steps, reg, schedule, alt, every=2, backend="triton")
        r = ftrl_run(A, ux, uy, eta, eps, steps, reg, schedule, alt, every=2, backend="torch")
        assert torch.equal(k["hit"], r["hit"])
        for key in ("x", "y", "phi", "gap"):
            torch.testing.assert_close(k[key], r[key], atol=1e-10, rtol=1e-9, equal_nan=True)


def test_identical_hitting_times_with_early_stops():
    # pure coordination games: fictitious play stops at different t per game; both paths agree
    A = torch.stack([torch.diag(torch.tensor([0.3, 0.9, 0.5, 0.1], dtype=torch.float64)),
                     torch.diag(torch.tensor([0.2, 0.2, 0.8, 0.4], dtype=torch.float64))])
    z = torch.zeros(2, 4, dtype=torch.float64)
    eta = torch.tensor([1.5, 0.7], dtype=torch.float64)
    eps = torch.tensor([0.05, 0.05], dtype=torch.float64)
    for reg in ("entropic", "fp"):
        k = ftrl_run(A, z, z, eta, eps, 40, reg, every=3, backend="triton")
        r = ftrl_run(A, z, z, eta, eps, 40, reg, every=3, backend="torch")
        assert torch.equal(k["hit"], r["hit"]) and bool((r["hit"] > 0).all())
        torch.testing.assert_close(k["x"], r["x"], atol=1e-12, rtol=0)


def test_ne_gap_parity_and_brute_force():
    A, _, _, _ = _inputs(7, 9, 3)
    gen = torch.Generator().manual_seed(1)
    x = torch.softmax(torch.randn(7, 9, generator=gen, dtype=torch.float64), -1)
    y = torch.softmax(torch.randn(7, 9, generator=gen, dtype=torch.float64), -1)
    g = ne_gap(A, x, y, backend="triton")
    torch.testing.assert_close(g, ne_gap_reference(A, x, y), atol=1e-13, rtol=0)
    for b in range(7):  # brute force: best pure deviation of each player
        An, xn, yn = A[b].numpy(), x[b].numpy(), y[b].numpy()
        v = xn @ An @ yn
        best = max(max(An[i] @ yn for i in range(9)), max(xn @ An[:, j] for j in range(9)))
        assert abs((best - v) - float(g[b])) < 1e-12
        assert float(g[b]) >= 0


def test_projection_matches_scipy():
    gen = torch.Generator().manual_seed(4)
    z = torch.randn(5, 7, generator=gen, dtype=torch.float64) * 1.7
    p = project_simplex(z)
    for b in range(5):
        res = minimize(lambda v: 0.5 * np.sum((v - z[b].numpy()) ** 2), np.full(7, 1 / 7),
                       constraints=[{"type": "eq", "fun": lambda v: v.sum() - 1}], bounds=[(0, None)] * 7,
                       method="SLSQP", options={"ftol": 1e-14, "maxiter": 500})
        np.testing.assert_allclose(p[b].numpy(), res.x, atol=1e-6)


def test_logbarrier_kkt_and_scipy():
    gen = torch.Generator().manual_seed(5)
    z = torch.randn(4, 6, generator=gen, dtype=torch.float64) * 3.0
    x = logbarrier_response(z)
    assert torch.allclose(x.sum(-1), torch.ones(4, dtype=torch.float64), atol=1e-14)
    lam = 1.0 / x + z                       # KKT: 1/x_i + z_i = λ for every i
    assert float((lam - lam.mean(-1, keepdim=True)).abs().max()) < 1e-9
    res = minimize(lambda v: -(z[0].numpy() @ v + np.log(v).sum()), np.full(6, 1 / 6),
                   constraints=[{"type": "eq", "fun": lambda v: v.sum() - 1}], bounds=[(1e-12, 1)] * 6,
                   method="SLSQP", options={"ftol": 1e-15, "maxiter": 1000})
    np.testing.assert_allclose(x[0].numpy(), res.x, atol=1e-5)


def test_entropic_is_mwu_closed_form():
    # FTRL with entropy from U_0 = 0 equals multiplicative weights x_{t+1} ∝ x_t · exp(η u_t)
    A, _, _, _ = _inputs(1, 4, 9)
    z = torch.zeros(1, 4, dtype=torch.float64)
    eta = 0.37
    out = ftrl_run(A, z, z, torch.tensor([eta], dtype=torch.float64), torch.tensor([1e-12], dtype=torch.float64),
                   5, "entropic", backend="torch")
    x = np.full(4, 0.25); y = np.full(4, 0.25); An = A[0].numpy()
    for _ in range(4):
        x, y = x * np.exp(eta * An @ y), y * np.exp(eta * An.T @ x)
        x, y = x / x.sum(), y / y.sum()
    np.testing.assert_allclose(out["x"][0].numpy(), x, atol=1e-12)
    np.testing.assert_allclose(out["y"][0].numpy(), y, atol=1e-12)


def test_fp_ties_lowest_index_and_responses_permutation_invariant():
    z = torch.tensor([[0.5, 1.0, 1.0, -2.0]], dtype=torch.float64)
    assert regularized_response(z, "fp").tolist() == [[0.0, 1.0, 0.0, 0.0]]
    zero = torch.zeros(1, 5, dtype=torch.float64)
    for reg in ("entropic", "euclidean", "logbarrier"):  # the uniform start of every such regularizer
        torch.testing.assert_close(regularized_response(zero, reg), torch.full((1, 5), 0.2, dtype=torch.float64))


def test_bad_inputs():
    A, ux, uy, eta = _inputs(2, 3, 0)
    with pytest.raises(ValueError, match="eps"):
        ftrl_run(A, ux, uy, eta, torch.zeros(2, dtype=torch.float64), 5, backend="torch")
    with pytest.raises(ValueError, match="reg"):
        ftrl_run(A, ux, uy, eta, torch.ones(2, dtype=torch.float64), 5, reg="tsallis", backend="torch")
    with pytest.raises(ValueError, match="A"):
        ftrl_run(A[:, :2], ux, uy, eta, torch.ones(2, dtype=torch.float64), 5, backend="torch")


def test_bench_small_runs():
    for label, make, kern, ref, _, _ in BENCHMARKS_SMALL:
        inputs = make("cpu")
        torch.testing.assert_close(kern(*inputs)["x"], ref(*inputs)["x"], atol=1e-10, rtol=0)


def test_fp_tie_priorities_triton_matches_reference_and_prefers_the_highest():
    """Random tie-breaking: with per-run priority permutations the Triton path (interpreter) and the
    reference give identical trajectories, and ties go to the highest priority."""
    gen = torch.Generator().manual_seed(3)
    B, n = 5, 6
    A = torch.randint(-2, 3, (B, n, n), generator=gen).to(torch.float64)      # integer payoffs: many ties
    z = torch.zeros(B, n, dtype=torch.float64)
    px = torch.stack([torch.randperm(n, generator=gen) for _ in range(B)]).to(torch.float64)
    py = torch.stack([torch.randperm(n, generator=gen) for _ in range(B)]).to(torch.float64)
    args = (A, z, z.clone(), torch.ones(B, dtype=torch.float64), torch.full((B,), 1e-9, dtype=torch.float64), 9, "fp")
    ref = ftrl_run(*args, every=1, backend="torch", prio_x=px, prio_y=py)
    tri = ftrl_run(*args, every=1, backend="triton", prio_x=px, prio_y=py)
    assert torch.equal(ref["hit"], tri["hit"]) and torch.equal(ref["x"], tri["x"]) and torch.equal(ref["y"], tri["y"])
    one = ftrl_run(A, z, z.clone(), torch.ones(B, dtype=torch.float64), torch.full((B,), 1e-9, dtype=torch.float64), 1,
                   "fp", every=1, backend="torch", prio_x=px, prio_y=py)
    assert torch.equal(one["x"].argmax(1), px.argmax(1)) and torch.equal(one["y"].argmax(1), py.argmax(1))
    with pytest.raises(ValueError, match="prio_x"):
        ftrl_run(*args, backend="torch", prio_x=px[:, :3])
