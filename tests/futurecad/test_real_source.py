"""The real-format loader (issue 42): a STEP directory + queries.jsonl in the BRepGround row schema, read by
``cad.load_step_dir`` on the fixture set the repo ships (stages/futurecad/step_parts, made with CadQuery by
tests/futurecad/make_step_fixtures.py). Labels are checked against geometry measured here by hand (radii,
z-levels, counts), and malformed directories give one-line errors."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from stages.common.paths import ROOT
from stages.common.sources import check_source
from stages.futurecad import SOURCES, cad

FIXTURE = ROOT / "stages" / "futurecad" / "step_parts"


@pytest.mark.real_source
def test_step_dir_fixture():
    rows = cad.load_step_dir(FIXTURE)
    by_id = {r["id"]: r for r in rows}
    assert len({r["step"] for r in rows}) == 4 and len(rows) == 23
    for r in rows:
        p = r["prims"]
        assert len(r["face_labels"]) == len(p.face_attr) == p.faces.shape[0]
        assert len(r["edge_labels"]) == len(p.edge_attr) == p.edges.shape[0]
        assert p.faces.shape[1:] == (cad.UV * cad.UV, cad.FACE_CH) and p.edges.shape[1:] == (cad.CURVE, cad.EDGE_CH)
        assert np.abs(p.faces[..., :3]).max() <= 1 + 1e-6        # UV grids in the part's normalised frame
        # ids in CadQuery's own enumeration order of the loaded solid
        assert len(p.edge_attr) == len(r["solid"].Edges()) and len(p.face_attr) == len(r["solid"].Faces())
    # flange: outer rim radius 25 at the top, four bolt rims radius 2.5 at the top
    fl = by_id["flange_outer_rim"]
    (i,) = [k for k, v in enumerate(fl["edge_labels"]) if v]
    e = fl["solid"].Edges()[i]
    assert e.geomType() == "CIRCLE" and e.radius() == pytest.approx(25) and e.Center().z == pytest.approx(8)
    bolts = [k for k, v in enumerate(by_id["flange_bolt_rims"]["edge_labels"]) if v]
    assert len(bolts) == 4 and all(fl["solid"].Edges()[k].radius() == pytest.approx(2.5) for k in bolts)
    # bracket: the straight top edges are the four at z = 30 (the upright's tip)
    br = by_id["bracket_top_straight"]
    top = [k for k, v in enumerate(br["edge_labels"]) if v]
    pts = br["prims"].edge_points()
    assert len(top) == 4 and np.allclose(pts[top][..., 2], 30, atol=1e-6)
    # counterbored block: the floor of the counterbore is the one planar up-facing face at z = 15 − 4
    cb = by_id["cbore_block_cbore_floor"]
    (f,) = [k for k, v in enumerate(cb["face_labels"]) if v]
    face = cb["solid"].Faces()[f]
    assert face.geomType() == "PLANE" and face.Center().z == pytest.approx(15 / 2 - 4, abs=1e-6)
    # absent-feature rows: all-zero labels; every row has at least one query
    for rid in ("bracket_pocket", "flange_no_lines", "cbore_block_sphere", "slot_plate_keyway"):
        assert not any(by_id[rid]["face_labels"]) and not any(by_id[rid]["edge_labels"])
    assert all(r["queries"] for r in rows)
    assert check_source(SOURCES[0]) == []


@pytest.mark.real_source
@pytest.mark.parametrize("mutate,msg", [
    (lambda d: (d / cad.STEP_QUERIES).write_text("{not json\n"), "not a JSON object"),
    (lambda d: (d / cad.STEP_QUERIES).write_text(json.dumps({"id": "x", "step": "nope.step", "queries": ["q"],
                                                            "face_labels": [], "edge_labels": []}) + "\n"),
     "is not a file"),
    (lambda d: (d / cad.STEP_QUERIES).write_text(json.dumps({"id": "x", "step": "../flange.step", "queries": ["q"],
                                                            "face_labels": [], "edge_labels": []}) + "\n"),
     "is not a file"),
    (lambda d: (d / cad.STEP_QUERIES).write_text(json.dumps({"id": "x", "step": "flange.step", "queries": ["q"],
                                                            "face_labels": [0], "edge_labels": [0]}) + "\n"),
     "face_labels must be"),
    (lambda d: (d / cad.STEP_QUERIES).write_text(json.dumps({"id": "x", "step": "flange.step", "queries": [],
                                                            "face_labels": [], "edge_labels": []}) + "\n"),
     "queries"),
    (lambda d: (d / cad.STEP_QUERIES).unlink(), "no queries.jsonl"),
    (lambda d: ((d / "flange.step").write_text("ISO-10303-21;\ngarbage\n"),
                (d / cad.STEP_QUERIES).write_text(json.dumps({"id": "x", "step": "flange.step", "queries": ["q"],
                                                             "face_labels": [], "edge_labels": []}) + "\n")),
     "not a readable STEP"),
])
def test_step_dir_bad_input(tmp_path, mutate, msg):
    d = tmp_path / "parts"
    shutil.copytree(FIXTURE, d)
    mutate(d)
    with pytest.raises(cad.StepError, match=msg) as err:
        cad.load_step_dir(d)
    assert "\n" not in str(err.value)
