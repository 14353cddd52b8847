"""Check predicted formulas against instances: per-instance validity for its regime.

    python -m stages.induction.check --instances IN.jsonl --predictions OUT.jsonl [--out CHECK.jsonl]

Prints one line per instance and a summary, writes per-instance results (JSONL: id, regime,
valid, size, gold_size, error) and exits 0 -- validity is data, not an error. A malformed or
missing formula is reported invalid with the parse error (line, column). A malformed instance or
prediction file (or a prediction file missing an instance id) stops with one line naming the file
line, the instance id and the field, exit code 2.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from stages.induction.formula import FormulaError, parse, size
from stages.induction.instances import Instance, InstanceError, load_instances, load_predictions
from stages.induction.semantics import is_valid


def check_formula(inst: Instance, formula: str | None) -> dict:
    """{id, regime, valid, size, gold_size, error}; never raises on a bad formula."""
    gold_size = size(parse(inst.gold)) if inst.gold else None
    out = {"id": inst.id, "regime": inst.regime, "valid": False, "size": None, "gold_size": gold_size,
           "error": None}
    if formula is None:
        out["error"] = "no formula"
        return out
    try:
        f = parse(formula)
    except FormulaError as err:
        out["error"] = f"parse error: {err}"
        return out
    out["size"] = size(f)
    try:
        ok, reason = is_valid(f, inst)
    except Exception as err:  # z3 giving up, resource limits: report, never crash
        ok, reason = False, f"evaluation failed: {type(err).__name__}: {err}"
    out["valid"] = bool(ok)
    out["error"] = reason or None
    return out


def check_files(instances: Path, predictions: Path) -> list[dict]:
    insts = load_instances(instances)
    preds = load_predictions(predictions, insts)
    extra = sorted(set(preds) - {i.id for i in insts})
    if extra:
        print(f"warning: {predictions}: {len(extra)} prediction(s) for ids not in {instances} "
              f"(ignored), e.g. {extra[0]!r}", file=sys.stderr)
    return [check_formula(inst, preds[inst.id].formula) for inst in insts]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stages.induction.check", description=__doc__.splitlines()[0])
    ap.add_argument("--instances", required=True, type=Path, help="instances JSONL")
    ap.add_argument("--predictions", required=True, type=Path, help="predictions JSONL (id, formula, ...)")
    ap.add_argument("--out", type=Path, default=None, help="per-instance results (default: <predictions>.check.jsonl)")
    args = ap.parse_args(argv)
    out = args.out or args.predictions.with_suffix(".check.jsonl")
    from stages.induction.solve import check_out_path

    problem = check_out_path(out, [args.instances, args.predictions])
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        results = check_files(args.instances, args.predictions)
    except InstanceError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out.write_text("".join(json.dumps(r) + "\n" for r in results))
    per = defaultdict(lambda: [0, 0])
    for r in results:
        per[r["regime"]][0] += r["valid"]
        per[r["regime"]][1] += 1
        status = "valid" if r["valid"] else "INVALID"
        detail = f"size={r['size']}" + (f" gold={r['gold_size']}" if r["gold_size"] else "")
        print(f"{r['id']}\t{r['regime']}\t{status}\t{detail}" + (f"\t{r['error']}" if r["error"] else ""))
    summary = ", ".join(f"{reg}: {v}/{n} valid" for reg, (v, n) in per.items())
    print(f"summary: {summary} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
