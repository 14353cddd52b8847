"""Minimality when the gold needs an and/or whose two sides have EQUAL size (issue 53: the `i > j` ->
`i >= j` mutant of the enumerator's and/or loop skipped those pairs and returned size 9 for (and P Q))."""
from __future__ import annotations

import numpy as np
import pytest

from stages.induction.enumerate import synthesize
from stages.induction.formula import parse, size, to_sexpr
from stages.induction.instances import Instance, World, empty_atoms
from stages.induction.lift import synthesize_lift
from stages.induction.semantics import is_valid
from tests.induction.helpers import brute_labels


def _worlds(gold: str, relations: bool, seed: int = 7) -> list[World]:
    """Worlds where P, Q take all four combinations; R, S empty (every quantified formula is then constant in
    each world, so nothing smaller than the gold explains the labels) or random (relations=True)."""
    rng = np.random.default_rng(seed)
    f = parse(gold)
    out = []
    for D in (5, 6, 7):
        facts = empty_atoms(D)
        facts["P"][:] = [bool(i & 1) for i in range(D)]
        facts["Q"][:] = [bool(i & 2) for i in range(D)]
        if relations:
            facts["R"] = rng.random((D, D)) < 0.35
            facts["S"] = rng.random((D, D)) < 0.35
        out.append(World(D, facts, empty_atoms(D), brute_labels(f, facts, D)))
    return out


@pytest.mark.parametrize("gold", ["(and (P x) (Q x))", "(or (P x) (Q x))"])
@pytest.mark.parametrize("solver", ["guarded", "lift"])
def test_equal_size_sides_unary(gold, solver):
    inst = Instance("eq", "fullobs", _worlds(gold, relations=False), gold)
    res = (synthesize(inst, max_generated=200_000, max_size=12) if solver == "guarded"
           else synthesize_lift(inst, max_generated=200_000, max_size=12, backend="torch"))
    assert res.formula is not None and is_valid(res.formula, inst)[0]
    assert size(res.formula) == 5 == size(parse(gold)), to_sexpr(res.formula)   # both sides size 2


def test_equal_size_sides_inside_a_quantifier_lift():
    """∃y (R(x,y) ∧ S(x,y)): the binary bank must pair two size-3 atoms (equal sides) -- size 9, nothing
    smaller explains these worlds (checked: no valid formula is found with max_size 8)."""
    gold = "(exists y (and (R x y) (S x y)))"
    inst = Instance("eqq", "fullobs", _worlds(gold, relations=True, seed=11), gold)
    assert 0 < sum(w.labels.sum() for w in inst.worlds) < sum(w.domain for w in inst.worlds)
    res = synthesize_lift(inst, max_generated=500_000, max_size=12, backend="torch")
    assert res.formula is not None and is_valid(res.formula, inst)[0]
    assert size(res.formula) == 9, to_sexpr(res.formula)
    assert synthesize_lift(inst, max_generated=500_000, max_size=8, backend="torch").formula is None
