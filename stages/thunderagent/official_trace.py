"""Loader for the official ThunderAgent agent traces (SWE-agent-profile run directories) → a Workload.

    python -m stages.thunderagent.official_trace RUN_DIR --out W.jsonl [--shared-prefix 0] [--backends 2]
        [--capacity 100000]
    python -m stages.thunderagent.simulate --workload W.jsonl --policy thunderagent --workers 32 --out R.json

Format (as written by the official profiling harness, e.g. ThunderAgent-org/ThunderAgent
SWE-agent-profile/real_chunk_prefill/<run>/<instance_id>/): a run directory holds one sub-directory per
agent instance (an LLM Program) with two JSON-lines files:

- ``prefix_cache_metrics.jsonl``, one line per LLM call:
  ``{"step": 1, "first_chunk_timestamp": 1760196408.97, "llm_reasoning_time": 13.66, "prefill_time": 0.16,
  "decode_time": 13.38, "input_tokens": 1167, "output_tokens": 234}``
- ``stage_timings.jsonl``, one line per stage boundary:
  ``{"timestamp": 1760196398.01, "instance_id": "django__django-13925", "thread": "ThreadPoolExecutor-13_0",
  "stage": "env_prepare" | "llm_reasoning" | "tool_execution" | "observation_packaging", "phase": "enter" |
  "exit", "step": 0, "attempt": 1, "extra": {...}}``

Mapping (the assumptions, documented because the traces do not state them):
- one instance directory = one program, id = the directory name;
- prompt_tokens = input_tokens of the first call; call i decodes output_tokens_i (at least 1);
- obs_tokens_i = input_tokens_{i+1} − input_tokens_i − output_tokens_i: what the tool and the harness appended
  (clamped at 0 when the context shrank, e.g. history truncation, which the workload model cannot express;
  counted in ``Workload.notes``);
- tool_s_i = (llm_reasoning enter of call i+1) − (llm_reasoning exit of call i): everything between two
  calls, as the official proxy's tool_call_time (request end → next request); when either timestamp is
  missing, the tool_execution + observation_packaging durations of step i;
- env_prep_s = env_prepare exit − enter (0 without it); arrival_s = the instance's first timestamp minus the
  run's earliest one (the recorded worker pool's start times; a closed-loop replay ignores it);
- retried stages (attempt > 1) count their last attempt; steps are sorted by their number; a step recorded
  twice in prefix_cache_metrics.jsonl (a retried call, e.g. django__django-15202 step 32 of the official bs4 run)
  keeps its last record (counted in ``Workload.notes``);
- shared_prefix_tokens is not recorded: a parameter (default 0, i.e. no sharing credit, as the official
  capacity rule), clamped to the prompt.
Files are bounded (size, JSON depth) and validated; any problem is one line naming the file, line and
field (WorkloadError; exit 2 from the CLI).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stages.thunderagent.workload import (MAX_TOKENS, Cluster, Program, Step, Workload, WorkloadError, dump_workload,
                                          parse_json_line, read_text_bounded)

METRICS = "prefix_cache_metrics.jsonl"
TIMINGS = "stage_timings.jsonl"
MAX_INSTANCES = 100_000


def _lines(path: Path):
    text = read_text_bounded(path, what="trace file")
    for n, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            where = f"{path.parent.name}/{path.name}:{n}: "
            obj = parse_json_line(line, where)
            if not isinstance(obj, dict):
                raise WorkloadError(f"{where}expected a JSON object")
            yield where, obj


def _int(obj, key, where, lo=0, hi=MAX_TOKENS) -> int:
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, int):
        raise WorkloadError(f"{where}{key}: must be an integer (got {str(v)[:40]})")
    if not lo <= v <= hi:
        raise WorkloadError(f"{where}{key}: must be in [{lo}, {hi}] (got {str(v)[:40]})")
    return v


def _time(obj, key, where) -> float:
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1e11:
        raise WorkloadError(f"{where}{key}: must be a finite timestamp/duration in [0, 1e11) (got {str(v)[:40]})")
    return float(v)


def read_instance(d: Path, notes: list | None = None) -> tuple[dict, dict]:
    """(calls by step, stage boundaries by (stage, step, phase) -> (attempt, timestamp)) of one instance. A step
    recorded more than once (a retried call) keeps its last record; each repeat is named in ``notes``."""
    if not (d / METRICS).is_file():
        raise WorkloadError(f"{d}: missing {METRICS} (not an official trace instance directory)")
    calls = {}
    for where, o in _lines(d / METRICS):
        step = _int(o, "step", where, 1, 100_000)
        rec = (_int(o, "input_tokens", where, 1), _int(o, "output_tokens", where, 0))
        if step in calls and notes is not None:
            notes.append(f"{d.name} step {step}: recorded again at {where.rstrip(': ')}; the last record is kept")
        calls[step] = rec
    if not calls:
        raise WorkloadError(f"{d / METRICS}: no calls")
    marks: dict = {}
    if (d / TIMINGS).is_file():
        for where, o in _lines(d / TIMINGS):
            stage, phase = o.get("stage"), o.get("phase")
            if not isinstance(stage, str) or phase not in ("enter", "exit"):
                raise WorkloadError(f"{where}stage/phase: need a stage name and phase enter|exit")
            step = _int(o, "step", where, 0, 100_000)
            attempt = _int(o, "attempt", where, 0, 10_000) if "attempt" in o else 1
            ts = _time(o, "timestamp", where)
            key = (stage, step, phase)
            if key not in marks or attempt >= marks[key][0]:
                marks[key] = (attempt, ts)
    return calls, marks


def instance_program(d: Path, shared_prefix_tokens: int = 0, notes: list | None = None) -> tuple[Program, float]:
    """One instance directory → (Program with arrival 0, its first timestamp or +inf)."""
    calls, marks = read_instance(d, notes)
    steps_sorted = sorted(calls)

    def t(stage, step, phase):
        m = marks.get((stage, step, phase))
        return None if m is None else m[1]

    steps = []
    for i, s in enumerate(steps_sorted):
        inp, out = calls[s]
        obs, tool = 0, 0.0
        if i + 1 < len(steps_sorted):
            nxt = calls[steps_sorted[i + 1]][0]
            obs = nxt - inp - out
            if obs < 0:
                if notes is not None:
                    notes.append(f"{d.name} step {s}: context shrank by {-obs} tokens; obs_tokens clamped to 0")
                obs = 0
            a, b = t("llm_reasoning", s, "exit"), t("llm_reasoning", steps_sorted[i + 1], "enter")
            if a is not None and b is not None and b >= a:
                tool = b - a
            else:
                for stage in ("tool_execution", "observation_packaging"):
                    x, y = t(stage, s, "enter"), t(stage, s, "exit")
                    if x is not None and y is not None and y >= x:
                        tool += y - x
        steps.append(Step(decode_tokens=max(1, out), tool_s=round(min(tool, 1e6), 6), obs_tokens=min(obs, MAX_TOKENS)))
    x, y = t("env_prepare", 0, "enter"), t("env_prepare", 0, "exit")
    env = round(min(y - x, 1e6), 6) if x is not None and y is not None and y >= x else 0.0
    first = min((m[1] for m in marks.values()), default=float("inf"))
    prompt = calls[steps_sorted[0]][0]
    prog = Program(id=d.name[:128], prompt_tokens=prompt, steps=tuple(steps[:10_000]),
                   shared_prefix_tokens=min(shared_prefix_tokens, prompt), prefix_group="sys", env_prep_s=env)
    return prog, first


def load_official_traces(run_dir: Path | str, cluster: Cluster | None = None, shared_prefix_tokens: int = 0) -> Workload:
    """A run directory of instance directories (or one instance directory) → Workload (programs sorted by start)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise WorkloadError(f"{run_dir}: not a directory")
    dirs = [run_dir] if (run_dir / METRICS).exists() else sorted(p for p in run_dir.iterdir() if (p / METRICS).is_file())
    if not dirs:
        raise WorkloadError(f"{run_dir}: no instance directory with {METRICS}")
    if len(dirs) > MAX_INSTANCES:
        raise WorkloadError(f"{run_dir}: {len(dirs)} instances, more than {MAX_INSTANCES}")
    notes: list[str] = []
    got = [instance_program(d, shared_prefix_tokens, notes) for d in dirs]
    t0 = min((f for _, f in got if f != float("inf")), default=0.0)
    progs = []
    for p, first in sorted(got, key=lambda x: (x[1], x[0].id)):
        arr = round(min(max(first - t0, 0.0), 1e7), 6) if first != float("inf") else 0.0
        progs.append(Program(id=p.id, prompt_tokens=p.prompt_tokens, steps=p.steps, arrival_s=arr,
                             shared_prefix_tokens=p.shared_prefix_tokens, prefix_group=p.prefix_group,
                             env_prep_s=p.env_prep_s))
    wl = Workload(progs, cluster or Cluster())
    wl.notes = notes  # type: ignore[attr-defined]
    return wl


def main(argv: list[str] | None = None) -> int:
    class P(argparse.ArgumentParser):
        def error(self, message):
            print(f"official_trace: {message}", file=sys.stderr)
            raise SystemExit(2)

    ap = P(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--shared-prefix", type=int, default=0)
    ap.add_argument("--backends", type=int, default=2)
    ap.add_argument("--capacity", type=int, default=100_000)
    args = ap.parse_args(argv)
    try:
        if not 0 <= args.shared_prefix <= MAX_TOKENS:
            raise WorkloadError(f"--shared-prefix: must be in [0, {MAX_TOKENS}]")
        if not 1 <= args.backends <= 64 or not 1 <= args.capacity <= 10**9:
            raise WorkloadError("--backends in [1, 64] and --capacity in [1, 1e9]")
        if args.out.exists() and args.out.is_dir():
            raise WorkloadError(f"--out: {args.out} is a directory")
        wl = load_official_traces(args.run_dir, Cluster(args.backends, args.capacity, 16), args.shared_prefix)
    except WorkloadError as err:
        print(f"official_trace: {err}", file=sys.stderr)
        return 2
    from stages.common.paths import atomic_write_text

    atomic_write_text(args.out, dump_workload(wl))
    print(f"official_trace: {len(wl.programs)} programs, {sum(len(p.steps) for p in wl.programs)} calls"
          f"{f', {len(wl.notes)} notes' if wl.notes else ''} -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
