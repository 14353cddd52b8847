"""Replay a JSONL workload through the cluster simulator under one scheduling policy.

    python -m stages.thunderagent.simulate --workload W.jsonl --policy thunderagent|vllm|continuum --out R.json
        [--backends N] [--capacity TOKENS] [--seed 0] [--aging-half-life S] [--no-skip-after S]

Workload format: the module docstring of stages/thunderagent/workload.py. R.json holds throughput
(steps/min: LLM calls completed ÷ makespan), KV hit rate (official: mean over calls of cached/prompt
tokens), KV reuse rate, recomputed tokens, preemptions, pauses, TTFR percentiles (arrival → first
LLM response) and TTFR per program prompt size, memory imbalance across backends. Cost model: the
nominal one in stages/thunderagent/sim.py (CostModel).

Bad input (unreadable or invalid workload, unknown policy, a prompt larger than the KV capacity,
--out a directory or equal to the workload) prints one line and exits 2 before any work; R.json is
written atomically (temp file + rename), never half-written.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

from stages.common.paths import atomic_write_text
from stages.thunderagent.sim import SchedConfig, simulate
from stages.thunderagent.workload import WorkloadError, check_capacity, load_workload

POLICIES = ("thunderagent", "vllm", "continuum")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2
        print(f"simulate: {message}", file=sys.stderr)
        raise SystemExit(2)


def _nonneg(v: str) -> float:
    x = float(v)
    if not math.isfinite(x) or x < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0 (got {v})")
    return x


def _posint(lo: int, hi: int):
    def f(v: str) -> int:
        x = int(v)
        if not lo <= x <= hi:
            raise argparse.ArgumentTypeError(f"must be in [{lo}, {hi}] (got {v})")
        return x
    return f


def main(argv: list[str] | None = None) -> int:
    ap = _Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", required=True, type=Path)
    ap.add_argument("--policy", required=True)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--backends", type=_posint(1, 64))
    ap.add_argument("--capacity", type=_posint(1, 10**9), help="KV tokens per backend (overrides the file)")
    ap.add_argument("--seed", type=_posint(0, 2**32 - 1), default=0)
    ap.add_argument("--aging-half-life", type=_nonneg, default=0.0, help="starvation fix (0 = off)")
    ap.add_argument("--no-skip-after", type=_nonneg, default=0.0, help="starvation bound in s (0 = off)")
    args = ap.parse_args(argv)
    try:
        if args.policy not in POLICIES:
            raise WorkloadError(f"--policy: unknown policy {args.policy!r} (choose {', '.join(POLICIES)})")
        if args.out.exists() and args.out.is_dir():
            raise WorkloadError(f"--out: {args.out} is a directory")
        if args.out.resolve() == args.workload.resolve():
            raise WorkloadError("--out: must not be the workload file itself")
        if not args.out.parent.exists():
            raise WorkloadError(f"--out: directory {args.out.parent} does not exist")
        wl = load_workload(args.workload)
        over = {k: v for k, v in (("backends", args.backends), ("kv_capacity_tokens", args.capacity)) if v is not None}
        if over:
            wl.cluster = dataclasses.replace(wl.cluster, **over)
        check_capacity(wl, args.workload.name)
    except WorkloadError as err:
        print(f"simulate: {err}", file=sys.stderr)
        return 2
    sched = SchedConfig(aging_half_life_s=args.aging_half_life, no_skip_after_s=args.no_skip_after)
    res = simulate(wl, args.policy, sched=sched, seed=args.seed)
    res["workload"] = str(args.workload)
    res["cluster"] = dataclasses.asdict(wl.cluster)
    atomic_write_text(args.out, json.dumps(res, indent=2) + "\n")
    print(f"{args.policy}: {res['steps_per_min']:.2f} steps/min, KV hit {res['kv_hit_rate']:.3f}, "
          f"recomputed {res['recomputed_tokens']} tokens, TTFR p95 {res['ttfr_p95_s']:.1f} s -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
