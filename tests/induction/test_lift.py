"""Benchmark families and the two-bank lift enumerator: generator facts, exact banks, solutions, CLI."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from stages.induction.families import FAMILIES, FamilySpec, generate_families, make_family_instance
from stages.induction.formula import flatten, parse, quantifier_depth, size, to_sexpr
from stages.induction.generator import GenSpec, generate
from stages.induction.instances import Instance, write_instances
from stages.induction.lift import LiftContext, LiftSearch, synthesize_lift
from stages.induction.enumerate import Budget
from stages.induction.semantics import is_valid
from stages.induction.solve import main as solve_main, solve_instance
from tests.induction.helpers import brute_labels, holds


@pytest.fixture(scope="module")
def fam0():
    return generate_families(FamilySpec(per_family=1, seed=0))


def test_family_instances_follow_the_spec(fam0):
    insts, metas = fam0
    assert [m["family"] for m in metas] == list(FAMILIES)
    for inst, meta in zip(insts, metas):
        gold = parse(inst.gold)
        assert inst.regime == "fullobs" and len(inst.worlds) == 4 and len(meta["heldout"]) == 4
        assert quantifier_depth(gold) in (2, 3) and meta["depth"] == quantifier_depth(gold)
        for w in inst.worlds:
            assert 9 <= w.domain <= 11
            assert np.array_equal(w.labels, brute_labels(gold, w.facts, w.domain))   # independent semantics
            assert 0.15 <= w.labels.mean() <= 0.85
            for r in ("R", "S"):                        # every object has the same out-degree, 2..6
                deg = w.facts[r].sum(1)
                assert deg.min() == deg.max() and 2 <= deg[0] <= 6
    other, _ = generate_families(FamilySpec(per_family=1, seed=1))
    assert [i.gold for i in other] != [i.gold for i in insts] or \
        any(not np.array_equal(a.worlds[0].labels, b.worlds[0].labels) for a, b in zip(other, insts))


def test_family_shapes_need_x_inside_an_inner_scope():
    # every family mentions x inside a quantifier nested in another (outside the guarded fragment)
    rng = np.random.default_rng(3)
    for fam in FAMILIES:
        inst, _ = make_family_instance("t", fam, rng, FamilySpec())
        text = inst.gold
        inner = text[text.index("(", text.index("(", 1) + 1):]
        assert " x" in inner.split("(forall", 1)[-1] or " x" in inner.split("(exists", 2)[-1]


def test_lift_banks_are_exact_against_brute_force():
    """Every kept unary formula and a sample of binary ones: signature == Tarskian evaluation."""
    insts, _ = generate(GenSpec(per_template=1, regimes=("fullobs",), templates=("triangle",), seed=4,
                                min_domain=4, max_domain=5))
    s = LiftSearch(insts[0], 10**6, 4, backend="torch")
    budget = Budget(10**6)
    for n in range(2, 12):
        for _ in s.grow_u(n, budget):
            pass
        s.grow_b(n, budget)
    ctx = s.ctx
    for gid in range(s.U.count):
        f = s.ast_u(gid)
        for k, w in enumerate(ctx.worlds):
            bits = brute_labels(f, w.facts, w.domain)
            assert int(s.U.sig[gid, k]) == int((bits.astype(np.int64) << np.arange(w.domain)).sum()), to_sexpr(f)
    rng = np.random.default_rng(0)
    for gid in rng.choice(s.B.count, size=min(120, s.B.count), replace=False):
        f = s.ast_b(int(gid), "y", 0)
        for row in range(ctx.Wp):
            w = ctx.worlds[ctx.rw[row]]
            want = sum(holds(f, {"x": int(ctx.rx[row]), "y": v}, w.facts, w.domain) << v for v in range(w.domain))
            assert int(s.B.sig[gid, row]) == want, to_sexpr(f)


def test_lift_kernel_paths_agree(fam0):
    """The binary-bank quantifier through the Triton kernel (interpreter) equals the torch reference."""
    inst = fam0[0][3]
    ref = LiftContext(inst.worlds[:2], backend="torch")
    tri = LiftContext(inst.worlds[:2], backend="triton")
    rng = np.random.default_rng(1)
    phi = (rng.integers(0, 1 << 11, size=(7, ref.Wp)) & ref.dom_p[None, :]).astype(np.int32)
    for mode in ("exists", "forall"):
        assert np.array_equal(ref.quantify([0, 1, 2, 3], phi, mode), tri.quantify([0, 1, 2, 3], phi, mode))


@pytest.mark.parametrize("k", [0, 3, 5])    # guardless cross-scope, binary-guard incoming, compact ∃∀
def test_lift_solves_depth2_families_at_gold_size_deterministically(fam0, k):
    inst, meta = fam0[0][k], fam0[1][k]
    r1 = synthesize_lift(inst, max_generated=600_000, max_size=24, backend="torch")
    r2 = synthesize_lift(inst, max_generated=600_000, max_size=24, backend="torch")
    assert r1.status == "found" and to_sexpr(r1.formula) == to_sexpr(r2.formula) and r1.generated == r2.generated
    assert is_valid(r1.formula, inst)[0]
    assert size(flatten(r1.formula)) <= meta["gold_size"]
    assert quantifier_depth(r1.formula) >= 2


def test_lift_budget_is_a_count(fam0):
    inst = fam0[0][9]                                    # nested containment: not reachable with 50k
    r = synthesize_lift(inst, max_generated=50_000, max_size=24, backend="torch")
    assert r.formula is None and r.status == "budget" and 50_000 <= r.generated < 200_000


def test_lift_rejects_ec_and_solve_falls_back_to_guarded():
    insts, _ = generate(GenSpec(per_template=1, regimes=("ec",), templates=("some_succ",), seed=0))
    with pytest.raises(ValueError, match="ec"):
        synthesize_lift(insts[0])
    res, status = solve_instance(insts[0], "enum", max_generated=50_000, grammar="lift")
    assert status in ("solved", "none")


def test_solve_cli_grammar_lift(tmp_path, fam0, capsys):
    src = tmp_path / "in.jsonl"
    write_instances(src, [fam0[0][0]])
    out = tmp_path / "out.jsonl"
    assert solve_main(["--instances", str(src), "--out", str(out), "--grammar", "lift", "--max-size", "24",
                       "--max-generated", "300000"]) == 0
    line = json.loads(out.read_text())
    assert line["status"] == "solved" and line["size"] == size(parse(line["formula"])) <= 11
    bad = tmp_path / "bad.jsonl"
    assert solve_main(["--instances", str(src), "--out", str(bad), "--grammar", "lift", "--small-operand", "1"]) == 2
    assert not bad.exists() and "--small-operand" in capsys.readouterr().err


def test_store_dedup_equals_a_row_by_row_scan():
    """A bank keeps exactly the rows (and order) a row-by-row scan over whole signatures keeps, also when the
    bank cap cuts a batch."""
    from stages.induction import lift as lift_mod

    rng = np.random.default_rng(5)
    store, seen, limit = lift_mod.Store(3), set(), 150
    for batch in range(12):
        sig = rng.integers(0, 4, size=(int(rng.integers(0, 60)), 3)).astype(np.int32)
        want = []
        for i, row in enumerate(sig):
            if len(seen) + len(want) >= limit:
                break
            key = row.tobytes()
            if key not in seen and all(sig[j].tobytes() != key for j in want):
                want.append(i)
        got = store.add(sig, np.zeros((len(sig), 3), np.int64), limit)
        assert got.tolist() == want, batch
        seen.update(sig[i].tobytes() for i in want)
        assert store.count == len(seen)
    assert {store.sig[i].tobytes() for i in range(store.count)} == seen
