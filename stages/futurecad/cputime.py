"""CPU time of a futurecad stage (user + system, the stage process and its reaped children — the CAD sandbox
workers), written beside the stage's output like the runner's runtime file (not inside it, so DVC hashes stay
byte-identical): data/futurecad/<stage>.cpu.json. Wall-clock on a shared machine overstates a quiet machine's
time; the report shows both."""
from __future__ import annotations

import os

from stages.common.paths import write_json


def record(ctx, phases: dict[str, float] | None = None) -> None:
    t = os.times()
    write_json(ctx.out.parent / f"{ctx.stage}.cpu.json",
               {"stage": ctx.stage, "profile": ctx.profile, "main_cpu_s": round(t.user + t.system, 2),
                "children_cpu_s": round(t.children_user + t.children_system, 2),
                "phases_cpu_s": {k: round(v, 2) for k, v in (phases or {}).items()}})
