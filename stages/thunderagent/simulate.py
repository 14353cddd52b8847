"""Replay a JSONL workload through the cluster simulator under one scheduling policy.

    python -m stages.thunderagent.simulate --workload W.jsonl --policy thunderagent|vllm|continuum --out R.json
        [--backends N] [--capacity TOKENS] [--seed 0] [--aging-half-life S] [--no-skip-after S]
        [--workers N --window W0 W1 [--stop-at S]]

Workload format: the module docstring of stages/thunderagent/workload.py (or an official trace directory
converted by ``python -m stages.thunderagent.official_trace``). R.json holds throughput (steps/min: LLM calls
÷ makespan; with ``--window``: calls completed in [W0, W1) per minute, the official steady-state metric),
KV hit rate (official: mean over calls of cached/prompt tokens), KV reuse rate, recomputed tokens,
preemptions, pauses, TTFR percentiles (arrival → first LLM response, simulated seconds) and TTFR per
program prompt size, memory imbalance across backends. ``--workers N`` runs a closed loop: N programs at
once, each finished program's worker starts the next one in file order (arrival_s ignored). Cost model:
stages/thunderagent/costmodel.py (GPU constants, sources there).

Bad input (unreadable or invalid workload, unknown policy, a program the capacity rule refuses, a
workload that needs more simulation events than the limit, --out a directory or equal to the workload)
prints one line and exits 2 before any work; R.json is written atomically (temp file + rename), never
half-written, and never holds NaN or Infinity (a non-finite number is written as null and named under
"nonfinite").
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

from stages.common.paths import atomic_write_text
from stages.thunderagent.sim import SchedConfig, SimulationError, check_work, simulate
from stages.thunderagent.workload import MAX_ARRIVAL_S, WorkloadError, check_capacity, load_workload

POLICIES = ("thunderagent", "vllm", "continuum")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2
        print(f"simulate: {message}", file=sys.stderr)
        raise SystemExit(2)


def _nonneg(hi: float):
    def f(v: str) -> float:
        try:
            x = float(v)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number (got {v[:40]})") from None
        if not math.isfinite(x) or x < 0 or x > hi:
            raise argparse.ArgumentTypeError(f"must be a finite number in [0, {hi:g}] (got {v[:40]})")
        return x
    return f


def _posint(lo: int, hi: int):
    def f(v: str) -> int:
        try:
            x = int(v)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer (got {v[:40]})") from None
        if not lo <= x <= hi:
            raise argparse.ArgumentTypeError(f"must be in [{lo}, {hi}] (got {v[:40]})")
        return x
    return f


def finite_json(obj, path: str = "", bad: list | None = None):
    """A copy of obj with every non-finite float replaced by None; `bad` collects their paths."""
    if isinstance(obj, float) and not math.isfinite(obj):
        if bad is not None:
            bad.append(path or ".")
        return None
    if isinstance(obj, dict):
        return {k: finite_json(v, f"{path}.{k}" if path else str(k), bad) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v, f"{path}[{i}]", bad) for i, v in enumerate(obj)]
    return obj


def dumps_finite(obj) -> str:
    bad: list[str] = []
    clean = finite_json(obj, "", bad)
    if bad:
        clean["nonfinite"] = {"paths": bad[:50], "reason": "not a finite number (e.g. no program in the window)"}
    return json.dumps(clean, indent=2, allow_nan=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = _Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", required=True, type=Path)
    ap.add_argument("--policy", required=True)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--backends", type=_posint(1, 64))
    ap.add_argument("--capacity", type=_posint(1, 10**9), help="KV tokens per backend (overrides the file)")
    ap.add_argument("--seed", type=_posint(0, 2**32 - 1), default=0)
    ap.add_argument("--aging-half-life", type=_nonneg(1e6), default=0.0, help="starvation fix (0 = off)")
    ap.add_argument("--no-skip-after", type=_nonneg(1e6), default=0.0, help="starvation bound in s (0 = off)")
    ap.add_argument("--workers", type=_posint(0, 100_000), default=0, help="closed loop with N workers (0 = open loop)")
    ap.add_argument("--window", type=_nonneg(MAX_ARRIVAL_S), nargs=2, metavar=("W0", "W1"),
                    help="steady-state window in simulated seconds")
    ap.add_argument("--stop-at", type=_nonneg(MAX_ARRIVAL_S), help="stop the run at this simulated time")
    args = ap.parse_args(argv)
    sched = SchedConfig(aging_half_life_s=args.aging_half_life, no_skip_after_s=args.no_skip_after)
    try:
        if args.policy not in POLICIES:
            raise WorkloadError(f"--policy: unknown policy {args.policy!r} (choose {', '.join(POLICIES)})")
        if args.window is not None and not args.window[0] < args.window[1]:
            raise WorkloadError(f"--window: W0 must be < W1 (got {args.window[0]:g} {args.window[1]:g})")
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
        if args.stop_at is None:
            check_work(wl, args.policy, sched)
        from stages.thunderagent.costmodel import gpu_cost_model

        res = simulate(wl, args.policy, gpu_cost_model()[0], sched=sched, seed=args.seed, workers=args.workers,
                       window_s=tuple(args.window) if args.window else None, stop_at_s=args.stop_at)
    except (WorkloadError, SimulationError) as err:
        print(f"simulate: {err}", file=sys.stderr)
        return 2
    res["workload"] = str(args.workload)
    res["cluster"] = dataclasses.asdict(wl.cluster)
    res["time_unit"] = "simulated seconds (cost model), not wall-clock"
    atomic_write_text(args.out, dumps_finite(res))
    extra = f", window {res['window_steps_per_min']:.2f} steps/min" if "window_steps_per_min" in res else ""
    print(f"{args.policy}: {res['steps_per_min']:.2f} steps/min{extra}, KV hit {res['kv_hit_rate']:.3f}, "
          f"recomputed {res['recomputed_tokens']} tokens, TTFR p95 {res['ttfr_p95_s']:.1f} simulated s -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
