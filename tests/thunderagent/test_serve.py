"""The real scheduler on loopback: stages.thunderagent.serve in front of two processes of the project's tiny engine
(stages.thunderagent.backend_server), driven by the bounded client (stages.thunderagent.replay).

1. A simulator run and the proxy see the same trace (the simulator's policy inputs replayed in order under the
   proxy's manual clock, replies released by the gated backends in the simulator's order): the proxy's decision
   log equals the simulator's, and every call was served by the backend the policy chose.
2. A backend killed mid-run fails its in-flight calls with a clean 502 naming it; the proxy keeps serving the
   other backend, reports it down in /metrics, and later programs complete.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stages.thunderagent.replay import lockstep, replay
from stages.thunderagent.serve import capacity_from_metrics, parse_args, program_id
from stages.thunderagent.serve import main as serve_main
from stages.thunderagent.sim import CostModel, SchedConfig, Simulator
from stages.thunderagent.workload import Cluster, Program, Step, Workload

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 2.0):
    import urllib.request

    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode()


def _wait(url: str, proc, what: str, timeout: float = 90.0) -> None:
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}: {proc.stderr.read()[-800:]}")
        try:
            if _get(url)[0] == 200:
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"{what} did not come up at {url}")


class Backends:
    """Two backend_server processes (gated: tests can switch reply gating on and off) on free loopback ports."""

    def __init__(self, capacity: int = 4096):
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        self.procs, self.urls = [], []
        for _ in range(2):
            port = _port()
            args = [PY, "-m", "stages.thunderagent.backend_server", "--port", str(port), "--capacity", str(capacity),
                    "--max-model-len", "1024", "--gated"]
            self.procs.append(subprocess.Popen(args, cwd=ROOT, env=self.env, stdout=subprocess.DEVNULL,
                                               stderr=subprocess.PIPE, text=True))
            self.urls.append(f"http://127.0.0.1:{port}")
        for url, p in zip(self.urls, self.procs):
            _wait(f"{url}/health", p, "backend")

    def control(self, **body) -> None:
        import urllib.request

        for url, p in zip(self.urls, self.procs):
            if p.poll() is None:
                req = urllib.request.Request(f"{url}/gate/control", data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
                urllib.request.urlopen(req, timeout=5).read()

    def proxy(self, args: list[str]) -> tuple[str, subprocess.Popen]:
        port = _port()
        cmd = [PY, "-m", "stages.thunderagent.serve", "--port", str(port)]
        for b in self.urls:
            cmd += ["--backend", b]
        proc = subprocess.Popen(cmd + args, cwd=ROOT, env=self.env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        self.procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        _wait(f"{url}/health", proc, "proxy")
        return url, proc

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.fixture(scope="module")
def backends():
    b = Backends()
    yield b
    b.close()


def _workload() -> Workload:
    """5 programs on 2 backends of 650 tokens: the capacity rule binds (queueing, pauses, marks, holds, resumes)."""
    progs = [Program("p0", 150, (Step(20, 3.0, 60), Step(12, 1.0, 40), Step(8))),
             Program("p1", 220, (Step(16, 8.0, 90), Step(10))),
             Program("p2", 120, (Step(24, 2.0, 50), Step(14, 6.0, 30), Step(6))),
             Program("p3", 260, (Step(10, 1.0, 20), Step(18))),
             Program("p4", 90, (Step(12, 4.0, 200), Step(9, 1.0, 150), Step(7)), arrival_s=6.0)]
    return Workload(progs, Cluster(2, 650, 16))


def test_metrics_format_helpers_and_cli_errors(capsys):
    text = ('# HELP vllm:cache_config_info x\nvllm:cache_config_info{block_size="16",cache_dtype="auto",'
            'num_gpu_blocks="2048",num_cpu_blocks="0"} 1.0\n')
    assert capacity_from_metrics(text) == 32768 and capacity_from_metrics("vllm:other 1\n") is None
    assert program_id({"program_id": 7}, {}) == "7"
    assert program_id({"extra_body": {"program_id": "e"}}, {"X-Session-ID": "h"}) == "e"
    assert program_id({}, {"X-Session-ID": "h"}) == "h" and program_id({}, {}) == "default"
    assert parse_args(["--backend", "http://a:1", "--capacity", "5"]).capacity == [5]
    for args, msg in ((["--backend", "ftp://x"], "not an http(s) URL"),
                      (["--backend", "http://a:1", "--backend", "http://b:2", "--capacity", "1", "--capacity", "2",
                        "--capacity", "3"], "one value, or one per --backend"),
                      (["--backend", "http://a:1", "--tick-s", "nan"], "--tick-s: must be in"),
                      (["--backend", "http://127.0.0.1:9"], "cannot read /metrics")):
        with pytest.raises(SystemExit) as ex:
            raise SystemExit(serve_main(args))
        err = capsys.readouterr().err
        assert ex.value.code == 2 and msg in err and "Traceback" not in err
        assert len(err.strip().splitlines()) == 1, err


def test_proxy_decisions_equal_the_simulators_on_the_same_trace(backends):
    wl = _workload()
    sim = Simulator(wl, "thunderagent", CostModel(a=0.2, b=1e-4, p=2e-3, q=0.0),
                    SchedConfig(tick_s=2.0, stream_progress=False), record_inputs=True)
    sim.run()
    want = [[t, k, wl.programs[p].id, b] for t, k, p, b in sim.pol.log]
    kinds = {k for _, k, _, _ in want}
    assert kinds == {"start", "queue", "forward", "resume", "release", "pause", "mark", "pause_marked", "hold"}
    backends.control(gating=True, reset=True)
    proxy, proc = backends.proxy(["--capacity", "650", "--token-estimate", "tokenize", "--manual-clock"])
    try:
        got = asyncio.run(lockstep(proxy, backends.urls, wl, sim.inputs, timeout=60.0))
        assert got == want
        # each call was served by the backend the policy chose: start/forward send a call at once; a held call
        # (queue/hold) is sent by the resume/forced that releases it
        expect, k, held = {}, {p.id: 0 for p in wl.programs}, set()
        for _, kind, pid, b in want:
            if kind in ("start", "forward") or (kind in ("resume", "forced") and pid in held):
                expect[f"{pid}:{k[pid]}"] = b
                k[pid] += 1
                held.discard(pid)
            elif kind in ("queue", "hold"):
                held.add(pid)
        served = {}
        for i, url in enumerate(backends.urls):
            for key in json.loads(_get(f"{url}/served")[1])["served"]:
                assert key not in served, f"call {key} served twice"
                served[key] = i
        assert served == expect and len(served) == sum(len(p.steps) for p in wl.programs)
        status, text = _get(f"{proxy}/metrics")
        assert status == 200 and 'thunderagent_backend_up{backend="' + backends.urls[0] + '"} 1' in text
        for name in ('thunderagent_programs{state="reasoning"}', "thunderagent_backend_kv_estimate_tokens{",
                     "thunderagent_pauses_total ", "thunderagent_forced_resumes_total ", "thunderagent_resumes_total "):
            assert name in text
    finally:
        proc.terminate()


def test_backend_death_fails_its_calls_cleanly_and_the_other_keeps_serving(backends):
    """(Runs last: it kills backend 2 of the module's pair.)"""
    progs = [Program(f"q{i}", 120 + 10 * i, (Step(6, 0.6, 20),) * 6 + (Step(4),)) for i in range(6)]
    late = [Program(f"late{i}", 100, (Step(5, 0.1, 10), Step(5))) for i in range(2)]
    backends.control(gating=False, reset=True)
    proxy, proc = backends.proxy(["--capacity", "4000", "--tick-s", "0.2", "--health-interval", "60",
                                  "--request-timeout", "20"])
    urls = backends.urls
    try:
        async def scenario():
            first = asyncio.create_task(replay(proxy, Workload(progs, Cluster(2, 4000, 16)), workers=6, scale=0.5,
                                               max_programs=6, deadline_s=60.0, timeout_s=20.0))
            t_end = time.monotonic() + 30
            while time.monotonic() < t_end:                          # wait until both backends served calls
                served = [len(json.loads(_get(f"{u}/served")[1])["served"]) for u in urls]
                if min(served) >= 2:
                    break
                await asyncio.sleep(0.05)
            backends.procs[1].kill()                                 # backend 2 dies mid-run
            backends.procs[1].wait(timeout=10)
            res = await first
            after = await replay(proxy, Workload(late, Cluster(2, 4000, 16)), workers=2, scale=0.1,
                                 max_programs=2, deadline_s=30.0, timeout_s=20.0)
            return res, after

        res, after = asyncio.run(scenario())
        dead = urls[1]
        failed = [x for x in res["calls"] if x["status"] != 200]
        assert failed, "some call must have been in flight on (or routed to) the dead backend"
        assert all(x["status"] == 502 and x["backend_error"] == dead for x in failed)
        assert not res["abandoned"]                                  # nothing hangs
        done = [p for p in res["programs"] if p["ok"]]
        assert done and all(p["calls"] == 7 for p in done)           # programs on the live backend finish
        assert all(p["ok"] and p["calls"] == 2 for p in after["programs"])   # later programs are served
        status, text = _get(f"{proxy}/metrics")
        assert f'thunderagent_backend_up{{backend="{dead}"}} 0' in text
        assert f'thunderagent_backend_up{{backend="{urls[0]}"}} 1' in text
        assert 'thunderagent_requests_total{outcome="backend_error"} ' + str(len(failed)) in text
        assert json.loads(_get(f"{proxy}/health")[1])["backends_up"] == [True, False]
    finally:
        proc.terminate()
