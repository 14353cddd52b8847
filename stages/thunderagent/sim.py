"""Discrete-event simulator of an agentic serving cluster, with three schedulers.

Cluster: ``backends`` data-parallel engines, each a vLLM-like continuous-batching engine with a KV
pool of C tokens and automatic prefix caching (finished requests' KV stays as LRU cache entries;
eviction trims an entry from its tail, so what remains is still a valid prefix; a shared system
prompt is one entry per backend). When a decode step finds no free or evictable KV, the most recently
admitted request is preempted (recompute mode: its KV becomes an evictable cache entry and it goes
back to the front of the queue). Cost model (fitted to the real engine by ``train``):

    # ALGO: iteration time = a + b·(KV tokens read by the batch) + p·(prefill tokens) + q·(prefill·context)
    # (the paper's space-time cost: decode + prefill + recompute ∝ c² for a full re-prefill)

Policies (``policy``):
- ``vllm``: per-request FCFS queue per backend, LRU eviction, router = fewest programs, sticky.
- ``continuum``: same router; program-level FCFS and TTL pinning of a program's KV during its tool call
  (pinned entries are not evictable until the TTL expires).
- ``thunderagent``: the program-aware scheduler (class ThunderScheduler) above the same engines.

The event loop advances each engine in macro-steps of k identical-batch decode iterations (closed-form
time, Σ_i a + b·(T0 + n·i)), cut at the next completion, memory exhaustion or external event.
``Simulator.trace`` (optional) records every engine operation so the real engine can replay it.
"""
from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from stages.thunderagent.workload import Program, Workload

PROGRAM_OVERHEAD = 100  # tokens charged per program in the capacity check (official state.py)


@dataclass(frozen=True)
class CostModel:
    # nominal H100-scale values for a ~32B model (weights/FLOP arithmetic; see the report's Deviations)
    a: float = 0.025      # s per iteration (fixed: weights read once per step)
    b: float = 8.0e-8     # s per KV token read in decode (≈256 KB/token at 3.3 TB/s)
    p: float = 1.6e-4     # s per prefill token (≈64 GFLOP/token at 400 TFLOP/s)
    q: float = 3.0e-9     # s per prefill token × context token (attention part of prefill)

    def chunk_time(self, k: int, n: int, t0: int, prefill: int = 0, prefill_ctx: int = 0) -> float:
        return self.p * prefill + self.q * prefill_ctx + k * self.a + self.b * (k * t0 + n * k * (k - 1) / 2)

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


@dataclass(frozen=True)
class SchedConfig:
    """Program-aware scheduler knobs (ThunderAgent) and baseline knobs."""
    tick_s: float = 5.0                     # Δt between scheduling passes
    acting_weight: float = 1.0              # w on acting programs' context (official serving: 1.0)
    acting_decay: bool = False              # f(t) = 2^{-t/half_life} on acting claims (official default: off)
    decay_half_life_s: float = 1.0          # paper: f(t) = 2^{-t}, t in seconds
    victim_order: str = "shortest"          # shortest | longest | random (claim 3 ablation)
    aging_half_life_s: float = 0.0          # 0 = off (official); >0: new-tier key c·2^{-wait/h}
    no_skip_after_s: float = 0.0            # 0 = off; >0: a program waiting longer is never skipped
    forced_resume_s: float = 1800.0         # official bound: forced resume after this long
    prep_lookahead: int = 4                 # async env preparation for the next k queued programs
    async_env_prep: bool = True
    cleanup_hooks: bool = True
    ttl_s: float = 15.0                     # continuum TTL pin
    max_num_seqs: int = 128                 # engine batch limit
    max_chunk_iters: int = 64
    kv_affinity: bool = True                # (ours) resume on the program's own backend when it fits


# ----------------------------------------------------------------------------------------- state
@dataclass
class PState:
    prog: Program
    idx: int = 0                 # next / current LLM call
    ctx: int = 0                 # context tokens before current call (c_i)
    gen: int = 0                 # tokens generated so far in the current call
    backend: int = -1
    phase: str = "new"           # new | queued | reasoning | acting | done
    paused: bool = False
    marked: bool = False         # pause at reply end
    pending: bool = False        # a request is held (paused with tool finished)
    started_at: float = -1.0
    queued_at: float = 0.0
    acting_since: float = 0.0
    env_ready: float = math.inf
    env_started: bool = False
    env_freed: bool = False
    computed_priv: int = 0       # private tokens ever computed into KV
    counted_step: int = -1       # step whose hit stats were recorded
    first_response: float = math.nan
    tool_done_at: float = 0.0
    req_seq: int = 0             # FCFS order key
    end: float = math.nan


@dataclass
class Req:
    pid: int
    priv: int                    # private KV tokens held now
    order: int


@dataclass
class Backend:
    idx: int
    cap: int
    running: list = field(default_factory=list)
    waiting: list = field(default_factory=list)       # pids
    cache: OrderedDict = field(default_factory=OrderedDict)  # key -> tokens (LRU first)
    pinned_until: dict = field(default_factory=dict)
    prefix_users: dict = field(default_factory=dict)  # group -> running users
    busy: bool = False
    n_programs: int = 0

    def used(self) -> int:
        return sum(r.priv for r in self.running) + sum(self.cache.values())


class Simulator:
    def __init__(self, wl: Workload, policy: str, cost: CostModel = CostModel(), sched: SchedConfig = SchedConfig(),
                 seed: int = 0, trace: bool = False):
        if policy not in ("vllm", "continuum", "thunderagent"):
            raise ValueError(f"policy: unknown policy {policy!r} (vllm, continuum, thunderagent)")
        self.wl, self.policy, self.cost, self.sc = wl, policy, cost, sched
        self.rng = np.random.default_rng(seed)
        self.P = [PState(prog=p, ctx=p.prompt_tokens) for p in wl.programs]
        self.B = [Backend(i, wl.cluster.kv_capacity_tokens) for i in range(wl.cluster.backends)]
        self.now, self.events, self._seq, self._order = 0.0, [], 0, 0
        self.queue: list[int] = []    # thunderagent global waiting queue (new programs)
        self.trace = [] if trace else None
        self.stats = dict(calls=0, hit_tokens=0, prompt_tokens=0, hit_rates=[], recomputed=0, prefill=0,
                          preemptions=0, pauses=0, migrations=0, env_seconds=0.0, peak_envs=0,
                          imbalance_area=0.0, forced=0)
        self.step_log = []  # (time, calls so far)
        self._live_envs, self._last_env_t = 0, 0.0

    # ------------------------------------------------------------------ events
    def push(self, t: float, kind: str, data=None) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, self._seq, kind, data))

    def run(self, max_events: int = 5_000_000) -> dict:
        for i, p in enumerate(self.P):
            self.push(p.prog.arrival_s, "arrive", i)
        if self.policy == "thunderagent":
            self.push(self.sc.tick_s, "tick")
        n = 0
        while self.events:
            t, _, kind, data = heapq.heappop(self.events)
            self._advance_clock(t)
            if kind == "arrive":
                self.on_arrive(data)
            elif kind == "tool_done":
                self.on_tool_done(data)
            elif kind == "chunk_done":
                self.on_chunk_done(*data)
            elif kind == "wake":
                self.start_chunk(self.B[data])
            elif kind == "tick":
                self.on_tick()
                if any(p.phase != "done" for p in self.P):
                    self.push(self.now + self.sc.tick_s, "tick")
            n += 1
            if n > max_events:
                raise RuntimeError("simulation did not finish within max_events (livelock?)")
            if all(p.phase == "done" for p in self.P) and not any(b.running for b in self.B):
                break
        stuck = [p.prog.id for p in self.P if p.phase != "done"]
        if stuck:  # e.g. a call whose context outgrows one backend's KV pool: it can never be admitted
            raise RuntimeError(f"simulation stalled with {len(stuck)} unfinished programs (first: {stuck[0]!r}); "
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

    # ------------------------------------------------------------------ program lifecycle
    def start_env(self, p: PState) -> None:
        if not p.env_started:
            p.env_started = True
            p.env_ready = self.now + p.prog.env_prep_s
            self._env(+1)

    def on_arrive(self, pid: int) -> None:
        p = self.P[pid]
        if self.policy == "thunderagent":
            self.ta_arrive(pid)
            return
        b = min(self.B, key=lambda b: (b.n_programs, b.idx))  # router: fewest programs, sticky
        self.start_program(pid, b.idx)

    def start_program(self, pid: int, bidx: int) -> None:
        p = self.P[pid]
        p.started_at, p.backend = self.now, bidx
        self.B[bidx].n_programs += 1
        self.start_env(p)
        self.submit(pid)

    def submit(self, pid: int) -> None:
        p = self.P[pid]
        if self.policy == "thunderagent" and p.paused:
            p.pending = True
            return
        p.phase = "reasoning"
        self._order += 1
        p.req_seq = self._order
        b = self.B[p.backend]
        b.waiting.append(pid)
        if not b.busy:
            b.busy = True
            self.push(self.now, "wake", b.idx)

    def on_request_done(self, pid: int) -> None:
        p = self.P[pid]
        st = p.prog.steps[p.idx]
        self.stats["calls"] += 1
        self.step_log.append((self.now, self.stats["calls"]))
        if math.isnan(p.first_response):
            p.first_response = self.now - p.prog.arrival_s
        s = p.prog.shared_prefix_tokens
        p.computed_priv = p.ctx + p.gen - s
        b = self.B[p.backend]
        p.idx += 1
        if p.idx >= len(p.prog.steps):
            p.phase, p.end = "done", self.now
            b.n_programs -= 1
            b.cache[pid] = p.computed_priv  # stays as LRU garbage
            if self.policy != "thunderagent" or not self.sc.cleanup_hooks:
                return  # no hook: the environment lives until the run ends
            self._env(-1)  # ALGO: hook-based cleanup on termination
            p.env_freed = True
            return
        b.cache[pid] = p.computed_priv
        if self.policy == "continuum":
            b.pinned_until[pid] = self.now + self.sc.ttl_s  # ALGO (Continuum): TTL pin across the tool call
        if p.marked:
            p.marked, p.paused = False, True
        p.phase, p.acting_since = "acting", self.now
        p.ctx, p.gen = p.ctx + p.gen + st.obs_tokens, 0
        start = max(self.now, p.env_ready)
        self.push(start + st.tool_s, "tool_done", pid)

    def on_tool_done(self, pid: int) -> None:
        self.P[pid].tool_done_at = self.now
        self.submit(pid)

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
            return sorted(b.waiting, key=lambda i: (self.P[i].prog.arrival_s, i))
        return b.waiting  # request FCFS (preempted requests re-enter at the front)

    def admit(self, b: Backend) -> tuple[int, int]:
        prefill = prefill_ctx = 0
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
            b.running.append(Req(pid, total - s, self._order))
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
            if self.trace is not None:
                self.trace.append(("admit", b.idx, pid, cached_priv, prefix_hit, total))
        return prefill, prefill_ctx

    def _preempt(self, b: Backend) -> None:
        r = max(b.running, key=lambda r: r.order)  # vLLM: the most recently admitted
        b.running.remove(r)
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
        prefill, prefill_ctx = self.admit(b)
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
        t0 = sum(self.P[r.pid].ctx + self.P[r.pid].gen for r in b.running)
        rem = min(self.P[r.pid].prog.steps[self.P[r.pid].idx].decode_tokens - self.P[r.pid].gen for r in b.running)
        k = min(rem, self.sc.max_chunk_iters, free // n)
        if self.events:  # cut at the next event; the first iteration also carries this chunk's prefill
            pre = self.cost.p * prefill + self.cost.q * prefill_ctx
            k = min(k, self.cost.iters_within(self.events[0][0] - self.now - pre, n, t0))
        k = max(1, k)
        dt = self.cost.chunk_time(k, n, t0, prefill, prefill_ctx)
        if self.trace is not None:
            self.trace.append(("decode", b.idx, [r.pid for r in b.running], k, dt))
        self.push(self.now + dt, "chunk_done", (b.idx, k))

    def on_chunk_done(self, bidx: int, k: int) -> None:
        b = self.B[bidx]
        done = []
        for r in b.running:
            p = self.P[r.pid]
            p.gen += k
            r.priv += k
            if p.gen >= p.prog.steps[p.idx].decode_tokens:
                done.append(r)
        for r in done:
            b.running.remove(r)
            p = self.P[r.pid]
            self._release_prefix(b, p)
            self.on_request_done(r.pid)
        self.start_chunk(b)

    # ------------------------------------------------------------------ ThunderAgent
    def _claim(self, p: PState) -> float:
        c = p.ctx + p.gen
        if p.phase == "acting" and not p.pending:
            f = 2.0 ** (-(self.now - p.acting_since) / self.sc.decay_half_life_s) if self.sc.acting_decay else 1.0
            return self.sc.acting_weight * c * f  # ALGO: Σ_A c·f(t), f(t) = 2^{-t}
        return float(c)

    def _active_on(self, bidx: int) -> list[int]:
        return [i for i, p in enumerate(self.P) if p.backend == bidx and p.phase not in ("done", "new", "queued")
                and not p.paused and not p.marked]

    def _used(self, bidx: int) -> float:
        # ALGO: thrashing check  Σ_R c + w·Σ_A c·f(t) + 100·n  vs  C  (no shared-prefix credit, as official)
        act = self._active_on(bidx)
        return sum(self._claim(self.P[i]) for i in act) + PROGRAM_OVERHEAD * len(act)

    def ta_arrive(self, pid: int) -> None:
        p = self.P[pid]
        p.phase, p.queued_at = "queued", self.now
        c = p.prog.prompt_tokens + PROGRAM_OVERHEAD
        if not self.queue:
            room = [(self.B[i].cap - self._used(i), i) for i in range(len(self.B))]
            r, bi = max(room, key=lambda x: (x[0], -x[1]))
            if c <= r:
                self.start_program(pid, bi)
                return
        self.queue.append(pid)
        self._prep_lookahead()

    def _new_key(self, pid: int) -> float:
        p = self.P[pid]
        c = float(p.prog.prompt_tokens)
        if self.sc.aging_half_life_s > 0:  # ALGO (ours, fix for issue #46): aged size c·2^{-wait/h}
            c *= 2.0 ** (-(self.now - p.queued_at) / self.sc.aging_half_life_s)
        return c

    def _prep_lookahead(self) -> None:
        if self.sc.async_env_prep:  # ALGO: asynchronous environment preparation for programs about to run
            for pid in sorted(self.queue, key=lambda i: (self._new_key(i), i))[: self.sc.prep_lookahead]:
                self.start_env(self.P[pid])

    def on_tick(self) -> None:
        self.resume()
        self.pause()
        self._prep_lookahead()

    def pause(self) -> None:
        for bi in range(len(self.B)):
            over = self._used(bi) - self.B[bi].cap
            if over <= 0:
                continue
            act = self._active_on(bi)
            acting = [i for i in act if self.P[i].phase == "acting" and not self.P[i].pending]
            reasoning = [i for i in act if i not in acting]
            # ALGO: victims minimising Σc² s.t. Σc ≥ ΔC — shortest-first, Acting before Reasoning
            for tier in (acting, reasoning):
                for i in self._victim_order(tier):
                    if over <= 0:
                        break
                    p = self.P[i]
                    over -= self._claim(p) + PROGRAM_OVERHEAD
                    if p.phase == "acting":
                        p.paused = True
                    else:
                        p.marked = True
                    self.stats["pauses"] += 1

    def _victim_order(self, ids: list[int]) -> list[int]:
        if self.sc.victim_order == "random":
            ids = list(ids)
            self.rng.shuffle(ids)
            return ids
        sign = -1 if self.sc.victim_order == "longest" else 1
        return sorted(ids, key=lambda i: (sign * (self.P[i].ctx + self.P[i].gen), i))

    def resume(self) -> None:
        free = {i: self.B[i].cap - self._used(i) for i in range(len(self.B))}
        total_free = sum(max(0.0, f) for f in free.values())
        paused = [i for i, p in enumerate(self.P) if p.paused and p.phase != "done"]
        tier0 = [i for i in paused if self.P[i].pending]        # Reasoning (step > 1)
        tier2 = [i for i in paused if not self.P[i].pending]    # Acting
        forced = [i for i in self.queue + paused if self.now - self._since(i) >= self.sc.forced_resume_s]
        take, acc, blocked = [], 0.0, False
        # ALGO: restore order Reasoning > New > Acting, smallest first per tier, skip what does not fit
        for tier, key in ((tier0, lambda i: (self.P[i].ctx, i)), (list(self.queue), lambda i: (self._new_key(i), i)),
                          (tier2, lambda i: (self.P[i].ctx, i))):
            for i in sorted(tier, key=key):
                if blocked:
                    break
                c = self.P[i].ctx + PROGRAM_OVERHEAD
                if acc + c <= total_free:
                    take.append(i)
                    acc += c
                elif (self.sc.no_skip_after_s > 0 and self.P[i].phase == "queued"
                      and self.now - self.P[i].queued_at >= self.sc.no_skip_after_s):
                    blocked = True  # ALGO (ours): a starving program is never skipped; capacity accumulates for it
        for i in forced:
            if i not in take:
                take.append(i)
                self.stats["forced"] += 1
        # ALGO: Best-Fit-Decreasing — the largest program onto the backend with the most room
        for i in sorted(take, key=lambda i: (-self.P[i].ctx, i)):
            bi = max(free, key=lambda j: (free[j], -j))
            own = self.P[i].backend
            if self.sc.kv_affinity and own >= 0 and free[own] >= self.P[i].ctx + PROGRAM_OVERHEAD:
                bi = own  # (ours) keep a program where its KV is when it fits there
            free[bi] -= self.P[i].ctx + PROGRAM_OVERHEAD
            p = self.P[i]
            if p.phase == "queued":
                self.queue.remove(i)
                self.start_program(i, bi)
                continue
            if p.backend != bi:
                self.stats["migrations"] += 1
                self.B[p.backend].n_programs -= 1
                self.B[bi].n_programs += 1
                p.backend = bi
            p.paused = False
            if p.pending:
                p.pending = False
                self.submit(i)

    def _since(self, i: int) -> float:
        p = self.P[i]
        return p.queued_at if p.phase == "queued" else (p.tool_done_at if p.pending else p.acting_since)

    # ------------------------------------------------------------------ metrics
    def summary(self) -> dict:
        if self._live_envs:
            self._env(-self._live_envs)
        makespan = max((p.end for p in self.P), default=0.0)
        ttfr = np.array([p.first_response for p in self.P])
        hr = self.stats["hit_rates"]
        return {
            "policy": self.policy, "programs": len(self.P), "calls": self.stats["calls"],
            "makespan_s": makespan,
            "steps_per_min": self.stats["calls"] / (makespan / 60.0) if makespan > 0 else 0.0,
            "kv_hit_rate": float(np.mean(hr)) if hr else 0.0,
            "kv_hit_rate_token_weighted": self.stats["hit_tokens"] / max(1, self.stats["prompt_tokens"]),
            # reusable-context hit rate: cached / (cached + recomputed) tokens — 1.0 means no recompute
            "kv_reuse_rate": self.stats["hit_tokens"] / max(1, self.stats["hit_tokens"] + self.stats["recomputed"]),
            "recomputed_tokens": int(self.stats["recomputed"]), "preemptions": self.stats["preemptions"],
            "pauses": self.stats["pauses"], "migrations": self.stats["migrations"], "forced_resumes": self.stats["forced"],
            "ttfr_p50_s": float(np.percentile(ttfr, 50)), "ttfr_p95_s": float(np.percentile(ttfr, 95)),
            "ttfr_max_s": float(ttfr.max()),
            "ttfr_by_prompt": [[p.prog.prompt_tokens, p.first_response] for p in self.P],
            "memory_imbalance": self.stats["imbalance_area"] / makespan if makespan > 0 else 0.0,
            "peak_live_envs": self.stats["peak_envs"], "env_seconds": self.stats["env_seconds"],
        }


def simulate(wl: Workload, policy: str, cost: CostModel = CostModel(), sched: SchedConfig = SchedConfig(),
             seed: int = 0, trace: bool = False):
    sim = Simulator(wl, policy, cost, sched, seed, trace)
    out = sim.run()
    return (out, sim.trace) if trace else out
