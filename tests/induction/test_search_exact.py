"""Small decisive cases for the enumerator (issues 24/33): minimality against an unpruned brute
force, inclusive max_size, cost == AST size, count budgets are deterministic, exact dedup under
hash collisions, CI semantics (every NO world must differ), EC with R(a,b)/R(b,a) both unknown."""
from __future__ import annotations

import numpy as np
import pytest

from stages.induction import enumerate as en
from stages.induction.bitset import ENUM_GUARDS, BitContext
from stages.induction.enumerate import Goal, feature_bank, synthesize
from stages.induction.formula import And, Atom, Not, Or, Quant, parse, size, to_sexpr
from stages.induction.instances import Instance, World, empty_atoms
from stages.induction.semantics import is_valid, world_explainable
from tests.induction.helpers import brute_labels, random_world


# ---------------------------------------------------------------- unpruned brute force
def _brute_force_sizes(worlds: list[World], max_size: int) -> dict[int, list]:
    """Every formula of the enumerator's grammar up to max_size, NO pruning, each with its truth
    vectors computed by the textbook (Tarskian) evaluator. size -> [(formula, tuple of labels)]."""
    by_size: dict[int, list] = {n: [] for n in range(2, max_size + 1)}

    def add(f):
        n = size(f)
        if n <= max_size:
            by_size[n].append((f, tuple(brute_labels(f, w.facts, w.domain).tobytes() for w in worlds)))

    y = "y"
    for n in range(2, max_size + 1):
        if n == 2:
            add(Atom("P", ("x",)))
            add(Atom("Q", ("x",)))
        if n == 3:
            add(Atom("R", ("x", "x")))
            add(Atom("S", ("x", "x")))
        for f, _ in by_size.get(n - 1, []):
            add(Not(f))
        for i in range(2, n - 2):
            j = n - 1 - i
            for f, _ in by_size[i]:
                for g, _ in by_size.get(j, []):
                    add(And((f, g)))
                    add(Or((f, g)))
        # quantifiers over a unary body U(y): the body is any smaller formula with every variable shifted
        for body_size in range(2, n - 1):
            for f, _ in by_size[body_size]:
                u = _shift(f)
                if body_size == n - 2:
                    add(Quant("exists", y, u))
                    add(Quant("forall", y, u))
                for g in ENUM_GUARDS:
                    if 3 + g.size + body_size == n:
                        add(Quant("exists", y, And((g.literal("x", y, "z"), u))))
                    if 3 + g.complement_size + body_size == n:
                        add(Quant("forall", y, Or((g.complement_literal("x", y, "z"), u))))
        for g in ENUM_GUARDS:
            if 2 + g.size == n:
                add(Quant("exists", y, g.literal("x", y, "z")))
                add(Quant("forall", y, g.literal("x", y, "z")))
    return by_size


_NEXT = {"x": "y", "y": "z", "z": "w", "w": "v", "v": "u", "u": "t"}


def _shift(f):
    """The same formula with x -> y, y -> z, ... (a unary formula in y, no capture)."""
    if isinstance(f, Atom):
        return Atom(f.pred, tuple(_NEXT[a] for a in f.args))
    if isinstance(f, Not):
        return Not(_shift(f.child))
    if isinstance(f, (And, Or)):
        return type(f)(tuple(_shift(c) for c in f.children))
    return Quant(f.kind, _NEXT[f.var], _shift(f.body))


def _fullobs(worlds, gold) -> Instance:
    for w in worlds:
        w.labels = brute_labels(gold, w.facts, w.domain)
    return Instance("t", "fullobs", worlds, to_sexpr(gold))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_enumeration_is_minimal_against_unpruned_brute_force(seed):
    rng = np.random.default_rng(seed)
    worlds = [random_world(rng, int(rng.integers(3, 5)), p=0.45) for _ in range(2)]
    golds = ["(exists y (and (R x y) (Q y)))", "(and (P x) (not (Q x)))", "(forall y (or (not (S y x)) (P y)))",
             "(exists y (and (R x y) (S y x)))"]
    inst = _fullobs(worlds, parse(golds[seed]))
    target = tuple(w.labels.tobytes() for w in worlds)
    limit = 9
    brute = _brute_force_sizes(worlds, limit)
    brute_min = next((n for n in range(2, limit + 1) if any(t == target for _, t in brute[n])), None)
    assert brute_min is not None                          # every gold above has size <= 9
    res = synthesize(inst, max_generated=10**7, max_size=limit)
    assert res.formula is not None and is_valid(res.formula, inst)[0]
    assert res.size == brute_min, (to_sexpr(res.formula), brute_min)


def test_max_size_is_inclusive():
    rng = np.random.default_rng(4)
    inst = _fullobs([random_world(rng, 5, p=0.4) for _ in range(3)], parse("(exists y (and (R x y) (P y)))"))
    found = synthesize(inst, max_size=8)
    assert found.size == 8                               # minimal here (checked: nothing smaller is valid)
    assert synthesize(inst, max_size=8).formula is not None
    below = synthesize(inst, max_size=7)
    assert below.formula is None and below.status == "size_limit"


def test_every_production_costs_the_ast_size_it_builds():
    rng = np.random.default_rng(2)
    worlds = [random_world(rng, D) for D in (3, 4)]
    bank = feature_bank(BitContext(worlds), 13)
    for n, ids in bank.levels.items():
        for gid in ids[:: max(1, len(ids) // 40)]:
            assert size(bank.formula(int(gid))) == n, to_sexpr(bank.formula(int(gid)))


def test_compound_and_back_guard_costs():
    for g in ENUM_GUARDS:
        assert size(g.literal("x", "y", "z")) == g.size
        assert size(g.complement_literal("x", "y", "z")) == g.complement_size


def test_count_budget_is_deterministic_and_stops_the_search():
    from stages.induction.generator import GenSpec, generate

    inst = next(i for i, m in zip(*generate(GenSpec(per_template=1, regimes=("ci",), seed=2, templates=("chain3",))))
                if True)
    a = synthesize(inst, max_generated=3_000, max_size=22)
    b = synthesize(inst, max_generated=3_000, max_size=22)
    assert (a.status, a.generated, a.bank) == (b.status, b.generated, b.bank)
    assert a.status in ("budget", "found")
    if a.status == "budget":
        assert 3_000 <= a.generated < 3_000 + 100_000        # stops within one batch of the budget
    full = synthesize(inst, max_generated=15_000, max_size=22)
    full2 = synthesize(inst, max_generated=15_000, max_size=22)
    assert (full.status, full.generated) == (full2.status, full2.generated)
    assert (to_sexpr(full.formula) if full.formula else None) == (to_sexpr(full2.formula) if full2.formula else None)


def test_dedup_is_exact_under_hash_collisions(monkeypatch):
    rng = np.random.default_rng(0)
    worlds = [random_world(rng, D) for D in (3, 4)]
    honest = feature_bank(BitContext(worlds), 8)
    monkeypatch.setattr(en, "row_hash", lambda sig: np.zeros(len(sig), dtype=np.uint64))   # every row collides
    colliding = feature_bank(BitContext(worlds), 8)
    assert colliding.count == honest.count and colliding.collisions > 0
    a, b = honest._cat()[0], colliding._cat()[0]
    assert {r.tobytes() for r in a} == {r.tobytes() for r in b}


def _world(D, facts=None, unknown=None, labels=(), kind="yes"):
    f, u = empty_atoms(D), empty_atoms(D)
    for k, v in (facts or {}).items():
        for idx in v:
            f[k][idx] = True
    for k, v in (unknown or {}).items():
        for idx in v:
            u[k][idx] = True
    return World(D, f, u, np.array(labels, bool), kind)


def test_ci_every_no_world_must_differ():
    yes = _world(3, {"P": [0, 2]}, labels=[1, 0, 1])
    no1 = _world(3, {"P": [1]}, labels=[0, 0, 1], kind="no")        # (P x) gives 010: differs
    no2 = _world(3, {"P": [0]}, labels=[1, 0, 0], kind="no")        # (P x) gives 100: matches -> invalid
    f = parse("(P x)")
    assert is_valid(f, Instance("c", "ci", [yes, no1]))[0]
    assert not is_valid(f, Instance("c", "ci", [yes, no1, no2]))[0]     # one matching NO world suffices to fail
    for worlds, expect in (([yes, no1, no2], False), ([yes, no1], True), ([yes, no2, no1], False)):
        ctx = BitContext(worlds)                           # the enumerator's vectorized test agrees
        assert Goal(Instance("c", "ci", worlds), ctx).candidates(ctx.compile_many([f]))[0] == expect


def test_ec_r_ab_and_r_ba_both_unknown_need_different_values():
    # R(0,1) and R(1,0) unknown; labels [1, 0] for "x has an R-successor that is not an R-predecessor"
    w = _world(2, unknown={"R": [(0, 1), (1, 0)]}, labels=[1, 0])
    asym = parse("(exists y (and (R x y) (not (R y x))))")
    mutual = parse("(exists y (and (R x y) (R y x)))")
    assert world_explainable(asym, w)                      # needs R(0,1)=1, R(1,0)=0
    assert not world_explainable(mutual, w)                # mutual edges force equal labels for 0 and 1
    w2 = _world(2, unknown={"R": [(0, 1), (1, 0)]}, labels=[0, 1])
    assert world_explainable(asym, w2)                     # the other world: R(0,1)=0, R(1,0)=1
    inst = Instance("e", "ec", [w, w2, _world(3, {"R": [(0, 1)]}, labels=[1, 0, 0])])
    res = synthesize(inst, max_generated=10**6, max_size=12)
    assert res.formula is not None and is_valid(res.formula, inst)[0]


@pytest.mark.parametrize("three_valued", [False, True])
def test_compound_and_back_guards_compile_to_their_semantics(three_valued):
    """Every extended guard, under exists and forall with a body, through the kernel == textbook
    semantics (fully observed) or == the Kleene bounds (EC planes 0/1)."""
    from stages.induction.semantics import evaluate3

    rng = np.random.default_rng(11)
    worlds = [random_world(rng, D, p=0.4, unknown=0.25 if three_valued else 0.0) for D in (3, 5, 4)]
    ctx = BitContext(worlds, completions=1, seed=0, three_valued=three_valued)
    u = Atom("P", ("y",))
    formulas = []
    for g in ENUM_GUARDS[9::3]:                        # a third of the compound and back guards
        formulas.append(Quant("exists", "y", And((g.literal("x", "y", "z"), u))))
        formulas.append(Quant("forall", "y", Or((g.complement_literal("x", "y", "z"), u))))
        formulas.append(Quant("exists", "y", g.literal("x", "y", "z")))
    sigs = ctx.compile_many(formulas)
    W = len(worlds)
    for f, sig in zip(formulas, sigs):
        for k, w in enumerate(worlds):
            got = ((sig[k] >> np.arange(w.domain)) & 1).astype(bool)
            if three_valued:
                must, may = evaluate3(f, w)
                got_may = ((sig[W + k] >> np.arange(w.domain)) & 1).astype(bool)
                assert np.array_equal(got, must) and np.array_equal(got_may, may), to_sexpr(f)
            else:
                assert np.array_equal(got, brute_labels(f, w.facts, w.domain)), to_sexpr(f)
