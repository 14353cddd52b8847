"""thunderagent — program-aware agentic inference (miniature reproduction of ThunderAgent).

LLM Programs P = ⟨id, context c, tool environments, backend, phase Reasoning/Acting, status⟩ are
scheduled as units: every Δt the scheduler checks thrashing (Σ_R c + w·Σ_A c·f(t) + 100·n > C),
pauses shortest programs first (Acting before Reasoning), restores Reasoning > New > Acting smallest
first with Best-Fit-Decreasing placement across backends from one global queue, prepares tool
environments asynchronously and cleans them with hooks. ONE policy module (policy.py) implements it;
the discrete-event simulator (sim.py) and the OpenAI-compatible HTTP proxy (serve.py) both call it.

    python -m stages prepare thunderagent    # workloads (JSONL, workload.py format): task lists, #46 burst, engine
    python -m stages train thunderagent      # real paged engine replays traces; fit + held-out check of the cost model
    python -m stages evaluate thunderagent   # closed-loop sweep to the collapse, makespan, victims, #46 study
    python -m stages report thunderagent     # report.md, figures, claims
    python -m stages.thunderagent.simulate --workload W.jsonl --policy thunderagent --workers 32 --window 600 2400 --out R.json
    python -m stages.thunderagent.serve --backend http://127.0.0.1:8001 --backend http://127.0.0.1:8002   # the proxy
    python -m stages.thunderagent.backend_server --port 8001   # the tiny engine behind an OpenAI-compatible API
    python -m stages.thunderagent.replay --proxy http://127.0.0.1:8300 --workload W.jsonl     # bounded client
    python -m stages.thunderagent.official_trace RUN_DIR --out W.jsonl   # official traces -> workload

Modules: policy (the scheduler), workload (format + generator), sim (simulator), costmodel (GPU constants
with sources; CPU fit), engine (real paged engine), serve / backend_server / replay (the real path),
official_trace (real trace loader); kernel: kernels/paged_decode_attention.py. README.md: deployment in
front of vLLM / SGLang.
"""
from stages.common.sources import Source

SOURCES = [Source(
    real=("official ThunderAgent agent traces: SWE-agent-profile run directories, one per instance with "
          "prefix_cache_metrics.jsonl (per-call input/output tokens) and stage_timings.jsonl (stage enter/exit)"),
    params_key="papers.thunderagent.prepare.official_trace_dir",
    loader="stages.thunderagent.official_trace:load_official_traces",
    fixture_test="tests/thunderagent/test_official_trace.py::test_official_trace_fixture",
    note="full profile: point official_trace_dir at a downloaded run directory; nothing is downloaded here",
)]


def record_cpu(ctx) -> None:
    """Total CPU time of this stage's process (imports included), beside — not inside — its DVC output:
    data/thunderagent/<stage>.cpu.json (the report lists it; wall-clock on a shared machine overstates)."""
    import json
    import time

    from stages.common.paths import stage_dir

    path = stage_dir(ctx.slug, ctx.stage, ctx.root).parent / f"{ctx.stage}.cpu.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"cpu_s": round(time.process_time(), 3)}) + "\n")
