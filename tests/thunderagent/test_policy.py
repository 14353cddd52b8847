"""policy.py (the one scheduler the simulator and the proxy share): hand-worked decisions, event by event."""
from __future__ import annotations

import random

import pytest

from stages.thunderagent.policy import (PROGRAM_OVERHEAD, DefaultRouter, PolicyConfig, Stats, ThunderPolicy, charge, fits,
                                        make_policy)


def _kinds(pol, since=0):
    return [(k, p, b) for _, k, p, b in pol.log[since:]]


def _active(pol, pid, b, tokens, status="acting"):
    p = pol._new(pid, 0.0)
    p.steps, p.tokens, p.status = 2, float(tokens), status
    pol._register(p, b)
    return p


def _paused(pol, pid, tokens, origin=None, waiting=False, steps=2, status="acting", since=0.0):
    p = pol._new(pid, since)
    p.steps, p.tokens, p.status, p.origin, p.waiting, p.wait_since = steps, float(tokens), status, origin, waiting, since
    p.started = origin is not None or steps > 1
    pol._enter_pool(p)
    return p


def test_capacity_rule_is_context_plus_reserve():
    assert PROGRAM_OVERHEAD == 100 and charge(250) == 350
    assert fits(900, 1000) and not fits(901, 1000)        # the tight case: exactly C − 100 fits
    pol = ThunderPolicy([1000])
    assert pol.on_request("a", 900, 0.0) == 0             # an empty backend takes exactly C − 100
    assert pol.used(0) == 1000 and pol.remaining(0) == 0
    pol2 = ThunderPolicy([1000])
    assert pol2.on_request("a", 901, 0.0) is None and _kinds(pol2) == [("queue", "a", None)]


def test_arrivals_place_on_least_active_backend_and_queue_behind_the_pool():
    pol = ThunderPolicy([500, 500])
    assert [pol.on_request(p, c, 0.0) for p, c in (("p1", 100), ("p2", 150), ("p3", 200), ("p4", 250), ("p5", 10))] \
        == [0, 1, 0, None, None]
    # p3: backend 0 has 500 − 200 = 300 room ≥ 300, backend 1 only 250; p4 fits nowhere; p5 would fit on
    # backend 1 (110 ≤ 250) but the pool is not empty: nobody overtakes it (official fairness rule)
    assert _kinds(pol) == [("start", "p1", 0), ("start", "p2", 1), ("start", "p3", 0), ("queue", "p4", None),
                           ("queue", "p5", None)]
    assert pol.stats.queued == 2 and pol.state_counts()["queued_new"] == 2


def test_pause_shortest_acting_first_then_resume_the_new_program():
    pol = ThunderPolicy([1000])
    for pid, c in (("a", 100), ("b", 150), ("c", 300)):
        assert pol.on_request(pid, c, 0.0) == 0
    for pid, c in (("a", 150), ("b", 200), ("c", 350)):
        pol.on_response(pid, c, 1.0)
    assert pol.used(0) == 150 + 200 + 350 + 300 == 1000
    assert pol.on_request("d", 80, 2.0) is None                     # 180 > 0 room: queued
    assert pol.on_request("c", 400, 3.0) == 0                        # c grows: used 1050, over by 50
    assert pol.tick(5.0) == []                                       # no room to resume; pause a (150 + 100 ≥ 50)
    assert _kinds(pol)[-1] == ("pause", "a", 0) and pol.progs["a"].paused and pol.progs["a"].origin == 0
    assert pol.on_request("a", 160, 6.0) is None and _kinds(pol)[-1] == ("hold", "a", None)
    # room 1000 − (200 + 400 + 200) = 200: the held Reasoning call a needs 260 (skipped), the new d 180 fits
    assert pol.tick(10.0) == [("d", 0)]
    assert _kinds(pol)[-1] == ("resume", "d", 0) and pol.progs["a"].paused and pol.progs["a"].waiting
    assert pol.used(0) == 200 + 400 + 80 + 300 == 980


@pytest.mark.parametrize("official", [False, True])
def test_reasoning_programs_are_marked_and_pause_when_their_reply_ends(official):
    pol = ThunderPolicy([600], PolicyConfig(marks_lower_capacity=not official))
    _active(pol, "x", 0, 250, status="reasoning")
    _active(pol, "y", 0, 200, status="reasoning")                    # 250 + 200 + 200 = 650 > 600
    pol.tick(5.0)
    marked = [p for p, q in pol.progs.items() if q.marked]
    # paper's algorithm: marking y (200 + 100 ≥ 50) is enough; official as read: the mark does not lower the
    # capacity sum, so every Reasoning program gets marked
    assert marked == (["x", "y"] if official else ["y"])
    assert pol.used(0) == (650 if official else 350)
    pol.on_response("y", 260, 6.0)
    assert _kinds(pol)[-1] == ("pause_marked", "y", 0) and pol.progs["y"].paused and not pol.progs["y"].marked


def test_resume_tiers_skip_and_best_fit_after_an_evacuation():
    pol = ThunderPolicy([400, 400])
    assert pol.on_request("z", 200, 0.0) == 0
    assert pol.on_request("p", 100, 0.0) == 1                        # backend 0 has 100 < 200 room
    assert pol.on_request("r", 20, 0.0) == 1
    pol.on_response("p", 150, 1.0)
    pol.on_response("r", 30, 1.0)
    assert pol.on_request("r", 40, 1.0) == 1 and _kinds(pol)[-1] == ("forward", "r", 1)
    pol.on_response("r", 50, 1.5)
    pol.set_healthy(1, False, 2.0)                                   # its programs lose their KV: back to the pool
    assert _kinds(pol)[-2:] == [("evacuate", "p", 1), ("evacuate", "r", 1)] and pol.stats.evacuated == 2
    pol.set_healthy(1, True, 2.5)
    assert pol.on_request("p", 150, 2.5) is None                     # held Reasoning call (step 2)
    assert pol.on_request("q", 50, 2.5) is None                      # new, queued
    # backend 0 has 100 left (not > 100): only backend 1 (400) counts. Reasoning p 250 (acc 250), New q 150
    # (acc 400), Acting r 150 (550 > 400: skipped). BFD: p then q onto backend 1 (150 left, then 0)
    assert pol.tick(3.0) == [("p", 1), ("q", 1)]
    assert _kinds(pol)[-2:] == [("resume", "p", 1), ("resume", "q", 1)] and pol.progs["r"].paused
    assert pol.stats.migrations == 0                                 # evacuated programs have no origin left


@pytest.mark.parametrize("affinity", [False, True])
def test_best_fit_decreasing_onto_the_roomiest_backend_or_kv_affinity(affinity):
    pol = ThunderPolicy([1000, 1000], PolicyConfig(kv_affinity=affinity))
    _active(pol, "u", 0, 350)                                        # backend 0: room 550; backend 1: 1000
    _paused(pol, "a", 150, origin=0)
    _paused(pol, "b", 400, origin=1)
    pol.tick(5.0)
    # largest first: b (500) → backend 1 (room 1000 → 500); a (250): roomiest is backend 0 (550 > 500)
    assert pol.progs["b"].backend == 1 and pol.progs["a"].backend == 0 and pol.stats.migrations == 0
    pol2 = ThunderPolicy([1000, 1000], PolicyConfig(kv_affinity=affinity))
    _active(pol2, "u", 0, 350)
    _paused(pol2, "a", 150, origin=0)
    pol2.tick(5.0)
    # official BFD: a onto the roomiest backend 1 (a migration); with affinity: back onto its own backend 0
    assert pol2.progs["a"].backend == (0 if affinity else 1) and pol2.stats.migrations == (0 if affinity else 1)


def test_forced_resume_after_the_bound_onto_origin_or_fewest_programs():
    pol = ThunderPolicy([300, 300], PolicyConfig(forced_resume_s=30.0))
    _active(pol, "big0", 0, 150)                                     # room 50 each: no resume, no pause
    _active(pol, "big1", 1, 50)
    _active(pol, "big1b", 1, -100)                                   # backend 1 holds 2 programs
    _paused(pol, "held", 180, origin=1, waiting=True, status="reasoning", since=0.0)
    _paused(pol, "fresh", 180, origin=None, waiting=True, steps=1, status="reasoning", since=0.0)
    assert pol.tick(29.0) == [] and pol.stats.forced == 0
    # at 30 s both are forced regardless of capacity: the paused one to its origin, the new one to the backend
    # with the fewest programs (backend 0 has 1, backend 1 has 3 after "held" returns)
    assert pol.tick(30.0) == [("held", 1), ("fresh", 0)] and pol.stats.forced == 2
    assert [e for e in _kinds(pol) if e[0] == "forced"] == [("forced", "held", 1), ("forced", "fresh", 0)]


def test_starvation_fix_reserves_room_and_never_skips_the_oldest_new_program():
    cfg = PolicyConfig(aging_half_life_s=60.0, no_skip_after_s=120.0)
    pol = ThunderPolicy([1000], cfg)
    _active(pol, "a", 0, 300)
    _active(pol, "b", 0, 100)
    _active(pol, "c", 0, 200, status="reasoning")                    # used 600 + 300 = 900
    assert pol.on_request("X", 500, 0.0) is None                     # needs 600 > 100 room
    assert pol.on_request("s", 10, 5.0) is None                      # behind the pool
    pol.tick(60.0)                                                   # room 100: nothing; X not starving yet
    assert not any(q.paused for q in (pol.progs["a"], pol.progs["b"]))
    pol.tick(125.0)   # X waited 125 ≥ 120 s: nobody else is admitted; room is made for it: pause b (200), a (400)
    assert _kinds(pol)[-2:] == [("pause", "b", 0), ("pause", "a", 0)] and pol.progs["X"].paused
    assert pol.tick(130.0)[0] == ("X", 0)                            # room 700 ≥ 600
    # official (no fix): X waits behind the smaller program s and keeps waiting (room only 100)
    off = ThunderPolicy([1000])
    _active(off, "a", 0, 300)
    _active(off, "b", 0, 100)
    _active(off, "c", 0, 200, status="reasoning")
    off.on_request("X", 500, 0.0)
    off.tick(125.0)
    assert off.progs["X"].paused and off.stats.pauses == 0


def test_aging_key_and_new_tier_order():
    pol = ThunderPolicy([50], PolicyConfig(aging_half_life_s=4.0))
    pol.on_request("old", 40, 2.0)                                   # 140 > 50: queued
    pol.on_request("young", 30, 9.0)
    # key = c · 2^{-(now − wait_since)/h}: old 40·2^{-2} = 10, young 30·2^{-0.25} ≈ 25.2 → old first
    assert pol.new_key(pol.progs["old"], 10.0) == pytest.approx(10.0)
    assert pol.new_key(pol.progs["young"], 10.0) == pytest.approx(30 * 2 ** -0.25)
    assert [p.pid for p in pol.queued_new(10.0)] == ["old", "young"]
    assert [p.pid for p in ThunderPolicy([50]).queued_new(0.0)] == []
    off = ThunderPolicy([50])
    off.on_request("old", 40, 2.0)
    off.on_request("young", 30, 9.0)
    assert [p.pid for p in off.queued_new(10.0)] == ["young", "old"]   # official: smallest first


def test_acting_decay_only_lowers_the_resume_capacity():
    pol = ThunderPolicy([1000], PolicyConfig(acting_decay=True, decay_half_life_s=2.0, acting_weight=0.5))
    a = _active(pol, "a", 0, 400)
    a.acting_since = 3.0
    assert pol.claim(a) == 200.0 and pol.claim(a, now=7.0) == pytest.approx(200 * 2 ** -2)
    assert pol.used(0) == 300.0 and pol.used(0, now=7.0) == pytest.approx(150.0)


def test_victim_orders():
    pol = ThunderPolicy([1], PolicyConfig(victim_order="longest"))
    ps = [_active(pol, f"v{i}", 0, c) for i, c in enumerate((30, 80, 30, 50))]
    assert [p.pid for p in pol.victim_order(ps)] == ["v1", "v3", "v0", "v2"]
    short = ThunderPolicy([1])
    ps2 = [_active(short, f"v{i}", 0, c) for i, c in enumerate((30, 80, 30, 50))]
    assert [p.pid for p in short.victim_order(ps2)] == ["v0", "v2", "v3", "v1"]     # ties by creation order
    r1, r2 = (ThunderPolicy([1], PolicyConfig(victim_order="random"), seed=7) for _ in range(2))
    ps3 = [_active(r1, f"v{i}", 0, i) for i in range(6)]
    ps4 = [_active(r2, f"v{i}", 0, i) for i in range(6)]
    want = [f"v{i}" for i in range(6)]
    random.Random(7).shuffle(want)
    assert [p.pid for p in r1.victim_order(ps3)] == want == [p.pid for p in r2.victim_order(ps4)]


def test_default_router_fewest_programs_sticky_and_failover():
    r = DefaultRouter([10, 10])
    assert [r.on_request(p, 5, 0.0) for p in ("a", "b", "c")] == [0, 1, 0]
    assert r.on_request("b", 7, 1.0) == 1                            # sticky
    r.on_release("a", 2.0)
    assert r.on_request("d", 5, 2.0) == 0 and r.tick(3.0) == []
    r.set_healthy(0, False, 4.0)
    assert r.on_request("c", 9, 4.0) == 1 and _kinds(r)[-1] == ("start", "c", 1)   # its backend died: moved
    assert isinstance(make_policy("vllm", [1]), DefaultRouter) and isinstance(make_policy("thunderagent", [1]),
                                                                               ThunderPolicy)
    with pytest.raises(ValueError, match="unknown policy 'sglang'"):
        make_policy("sglang", [1])


def test_release_removes_from_pool_and_backend():
    pol = ThunderPolicy([200])
    pol.on_request("a", 50, 0.0)
    pol.on_request("b", 150, 0.0)                                    # queued (150 + 100 > 50 room)
    pol.on_release("b", 1.0)
    pol.on_release("a", 1.0)
    pol.on_release("ghost", 1.0)                                     # unknown: ignored
    assert pol.pool == {} and pol.members[0] == {} and pol.progs == {}
    assert _kinds(pol)[-2:] == [("release", "b", None), ("release", "a", None)]


# ------------------------------------------------------------------ whole decision logs, hand-worked, with times
def test_thunder_full_log_times_stats_and_states():
    """Every event of a one-backend run (C = 1000) with its time, the counters and the state census."""
    pol = ThunderPolicy([1000])
    assert pol.on_request("a", 300, 1.5) == 0 and pol.on_request("b", 200, 2.5) == 0
    pol.on_response("a", 350, 3.5)
    pol.on_response("b", 250, 4.0)
    pol.on_progress("b", 30)                                         # streamed tokens add: b = 280
    pol.on_progress("ghost", 5)                                      # unknown program: ignored
    assert pol.progs["b"].tokens == 280 and pol.backend_of("b") == 0 and pol.backend_of("ghost") is None
    # room 1000 − (350 + 100) − (280 + 100) = 170 < 500 + 100: c waits in the pool
    assert pol.on_request("c", 500, 5.0) is None and pol.backend_of("c") is None
    assert pol.state_counts() == {"reasoning": 0, "acting": 2, "paused": 0, "queued_new": 1, "marked": 0, "held": 1}
    assert pol.tick(6.0) == [] and len(pol.log) == 3                 # c does not fit; nothing is over capacity
    assert pol.on_request("a", 420, 7.0) == 0                        # a's next call: forwarded, Reasoning
    pol.on_progress("a", 200)                                        # a = 620: used 720 + 380 = 1100, over by 100
    assert pol.tick(8.0) == []                                       # pause the Acting b (380 ≥ 100), not a
    assert pol.state_counts() == {"reasoning": 1, "acting": 0, "paused": 1, "queued_new": 1, "marked": 0, "held": 1}
    assert pol.on_request("b", 300, 9.0) is None                     # b is paused: its call is held
    assert pol.state_counts()["held"] == 2 and pol.stats.holds == 1
    assert pol.on_request("b", 300, 9.25) is None and pol.stats.holds == 2      # its retry is held too
    assert pol.progs["b"].steps == 3
    pol.on_response("a", 650, 10.0)
    assert pol.tick(11.0) == []                                      # room 250: b needs 400, c 600
    pol.on_release("a", 12.0)
    # room 1000: Reasoning b (400) then New c (600) fit exactly; best fit decreasing places c (500) first
    assert pol.tick(13.0) == [("c", 0), ("b", 0)]
    assert pol.log == [(1.5, "start", "a", 0), (2.5, "start", "b", 0), (5.0, "queue", "c", None),
                       (7.0, "forward", "a", 0), (8.0, "pause", "b", 0), (9.0, "hold", "b", None),
                       (9.25, "hold", "b", None), (12.0, "release", "a", None), (13.0, "resume", "c", 0), (13.0, "resume", "b", 0)]
    assert pol.stats == Stats(starts=2, queued=1, holds=2, pauses=1, marks=0, resumes=2, forced=0, migrations=0,
                              evacuated=0)
    assert pol.state_counts() == {"reasoning": 2, "acting": 0, "paused": 0, "queued_new": 0, "marked": 0, "held": 0}
    assert [p.seq for p in pol.progs.values()] == [2, 3] and pol.progs["c"].created_at == 5.0
    assert pol.used(0) == 500 + 100 + 300 + 100 and pol.remaining(0) == 0
    assert pol.progs["b"].paused is False and pol.progs["b"].waiting is False and pol.pool == {}


def test_thunder_marks_errors_and_evacuation_logged_with_times():
    pol = ThunderPolicy([1000, 700])
    _active(pol, "r1", 0, 400, status="reasoning")
    _active(pol, "r2", 0, 300, status="reasoning")
    _active(pol, "r3", 0, 250, status="reasoning")                   # used 950 + 300 = 1250: over by 250
    assert pol.tick(4.25) == []
    # smallest Reasoning first: r3 (350) covers 250, so only r3 is marked (marks lower the capacity)
    assert pol.log == [(4.25, "mark", "r3", 0)] and pol.stats.marks == 1 and pol.used(0) == 900
    assert pol.state_counts()["marked"] == 1
    pol.on_error("r3", 5.5)                                          # its call failed: idle again, then paused
    assert pol.log[-1] == (5.5, "pause_marked", "r3", 0) and pol.progs["r3"].status == "acting"
    assert pol.progs["r3"].acting_since == 5.5 and pol.progs["r3"].marked is False and pol.progs["r3"].origin == 0
    pol.on_error("r2", 6.0)                                          # not marked: only idle again
    assert pol.progs["r2"].status == "acting" and pol.progs["r2"].acting_since == 6.0 and not pol.progs["r2"].paused
    pol.on_error("ghost", 6.0)
    pol.progs["r1"].marked = True
    pol.on_response("r1", 420, 6.5)
    assert pol.log[-1] == (6.5, "pause_marked", "r1", 0) and pol.progs["r1"].marked is False
    assert pol.stats.pauses == 2
    pol.set_healthy(0, False, 7.0)                                   # r2 loses its KV: evacuated to the pool
    assert pol.log[-1] == (7.0, "evacuate", "r2", 0) and pol.progs["r2"].paused and pol.progs["r2"].origin is None
    assert pol.progs["r2"].marked is False and pol.stats.evacuated == 1
    pol.set_healthy(0, False, 7.5)                                   # already down: nothing happens
    assert pol.stats.evacuated == 1 and len(pol.log) == 4
    # the pool in entry order: r3, r1, r2 (pool_seq 1, 2, 3). Only backend 1 is up (room 700); the snapshot by
    # (tokens at entry, seq) is r3 250, r2 300, r1 420, all Acting: r3 (350) fits, r2 (350 + 400 > 700) and r1
    # (350 + 520) are skipped
    assert [p.pool_seq for p in (pol.progs["r3"], pol.progs["r1"], pol.progs["r2"])] == [1, 2, 3]
    assert pol.tick(8.0) == []                                       # Acting programs hold no call: no release
    assert pol.log[-1] == (8.0, "resume", "r3", 1) and len(pol.log) == 5
    assert pol.stats.migrations == 1 and pol.stats.resumes == 1      # r3 came from backend 0
    assert pol.progs["r1"].paused and pol.progs["r2"].paused and pol.progs["r3"].backend == 1
    assert pol.progs["r3"].origin is None and pol.progs["r3"].paused is False and "r3" not in pol.pool


def test_default_router_full_log_and_states():
    r = DefaultRouter([10, 10])
    assert r.on_request("a", 5, 0.5) == 0 and r.on_request("b", 6, 1.5) == 1
    r.on_progress("a", 4)
    assert r.progs["a"].tokens == 9 and r.used(0) == 109 and r.used(1) == 106
    assert r.on_request("a", 7, 2.5) == 0 and r.progs["a"].steps == 2 and r.progs["a"].status == "reasoning"
    r.on_response("a", 8, 3.0)
    assert r.progs["a"].tokens == 8 and r.progs["a"].status == "acting" and r.progs["a"].acting_since == 3.0
    r.on_response("ghost", 1, 3.0)
    assert r.state_counts() == {"reasoning": 1, "acting": 1, "paused": 0, "queued_new": 0, "marked": 0, "held": 0}
    r.on_error("b", 3.5)
    assert r.progs["b"].status == "acting" and r.progs["b"].acting_since == 3.5
    r.on_error("ghost", 3.5)
    r.set_healthy(0, False, 4.0)
    assert r.healthy == [False, True]
    assert r.on_request("a", 9, 4.5) == 1 and "a" not in r.members[0] and list(r.members[1]) == ["b", "a"]
    r.on_release("b", 5.0)
    r.on_release("b", 5.5)                                           # twice: the second is ignored
    assert r.log == [(0.5, "start", "a", 0), (1.5, "start", "b", 1), (2.5, "forward", "a", 0),
                     (4.5, "start", "a", 1), (5.0, "release", "b", None)]
    assert r.stats.starts == 3 and r.backend_of("a") == 1 and r.backend_of("b") is None
    assert r.progs["a"].created_at == 0.5 and r.progs["a"].seq == 1
    r.set_healthy(1, False, 6.0)
    assert r.fewest_programs() == 0                                  # nothing healthy: backend 0
    quiet = DefaultRouter([5], log=False)
    quiet.on_request("x", 1, 0.0)
    assert quiet.log is None
    with pytest.raises(ValueError, match="^capacities: need at least one backend$"):
        DefaultRouter([])
    with pytest.raises(ValueError, match="^capacities: need at least one backend$"):
        ThunderPolicy([])
    assert ThunderPolicy([5], log=False).log is None and ThunderPolicy([5]).reserve == 0.0


def test_make_policy_passes_config_seed_and_log():
    cfg = PolicyConfig(victim_order="random", acting_weight=0.25)
    pol = make_policy("thunderagent", [3, 4], cfg, seed=11, log=False)
    assert pol.cfg is cfg and pol.cap == [3.0, 4.0] and pol.log is None
    assert ThunderPolicy([1]).rng.random() == random.Random(0).random()          # default seed 0
    assert pol.rng.random() == random.Random(11).random()
    assert make_policy("thunderagent", [1]).rng.random() == random.Random(0).random()
    for name in ("vllm", "continuum", "default"):
        r = make_policy(name, [2, 2], log=False)
        assert isinstance(r, DefaultRouter) and r.cap == [2.0, 2.0] and r.log is None
    assert make_policy("vllm", [2]).log == []


# ------------------------------------------------------------------ pause: the boundaries of "over capacity"
def test_pause_stops_exactly_when_the_backend_is_no_longer_over():
    # C = 350, Acting x 100 (200) and y 250 (350): over by 200 = x's share: x alone is paused
    pol = ThunderPolicy([350])
    _active(pol, "x", 0, 100)
    _active(pol, "y", 0, 250)
    pol.tick(1.0)
    assert _kinds(pol) == [("pause", "x", 0)] and not pol.progs["y"].paused
    # C = 349: over by 201, x leaves 1 over: y goes too
    pol = ThunderPolicy([349])
    _active(pol, "x", 0, 100)
    _active(pol, "y", 0, 250)
    pol.tick(1.0)
    assert _kinds(pol) == [("pause", "x", 0), ("pause", "y", 0)] and pol.stats.pauses == 2
    # used == C exactly: nothing to do; one token over: the smallest program goes
    pol = ThunderPolicy([450])
    _active(pol, "x", 0, 100)
    _active(pol, "y", 0, 150)
    pol.tick(1.0)
    assert pol.log == []
    pol.cap[0] = 449
    pol.tick(2.0)
    assert pol.log == [(2.0, "pause", "x", 0)]


def test_marks_stop_exactly_when_the_backend_is_no_longer_over():
    pol = ThunderPolicy([350])
    _active(pol, "x", 0, 100, status="reasoning")
    _active(pol, "y", 0, 250, status="reasoning")
    pol.tick(1.0)
    assert pol.log == [(1.0, "mark", "x", 0)] and pol.stats.marks == 1
    pol = ThunderPolicy([349])
    _active(pol, "x", 0, 100, status="reasoning")
    _active(pol, "y", 0, 250, status="reasoning")
    pol.tick(1.0)
    assert pol.log == [(1.0, "mark", "x", 0), (1.0, "mark", "y", 0)] and pol.stats.marks == 2


def test_paused_acting_programs_are_not_marked_after_them():
    # C = 200: Acting x 50 (150), Reasoning r 100 (200) and s 300 (400): over by 550. x is paused (400 left),
    # then the Reasoning ones are marked shortest first: r (200 left), s
    pol = ThunderPolicy([200])
    _active(pol, "x", 0, 50)
    _active(pol, "r", 0, 100, status="reasoning")
    _active(pol, "s", 0, 300, status="reasoning")
    pol.tick(3.0)
    assert pol.log == [(3.0, "pause", "x", 0), (3.0, "mark", "r", 0), (3.0, "mark", "s", 0)]
    assert not pol.progs["x"].marked and pol.stats.marks == 2


def test_a_held_acting_program_claims_its_whole_context():
    pol = ThunderPolicy([1000], PolicyConfig(acting_weight=0.5))
    a = _active(pol, "a", 0, 400)
    r = _active(pol, "r", 0, 300, status="reasoning")
    assert pol.claim(a) == 200.0 and pol.claim(r) == 300.0
    a.waiting = True                                                 # a call of its own is held: full claim
    assert pol.claim(a) == 400.0
    r.waiting = True
    assert pol.claim(r) == 300.0


# ------------------------------------------------------------------ resume: capacity, tiers, best fit
def _pool_of(pol, specs):
    """(pid, tokens, tier) into the pool in order; tier: reasoning (a held call) | new | acting."""
    for pid, tokens, tier in specs:
        _paused(pol, pid, tokens, origin=None, waiting=tier != "acting", steps=1 if tier == "new" else 2,
                status="acting" if tier == "acting" else "reasoning")


def test_resume_total_capacity_is_a_running_sum_over_the_tiers():
    # room 500: Reasoning r1 (300) and New n (100) fit (400); Acting a (350) would make 750: skipped.
    pol = ThunderPolicy([500])
    _pool_of(pol, [("r1", 200, "reasoning"), ("n", 0, "new"), ("a", 250, "acting")])
    assert pol.tick(1.0) == [("r1", 0), ("n", 0)]
    assert pol.progs["a"].paused and pol.stats.resumes == 2 and pol.remaining(0) == 100


def test_resume_takes_each_program_once():
    pol = ThunderPolicy([5000])
    _pool_of(pol, [("r", 100, "reasoning"), ("n", 50, "new"), ("a", 70, "acting")])
    assert pol.tick(1.0) == [("r", 0), ("n", 0)]                     # a holds no call: resumed, not released
    assert [k for _, k, _, _ in pol.log] == ["resume"] * 3 and pol.stats.resumes == 3
    assert pol.pool == {} and not any(p.paused or p.waiting for p in pol.progs.values())


def test_resume_needs_more_than_the_per_program_reserve_of_room():
    # exactly 100 left on the backend: not room for any program (not even an empty one)
    pol = ThunderPolicy([600])
    _active(pol, "u", 0, 400)
    _pool_of(pol, [("z", 0, "acting")])
    pol.tick(1.0)
    assert pol.progs["z"].paused and pol.stats.resumes == 0
    pol.cap[0] = 601                                                 # 101 left: z (charge 100) fits
    pol.tick(2.0)
    assert pol.log[-1] == (2.0, "resume", "z", 0)


def test_best_fit_decreasing_skips_what_the_roomiest_cannot_take_and_keeps_placing():
    # rooms 350 and 350 (total 700): p (400) fits no backend, q (200) does
    pol = ThunderPolicy([1000, 1000])
    _active(pol, "u0", 0, 550)
    _active(pol, "u1", 1, 550)
    _pool_of(pol, [("p", 300, "acting"), ("q", 100, "acting")])
    pol.tick(1.0)
    assert pol.progs["p"].paused and pol.progs["q"].backend == 0 and pol.log[-1] == (1.0, "resume", "q", 0)


def test_best_fit_decreasing_updates_and_resorts_the_rooms():
    # rooms: backend 0 1000, backend 1 800. q (400) onto 0 (600 left), then p (350) onto the now roomiest 1
    pol = ThunderPolicy([1000, 1000])
    _active(pol, "u1", 1, 100)
    _pool_of(pol, [("p", 250, "acting"), ("q", 300, "acting")])
    pol.tick(1.0)
    assert pol.progs["q"].backend == 0 and pol.progs["p"].backend == 1
    # rooms 1000 and 500: q (400) onto 0 (600 left), p (350) stays on 0 (600 > 500)
    pol = ThunderPolicy([1000, 1000])
    _active(pol, "u1", 1, 400)
    _pool_of(pol, [("p", 250, "acting"), ("q", 300, "acting")])
    pol.tick(1.0)
    assert pol.progs["q"].backend == 0 and pol.progs["p"].backend == 0 and pol.remaining(0) == 250


def test_a_slot_left_with_the_reserve_only_is_closed():
    # room 500: p (400) leaves exactly 100 on the backend: closed, so q (charge 100) waits for the next tick
    pol = ThunderPolicy([500])
    _pool_of(pol, [("p", 300, "acting"), ("q", 0, "acting")])
    pol.tick(1.0)
    assert pol.progs["p"].backend == 0 and pol.progs["q"].paused and pol.stats.resumes == 1


@pytest.mark.parametrize("room,own", [(250, True), (249, False)])
def test_kv_affinity_only_where_the_origin_has_the_room(room, own):
    # p needs 250; its origin backend 0 has `room` left, backend 1 has 1000
    pol = ThunderPolicy([1000, 1000], PolicyConfig(kv_affinity=True))
    _active(pol, "u", 0, 1000 - room - 100)
    _paused(pol, "p", 150, origin=0)
    pol.tick(1.0)
    assert pol.progs["p"].backend == (0 if own else 1) and pol.stats.migrations == (0 if own else 1)


def test_kv_affinity_with_the_origin_out_of_room_or_down():
    pol = ThunderPolicy([1000, 1000], PolicyConfig(kv_affinity=True))
    _active(pol, "u", 0, 900)                                        # origin backend: no room at all
    _paused(pol, "p", 150, origin=0)
    pol.tick(1.0)
    assert pol.progs["p"].backend == 1
    pol = ThunderPolicy([1000, 1000], PolicyConfig(kv_affinity=True))
    pol.healthy[0] = False                                           # origin down (not in the rooms)
    _paused(pol, "p", 150, origin=0)
    pol.tick(1.0)
    assert pol.progs["p"].backend == 1


def test_resume_room_reads_the_acting_decay_at_the_tick():
    # a (Acting 600, since t = 0) decays with half-life 1 s: at t = 3 it claims 75, leaving room for p (charge 500)
    cfg = PolicyConfig(acting_decay=True, decay_half_life_s=1.0)
    pol = ThunderPolicy([1000], cfg)
    a = _active(pol, "a", 0, 600)
    a.acting_since = 0.0
    _pool_of(pol, [("p", 400, "reasoning")])
    assert pol.tick(3.0) == [("p", 0)]
    # the pause step that follows reads a's undecayed claim: 700 + 500 > 1000, so a (Acting) is paused
    assert pol.log == [(3.0, "resume", "p", 0), (3.0, "pause", "a", 0)]
    off = ThunderPolicy([1000])
    _active(off, "a", 0, 600)
    _pool_of(off, [("p", 400, "reasoning")])
    assert off.tick(3.0) == [] and off.progs["p"].paused


def test_resume_skips_a_down_backend_and_uses_the_next():
    pol = ThunderPolicy([1000, 1000, 1000])
    pol.healthy[0] = False
    _active(pol, "u", 1, 500)
    _pool_of(pol, [("p", 300, "reasoning")])
    assert pol.tick(1.0) == [("p", 2)]


# ------------------------------------------------------------------ forced resume and the starvation fix
def test_forced_resume_counts_the_wait_from_when_the_call_was_held():
    pol = ThunderPolicy([100], PolicyConfig(forced_resume_s=30.0))
    _paused(pol, "h", 500, origin=0, waiting=True, status="reasoning", since=10.0)
    assert pol.tick(39.0) == [] and pol.progs["h"].paused
    assert pol.tick(40.0) == [("h", 0)]
    # forced onto its origin regardless of room; the same tick's pause step then marks it (600 > 100)
    assert pol.log[-2:] == [(40.0, "forced", "h", 0), (40.0, "mark", "h", 0)]
    assert pol.stats.forced == 1 and pol.stats.resumes == 1


def test_forced_resume_times_the_call_from_its_hold_not_from_the_program_start():
    # a starts at 0 and is paused at t = 1000 (b grew); its next call is held at t = 1000 and forced 1800 s later
    pol = ThunderPolicy([1000])
    assert pol.on_request("a", 300, 0.0) == 0
    pol.on_response("a", 350, 1.0)
    assert pol.on_request("b", 400, 2.0) == 0
    pol.on_progress("b", 300)                                        # used 450 + 800 = 1250: over by 250
    assert pol.tick(1000.0) == [] and pol.log[-1] == (1000.0, "pause", "a", 0)
    assert pol.on_request("a", 400, 1000.0) is None and pol.progs["a"].wait_since == 1000.0
    assert pol.tick(1800.0) == [] and pol.tick(2799.0) == []
    assert pol.tick(2800.0) == [("a", 0)] and (2800.0, "forced", "a", 0) in pol.log


@pytest.mark.parametrize("wait,starving", [(119.0, False), (120.0, True)])
def test_starving_from_the_hold_time_at_the_bound(wait, starving):
    # X (charge 600) held since t = 50; a small Reasoning call s fits the 300 of room. Starving (waited ≥ 120 s):
    # nobody overtakes X, s waits, and room is made for X (b paused); otherwise s is resumed and nothing paused
    pol = ThunderPolicy([1000], PolicyConfig(no_skip_after_s=120.0))
    _active(pol, "b", 0, 300)
    _active(pol, "c", 0, 200, status="reasoning")
    _pool_of(pol, [("s", 50, "reasoning")])
    assert pol.on_request("X", 500, 50.0) is None
    out = pol.tick(50.0 + wait)
    if starving:
        assert out == [] and pol.progs["s"].paused and pol.reserve == 600
        assert _kinds(pol)[-1] == ("pause", "b", 0)
    else:
        assert out == [("s", 0)] and pol.reserve == 0 and pol.stats.pauses == 0


def test_a_sub_second_no_skip_bound_still_applies():
    pol = ThunderPolicy([1000], PolicyConfig(no_skip_after_s=0.5))
    _active(pol, "b", 0, 300)
    _active(pol, "c", 0, 200, status="reasoning")
    assert pol.on_request("X", 500, 1.0) is None
    pol.tick(1.5)
    assert pol.reserve == 600 and _kinds(pol)[-1] == ("pause", "b", 0)


def test_a_starving_program_too_large_for_any_single_backend_gets_the_room_made_on_the_roomiest():
    # rooms 400 and 500 (total 900 ≥ 600): X is selected but fits no single backend: room is made on backend 1
    pol = ThunderPolicy([1000, 1000], PolicyConfig(no_skip_after_s=10.0))
    _active(pol, "a0", 0, 500)
    _active(pol, "a1", 1, 300)
    _active(pol, "a1b", 1, 0)
    assert pol.on_request("X", 500, 0.0) is None
    assert pol.tick(20.0) == [] and pol.reserve == 600
    assert _kinds(pol)[-1] == ("pause", "a1b", 1) and pol.progs["a0"].backend == 0
    assert pol.tick(21.0) == [("X", 1)]


def test_room_is_made_on_the_roomiest_backend_only_lowest_index_on_ties():
    for caps, target in (([1000, 1000], 0), ([1000, 1100], 1)):
        pol = ThunderPolicy(caps, PolicyConfig(no_skip_after_s=10.0))
        _active(pol, "a0", 0, 500)
        _active(pol, "a1", 1, 500)
        assert pol.on_request("X", 900, 0.0) is None                 # charge 1000: no backend has the room
        pol.tick(20.0)
        assert pol.reserve == 1000
        assert [(k, b) for _, k, _, b in pol.log if k == "pause"] == [("pause", target)]


def test_no_reserve_means_no_pause_at_exact_capacity_and_no_backend_up_is_no_error():
    pol = ThunderPolicy([1000, 1000], PolicyConfig(no_skip_after_s=10.0))
    _active(pol, "a0", 0, 900)                                       # exactly full, nobody starving
    assert pol.tick(5.0) == [] and pol.log == [] and pol.reserve == 0
    down = ThunderPolicy([1000], PolicyConfig(no_skip_after_s=1.0))
    down.set_healthy(0, False, 0.0)
    assert down.on_request("X", 900, 0.0) is None                    # no backend up: queued
    assert down.tick(5.0) == [] and down.reserve == 1000             # starving, but nowhere to make room


def test_census_counts_every_marked_program_and_two_migrations_count_two():
    pol = ThunderPolicy([10000, 10000])
    for pid, marked in (("m1", True), ("m2", True), ("u", False)):
        _active(pol, pid, 0, 10, status="reasoning").marked = marked
    assert pol.state_counts()["marked"] == 2
    pol = ThunderPolicy([1000, 1000])
    _active(pol, "big", 0, 850)                                      # backend 0: 50 left; backend 1: 1000
    _paused(pol, "p", 100, origin=0)
    _paused(pol, "q", 200, origin=0)
    pol.tick(1.0)
    assert pol.progs["p"].backend == pol.progs["q"].backend == 1 and pol.stats.migrations == 2


def test_sub_second_aging_half_life_ages():
    pol = ThunderPolicy([50], PolicyConfig(aging_half_life_s=0.5))
    pol.on_request("old", 40, 2.0)
    assert pol.new_key(pol.progs["old"], 3.0) == pytest.approx(40 * 2 ** -2)
