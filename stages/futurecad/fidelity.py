"""Fidelity of a generated script to its description, call by call, without executing it.

The reward (executes × (1 − nCD)) cannot tell a 0.5 mm fillet from a 1 mm chamfer on a 40 mm part, nor the edges
the description named from others, so a model can raise it while ignoring the edit it was asked for. These
measures read the parsed scripts (``cad.parse_script``) against the target script of the same description:

- ``parses``: the generated script is a whitelisted chain of calls;
- ``op``: the fillet/chamfer right after its first ``edges(...)`` call is the description's operation;
- ``size``: with the description's size;
- ``operands``: its ``Query`` names the description's edges (the same edge spec: the query's text with the operation
  word either way, ``cad.query_text``; a ``Query`` the templates never write, or ``Index``, names no spec);
- ``edit``: all three at once, on a single fillet/chamfer step (the whole edit as described);
- ``skeleton``: the names of the calls before that step equal the target's, in order (the part's family and its
  features' kinds and order, whatever the numbers);
- ``base``: every call before that step equals the target's (dimensions, features and positions of the part);
- ``exact``: the whole call chain equals the target's;
- ``calls_f1``: F1 of the two scripts' multisets of content calls (name + arguments; the boilerplate every script
  writes, ``Workplane``/``faces``/``workplane``, left out): partial credit for the part.

A script that does not parse scores 0 on all of them. The target scripts are prepare's (one ``edges(Query)``
step, then ``fillet``/``chamfer``), so they always parse.
"""
from __future__ import annotations

from collections import Counter

from stages.futurecad import cad

KEYS = ("parses", "op", "size", "operands", "edit", "skeleton", "base", "exact", "calls_f1")
BOILERPLATE = frozenset({"Workplane", "faces", "workplane"})   # calls every script makes: no credit for them
EDIT_OPS = ("fillet", "chamfer")
# canonical query text of every edge spec, with either operation word -> the spec
SPEC_OF_QUERY = {cad.query_text(s, op): s for s in cad.EDGE_SPECS for op in EDIT_OPS}


def _edit(calls: list[cad.Call]) -> tuple[list[cad.Call], cad.Call | None, cad.Call | None]:
    """(calls before the first ``edges`` call, that selector call, the fillet/chamfer after it) — None where
    missing."""
    for i, c in enumerate(calls):
        if c.name == "edges":
            op = calls[i + 1] if i + 1 < len(calls) and calls[i + 1].name in EDIT_OPS else None
            return calls[:i], c, op
    return calls, None, None


def _spec(selector: cad.Call | None):
    if selector is None or selector.args[0][0] != "query":
        return None
    return SPEC_OF_QUERY.get(selector.args[0][1])


def calls_f1(a: list[cad.Call], b: list[cad.Call]) -> float:
    """F1 of two multisets of content calls (name and arguments; BOILERPLATE calls left out)."""
    a = [c for c in a if c.name not in BOILERPLATE]
    b = [c for c in b if c.name not in BOILERPLATE]
    common = sum((Counter(a) & Counter(b)).values())
    if not common:
        return 0.0
    p, r = common / len(a), common / len(b)
    return 2 * p * r / (p + r)


def script_fidelity(generated: str, target: str) -> dict[str, float]:
    """The measures above for one generated script against its description's target script."""
    tcalls = cad.parse_script(target)
    try:
        gcalls = cad.parse_script(generated)
    except cad.ScriptError:
        return dict.fromkeys(KEYS, 0.0)
    tbase, tsel, top = _edit(tcalls)
    gbase, gsel, gop = _edit(gcalls)
    if tsel is None or top is None:
        raise ValueError(f"target script has no edges(...).fillet/chamfer step: {target!r}")
    single = gop is not None and gcalls[-1] == gop and sum(c.name == "edges" for c in gcalls) == 1
    op = float(gop is not None and gop.name == top.name)
    size = float(gop is not None and gop.args == top.args)
    operands = float(_spec(gsel) is not None and _spec(gsel) == _spec(tsel))
    return {"parses": 1.0, "op": op, "size": size, "operands": operands,
            "edit": float(single and op and size and operands),
            "skeleton": float([c.name for c in gbase] == [c.name for c in tbase]), "base": float(gbase == tbase),
            "exact": float(gcalls == tcalls), "calls_f1": calls_f1(gcalls, tcalls)}
