"""Ground a natural-language query on a STEP part with the trained BRepGround-mini.

    python -m stages.futurecad.ground --step PART.step --query "fillet the circular edges on the top" --out R.json

Loads the checkpoint from data/futurecad/train/ (``--checkpoint`` to choose another), reads the
largest solid of the STEP file, exports its faces/edges in CadQuery's own enumeration order
(``Shape.Faces()``, ``Shape.Edges()``) and writes

    {"step": ..., "query": ..., "checkpoint": ..., "threshold": 0.5, "n_faces": F, "n_edges": E,
     "selected": {"edges": [ids], "faces": [ids]},
     "scores": {"edges": {id: σ(s)}, "faces": {id: σ(s)}}}       (scores of every primitive)

Bad input (missing/malformed STEP, empty query, --out a directory or equal to the STEP file,
missing checkpoint, part larger than the model's primitive slots) prints one line and exits 2;
nothing is written.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from stages.common.paths import ROOT

DEFAULT_TRAIN = ROOT / "data" / "futurecad" / "train"


class UsageError(ValueError):
    pass


def default_checkpoint(train_dir: Path = DEFAULT_TRAIN) -> Path:
    models = train_dir / "models.json"
    if not models.exists():
        raise UsageError(f"{train_dir}: no trained model (run `python -m stages train futurecad` first)")
    return train_dir / json.loads(models.read_text())["cli_checkpoint"]


def ground_solid(grounder, solid, query: str, threshold: float = 0.5) -> dict:
    """Scores and selections of one query on one solid (shared with the evaluate stage)."""
    from stages.futurecad import cad

    prims = cad.export_primitives(solid)
    g = grounder.meta["ground"]
    if len(prims.face_attr) > g["max_faces"] or len(prims.edge_attr) > g["max_edges"]:
        raise UsageError(f"part has {len(prims.face_attr)} faces / {len(prims.edge_attr)} edges; the model "
                         f"takes at most {g['max_faces']} / {g['max_edges']}")
    fs, es = grounder.scores(prims, query)
    return {"n_faces": len(fs), "n_edges": len(es), "threshold": threshold,
            "selected": {"edges": [int(i) for i, s in enumerate(es) if s > threshold],
                         "faces": [int(i) for i, s in enumerate(fs) if s > threshold]},
            "scores": {"edges": {str(i): round(float(s), 6) for i, s in enumerate(es)},
                       "faces": {str(i): round(float(s), 6) for i, s in enumerate(fs)}}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stages.futurecad.ground", description=__doc__.splitlines()[0])
    ap.add_argument("--step", required=True, type=Path, help="STEP file of the part")
    ap.add_argument("--query", required=True, help="natural-language description of the operands")
    ap.add_argument("--out", required=True, type=Path, help="JSON result file")
    ap.add_argument("--checkpoint", type=Path, default=None, help="BRepGround-mini checkpoint (.pt)")
    ap.add_argument("--threshold", type=float, default=0.5, help="select primitives with σ(score) above this")
    args = ap.parse_args(argv)
    try:
        if not args.query.strip():
            raise UsageError("--query: empty query")
        if not (0.0 < args.threshold < 1.0):
            raise UsageError(f"--threshold: {args.threshold} not in (0, 1)")
        if not args.step.is_file():
            raise UsageError(f"--step: {args.step} is not a file")
        if args.out.is_dir():
            raise UsageError(f"--out: {args.out} is a directory")
        if args.out.resolve() == args.step.resolve():
            raise UsageError("--out: equals the --step input")
        if not args.out.parent.is_dir():
            raise UsageError(f"--out: folder {args.out.parent} does not exist")
        ckpt = args.checkpoint or default_checkpoint()
        if not ckpt.is_file():
            raise UsageError(f"--checkpoint: {ckpt} not found")
        from stages.futurecad import cad
        from stages.futurecad.train import ModelGrounder, load_ground

        try:
            solid = cad.load_step(args.step)
        except cad.StepError as err:
            raise UsageError(f"--step: {err}") from None
        try:
            net, meta = load_ground(ckpt)
        except Exception as err:
            raise UsageError(f"--checkpoint: {ckpt} is not a BRepGround-mini checkpoint ({type(err).__name__})") from None
        result = ground_solid(ModelGrounder(net, meta), solid, args.query, args.threshold)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from stages.common.paths import write_json

    write_json(args.out, {"step": str(args.step), "query": args.query, "checkpoint": str(ckpt), **result})
    sel = result["selected"]
    print(f"{args.out}: {len(sel['edges'])} edges, {len(sel['faces'])} faces selected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
