"""Exact fictitious play by events: the whole trajectory of FP in an N-player identical-interest game
with INTEGER payoffs, stage by stage, in exact integer arithmetic — hitting times of any size
(Python ints), and the exact sequence of profiles FP visits (its path).

Fictitious play (as kernels.ftrl_dynamics with reg "fp"): at round t every player p plays the pure
best response to its cumulative realized utility U_p = Σ_{s<t} u_p(·, a_{−p,s}); ties go to the
action with the highest priority (default: the lowest index), all players simultaneously. During a
stage the profile a is fixed, so each U_p grows linearly: after s more rounds U_p = U_p⁰ + s·v_p with
v_p = u_p(·, a_{−p}). The stage ends at the first s where some player's best response changes,

    s* = min over players p and actions j ≠ a_p with g = v_p[j] − v_p[a_p] > 0 of the least s ≥ 1 with
         D + s·g > 0 (or ≥ 0 when j has the higher priority), D = U_p⁰[j] − U_p⁰[a_p] ≤ 0,

computed exactly; every player then re-picks. T_ε is the first round whose profile has gap ≤ ε
(the gap of a pure profile is constant over its stage). A stage whose profile no action ever
overtakes is final: if its gap is above ε, FP never reaches an ε-NE (hit -1).

    hit, stages = exact_fp(T_int, eps)         # stages: [(profile, first round, length or None)]
                                               # hit: round, -1 (stuck above ε), -2 (undecided)
"""
from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np


class ExactFPError(ValueError):
    """Payoffs that are not integers (scale them first), or inconsistent shapes/priorities."""


def integer_payoffs(T, scale: int) -> np.ndarray:
    """scale·T as an int64 array; refuses values that are not integers after scaling."""
    arr = np.asarray(T, dtype=float) * scale
    out = np.rint(arr)
    if np.abs(arr - out).max() > 1e-7:
        raise ExactFPError(f"payoffs × {scale} are not integers (max residue {np.abs(arr - out).max():.3g})")
    return out.astype(np.int64)


def pure_gap(T: np.ndarray, a: tuple[int, ...]) -> int:
    """Largest unilateral gain at the pure profile a (identical interest)."""
    val = int(T[a])
    return max(int(T[a[:p] + (slice(None),) + a[p + 1:]].max()) - val for p in range(T.ndim))


def exact_fp(T: np.ndarray, eps, prio: list[list[int]] | None = None, max_stages: int = 1_000_000
             ) -> tuple[int, list[tuple[tuple[int, ...], int, int | None]]]:
    """(hit round, stages) of fictitious play on the integer payoff tensor T (shape (m,)*N or
    (n1, n2, …)), ε in the same units; prio[p][j]: tie priority of player p's action j. hit is -1 when
    FP settles on a profile whose gap exceeds ε, -2 when max_stages stages pass undecided (pure play
    can cycle: FP converges in empirical frequencies, not always in pure profiles)."""
    T = np.asarray(T)
    if T.dtype.kind not in "iu":
        raise ExactFPError(f"payoffs: need an integer tensor (got {T.dtype}); use integer_payoffs")
    N = T.ndim
    sizes = T.shape
    rank = prio if prio is not None else [[-j for j in range(sizes[p])] for p in range(N)]
    if len(rank) != N or any(len(rank[p]) != sizes[p] or len(set(rank[p])) != sizes[p] for p in range(N)):
        raise ExactFPError("prio: one list of distinct priorities per player, one per action")
    eps = Fraction(eps).limit_denominator(10**12) if not isinstance(eps, int) else Fraction(eps)
    U = [[0] * sizes[p] for p in range(N)]

    def pick(p: int) -> int:
        u, r = U[p], rank[p]
        best = 0
        for j in range(1, sizes[p]):
            if u[j] > u[best] or (u[j] == u[best] and r[j] > r[best]):
                best = j
        return best

    t = 1
    stages: list[tuple[tuple[int, ...], int, int | None]] = []
    for _ in range(max_stages):
        a = tuple(pick(p) for p in range(N))
        v = [[int(x) for x in T[a[:p] + (slice(None),) + a[p + 1:]]] for p in range(N)]
        if pure_gap(T, a) <= eps:
            stages.append((a, t, None))
            return t, stages
        s_min = None
        for p in range(N):
            c = a[p]
            for j in range(sizes[p]):
                g = v[p][j] - v[p][c]
                if j == c or g <= 0:
                    continue
                D = U[p][j] - U[p][c]                                   # <= 0: c is the best response now
                s = (-D + g - 1) // g if rank[p][j] > rank[p][c] else -D // g + 1   # ceil(-D/g) / floor+1
                s = max(1, s)
                s_min = s if s_min is None else min(s_min, s)
        if s_min is None:                                               # nobody ever moves again
            stages.append((a, t, None))
            return -1, stages
        stages.append((a, t, s_min))
        for p in range(N):
            for j in range(sizes[p]):
                U[p][j] += s_min * v[p][j]
        t += s_min
    return -2, stages                                                   # undecided within max_stages


def path_followed(stages, path: list[tuple[int, ...]]) -> dict:
    """How FP's sequence of profiles relates to a designed improvement path: the path index of each
    visited profile (-1 off the path), whether it is exactly the path in order, and the number of
    path profiles visited."""
    where = {tuple(p): k for k, p in enumerate(path)}
    idx = [where.get(tuple(a), -1) for a, _, _ in stages]
    return {"indices": idx, "follows": idx == list(range(len(path))), "visited": len(set(i for i in idx if i >= 0)),
            "path_length": len(path)}


def brute_fp(T: np.ndarray, eps: float, cap: int, prio=None) -> tuple[int, list[tuple[int, ...]]]:
    """Round-by-round fictitious play (the definition, for tests): (hit or -1, profile per round)."""
    T = np.asarray(T)
    N = T.ndim
    rank = prio if prio is not None else [[-j for j in range(T.shape[p])] for p in range(N)]
    U = [np.zeros(T.shape[p]) for p in range(N)]
    seq = []
    for t in range(1, cap + 1):
        a = []
        for p in range(N):
            mx = U[p].max()
            ties = [j for j in range(T.shape[p]) if U[p][j] == mx]
            a.append(max(ties, key=lambda j: rank[p][j]))
        a = tuple(a)
        seq.append(a)
        if pure_gap(T, a) <= eps:
            return t, seq
        for p in range(N):
            U[p] = U[p] + T[a[:p] + (slice(None),) + a[p + 1:]]
    return -1, seq


def all_profiles(sizes) -> list[tuple[int, ...]]:
    return list(itertools.product(*[range(s) for s in sizes]))
