"""The synthetic pre-training corpus with a known target domain (prepare's generator).

Documents are token sequences of length T over a vocabulary of V tokens:
  target   — Markov chain A (the domain the proxy and the validation set come from)
  other    — Markov chain B (a different, equally structured domain)
  noise    — near-uniform tokens
  dup      — near-duplicates of a few target documents (a handful of tokens mutated)
  toxic    — target documents carrying a trigger n-gram several times (the static-filter class)
"""
from __future__ import annotations

import numpy as np

KINDS = ("target", "other", "noise", "dup", "toxic")


def sparse_markov_chain(vocab: int, branching: int, concentration: float, rng: np.random.Generator,
                        exclude: np.ndarray | None = None) -> np.ndarray:
    """(V, V) row-stochastic matrix: each token has `branching` plausible successors (Dirichlet weights)."""
    allowed = np.setdiff1d(np.arange(vocab), exclude if exclude is not None else [])
    trans = np.zeros((vocab, vocab))
    for tok in range(vocab):
        succ = rng.choice(allowed, size=branching, replace=False)
        trans[tok, succ] = rng.dirichlet(np.full(branching, concentration))
    return trans


def sample_chain(trans: np.ndarray, n: int, length: int, rng: np.random.Generator,
                 starts: np.ndarray) -> np.ndarray:
    """n sequences of `length` tokens from the chain, first token uniform over `starts`."""
    out = np.empty((n, length), dtype=np.int64)
    out[:, 0] = rng.choice(starts, size=n)
    cdf = np.cumsum(trans, axis=1)
    for t in range(1, length):
        u = rng.random(n)[:, None]
        out[:, t] = np.minimum((u > cdf[out[:, t - 1]]).sum(1), trans.shape[1] - 1)
    return out


def near_uniform(n: int, length: int, vocab: int, rng: np.random.Generator, allowed: np.ndarray) -> np.ndarray:
    return rng.choice(allowed, size=(n, length))


def near_duplicates(base: np.ndarray, n: int, mutations: int, rng: np.random.Generator,
                    allowed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """n copies of rows of `base` (round-robin), each with `mutations` random positions resampled."""
    src = np.arange(n) % base.shape[0]
    out = base[src].copy()
    for row in out:
        pos = rng.choice(base.shape[1], size=mutations, replace=False)
        row[pos] = rng.choice(allowed, size=mutations)
    return out, src


def insert_trigger(docs: np.ndarray, trigger: np.ndarray, copies: int, rng: np.random.Generator) -> np.ndarray:
    """Overwrite `copies` non-overlapping windows of each document with the trigger n-gram."""
    out = docs.copy()
    n_gram, length = len(trigger), docs.shape[1]
    slots = length // n_gram
    for row in out:
        for slot in rng.choice(slots, size=min(copies, slots), replace=False):
            row[slot * n_gram:(slot + 1) * n_gram] = trigger
    return out
