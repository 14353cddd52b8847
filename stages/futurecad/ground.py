"""Ground a natural-language query on a STEP part with the trained BRepGround-mini.

    python -m stages.futurecad.ground --step PART.step --query "fillet the circular edges on the top" --out R.json

Loads the checkpoint from data/futurecad/train/ (``--checkpoint`` to choose another), reads the
largest solid of the STEP file, exports its faces/edges in CadQuery's own enumeration order
(``Shape.Faces()``, ``Shape.Edges()``) and writes

    {"step": ..., "query": ..., "checkpoint": ..., "threshold": 0.5, "abstain_threshold": 0.5,
     "abstained": false, "reason": "", "top_score": 0.97, "n_faces": F, "n_edges": E,
     "selected": {"edges": [ids], "faces": [ids]},
     "scores": {"edges": {id: σ(s)}, "faces": {id: σ(s)}}}       (scores of every primitive)

**Abstention.** The grounder answers "no such feature" when no word of the query is in its vocabulary
(nonsense, another language) or when its top score is below the abstention threshold (the checkpoint's
``abstain_threshold``, or ``--abstain-threshold``): the command then exits **0** with
``"abstained": true``, a ``"reason"``, empty selections and the scores, and prints
``<out>: no match (<reason>)``. Callers test ``abstained``, never an empty list alone.

Bad input (missing/malformed STEP, empty query, --out a directory or equal to the STEP file,
missing checkpoint, part larger than the model's primitive slots, thresholds outside (0, 1)) prints one
line and exits 2; nothing is written.
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


def ground_solid(grounder, solid, query: str, threshold: float | None = None,
                 abstain_threshold: float | None = None) -> dict:
    """The grounder's answer to one query on one solid (the evaluate stage compares it with its batch)."""
    from stages.futurecad import cad
    from stages.futurecad.model import known_words
    from stages.futurecad.infer import decide

    prims = cad.export_primitives(solid)
    g = grounder.meta["ground"]
    if len(prims.face_attr) > g["max_faces"] or len(prims.edge_attr) > g["max_edges"]:
        raise UsageError(f"part has {len(prims.face_attr)} faces / {len(prims.edge_attr)} edges; the model "
                         f"takes at most {g['max_faces']} / {g['max_edges']}")
    threshold = g.get("threshold", 0.5) if threshold is None else threshold
    abstain_threshold = g.get("abstain_threshold", 0.5) if abstain_threshold is None else abstain_threshold
    fs, es = grounder.scores(prims, query)
    d = decide(fs, es, known_words(query, grounder.vocab), threshold, abstain_threshold)
    return {"n_faces": len(fs), "n_edges": len(es), "threshold": threshold, "abstain_threshold": abstain_threshold,
            "abstained": d["abstained"], "reason": d["reason"], "top_score": round(d["top_score"], 6),
            "selected": {"edges": d["edges"], "faces": d["faces"]},
            "scores": {"edges": {str(i): round(float(s), 6) for i, s in enumerate(es)},
                       "faces": {str(i): round(float(s), 6) for i, s in enumerate(fs)}}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stages.futurecad.ground", description=__doc__.splitlines()[0])
    ap.add_argument("--step", required=True, type=Path, help="STEP file of the part")
    ap.add_argument("--query", required=True, help="natural-language description of the operands")
    ap.add_argument("--out", required=True, type=Path, help="JSON result file")
    ap.add_argument("--checkpoint", type=Path, default=None, help="BRepGround-mini checkpoint (.pt)")
    ap.add_argument("--threshold", type=float, default=None,
                    help="select primitives with σ(score) above this (default: the checkpoint's)")
    ap.add_argument("--abstain-threshold", type=float, default=None,
                    help="answer 'no match' below this top score (default: the checkpoint's)")
    args = ap.parse_args(argv)
    try:
        if not args.query.strip():
            raise UsageError("--query: empty query")
        for name, v in (("--threshold", args.threshold), ("--abstain-threshold", args.abstain_threshold)):
            if v is not None and not (0.0 < v < 1.0):
                raise UsageError(f"{name}: {v} not in (0, 1)")
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
        from stages.futurecad.infer import ModelGrounder, load_ground

        try:
            solid = cad.load_step(args.step)
        except cad.StepError as err:
            raise UsageError(f"--step: {err}") from None
        try:
            net, meta = load_ground(ckpt)
        except Exception as err:
            raise UsageError(f"--checkpoint: {ckpt} is not a BRepGround-mini checkpoint ({type(err).__name__})") from None
        result = ground_solid(ModelGrounder(net, meta), solid, args.query, args.threshold, args.abstain_threshold)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from stages.common.paths import write_json

    write_json(args.out, {"step": str(args.step), "query": args.query, "checkpoint": str(ckpt), **result})
    sel = result["selected"]
    if result["abstained"]:
        print(f"{args.out}: no match ({result['reason']})")
    else:
        print(f"{args.out}: {len(sel['edges'])} edges, {len(sel['faces'])} faces selected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
