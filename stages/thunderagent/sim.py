"""Discrete-event simulator of an agentic serving cluster, with three schedulers.

Cluster: ``backends`` data-parallel engines, each a vLLM-like continuous-batching engine with a KV
pool of C tokens and automatic prefix caching (finished requests' KV stays as LRU cache entries;
eviction trims an entry from its tail, so what remains is still a valid prefix; a shared system
prompt is one entry per backend). When a decode step finds no free or evictable KV, the most recently
admitted request is preempted (recompute mode: its KV becomes an evictable cache entry and it goes
back to the front of the queue). Cost model (stages/thunderagent/costmodel.py: GPU constants with their
sources; fitted to the real engine by ``train``):

    # ALGO: iteration time = a + b·(KV tokens read by the batch) + p·(prefill tokens) + q·(prefill·context)
    # (the paper's space-time cost: decode + prefill + recompute ∝ c² for a full re-prefill)

Policies (``policy``), all routed through stages/thunderagent/policy.py — the same module the HTTP proxy
(``serve``) runs:
- ``vllm``: per-request FCFS queue per backend, LRU eviction, router = fewest programs, sticky
  (policy.DefaultRouter).
- ``continuum``: same router; program-level FCFS and TTL pinning of a program's KV during its tool call
  (pinned entries are not evictable until the TTL expires).
- ``thunderagent``: policy.ThunderPolicy above the same engines (a held call waits in the simulator as it
  waits in the proxy; a tick may release it to any backend).

Clients: open loop (each program arrives at its ``arrival_s``) or closed loop (``workers`` = N: N programs
run at once, each finished program's worker starts the next one in file order — the official benchmarks'
worker pools, e.g. 128 mini-swe-agent workers). Throughput: LLM calls ÷ makespan, and the official
steady-state metric, calls completed in a window [w0, w1) ÷ its length (``window_s``).

The event loop advances each engine in macro-steps of k identical-batch decode iterations (closed-form
time, Σ_i a + b·(T0 + n·i)), cut at the next completion, memory exhaustion or external event.
``Simulator.trace`` (optional) records every engine operation so the real engine can replay it;
``Simulator.inputs`` (optional) records every event the policy saw, in order, so a client can replay the
same trace through the proxy (tests/thunderagent/test_serve.py).
"""
from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from stages.thunderagent.policy import PROGRAM_OVERHEAD, PolicyConfig, make_policy
from stages.thunderagent.workload import Program, Workload

__all__ = ["PROGRAM_OVERHEAD", "CostModel", "SchedConfig", "Simulator", "SimulationError", "check_work", "simulate"]


MAX_EVENTS = 5_000_000   # a run that needs more is refused up front (check_work) or stopped with SimulationError


class SimulationError(RuntimeError):
    """The simulation could not finish (one line: why)."""


@dataclass(frozen=True)
class CostModel:
    # defaults: historical nominal values; the pipeline uses costmodel.gpu_cost_model() (sources there)
    a: float = 0.025      # s per iteration (fixed: weights read once per step)
    b: float = 8.0e-8     # s per KV token read in decode (≈256 KiB/token at 3.35 TB/s)
    p: float = 1.6e-4     # s per prefill token (≈66 GFLOP/token at 40% of 989 TFLOP/s)
    q: float = 3.0e-9     # s per prefill token × context token (attention part of prefill)
    r: float = 0.0        # s per admitted request with a prefill (the CPU engine's overhead; GPU: 0, assumed)

    def chunk_time(self, k: int, n: int, t0: int, prefill: int = 0, prefill_ctx: int = 0,
                   prefill_calls: int = 0) -> float:
        return (self.p * prefill + self.q * prefill_ctx + self.r * prefill_calls
                + k * self.a + self.b * (k * t0 + n * k * (k - 1) / 2))

    def iters_within(self, dt: float, n: int, t0: int) -> int:
        """Largest k with k·a + b·(k·t0 + n·k(k−1)/2) ≤ dt (≥ 1)."""
        A = self.b * n / 2
        B = self.a + self.b * t0 - A
        if dt <= 0:
            return 1
        if A <= 0:
            return max(1, int(dt / max(B, 1e-12)))
        k = (-B + math.sqrt(B * B + 4 * A * dt)) / (2 * A)
        return max(1, int(k))

    def iters_done(self, dt: float, n: int, t0: int, k_max: int) -> int:
        """Iterations (0..k_max) of a chunk finished within dt of its decode start (exact, float-safe)."""
        if dt <= 0:
            return 0
        k = min(k_max, self.iters_within(dt, n, t0))
        while k < k_max and self.chunk_time(k + 1, n, t0) <= dt:
            k += 1
        while k > 0 and self.chunk_time(k, n, t0) > dt:
            k -= 1
        return k


@dataclass(frozen=True)
class SchedConfig:
    """Program-aware scheduler knobs (ThunderAgent, passed to policy.PolicyConfig) and engine/baseline knobs."""
    tick_s: float = 5.0                     # Δt between scheduling passes
    acting_weight: float = 1.0              # w on acting programs' context (official serving: 1.0)
    acting_decay: bool = False              # f(t) = 2^{-t/half_life} in the resume capacity (official default: off)
    decay_half_life_s: float = 1.0          # paper: f(t) = 2^{-t}, t in seconds
    victim_order: str = "shortest"          # shortest | longest | random (claim 3 ablation)
    marks_lower_capacity: bool = True       # paper's algorithm (official as read: False)
    kv_affinity: bool = False               # (ours) resume on the program's own backend when it fits; official: off
    aging_half_life_s: float = 0.0          # 0 = off (official); >0: new-tier key c·2^{-wait/h}
    no_skip_after_s: float = 0.0            # 0 = off; >0: a program waiting longer is never skipped
    forced_resume_s: float = 1800.0         # official bound: forced resume after this long
    stream_progress: bool = True            # the policy sees decode progress (official: streaming clients)
    prep_lookahead: int = 4                 # async env preparation for the next k queued programs
    async_env_prep: bool = True
    cleanup_hooks: bool = True
    ttl_s: float = 15.0                     # continuum TTL pin
    max_num_seqs: int = 128                 # engine batch limit
    max_chunk_iters: int = 64

    def policy_config(self) -> PolicyConfig:
        return PolicyConfig(acting_weight=self.acting_weight, acting_decay=self.acting_decay,
                            decay_half_life_s=self.decay_half_life_s, victim_order=self.victim_order,  # type: ignore[arg-type]
                            marks_lower_capacity=self.marks_lower_capacity, kv_affinity=self.kv_affinity,
                            aging_half_life_s=self.aging_half_life_s, no_skip_after_s=self.no_skip_after_s,
                            forced_resume_s=self.forced_resume_s)


# ----------------------------------------------------------------------------------------- state
@dataclass
class PState:
    prog: Program
    idx: int = 0                 # next / current LLM call
    ctx: int = 0                 # context tokens before current call (c_i)
    gen: int = 0                 # tokens generated so far in the current call
    backend: int = -1            # engine holding its request / KV
    phase: str = "new"           # new | waiting (call held) | reasoning | acting | done
    started_at: float = math.nan  # arrival (open loop) or worker pickup (closed loop)
    env_ready: float = math.inf
    env_started: bool = False
    env_freed: bool = False
    computed_priv: int = 0       # private tokens ever computed into KV
    counted_step: int = -1       # step whose hit stats were recorded
    first_response: float = math.nan
    req_seq: int = 0             # FCFS order key
    end: float = math.nan


@dataclass
class Req:
    pid: int
    priv: int                    # private KV tokens held now
    order: int
    ps: "PState | None" = None   # its program (for speed)
    shared: int = 0              # shared-prefix tokens it reads
    target: int = 0              # decode tokens of its call


class Cache(OrderedDict):
    """key -> cached tokens, LRU first, with a running total (so a backend's KV usage is O(1))."""

    def __init__(self, *args, **kw):
        self.total = 0
        super().__init__(*args, **kw)

    def __setitem__(self, key, value):
        self.total += value - self.get(key, 0)
        super().__setitem__(key, value)

    def __delitem__(self, key):
        self.total -= self[key]
        super().__delitem__(key)

    def pop(self, key, *default):
        if key in self:
            self.total -= self[key]
        return super().pop(key, *default)


@dataclass
class Backend:
    idx: int
    cap: int
    running: list = field(default_factory=list)
    waiting: list = field(default_factory=list)       # pids
    cache: Cache = field(default_factory=Cache)        # key -> tokens (LRU first)
    pinned_until: dict = field(default_factory=dict)
    prefix_users: dict = field(default_factory=dict)  # group -> running users
    busy: bool = False
    chunk: list | None = None    # [start, prefill_s, n, t0, k, prefill, prefill_ctx, trace index] in flight
    ver: int = 0                 # chunk version (a cut chunk's old completion event is stale)
    run_priv: int = 0            # Σ private KV of running requests
    run_shared: int = 0          # Σ shared-prefix tokens read by running requests

    def used(self) -> int:
        return self.run_priv + self.cache.total


class Simulator:
    def __init__(self, wl: Workload, policy: str, cost: CostModel = CostModel(), sched: SchedConfig = SchedConfig(),
                 seed: int = 0, trace: bool = False, *, workers: int = 0, window_s: tuple[float, float] | None = None,
                 stop_at_s: float | None = None, record_inputs: bool = False):
        if policy not in ("vllm", "continuum", "thunderagent"):
            raise ValueError(f"policy: unknown policy {policy!r} (vllm, continuum, thunderagent)")
        if workers < 0:
            raise ValueError(f"workers: must be >= 0 (got {workers})")
        self.wl, self.policy, self.cost, self.sc = wl, policy, cost, sched
        self.workers, self.window, self.stop_at = workers, window_s, stop_at_s
        self.rng = np.random.default_rng(seed)
        self.P = [PState(prog=p, ctx=p.prompt_tokens) for p in wl.programs]
        self.B = [Backend(i, wl.cluster.kv_capacity_tokens) for i in range(wl.cluster.backends)]
        self.pol = make_policy(policy, [b.cap for b in self.B], sched.policy_config(), seed=seed,
                               log=trace or record_inputs)
        self.ta = policy == "thunderagent"
        self.now, self.events, self._seq, self._order = 0.0, [], 0, 0
        self.next_tick = math.inf
        self.trace = [] if trace else None
        self.inputs = [] if record_inputs else None   # (time, kind, pid, tokens): what the policy saw
        self.stats = dict(calls=0, hit_tokens=0, prompt_tokens=0, hit_rates=[], recomputed=0, prefill=0,
                          preemptions=0, env_seconds=0.0, peak_envs=0, imbalance_area=0.0)
        self.step_log = []  # (time, calls so far)
        self._live_envs, self._done, self._next = 0, 0, 0
        self.exhausted_at = math.nan   # closed loop: when the last program was picked up

    # ------------------------------------------------------------------ events
    def push(self, t: float, kind: str, data=None) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, self._seq, kind, data))

    def run(self, max_events: int = MAX_EVENTS) -> dict:
        n_prog = len(self.P)
        if self.workers:
            self._next = min(self.workers, n_prog)
            for i in range(self._next):
                self.push(0.0, "arrive", i)
            if self._next == n_prog:
                self.exhausted_at = 0.0
        else:
            for i, p in enumerate(self.P):
                self.push(p.prog.arrival_s, "arrive", i)
        self.next_tick = self.sc.tick_s if self.ta else math.inf
        if self.ta:
            self.push(self.sc.tick_s, "tick")
        n = 0
        while self.events:
            if self.stop_at is not None and self.events[0][0] > self.stop_at:
                self._advance_clock(self.stop_at)
                return self.summary()   # a run cut at a horizon (closed loop: the window's end + grace)
            t, _, kind, data = heapq.heappop(self.events)
            self._advance_clock(t)
            if kind == "arrive":
                self.on_arrive(data)
            elif kind == "tool_done":
                self.submit(data)
            elif kind == "chunk_done":
                self.on_chunk_done(*data)
            elif kind == "wake":
                self.start_chunk(self.B[data])
            elif kind == "tick":
                self.on_tick()
                self.next_tick = self.now + self.sc.tick_s
                if self._done < n_prog:
                    self.push(self.next_tick, "tick")
            n += 1
            if n > max_events:
                raise SimulationError(f"simulation did not finish within max_events={max_events} "
                                      f"({self._done} of {n_prog} programs done at t = {self.now:.1f} s)")
            if self._done == n_prog and not any(b.running for b in self.B):
                break
        stuck = [p.prog.id for p in self.P if p.phase != "done"]
        if stuck:  # e.g. a call whose context outgrows one backend's KV pool: it can never be admitted
            raise SimulationError(f"simulation stalled with {len(stuck)} unfinished programs (first: {stuck[0]!r}); "
                                  "a request needs more KV than one backend holds")
        return self.summary()

    def _advance_clock(self, t: float) -> None:
        dt = t - self.now
        if dt > 0:
            self.stats["env_seconds"] += self._live_envs * dt
            if len(self.B) > 1:
                used = [b.used() / b.cap for b in self.B]
                self.stats["imbalance_area"] += (max(used) - min(used)) * dt
        self.now = max(self.now, t)

    def _env(self, delta: int) -> None:
        self._live_envs += delta
        self.stats["peak_envs"] = max(self.stats["peak_envs"], self._live_envs)

    def _input(self, kind: str, pid: int, tokens: int = 0) -> None:
        """Record an event the policy just processed, with the length of its decision log after it."""
        if self.inputs is not None:
            self.inputs.append((self.now, kind, pid, tokens, len(self.pol.log)))

    # ------------------------------------------------------------------ program lifecycle
    def start_env(self, p: PState) -> None:
        if not p.env_started:
            p.env_started = True
            p.env_ready = self.now + p.prog.env_prep_s
            self._env(+1)

    def on_arrive(self, pid: int) -> None:
        p = self.P[pid]
        p.started_at = self.now
        if not self.ta:
            self.start_env(p)        # the baselines prepare the environment when the program starts
        self.submit(pid)

    def submit(self, pid: int) -> None:
        """The program sends its next LLM call (first call at arrival, then when its tool returns)."""
        p = self.P[pid]
        b = self.pol.on_request(pid, p.ctx, self.now)
        self._input("request", pid, p.ctx)
        if b is None:                # held by ThunderAgent (queued new program, or paused)
            p.phase = "waiting"
            self._prep_lookahead()
            return
        self._send(pid, b)

    def _send(self, pid: int, bidx: int) -> None:
        p = self.P[pid]
        p.backend = bidx
        self.start_env(p)
        p.phase = "reasoning"
        self._order += 1
        p.req_seq = self._order
        b = self.B[bidx]
        b.waiting.append(pid)
        if not b.busy:
            b.busy = True
            self.push(self.now, "wake", b.idx)
        elif b.chunk is not None:
            self._cut(b)   # the new request joins at the next iteration boundary, as in a real engine

    def on_request_done(self, pid: int) -> None:
        p = self.P[pid]
        st = p.prog.steps[p.idx]
        self.stats["calls"] += 1
        self.step_log.append((self.now, self.stats["calls"]))
        if math.isnan(p.first_response):
            p.first_response = self.now - p.started_at
        s = p.prog.shared_prefix_tokens
        total = p.ctx + p.gen
        p.computed_priv = total - s
        b = self.B[p.backend]
        b.cache[pid] = p.computed_priv  # stays as LRU cache (garbage once the program is done)
        self.pol.on_response(pid, total, self.now)
        self._input("response", pid, total)
        p.idx += 1
        if p.idx >= len(p.prog.steps):
            p.phase, p.end = "done", self.now
            self._done += 1
            self.pol.on_release(pid, self.now)
            self._input("release", pid)
            if self.ta and self.sc.cleanup_hooks:  # ALGO: hook-based cleanup on termination
                self._env(-1)
                p.env_freed = True
            if self.workers and self._next < len(self.P):   # closed loop: the worker starts the next program
                self.push(self.now, "arrive", self._next)
                self._next += 1
                if self._next == len(self.P):
                    self.exhausted_at = self.now
            return
        if self.policy == "continuum":
            b.pinned_until[pid] = self.now + self.sc.ttl_s  # ALGO (Continuum): TTL pin across the tool call
        p.phase = "acting"
        p.ctx, p.gen = total + st.obs_tokens, 0
        self.push(max(self.now, p.env_ready) + st.tool_s, "tool_done", pid)

    # ------------------------------------------------------------------ engine
    def _evictable(self, b: Backend, keep: set) -> list:
        out = []
        for key, tok in b.cache.items():
            if key in keep or tok <= 0:
                continue
            if isinstance(key, tuple) and b.prefix_users.get(key[1], 0) > 0:
                continue
            if b.pinned_until.get(key, -1.0) > self.now:
                continue
            out.append(key)
        return out

    def _evict(self, b: Backend, need: int, keep: set) -> int:
        """Trim LRU entries (tail first) until `need` tokens are free; returns tokens freed."""
        freed = 0
        for key in self._evictable(b, keep):
            if freed >= need:
                break
            take = min(b.cache[key], need - freed)
            b.cache[key] -= take
            freed += take
            if self.trace is not None:
                self.trace.append(("trim", b.idx, key, b.cache[key]))
            if b.cache[key] == 0:
                del b.cache[key]
                b.pinned_until.pop(key, None)
        return freed

    def _waiting_order(self, b: Backend) -> list:
        if self.policy == "continuum":  # program-level FCFS
            return sorted(b.waiting, key=lambda i: (self.P[i].started_at, i))
        return b.waiting  # request FCFS (preempted requests re-enter at the front)

    def admit(self, b: Backend) -> tuple[int, int, int]:
        prefill = prefill_ctx = calls = 0
        for pid in list(self._waiting_order(b)):
            if len(b.running) >= self.sc.max_num_seqs:
                break
            p = self.P[pid]
            prog = p.prog
            s, g = prog.shared_prefix_tokens, ("g", prog.prefix_group)
            total = p.ctx + p.gen
            cached_priv = min(b.cache.get(pid, 0), total - s)
            prefix_hit = min(b.cache.get(g, 0), s) if s > 0 else 0
            new_priv = total - s - cached_priv
            new_prefix = s - prefix_hit
            need = new_priv + new_prefix + 1
            free = b.cap - b.used()
            keep = {pid, g}
            if need > free:
                evictable = sum(b.cache[k] for k in self._evictable(b, keep))
                if need > free + evictable:
                    break  # head-of-line: FCFS
                self._evict(b, need - free, keep)
            b.waiting.remove(pid)
            b.cache.pop(pid, None)
            b.pinned_until.pop(pid, None)
            if s > 0:
                b.cache[g] = s
                b.cache.move_to_end(g)
                b.prefix_users[prog.prefix_group] = b.prefix_users.get(prog.prefix_group, 0) + 1
            self._order += 1
            b.running.append(Req(pid, total - s, self._order, p, s, prog.steps[p.idx].decode_tokens))
            b.run_priv += total - s
            b.run_shared += s
            if p.counted_step != p.idx:  # per-step hit statistics (official: cached / prompt tokens)
                p.counted_step = p.idx
                hit = cached_priv + prefix_hit
                self.stats["hit_tokens"] += hit
                self.stats["prompt_tokens"] += total
                self.stats["hit_rates"].append(hit / total)
                prev = p.computed_priv if p.idx > 0 else 0
                self.stats["recomputed"] += max(0, min(prev, total - s) - cached_priv)
            else:  # re-admission after preemption: everything missing had been computed
                self.stats["recomputed"] += new_priv
            prefill += new_priv + new_prefix
            prefill_ctx += (new_priv + new_prefix) * total
            calls += (new_priv + new_prefix) > 0
            if self.trace is not None:
                self.trace.append(("admit", b.idx, pid, cached_priv, prefix_hit, total))
        return prefill, prefill_ctx, calls

    def _preempt(self, b: Backend) -> None:
        r = max(b.running, key=lambda r: r.order)  # vLLM: the most recently admitted
        b.running.remove(r)
        b.run_priv -= r.priv
        b.run_shared -= r.shared
        p = self.P[r.pid]
        b.cache[r.pid] = r.priv
        self._release_prefix(b, p)
        b.waiting.insert(0, r.pid)
        self.stats["preemptions"] += 1
        if self.trace is not None:
            self.trace.append(("preempt", b.idx, r.pid, r.priv))

    def _release_prefix(self, b: Backend, p: PState) -> None:
        if p.prog.shared_prefix_tokens > 0:
            b.prefix_users[p.prog.prefix_group] -= 1

    def start_chunk(self, b: Backend) -> None:
        prefill, prefill_ctx, calls = self.admit(b)
        while b.running:
            n = len(b.running)
            free = b.cap - b.used()
            if free < n:
                self._evict(b, n * 16 - free, set())
                free = b.cap - b.used()
            if free >= n:
                break
            self._preempt(b)
        if not b.running:
            b.busy = False
            pins = [t for t in b.pinned_until.values() if t > self.now]
            if b.waiting and pins:  # continuum: retry when the next pin expires
                b.busy = True
                self.push(min(pins) + 1e-9, "wake", b.idx)
            return
        n = len(b.running)
        t0 = b.run_priv + b.run_shared                        # Σ (context + generated) of the batch
        rem = min([r.target - r.ps.gen for r in b.running])
        k = min(rem, self.sc.max_chunk_iters, free // n)
        pre = self.cost.p * prefill + self.cost.q * prefill_ctx + self.cost.r * calls
        if self.ta:  # cut at the next scheduling tick, so the policy sees the decode progress of that instant
            k = min(k, self.cost.iters_within(self.next_tick - self.now - pre, n, t0))
        k = max(1, k)
        dt = self.cost.chunk_time(k, n, t0, prefill, prefill_ctx, calls)
        ti = -1
        if self.trace is not None:
            ti = len(self.trace)
            self.trace.append(("decode", b.idx, [r.pid for r in b.running], k, dt))
        b.ver += 1
        b.chunk = [self.now, pre, n, t0, k, prefill, prefill_ctx, calls, ti]
        self.push(self.now + dt, "chunk_done", (b.idx, k, b.ver))

    def _cut(self, b: Backend) -> None:
        """End the chunk in flight at the first iteration boundary at or after now (a request arrived)."""
        start, pre, n, t0, k, prefill, prefill_ctx, calls, ti = b.chunk
        elapsed = self.now - start - pre
        j = self.cost.iters_done(elapsed, n, t0, k)
        if j < k and (j == 0 or self.cost.chunk_time(j, n, t0) < elapsed):
            j += 1
        j = max(1, j)
        if j >= k:
            return
        dt = self.cost.chunk_time(j, n, t0, prefill, prefill_ctx, calls)
        b.ver += 1
        b.chunk[4] = j
        if ti >= 0:
            op = self.trace[ti]
            self.trace[ti] = (op[0], op[1], op[2], j, dt)
        self.push(start + dt, "chunk_done", (b.idx, j, b.ver))

    def on_chunk_done(self, bidx: int, k: int, ver: int) -> None:
        b = self.B[bidx]
        if ver != b.ver:
            return   # a chunk that was cut short: its completion moved earlier
        b.chunk = None
        done = []
        progress = self.pol.on_progress if self.ta and self.sc.stream_progress else None
        b.run_priv += k * len(b.running)
        for r in b.running:
            p = r.ps
            p.gen += k
            r.priv += k
            if progress is not None:
                progress(r.pid, k)   # streamed tokens (official: every 20 tokens of a stream)
            if p.gen >= r.target:
                done.append(r)
        for r in done:
            b.running.remove(r)
            b.run_priv -= r.priv
            b.run_shared -= r.shared
            p = self.P[r.pid]
            self._release_prefix(b, p)
            self.on_request_done(r.pid)
        self.start_chunk(b)

    # ------------------------------------------------------------------ ThunderAgent ticks
    def _prep_lookahead(self) -> None:
        if self.ta and self.sc.async_env_prep:  # ALGO: asynchronous environment preparation for programs about to run
            for q in self.pol.queued_new(self.now)[: self.sc.prep_lookahead]:
                self.start_env(self.P[q.pid])

    def on_tick(self) -> None:
        released = self.pol.tick(self.now)
        self._input("tick", -1)
        for pid, b in released:
            self._send(pid, b)
        self._prep_lookahead()

    # ------------------------------------------------------------------ metrics
    def window_throughput(self, w0: float, w1: float) -> tuple[float, int]:
        """Official steady-state metric: LLM calls completed in [w0, w1) per minute."""
        n = sum(1 for t, _ in self.step_log if w0 <= t < w1)
        return n / ((w1 - w0) / 60.0), n

    def summary(self) -> dict:
        if self._live_envs:
            self._env(-self._live_envs)
        ends = [p.end for p in self.P if p.phase == "done"]
        makespan = max(ends, default=0.0)
        started = [p for p in self.P if not math.isnan(p.started_at)]
        ttfr = np.array([self._ttfr(p) for p in started]) if started else np.zeros(1)
        hr = self.stats["hit_rates"]
        ps = self.pol.stats
        out = {
            "policy": self.policy, "programs": len(self.P), "programs_done": len(ends), "calls": self.stats["calls"],
            "makespan_s": makespan, "finished": len(ends) == len(self.P),
            "steps_per_min": self.stats["calls"] / (makespan / 60.0) if makespan > 0 else 0.0,
            "kv_hit_rate": float(np.mean(hr)) if hr else 0.0,
            "kv_hit_rate_token_weighted": self.stats["hit_tokens"] / max(1, self.stats["prompt_tokens"]),
            # reusable-context hit rate: cached / (cached + recomputed) tokens — 1.0 means no recompute
            "kv_reuse_rate": self.stats["hit_tokens"] / max(1, self.stats["hit_tokens"] + self.stats["recomputed"]),
            "recomputed_tokens": int(self.stats["recomputed"]), "preemptions": self.stats["preemptions"],
            "pauses": ps.pauses, "marks": ps.marks, "migrations": ps.migrations, "forced_resumes": ps.forced,
            "ttfr_p50_s": float(np.percentile(ttfr, 50)), "ttfr_p95_s": float(np.percentile(ttfr, 95)),
            "ttfr_max_s": float(ttfr.max()),
            "ttfr_by_prompt": [[p.prog.prompt_tokens, self._ttfr(p)] for p in started],
            "memory_imbalance": self.stats["imbalance_area"] / self.now if self.now > 0 else 0.0,
            "peak_live_envs": self.stats["peak_envs"], "env_seconds": self.stats["env_seconds"],
        }
        if self.window is not None:
            w0, w1 = self.window
            thr, n = self.window_throughput(w0, w1)
            inside = [p for p in started if w0 <= p.started_at < w1]
            wt = np.array([self._ttfr(p) for p in inside]) if inside else np.full(1, np.nan)
            out.update({"window_steps_per_min": thr, "window_calls": n, "window_s": [w0, w1],
                        # the worker pool stayed full through the window (no worker idled before w1)
                        "window_valid": bool(not self.workers or not (self.exhausted_at < w1)),
                        # TTFR of fresh programs picked up inside the window (censored at the horizon if no reply)
                        "window_ttfr_p50_s": float(np.percentile(wt, 50)), "window_ttfr_p95_s": float(np.percentile(wt, 95)),
                        "window_programs": len(inside),
                        "window_ttfr_censored": sum(math.isnan(p.first_response) for p in inside)})
        return out

    def _ttfr(self, p: PState) -> float:
        """Arrival → first reply; a program with no reply yet at a horizon counts its wait so far (censored)."""
        return p.first_response if not math.isnan(p.first_response) else self.now - p.started_at

def min_events(wl: Workload, policy: str, sched: SchedConfig = SchedConfig()) -> int:
    """A lower bound on the events a run of `wl` needs: arrivals + 2 per call (tool return, engine wake)
    + decode chunks (a chunk advances one request by ≤ max_chunk_iters tokens and a batch by ≤
    max_num_seqs·max_chunk_iters) + scheduling ticks over the time the slowest program needs without any
    queueing (ThunderAgent). Used to refuse, up front and with the reason, a workload that cannot finish."""
    k = sched.max_chunk_iters
    calls = sum(len(p.steps) for p in wl.programs)
    per_prog = max((sum(-(-s.decode_tokens // k) for s in p.steps) for p in wl.programs), default=0)
    total_dec = sum(s.decode_tokens for p in wl.programs for s in p.steps)
    chunks = max(per_prog, -(-total_dec // (k * sched.max_num_seqs)))
    n = len(wl.programs) + 2 * calls + chunks
    if policy == "thunderagent":
        span = max((p.arrival_s + p.env_prep_s + sum(s.tool_s for s in p.steps[:-1]) for p in wl.programs), default=0.0)
        n += int(span / sched.tick_s)
    return n


def check_work(wl: Workload, policy: str, sched: SchedConfig = SchedConfig(), max_events: int = MAX_EVENTS) -> None:
    """Raise SimulationError (one line) when the workload needs more than max_events events."""
    need = min_events(wl, policy, sched)
    if need > max_events:
        raise SimulationError(f"the workload needs at least {need:.3g} simulation events under {policy} (decode "
                              f"chunks of <= {sched.max_chunk_iters} tokens, ticks every {sched.tick_s:g} s); the "
                              f"limit is {max_events:.3g}: shorten decode_tokens, steps or tool times")


def simulate(wl: Workload, policy: str, cost: CostModel = CostModel(), sched: SchedConfig = SchedConfig(),
             seed: int = 0, trace: bool = False, **kw):
    sim = Simulator(wl, policy, cost, sched, seed, trace, **kw)
    out = sim.run()
    return (out, sim.trace) if trace else out
