"""Identical-interest (potential) games: the derived chain gadget, the plain staircase, random games,
and the multi-player chain used for fictitious play.

Two-player games are one payoff matrix A (n, n): both players receive xᵀAy (identical interest, so
Φ(x, y) = xᵀAy is an exact potential). An N-player game is one payoff tensor of shape (m,)*N.

    A = chain_game(5)            # (2m+2, 2m+2): unique pure NE at (m-1, m-1), see the report
    A = staircase_game(5)        # the card's pre-check staircase (uniform start finds an ε-NE fast)
    A = random_game(8, gen)      # i.i.d. uniform[0, 1] payoffs (baseline)
    T = multi_chain_game(3, 2)   # N players, 2 actions: payoffs along a reflected Gray code (shortcut by FP)
    T = box_snake_game(5)        # N players, 2 actions: payoffs along a snake-in-the-box (induced path)
"""
from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import torch


class GameError(ValueError):
    """A game argument is invalid (size, payoff shape, not identical interest)."""


def _check_size(m: int, what: str = "m") -> None:
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 2:
        raise GameError(f"{what}: a game size must be an integer >= 2 (got {m!r})")


def chain_cells(m: int) -> list[tuple[int, int]]:
    """(0,0) → (1,0) → (1,1) → (2,1) → … → (m-1, m-1): 2m-1 cells, each one player's deviation."""
    _check_size(m)
    cells = [(0, 0)]
    for i in range(1, m):
        cells += [(i, i - 1), (i, i)]
    return cells


def chain_game(m: int, pad: int | None = None) -> torch.Tensor:
    """The derived gadget (NOT the paper's game, which could not be retrieved; see report Derivation).

    d = 1/(2m). Chain cell k pays (k+2)d. The off-chain cell right of (i,i) and the one below
    (i,i-1) pay their chain neighbour's value − 2d. Every other block cell pays −(1 + (i+j)/m).
    P = pad (default m+2) padding actions per player: pad columns pay 0 against row 0 and −1
    otherwise; pad rows pay 0 against column 0 and −1 otherwise; pad×pad pays −1.
    """
    _check_size(m)
    P = m + 2 if pad is None else int(pad)
    if P < 0:
        raise GameError(f"pad: must be >= 0 (got {pad})")
    d = 1.0 / (2 * m)
    n = m + P
    A = np.full((n, n), -1.0)
    for i in range(m):
        for j in range(m):
            A[i, j] = -(1.0 + (i + j) / m)
    for k, (i, j) in enumerate(chain_cells(m)):
        A[i, j] = (k + 2) * d                      # chain: strictly increasing potential
    for i in range(m - 1):
        A[i, i + 1] = A[i, i] - 2 * d              # right of (i,i): a worse exit than going down
    for i in range(1, m - 1):
        A[i + 1, i - 1] = A[i, i - 1] - 2 * d      # below (i,i-1): a worse exit than going right
    A[0, m:] = 0.0                                  # pad columns: harmless only against row 0
    A[m:, 0] = 0.0                                  # pad rows: harmless only against column 0
    return torch.tensor(A, dtype=torch.float64)


def staircase_game(m: int) -> torch.Tensor:
    """The card's pre-check staircase: chain cell k pays k/(2m) (cell 0 pays 0), all else 0."""
    _check_size(m)
    A = np.zeros((m, m))
    for k, (i, j) in enumerate(chain_cells(m)):
        A[i, j] = k / (2 * m)
    return torch.tensor(A, dtype=torch.float64)


def random_game(n: int, gen: np.random.Generator) -> torch.Tensor:
    """i.i.d. uniform[0,1] identical-interest payoffs (n, n)."""
    _check_size(n, "n")
    return torch.tensor(gen.uniform(0.0, 1.0, size=(n, n)), dtype=torch.float64)


def snake_path(n_players: int, m: int) -> list[tuple[int, ...]]:
    """A Hamiltonian path through {0..m-1}^N in which consecutive profiles differ in ONE player's
    action (a reflected mixed-radix Gray code): every step is a unilateral deviation."""
    _check_size(m)
    if n_players < 2:
        raise GameError(f"n_players: need >= 2 players (got {n_players})")
    path: list[tuple[int, ...]] = [()]
    for _ in range(n_players):
        new = []
        for idx, prefix in enumerate(path):
            order = range(m) if idx % 2 == 0 else range(m - 1, -1, -1)
            new += [prefix + (a,) for a in order]
        path = new
    return path


def multi_chain_game(n_players: int, m: int) -> torch.Tensor:
    """N-player identical-interest game: profile k on the snake path pays (k+1)/L (L = m^N cells);
    every profile off the path is unreachable by improvements and pays −1 (a strict dis-incentive).
    The path ends at the unique pure NE (m-1, …) with payoff 1."""
    path = snake_path(n_players, m)
    L = len(path)
    T = np.full((m,) * n_players, -1.0)
    for k, cell in enumerate(path):
        T[cell] = (k + 1) / L
    return torch.tensor(T, dtype=torch.float64)


def check_identical_interest(payoffs: list[torch.Tensor] | torch.Tensor, tol: float = 0.0) -> torch.Tensor:
    """A potential game of identical interest needs every player's payoff tensor to be the same;
    returns the common tensor, or raises GameError naming the first player that differs."""
    if isinstance(payoffs, torch.Tensor):
        payoffs = [payoffs]
    if not payoffs:
        raise GameError("payoffs: need at least one payoff tensor")
    base = payoffs[0]
    for p, other in enumerate(payoffs[1:], start=1):
        if other.shape != base.shape:
            raise GameError(f"payoffs[{p}]: shape {tuple(other.shape)} differs from player 0's {tuple(base.shape)}")
        diff = float((other - base).abs().max()) if other.numel() else 0.0
        if diff > tol:
            raise GameError(f"payoffs[{p}]: not identical interest (max |u_{p} - u_0| = {diff:.3g} > {tol:g}); "
                            "a potential game of identical interest is required")
    return base


def pure_nash(A: torch.Tensor) -> list[tuple[int, int]]:
    """All pure Nash equilibria of the two-player identical-interest game A (brute force)."""
    col_max = A.max(dim=0).values  # best row payoff for each column
    row_max = A.max(dim=1).values
    return [(i, j) for i, j in itertools.product(range(A.shape[0]), range(A.shape[1]))
            if A[i, j] >= col_max[j] and A[i, j] >= row_max[i]]


SNAKES = Path(__file__).resolve().parent / "snakes.json"


def load_snakes() -> dict[int, list[tuple[int, ...]]]:
    """The stored snake-in-the-box paths (found once by depth-first search from vertex 0, see
    find_snake; N -> list of profiles), each checked to be an induced path of the hypercube."""
    raw = json.loads(SNAKES.read_text())
    out = {int(k): [tuple(int(x) for x in v) for v in path] for k, path in raw.items()}
    for N, path in out.items():
        check_induced_path(path, N)
    return out


def check_induced_path(path: list[tuple[int, ...]], N: int) -> None:
    """A snake in the box: consecutive profiles differ in exactly one player's action; profiles two or
    more steps apart differ in at least two (no unilateral shortcut between path profiles)."""
    if not path or path[0] != (0,) * N or any(len(p) != N or set(p) - {0, 1} for p in path):
        raise GameError(f"snake N={N}: profiles must be 0/1 tuples of length {N} starting at all zeros")
    if len(set(path)) != len(path):
        raise GameError(f"snake N={N}: a profile repeats")
    for i in range(len(path)):
        for j in range(i + 1, len(path)):
            dist = sum(a != b for a, b in zip(path[i], path[j]))
            if (j == i + 1 and dist != 1) or (j > i + 1 and dist < 2):
                raise GameError(f"snake N={N}: profiles {i} and {j} are {dist} apart (not an induced path)")


def find_snake(N: int, budget: int = 1_000_000) -> list[tuple[int, ...]]:
    """Longest induced path from vertex 0 of the N-cube found by depth-first search within `budget`
    nodes (exhaustive for N <= 5; how snakes.json was made)."""
    best: list[int] = [0]
    path, onp, nodes = [0], {0}, [0]

    def ok(v: int, last: int) -> bool:
        return v not in onp and all(u == last or u not in onp for u in (v ^ (1 << i) for i in range(N)))

    def dfs() -> None:
        nodes[0] += 1
        if len(path) > len(best):
            best[:] = path
        if nodes[0] > budget:
            return
        last = path[-1]
        for v in (last ^ (1 << i) for i in range(N)):
            if ok(v, last):
                path.append(v)
                onp.add(v)
                dfs()
                path.pop()
                onp.discard(v)

    dfs()
    return [tuple((v >> i) & 1 for i in range(N)) for v in best]


def box_snake_game(N: int, path: list[tuple[int, ...]] | None = None) -> np.ndarray:
    """N-player identical-interest game, 2 actions each, on a snake in the box (this project's
    construction, NOT the paper's): with L = len(path) and d = 1/(2L), path profile k pays (k+2)·d;
    every other profile pays −(1 + |a|/N) (|a| = number of players on action 1). Returned as INTEGER
    payoffs scaled by 2·L·N: path (k+2)·N, others −(2LN + 2L|a|). The unique pure NE is the path's
    end; every unilateral deviation from path profile k leads to profile k ± 1 or off the path (an
    induced path has no chords), so a best-response path cannot skip ahead by one player's move."""
    path = path if path is not None else load_snakes()[N]
    check_induced_path(path, N)
    L = len(path)
    T = np.empty((2,) * N, dtype=np.int64)
    for a in itertools.product((0, 1), repeat=N):
        T[a] = -(2 * L * N + 2 * L * sum(a))
    for k, a in enumerate(path):
        T[a] = (k + 2) * N
    return T
