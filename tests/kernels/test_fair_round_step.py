"""kernels/fair_round_step.py: Triton (interpreter) vs reference (exact actions/counters), brute force."""
from __future__ import annotations

import itertools

import pytest
import torch

from kernels.fair_round_step import BENCHMARKS, BENCHMARKS_SMALL, fair_round_step, random_inputs


def _assert_same(a, b):
    assert torch.equal(a.action, b.action)
    assert torch.equal(a.reward, b.reward)
    assert torch.equal(a.counts, b.counts)
    assert torch.equal(a.succ, b.succ)
    assert torch.equal(a.any_feasible, b.any_feasible)
    torch.testing.assert_close(a.lam, b.lam, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("B,K,J,C,ties", [(37, 10, 3, 8, False), (5, 7, 1, 3, True), (1, 1, 2, 1, False),
                                           (19, 33, 3, 5, True), (64, 3, 4, 8, True)])
def test_triton_matches_reference_exactly_on_odd_shapes(B, K, J, C, ties):
    inputs = random_inputs(B, K, J, C, seed=B * 7 + K, ties=ties)
    _assert_same(fair_round_step(*inputs, backend="triton"), fair_round_step(*inputs, backend="torch"))


def test_float32_inputs_and_inputs_left_untouched():
    inputs = random_inputs(23, 9, 3, 8, seed=5, dtype=torch.float32, ties=True)
    before = [x.clone() for x in inputs]
    tri, ref = fair_round_step(*inputs, backend="triton"), fair_round_step(*inputs, backend="torch")
    _assert_same(tri, ref)
    for x, y in zip(inputs, before):
        assert torch.equal(x, y)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_against_brute_force_loop(backend):
    score, eff, xi, tau, explore, mixer, u, p_true, ctx, counts, succ, lam, eta, lam_max = inputs = \
        random_inputs(29, 6, 3, 4, seed=11, ties=True)
    out = fair_round_step(*inputs, backend=backend)
    for b in range(29):
        feas = [all(abs(float(eff[b, j, k])) - float(xi[b, j, k]) < float(tau[b]) for j in range(3)) for k in range(6)]
        allowed = [k for k in range(6) if feas[k]] or list(range(6))
        # official rule: lexsort by (ucb, mixer), take the largest
        a = max(allowed, key=lambda k: (float(score[b, k]), float(mixer[b, k]), -k))
        if int(explore[b]) >= 0:
            a = int(explore[b])
        assert int(out.action[b]) == a
        r = float(u[b]) < float(p_true[b, a])
        assert float(out.reward[b]) == float(r)
        assert bool(out.any_feasible[b]) == any(feas)
        want = counts[b].clone()
        want[int(ctx[b]), a] += 1
        assert torch.equal(out.counts[b], want)
        assert float(out.succ[b, int(ctx[b]), a]) == float(succ[b, int(ctx[b]), a]) + r
        for j in range(3):
            lv = float(lam[b, j]) + float(eta[b]) * (abs(float(eff[b, j, a])) - float(tau[b]))
            assert abs(float(out.lam[b, j]) - min(max(lv, 0.0), float(lam_max[b]))) < 1e-12


def test_unconstrained_rows_pick_the_overall_argmax_and_infeasible_rows_fall_back():
    B, K = 4, 5
    score = torch.tensor([[0.1, 0.9, 0.3, 0.2, 0.0]] * B, dtype=torch.float64)
    eff = torch.zeros(B, 3, K, dtype=torch.float64)
    eff[:, 0, 1] = 0.5                        # the best arm is unfair
    xi = torch.zeros(B, 3, K, dtype=torch.float64)
    xi[0] = torch.inf                         # unconstrained
    tau = torch.tensor([0.1, 0.1, 0.0, 0.6], dtype=torch.float64)  # row 2: tau = 0, nothing fair
    z = lambda *s: torch.zeros(*s, dtype=torch.float64)  # noqa: E731
    args = (score, eff, xi, tau, torch.full((B,), -1), z(B, K), z(B), z(B, K), torch.zeros(B, dtype=torch.long),
            torch.zeros(B, 1, K, dtype=torch.long), z(B, 1, K), z(B, 3), z(B), z(B))
    for backend in ("torch", "triton"):
        out = fair_round_step(*args, backend=backend)
        assert out.action.tolist() == [1, 2, 1, 1]
        assert out.any_feasible.tolist() == [True, True, False, True]


def test_bad_shapes_fail_clearly():
    inputs = list(random_inputs(4, 5, 3, 2))
    inputs[3] = inputs[3][:2]
    with pytest.raises(ValueError, match="tau"):
        fair_round_step(*inputs)
    inputs = list(random_inputs(4, 5, 3, 2))
    inputs[3] = torch.full_like(inputs[3], torch.inf)
    with pytest.raises(ValueError, match="finite"):
        fair_round_step(*inputs)


def test_benchmark_cases_are_declared():
    assert BENCHMARKS and BENCHMARKS_SMALL
    label, make, kern, ref, nbytes, flops = BENCHMARKS_SMALL[0]
    _assert_same(kern(*make("cpu")), ref(*make("cpu")))
    assert nbytes > 0 and flops > 0
