"""Solve instances: one formula per instance, by enumeration, the bloated fitter, or both.

    python -m stages.induction.solve --instances IN.jsonl --out OUT.jsonl [--timeout S]
        [--solver portfolio|enum|bloated] [--max-size N]

Writes one line per instance: {"id", "formula": s-expr | null, "size", "seconds"}.
portfolio (default): bottom-up enumeration within the time budget; if it finds nothing, the
bloated fitter (valid on the training worlds whenever the objects' types separate).
A malformed instance file stops with one line naming the file line, instance id and field (exit 2).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tqdm import tqdm

from stages.induction.bloated import fit_bloated
from stages.induction.enumerate import SolveResult, synthesize
from stages.induction.formula import to_sexpr
from stages.induction.instances import Instance, InstanceError, load_instances

SOLVERS = ("portfolio", "enum", "bloated")


def solve_instance(inst: Instance, solver: str = "portfolio", timeout_s: float = 2.0, max_size: int = 20,
                   seed: int = 0, completions: int = 8) -> tuple[SolveResult, str]:
    if solver not in SOLVERS:
        raise ValueError(f"solver: expected one of {', '.join(SOLVERS)} (got {solver!r})")
    if solver in ("enum", "portfolio"):
        res = synthesize(inst, timeout_s=timeout_s, max_size=max_size, seed=seed, completions=completions)
        if res.formula is not None or solver == "enum":
            return res, "enum"
        spent = res.seconds
        res = fit_bloated(inst)
        res.seconds += spent
        return res, "bloated"
    return fit_bloated(inst), "bloated"


def prediction_line(inst: Instance, res: SolveResult) -> dict:
    return {"id": inst.id, "formula": to_sexpr(res.formula) if res.formula is not None else None,
            "size": res.size, "seconds": round(res.seconds, 4)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stages.induction.solve", description=__doc__.splitlines()[0])
    ap.add_argument("--instances", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--timeout", type=float, default=2.0, help="enumeration budget per instance, seconds")
    ap.add_argument("--solver", choices=SOLVERS, default="portfolio")
    ap.add_argument("--max-size", type=int, default=20, help="enumeration size budget (AST size)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the EC completion samples")
    args = ap.parse_args(argv)
    if args.timeout <= 0 or args.max_size < 2:
        print("error: --timeout must be > 0 and --max-size >= 2", file=sys.stderr)
        return 2
    try:
        insts = load_instances(args.instances)
    except InstanceError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(1)
    lines = []
    for inst in tqdm(insts, desc="solve", file=sys.stderr):
        res, _ = solve_instance(inst, args.solver, args.timeout, args.max_size, args.seed)
        lines.append(json.dumps(prediction_line(inst, res)) + "\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(lines))
    solved = sum(json.loads(s)["formula"] is not None for s in lines)
    print(f"solve: {solved}/{len(insts)} instances got a formula -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
