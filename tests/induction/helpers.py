"""Independent brute-force semantics and random formulas/worlds for the induction tests."""
from __future__ import annotations

import itertools

import numpy as np

from stages.induction.formula import And, Atom, Not, Or, Quant
from stages.induction.instances import World, empty_atoms


def holds(f, env: dict, facts: dict, D: int) -> bool:
    """Textbook Tarskian satisfaction, one assignment at a time (no vectorization, no sharing)."""
    if isinstance(f, Atom):
        vals = tuple(env[v] for v in f.args)
        if f.pred == "=":
            return vals[0] == vals[1]
        return bool(facts[f.pred][vals])
    if isinstance(f, Not):
        return not holds(f.child, env, facts, D)
    if isinstance(f, And):
        return all(holds(c, env, facts, D) for c in f.children)
    if isinstance(f, Or):
        return any(holds(c, env, facts, D) for c in f.children)
    results = (holds(f.body, {**env, f.var: d}, facts, D) for d in range(D))
    return any(results) if f.kind == "exists" else all(results)


def brute_labels(f, facts: dict, D: int) -> np.ndarray:
    return np.array([holds(f, {"x": a}, facts, D) for a in range(D)], dtype=bool)


def completions(world: World):
    """Every completion of the world's unknown atoms, as fact dicts."""
    cells = [(k, idx) for k, arr in world.unknown.items() for idx in zip(*np.nonzero(arr))]
    for bits in itertools.product((False, True), repeat=len(cells)):
        facts = {k: v.copy() for k, v in world.facts.items()}
        for (k, idx), b in zip(cells, bits):
            facts[k][idx] = b
        yield facts


def random_world(rng: np.random.Generator, D: int, p: float = 0.4, unknown: float = 0.0,
                 max_unknown: int | None = None) -> World:
    facts, unk = empty_atoms(D), empty_atoms(D)
    for k in facts:
        shape = facts[k].shape
        facts[k] = rng.random(shape) < p
        unk[k] = rng.random(shape) < unknown
        facts[k] &= ~unk[k]
    if max_unknown is not None:                         # keep the brute force small
        cells = [(k, idx) for k, arr in unk.items() for idx in zip(*np.nonzero(arr))]
        for j in rng.permutation(len(cells))[max_unknown:]:
            k, idx = cells[j]
            unk[k][idx] = False
    return World(D, facts, unk, np.zeros(D, bool))


def random_formula(rng: np.random.Generator, depth: int = 3, scope: tuple[str, ...] = ("x",)):
    """Arbitrary FO formula over scope (not only the guarded fragment), with shadowing."""
    r = rng.random()
    if depth == 0 or r < 0.25:
        pred = rng.choice(["P", "Q", "R", "S", "="])
        n = 1 if pred in ("P", "Q") else 2
        return Atom(str(pred), tuple(str(rng.choice(scope)) for _ in range(n)))
    if r < 0.4:
        return Not(random_formula(rng, depth - 1, scope))
    if r < 0.7:
        kids = tuple(random_formula(rng, depth - 1, scope) for _ in range(int(rng.integers(2, 4))))
        return And(kids) if rng.random() < 0.5 else Or(kids)
    var = str(rng.choice(["y", "z", "w"]))
    kind = "exists" if rng.random() < 0.5 else "forall"
    return Quant(kind, var, random_formula(rng, depth - 1, scope + (var,)))
