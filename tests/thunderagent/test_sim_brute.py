"""sim.py against hand-worked timelines and an independent per-iteration reference simulator.

The reference below (``ref_ample``) is written from the module docstring only: one engine, ample KV,
continuous batching one decode iteration at a time (iteration time a + b·KV read + p·prefill +
q·prefill·context), FCFS admission at iteration boundaries, prefix/private KV reuse. The simulator
under test advances in closed-form macro-steps cut at events, so agreeing with the reference on
random workloads checks the closed form, the cut points and the bookkeeping at once.
"""
from __future__ import annotations

import heapq
import itertools
import math

import numpy as np
import pytest

from stages.thunderagent.sim import CostModel, SchedConfig, SimulationError, Simulator, simulate
from stages.thunderagent.workload import Cluster, Program, Step, Workload

COST = CostModel(a=0.5, b=0.01, p=0.1, q=0.001)   # non-unit, distinct coefficients


# ------------------------------------------------------------------------------------ cost model
def test_chunk_time_hand_numbers():
    # k=3 iterations, n=2 requests, t0=10 KV tokens, 7 prefill tokens at context 40:
    # 0.1·7 + 0.001·7·40 + 3·0.5 + 0.01·(10 + 12 + 14) = 0.7 + 0.28 + 1.5 + 0.36 = 2.84
    assert COST.chunk_time(3, 2, 10, 7, 280) == pytest.approx(2.84, abs=1e-12)
    assert COST.chunk_time(1, 5, 0) == pytest.approx(0.5, abs=1e-12)
    assert CostModel().chunk_time(2, 1, 100) == pytest.approx(2 * 0.025 + 8e-8 * 201, rel=1e-12)


def _brute_iters(c: CostModel, dt: float, n: int, t0: int) -> int:
    k, tot = 0, 0.0
    while True:
        nxt = tot + c.a + c.b * (t0 + n * k)
        if nxt > dt:
            return max(1, k)
        tot, k = nxt, k + 1


def test_iters_within_matches_brute_force():
    rng = np.random.default_rng(5)
    for _ in range(300):
        c = CostModel(a=float(rng.uniform(0.01, 1.0)), b=float(rng.uniform(1e-4, 0.05)), p=0.3, q=0.002)
        n, t0 = int(rng.integers(1, 9)), int(rng.integers(0, 500))
        dt = float(rng.uniform(0.0, 40.0))
        assert c.iters_within(dt, n, t0) == _brute_iters(c, dt, n, t0), (c, dt, n, t0)
    # hand: a=0.5, b=0.01, n=2, t0=10: iteration times 0.6, 0.62, 0.64 → cumulative 0.6, 1.22, 1.86
    assert COST.iters_within(1.85, 2, 10) == 2 and COST.iters_within(1.87, 2, 10) == 3
    assert COST.iters_within(0.59, 2, 10) == 1 and COST.iters_within(-1.0, 2, 10) == 1
    assert COST.iters_within(0.0, 2, 10) == 1
    # b = 0 (no per-token term): k = floor(dt / a) exactly
    flat = CostModel(a=0.25, b=0.0, p=0.1, q=0.0)
    assert flat.iters_within(1.3, 3, 50) == 5 and flat.iters_within(0.1, 3, 50) == 1
    # free decode (a = b = 0): unbounded, guarded against division by zero (dt / 1e-12)
    assert CostModel(0.0, 0.0, 0.1, 0.0).iters_within(2.0, 3, 7) == int(2.0 / 1e-12)
    # n = 0 is linear too: k·(a + b·t0) ≤ dt; 0.5 + 0.01·10 = 0.6 per iteration
    assert COST.iters_within(1.9, 0, 10) == 3 and COST.iters_within(1.7, 0, 10) == 2


# ------------------------------------------------------------------------------------ hand timeline
def test_single_program_timeline_by_hand():
    """One program: prompt 10, call 0 decodes 3 then a 2.0 s tool returning 5 tokens, call 1 decodes 2.

    t=0     admit: 10 new tokens (no cache).  chunk k=3, t0=10:
            0.1·10 + 0.001·10·10 + 3·0.5 + 0.01·(3·10 + 1·3) = 1 + 0.1 + 1.5 + 0.33 = 2.93
    t=2.93  call 0 done (ttfr 2.93); private KV 13 stays cached; tool until 4.93; context 13 + 5 = 18
    t=4.93  admit: 13 cached, 5 new.  chunk k=2, t0=18:
            0.1·5 + 0.001·5·18 + 2·0.5 + 0.01·(2·18 + 1) = 0.5 + 0.09 + 1.0 + 0.37 = 1.96
    t=6.89  done.  hit rates 0 and 13/18; token-weighted 13/28; no recompute.
    """
    prog = Program("x", 10, (Step(3, 2.0, 5), Step(2)))
    for pol in ("vllm", "continuum", "thunderagent"):
        # (thunderagent's scheduling tick would cut a chunk in two; put it after the end)
        r, trace = simulate(Workload([prog], Cluster(1, 10**5, 16)), pol, COST, SchedConfig(tick_s=50.0), trace=True)
        assert [op[:6] if op[0] == "admit" else op[:4] for op in trace] == [
            ("admit", 0, 0, 0, 0, 10), ("decode", 0, [0], 3), ("admit", 0, 0, 13, 0, 18), ("decode", 0, [0], 2)]
        assert [op[4] for op in trace if op[0] == "decode"] == pytest.approx([2.93, 1.96], abs=1e-12)
        assert r["policy"] == pol and r["programs"] == 1 and r["calls"] == 2
        assert r["makespan_s"] == pytest.approx(6.89, abs=1e-12)
        assert r["steps_per_min"] == pytest.approx(2 / (6.89 / 60), rel=1e-12)
        assert r["kv_hit_rate"] == pytest.approx(13 / 36, rel=1e-12)
        assert r["kv_hit_rate_token_weighted"] == pytest.approx(13 / 28, rel=1e-12)
        assert r["kv_reuse_rate"] == 1.0 and r["recomputed_tokens"] == 0 and r["preemptions"] == 0
        assert r["pauses"] == r["migrations"] == r["forced_resumes"] == 0
        assert r["ttfr_p50_s"] == r["ttfr_p95_s"] == r["ttfr_max_s"] == pytest.approx(2.93, abs=1e-12)
        assert r["ttfr_by_prompt"] == [[10, pytest.approx(2.93, abs=1e-12)]]
        assert r["memory_imbalance"] == 0.0 and r["peak_live_envs"] == 1
        assert r["env_seconds"] == pytest.approx(6.89, abs=1e-12)


def test_env_prep_delays_the_tool_and_prefix_is_shared():
    """Two programs of one prefix group (s = 4) arriving together; program 1 has env prep 10 s.

    t=0: both admitted in one pass (FCFS). Program 0 computes the prefix (4) + 6 private tokens; program 1
    finds the prefix cached (hit 4 of 10). Prefill 10 + 6 = 16 tokens at context 10: 1.6 + 0.16 = 1.76.
    Chunk k = 1 (both decode 1), n = 2, t0 = 20: 0.5 + 0.2 = 0.7 → t = 2.46, both calls done.
    Program 0: tool 1.0 s → 3.46. Program 1: its tool starts when its env is ready (t = 10) → 11.0.
    t=3.46 program 0 call 1: cached 7 (+ prefix 4 = 11 of 11 + 2 obs = 13), prefill 2 at ctx 13:
           0.2 + 0.026 + 0.5 + 0.01·13 = 0.856 → end 4.316.
    t=11   program 1 call 1: same shape → 11.856.
    """
    progs = [Program("a", 10, (Step(1, 1.0, 2), Step(1)), shared_prefix_tokens=4, prefix_group="s"),
             Program("b", 10, (Step(1, 1.0, 2), Step(1)), shared_prefix_tokens=4, prefix_group="s", env_prep_s=10.0)]
    r, trace = simulate(Workload(progs, Cluster(1, 10**5, 16)), "vllm", COST, trace=True)
    admits = [op for op in trace if op[0] == "admit"]
    assert admits == [("admit", 0, 0, 0, 0, 10), ("admit", 0, 1, 0, 4, 10), ("admit", 0, 0, 7, 4, 13),
                      ("admit", 0, 1, 7, 4, 13)]
    assert [op[4] for op in trace if op[0] == "decode"] == pytest.approx([1.76 + 0.7, 0.856, 0.856], abs=1e-12)
    assert r["makespan_s"] == pytest.approx(11.856, abs=1e-12)
    assert r["ttfr_by_prompt"] == [[10, pytest.approx(2.46)], [10, pytest.approx(2.46)]]
    # hit rates: 0, 4/10, 11/13, 11/13
    assert r["kv_hit_rate"] == pytest.approx((0 + 0.4 + 2 * 11 / 13) / 4, rel=1e-12)
    assert r["kv_hit_rate_token_weighted"] == pytest.approx(26 / 46, rel=1e-12)
    # vllm has no cleanup hook: both environments live to the end: 2 × 11.856
    assert r["env_seconds"] == pytest.approx(2 * 11.856, rel=1e-12) and r["peak_live_envs"] == 2
    t = simulate(Workload(progs, Cluster(1, 10**5, 16)), "thunderagent", COST)
    # thunderagent frees an environment at its program's end (hook): 4.316 + 11.856
    assert t["env_seconds"] == pytest.approx(4.316 + 11.856, rel=1e-12)
    assert t["makespan_s"] == pytest.approx(11.856, abs=1e-12)
    nohook = simulate(Workload(progs, Cluster(1, 10**5, 16)), "thunderagent", COST, SchedConfig(cleanup_hooks=False))
    assert nohook["env_seconds"] == pytest.approx(2 * 11.856, rel=1e-12)


# ------------------------------------------------------------------------------------ reference simulator
def ref_ample(progs: list[Program], cost: CostModel):
    """Per-iteration discrete-event reference for one engine with ample KV (see the module docstring)."""
    n = len(progs)
    seq = itertools.count()
    ev = [(p.arrival_s, next(seq), "submit", i) for i, p in enumerate(progs)]
    heapq.heapify(ev)
    idx, gen, ctx = [0] * n, [0] * n, [p.prompt_tokens for p in progs]
    prev = [0] * n                       # context + generated tokens of the previous call (all in KV)
    waiting, running, groups = [], [], set()
    first, end = [math.nan] * n, [math.nan] * n
    hits, hit_tok, prompt_tok, calls = [], 0, 0, 0
    busy = False
    state = {"P": 0, "PC": 0}

    def admit_and_iterate(now):
        nonlocal busy
        P = PC = 0
        for i in waiting:
            p, total = progs[i], ctx[i] + gen[i]
            s = p.shared_prefix_tokens
            ph = s if (s > 0 and p.prefix_group in groups) else 0
            if s > 0:
                groups.add(p.prefix_group)
            cached = prev[i] - s if idx[i] > 0 else 0
            hits.append((ph + cached, total))
            P += total - ph - cached
            PC += (total - ph - cached) * total
            running.append(i)
        waiting.clear()
        if not running:
            busy = False
            return
        T = sum(ctx[i] + gen[i] for i in running)
        heapq.heappush(ev, (now + cost.a + cost.b * T + cost.p * P + cost.q * PC, next(seq), "iter_done", None))

    while ev:
        now, _, kind, i = heapq.heappop(ev)
        if kind == "submit":
            waiting.append(i)
            if not busy:
                busy = True
                heapq.heappush(ev, (now, next(seq), "wake", None))
        elif kind == "wake":
            admit_and_iterate(now)
        else:
            for j in list(running):
                gen[j] += 1
                st = progs[j].steps[idx[j]]
                if gen[j] >= st.decode_tokens:
                    running.remove(j)
                    calls += 1
                    if math.isnan(first[j]):
                        first[j] = now - progs[j].arrival_s
                    prev[j] = ctx[j] + gen[j]
                    idx[j] += 1
                    if idx[j] == len(progs[j].steps):
                        end[j] = now
                    else:
                        ctx[j], gen[j] = ctx[j] + gen[j] + st.obs_tokens, 0
                        heapq.heappush(ev, (max(now, progs[j].env_prep_s + progs[j].arrival_s) + st.tool_s,
                                            next(seq), "submit", j))
            admit_and_iterate(now)
    return dict(first=first, end=end, hits=hits, calls=calls)


def _random_programs(rng, n, t_arrive=8.0, groups=("g", "h")):
    out = []
    for i in range(n):
        prompt = int(rng.integers(8, 40))
        steps = tuple(Step(int(rng.integers(1, 9)), float(rng.uniform(0.3, 4.0)), int(rng.integers(0, 12)))
                      for _ in range(int(rng.integers(1, 4))))
        out.append(Program(f"p{i}", prompt, steps, arrival_s=float(rng.uniform(0, t_arrive)),
                           shared_prefix_tokens=int(rng.integers(0, prompt // 2 + 1)),
                           prefix_group=groups[int(rng.integers(len(groups)))]))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_matches_per_iteration_reference_with_ample_memory(seed):
    rng = np.random.default_rng(seed)
    progs = _random_programs(rng, 5)
    # prefix groups hold one prompt length per group in the workload format's spirit: same s per group
    s_of = {}
    progs = [Program(p.id, p.prompt_tokens, p.steps, p.arrival_s,
                     s_of.setdefault(p.prefix_group, min(p.shared_prefix_tokens, 4)), p.prefix_group) for p in progs]
    ref = ref_ample(progs, COST)
    sc = SchedConfig(max_chunk_iters=3 + seed)   # chunks of several sizes; must not change the timeline
    for pol in ("vllm", "continuum", "thunderagent"):
        r = simulate(Workload(progs, Cluster(1, 10**6, 16)), pol, COST, sc)
        assert r["calls"] == ref["calls"] == sum(len(p.steps) for p in progs)
        assert r["makespan_s"] == pytest.approx(max(ref["end"]), rel=1e-9)
        assert [x[1] for x in r["ttfr_by_prompt"]] == pytest.approx(ref["first"], rel=1e-9)
        assert [x[0] for x in r["ttfr_by_prompt"]] == [p.prompt_tokens for p in progs]
        ttfr = np.array(ref["first"])
        assert r["ttfr_p50_s"] == pytest.approx(float(np.median(ttfr)), rel=1e-9)
        assert r["ttfr_p95_s"] == pytest.approx(float(np.percentile(ttfr, 95)), rel=1e-9)
        assert r["ttfr_max_s"] == pytest.approx(float(ttfr.max()), rel=1e-9)
        assert r["kv_hit_rate"] == pytest.approx(np.mean([h / t for h, t in ref["hits"]]), rel=1e-9)
        assert r["kv_hit_rate_token_weighted"] == pytest.approx(sum(h for h, _ in ref["hits"])
                                                                / sum(t for _, t in ref["hits"]), rel=1e-9)
        assert r["recomputed_tokens"] == 0 and r["preemptions"] == 0 and r["kv_reuse_rate"] == 1.0
        assert r["steps_per_min"] == pytest.approx(ref["calls"] * 60 / max(ref["end"]), rel=1e-9)
        # environments: vllm/continuum keep each from arrival to the end of the run; thunderagent frees at end
        want_env = (sum(e - p.arrival_s for e, p in zip(ref["end"], progs)) if pol == "thunderagent"
                    else sum(max(ref["end"]) - p.arrival_s for p in progs))
        assert r["env_seconds"] == pytest.approx(want_env, rel=1e-9)


# ------------------------------------------------------------------------------------ memory pressure
class Checked(Simulator):
    """The simulator with invariants asserted after every engine operation."""

    times: list

    def _advance_clock(self, t):
        assert t >= self.now - 1e-12                       # time is monotone
        super()._advance_clock(t)
        self.__dict__.setdefault("times", []).append(self.now)

    def start_chunk(self, b):
        super().start_chunk(b)
        self._check(b)

    def on_chunk_done(self, bidx, k, ver):
        super().on_chunk_done(bidx, k, ver)
        self._check(self.B[bidx])

    def _check(self, b):
        assert b.used() <= b.cap, (b.used(), b.cap)      # KV usage never exceeds capacity
        assert all(v >= 0 for v in b.cache.values())
        for r in b.running:                              # running private KV = context + generated − prefix
            p = self.P[r.pid]
            assert r.priv == p.ctx + p.gen - p.prog.shared_prefix_tokens
        assert len({r.pid for r in b.running}) == len(b.running)
        assert not set(b.waiting) & {r.pid for r in b.running}


def test_preemption_and_eviction_by_hand():
    """cap 30, two programs of prompt 10 decoding 8 (one call each), both at t=0.

    t=0     both admitted (need 11 each), used 20. k = min(8, free 10 // 2 = 5) = 5:
            0.1·20 + 0.001·200 + 5·0.5 + 0.01·(5·20 + 2·10) = 2 + 0.2 + 2.5 + 1.2 = 5.9
    t=5.9   used 30, free 0 < 2: nothing evictable → preempt p1 (admitted last): its 15 tokens become a
            cache entry; still free 0 < 1 → that entry is trimmed away (LRU). p0 alone, t0 = 15, k = 3:
            1.5 + 0.01·(45 + 3) = 1.98 → 7.88, p0 done (18 tokens cached).
    t=7.88  p1 needs 15 + 1, free 12: trim p0's entry to 14; 15 tokens recomputed, k = free 1 // 1 = 1:
            0.1·15 + 0.001·225 + 0.5 + 0.01·15 = 2.375 → 10.255; then p0's entry trimmed to 0, k = 2:
            1.0 + 0.01·(32 + 1) = 1.33 → 11.585.
    """
    progs = [Program("a", 10, (Step(8),)), Program("b", 10, (Step(8),))]
    for pol in ("vllm", "continuum"):
        sim = Checked(Workload(progs, Cluster(1, 30, 16)), pol, COST, SchedConfig(), trace=True)
        r = sim.run()
        ops = [op if op[0] != "decode" else op[:4] + (round(op[4], 9),) for op in sim.trace]
        assert ops == [("admit", 0, 0, 0, 0, 10), ("admit", 0, 1, 0, 0, 10), ("decode", 0, [0, 1], 5, 5.9),
                       ("preempt", 0, 1, 15), ("trim", 0, 1, 0), ("decode", 0, [0], 3, 1.98),
                       ("trim", 0, 0, 14), ("admit", 0, 1, 0, 0, 15), ("decode", 0, [1], 1, 2.375),
                       ("trim", 0, 0, 0), ("decode", 0, [1], 2, 1.33)]
        assert r["preemptions"] == 1 and r["recomputed_tokens"] == 15
        assert r["makespan_s"] == pytest.approx(11.585, abs=1e-12)
        assert r["ttfr_by_prompt"] == [[10, pytest.approx(7.88)], [10, pytest.approx(11.585)]]
        assert r["kv_hit_rate"] == 0.0 and r["kv_reuse_rate"] == 0.0 and r["calls"] == 2
        assert sim.times == sorted(sim.times)


def test_recompute_counted_when_own_cache_was_evicted():
    """p0 (2 calls) loses part of its cached private KV to p1 during its tool call → recomputed at call 1.

    cap 40. p0: prompt 10, decode 2, tool 5 s, obs 3; then decode 1. p1 arrives at 1.0: prompt 20, decode 4.
    After p0's call 0 its 12 tokens are cached. p1 needs 21 (free 40 − 12 = 28) fine, then decodes 4 → 24.
    At t≈5 (p0 back, total 15): need 3 + 1 = 4 with free 40 − 24 − 12 = 4 → no eviction, hit 12/15.
    With cap 36 instead, free is 0 and 4 tokens of p0's own entry cannot be evicted for itself (it is kept),
    while p1's finished entry (24) is evictable → still a full hit. Private-cache loss is forced with cap 33
    and p1 running long: see the invariant test below for the general case.
    """
    progs = [Program("a", 10, (Step(2, 5.0, 3), Step(1))), Program("b", 20, (Step(4),), arrival_s=1.0)]
    r, trace = simulate(Workload(progs, Cluster(1, 40, 16)), "vllm", COST, trace=True)
    admits = [op for op in trace if op[0] == "admit"]
    assert admits == [("admit", 0, 0, 0, 0, 10), ("admit", 0, 1, 0, 0, 20), ("admit", 0, 0, 12, 0, 15)]
    assert r["kv_hit_rate"] == pytest.approx((0 + 0 + 12 / 15) / 3)
    # p1 long enough to still run at t≈5 with a small pool: p0's entry is trimmed from its tail while p1 decodes
    progs = [Program("a", 10, (Step(2, 5.0, 3), Step(1))), Program("b", 20, (Step(15),), arrival_s=1.0)]
    sim = Checked(Workload(progs, Cluster(1, 40, 16)), "vllm", COST, SchedConfig(), trace=True)
    r = sim.run()
    adm = [op for op in sim.trace if op[0] == "admit" and op[2] == 0]
    cached = adm[-1][3]
    assert cached == 0                                   # p1's decode trimmed p0's whole entry (12 tokens)
    assert r["recomputed_tokens"] == 12 and r["kv_reuse_rate"] == 0.0   # all computed and missing: recomputed
    assert r["calls"] == 3
    # a call that outgrows the whole pool (20 + 30 > 40) can never be served: an error, not a silent summary
    progs = [Program("a", 10, (Step(2, 5.0, 3), Step(1))), Program("b", 20, (Step(30),), arrival_s=1.0)]
    with pytest.raises(RuntimeError, match=r"stalled with 2 unfinished programs \(first: 'a'\)"):
        simulate(Workload(progs, Cluster(1, 40, 16)), "vllm", COST)


@pytest.mark.parametrize("pol", ["vllm", "continuum", "thunderagent"])
@pytest.mark.parametrize("seed", [0, 1])
def test_invariants_under_pressure(pol, seed):
    rng = np.random.default_rng(10 + seed)
    progs = _random_programs(rng, 8, t_arrive=3.0, groups=("g",))
    progs = [Program(p.id, p.prompt_tokens, p.steps, p.arrival_s, 4, "g", float(rng.uniform(0, 2))) for p in progs]
    cap = 160 if pol == "thunderagent" else 70
    sim = Checked(Workload(progs, Cluster(2, cap, 16)), pol, COST, SchedConfig(tick_s=1.5, ttl_s=2.0),
                  seed=seed, trace=True)
    r = sim.run()
    assert r["calls"] == sum(len(p.steps) for p in progs)           # every request finishes, once
    assert all(p.phase == "done" and p.idx == len(p.prog.steps) for p in sim.P)
    assert all(not math.isnan(p.end) and p.end <= r["makespan_s"] for p in sim.P)
    assert len(sim.stats["hit_rates"]) == r["calls"]                # one hit record per call
    assert all(0.0 <= h <= 1.0 for h in sim.stats["hit_rates"])     # cache hits never exceed the prompt
    assert sim.stats["hit_tokens"] <= sim.stats["prompt_tokens"]
    decoded = sum(op[3] * len(op[2]) for op in sim.trace if op[0] == "decode")
    assert decoded >= sum(s.decode_tokens for p in progs for s in p.steps)
    assert sim.times == sorted(sim.times)
    assert r["preemptions"] == sum(op[0] == "preempt" for op in sim.trace)
    assert 0.0 <= r["memory_imbalance"] <= 1.0 and r["peak_live_envs"] <= len(progs)
    assert all(v == 0 for b in sim.B for v in b.prefix_users.values())   # no running user of a prefix left
    if pol != "thunderagent":
        assert r["preemptions"] > 0                                  # the scenario is under pressure


# ------------------------------------------------------------------------------------ scheduler decisions
def _sim(n_prog=4, backends=2, cap=1000, policy="thunderagent", **sc):
    progs = [Program(f"p{i}", 10 * (i + 1), (Step(5, 1.0, 2), Step(3)), shared_prefix_tokens=4, prefix_group="g")
             for i in range(n_prog)]
    return Simulator(Workload(progs, Cluster(backends, cap, 16)), policy, COST, SchedConfig(**sc), seed=3)


def test_policy_name_checked():
    with pytest.raises(ValueError, match=r"policy: unknown policy 'sglang' \(vllm, continuum, thunderagent\)"):
        _sim(policy="sglang")


def test_evictable_and_evict_lru_tail_trimming():
    sim = _sim(policy="continuum")
    sim.now = 10.0
    b = sim.B[0]
    b.cache.update([(0, 5), (("g", "sys"), 4), (1, 0), (2, 3), (3, 7), (4, 6)])
    b.prefix_users["sys"] = 1
    b.pinned_until.update({2: 10.5, 3: 9.0, 4: 10.0})      # 2 pinned; 3 expired; 4 expires exactly now
    assert sim._evictable(b, {0}) == [3, 4]
    b.prefix_users["sys"] = 0
    assert sim._evictable(b, set()) == [0, ("g", "sys"), 3, 4]
    sim.trace = []
    assert sim._evict(b, 11, {("g", "sys")}) == 11                  # 0 (5) deleted, 3 trimmed 7 → 1
    assert list(b.cache.items()) == [(("g", "sys"), 4), (1, 0), (2, 3), (3, 1), (4, 6)]
    assert sim.trace == [("trim", 0, 0, 0), ("trim", 0, 3, 1)]
    assert 3 in b.pinned_until                                       # a trimmed (not deleted) entry keeps its pin
    assert sim._evict(b, 100, set()) == 11                           # all that is evictable: 4 + 1 + 6
    assert list(b.cache.items()) == [(1, 0), (2, 3)] and set(b.pinned_until) == {2}
    assert sim._evict(b, 0, set()) == 0 and b.used() == 3


def test_waiting_order():
    sim = _sim(n_prog=4, policy="continuum")
    for i, t in ((2, 5.0), (0, 1.0), (3, 1.0), (1, 0.5)):     # program-level FCFS: by start time, ties by index
        sim.P[i].started_at = t
    b = sim.B[0]
    b.waiting[:] = [2, 3, 0, 1]
    assert sim._waiting_order(b) == [1, 0, 3, 2]
    sim.policy = "vllm"
    assert sim._waiting_order(b) == [2, 3, 0, 1]


def test_router_fewest_programs_and_memory_imbalance():
    """Two backends, the hand-timeline program alone: backend 1 stays empty, so the imbalance is backend 0's
    used fraction: 10/100 over [0, 2.93], 13/100 (cache) over the tool [2.93, 4.93], 18/100 over [4.93, 6.89]."""
    prog = Program("x", 10, (Step(3, 2.0, 5), Step(2)))
    r = simulate(Workload([prog], Cluster(2, 100, 16)), "vllm", COST)
    area = 0.10 * 2.93 + 0.13 * 2.0 + 0.18 * 1.96
    assert r["memory_imbalance"] == pytest.approx(area / 6.89, rel=1e-12)
    # router: fewest programs, ties to the lower index; a finished program no longer counts
    progs = [Program(f"p{i}", 10, (Step(1),), arrival_s=t) for i, t in enumerate([0.0, 0.1, 0.2, 30.0])]
    sim = Simulator(Workload(progs, Cluster(2, 100, 16)), "vllm", COST)
    sim.run()
    assert [p.backend for p in sim.P] == [0, 1, 0, 0]
    assert sim.pol.members == [{}, {}] and sim.pol.progs == {}


def test_continuum_pin_blocks_eviction_and_wakes_at_expiry():
    """cap 30. A: prompt 10, call 0 decodes 2 then a 10 s tool (1 obs token), call 1 decodes 1. B arrives at
    1.0 with prompt 20 and decodes 2. B does not fit while A runs; A finishes call 0 at 1.7 + 0.61 = 2.31.
    vllm: B evicts A's cached 12 down to 9 and runs; A comes back at 12.31 to an empty entry (B's decode
    trimmed the rest) and recomputes 12. continuum: A's entry is pinned until 2.31 + 15 s TTL... with ttl 12 s
    → 14.31; B waits; A returns at 12.31, is first in program-level FCFS, hits 12 of 13, no recompute."""
    progs = [Program("A", 10, (Step(2, 10.0, 1), Step(1))), Program("B", 20, (Step(2),), arrival_s=1.0)]
    wl = Workload(progs, Cluster(1, 30, 16))
    v, vt = simulate(wl, "vllm", COST, trace=True)
    assert ("trim", 0, 0, 9) in vt and vt.index(("trim", 0, 0, 9)) < vt.index(("admit", 0, 1, 0, 0, 20))
    assert v["recomputed_tokens"] == 12 and v["ttfr_by_prompt"][1][1] == pytest.approx(6.12 - 1.0)
    c, ct = simulate(wl, "continuum", COST, SchedConfig(ttl_s=12.0), trace=True)
    assert not any(op[0] == "trim" and op[2] == 0 for op in ct[:ct.index(("admit", 0, 0, 12, 0, 13))])
    admits = [op for op in ct if op[0] == "admit"]
    assert admits[1:] == [("admit", 0, 0, 12, 0, 13), ("admit", 0, 1, 0, 0, 20)]
    assert c["recomputed_tokens"] == 0 and c["preemptions"] == 0
    # A: 12.31 + (0.1 + 0.013 + 0.5 + 0.13) = 13.053; B then runs 2.4 + 0.5 + 0.2 = 3.1 (k = 1, free 1) ...
    assert c["ttfr_by_prompt"][0][1] == pytest.approx(2.31)
    assert c["ttfr_by_prompt"][1][1] > 13.053 - 1.0
    # a pin that expires while B waits and nothing else is pending: the engine wakes itself at the expiry
    progs = [Program("A", 10, (Step(2, 10.0, 1), Step(1))), Program("B", 20, (Step(2),), arrival_s=1.0)]
    c2, ct2 = simulate(Workload(progs, Cluster(1, 30, 16)), "continuum", COST, SchedConfig(ttl_s=4.0), trace=True)
    i = ct2.index(("admit", 0, 1, 0, 0, 20))
    assert ("trim", 0, 0, 9) in ct2[:i]                              # evicted only after the pin (6.31) expired
    dec = [op for op in ct2 if op[0] == "decode"]
    assert c2["ttfr_by_prompt"][1][1] == pytest.approx(6.31 + 3.1 + 0.71 - 1.0, abs=1e-6)
    assert len(dec) >= 4


def test_run_ticks_every_tick_s_until_done():
    class Count(Simulator):
        def on_tick(self):
            self.__dict__.setdefault("ticks", []).append(self.now)
            super().on_tick()

    prog = Program("x", 10, (Step(3, 2.0, 5), Step(2)))
    sim = Count(Workload([prog], Cluster(1, 10**5, 16)), "thunderagent", COST, SchedConfig(tick_s=1.5))
    r = sim.run()
    assert sim.ticks == pytest.approx([1.5, 3.0, 4.5, 6.0])          # ticks cut chunks, not the timeline
    assert r["makespan_s"] == pytest.approx(6.89, abs=1e-9)
    v = Count(Workload([prog], Cluster(1, 10**5, 16)), "vllm", COST)
    v.run()
    assert "ticks" not in v.__dict__


def test_degenerate_zero_cost_and_one_token_prefix():
    # a free engine: everything happens at t = 0; rates that divide by the makespan are 0, not an error
    progs = [Program("a", 3, (Step(2),)), Program("b", 4, (Step(1),))]
    r = simulate(Workload(progs, Cluster(2, 100, 16)), "vllm", CostModel(0.0, 0.0, 0.0, 0.0))
    assert r["makespan_s"] == 0.0 and r["steps_per_min"] == 0.0 and r["memory_imbalance"] == 0.0
    assert r["calls"] == 2 and r["ttfr_max_s"] == 0.0
    # two one-token prompts that are entirely a shared prefix: the second finds it cached
    progs = [Program("a", 1, (Step(1),), shared_prefix_tokens=1, prefix_group="g"),
             Program("b", 1, (Step(1),), shared_prefix_tokens=1, prefix_group="g")]
    r = simulate(Workload(progs, Cluster(1, 100, 16)), "vllm", COST)
    assert r["kv_hit_rate_token_weighted"] == 0.5 and r["kv_reuse_rate"] == 1.0 and r["kv_hit_rate"] == 0.5
    # prefill: 1 token at context 1; k = 1: 0.1 + 0.001 + 0.5 + 0.01·2 = 0.621
    assert r["makespan_s"] == pytest.approx(0.621, abs=1e-12)


def test_admission_at_exact_capacity_and_batch_limit():
    """cap 22: p0 (prompt 10, 1 token) ends at 0.1·10 + 0.001·100 + 0.5 + 0.01·10 = 1.7 leaving 11 cached;
    p1 (prompt 21) arrives at 1.0 and needs 22 = free 11 + evictable 11: admitted after evicting all of p0;
    then free = 1 = n: decodes without preemption (k = 1: 2.1 + 0.441 + 0.5 + 0.21 = 3.251)."""
    progs = [Program("a", 10, (Step(1),)), Program("b", 21, (Step(1),), arrival_s=1.0)]
    r, tr = simulate(Workload(progs, Cluster(1, 22, 16)), "vllm", COST, trace=True)
    assert tr[2:5] == [("trim", 0, 0, 0), ("admit", 0, 1, 0, 0, 21), ("decode", 0, [1], 1, pytest.approx(3.251))]
    assert r["preemptions"] == 0 and r["makespan_s"] == pytest.approx(1.7 + 3.251)
    # max_num_seqs = 2: the third program waits for a free slot even with ample memory
    progs = [Program(f"p{i}", 10, (Step(2 + i),)) for i in range(3)]
    r, tr = simulate(Workload(progs, Cluster(1, 10**4, 16)), "vllm", COST, SchedConfig(max_num_seqs=2), trace=True)
    assert [op[0] for op in tr][:4] == ["admit", "admit", "decode", "admit"]
    assert tr[2][2] == [0, 1] and tr[2][3] == 2 and tr[3][2] == 2


def test_preempted_request_goes_to_the_front_and_decode_eviction_size():
    # three programs of prompt 10 decoding 8, cap 30: p2 waits; p1 is preempted at 5.9 and re-enters first
    progs = [Program(f"p{i}", 10, (Step(8),)) for i in range(3)]
    r, tr = simulate(Workload(progs, Cluster(1, 30, 16)), "vllm", COST, trace=True)
    after = [op[2] for op in tr[tr.index(("preempt", 0, 1, 15)):] if op[0] == "admit"]
    assert after[:2] == [1, 2] and r["calls"] == 3
    # a decode that runs out of KV trims n·16 − free tokens from the LRU cache: p0 leaves 51 cached;
    # p1 (20) and p2 (26) are admitted (free 100 − 51 − 46 = 3), one iteration leaves free 1 < n = 2:
    # trim 2·16 − 1 = 31 → p0's entry 51 → 20
    progs = [Program("a", 50, (Step(1),)), Program("b", 20, (Step(10),), arrival_s=10.0),
             Program("c", 26, (Step(10),), arrival_s=10.0)]
    r, tr = simulate(Workload(progs, Cluster(1, 100, 16)), "vllm", COST, trace=True)
    trims = [op for op in tr if op[0] == "trim"]
    assert trims[0] == ("trim", 0, 0, 20) and r["preemptions"] == 0 and r["calls"] == 3


def test_run_event_budget_is_exact():
    # vllm hand timeline: arrive, wake, chunk_done, tool_done, wake, chunk_done = 6 events
    prog = Program("x", 10, (Step(3, 2.0, 5), Step(2)))
    Simulator(Workload([prog], Cluster(1, 10**5, 16)), "vllm", COST).run(max_events=6)
    with pytest.raises(SimulationError, match="max_events"):
        Simulator(Workload([prog], Cluster(1, 10**5, 16)), "vllm", COST).run(max_events=5)


def test_defaults_seed_zero_and_no_trace():
    from stages.thunderagent.workload import generate

    wl = _sim().wl
    s = Simulator(wl, "thunderagent", COST, SchedConfig(victim_order="random"))
    assert s.trace is None and s.inputs is None and s.pol.log is None
    assert s.pol.rng.random() == __import__("random").Random(0).random()
    # random victims under overload: the default seed is seed 0, and another seed changes the run
    wl = generate(12, 1, steps=(4, 5), cluster=Cluster(1, 30000, 16))
    sc = SchedConfig(victim_order="random")
    d = simulate(wl, "thunderagent", sched=sc)
    assert d == simulate(wl, "thunderagent", sched=sc, seed=0) and d["pauses"] > 0
    assert d != simulate(wl, "thunderagent", sched=sc, seed=5)


def test_prefix_entry_is_lru_and_named_for_the_engine():
    """cap 30. A (prompt 10, shared prefix 4 of group "a") finishes at 1.7 leaving the prefix entry (4, older)
    and its private entry (7). B (prompt 20) arrives at 2.0 and needs 21 of free 19: the LRU entry, the
    prefix, is trimmed by 2. The trace names it ("g", group), the key the real engine replays."""
    progs = [Program("A", 10, (Step(1),), shared_prefix_tokens=4, prefix_group="a"),
             Program("B", 20, (Step(1),), arrival_s=2.0)]
    r, tr = simulate(Workload(progs, Cluster(1, 30, 16)), "vllm", COST, trace=True)
    assert tr[2:4] == [("trim", 0, ("g", "a"), 2), ("admit", 0, 1, 0, 0, 20)]


# ------------------------------------------------------------------------------------ the shared policy inside the simulator
def test_held_call_is_released_by_a_tick_to_the_backend_the_policy_chose():
    """cap 400 per backend, 2 backends. a (prompt 150, decodes 20 then a 30 s tool) and b (prompt 150) start on
    backends 0 and 1 (charge 250 each); c (prompt 250: charge 350 > 150 room on both) is queued at t = 0 and held.
    a finishes its last call at t_a: it is released, backend 0 empties, and the first tick after t_a resumes c there
    (New tier, BFD onto the roomiest backend), and only then is c admitted by the engine."""
    progs = [Program("a", 150, (Step(20),)), Program("b", 150, (Step(200),)), Program("c", 250, (Step(5),))]
    sim = Simulator(Workload(progs, Cluster(2, 400, 16)), "thunderagent", COST, SchedConfig(tick_s=2.0), trace=True,
                    record_inputs=True)
    r = sim.run()
    log = [(k, p, b) for _, k, p, b in sim.pol.log]
    assert log[:3] == [("start", 0, 0), ("start", 1, 1), ("queue", 2, None)]
    t_a = sim.P[0].end
    resume = next(e for e in sim.pol.log if e[1] == "resume")
    assert resume[1:] == ("resume", 2, 0) and resume[0] == pytest.approx(2.0 * math.ceil(t_a / 2.0))
    first_admit = next(i for i, op in enumerate(sim.trace) if op[0] == "admit" and op[2] == 2)
    assert sim.trace[first_admit][1] == 0 and sim.P[2].first_response > resume[0]
    # the input record: every event the policy saw, with its decision-log length after it
    kinds = [e[1] for e in sim.inputs]
    assert kinds.count("request") == 3 and kinds.count("response") == 3 and kinds.count("release") == 3
    assert all(a[4] <= b[4] for a, b in zip(sim.inputs, sim.inputs[1:])) and sim.inputs[-1][4] == len(sim.pol.log)
    assert r["calls"] == 3


def test_closed_loop_workers_window_and_horizon():
    """workers = 2 over 4 identical one-call programs on ample KV: programs 2 and 3 start when 0 and 1 finish."""
    progs = [Program(f"p{i}", 10, (Step(3),)) for i in range(4)]
    sim = Simulator(Workload(progs, Cluster(1, 10**5, 16)), "vllm", COST, workers=2, window_s=(1.0, 10.0))
    r = sim.run()
    # batch of 2: prefill 20 at context 10 + 3 iterations over t0 = 20: 2 + 0.2 + 1.5 + 0.01·(60 + 2·3) = 4.36
    assert [p.started_at for p in sim.P] == pytest.approx([0.0, 0.0, 4.36, 4.36])
    assert r["makespan_s"] == pytest.approx(8.72) and r["window_calls"] == 4 and r["window_valid"] is False
    assert r["window_steps_per_min"] == pytest.approx(4 / (9.0 / 60.0))
    assert sim.exhausted_at == pytest.approx(4.36)
    # a horizon cuts the run; a program with no reply yet counts its wait so far (censored TTFR)
    h = Simulator(Workload(progs, Cluster(1, 10**5, 16)), "vllm", COST, workers=2, window_s=(0.0, 5.0), stop_at_s=6.0)
    rh = h.run()
    assert rh["calls"] == 2 and rh["finished"] is False and rh["programs_done"] == 2
    assert rh["window_programs"] == 4 and rh["window_ttfr_censored"] == 2
    assert sorted(x[1] for x in rh["ttfr_by_prompt"]) == pytest.approx([6.0 - 4.36, 6.0 - 4.36, 4.36, 4.36])


def test_warm_start_resumes_programs_mid_trajectory():
    from stages.thunderagent.workload import generate, warm_start

    wl = generate(6, 3, steps=(4, 6), cluster=Cluster(1, 10**6, 16))
    ws = warm_start(wl, 3, 3)
    assert ws.programs[3:] == wl.programs[3:]
    moved = 0
    for a, b in zip(wl.programs[:3], ws.programs[:3]):
        j = len(a.steps) - len(b.steps)
        assert 0 <= j < len(a.steps) and b.steps == a.steps[j:] and b.prompt_tokens == a.context_before(j)
        assert b.id == (f"{a.id}~{j}" if j else a.id)
        moved += j > 0
    assert moved >= 1 and warm_start(wl, 3, 3).programs == ws.programs


def test_lazy_chunk_cut_equals_cutting_at_every_event():
    """A request arriving mid-chunk joins at the next iteration boundary: the same timeline as a simulator that
    cuts every chunk at every event (the pre-optimisation design), checked against the per-iteration reference."""
    rng = np.random.default_rng(9)
    progs = _random_programs(rng, 6, t_arrive=5.0, groups=("g",))
    progs = [Program(p.id, p.prompt_tokens, p.steps, p.arrival_s, 0, "g") for p in progs]
    ref = ref_ample(progs, COST)
    for pol in ("vllm", "thunderagent"):
        r = simulate(Workload(progs, Cluster(1, 10**6, 16)), pol, COST, SchedConfig(tick_s=0.7, max_chunk_iters=50))
        assert [x[1] for x in r["ttfr_by_prompt"]] == pytest.approx(ref["first"], rel=1e-9)
        assert r["makespan_s"] == pytest.approx(max(ref["end"]), rel=1e-9)
