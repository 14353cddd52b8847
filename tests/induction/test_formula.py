"""Parser/printer round trips, the card's AST size, and line/column errors on malformed text."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stages.induction.formula import FormulaError, flatten, parse, quantifier_depth, size, to_sexpr
from tests.induction.helpers import random_formula


@pytest.mark.parametrize("text, expected", [
    ("(P x)", 2),                                              # atom = 1 + args
    ("(R x x)", 3),
    ("(= x x)", 3),
    ("(not (P x))", 3),                                        # not = 1 + child
    ("(and (P x) (Q x) (R x x))", 1 + 2 + 2 + 3),             # and = 1 + children
    ("(exists y (and (R x y) (P y)))", 2 + 1 + 3 + 2),       # quantifier = 2 + body
    ("(forall y (or (not (S x y)) (Q y)))", 2 + 1 + 4 + 2),
])
def test_size_is_the_cards_measure(text, expected):
    assert size(parse(text)) == expected


def test_print_is_canonical_and_depth():
    text = "(forall y (or (not (R x y)) (exists z (and (S y z) (P z)))))"
    f = parse("  (forall y\n (or (not (R x y))\n\t(exists z (and (S y z) (P z)))))  ")
    assert to_sexpr(f) == text
    assert quantifier_depth(f) == 2


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_parse_print_round_trip(seed):
    f = random_formula(np.random.default_rng(seed), depth=4)
    text = to_sexpr(f)
    g = parse(text)
    assert to_sexpr(g) == text and size(g) == size(f)
    assert size(flatten(g)) <= size(g)


@pytest.mark.parametrize("text, where, words", [
    ("(P x", "line 1, column 5", "expected ')'"),
    ("(exists y (and (R x y) (P y))", "line 1, column 30", "expected ')'"),
    ("(T x)", "line 1, column 2", "unknown predicate"),
    ("(P x y)", "line 1, column 2", "takes 1 argument"),
    ("(R x)", "line 1, column 2", "takes 2 argument"),
    ("(P y)", "line 1, column 4", "not bound"),
    ("(exists x (P x))", "line 1, column 9", "cannot be bound"),
    ("(P x) (Q x)", "line 1, column 7", "after the end"),
    ("(and (P x)\n  (Q x)\n  (R x Z))", "line 3, column 8", "not a variable"),
    ("(implies (P x) (Q x))", "line 1, column 2", "implication"),
    ("(and)", "line 1, column 2", "at least one"),
    ("P x", "line 1, column 1", "expected '('"),
    ("", "line 1, column 1", "empty"),
    (")", "line 1, column 1", "expected '('"),
])
def test_malformed_formulas_name_line_and_column(text, where, words):
    with pytest.raises(FormulaError) as err:
        parse(text)
    assert where in str(err.value) and words in str(err.value)
