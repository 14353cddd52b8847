"""ThunderAgent as a real scheduler: an OpenAI-compatible HTTP proxy in front of N inference backends.

    python -m stages.thunderagent.serve --backend http://127.0.0.1:8001 --backend http://127.0.0.1:8002 \\
        [--port 8300] [--policy thunderagent|vllm] [--tick-s 5] [--capacity TOKENS ...] \\
        [--token-estimate chars|tokenize] [--acting-weight 1.0] [--aging-half-life 0] [--no-skip-after 0]

Clients call ``POST /v1/chat/completions`` (or ``/v1/completions``) on the proxy exactly as on vLLM, naming
their program as the official code reads it: ``"program_id"`` in the body, ``extra_body.program_id``, or
the ``X-Session-ID`` header (else the program "default"); a program that finishes calls
``POST /programs/release {"program_id": ...}``. The proxy runs stages/thunderagent/policy.py — the SAME
module the simulator runs — on five events: a call arrives (estimate its context: the payload's characters
÷ a chars-per-token ratio updated from usage, EMA 0.2, as the official code; or ``--token-estimate tokenize``:
the backend's /tokenize count), a reply returns (usage.total_tokens), streamed tokens (streaming calls), a
release, and a tick every ``--tick-s`` seconds (resume, forced resume, pause). A call the policy holds
(queued new program, paused program) waits inside the proxy until a tick releases it to a backend.

Other endpoints: ``GET /metrics`` (Prometheus text: programs per state, KV estimate and capacity per
backend, backend up, pauses / marks / resumes / forced resumes / migrations, requests by outcome),
``GET /programs``, ``GET /health``, ``GET /v1/models``; for deterministic replays (tests) ``--manual-clock``
adds ``POST /thunder/clock {"now": s}`` and ``POST /thunder/tick`` and disables the timer;
``GET /thunder/log?since=i`` returns the policy's decision log.

Backends: any OpenAI-compatible server. KV capacity per backend is read from its Prometheus
``vllm:cache_config_info`` (block_size × num_gpu_blocks, as the official code) unless ``--capacity`` gives
it (one value for all backends, or one per backend; needed for SGLang). A backend that fails a call
(connection error, timeout, 5xx) is marked down: the failing call gets a 502 JSON error naming it, its
programs lose their KV and go back to the policy's pool (resumed on the others at the next tick), new
programs avoid it, and a health check every ``--health-interval`` s brings it back when /health answers.
See stages/thunderagent/README.md for vLLM / SGLang deployment.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import sys
import time
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from stages.thunderagent.policy import PROGRAM_OVERHEAD, PolicyConfig, make_policy
from stages.thunderagent.workload import json_depth_ok

FORWARD_HEADERS = ("x-request-id", "x-session-id", "x-dynamo-session-id", "authorization")
CACHE_INFO = re.compile(r'^vllm:cache_config_info\{([^}]*)\}', re.M)


class BackendHTTPError(Exception):
    """A backend answered with a 5xx status."""


class ProxyError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.kind = status, kind


def error_response(status: int, message: str, kind: str, **extra) -> web.Response:
    return web.json_response({"error": {"message": message[:500], "type": kind, **extra}}, status=status)


def program_id(payload: dict, headers) -> str:
    """Official resolution order: payload.program_id, payload.extra_body.program_id, X-Session-ID, 'default'."""
    if "program_id" in payload:
        return str(payload["program_id"])[:256]
    eb = payload.get("extra_body")
    if isinstance(eb, dict) and "program_id" in eb:
        return str(eb["program_id"])[:256]
    sid = headers.get("X-Session-ID") or headers.get("X-Dynamo-Session-ID")
    return str(sid)[:256] if sid else "default"


def capacity_from_metrics(text: str) -> int | None:
    """block_size × num_gpu_blocks from vLLM's vllm:cache_config_info (None if absent)."""
    m = CACHE_INFO.search(text)
    if not m:
        return None
    labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
    try:
        return int(labels["block_size"]) * int(labels["num_gpu_blocks"])
    except (KeyError, ValueError):
        return None


@dataclass
class Counters:
    requests: dict = field(default_factory=lambda: {"ok": 0, "backend_error": 0, "bad_request": 0, "released": 0})
    ticks: int = 0


class Proxy:
    def __init__(self, args, capacities: list[int]):
        self.args = args
        self.urls = [u.rstrip("/") for u in args.backend]
        cfg = PolicyConfig(acting_weight=args.acting_weight, aging_half_life_s=args.aging_half_life,
                           no_skip_after_s=args.no_skip_after, forced_resume_s=args.forced_resume_s,
                           marks_lower_capacity=not args.official_marks, kv_affinity=args.kv_affinity)
        self.pol = make_policy(args.policy, capacities, cfg, log=True)
        self.capacities = capacities
        self.t0 = time.monotonic()
        self.manual_now = 0.0
        self.log_offset = 0
        self.waiters: dict[str, asyncio.Future] = {}
        self.ratio, self.ratio_init = 5.0, False       # official chars-per-token estimate
        self.counters = Counters()
        self.session: aiohttp.ClientSession | None = None
        self.tasks: list[asyncio.Task] = []

    # ------------------------------------------------------------------ time, log
    def now(self) -> float:
        return self.manual_now if self.args.manual_clock else time.monotonic() - self.t0

    def _trim_log(self) -> None:
        keep = self.args.log_entries
        if len(self.pol.log) > 2 * keep:
            cut = len(self.pol.log) - keep
            del self.pol.log[:cut]
            self.log_offset += cut

    # ------------------------------------------------------------------ lifecycle
    async def start(self, app) -> None:
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.args.request_timeout))
        if not self.args.manual_clock:
            self.tasks.append(asyncio.create_task(self._tick_loop()))
        self.tasks.append(asyncio.create_task(self._health_loop()))

    async def stop(self, app) -> None:
        for t in self.tasks:
            t.cancel()
        for fut in self.waiters.values():
            if not fut.done():
                fut.cancel()
        if self.session is not None:
            await self.session.close()

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(self.args.tick_s)
            self.tick()

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.args.health_interval)
            for b, url in enumerate(self.urls):
                if self.pol.healthy[b]:
                    continue
                try:
                    async with self.session.get(f"{url}/health", timeout=aiohttp.ClientTimeout(total=2)) as r:
                        if r.status == 200:
                            self.pol.set_healthy(b, True, self.now())
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                    pass

    def tick(self) -> list:
        released = self.pol.tick(self.now())
        self.counters.ticks += 1
        for pid, b in released:
            fut = self.waiters.pop(pid, None)
            if fut is not None and not fut.done():
                fut.set_result(b)
        self._trim_log()
        return released

    # ------------------------------------------------------------------ token estimate
    async def estimate(self, payload: dict) -> tuple[int, int]:
        """(estimated context tokens, payload characters)."""
        chars = len(json.dumps(payload, ensure_ascii=False))
        if self.args.token_estimate == "tokenize":
            body = {k: payload[k] for k in ("model", "messages", "prompt") if k in payload}
            for b, url in enumerate(self.urls):
                if not self.pol.healthy[b]:
                    continue
                try:
                    async with self.session.post(f"{url}/tokenize", json=body) as r:
                        if r.status == 200:
                            count = (await r.json()).get("count")
                            if isinstance(count, int) and count >= 0:
                                return count, chars
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
                    continue
        return int(chars / self.ratio), chars     # official: chars / ratio (initial 5)

    def learn_ratio(self, chars: int, prompt_tokens) -> None:
        if isinstance(prompt_tokens, int) and prompt_tokens > 0 and chars > 0:
            r = chars / prompt_tokens
            self.ratio = r if not self.ratio_init else 0.2 * r + 0.8 * self.ratio
            self.ratio_init = True

    # ------------------------------------------------------------------ requests
    async def read_json(self, request: web.Request) -> dict:
        limit = self.args.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise ProxyError(413, f"body larger than {limit} bytes")
        raw = await request.content.read(limit + 1)
        if len(raw) > limit:
            raise ProxyError(413, f"body larger than {limit} bytes")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ProxyError(400, "body is not UTF-8") from None
        if not json_depth_ok(text, 64):
            raise ProxyError(400, "JSON nested deeper than 64 levels")
        try:
            payload = json.loads(text)
        except ValueError as err:
            raise ProxyError(400, f"invalid JSON ({str(err).splitlines()[0][:120]})") from None
        if not isinstance(payload, dict):
            raise ProxyError(400, "body must be a JSON object")
        return payload

    async def completions(self, request: web.Request) -> web.StreamResponse:
        try:
            payload = await self.read_json(request)
        except ProxyError as err:
            self.counters.requests["bad_request"] += 1
            return error_response(err.status, str(err), err.kind)
        pid = program_id(payload, request.headers)
        tokens, chars = await self.estimate(payload)
        b = self.pol.on_request(pid, tokens, self.now())
        self._trim_log()
        if b is None:                                   # held: wait for a tick to release it
            fut = asyncio.get_running_loop().create_future()
            self.waiters[pid] = fut
            try:
                b = await fut
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():   # the client went away: stop waiting
                    if self.waiters.get(pid) is fut:
                        del self.waiters[pid]
                    raise
                self.counters.requests["released"] += 1
                return error_response(409, f"program {pid!r} was released while its call waited", "program_released")
        body = {k: v for k, v in payload.items() if k != "program_id"}
        if isinstance(body.get("extra_body"), dict) and "program_id" in body["extra_body"]:
            body["extra_body"] = {k: v for k, v in body["extra_body"].items() if k != "program_id"}
        headers = {h: request.headers[h] for h in FORWARD_HEADERS if h in request.headers}
        url = f"{self.urls[b]}{request.path}"
        try:
            if payload.get("stream"):
                return await self._stream(request, pid, b, url, body, headers, tokens, chars)
            async with self.session.post(url, json=body, headers=headers) as r:
                data = await r.read()
                status = r.status
            if status >= 500:
                raise BackendHTTPError(f"status {status}: {data[:200].decode('utf-8', 'replace')}")
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, BackendHTTPError) as err:
            return self._backend_failed(pid, b, err)
        try:
            out = json.loads(data)
        except ValueError:
            out = None
        usage = out.get("usage") if isinstance(out, dict) else None
        if status < 400 and isinstance(usage, dict) and isinstance(usage.get("total_tokens"), int) \
                and math.isfinite(usage["total_tokens"]):
            self.learn_ratio(chars, usage.get("prompt_tokens"))
            self.pol.on_response(pid, usage["total_tokens"], self.now())
        elif status < 400:
            self.pol.on_response(pid, tokens, self.now())
        else:
            self.pol.on_error(pid, self.now())
        self._trim_log()
        self.counters.requests["ok" if status < 400 else "bad_request"] += 1
        return web.Response(body=data, status=status, content_type="application/json")

    async def _stream(self, request, pid, b, url, body, headers, tokens, chars) -> web.StreamResponse:
        resp = None
        total, usage = tokens, None
        try:
            async with self.session.post(url, json=body, headers=headers) as r:
                if r.status >= 400:
                    data = await r.read()
                    if r.status >= 500:
                        raise BackendHTTPError(f"status {r.status}")
                    self.pol.on_error(pid, self.now())
                    self.counters.requests["bad_request"] += 1
                    return web.Response(body=data, status=r.status, content_type="application/json")
                resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
                await resp.prepare(request)
                async for line in r.content:
                    await resp.write(line)
                    s = line.decode("utf-8", "replace").strip()
                    if not s.startswith("data:") or s == "data: [DONE]":
                        continue
                    try:
                        ev = json.loads(s[5:])
                    except ValueError:
                        continue
                    if isinstance(ev, dict) and isinstance(ev.get("usage"), dict):
                        usage = ev["usage"]
                    elif isinstance(ev, dict) and ev.get("choices"):
                        self.pol.on_progress(pid, 1)      # streamed tokens update the program's claim
                        total += 1
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, BackendHTTPError) as err:
            if resp is None:
                return self._backend_failed(pid, b, err)
            self._backend_failed(pid, b, err)           # mid-stream: the client sees the stream end early
            return resp
        if isinstance(usage, dict) and isinstance(usage.get("total_tokens"), int):
            self.learn_ratio(chars, usage.get("prompt_tokens"))
            total = usage["total_tokens"]
        self.pol.on_response(pid, total, self.now())
        self.counters.requests["ok"] += 1
        await resp.write_eof()
        return resp

    def _backend_failed(self, pid: str, b: int, err: Exception) -> web.Response:
        self.pol.on_error(pid, self.now())
        self.pol.set_healthy(b, False, self.now())   # its programs' KV is gone: they return to the pool
        self._trim_log()
        self.counters.requests["backend_error"] += 1
        msg = f"backend {self.urls[b]} failed: {type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"
        return error_response(502, msg, "backend_error", backend=self.urls[b])

    # ------------------------------------------------------------------ control endpoints
    async def release(self, request: web.Request) -> web.Response:
        try:
            body = await self.read_json(request)
        except ProxyError as err:
            return error_response(err.status, str(err), err.kind)
        pid = body.get("program_id")
        if not pid:
            return error_response(400, "Missing program_id", "invalid_request_error")
        pid = str(pid)
        known = pid in self.pol.progs
        self.pol.on_release(pid, self.now())
        fut = self.waiters.pop(pid, None)
        if fut is not None and not fut.done():
            fut.cancel()
        self._trim_log()
        return web.json_response({"program_id": pid, "released": known})

    async def programs(self, request: web.Request) -> web.Response:
        out = {}
        for pid, p in self.pol.progs.items():
            out[str(pid)] = {"backend": None if p.backend is None else self.urls[p.backend], "tokens": p.tokens,
                             "status": p.status, "paused": p.paused, "marked": p.marked, "held": p.waiting,
                             "steps": p.steps}
        return web.json_response(out)

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "policy": self.args.policy, "backends": self.urls,
                                  "backends_up": [bool(h) for h in self.pol.healthy],
                                  "programs": len(self.pol.progs), **self.pol.state_counts()})

    async def models(self, request: web.Request) -> web.Response:
        for b, url in enumerate(self.urls):
            if not self.pol.healthy[b]:
                continue
            try:
                async with self.session.get(f"{url}/v1/models") as r:
                    return web.Response(body=await r.read(), status=r.status, content_type="application/json")
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                continue
        return error_response(502, "no backend answered /v1/models", "backend_error")

    def metrics_text(self) -> str:
        st, pol = self.pol.stats, self.pol
        out = ["# HELP thunderagent_programs Programs tracked by the proxy, by state",
               "# TYPE thunderagent_programs gauge"]
        for k, v in pol.state_counts().items():
            out.append(f'thunderagent_programs{{state="{k}"}} {v}')
        gauges = (("thunderagent_backend_kv_estimate_tokens", "Capacity-rule usage (context claims + 100 per program)",
                   lambda b: pol.used(b)),
                  ("thunderagent_backend_kv_capacity_tokens", "KV capacity of the backend", lambda b: pol.cap[b]),
                  ("thunderagent_backend_programs", "Programs registered on the backend", lambda b: len(pol.members[b])),
                  ("thunderagent_backend_up", "1 if the backend is considered healthy", lambda b: int(pol.healthy[b])))
        for name, help_, f in gauges:
            out += [f"# HELP {name} {help_}", f"# TYPE {name} gauge"]
            out += [f'{name}{{backend="{u}"}} {float(f(b)):g}' for b, u in enumerate(self.urls)]
        for name, v in (("pauses", st.pauses), ("marks", st.marks), ("resumes", st.resumes),
                        ("forced_resumes", st.forced), ("migrations", st.migrations), ("queued", st.queued),
                        ("evacuated", st.evacuated), ("ticks", self.counters.ticks)):
            out += [f"# TYPE thunderagent_{name}_total counter", f"thunderagent_{name}_total {v}"]
        out += ["# TYPE thunderagent_requests_total counter"]
        out += [f'thunderagent_requests_total{{outcome="{k}"}} {v}' for k, v in self.counters.requests.items()]
        out += ["# TYPE thunderagent_held_requests gauge", f"thunderagent_held_requests {len(self.waiters)}",
                "# TYPE thunderagent_program_overhead_tokens gauge",
                f"thunderagent_program_overhead_tokens {PROGRAM_OVERHEAD}"]
        return "\n".join(out) + "\n"

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.metrics_text(), content_type="text/plain")

    async def set_clock(self, request: web.Request) -> web.Response:
        body = await self.read_json(request)
        now = body.get("now")
        if isinstance(now, bool) or not isinstance(now, (int, float)) or not math.isfinite(now) or now < self.manual_now:
            return error_response(400, "now: must be a finite number >= the current clock", "invalid_request_error")
        self.manual_now = float(now)
        return web.json_response({"now": self.manual_now})

    async def do_tick(self, request: web.Request) -> web.Response:
        released = self.tick()
        return web.json_response({"now": self.now(), "released": [[str(p), b] for p, b in released]})

    async def log(self, request: web.Request) -> web.Response:
        try:
            since = max(0, int(request.query.get("since", "0")))
        except ValueError:
            return error_response(400, "since: must be an integer", "invalid_request_error")
        start = max(0, since - self.log_offset)
        return web.json_response({"offset": self.log_offset, "length": self.log_offset + len(self.pol.log),
                                  "entries": [list(e) for e in self.pol.log[start:]]})


def make_app(args, capacities: list[int]) -> web.Application:
    p = Proxy(args, capacities)
    app = web.Application(client_max_size=args.max_body_bytes + 1)
    app["proxy"] = p
    app.on_startup.append(p.start)
    app.on_cleanup.append(p.stop)
    app.router.add_post("/v1/chat/completions", p.completions)
    app.router.add_post("/v1/completions", p.completions)
    app.router.add_post("/programs/release", p.release)
    app.router.add_get("/programs", p.programs)
    app.router.add_get("/health", p.health)
    app.router.add_get("/metrics", p.metrics)
    app.router.add_get("/v1/models", p.models)
    app.router.add_get("/thunder/log", p.log)
    if args.manual_clock:
        app.router.add_post("/thunder/clock", p.set_clock)
        app.router.add_post("/thunder/tick", p.do_tick)
    return app


async def fetch_capacities(urls: list[str], timeout: float) -> list[int]:
    caps = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s:
        for u in urls:
            try:
                async with s.get(f"{u.rstrip('/')}/metrics") as r:
                    cap = capacity_from_metrics(await r.text()) if r.status == 200 else None
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as err:
                raise ValueError(f"--backend {u}: cannot read /metrics ({type(err).__name__}); pass --capacity") from None
            if cap is None:
                raise ValueError(f"--backend {u}: /metrics has no vllm:cache_config_info (block_size, num_gpu_blocks); "
                                 "pass --capacity")
            caps.append(cap)
    return caps


def parse_args(argv: list[str] | None = None):
    class P(argparse.ArgumentParser):
        def error(self, message):
            print(f"serve: {message}", file=sys.stderr)
            raise SystemExit(2)

    ap = P(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", action="append", required=True, help="backend base URL (repeat for N backends)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8300)
    ap.add_argument("--policy", default="thunderagent", choices=("thunderagent", "vllm"))
    ap.add_argument("--tick-s", type=float, default=5.0)
    ap.add_argument("--capacity", type=int, action="append", help="KV tokens (one for all, or one per backend)")
    ap.add_argument("--token-estimate", default="chars", choices=("chars", "tokenize"))
    ap.add_argument("--acting-weight", type=float, default=1.0)
    ap.add_argument("--aging-half-life", type=float, default=0.0)
    ap.add_argument("--no-skip-after", type=float, default=0.0)
    ap.add_argument("--forced-resume-s", type=float, default=1800.0)
    ap.add_argument("--official-marks", action="store_true", help="marks stay in the capacity sum (official as read)")
    ap.add_argument("--kv-affinity", action="store_true", help="(ours) resume onto the origin backend when it fits")
    ap.add_argument("--request-timeout", type=float, default=900.0)
    ap.add_argument("--health-interval", type=float, default=5.0)
    ap.add_argument("--max-body-bytes", type=int, default=32 * 2**20)
    ap.add_argument("--log-entries", type=int, default=100_000, help="decision-log entries kept")
    ap.add_argument("--manual-clock", action="store_true", help="tests: clock and ticks driven by /thunder/*")
    args = ap.parse_args(argv)
    for u in args.backend:
        if not re.match(r"^https?://[^\s/]+(:\d+)?(/[^\s]*)?$", u):
            ap.error(f"--backend: not an http(s) URL: {u[:80]}")
    if len(set(args.backend)) != len(args.backend):
        ap.error("--backend: each backend once")
    checks = (("port", 1, 65535), ("tick_s", 0.01, 3600), ("acting_weight", 0, 1e3), ("aging_half_life", 0, 1e6),
              ("no_skip_after", 0, 1e6), ("forced_resume_s", 0.01, 1e7), ("request_timeout", 0.1, 1e5),
              ("health_interval", 0.05, 3600), ("max_body_bytes", 1024, 2**31), ("log_entries", 10, 10**7))
    for name, lo, hi in checks:
        v = getattr(args, name)
        if not (math.isfinite(v) and lo <= v <= hi):
            ap.error(f"--{name.replace('_', '-')}: must be in [{lo:g}, {hi:g}] (got {v})")
    if args.capacity is not None:
        if len(args.capacity) not in (1, len(args.backend)):
            ap.error("--capacity: give one value, or one per --backend")
        if any(not 1 <= c <= 10**10 for c in args.capacity):
            ap.error("--capacity: must be in [1, 1e10]")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.capacity is not None:
        caps = args.capacity * len(args.backend) if len(args.capacity) == 1 else list(args.capacity)
    else:
        try:
            caps = asyncio.run(fetch_capacities(args.backend, 10.0))
        except ValueError as err:
            print(f"serve: {err}", file=sys.stderr)
            return 2
    print(f"serve: {args.policy} on {args.host}:{args.port} -> {', '.join(f'{u} ({c} tokens)' for u, c in zip(args.backend, caps))}",
          flush=True)
    web.run_app(make_app(args, caps), host=args.host, port=args.port, print=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
