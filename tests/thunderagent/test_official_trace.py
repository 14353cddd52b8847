"""official_trace.py: the official SWE-agent-profile trace layout → a workload the simulator runs (issue 42).

The fixture (tests/thunderagent/fixtures/official_trace/run) is written in the official schema: one directory
per instance with stage_timings.jsonl and prefix_cache_metrics.jsonl, including out-of-order steps, a retried
stage, a context that shrinks, a zero-token reply and an instance without stage timings."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stages.thunderagent.official_trace import load_official_traces
from stages.thunderagent.sim import simulate
from stages.thunderagent.workload import Cluster, Step, WorkloadError, check_capacity, load_workload

ROOT = Path(__file__).resolve().parents[2]
FIX = Path(__file__).parent / "fixtures" / "official_trace" / "run"


@pytest.mark.real_source
def test_official_trace_fixture(tmp_path):
    wl = load_official_traces(FIX, Cluster(2, 20_000, 16), shared_prefix_tokens=1000)
    a, b, c = wl.programs
    assert [p.id for p in wl.programs] == ["astropy__astropy-12907", "django__django-11099", "sympy__sympy-20590"]
    # A: prompt = first input; obs = next input − input − output; tool = next llm enter − llm exit
    assert (a.prompt_tokens, a.env_prep_s, a.arrival_s, a.shared_prefix_tokens) == (1167, 7.5, 0.0, 1000)
    assert a.steps == (Step(234, 1.25, 2040), Step(156, 3.5, 334), Step(114, 0.0, 0))
    # B: steps sorted; the context shrank (1900 < 2000 + 87) → obs 0 and a note; no next llm enter → the last
    # attempt of tool_execution (6 s) + observation_packaging (0.5 s); arrival 12 s after the run's first event
    assert (b.prompt_tokens, b.env_prep_s, b.arrival_s) == (2000, 2.0, 12.0)
    assert b.steps == (Step(87, 6.5, 0), Step(40, 0.0, 0))
    assert wl.notes == ["django__django-11099 step 1: context shrank by 187 tokens; obs_tokens clamped to 0"]
    # C: no stage timings; a zero-token reply counts as 1 decoded token; shared prefix clamped to the prompt
    assert (c.prompt_tokens, c.steps, c.env_prep_s, c.arrival_s, c.shared_prefix_tokens) == (900, (Step(1),), 0.0, 0.0, 900)
    check_capacity(wl, "official")
    for pol in ("vllm", "thunderagent"):
        r = simulate(wl, pol, workers=2)
        assert r["calls"] == 6 and r["programs_done"] == 3
    # the CLI writes a workload in the public format that the simulator's CLI reads back
    out = tmp_path / "w.jsonl"
    r = subprocess.run([sys.executable, "-m", "stages.thunderagent.official_trace", str(FIX), "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "3 programs, 6 calls, 1 notes" in r.stdout, r.stderr
    back = load_workload(out)
    assert [p.steps for p in back.programs] == [p.steps for p in load_official_traces(FIX).programs]
    one = load_official_traces(FIX / "sympy__sympy-20590")           # a single instance directory works too
    assert len(one.programs) == 1


@pytest.mark.real_source
def test_official_trace_bad_inputs_one_line(tmp_path):
    with pytest.raises(WorkloadError, match="no instance directory with prefix_cache_metrics.jsonl"):
        load_official_traces(tmp_path)
    d = tmp_path / "run" / "inst"
    shutil.copytree(FIX / "astropy__astropy-12907", d)
    rows = (d / "prefix_cache_metrics.jsonl").read_text().splitlines()
    rows[1] = json.dumps({**json.loads(rows[1]), "input_tokens": "many"})
    (d / "prefix_cache_metrics.jsonl").write_text("\n".join(rows) + "\n")
    with pytest.raises(WorkloadError, match=r"inst/prefix_cache_metrics.jsonl:2: input_tokens: must be an integer"):
        load_official_traces(tmp_path / "run")
    (d / "prefix_cache_metrics.jsonl").write_text("[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(WorkloadError, match="nested deeper than 8"):
        load_official_traces(tmp_path / "run")
    (d / "prefix_cache_metrics.jsonl").write_text('{"step": 1, "input_tokens": 5, "output_tokens": 1}\n')
    (d / "stage_timings.jsonl").write_text('{"timestamp": 1e300, "stage": "llm_reasoning", "phase": "exit", "step": 1}\n')
    with pytest.raises(WorkloadError, match=r"stage_timings.jsonl:1: timestamp: must be a finite timestamp"):
        load_official_traces(tmp_path / "run")
    r = subprocess.run([sys.executable, "-m", "stages.thunderagent.official_trace", str(tmp_path / "nope"), "--out",
                        str(tmp_path / "o.jsonl")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "not a directory" in r.stderr


@pytest.mark.real_source
def test_official_trace_repeated_step_keeps_last_record():
    """fixtures/official_trace/repeated: lines 31-34 of django__django-15202/prefix_cache_metrics.jsonl of the
    official bs4 run (ThunderAgent-org/ThunderAgent @ ef8ef52, SWE-agent-profile/real_chunk_prefill), where step 32
    was recorded twice (a retried call). The loader keeps the last record and names the repeat in the notes."""
    wl = load_official_traces(FIX.parent / "repeated", Cluster(2, 100_000, 16))
    (p,) = wl.programs
    # prompt = step 31's input; step 32 = its LAST record (27858 in, 17 out), so obs_31 = 27858 − 27449 − 99 and
    # obs_32 = 27910 − 27858 − 17 (the first record, 27614 in / 87 out, would give 66 and 209); no stage timings → tool 0
    assert p.prompt_tokens == 27449
    assert p.steps == (Step(99, 0.0, 310), Step(17, 0.0, 35), Step(52, 0.0, 0))
    assert len(wl.notes) == 1 and "step 32" in wl.notes[0] and "last record is kept" in wl.notes[0]
