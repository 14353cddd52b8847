"""Exact event-driven fictitious play against a round-by-round brute force, the kernel's FP (with
random tie-breaking priorities) against the exact times, and the snake-in-the-box construction."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from kernels.ftrl_dynamics import ftrl_run
from stages.ftrl_potential.exact_fp import ExactFPError, brute_fp, exact_fp, integer_payoffs, path_followed, pure_gap
from stages.ftrl_potential.games import (GameError, box_snake_game, chain_cells, chain_game, check_induced_path,
                                         find_snake, load_snakes, snake_path)
from stages.ftrl_potential.train import random_priorities


@pytest.mark.parametrize("shape,seed", [((4, 4), 0), ((3, 5), 1), ((2, 2, 2), 2), ((3, 2, 3), 3), ((2, 2, 2, 2), 4)])
def test_exact_fp_equals_round_by_round_play(shape, seed):
    """Small integer games where ties are frequent, lowest-index and random priorities: the same hitting
    round and, stage by stage, the same profiles as playing every round."""
    rng = np.random.default_rng(seed)
    T = rng.integers(-3, 4, size=shape).astype(np.int64)
    for prio in (None, [list(rng.permutation(s)) for s in shape]):
        for eps in (0, 1, 2):
            hit, stages = exact_fp(T, eps, prio, max_stages=60)
            cap = stages[-1][1] if hit == -2 else 2000           # undecided: compare the rounds it covered
            hb, seq = brute_fp(T, eps, cap, prio)
            if hit != -2:
                assert hit == hb, (hit, hb)
            expanded = []
            for a, _, length in stages:
                expanded += [a] * (length if length is not None else 1)
            n = min(len(expanded), len(seq))
            assert n > 0 and expanded[:n] == seq[:n]


def test_exact_fp_checks_inputs():
    with pytest.raises(ExactFPError, match="integer tensor"):
        exact_fp(np.zeros((2, 2)), 0.1)
    with pytest.raises(ExactFPError, match="distinct priorities"):
        exact_fp(np.zeros((2, 2), dtype=np.int64), 0, [[0, 0], [0, 1]])
    with pytest.raises(ExactFPError, match="not integers"):
        integer_payoffs(chain_game(3).numpy(), 5)
    assert (integer_payoffs(chain_game(3).numpy(), 6) == np.rint(6 * chain_game(3).numpy())).all()


@pytest.mark.parametrize("m", [2, 3, 4])
def test_kernel_fp_equals_exact_fp_on_the_chain(m):
    """The kernel's FP on the integer game 2m·A (lowest index and 3 random tie orders) hits at exactly the
    exact event-driven round; the lowest-index rule climbs the whole chain from its first cell."""
    Ti = integer_payoffs(chain_game(m).numpy(), 2 * m)
    n = Ti.shape[0]
    prios = [None] + [random_priorities(s, m, 2, (n, n)) for s in (0, 1, 2)]
    A = torch.tensor(Ti, dtype=torch.float64)[None]
    z = torch.zeros(1, n, dtype=torch.float64)
    for pr in prios:
        hit, stages = exact_fp(Ti, 0.2, pr)
        kw = {} if pr is None else {"prio_x": torch.tensor([pr[0]], dtype=torch.float64),
                                    "prio_y": torch.tensor([pr[1]], dtype=torch.float64)}
        out = ftrl_run(A, z, z, torch.ones(1, dtype=torch.float64), torch.tensor([0.2], dtype=torch.float64),
                       20000, "fp", backend="torch", **kw)
        assert int(out["hit"][0]) == hit
        if pr is None:
            assert path_followed(stages, chain_cells(m))["follows"]


def test_stored_snakes_are_induced_paths_and_the_gray_code_is_not():
    snakes = load_snakes()
    assert [len(snakes[N]) for N in (3, 4, 5, 6)] == [5, 8, 14, 27]     # the known maximal snakes
    for N in (3, 4):
        with pytest.raises(GameError, match="not an induced path"):
            check_induced_path(snake_path(N, 2), N)                       # a Hamiltonian path has chords
    assert len(find_snake(4, budget=20_000)) == 8


@pytest.mark.parametrize("N", [3, 4, 5])
def test_box_snake_game_unique_ne_and_fp_follows_the_whole_path(N):
    path = load_snakes()[N]
    T = box_snake_game(N, path)
    ne = [a for a in itertools.product((0, 1), repeat=N) if pure_gap(T, a) <= 0]
    assert ne == [path[-1]]
    hit, stages = exact_fp(T, 0.2 * N, None)
    pf = path_followed(stages, path)
    assert pf["follows"] and pf["visited"] == len(path) and hit > 0
    if N == 3:                                 # small enough for round-by-round play
        assert brute_fp(T, 0.2 * N, 10_000)[0] == hit == 6104
