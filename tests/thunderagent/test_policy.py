"""policy.py (the one scheduler the simulator and the proxy share): hand-worked decisions, event by event."""
from __future__ import annotations

import random

import pytest

from stages.thunderagent.policy import (PROGRAM_OVERHEAD, DefaultRouter, PolicyConfig, ThunderPolicy, charge, fits,
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
