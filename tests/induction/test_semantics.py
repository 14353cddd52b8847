"""check/semantics against an independent brute-force evaluator, and EC (z3) against enumeration
of every completion; the bit-packed (kernel) evaluator and the enumerator's bank against both."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stages.induction.bitset import BitContext, unpack
from stages.induction.check import check_formula
from stages.induction.enumerate import feature_bank
from stages.induction.formula import parse, to_sexpr
from stages.induction.instances import Instance, World
from stages.induction.semantics import evaluate, evaluate3, is_valid, world_explainable
from tests.induction.helpers import brute_labels, completions, random_formula, random_world

SEEDS = st.integers(0, 2**32 - 1)


@settings(max_examples=120, deadline=None)
@given(SEEDS)
def test_vectorized_evaluation_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    f = random_formula(rng, depth=4)
    w = random_world(rng, int(rng.integers(1, 6)))
    assert np.array_equal(evaluate(f, w), brute_labels(f, w.facts, w.domain)), to_sexpr(f)


@settings(max_examples=80, deadline=None)
@given(SEEDS)
def test_check_agrees_with_brute_force_validity(seed):
    """FULLOBS and CI validity from `check` == the definition, evaluated by brute force."""
    rng = np.random.default_rng(seed)
    f, g = random_formula(rng, depth=3), random_formula(rng, depth=3)   # g: the hidden concept
    worlds = []
    for k in range(4):
        w = random_world(rng, int(rng.integers(2, 6)))
        w.labels = brute_labels(g, w.facts, w.domain)
        if k == 3 and rng.random() < 0.5:
            w.labels[0] = ~w.labels[0]                 # sometimes a deliberately perturbed world
        worlds.append(w)
    preds = [brute_labels(f, w.facts, w.domain) for w in worlds]
    fo = Instance("t", "fullobs", worlds)
    assert check_formula(fo, to_sexpr(f))["valid"] == all(np.array_equal(p, w.labels) for p, w in zip(preds, worlds))
    ci_worlds = [World(w.domain, w.facts, w.unknown, w.labels, "yes" if k < 3 else "no") for k, w in enumerate(worlds)]
    ci = Instance("t", "ci", ci_worlds)
    expect = all(np.array_equal(p, w.labels) for p, w in zip(preds[:3], worlds[:3])) and \
        not np.array_equal(preds[3], worlds[3].labels)
    assert is_valid(f, ci)[0] == expect


@settings(max_examples=60, deadline=None)
@given(SEEDS)
def test_ec_z3_agrees_with_enumerating_every_completion(seed):
    rng = np.random.default_rng(seed)
    f = random_formula(rng, depth=3)
    w = random_world(rng, int(rng.integers(2, 5)), unknown=0.3, max_unknown=7)
    comps = list(completions(w))
    # labels: from a random completion (often explainable) or random (often not)
    w.labels = brute_labels(f, comps[int(rng.integers(len(comps)))], w.domain) if rng.random() < 0.5 \
        else rng.random(w.domain) < 0.5
    expect = any(np.array_equal(brute_labels(f, c, w.domain), w.labels) for c in comps)
    assert world_explainable(f, w) == expect, to_sexpr(f)
    must, may = evaluate3(f, w)                                  # Kleene bounds are sound
    for c in comps:
        v = brute_labels(f, c, w.domain)
        assert np.all(must <= v) and np.all(v <= may)


def test_ec_each_world_gets_its_own_completion():
    """Two worlds needing opposite completions of the 'same' unknown atom are both explainable."""
    f = parse("(P x)")
    w1 = World(1, {"P": np.array([False]), "Q": np.zeros(1, bool), "R": np.zeros((1, 1), bool), "S": np.zeros((1, 1), bool)},
               {"P": np.array([True]), "Q": np.zeros(1, bool), "R": np.zeros((1, 1), bool), "S": np.zeros((1, 1), bool)},
               np.array([True]))
    w2 = World(1, w1.facts, w1.unknown, np.array([False]))
    assert is_valid(f, Instance("e", "ec", [w1, w2]))[0]
    assert not is_valid(f, Instance("f", "fullobs", [World(1, w1.facts, w1.facts, np.array([True]))]))[0]


@pytest.mark.parametrize("three_valued", [False, True])
def test_bank_signatures_are_the_semantics_of_their_formulas(three_valued):
    """Every formula the enumerator keeps: its bit signature == brute-force evaluation of its AST
    (fully observed), or lies between the Kleene bounds and equals each sampled completion (EC)."""
    rng = np.random.default_rng(7)
    worlds = [random_world(rng, D, unknown=0.3 if three_valued else 0.0) for D in (3, 5, 4)]
    ctx = BitContext(worlds, completions=2, seed=1, three_valued=three_valued)
    bank = feature_bank(ctx, 9)
    sigs = bank._cat()[0]
    picks = rng.choice(bank.count, size=min(60, bank.count), replace=False)
    W = len(worlds)
    for gid in picks:
        f = bank.formula(int(gid))
        for k, w in enumerate(worlds):
            if not three_valued:
                got = unpack(sigs[gid, k: k + 1], w.domain)[0]
                assert np.array_equal(got, brute_labels(f, w.facts, w.domain)), to_sexpr(f)
                continue
            must, may = evaluate3(f, w)
            assert np.array_equal(unpack(sigs[gid, k: k + 1], w.domain)[0], must), to_sexpr(f)
            assert np.array_equal(unpack(sigs[gid, W + k: W + k + 1], w.domain)[0], may), to_sexpr(f)


@settings(max_examples=10, deadline=None)
@given(SEEDS)
def test_kernel_evaluator_matches_brute_force_on_guarded_formulas(seed):
    """compile_many (quantifiers through the Triton kernel, interpreted) on formulas the enumerator
    emits, re-evaluated on fresh worlds."""
    rng = np.random.default_rng(seed)
    train = [random_world(rng, 4)]
    bank = feature_bank(BitContext(train), 10)
    formulas = [bank.formula(int(i)) for i in rng.choice(bank.count, size=min(12, bank.count), replace=False)]
    fresh = [random_world(rng, int(rng.integers(1, 8))) for _ in range(3)]
    sigs = BitContext(fresh).compile_many(formulas)
    for f, sig in zip(formulas, sigs):
        for k, w in enumerate(fresh):
            assert np.array_equal(unpack(sig[k: k + 1], w.domain)[0], brute_labels(f, w.facts, w.domain)), to_sexpr(f)
