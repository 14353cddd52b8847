"""A bounded client that replays a workload through the proxy (or any OpenAI-compatible server).

    python -m stages.thunderagent.replay --proxy http://127.0.0.1:8300 --workload W.jsonl --out R.json
        [--workers 4] [--time-scale 0.01] [--max-programs 8] [--deadline-s 120] [--timeout-s 60]

Each program is an agent: call i sends its conversation (a system prompt of shared_prefix_tokens
characters common to its prefix group, its task, then every earlier reply and tool observation) with
``max_tokens = decode_tokens_i``, ``program_id = id`` and header ``x-request-id: <id>:<i>``; then it "runs
the tool" for tool_s × time-scale seconds and appends an observation of obs_tokens characters; at the end
it calls ``POST /programs/release``. Against the project's backend_server (one token per character) the
contexts equal the workload's token counts exactly. Bounded: at most ``--workers`` programs at once (a
closed loop; 0 = open loop at arrival_s × time-scale), ``--max-programs``, a per-call timeout and a total
deadline after which unfinished programs are abandoned. R.json: per-call status and wall latency,
per-program TTFR (wall seconds), failures with their error messages.

``lockstep(...)`` (tests) replays a simulator run's policy inputs in their exact order under the proxy's
manual clock, so that the proxy's decisions can be compared with the simulator's.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import aiohttp

from stages.thunderagent.workload import Program, Workload, WorkloadError, load_workload


def _text(seed: str, n: int) -> str:
    """n deterministic lowercase characters (one token each for backend_server)."""
    import hashlib

    out, i = [], 0
    while len(out) * 32 < n:
        out.append(hashlib.sha256(f"{seed}:{i}".encode()).hexdigest())
        i += 1
    hexs = "".join(out)[:n]
    return "".join(chr(97 + int(c, 16)) for c in hexs)


class Conversation:
    """The messages of one program, sized in characters = tokens for backend_server."""

    def __init__(self, p: Program):
        self.p = p
        s = p.shared_prefix_tokens
        self.messages = [{"role": "system", "content": _text(f"prefix:{p.prefix_group}", s)}] if s else []
        self.messages.append({"role": "user", "content": _text(f"task:{p.id}", p.prompt_tokens - s)})

    def request(self, i: int) -> dict:
        return {"model": "tiny-gpt", "messages": list(self.messages), "max_tokens": self.p.steps[i].decode_tokens,
                "program_id": self.p.id, "temperature": 0.0}

    def reply(self, i: int, content: str) -> None:
        self.messages.append({"role": "assistant", "content": content})
        if i + 1 < len(self.p.steps) and self.p.steps[i].obs_tokens:
            self.messages.append({"role": "user", "content": _text(f"obs:{self.p.id}:{i}", self.p.steps[i].obs_tokens)})


async def _call(session, url: str, body: dict, key: str, timeout: float) -> tuple[int, dict]:
    async with session.post(url, json=body, headers={"x-request-id": key},
                            timeout=aiohttp.ClientTimeout(total=timeout)) as r:
        try:
            data = await r.json(content_type=None)
        except (ValueError, aiohttp.ContentTypeError):
            data = {"error": {"message": (await r.text())[:200]}}
        return r.status, data if isinstance(data, dict) else {}


async def run_program(session, proxy: str, p: Program, scale: float, timeout: float, t0: float, log: list) -> dict:
    conv = Conversation(p)
    start = time.monotonic()
    rec = {"id": p.id, "calls": 0, "ttfr_s": None, "ok": True, "error": None}
    for i in range(len(p.steps)):
        t = time.monotonic()
        try:
            status, data = await _call(session, f"{proxy}/v1/chat/completions", conv.request(i), f"{p.id}:{i}", timeout)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as err:
            status, data = 0, {"error": {"message": f"{type(err).__name__}: {err}"[:200]}}
        log.append({"program": p.id, "call": i, "status": status, "latency_s": time.monotonic() - t,
                    "at_s": t - t0, "backend_error": (data.get("error") or {}).get("backend")})
        if status != 200:
            rec.update(ok=False, error=(data.get("error") or {}).get("message", f"status {status}"))
            break
        rec["calls"] += 1
        if rec["ttfr_s"] is None:
            rec["ttfr_s"] = time.monotonic() - start
        conv.reply(i, data["choices"][0]["message"]["content"])
        if i + 1 < len(p.steps):
            await asyncio.sleep(p.steps[i].tool_s * scale)
    try:
        async with session.post(f"{proxy}/programs/release", json={"program_id": p.id},
                                timeout=aiohttp.ClientTimeout(total=timeout)):
            pass
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        pass
    return rec


async def replay(proxy: str, wl: Workload, *, workers: int = 4, scale: float = 0.01, max_programs: int = 8,
                 deadline_s: float = 120.0, timeout_s: float = 60.0) -> dict:
    progs = wl.programs[:max_programs]
    log: list[dict] = []
    results: list[dict] = []
    t0 = time.monotonic()
    async with aiohttp.ClientSession() as session:
        async def one(p: Program, sem):
            async with sem:
                results.append(await run_program(session, proxy, p, scale, timeout_s, t0, log))

        async def delayed(p: Program, sem):
            await asyncio.sleep(p.arrival_s * scale)
            await one(p, sem)

        sem = asyncio.Semaphore(workers if workers > 0 else len(progs))
        tasks = [asyncio.create_task(one(p, sem) if workers > 0 else delayed(p, sem)) for p in progs]
        done, pending = await asyncio.wait(tasks, timeout=deadline_s)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    finished = {r["id"] for r in results}
    abandoned = [p.id for p in progs if p.id not in finished]
    return {"programs": results, "calls": log, "abandoned": abandoned, "wall_s": time.monotonic() - t0,
            "time_unit": "wall-clock seconds of this replay", "ok_calls": sum(c["status"] == 200 for c in log),
            "failed_calls": sum(c["status"] != 200 for c in log)}


async def lockstep(proxy: str, backends: list[str], wl: Workload, inputs: list[tuple], timeout: float = 30.0) -> list:
    """Replay a simulator run's policy inputs [(t, kind, pid_index, tokens, log_len_after)] against a
    --manual-clock proxy whose backends run --gated, in the same order; returns the proxy's decision log.
    A "response" opens the gate of that call on every backend and waits for the proxy's reply; every
    event waits until the proxy's log has as many entries as the simulator's after it (else TimeoutError)."""
    convs = {i: Conversation(p) for i, p in enumerate(wl.programs)}
    step = {i: 0 for i in convs}
    inflight: dict[int, asyncio.Task] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s:
        async def log_len() -> int:
            async with s.get(f"{proxy}/thunder/log?since=0") as r:
                return (await r.json())["length"]

        async def wait_log(n: int, what: str) -> None:
            t_end = time.monotonic() + timeout
            while (got := await log_len()) < n:
                if time.monotonic() > t_end:
                    raise TimeoutError(f"proxy log has {got} entries after {what}, the simulator {n}")
                await asyncio.sleep(0.005)

        for t, kind, pid, tokens, want in inputs:
            async with s.post(f"{proxy}/thunder/clock", json={"now": t}) as r:
                assert r.status == 200, await r.text()
            p = wl.programs[pid] if pid >= 0 else None
            if kind == "request":
                k = step[pid]
                body = convs[pid].request(k)
                inflight[pid] = asyncio.create_task(_call(s, f"{proxy}/v1/chat/completions", body, f"{p.id}:{k}", timeout))
            elif kind == "response":
                k = step[pid]
                for b in backends:
                    async with s.post(f"{b}/gate/open", json={"key": f"{p.id}:{k}"}) as r:
                        await r.read()
                status, data = await inflight.pop(pid)
                if status != 200:
                    raise RuntimeError(f"call {p.id}:{k} failed: {status} {data}")
                convs[pid].reply(k, data["choices"][0]["message"]["content"])
                step[pid] = k + 1
            elif kind == "release":
                async with s.post(f"{proxy}/programs/release", json={"program_id": p.id}) as r:
                    await r.read()
            elif kind == "tick":
                async with s.post(f"{proxy}/thunder/tick", json={}) as r:
                    await r.read()
            await wait_log(want, f"{kind} {p.id if p else ''} at t={t:g}")
        async with s.get(f"{proxy}/thunder/log?since=0") as r:
            return (await r.json())["entries"]


def main(argv: list[str] | None = None) -> int:
    class P(argparse.ArgumentParser):
        def error(self, message):
            print(f"replay: {message}", file=sys.stderr)
            raise SystemExit(2)

    ap = P(description=__doc__.splitlines()[0])
    ap.add_argument("--proxy", required=True)
    ap.add_argument("--workload", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--time-scale", type=float, default=0.01)
    ap.add_argument("--max-programs", type=int, default=8)
    ap.add_argument("--deadline-s", type=float, default=120.0)
    ap.add_argument("--timeout-s", type=float, default=60.0)
    args = ap.parse_args(argv)
    for name, lo, hi in (("workers", 0, 4096), ("time_scale", 0.0, 10.0), ("max_programs", 1, 100_000),
                         ("deadline_s", 0.1, 86400), ("timeout_s", 0.1, 86400)):
        v = getattr(args, name)
        if not lo <= v <= hi:
            print(f"replay: --{name.replace('_', '-')}: must be in [{lo}, {hi}] (got {v})", file=sys.stderr)
            return 2
    try:
        wl = load_workload(args.workload)
    except WorkloadError as err:
        print(f"replay: {err}", file=sys.stderr)
        return 2
    res = asyncio.run(replay(args.proxy.rstrip("/"), wl, workers=args.workers, scale=args.time_scale,
                             max_programs=args.max_programs, deadline_s=args.deadline_s, timeout_s=args.timeout_s))
    from stages.common.paths import atomic_write_text

    atomic_write_text(args.out, json.dumps(res, indent=2, allow_nan=False) + "\n")
    print(f"replay: {res['ok_calls']} calls ok, {res['failed_calls']} failed, {len(res['abandoned'])} programs "
          f"abandoned in {res['wall_s']:.1f} s -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
