"""report: throughput vs concurrency, KV reuse, victim ablation, starvation fix, engine fit; claims."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import polars as pl

from stages.common.claims import Better, Bound, Claim
from stages.common.config import ReportConfig
from stages.common.paths import read_json
from stages.common.reporting import Report
from stages.common.runner import StageContext

CLAIM = ("Scheduling agentic workflows as LLM Programs (program-aware pausing/restoring against KV capacity, global "
         "queue with Best-Fit-Decreasing placement, tool-environment lifecycle) avoids KV thrashing: 1.5–3.6× serving "
         "throughput over vLLM, KV hit rate near 100%.")

CLAIMS = [
    Bound("throughput_gain_high_concurrency",
          "At the highest concurrency ThunderAgent's steps/min is ≥ 1.5× the vLLM-like baseline's",
          value="high.ta_over_vllm", 
          refuted_by="a per-seed throughput ratio ThunderAgent/vLLM ≤ 1.5 beyond 2 s.e.", kind="finding"),
    Bound("vllm_collapses", "The vLLM-like baseline's throughput at the highest concurrency falls below 80% of its "
          "peak over the sweep (throughput collapse once programs exceed capacity)",
          value="high.vllm_over_peak", refuted_by="vLLM keeps ≥ 80% of its peak throughput", kind="finding"),
    Bound("thunderagent_holds", "ThunderAgent keeps ≥ 90% of its peak throughput at the highest concurrency",
          value="high.ta_over_peak", refuted_by="ThunderAgent's throughput also drops below 90% of peak", kind="finding"),
    Bound("kv_reuse_near_100", "ThunderAgent reuses ≥ 95% of previously computed context from the KV cache "
          "(cached / (cached + recomputed) tokens) at the highest concurrency",
          value="high.ta_reuse", refuted_by="a reuse rate ≤ 0.95 beyond 2 s.e.", kind="finding"),
    Better("kv_reuse_beats_vllm", "ThunderAgent's KV reuse rate exceeds vLLM's at the highest concurrency",
           a="high.ta_reuse", b=f"high.vllm_reuse", refuted_by="vLLM's reuse ≥ ThunderAgent's on most seeds", kind="finding"),
    Better("shortest_victims_beat_longest", "Shortest-first victim choice recomputes fewer tokens than longest-first",
           a="victims.shortest", b=f"victims.longest", higher_is_better=False,
           refuted_by="longest-first recomputes fewer tokens on most seeds", kind="finding"),
    Better("shortest_victims_beat_random", "Shortest-first victim choice recomputes fewer tokens than random victims",
           a="victims.shortest", b=f"victims.random", higher_is_better=False,
           refuted_by="random victims recompute fewer tokens on most seeds", kind="finding"),
    Bound("starvation_exists", "Official smallest-first admission with skipping starves large prompts under a burst: "
          "their max TTFR exceeds the bound", value="starvation.official_large_ttfr", above=f"ttfr_bound_s",
          refuted_by="large prompts' max TTFR below the bound without any fix", kind="finding"),
    Bound("aging_bounds_ttfr", "With aging + no-skip-after-wait the max TTFR of large prompts stays below the bound",
          value="starvation.aging_large_ttfr", below=f"ttfr_bound_s",
          refuted_by="a large-prompt max TTFR above the bound with the fix", kind="finding"),
    Bound("aging_keeps_throughput", "The fix keeps ≥ 95% of the official scheduler's throughput on the burst",
          value="starvation.aging_over_official_throughput", 
          refuted_by="throughput with the fix < 95% of without, beyond 2 s.e.", kind="finding"),
    Claim("engine_exact", "The real paged engine (shared prefix blocks, LRU trims, preemption, recompute) replaying "
          "the schedulers' traces generates exactly the dense model's greedy tokens, within its block pool",
          f"engine.mismatches == 0 and engine.steps_done == engine.steps_total",
          refuted_by="any generated token differing from the dense uncached greedy choice, or an unfinished program", kind="finding"),
]

LABEL = {"vllm": "vLLM-like (FCFS+LRU)", "continuum": "Continuum-like (TTL pin)", "thunderagent": "ThunderAgent"}


class Config(ReportConfig):
    pass


def _m(v):
    return float(np.mean(v))


def run(cfg: Config, ctx: StageContext) -> None:
    ev = read_json(ctx.input("evaluate") / "results.json")
    tr = ctx.input("train")
    fit, eng = read_json(tr / "fit.json"), read_json(tr / "engine.json")
    sw, ns, seeds = ev["sweep"], ev["concurrency"], ev["seeds"]
    top = f"N{ns[-1]}"

    def thr(p, n):
        return sw[p][n]["steps_per_min"]

    peak = {p: [max(thr(p, f"N{n}")[i] for n in ns) for i in range(len(seeds))] for p in sw}
    st = ev["starvation"]
    off, ag = st["thunderagent_official"], st["thunderagent_aging"]
    metrics = {
        "seeds": seeds, "concurrency": ns, "ttfr_bound_s": ev["cfg"]["ttfr_bound_s"],
        "high": {"ta_over_vllm": [a / b for a, b in zip(thr("thunderagent", top), thr("vllm", top))],
                 "ta_over_continuum": [a / b for a, b in zip(thr("thunderagent", top), thr("continuum", top))],
                 "vllm_over_peak": [a / b for a, b in zip(thr("vllm", top), peak["vllm"])],
                 "ta_over_peak": [a / b for a, b in zip(thr("thunderagent", top), peak["thunderagent"])],
                 "ta_reuse": sw["thunderagent"][top]["kv_reuse_rate"], "vllm_reuse": sw["vllm"][top]["kv_reuse_rate"],
                 "ta_hit_official": sw["thunderagent"][top]["kv_hit_rate"]},
        "victims": {o: v["recomputed_tokens"] for o, v in ev["victims"].items()},
        "starvation": {"official_large_ttfr": off["large_ttfr_max_s"], "aging_large_ttfr": ag["large_ttfr_max_s"],
                       "vllm_large_ttfr": st["vllm"]["large_ttfr_max_s"],
                       "aging_over_official_throughput": [a / b for a, b in zip(ag["steps_per_min"], off["steps_per_min"])]},
        "engine": {"mismatches": sum(e["mismatches"] for e in eng.values()),
                   "steps_done": sum(e["steps_done"] for e in eng.values()),
                   "steps_total": sum(e["steps_total"] for e in eng.values()),
                   "generated_tokens": sum(e["generated_tokens"] for e in eng.values()), "per_policy": eng},
        "cost_fit_runtime": fit,
        "sweep": {p: {n: {k: v for k, v in b.items()} for n, b in d.items()} for p, d in sw.items()},
    }
    rows = []
    for p in sw:
        for n in ns:
            b = sw[p][f"N{n}"]
            rows.append({"policy": LABEL[p], "programs": n, "steps/min": _m(b["steps_per_min"]),
                         "KV hit (official)": _m(b["kv_hit_rate"]), "KV reuse": _m(b["kv_reuse_rate"]),
                         "recomputed Mtok": _m(b["recomputed_tokens"]) / 1e6, "preemptions": _m(b["preemptions"]),
                         "pauses": _m(b["pauses"]), "TTFR p95 s": _m(b["ttfr_p95_s"]),
                         "mem. imbalance": _m(b["memory_imbalance"]), "peak envs": _m(b["peak_live_envs"]),
                         "env·s": _m(b["env_seconds"])})
    table = pl.DataFrame(rows)
    rep = Report(ctx, "ThunderAgent: program-aware agentic inference (thunderagent)", CLAIM)
    rep.section("Setup", f"""
Simulated cluster: {ns} concurrent programs (closed burst), seeds {seeds}; workloads in the public JSONL format
(`stages/thunderagent/workload.py`), ~20 steps each, 200–800 decode tokens per step, tool calls ~Exp(mean 5–30 s),
observations 100–2K tokens, a 1K-token shared system prompt. Policies: vLLM-like (request FCFS, LRU prefix cache,
recompute preemption; router = fewest programs, sticky), Continuum-like (program-FCFS + TTL pin
{ev['cfg']['ttl_s']} s), ThunderAgent (tick {ev['cfg']['tick_s']} s, capacity check Σ_R c + w·Σ_A c + 100·n with
w = 1 and no acting decay as in the official serving scripts, shortest-first victims Acting before Reasoning,
restore Reasoning > New > Acting with skip, BFD, global queue, async env preparation, cleanup hooks).
Throughput = LLM calls ÷ makespan. Cost model (nominal, H100-scale ~32B): iteration = a + b·KV-read + p·prefill +
q·prefill·ctx. Starvation study (#46): a burst of mixed 1.4k–8k-token prompts at t = 0 plus a stream of small
programs on one backend; "large" = prompt ≥ {ev['cfg']['large_prompt_tokens']} tokens; fix = aging (key c·2^(−wait/
{ev['cfg']['aging_half_life_s']} s)) + never skipping a program waiting > {ev['cfg']['no_skip_after_s']} s.
Real engine: the shared tiny GPT (float64, CPU) with a paged KV cache (16-token blocks, shared prefix blocks)
replays the simulator's scheduler traces; `train` fits a, b, p, q to its chunk wall times.
""")
    rep.table("Policy sweep (means over seeds)", table)
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.8))
    plot_rows = []
    for i, p in enumerate(sw):
        y = [_m(thr(p, f"N{n}")) for n in ns]
        e = [np.std(thr(p, f"N{n}"), ddof=1) / np.sqrt(len(seeds)) if len(seeds) > 1 else 0 for n in ns]
        ax[0].errorbar(ns, y, yerr=e, marker="o", label=LABEL[p], color=f"C{i}")
        ax[1].plot(ns, [_m(sw[p][f"N{n}"]["kv_reuse_rate"]) for n in ns], marker="o", label=LABEL[p], color=f"C{i}")
        plot_rows += [{"programs": n, "policy": p, "steps_per_min": yy} for n, yy in zip(ns, y)]
    ax[0].set_xlabel("concurrent programs")
    ax[0].set_ylabel("steps / min")
    ax[0].set_title("throughput vs concurrency")
    ax[1].set_xlabel("concurrent programs")
    ax[1].set_ylabel("KV reuse (cached / (cached+recomputed))")
    ax[0].legend(fontsize=7)
    rep.figure("throughput_vs_concurrency", fig, "Throughput (mean ± s.e. over seeds) and KV reuse vs concurrency.")
    rep.plot("throughput_vs_concurrency", pl.DataFrame(plot_rows), x="programs", y="steps_per_min",
             title="steps/min vs concurrent programs")
    vt = pl.DataFrame([{"victim order": o, "recomputed Mtok": _m(v) / 1e6, "steps/min": _m(ev["victims"][o]["steps_per_min"])}
                       for o, v in metrics["victims"].items()])
    rep.table(f"Victim-order ablation (ThunderAgent, {ns[-1]} programs)", vt)
    srows = [{"arm": a, "large-prompt max TTFR s": _m(b["large_ttfr_max_s"]), "TTFR p95 s": _m(b["ttfr_p95_s"]),
              "TTFR max s": _m(b["ttfr_max_s"]), "steps/min": _m(b["steps_per_min"])} for a, b in st.items()]
    rep.table("Starvation study (#46 burst)", pl.DataFrame(srows))
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for i, (a, b) in enumerate(st.items()):
        pts = np.array(b["ttfr_by_prompt"][0], dtype=float)
        ax.scatter(pts[:, 0], pts[:, 1], s=10, label=a, color=f"C{i}", alpha=0.7)
    ax.axhline(ev["cfg"]["ttfr_bound_s"], ls="--", color="k", lw=0.8)
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("TTFR (s)")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    rep.figure("ttfr_vs_prompt", fig, f"TTFR vs prompt size on the burst (seed {seeds[0]}); dashed: the claimed bound.")
    rep.section("Real engine and cost-model fit", f"""
Generated tokens checked against the dense model: {metrics['engine']['generated_tokens']}, mismatches:
{metrics['engine']['mismatches']}. Per policy: {', '.join(f"{p}: peak {e['peak_blocks']} of {e['pool_blocks']} blocks, "
f"{e['sim_recomputed_tokens']} recomputed tokens, {e['sim_preemptions']} preemptions" for p, e in eng.items())}.
Cost model fitted to the CPU engine (wall-clock, machine-dependent, not used by any claim): a = {fit['a']:.3g} s,
b = {fit['b']:.3g} s/token, p = {fit['p']:.3g} s/token, q = {fit['q']:.3g}; held-out chunks ({fit['n_chunks']} in
all): R² = {fit['heldout_r2']:.3f}, mean |rel. err| = {fit['heldout_mape']:.3f}, total-time rel. err =
{fit['heldout_total_time_rel_err']:.3f}.
""")
    rep.section("Deviations", """
| what | paper / official code | here | why |
| --- | --- | --- | --- |
| hardware, models | H100 clusters, real agents (SWE-agent, OpenHands, RL rollouts) | simulator with a nominal H100-scale cost model; tiny GPT on CPU for the real path | laptop scale |
| cost model in the simulator | real GPU time | nominal a, b, p, q (arithmetic for a ~32B model); the CPU-fitted values are reported, not used | a CPU tiny-GPT fit would not describe a GPU cluster, and wall-clock fits are not deterministic |
| pause marks | official marks of Reasoning programs do not lower remaining capacity | marks lower it (paper's algorithm) | as-read official behaviour pauses every Reasoning program |
| resume placement | BFD: largest onto the roomiest backend | same, but a program stays on its own backend when it fits there (KV affinity) | migration discards KV; ours, labelled |
| acting decay | paper: f(t)=2^(−t); official serving: off | off by default (`SchedConfig.acting_decay`) | matches the serving runs |
| KV hit metric | cached / prompt tokens per call | reported (official) and a reuse rate cached/(cached+recomputed) used by the claim | new observation tokens can never hit, so the official rate is capped below 1 by construction here |
| Σc² victim choice | shortest-first heuristic | same; longest/random ablation | — |
| async env prep, cleanup hooks | paper only (not in repo) | simulated (prep for the next 4 queued programs; baselines free envs at the end of the run) | — |
| starvation fix | open issue #46 | aging + no-skip-after-wait (ours) | the issue asks for a fix |
| throughput window | calls in a 10–70 min window | calls ÷ makespan of a closed burst | finite workloads |
""")
    rep.section("Discussion", f"""
The paper serves real agent workloads on GPU clusters (128 SWE-agent workers, RL rollouts) and reports 1.5–3.6×
throughput over vLLM with near-100% KV hit rate. This miniature keeps the scheduler's logic (thrashing check,
shortest-first pausing, tiered restore with skip, BFD over a global queue) and the baselines' mechanisms, but its
numbers come from a cost model, not GPUs: the size of the gain depends on how expensive re-prefill is relative to
decode and on tool latencies, which are assumed here. The real engine only shows that the KV bookkeeping the
scheduler relies on (shared prefix blocks, LRU tail trims, preemption and recompute) is executable and exact on a
tiny model; its CPU timings say nothing about GPU throughput. Disk savings (4.2×) are not reproduced (only
environment-seconds are tracked).
""")
    rep.finish(CLAIMS, metrics)
