"""Fidelity of a generated script to its description (stages/futurecad/fidelity.py), on hand-written scripts whose
measures are counted by hand."""
from __future__ import annotations

import numpy as np
import pytest

from stages.futurecad import cad
from stages.futurecad.fidelity import KEYS, calls_f1, script_fidelity

SPEC, OTHER = cad.EDGE_SPECS[0], cad.EDGE_SPECS[1]
BASE = 'cq.Workplane("XY").box(30, 20, 10).faces(">Z").workplane().center(5, 0).hole(6)'   # 6 calls


def edit(spec, op: str, size, query_op: str | None = None) -> str:
    return f'.edges(Query("{cad.query_text(spec, query_op or op)}")).{op}({size})'


TARGET = BASE + edit(SPEC, "fillet", 1)                                                       # 8 calls


def test_the_target_itself_scores_one_everywhere():
    assert script_fidelity(TARGET, TARGET) == dict.fromkeys(KEYS, 1.0)
    # whitespace and the model's token spacing do not matter: the calls are compared, not the text
    spaced = cad.detokenize_script(cad.script_tokens(TARGET))
    assert spaced != TARGET and script_fidelity(spaced, TARGET) == dict.fromkeys(KEYS, 1.0)


@pytest.mark.parametrize("generated, want", [
    # the other operation on the same edges, same size: of 5 content calls (box, center, hole, edges, op) 3 match
    (BASE + edit(SPEC, "chamfer", 1), dict(op=0, size=1, operands=1, edit=0, skeleton=1, base=1, exact=0,
                                           calls_f1=0.6)),
    # another size
    (BASE + edit(SPEC, "fillet", 0.5), dict(op=1, size=0, operands=1, edit=0, skeleton=1, base=1, exact=0,
                                            calls_f1=4 / 5)),
    # other edges
    (BASE + edit(OTHER, "fillet", 1), dict(op=1, size=1, operands=0, edit=0, skeleton=1, base=1, exact=0,
                                           calls_f1=4 / 5)),
    # the right edit on a part of other dimensions: only box(...) differs
    (BASE.replace("box(30, 20, 10)", "box(40, 16, 5)") + edit(SPEC, "fillet", 1),
     dict(op=1, size=1, operands=1, edit=1, skeleton=1, base=0, exact=0, calls_f1=4 / 5)),
    # a slot instead of the hole: the skeleton (family and feature kinds) differs; box and center(5, 0) still match
    (BASE.replace(".hole(6)", ".slot2D(8, 4).cutBlind(-3)") + edit(SPEC, "fillet", 1),
     dict(op=1, size=1, operands=1, edit=1, skeleton=0, base=0, exact=0, calls_f1=2 * 4 / (6 + 5))),
    # edges by index: no query names the spec
    (BASE + ".edges(Index(2, 5)).fillet(1)", dict(op=1, size=1, operands=0, edit=0, skeleton=1, base=1, exact=0,
                                                  calls_f1=4 / 5)),
    # no edit at all: its 3 content calls are all the target's, 3 of the target's 5 -> F1 = 2·3 / (3 + 5)
    (BASE, dict(op=0, size=0, operands=0, edit=0, skeleton=1, base=1, exact=0, calls_f1=6 / 8)),
    # the edit twice: not the single step the description asks for; 5 of 7 generated content calls match, 5 of 5
    (TARGET + edit(SPEC, "fillet", 1), dict(op=1, size=1, operands=1, edit=0, skeleton=1, base=1, exact=0,
                                            calls_f1=2 * 5 / 12)),
    # a query whose operation word is the other one still names the same edges
    (BASE + edit(SPEC, "fillet", 1, query_op="chamfer"),
     dict(op=1, size=1, operands=1, edit=1, skeleton=1, base=1, exact=0, calls_f1=4 / 5)),
    # a selection with no operation after it (the last call), and one followed by another call: no op, no size
    (BASE + f'.edges(Query("{cad.query_text(SPEC, "fillet")}"))',
     dict(op=0, size=0, operands=1, edit=0, skeleton=1, base=1, exact=0, calls_f1=2 * 4 / 9)),
    (BASE + f'.edges(Query("{cad.query_text(SPEC, "fillet")}")).hole(1)',
     dict(op=0, size=0, operands=1, edit=0, skeleton=1, base=1, exact=0, calls_f1=2 * 4 / 10)),
    # boilerplate alone earns nothing
    ('cq.Workplane("XY").faces(">Z").workplane()', dict(op=0, size=0, operands=0, edit=0, skeleton=0, base=0,
                                                         exact=0, calls_f1=0)),
])
def test_measures_by_hand(generated, want):
    got = script_fidelity(generated, TARGET)
    assert got["parses"] == 1.0
    assert {k: got[k] for k in want} == pytest.approx(want)


@pytest.mark.parametrize("bad", ["", "cq.Workplane(", 'cq.Workplane("XY").box(1, 2)', "import os",
                                 'cq.Workplane("XY").box(3, 3, 3).edges(Query("")).fillet(1)'])
def test_a_script_that_does_not_parse_scores_zero(bad):
    assert script_fidelity(bad, TARGET) == dict.fromkeys(KEYS, 0.0)


def test_a_target_without_an_edit_step_is_refused():
    with pytest.raises(ValueError, match="no edges"):
        script_fidelity(TARGET, BASE)
    with pytest.raises(ValueError, match="no edges"):                  # a selection but no fillet/chamfer
        script_fidelity(TARGET, BASE + f'.edges(Query("{cad.query_text(SPEC, "fillet")}"))')


def test_calls_f1_against_a_brute_force_count():
    """Multiset F1 against counting matches by removing each matched call once (boilerplate never drawn here)."""
    rng = np.random.default_rng(7)
    pool = [cad.Call("box", (float(a), 2.0, 3.0)) for a in range(4)] + [cad.Call("hole", (6.0,)), cad.Call("extrude", (2.0,))]
    for _ in range(200):
        a = [pool[i] for i in rng.integers(len(pool), size=int(rng.integers(1, 7)))]
        b = [pool[i] for i in rng.integers(len(pool), size=int(rng.integers(1, 7)))]
        left, common = list(b), 0
        for c in a:
            if c in left:
                left.remove(c)
                common += 1
        want = 0.0 if common == 0 else 2 * common / (len(a) + len(b))
        assert calls_f1(a, b) == pytest.approx(want)


def test_every_generator_program_scores_one_against_itself():
    rng = np.random.default_rng(3)
    for _ in range(30):
        part = cad.random_part(rng)
        for k in rng.permutation(len(cad.EDGE_SPECS))[:2]:
            spec = cad.EDGE_SPECS[int(k)]
            s = cad.fillet_script(part["script"], spec, "chamfer", 0.5, cad.query_selector(spec, "chamfer"))
            assert script_fidelity(s, s) == dict.fromkeys(KEYS, 1.0)
