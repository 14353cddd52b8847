"""Write the external STEP fixture set shipped in stages/futurecad/step_parts/ (run once, output committed):
four small parts built with CadQuery directly — shapes the procedural generator never makes (an L-bracket
from a union, a flange with a bolt circle, a counterbored block, a plate with a slot and two hole sizes) —
and ``queries.jsonl`` in the BRepGround row schema (``cad.load_step_dir``). The queries were written by
hand for these parts; each names the spec whose geometric predicate gives its labels, and the label
counts are checked against counts made by hand below.

    python -m tests.futurecad.make_step_fixtures
"""
from __future__ import annotations

import json
from pathlib import Path

from stages.common.paths import ROOT
from stages.futurecad import cad

OUT = ROOT / "stages" / "futurecad" / "step_parts"

NONE = None   # no such feature on this part: all-zero labels

# part -> [(id suffix, [queries], spec or NONE, hand-counted members)]
QUERIES = {
    "bracket": [
        ("top_straight", ["fillet the straight edges on the top", "round the four edges at the tip of the upright"],
         ("edges", "straight", "top", ""), 4),
        ("ledge_rim", ["chamfer the circular edges at the step level",
                       "chamfer the rim of the hole where it opens on the ledge"], ("edges", "circular", "step level", ""), 1),
        ("under_rim", ["chamfer the round edge of the hole on the underside"], ("edges", "circular", "bottom", ""), 1),
        ("ledge_face", ["select the flat face on the lower ledge", "select the planar faces at the step level"],
         ("faces", "planar", "step level", ""), 1),
        ("bore", ["select the cylindrical faces"], ("faces", "cylindrical", "sides", ""), 1),
        ("pocket", ["fillet the edges of the hexagonal pocket"], NONE, 0),
    ],
    "flange": [
        ("outer_rim", ["fillet the largest circular edge on the top", "round the outer rim of the upper face"],
         ("edges", "circular", "top", "largest"), 1),
        ("bolt_rims", ["chamfer the smallest circular edges on the top", "deburr the bolt hole rims on the top face"],
         ("edges", "circular", "top", "smallest"), 4),
        ("bottom_circles", ["fillet the circular edges on the bottom"], ("edges", "circular", "bottom", ""), 6),
        ("outer_wall", ["select the largest cylindrical face"], ("faces", "cylindrical", "sides", "largest"), 1),
        ("top_face", ["select the planar face on the top", "select the flat face at the very top"],
         ("faces", "planar", "top", ""), 1),
        ("no_lines", ["chamfer the straight edges on the top"], NONE, 0),
    ],
    "cbore_block": [
        ("corners", ["fillet the vertical straight edges on the sides", "round the upright corners of the block"],
         ("edges", "vertical straight", "sides", ""), 4),
        ("cbore_rim", ["chamfer the circular edges on the top"], ("edges", "circular", "top", ""), 1),
        ("cbore_floor", ["select the planar faces at the step level", "select the floor of the counterbore"],
         ("faces", "planar", "step level", ""), 1),
        ("long_top", ["fillet the longest straight edges on the top"], ("edges", "straight", "top", "longest"), 2),
        ("sphere", ["select the spherical faces"], NONE, 0),
    ],
    "slot_plate": [
        ("big_hole", ["fillet the biggest round edge on the upper side"], ("edges", "circular", "top", "largest"), 1),
        ("small_hole", ["chamfer the smallest circular edges on the top"], ("edges", "circular", "top", "smallest"), 1),
        ("corners", ["fillet the vertical straight edges on the sides"], ("edges", "vertical straight", "sides", ""), 4),
        ("bottom_face", ["select the planar faces on the bottom", "pick the face the plate rests on"],
         ("faces", "planar", "bottom", ""), 1),
        ("short_top", ["chamfer the shortest straight edges on the top"], ("edges", "straight", "top", "shortest"), 2),
        ("keyway", ["chamfer the keyway edges"], NONE, 0),
    ],
}


def build() -> dict:
    import cadquery as cq

    base = cq.Workplane("XY").box(40, 20, 6).translate((0, 0, 3))
    upright = cq.Workplane("XY").box(6, 20, 30).translate((-17, 0, 15))
    bracket = base.union(upright).cut(cq.Workplane("XY").circle(3).extrude(6).translate((8, 0, 0)))
    flange = (cq.Workplane("XY").circle(25).extrude(8).faces(">Z").workplane().hole(16)
              .faces(">Z").workplane().polarArray(16, 0, 360, 4).hole(5))
    cbore = cq.Workplane("XY").box(40, 30, 15).faces(">Z").workplane().cboreHole(6, 10, 4)
    slot = (cq.Workplane("XY").box(60, 25, 5).faces(">Z").workplane().slot2D(20, 6).cutThruAll()
            .faces(">Z").workplane().pushPoints([(-24, 0)]).hole(4).faces(">Z").workplane().pushPoints([(24, 0)]).hole(8))
    return {"bracket": bracket.val(), "flange": flange.val(), "cbore_block": cbore.val(), "slot_plate": slot.val()}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    lines = []
    for name, solid in build().items():
        path = OUT / f"{name}.step"
        cad.write_step(solid, path)
        loaded = cad.load_step(path)
        prims = cad.export_primitives(loaded)
        for suffix, qs, spec, count in QUERIES[name]:
            ids = cad.target_ids(prims, spec) if spec else []
            assert len(ids) == count, (name, suffix, ids, count)
            kind = spec[0] if spec else "edges"
            f = [int(spec is not None and kind == "faces" and i in ids) for i in range(len(prims.face_attr))]
            e = [int(spec is not None and kind == "edges" and i in ids) for i in range(len(prims.edge_attr))]
            lines.append(json.dumps({"id": f"{name}_{suffix}", "step": path.name, "queries": qs,
                                     "face_labels": f, "edge_labels": e}))
    (OUT / cad.STEP_QUERIES).write_text("\n".join(lines) + "\n")
    print(f"{OUT}: {len(QUERIES)} parts, {len(lines)} rows")


if __name__ == "__main__":
    main()
