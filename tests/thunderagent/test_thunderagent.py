"""thunderagent: workload format, simulator invariants, scheduler effects, real engine exactness, CLI, smoke."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from stages.thunderagent.costmodel import fit_cost_model, gpu_cost_model, heldout_errors
from stages.thunderagent.engine import OnlineEngine, PagedEngine, engine_model_config
from stages.thunderagent.sim import CostModel, SchedConfig, simulate
from stages.thunderagent.workload import (Cluster, Program, Step, Workload, WorkloadError, check_capacity,
                                          dump_workload, generate, load_workload)

ROOT = Path(__file__).resolve().parents[2]


def _write(tmp_path, lines, name="w.jsonl"):
    p = tmp_path / name
    p.write_text("\n".join(json.dumps(x) if not isinstance(x, str) else x for x in lines) + "\n")
    return p


GOOD = {"id": "a", "prompt_tokens": 100, "steps": [{"decode_tokens": 5}]}


def test_defaults_documented_and_filled(tmp_path):
    wl = load_workload(_write(tmp_path, [GOOD]))
    p = wl.programs[0]
    assert (p.arrival_s, p.shared_prefix_tokens, p.prefix_group, p.env_prep_s) == (0.0, 0, "default", 0.0)
    assert (p.steps[0].tool_s, p.steps[0].obs_tokens) == (0.0, 0)
    assert wl.cluster == Cluster(1, 60000, 16)


@pytest.mark.parametrize("bad,match", [
    ({**GOOD, "prompt_tokens": -3}, r"w.jsonl:2: prompt_tokens: must be >= 1"),
    ({**GOOD, "steps": [{"decode_tokens": -1}]}, r"w.jsonl:2: steps\[0\].decode_tokens"),
    ({**GOOD, "steps": [{"decode_tokens": 3, "tool_s": "x"}]}, r"steps\[0\].tool_s: must be a number"),
    ({**GOOD, "prompt_tokens": True}, r"prompt_tokens: must be an integer"),
    ({**GOOD, "shared_prefix_tokens": 101}, r"shared_prefix_tokens: must be <= prompt_tokens"),
    ({**GOOD, "colour": 1}, r"colour: unknown field"),
    ({**GOOD, "id": "x"} | {"steps": []}, r"steps: must be a list"),
    ("{not json", r"w.jsonl:2: not valid JSON"),
    ({**GOOD, "arrival_s": "NaN"}, r"arrival_s: must be a number"),
])
def test_bad_lines_name_line_and_field(tmp_path, bad, match):
    with pytest.raises(WorkloadError, match=match):
        load_workload(_write(tmp_path, [{"id": "first", "prompt_tokens": 3, "steps": [{"decode_tokens": 1}]}, bad]))


def test_duplicate_id_and_capacity(tmp_path):
    with pytest.raises(WorkloadError, match="w.jsonl:2: id: duplicate"):
        load_workload(_write(tmp_path, [GOOD, GOOD]))
    wl = load_workload(_write(tmp_path, [{"cluster": {"kv_capacity_tokens": 50}}, GOOD]))
    with pytest.raises(WorkloadError, match="w.jsonl:2: prompt_tokens: 100"):
        check_capacity(wl, "w.jsonl")


def test_generator_round_trip(tmp_path):
    wl = generate(5, 3, cluster=Cluster(2, 90000, 16))
    p = tmp_path / "g.jsonl"
    p.write_text(dump_workload(wl))
    back = load_workload(p)
    assert back.programs == wl.programs and back.cluster == wl.cluster


def test_cost_model_chunk_time_matches_sum_and_inverse():
    c = CostModel(a=0.03, b=2e-6, p=1e-4, q=1e-8)
    k, n, t0 = 17, 5, 3000
    brute = sum(c.a + c.b * (t0 + n * i) for i in range(k))
    assert abs(c.chunk_time(k, n, t0) - brute) < 1e-12
    kk = c.iters_within(brute, n, t0)
    assert kk == k or (kk == k - 1 and c.chunk_time(k, n, t0) > brute - 1e-12)


def _tiny(n=6, cap=20000, seed=0, backends=1):
    return generate(n, seed, steps=(4, 6), decode=(50, 120), obs=(50, 300), prompt=(800, 1500), shared_prefix=512,
                    tool_mean_s=(2.0, 6.0), cluster=Cluster(backends, cap, 16))


def test_every_call_completes_and_no_recompute_when_memory_is_ample():
    wl = _tiny(cap=10**6)
    for pol in ("vllm", "continuum", "thunderagent"):
        r = simulate(wl, pol)
        assert r["calls"] == sum(len(p.steps) for p in wl.programs)
        assert r["recomputed_tokens"] == 0 and r["preemptions"] == 0 and r["kv_reuse_rate"] == 1.0


def test_hit_rate_independent_check_single_program():
    # one program, ample memory: hit at step i = (c_i − obs_{i−1}) / c_i, step 0 = 0 (cold prefix)
    p = Program("x", 1000, (Step(100, 1.0, 300), Step(50, 1.0, 200), Step(70)), shared_prefix_tokens=512)
    r = simulate(Workload([p], Cluster(1, 10**5, 16)), "vllm")
    c1, c2 = 1000 + 100 + 300, 1000 + 100 + 300 + 50 + 200
    want = (0 + (c1 - 300) / c1 + (c2 - 200) / c2) / 3
    assert abs(r["kv_hit_rate"] - want) < 1e-12


def test_core_effect_thunderagent_avoids_thrashing_under_overload():
    wl = generate(24, 1, steps=(8, 10), cluster=Cluster(1, 60000, 16))
    v, t = simulate(wl, "vllm"), simulate(wl, "thunderagent")
    assert t["recomputed_tokens"] < 0.5 * v["recomputed_tokens"]
    assert t["kv_reuse_rate"] > v["kv_reuse_rate"] + 0.2


def test_deterministic():
    wl = _tiny(cap=8000)
    assert simulate(wl, "thunderagent", seed=1) == simulate(wl, "thunderagent", seed=1)


def test_engine_replay_matches_dense_model_under_eviction_and_preemption():
    wl = generate(3, 0, steps=(2, 2), decode=(6, 12), obs=(4, 20), tool_mean_s=(0.5, 1.0), prompt=(40, 70),
                  shared_prefix=32, env_prep_s=(0.1, 0.2), cluster=Cluster(1, 160, 16))
    res, trace = simulate(wl, "vllm", trace=True)
    assert any(op[0] in ("trim", "preempt") for op in trace)  # the scenario exercises eviction
    eng = PagedEngine(wl, engine_model_config(256), 0, torch.device("cpu"))
    eng.replay(trace)
    ver = eng.verify()
    assert ver["mismatches"] == 0 and ver["generated_tokens"] > 0
    assert ver["steps_done"] == ver["steps_total"]
    kinds = {o["kind"] for o in eng.ops}
    assert kinds == {"prefill", "decode"} and all(o["cpu_s"] >= 0 for o in eng.ops)
    assert sum(o.get("iters", 0) * o.get("n", 0) for o in eng.ops) == ver["generated_tokens"]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "stages.thunderagent.simulate", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_cli_ok_and_errors(tmp_path):
    w = tmp_path / "w.jsonl"
    w.write_text(dump_workload(_tiny(n=3, cap=50000)))
    out = tmp_path / "r.json"
    r = _cli("--workload", w, "--policy", "thunderagent", "--out", out)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    for k in ("steps_per_min", "kv_hit_rate", "recomputed_tokens", "ttfr_p50_s", "ttfr_p95_s"):
        assert k in res
    bad = tmp_path / "o2.json"
    for args, msg in [(("--policy", "sglang"), "unknown policy"), (("--capacity", "100", "--policy", "vllm"), "prompt_tokens"),
                      (("--policy", "vllm", "--out", tmp_path), "is a directory")]:
        full = ["--workload", w, "--out", bad, *args] if "--out" not in args else ["--workload", w, *args]
        r = _cli(*full)
        assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    assert not bad.exists()
    r = _cli("--workload", w, "--policy", "vllm", "--out", w)
    assert r.returncode == 2 and "must not be the workload" in r.stderr


def test_smoke_pipeline(smoke_run):
    out = smoke_run("thunderagent")
    m = json.loads((smoke_run.root / "reports" / "thunderagent" / "metrics.json").read_text())
    assert {c["name"] for c in m["claims"]} >= {"throughput_gain_at_max_concurrency", "engine_exact", "cost_model_heldout"}
    assert {c["kind"] for c in m["claims"]} == {"finding", "check"}
    text = (smoke_run.root / "reports" / "thunderagent" / "metrics.json").read_text()
    json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(AssertionError(f"{c} in metrics.json")))
    assert "paged_decode_attention" in m["kernels"]
    assert (out["report"]).exists()


# ------------------------------------------------------------------------------ issue 40: hostile inputs
def test_capacity_rule_tight_case_is_the_schedulers(tmp_path):
    """check_capacity and the scheduler use one rule (context + 100 reserved ≤ C): a program whose peak context
    is exactly C − 100 is accepted and served at once (no 1,800 s forced-resume wait); C − 99 is refused."""
    cap = 1000
    ok = Workload([Program("a", 800, (Step(100),))], Cluster(1, cap, 16))       # peak 900 = C − 100
    check_capacity(ok, "w")
    r = simulate(ok, "thunderagent", CostModel(a=0.01, b=0.0, p=0.0, q=0.0))
    assert r["ttfr_max_s"] == pytest.approx(1.0) and r["forced_resumes"] == 0 and r["pauses"] == 0
    with pytest.raises(WorkloadError, match=r"w:\?: steps: the context grows to 901 tokens; 901 \+ 100 reserved"):
        check_capacity(Workload([Program("a", 800, (Step(101),))], Cluster(1, cap, 16)), "w")
    with pytest.raises(WorkloadError, match=r"prompt_tokens: 901 \+ 100 reserved tokens exceeds the backend KV capacity 1000"):
        check_capacity(Workload([Program("a", 901, (Step(1),))], Cluster(1, cap, 16)), "w")


def _line_err(tmp_path, text, name="h.jsonl"):
    p = tmp_path / name
    p.write_text(text)
    r = _cli("--workload", p, "--policy", "thunderagent", "--out", tmp_path / "o.json")
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "o.json").exists()
    return r.stderr


def test_hostile_workloads_one_line_exit_2(tmp_path):
    g = json.dumps
    assert "arrival_s: must be <= 1e+07 (got 1e+300)" in _line_err(tmp_path, g({**GOOD, "arrival_s": 1e300}) + "\n")
    assert "tool_s: must be <= 1e+06" in _line_err(tmp_path, g({**GOOD, "steps": [{"decode_tokens": 2, "tool_s": 1e7}]}))
    deep = "[" * 100_000 + "]" * 100_000
    assert "JSON nested deeper than 8 levels" in _line_err(tmp_path, deep + "\n")
    big_int = '{"id": "a", "prompt_tokens": ' + "9" * 4000 + ', "steps": [{"decode_tokens": 1}]}'
    assert "prompt_tokens: must be <= 10000000 (got an integer of 4000 digits)" in _line_err(tmp_path, big_int)
    assert "not valid JSON (Exceeds the limit" in _line_err(tmp_path, big_int.replace("9" * 4000, "9" * 5000))
    assert "not valid JSON" in _line_err(tmp_path, g(GOOD).replace("100", "NaN"))
    huge = tmp_path / "huge.jsonl"
    with open(huge, "wb") as f:                                      # sparse: no 64 MiB written
        f.truncate(64 * 2**20 + 1)
    r = _cli("--workload", huge, "--policy", "vllm", "--out", tmp_path / "o.json")
    assert r.returncode == 2 and "more than the limit of 67108864 bytes" in r.stderr and "Traceback" not in r.stderr


def test_unfinishable_workload_refused_up_front_with_the_reason(tmp_path):
    """900 steps × 10^6 decode tokens is valid in the format (peak 9·10^8 < C = 10^9) but needs ≥ 1.4·10^7 decode
    chunks: refused before any work, instead of grinding into a livelock error."""
    line = {"id": "x", "prompt_tokens": 10, "steps": [{"decode_tokens": 10**6}] * 900}
    p = tmp_path / "l.jsonl"
    p.write_text(json.dumps({"cluster": {"kv_capacity_tokens": 10**9}}) + "\n" + json.dumps(line) + "\n")
    import time
    t = time.process_time()
    r = _cli("--workload", p, "--policy", "thunderagent", "--out", tmp_path / "o.json")
    assert r.returncode == 2 and "needs at least 1.41e+07 simulation events" in r.stderr and "Traceback" not in r.stderr
    assert time.process_time() - t < 5.0
    # ticks: a program whose tools alone take 10^9 s would need 2·10^8 scheduling ticks
    slow = {"id": "y", "prompt_tokens": 10, "steps": [{"decode_tokens": 1, "tool_s": 10**6}] * 1000}
    p.write_text(json.dumps(slow) + "\n")
    r = _cli("--workload", p, "--policy", "thunderagent", "--out", tmp_path / "o.json")
    assert r.returncode == 2 and "simulation events" in r.stderr
    r = _cli("--workload", p, "--policy", "vllm", "--out", tmp_path / "o.json")    # no ticks under vLLM: it runs
    assert r.returncode == 0, r.stderr


def test_outputs_have_no_nan_or_infinity(tmp_path):
    w = tmp_path / "w.jsonl"
    w.write_text(dump_workload(_tiny(n=3, cap=50000)))
    out = tmp_path / "r.json"
    # a window after the run: no program starts in it, so its TTFR percentiles are not numbers -> null + reason
    r = _cli("--workload", w, "--policy", "vllm", "--out", out, "--workers", "2", "--window", "9000", "9500")
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text(), parse_constant=lambda c: (_ for _ in ()).throw(AssertionError(c)))
    assert res["window_ttfr_p95_s"] is None and "window_ttfr_p95_s" in res["nonfinite"]["paths"]
    assert res["time_unit"].startswith("simulated seconds")


# ------------------------------------------------------------------------------ cost model
def test_gpu_constants_by_hand():
    cm, d = gpu_cost_model()
    bw, fl = 2 * 3.35e12 * 0.7, 2 * 989.4e12 * 0.4
    assert cm.a == pytest.approx(2 * 32.5e9 / bw) and cm.a == pytest.approx(0.013859, rel=1e-4)
    assert d["kv_bytes_per_token"] == 2 * 64 * 8 * 128 * 2 == 262144 and cm.b == pytest.approx(262144 / bw)
    assert cm.p == pytest.approx(65e9 / fl) and cm.q == pytest.approx(4 * 64 * 40 * 128 / fl) and cm.r == 0.0
    assert set(d["assumed"]) == {"deployment.bw_efficiency", "deployment.mfu"}


def test_fit_recovers_known_coefficients_and_heldout_error():
    rng = __import__("numpy").random.default_rng(4)
    true = {"a": 2e-3, "b": 3e-6, "p": 5e-5, "q": 2e-8, "r": 1e-3}
    ops = []
    for _ in range(40):
        k, n, t0 = int(rng.integers(1, 30)), int(rng.integers(1, 5)), int(rng.integers(10, 400))
        ops.append({"kind": "decode", "iters": k, "kv_read": k * t0 + n * k * (k - 1) / 2})
        m, c = int(rng.integers(1, 200)), int(rng.integers(200, 600))
        ops.append({"kind": "prefill", "prefill": m, "prefill_ctx": m * c, "prefill_calls": 1})
    for o in ops:
        o["cpu_s"] = sum(true[k] * o.get(f, 0) for k, f in zip("abpqr", ("iters", "kv_read", "prefill", "prefill_ctx",
                                                                          "prefill_calls")))
    coef = fit_cost_model(ops[:60])
    assert all(coef[k] == pytest.approx(v, rel=1e-6) for k, v in true.items())
    e = heldout_errors(coef, ops[60:])
    assert e["total_rel_err"] < 1e-9 and e["op_r2"] == pytest.approx(1.0)


def test_online_engine_matches_dense_greedy():
    e = OnlineEngine(1024, engine_model_config(128), seed=3)
    toks = [(i * 37 + 5) % 128 for i in range(21)]
    out = e.generate(toks, 7)
    seq = list(toks)
    with torch.no_grad():
        for _ in range(7):
            seq.append(int(e.model(torch.tensor([seq]))[0, -1].argmax()))
    assert out == seq[21:] and len(e.pool.free) == e.pool.n_blocks     # blocks returned after the request
    with pytest.raises(ValueError, match="exceeds the model length 128"):
        e.generate(toks, 120)


def test_ttl_choice_pilot_seeds_and_program_latency():
    """Baseline tuning picks the best mean pilot throughput (ties → the smaller TTL); pilot seeds must be disjoint from
    the evaluation seeds; per-program latency: 1 worker runs identical programs back to back, so every completed
    program of the cohort takes the same time, and a horizon cut short censors the running one (a lower bound)."""
    from stages.thunderagent.evaluate import Config as EvalCfg, choose_ttl, program_latency
    from stages.thunderagent.prepare import Config as PrepCfg

    assert choose_ttl({"2": [80.0, 82.0], "5": [85.0, 83.0], "10": [86.0, 82.0], "30": [10.0, 10.0]}) == 5.0
    with pytest.raises(ValueError, match="pilot_seeds: must be disjoint"):
        PrepCfg(seeds=[0, 1, 2], pilot_seeds=[2, 7])
    prog = [Program(f"p{i}", 300, (Step(20, 1.5, 40), Step(10, 0.5, 30), Step(5)), env_prep_s=0.25) for i in range(40)]
    wl = Workload(prog, Cluster(1, 20_000, 16))
    cost = CostModel(a=0.01, b=1e-6, p=1e-4, q=0.0)
    cfg = EvalCfg(window_s=[3.0, 30.0], latency_cohort_s=6.0, latency_stop_s=60.0)   # 40 programs last ~96 s
    r = program_latency(wl, "vllm", cost, SchedConfig(), 0, 1, cfg)
    assert r["cohort"] >= 2 and r["censored"] == 0 and r["list_lasted"]
    assert r["p50_s"] == pytest.approx(r["max_s"]) and r["p99_s"] == pytest.approx(r["max_s"])
    one = r["max_s"]          # one program's whole run: env prep 0.25 s + tools 2 s + three short calls (< 0.5 s)
    assert 2.25 < one < 2.75
    short = program_latency(wl, "vllm", cost, SchedConfig(), 0, 1,
                            EvalCfg(window_s=[3.0, 30.0], latency_cohort_s=6.0, latency_stop_s=9.0 + 0.5))
    assert short["censored"] >= 1 and short["max_s"] <= one + 1e-9
