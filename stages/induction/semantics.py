"""Exact semantics: vectorized (numpy) evaluation on finite worlds and the three regimes' validity.

    truth = evaluate(f, world)                 # (D,) bool: φ(a) for every object a (known atoms)
    must, may = evaluate3(f, world)            # Kleene bounds over every completion of unknown atoms
    ok, reason = is_valid(f, instance)         # FULLOBS / CI / EC (EC exactly, with z3)

A subformula with variables (v1..vk) in scope evaluates to a bool array broadcastable to
(D,)*k (axis i = vi); a quantifier appends an axis and reduces it with any/all.
EC: a world is explained iff SOME completion of its unknown atoms makes φ match all its labels;
each world is its own z3 problem. Objects whose value is already fixed by the Kleene bounds are
decided without z3; only the undetermined ground sub-terms become z3 terms over the unknown atoms.
"""
from __future__ import annotations

import numpy as np
import z3

from stages.induction.formula import And, Atom, Formula, Not, Or, Quant
from stages.induction.instances import Instance, World

Bounds = tuple[np.ndarray, np.ndarray]  # (must, may)


def _axis_view(arr: np.ndarray, axes: tuple[int, ...], ndim: int) -> np.ndarray:
    """Place arr's axes at positions `axes` of an ndim-dim broadcastable array."""
    if len(set(axes)) < len(axes):            # (R y y): diagonal
        arr = np.diagonal(arr) if arr.ndim == 2 else arr
        axes = (axes[0],)
    order = np.argsort(axes)
    arr = np.transpose(arr, order) if arr.ndim > 1 else arr
    shape = [1] * ndim
    for ax, n in zip(sorted(axes), arr.shape):
        shape[ax] = n
    return arr.reshape(shape)


class _Evaluator:
    """Kleene three-valued evaluation; with no unknown atoms must == may == truth."""

    def __init__(self, world: World):
        self.world = world
        self.D = world.domain
        self.memo: dict[tuple[int, tuple[str, ...]], Bounds] = {}   # (node id, scope) -> bounds

    def atom(self, f: Atom, scope: tuple[str, ...]) -> Bounds:
        ndim = len(scope)
        axes = tuple(len(scope) - 1 - scope[::-1].index(v) for v in f.args)   # innermost binding wins
        if f.pred == "=":
            eq = np.eye(self.D, dtype=bool)
            v = _axis_view(eq, axes, ndim)
            return v, v
        must = self.world.facts[f.pred]
        may = must | self.world.unknown[f.pred]
        return _axis_view(must, axes, ndim), _axis_view(may, axes, ndim)

    def __call__(self, f: Formula, scope: tuple[str, ...]) -> Bounds:
        key = (id(f), scope)
        out = self.memo.get(key)
        if out is None:
            out = self.memo[key] = self._eval(f, scope)
        return out

    def _eval(self, f: Formula, scope: tuple[str, ...]) -> Bounds:
        if isinstance(f, Atom):
            return self.atom(f, scope)
        if isinstance(f, Not):
            must, may = self(f.child, scope)
            return ~may, ~must                           # Kleene negation swaps the bounds
        if isinstance(f, (And, Or)):
            parts = [self(c, scope) for c in f.children]
            op = np.logical_and if isinstance(f, And) else np.logical_or
            must, may = parts[0]
            for m2, M2 in parts[1:]:
                must, may = op(must, m2), op(may, M2)
            return must, may
        inner = scope + (f.var,)
        must, may = self(f.body, inner)
        # only the bound axis must be materialized; axes the body ignores stay size-1 (broadcast)
        must = np.broadcast_to(must, must.shape[:-1] + (self.D,))
        may = np.broadcast_to(may, may.shape[:-1] + (self.D,))
        red = np.any if f.kind == "exists" else np.all
        return red(must, axis=-1), red(may, axis=-1)


def evaluate3(f: Formula, world: World) -> Bounds:
    """(must, may): (D,) bool bounds of φ(a) over all completions of the world's unknown atoms."""
    must, may = _Evaluator(world)(f, ("x",))
    shape = (world.domain,)
    return np.broadcast_to(must, shape).copy(), np.broadcast_to(may, shape).copy()


def evaluate(f: Formula, world: World) -> np.ndarray:
    """φ(a) for every object a, reading unknown atoms as false (exact for fully known worlds)."""
    return evaluate3(f, world)[0]


# ---------------------------------------------------------------- EC with z3
def _ground(f: Formula, scope: tuple[str, ...], env: tuple[int, ...], ev: _Evaluator, atoms: dict, D: int):
    """z3 term (or Python bool when fixed by the Kleene bounds) for f under the assignment env."""
    must, may = ev.memo[(id(f), scope)]
    idx = tuple(min(i, n - 1) for i, n in zip(env, must.shape))
    lo, hi = bool(must[idx]), bool(may[idx])
    if lo == hi:
        return lo
    if isinstance(f, Atom):                              # undetermined atom == unknown atom
        axes = tuple(len(scope) - 1 - scope[::-1].index(v) for v in f.args)
        key = (f.pred, *(env[a] for a in axes))
        if key not in atoms:
            atoms[key] = z3.Bool("%s(%s)" % (f.pred, ",".join(map(str, key[1:]))))
        return atoms[key]
    if isinstance(f, Not):
        return z3.Not(_ground(f.child, scope, env, ev, atoms, D))
    if isinstance(f, (And, Or)):
        is_and = isinstance(f, And)
        terms = []
        for c in f.children:
            t = _ground(c, scope, env, ev, atoms, D)
            if isinstance(t, bool):
                if t != is_and:              # False in and / True in or decides
                    return t
                continue
            terms.append(t)
        if not terms:
            return is_and
        return terms[0] if len(terms) == 1 else (z3.And(terms) if is_and else z3.Or(terms))
    is_exists = f.kind == "exists"
    terms = []
    for d in range(D):
        t = _ground(f.body, scope + (f.var,), env + (d,), ev, atoms, D)
        if isinstance(t, bool):
            if t == is_exists:
                return t
            continue
        terms.append(t)
    if not terms:
        return not is_exists
    return terms[0] if len(terms) == 1 else (z3.Or(terms) if is_exists else z3.And(terms))


def world_explainable(f: Formula, world: World, timeout_ms: int = 60_000) -> bool:
    """EC: does SOME completion of this world's unknown atoms make φ match every label? (exact)"""
    ev = _Evaluator(world)
    must, may = ev(f, ("x",))
    must = np.broadcast_to(must, (world.domain,))
    may = np.broadcast_to(may, (world.domain,))
    labels = world.labels
    if np.any(labels & ~may) or np.any(~labels & must):   # fixed and wrong in every completion
        return False
    open_objs = np.flatnonzero(must != may)
    if open_objs.size == 0:
        return True
    solver = z3.Solver()
    solver.set("timeout", timeout_ms)
    atoms: dict = {}
    for a in open_objs:
        t = _ground(f, ("x",), (int(a),), ev, atoms, world.domain)
        solver.add(t if labels[a] else z3.Not(t))
    res = solver.check()
    if res == z3.unknown:
        raise RuntimeError(f"z3 returned unknown ({solver.reason_unknown()})")
    return res == z3.sat


# ---------------------------------------------------------------- validity per regime
def is_valid(f: Formula, inst: Instance) -> tuple[bool, str]:
    """Validity of φ for the instance's regime, with a short reason when invalid."""
    if inst.regime == "fullobs":
        for k, w in enumerate(inst.worlds):
            pred = evaluate(f, w)
            if not np.array_equal(pred, w.labels):
                bad = int(np.flatnonzero(pred != w.labels)[0])
                return False, f"world {k}: object {bad} has label {int(w.labels[bad])}, formula gives {int(pred[bad])}"
        return True, ""
    if inst.regime == "ci":
        for k, w in enumerate(inst.worlds):
            pred = evaluate(f, w)
            same = np.array_equal(pred, w.labels)
            if w.kind == "yes" and not same:
                bad = int(np.flatnonzero(pred != w.labels)[0])
                return False, f"yes-world {k}: object {bad} has label {int(w.labels[bad])}, formula gives {int(pred[bad])}"
            if w.kind == "no" and same:
                return False, f"no-world {k}: formula matches all its labels (must mismatch at least one)"
        return True, ""
    for k, w in enumerate(inst.worlds):
        if not world_explainable(f, w):
            return False, f"world {k}: no completion of its unknown atoms matches the labels"
    return True, ""


def heldout_accuracy(f: Formula, worlds: list[World]) -> tuple[float, float]:
    """(object accuracy, fraction of worlds labelled exactly) on fully observed held-out worlds."""
    correct = total = exact = 0
    for w in worlds:
        pred = evaluate(f, w)
        correct += int((pred == w.labels).sum())
        total += w.domain
        exact += int(np.array_equal(pred, w.labels))
    return correct / total, exact / len(worlds)
