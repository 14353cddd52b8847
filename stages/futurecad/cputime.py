"""CPU time of a futurecad stage (user + system, the stage process and its reaped children — the CAD sandbox
workers), written beside the stage's output like the runner's runtime file (not inside it, so DVC hashes stay
byte-identical): data/futurecad/<stage>.cpu.json. Wall-clock on a shared machine overstates a quiet machine's
time; the report shows both."""
from __future__ import annotations

import os

from stages.common.paths import write_json


def record(ctx, phases: dict[str, float] | None = None, sandbox_cpu_s: float | None = None) -> None:
    """``sandbox_cpu_s``: when the stage's runs ran in pool processes (its children, stages.common.jobs), the CPU
    of the sandbox workers those processes started; the rest of the children's CPU is the runs' own work and
    counts as the stage's (main), so that main stays the models' work and children the CAD workers'."""
    t = os.times()
    main, children = t.user + t.system, t.children_user + t.children_system
    if sandbox_cpu_s is not None:
        main, children = main + children - sandbox_cpu_s, sandbox_cpu_s
    write_json(ctx.out.parent / f"{ctx.stage}.cpu.json",
               {"stage": ctx.stage, "profile": ctx.profile, "main_cpu_s": round(main, 2),
                "children_cpu_s": round(children, 2),
                "phases_cpu_s": {k: round(v, 2) for k, v in (phases or {}).items()}})
