"""Game constructions against brute force; bad inputs give clear errors."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from stages.ftrl_potential.dynamics import multi_fp_hitting_time, multi_gap
from stages.ftrl_potential.games import (GameError, chain_cells, chain_game, check_identical_interest,
                                         multi_chain_game, pure_nash, random_game, snake_path, staircase_game)


@pytest.mark.parametrize("m", [2, 3, 5, 7])
def test_chain_game_unique_pure_ne_and_improvement_path(m):
    A = chain_game(m)
    assert A.shape == (2 * m + 2, 2 * m + 2)
    # brute-force pure NE: no row or column deviation improves
    ne = [(i, j) for i in range(A.shape[0]) for j in range(A.shape[1])
          if A[i, j] >= A[:, j].max() and A[i, j] >= A[i, :].max()]
    assert ne == [(m - 1, m - 1)] == pure_nash(A)
    cells = chain_cells(m)
    assert len(cells) == 2 * m - 1
    vals = [float(A[c]) for c in cells]
    assert all(b > a for a, b in zip(vals, vals[1:]))                  # potential increases along the chain
    for (i0, j0), (i1, j1) in zip(cells, cells[1:]):
        assert (i0 == i1) != (j0 == j1)                                # one player deviates per step
        assert float(A[i1, j1]) == pytest.approx(float(A[i0, j0]) + 1 / (2 * m))
    # uniform start: row 0 and column 0 are the best responses to the uniform opponent
    assert int(A.mean(1).argmax()) == 0 and int(A.mean(0).argmax()) == 0


def test_staircase_and_random_games():
    S = staircase_game(4)
    assert pure_nash(S) == [(3, 3)] and float(S[3, 3]) == pytest.approx(6 / 8)
    R = random_game(5, np.random.default_rng(0))
    assert R.shape == (5, 5) and float(R.min()) >= 0 and float(R.max()) <= 1


@pytest.mark.parametrize("N,m", [(2, 3), (3, 2), (4, 2), (3, 3)])
def test_snake_path_is_a_unilateral_hamiltonian_path(N, m):
    path = snake_path(N, m)
    assert len(path) == m ** N == len(set(path))
    for a, b in zip(path, path[1:]):
        assert sum(x != y for x, y in zip(a, b)) == 1
    T = multi_chain_game(N, m).numpy()
    pure = [a for a in itertools.product(range(m), repeat=N) if multi_gap(T, a) <= 0]
    assert pure == [path[-1]]


def test_multi_fp_reaches_the_unique_ne():
    T = multi_chain_game(3, 2)
    t, phis = multi_fp_hitting_time(T, 0.5 / 8, 1000)
    assert t > 0 and phis[-1] == pytest.approx(1.0)


@pytest.mark.parametrize("bad", [1, 0, -3, 2.5, True])
def test_size_below_two_rejected(bad):
    with pytest.raises(GameError, match="size must be an integer >= 2"):
        chain_game(bad)
    with pytest.raises(GameError):
        staircase_game(bad)


def test_non_identical_interest_rejected():
    A = chain_game(3)
    B = A.clone()
    B[0, 1] += 0.25
    assert torch.equal(check_identical_interest([A, A.clone()]), A)
    with pytest.raises(GameError, match=r"payoffs\[1\]: not identical interest"):
        check_identical_interest([A, B])
    with pytest.raises(GameError, match="not identical interest"):
        multi_fp_hitting_time([multi_chain_game(2, 2), multi_chain_game(2, 2) * 2], 0.1, 10)


def test_nonpositive_eps_rejected():
    with pytest.raises(GameError, match="eps"):
        multi_fp_hitting_time(multi_chain_game(2, 2), 0.0, 10)
