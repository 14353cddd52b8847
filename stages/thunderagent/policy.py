"""The ThunderAgent scheduling policy — ONE implementation shared by the simulator and the HTTP proxy.

Both callers translate their world into the same five events and obey the same answers:

    pol = ThunderPolicy(capacities=[C0, C1], cfg=PolicyConfig())     # or DefaultRouter(...) for vLLM
    b = pol.on_request(pid, tokens, now)   # a program sends an LLM call: forward to backend b, or None = hold it
    pol.on_progress(pid, delta)            # streamed tokens of the call in flight (optional)
    pol.on_response(pid, total, now)       # the call returned usage.total_tokens (program -> Acting)
    pol.on_release(pid, now)               # the program terminated (client calls /programs/release)
    for pid, b in pol.tick(now): ...       # every Δt: resume (may release held calls to b), forced resume, pause

``sim.Simulator`` calls these from its discrete-event loop (tokens exact); ``serve`` calls them from HTTP
handlers (tokens estimated from the payload before a call, usage.total_tokens after, as the official
code). Both write the same decision log (``pol.log``: (time, kind, program, backend) tuples), which the
loopback test compares.

Official code (ThunderAgent-org/ThunderAgent @ a7eef77; R = scheduler/router.py, S = backend/state.py):

- Capacity rule (S:182-191), ``used(b) = Σ_Reasoning c + w·Σ_Acting c + PROGRAM_OVERHEAD·n`` over the
  programs registered on backend b, against C = block_size·num_gpu_blocks. No shared-prefix credit
  (shared_tokens stays 0 in the official code), so a shared system prompt counts once per program.
  ``charge(c) = c + PROGRAM_OVERHEAD`` is what one program of context c costs; ``workload.check_capacity``
  refuses, up front, any program whose peak context cannot be charged to one backend — the same rule.
- New program (R:249-281, 341-362): starts only if the global waiting pool is empty and some healthy
  backend has remaining ≥ c + 100 (the one with the fewest active tokens); otherwise it waits in the pool.
- Tick (R:671-683): resume, then pause. Pause (R:685-717): while over capacity, pause the smallest ACTING
  program; else mark the smallest REASONING one (it is paused when its reply ends). Resume (R:719-844):
  tiers Reasoning (a held call, step > 1) > New (step 1) > Acting, ascending tokens (the snapshot taken when
  it entered the pool) within a tier; take a program if the running sum of c + 100 fits the total free
  capacity, else skip it; Best-Fit-Decreasing places the largest onto the backend with the most room.
- A held call waits at most ``forced_resume_s`` (1800 s, R:846-868), then is forced onto its origin backend
  (a new program: the backend with the fewest programs). Here checked at ticks (official: its own timer).
- Acting decay f(t) = 2^{−t/h} only in the resume capacity, behind a flag (off in the serving scripts).

Labelled options (not official): ``marks_lower_capacity`` (True: a mark counts as paused at once — the
paper's algorithm; the official code as read leaves marks in the capacity sum, so once Acting programs run
out every Reasoning program is marked), ``kv_affinity`` (resume onto the origin backend when it fits),
``aging_half_life_s`` / ``no_skip_after_s`` (the starvation fix for official issue #46).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Hashable, Literal

PROGRAM_OVERHEAD = 100  # tokens reserved per program in the capacity rule (official BUFFER_PER_PROGRAM)


def charge(tokens: float) -> float:
    """What one program of `tokens` context costs in the capacity rule."""
    return tokens + PROGRAM_OVERHEAD


def fits(tokens: float, capacity: float) -> bool:
    """The one capacity rule: a program fits an (empty) backend iff charge(tokens) ≤ capacity."""
    return charge(tokens) <= capacity


@dataclass(frozen=True)
class PolicyConfig:
    acting_weight: float = 1.0              # w on Acting programs' context (official serving: 1.0; SkyRL: 0.1)
    acting_decay: bool = False              # f(t) = 2^{-t/h} on Acting claims in the resume capacity (official: off)
    decay_half_life_s: float = 1.0
    victim_order: Literal["shortest", "longest", "random"] = "shortest"
    marks_lower_capacity: bool = True       # (paper) a marked program no longer counts; official as read: False
    kv_affinity: bool = False               # (ours) resume onto the origin backend when it fits; official: False
    aging_half_life_s: float = 0.0          # (ours, #46 fix) new-tier key c·2^{-wait/h}; 0 = off (official)
    no_skip_after_s: float = 0.0            # (ours, #46 fix) a new program waiting longer for its first call goes
                                            # first, is never skipped, and room is made for it (0 = off, official)
    forced_resume_s: float = 1800.0         # official bound on a held call's wait


@dataclass
class Prog:
    pid: Hashable
    seq: int                                 # creation order (stable tie-break, as dict order officially)
    tokens: float = 0.0                      # c: estimate before a call, usage.total_tokens after
    status: str = "reasoning"                # reasoning | acting
    paused: bool = False                     # in the global waiting pool (new programs too)
    marked: bool = False                     # pause when the reply ends
    waiting: bool = False                    # a call is held by the proxy
    backend: int | None = None               # registered on (None while in the pool)
    origin: int | None = None                # backend it was paused from (None: new / evacuated)
    steps: int = 0                           # calls seen (official step_count)
    started: bool = False                    # ever registered on a backend
    created_at: float = 0.0
    wait_since: float = 0.0
    acting_since: float = 0.0
    pool_seq: int = 0
    pool_tokens: float = 0.0                 # tokens when it entered the pool (official PausedInfo)


@dataclass
class Stats:
    starts: int = 0
    queued: int = 0
    holds: int = 0
    pauses: int = 0
    marks: int = 0
    resumes: int = 0
    forced: int = 0
    migrations: int = 0
    evacuated: int = 0


class _Base:
    """What both policies share: program table, backends, health, the decision log."""

    def __init__(self, capacities: list[float], *, log: bool = True):
        if not capacities:
            raise ValueError("capacities: need at least one backend")
        self.cap = [float(c) for c in capacities]
        self.healthy = [True] * len(capacities)
        self.members: list[dict] = [dict() for _ in capacities]     # backend -> {pid: Prog} (insertion order)
        self.progs: dict[Hashable, Prog] = {}
        self.stats = Stats()
        self.log: list[tuple] | None = [] if log else None
        self._seq = 0

    def _log(self, now: float, kind: str, pid, backend=None) -> None:
        if self.log is not None:
            self.log.append((now, kind, pid, backend))

    def _new(self, pid, now: float) -> Prog:
        self._seq += 1
        p = Prog(pid=pid, seq=self._seq, created_at=now)
        self.progs[pid] = p
        return p

    def _register(self, p: Prog, b: int) -> None:
        p.backend, p.started = b, True
        self.members[b][p.pid] = p

    def _unregister(self, p: Prog) -> None:
        if p.backend is not None:
            self.members[p.backend].pop(p.pid, None)
        p.backend = None

    def fewest_programs(self) -> int:
        """Official default router: the healthy backend with the fewest registered programs (lowest index)."""
        best, load = None, math.inf
        for b in range(len(self.cap)):
            if self.healthy[b] and len(self.members[b]) < load:
                best, load = b, len(self.members[b])
        return 0 if best is None else best

    def backend_of(self, pid) -> int | None:
        p = self.progs.get(pid)
        return None if p is None else p.backend

    def on_progress(self, pid, delta: int) -> None:
        p = self.progs.get(pid)
        if p is not None:
            p.tokens += delta

    def state_counts(self) -> dict[str, int]:
        out = {"reasoning": 0, "acting": 0, "paused": 0, "queued_new": 0, "marked": 0, "held": 0}
        for p in self.progs.values():
            if p.paused:
                out["paused" if p.started else "queued_new"] += 1
            else:
                out[p.status] += 1
            out["marked"] += p.marked
            out["held"] += p.waiting
        return out


class DefaultRouter(_Base):
    """The vLLM baseline's router (official --router default): fewest programs, sticky; no scheduling."""

    name = "default"

    def on_request(self, pid, tokens: float, now: float) -> int:
        p = self.progs.get(pid)
        if p is None:
            p = self._new(pid, now)
        p.steps += 1
        p.tokens, p.status = float(tokens), "reasoning"
        if p.backend is None or not self.healthy[p.backend]:
            if p.backend is not None:
                self._unregister(p)
            self._register(p, self.fewest_programs())
            self.stats.starts += 1
            self._log(now, "start", pid, p.backend)
        else:
            self._log(now, "forward", pid, p.backend)
        return p.backend

    def on_response(self, pid, total: float, now: float) -> None:
        p = self.progs.get(pid)
        if p is not None:
            p.tokens, p.status, p.acting_since = float(total), "acting", now

    def on_error(self, pid, now: float) -> None:
        p = self.progs.get(pid)
        if p is not None:
            p.status, p.acting_since = "acting", now

    def on_release(self, pid, now: float) -> None:
        p = self.progs.pop(pid, None)
        if p is not None:
            self._unregister(p)
            self._log(now, "release", pid)

    def tick(self, now: float) -> list[tuple]:
        return []

    def set_healthy(self, b: int, healthy: bool, now: float) -> None:
        self.healthy[b] = healthy

    def used(self, b: int) -> float:
        return sum(charge(p.tokens) for p in self.members[b].values())


class ThunderPolicy(_Base):
    """Program-aware pause/resume against KV capacity (the official 'tr' router mode)."""

    name = "thunderagent"

    def __init__(self, capacities: list[float], cfg: PolicyConfig = PolicyConfig(), *, seed: int = 0,
                 log: bool = True):
        super().__init__(capacities, log=log)
        self.cfg = cfg
        self.rng = random.Random(seed)
        self.pool: dict[Hashable, Prog] = {}      # the global waiting pool (paused and queued new programs)
        self._pool_seq = 0
        self.reserve = 0.0                         # (#46 fix) room to make for the oldest starving call

    # ----------------------------------------------------------------- the capacity rule
    def claim(self, p: Prog, now: float | None = None) -> float:
        """A registered program's claim on its backend (now given: with the acting decay, if enabled)."""
        if p.status == "acting" and not p.waiting:
            f = 1.0
            if now is not None and self.cfg.acting_decay:
                f = 2.0 ** (-(now - p.acting_since) / self.cfg.decay_half_life_s)  # ALGO: f(t) = 2^{-t}
            return self.cfg.acting_weight * p.tokens * f                            # ALGO: w·Σ_A c·f(t)
        return p.tokens                                                             # ALGO: Σ_R c

    def counted(self, b: int) -> list[Prog]:
        """Programs whose claim counts on backend b (marked ones leave it at once when marks lower capacity)."""
        ms = self.members[b].values()
        return [p for p in ms if not p.marked] if self.cfg.marks_lower_capacity else list(ms)

    def used(self, b: int, now: float | None = None) -> float:
        # ALGO: thrashing check  Σ_R c + w·Σ_A c·f(t) + 100·n  vs  C  (no shared-prefix credit, as official)
        return sum(self.claim(p, now) + PROGRAM_OVERHEAD for p in self.counted(b))

    def remaining(self, b: int, now: float | None = None) -> float:
        return self.cap[b] - self.used(b, now)

    def active_tokens(self, b: int) -> float:
        return sum(self.claim(p) for p in self.members[b].values())

    # ----------------------------------------------------------------- events
    def on_request(self, pid, tokens: float, now: float) -> int | None:
        p = self.progs.get(pid)
        if p is None:
            p = self._new(pid, now)
        p.steps += 1
        p.tokens, p.status = float(tokens), "reasoning"
        if p.paused:                                   # paused: the call waits for a resume
            p.waiting, p.wait_since = True, now
            self.stats.holds += 1
            self._log(now, "hold", pid)
            return None
        if p.steps == 1 and p.backend is None:         # a new program: start now or queue
            b = self._select_new(p.tokens)
            if b is not None:
                self._register(p, b)
                self.stats.starts += 1
                self._log(now, "start", pid, b)
                return b
            p.waiting, p.wait_since = True, now
            self._enter_pool(p)
            self.stats.queued += 1
            self._log(now, "queue", pid)
            return None
        self._log(now, "forward", pid, p.backend)
        return p.backend

    def on_response(self, pid, total: float, now: float) -> None:
        p = self.progs.get(pid)
        if p is None:
            return
        p.tokens, p.status, p.acting_since = float(total), "acting", now
        if p.marked:                                   # ALGO: a marked program pauses at the end of its reply
            p.marked = False
            self._pause(p, now, "pause_marked")

    def on_error(self, pid, now: float) -> None:
        """The call failed (backend error): the program is idle again, as after a reply."""
        p = self.progs.get(pid)
        if p is not None:
            p.status, p.acting_since = "acting", now
            if p.marked:
                p.marked = False
                self._pause(p, now, "pause_marked")

    def on_release(self, pid, now: float) -> None:
        p = self.progs.pop(pid, None)
        if p is None:
            return
        self.pool.pop(pid, None)
        self._unregister(p)
        self._log(now, "release", pid)

    def tick(self, now: float) -> list[tuple]:
        """Resume, forced resume, then pause every healthy backend. Returns (pid, backend) of held calls to send."""
        released: list[tuple] = []
        self.reserve = 0.0
        self._resume(now, released)
        self._forced(now, released)
        target = None
        if self.reserve > 0:   # ALGO (ours, #46 fix): make room for a starving call on the roomiest backend
            up = [b for b in range(len(self.cap)) if self.healthy[b]]
            target = max(up, key=lambda b: (self.remaining(b), -b)) if up else None
        for b in range(len(self.cap)):
            if self.healthy[b]:
                self._pause_until_safe(b, now, self.reserve if b == target else 0.0)
        return released

    def set_healthy(self, b: int, healthy: bool, now: float) -> None:
        """A backend went down: its programs lose their KV and go to the pool (resumed elsewhere by the
        next tick); a backend back up becomes eligible again."""
        if self.healthy[b] == healthy:
            return
        self.healthy[b] = healthy
        if not healthy:
            for p in list(self.members[b].values()):
                self._unregister(p)
                p.marked, p.paused, p.origin = False, True, None
                self._enter_pool(p)
                self.stats.evacuated += 1
                self._log(now, "evacuate", p.pid, b)

    # ----------------------------------------------------------------- decisions
    def _select_new(self, tokens: float) -> int | None:
        if self.pool:                                  # fairness: nobody overtakes the waiting pool
            return None
        best, least = None, math.inf
        for b in range(len(self.cap)):
            if not self.healthy[b] or self.remaining(b) < charge(tokens):
                continue
            t = self.active_tokens(b)
            if t < least:
                best, least = b, t
        return best

    def _enter_pool(self, p: Prog) -> None:
        self._pool_seq += 1
        p.pool_seq, p.pool_tokens, p.paused = self._pool_seq, p.tokens, True
        self.pool[p.pid] = p

    def _pause(self, p: Prog, now: float, kind: str = "pause") -> None:
        b = p.backend
        self._unregister(p)
        p.origin = b
        self._enter_pool(p)
        self.stats.pauses += 1
        self._log(now, kind, p.pid, b)

    def victim_order(self, progs: list[Prog]) -> list[Prog]:
        if self.cfg.victim_order == "random":
            out = sorted(progs, key=lambda p: p.seq)
            self.rng.shuffle(out)
            return out
        sign = -1.0 if self.cfg.victim_order == "longest" else 1.0
        return sorted(progs, key=lambda p: (sign * p.tokens, p.seq))

    def _pause_until_safe(self, b: int, now: float, reserve: float = 0.0) -> None:
        over = self.used(b) + reserve - self.cap[b]
        if over <= 0:
            return
        ms = list(self.members[b].values())
        acting = [p for p in ms if p.status == "acting" and not p.marked]
        reasoning = [p for p in ms if p.status == "reasoning" and not p.marked]
        # ALGO: victims minimising Σc² s.t. Σc ≥ ΔC — shortest-first greedy, Acting before Reasoning
        for p in self.victim_order(acting):
            if over <= 0:
                return
            over -= self.claim(p) + PROGRAM_OVERHEAD
            self._pause(p, now)
        for p in self.victim_order(reasoning):
            if over <= 0:
                return
            if self.cfg.marks_lower_capacity:
                over -= self.claim(p) + PROGRAM_OVERHEAD
            p.marked = True
            self.stats.marks += 1
            self._log(now, "mark", p.pid, b)

    def new_key(self, p: Prog, now: float) -> float:
        c = p.pool_tokens
        if self.cfg.aging_half_life_s > 0:   # ALGO (ours, fix for #46): aged size c·2^{-wait/h}
            c *= 2.0 ** (-(now - p.wait_since) / self.cfg.aging_half_life_s)
        return c

    def queued_new(self, now: float) -> list[Prog]:
        """New programs in the pool, in the order the resume pass considers them."""
        new = [p for p in self.pool.values() if p.steps == 1]
        return sorted(new, key=lambda p: (self.new_key(p, now), p.pool_seq))

    def _resume(self, now: float, released: list) -> None:
        decay = self.cfg.acting_decay
        caps = []
        for b in range(len(self.cap)):
            if not self.healthy[b]:
                continue
            rem = self.remaining(b, now if decay else None)
            if rem > PROGRAM_OVERHEAD:
                caps.append([b, rem])
        total = sum(r for _, r in caps)
        if not self.pool:
            return
        snap = sorted(self.pool.values(), key=lambda p: (p.pool_tokens, p.pool_seq))
        starving = []
        if self.cfg.no_skip_after_s > 0:   # ALGO (ours, #46 fix): new programs held longer than the bound go first
            starving = sorted((p for p in snap if p.waiting and not p.started
                               and now - p.wait_since >= self.cfg.no_skip_after_s),
                              key=lambda p: (p.wait_since, p.pool_seq))
        if not caps or total <= 0:
            if starving:
                self.reserve = charge(starving[0].tokens)
            return
        late = {p.pid for p in starving}
        reasoning = [p for p in snap if p.steps != 1 and p.status == "reasoning" and p.pid not in late]
        new = [p for p in self.queued_new(now) if p.pid not in late]
        acting = [p for p in snap if p.steps != 1 and p.status != "reasoning" and p.pid not in late]
        take, acc = [], 0.0
        # ALGO: restore order Reasoning > New > Acting, smallest first per tier, skip what does not fit
        for tier, group in (("starving", starving), ("reasoning", reasoning), ("new", new), ("acting", acting)):
            for p in group:
                need = charge(p.tokens)
                if acc + need <= total:
                    take.append(p)
                    acc += need
                elif tier == "starving":
                    self.reserve = need   # ALGO (ours): never skipped; nobody overtakes it, room is made for it
                    break
            else:
                continue
            break
        if not take:
            return
        # ALGO: Best-Fit-Decreasing — the largest program onto the backend with the most room
        take.sort(key=lambda p: -p.tokens)
        caps.sort(key=lambda x: -x[1])
        smallest = charge(take[-1].tokens)
        for p in take:
            if not caps or smallest > caps[0][1]:
                break
            need = charge(p.tokens)
            if need > caps[0][1]:
                continue
            slot = caps[0]
            if self.cfg.kv_affinity and p.origin is not None:
                own = next((c for c in caps if c[0] == p.origin), None)
                if own is not None and own[1] >= need:
                    slot = own   # (ours) keep a program where its KV is when it fits there
            self._resume_to(p, slot[0], now, released, "resume")
            slot[1] -= need
            if slot[1] <= PROGRAM_OVERHEAD:
                caps.remove(slot)
            caps.sort(key=lambda x: -x[1])
        if not self.reserve:
            left = next((p for p in starving if p.paused), None)   # selected but no single backend had room
            if left is not None:
                self.reserve = charge(left.tokens)

    def _forced(self, now: float, released: list) -> None:
        for p in sorted(self.pool.values(), key=lambda p: p.pool_seq):
            if p.waiting and now - p.wait_since >= self.cfg.forced_resume_s:
                b = p.origin if p.origin is not None and self.healthy[p.origin] else self.fewest_programs()
                self.stats.forced += 1
                self._resume_to(p, b, now, released, "forced")

    def _resume_to(self, p: Prog, b: int, now: float, released: list, kind: str) -> None:
        self.pool.pop(p.pid, None)
        p.paused = False
        if p.origin is not None and p.origin != b:
            self.stats.migrations += 1
        p.origin = None
        self._register(p, b)
        self.stats.resumes += 1
        self._log(now, kind, p.pid, b)
        if p.waiting:
            p.waiting = False
            released.append((p.pid, b))


def make_policy(name: str, capacities: list[float], cfg: PolicyConfig = PolicyConfig(), *, seed: int = 0,
                log: bool = True):
    if name == "thunderagent":
        return ThunderPolicy(capacities, cfg, seed=seed, log=log)
    if name in ("vllm", "continuum", "default"):
        return DefaultRouter(capacities, log=log)
    raise ValueError(f"policy: unknown policy {name!r} (thunderagent, vllm, continuum)")
