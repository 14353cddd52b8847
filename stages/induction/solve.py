"""Solve instances: one formula per instance, by enumeration, the bloated fitter, or both.

    python -m stages.induction.solve --instances IN.jsonl --out OUT.jsonl [--timeout S]
        [--solver portfolio|enum|bloated] [--max-size N] [--max-generated N] [--max-bank N]
        [--grammar auto|guarded|lift] [--small-operand N]

Writes one line per instance: {"id", "formula": s-expr | null, "size", "seconds", "status", "grammar"}
with status "solved" (enumeration found a compact formula), "fallback" (the bloated fitter's formula,
used when enumeration found none within budget) or "none", and grammar the enumeration grammar that ran
on that instance ("lift", "guarded", or "none" for --solver bloated). Lines are written as each instance
is solved, so an interrupted run keeps what it finished.
portfolio (default): bottom-up enumeration within the formula-count budget (--max-generated, a
count, so results do not depend on machine speed); if it finds nothing, the bloated fitter.
--timeout is only a wall-clock safety net per instance (finite, > 0).
--grammar auto (default): per instance, the grammar that reaches its regime -- the two-bank lift
enumerator (stages.induction.lift: quantifier bodies may mention x again, as the benchmark's depth-2/3
families need) for FULLOBS and CI, the guarded grammar for EC (the only one with EC's completion
semantics). --grammar lift / guarded force one (lift on an EC instance still runs guarded). Raise the
reach with --max-size (e.g. 24) and --max-generated / --max-bank (counts, e.g. 10000000 for the depth-3
families).
Bad input (a malformed or non-UTF-8 instance file, --out equal to the input or a directory, a
non-finite --timeout) stops with one line and exit code 2, before any work.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from tqdm import tqdm

from stages.induction.bloated import fit_bloated
from stages.induction.enumerate import SolveResult, synthesize
from stages.induction.formula import flatten, size, to_sexpr
from stages.induction.instances import Instance, InstanceError, load_instances

SOLVERS = ("portfolio", "enum", "bloated")
GRAMMARS = ("auto", "guarded", "lift")


def grammar_for(inst: Instance, grammar: str = "auto") -> str:
    """The enumeration grammar that runs on this instance: lift for fullobs/ci (auto or lift), else guarded."""
    if grammar not in GRAMMARS:
        raise ValueError(f"grammar: expected one of {', '.join(GRAMMARS)} (got {grammar!r})")
    return "lift" if grammar in ("auto", "lift") and inst.regime != "ec" else "guarded"


def solve_instance(inst: Instance, solver: str = "portfolio", timeout_s: float = 60.0, max_size: int = 22,
                   seed: int = 0, completions: int = 8, max_generated: int = 200_000,
                   max_bank: int = 400_000, grammar: str = "auto", small_operand: int = 4) -> tuple[SolveResult, str]:
    """(result, status) with status solved | fallback | none; grammar_for(inst, grammar) says which grammar ran."""
    if solver not in SOLVERS:
        raise ValueError(f"solver: expected one of {', '.join(SOLVERS)} (got {solver!r})")
    chosen = grammar_for(inst, grammar)
    if solver in ("enum", "portfolio"):
        if chosen == "lift":
            from stages.induction.lift import synthesize_lift

            res = synthesize_lift(inst, max_generated=max_generated, max_size=max_size, max_bank=max_bank,
                                  small_operand=small_operand, safety_timeout_s=timeout_s)
            if res.formula is not None:
                res.formula = flatten(res.formula)
                res.size = size(res.formula)
        else:
            res = synthesize(inst, max_generated=max_generated, max_size=max_size, seed=seed,
                             completions=completions, safety_timeout_s=timeout_s, max_bank=max_bank)
        if res.formula is not None:
            return res, "solved"
        if solver == "enum":
            return res, "none"
        spent = res.seconds
        res = fit_bloated(inst, seed=seed)
        res.seconds += spent
        return res, "fallback" if res.formula is not None else "none"
    res = fit_bloated(inst, seed=seed)
    return res, "solved" if res.formula is not None else "none"


def prediction_line(inst: Instance, res: SolveResult, status: str | None = None, grammar: str | None = None) -> dict:
    if status is None:
        status = "solved" if res.formula is not None else "none"
    line = {"id": inst.id, "formula": to_sexpr(res.formula) if res.formula is not None else None,
            "size": res.size, "seconds": round(res.seconds, 4), "status": status}
    if grammar is not None:
        line["grammar"] = grammar
    return line


def check_out_path(out: Path, inputs: list[Path]) -> str | None:
    """A one-line problem with --out, or None: a directory, or the same file as an input."""
    if out.is_dir():
        return f"--out {out} is a directory (expected a file path)"
    for p in inputs:
        try:
            same = out.resolve() == p.resolve()
        except OSError:
            same = False
        if same:
            return f"--out {out} is the same file as the input {p} (it would be overwritten)"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stages.induction.solve", description=__doc__.splitlines()[0])
    ap.add_argument("--instances", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--timeout", type=float, default=60.0, help="wall-clock safety net per instance, seconds")
    ap.add_argument("--solver", choices=SOLVERS, default="portfolio")
    ap.add_argument("--max-size", type=int, default=22, help="enumeration size budget (AST size, inclusive)")
    ap.add_argument("--max-generated", type=int, default=200_000,
                    help="enumeration budget per instance: formulas generated (a count)")
    ap.add_argument("--max-bank", type=int, default=400_000,
                    help="cap on formulas kept after pruning (a count; raise it with --max-generated for deep concepts)")
    ap.add_argument("--grammar", choices=GRAMMARS, default="auto",
                    help="enumeration grammar: auto (lift for fullobs/ci, guarded for ec; the default), guarded "
                         "(unary bank) or lift (unary + binary banks; fullobs/ci)")
    ap.add_argument("--small-operand", type=int, default=4,
                    help="lift grammar: and/or combine two formulas only when one has at most this size")
    ap.add_argument("--seed", type=int, default=0, help="seed of the EC completion samples and tree tie-breaks")
    args = ap.parse_args(argv)
    if not math.isfinite(args.timeout) or args.timeout <= 0:
        print(f"error: --timeout must be a finite number > 0 (got {args.timeout})", file=sys.stderr)
        return 2
    if args.max_size < 2 or args.max_size > 60:
        print(f"error: --max-size must be in 2..60 (got {args.max_size})", file=sys.stderr)
        return 2
    if args.max_generated < 1 or args.max_generated > 10**9:
        print(f"error: --max-generated must be in 1..1000000000 (got {args.max_generated})", file=sys.stderr)
        return 2
    if args.small_operand < 2 or args.small_operand > 20:
        print(f"error: --small-operand must be in 2..20 (got {args.small_operand})", file=sys.stderr)
        return 2
    if args.max_bank < 100 or args.max_bank > 10**8:
        print(f"error: --max-bank must be in 100..100000000 (got {args.max_bank})", file=sys.stderr)
        return 2
    problem = check_out_path(args.out, [args.instances])
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        insts = load_instances(args.instances)
    except InstanceError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    solved, used = 0, {}
    with args.out.open("w") as fh:                 # incremental: each line flushed when solved
        for inst in tqdm(insts, desc="solve", file=sys.stderr):
            res, status = solve_instance(inst, args.solver, args.timeout, args.max_size, args.seed,
                                         max_generated=args.max_generated, max_bank=args.max_bank,
                                         grammar=args.grammar, small_operand=args.small_operand)
            grammar = grammar_for(inst, args.grammar) if args.solver != "bloated" else "none"
            used[grammar] = used.get(grammar, 0) + 1
            fh.write(json.dumps(prediction_line(inst, res, status, grammar)) + "\n")
            fh.flush()
            solved += res.formula is not None
    grammars = ", ".join(f"{g}: {n}" for g, n in sorted(used.items()))
    print(f"solve: {solved}/{len(insts)} instances got a formula (grammar per instance -- {grammars}) -> {args.out}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("solve: interrupted; the lines written so far are kept", file=sys.stderr)
        sys.exit(130)
