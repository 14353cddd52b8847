"""The solve CLI's default grammar reaches the instance's regime (issue 53): lift for FULLOBS and CI,
guarded for EC, and every output line says which grammar ran."""
from __future__ import annotations

import json

from stages.induction.families import FamilySpec, generate_families
from stages.induction.generator import GenSpec, generate
from stages.induction.instances import write_instances
from stages.induction.semantics import is_valid
from stages.induction.solve import grammar_for, main as solve_main
from stages.induction.formula import parse


def test_default_grammar_reaches_lift_concepts_and_reports_it(tmp_path, capsys):
    lift_only = generate_families(FamilySpec(per_family=1, seed=0,
                                             families=("guardless_cross_scope_lift_qd2",)))[0][0]
    ec, _ = generate(GenSpec(per_template=1, regimes=("ec",), templates=("unary",), seed=2))
    ci, _ = generate(GenSpec(per_template=1, regimes=("ci",), templates=("unary",), seed=2))
    insts = [lift_only, ec[0], ci[0]]
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_instances(src, insts)
    assert solve_main(["--instances", str(src), "--out", str(out)]) == 0            # defaults only
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["grammar"] for x in lines] == ["lift", "guarded", "lift"]
    assert [grammar_for(i) for i in insts] == ["lift", "guarded", "lift"]
    first = lines[0]                                     # a depth-2 concept the guarded grammar cannot express
    assert first["status"] == "solved" and is_valid(parse(first["formula"]), lift_only)[0]
    assert "grammar per instance -- guarded: 1, lift: 2" in capsys.readouterr().err
    forced = tmp_path / "guarded.jsonl"
    assert solve_main(["--instances", str(src), "--out", str(forced), "--grammar", "guarded",
                       "--max-generated", "2000"]) == 0
    g = [json.loads(x) for x in forced.read_text().splitlines()]
    assert [x["grammar"] for x in g] == ["guarded"] * 3 and g[0]["status"] in ("fallback", "none")
    bloated = tmp_path / "bloated.jsonl"
    assert solve_main(["--instances", str(src), "--out", str(bloated), "--solver", "bloated"]) == 0
    assert {json.loads(x)["grammar"] for x in bloated.read_text().splitlines()} == {"none"}
