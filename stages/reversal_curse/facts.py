"""The synthetic fact world: entity pairs (a_i, b_i), relation tokens r+, r-, r_id.

Vocabulary: a_0..a_{n-1} = 0..n-1, b_0..b_{n-1} = n..2n-1, r+ = 2n, r- = 2n+1, r_id = 2n+2.
Each example is a two-token input [entity, relation] with one target entity.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

ARMS = ("none", "A", "B", "AB")  # which entities get identity-bridge facts [e, r_id] -> e


@dataclass(frozen=True)
class Vocab:
    n: int

    @property
    def size(self) -> int:
        return 2 * self.n + 3

    def a(self, i): return i
    def b(self, i): return self.n + i
    @property
    def r_fwd(self): return 2 * self.n
    @property
    def r_rev(self): return 2 * self.n + 1
    @property
    def r_id(self): return 2 * self.n + 2


def build_facts(n: int, holdout_frac: float, seed: int) -> dict[str, list]:
    """All facts as columns. 'kind' says what a row is; 'split' whether it is trained on.

    - forward  [a_i, r+] -> b_i   for every pair (train)
    - reverse  [b_i, r-] -> a_i   in-distribution pairs (train); held-out pairs (test)
    - identity_A [a_i, r_id] -> a_i, identity_B [b_i, r_id] -> b_i (train, used per arm)
    """
    voc = Vocab(n)
    rng = np.random.default_rng(seed)
    n_held = max(1, int(round(holdout_frac * n)))
    held = set(rng.permutation(n)[:n_held].tolist())
    cols: dict[str, list] = {k: [] for k in ("pair", "entity", "relation", "target", "kind", "split")}

    def add(pair, entity, relation, target, kind, split):
        for key, val in zip(cols, (pair, entity, relation, target, kind, split)):
            cols[key].append(val)

    for i in range(n):
        add(i, voc.a(i), voc.r_fwd, voc.b(i), "forward", "train")
        add(i, voc.b(i), voc.r_rev, voc.a(i), "reverse", "test" if i in held else "train")
        add(i, voc.a(i), voc.r_id, voc.a(i), "identity_A", "train")
        add(i, voc.b(i), voc.r_id, voc.b(i), "identity_B", "train")
    return cols


def arm_mask(kind: np.ndarray, split: np.ndarray, arm: str) -> np.ndarray:
    """Training rows of an arm: forward + in-distribution reverse + its identity bridge facts."""
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r} (arms: {', '.join(ARMS)})")
    base = (split == "train") & np.isin(kind, ["forward", "reverse"])
    bridge = np.zeros_like(base)
    if "A" in arm:
        bridge |= kind == "identity_A"
    if "B" in arm:
        bridge |= kind == "identity_B"
    return base | bridge


def mean_onehot(entity: torch.Tensor, relation: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """x̄ = (e_entity + e_relation) / 2: the uniform-attention input of the one-layer model.  (N, V)"""
    x = torch.zeros(len(entity), vocab_size, device=entity.device)
    rows = torch.arange(len(entity), device=entity.device)
    x[rows, entity] += 0.5
    x[rows, relation] += 0.5
    return x
