"""report: the sweep to the collapse (steady-state window metric), makespan, regimes, victims, #46 latency,
the cost model (GPU constants and the CPU fit), the real proxy; claims."""
from __future__ import annotations

import time

import matplotlib.pyplot as plt
import numpy as np
import polars as pl

from stages.common.claims import Better, Bound, Claim, Near
from stages.common.config import ReportConfig
from stages.common.paths import read_json
from stages.common.reporting import Report
from stages.common.runner import StageContext
from stages.thunderagent.simulate import finite_json

CLAIM = ("Scheduling agentic workflows as LLM Programs (program-aware pausing/restoring against KV capacity, global "
         "queue with Best-Fit-Decreasing placement, tool-environment lifecycle) avoids KV thrashing: 1.5–3.6× serving "
         "throughput over vLLM, KV hit rate near 100%.")

SIM = "simulated seconds"

CLAIMS = [
    Bound("throughput_gain_at_max_concurrency",
          "Where vLLM thrashes (the largest concurrency of the sweep), ThunderAgent's steady-state throughput (official "
          "metric: LLM calls completed in a fixed window per minute) is ≥ 1.5× vLLM's (the paper's lower end)",
          value="head.ta_over_vllm", kind="finding",
          refuted_by="a per-seed window-throughput ratio ThunderAgent/vLLM whose t-bound lies at or below 1.5"),
    Bound("gain_over_strongest_baseline",
          "ThunderAgent's steady-state throughput at the largest concurrency beats the strongest TUNED baseline by the "
          "margin in params: per seed, the best of vLLM and Continuum-like TTL pinning (TTL chosen on pilot seeds) at "
          "any concurrency of the sweep (an oracle admission cap; the largest N included)",
          value="head.ta_over_strongest_tuned", kind="finding",
          refuted_by="the per-seed ratio to max over N of max(vLLM(N), Continuum(N)) at or below the margin"),
    Bound("makespan_gain_at_max_concurrency",
          "The same gain on the secondary metric: calls ÷ makespan of a closed burst of N programs at the largest N",
          value="makespan.ta_over_vllm", kind="finding",
          refuted_by="a per-seed makespan-throughput ratio at or below 1.5"),
    Bound("vllm_collapses",
          "vLLM-style LRU thrashes: its steady-state throughput at the largest concurrency falls below the fraction in "
          "params of its own peak over the sweep",
          value="head.vllm_over_peak", kind="finding",
          refuted_by="vLLM keeping at least that fraction of its peak"),
    Bound("thunderagent_holds",
          "ThunderAgent holds: its steady-state throughput at the largest concurrency keeps the fraction in params of its "
          "own peak", value="head.ta_over_peak", kind="finding",
          refuted_by="ThunderAgent also losing more than that share of its peak"),
    Bound("card_regime_gain",
          "The gain also holds in the paper card's workload regime (200–800 decode tokens, tools ~Exp(5–30 s)): "
          "ThunderAgent/vLLM steady-state throughput at the largest concurrency above the bound in params",
          value="card.ta_over_vllm", kind="finding",
          refuted_by="a ratio at or below the bound (vLLM at least as fast in that regime)"),
    Bound("kv_reuse_near_100",
          "ThunderAgent reuses ≥ 95% of previously computed context from the KV cache (cached / (cached + recomputed) "
          "tokens) at the largest concurrency", value="head.ta_reuse", kind="finding",
          refuted_by="a reuse rate whose t-bound lies at or below 0.95"),
    Better("kv_reuse_beats_vllm",
           "ThunderAgent's KV reuse rate exceeds vLLM's at the largest concurrency by the min effect in params",
           a="head.ta_reuse", b="head.vllm_reuse", kind="finding",
           refuted_by="a reuse gap at or below the min effect"),
    Bound("shortest_victims_beat_longest",
          "Shortest-first victim choice recomputes fewer tokens than longest-first: the longest-first/shortest-first "
          "recompute ratio ((tokens + 1) / (tokens + 1)) exceeds the bound in params", value="victims.longest_over_shortest", kind="finding",
          refuted_by="a ratio at or below the bound"),
    Bound("shortest_victims_beat_random",
          "Shortest-first victim choice recomputes fewer tokens than random victims (ratio above the bound in params)",
          value="victims.random_over_shortest", kind="finding", refuted_by="a ratio at or below the bound"),
    Better("starvation_vs_vllm",
           "Official issue #46: under a burst of mixed prompts, official ThunderAgent's smallest-first admission "
           "starves large prompts — their max TTFR exceeds vLLM's by the min effect (simulated s), paired per seed",
           a="starvation.official_large_ttfr", b="starvation.vllm_large_ttfr", kind="finding",
           refuted_by="large-prompt max TTFR within the min effect of vLLM's"),
    Better("aging_cuts_starvation",
           "The starvation fix (ours: aging c·2^(−wait/h) of new programs' keys; a new program waiting longer than a "
           "bound goes first, is never skipped, and room is made for it by pausing) lowers the large-prompt max TTFR "
           "of official ThunderAgent by the min effect (simulated s), paired per seed",
           a="starvation.aging_large_ttfr", b="starvation.official_large_ttfr", higher_is_better=False,
           kind="finding", refuted_by="a paired reduction at or below the min effect"),
    Better("aging_closes_gap_to_vllm",
           "With the fix, large prompts' max TTFR comes within the margin in params (simulated s) of vLLM's, paired per "
           "seed (the #46 complaint answered, not only reduced)",
           a="starvation.aging_large_ttfr", b="starvation.vllm_large_ttfr", higher_is_better=False, kind="finding",
           refuted_by="the fix's large-prompt max TTFR above vLLM's by more than the margin"),
    Bound("aging_keeps_throughput",
          "The fix keeps the fraction in params of official ThunderAgent's throughput where throughput is capacity-bound: "
          "the closed-loop steady-state window at the largest concurrency, paired per seed",
          value="head.aging_over_official_window", kind="finding",
          refuted_by="a per-seed window-throughput ratio aging/official at or below the bound"),
    Bound("aging_keeps_program_latency_p95",
          "In the closed loop at the largest concurrency the fix does not worsen the tail latency of whole programs: "
          "the p95 completion time (pickup → last reply) of programs picked up in the cohort window stays below the "
          "relative bound in params of official ThunderAgent's (non-inferiority, paired per seed)",
          value="latency.aging_over_official_p95", kind="finding",
          refuted_by="a per-seed p95 ratio aging/official at or above the bound"),
    Near("baselines_equal_below_capacity",
         "Sanity: below capacity (the smallest concurrency, where nothing is evicted) ThunderAgent and vLLM deliver the "
         "same steady-state throughput (ratio within the tolerance in params of 1): both policies run the same engine. "
         "It says nothing about a baseline's strength under overload (that is the tuned-baseline finding's job)",
         value="low.ta_over_vllm", kind="check",
         refuted_by="a ratio outside the band at low load (the engines would differ by construction)"),
    Claim("engine_exact", "The real paged engine (shared prefix blocks, LRU tail trims) replaying the simulator's traces "
          "generates exactly the dense model's greedy tokens, within its block pool (the replayed traces contain no "
          "preemption, so this check does not exercise the engine's preemption/recompute path)",
          "engine.mismatches == 0 and engine.steps_done == engine.steps_total", kind="check",
          refuted_by="any generated token differing from the dense uncached greedy choice, or an unfinished program"),
    Claim("cost_model_heldout", "The simulator's cost model fitted to the real engine's timed prefills and decode chunks "
          "predicts the engine's time on held-out traces (other workloads, scheduled by the simulator with the fitted "
          "model) within the relative error in params", "cost_fit.heldout_total_rel_err <= param.max", kind="check",
          wallclock=True, refuted_by="a held-out total-time relative error above the bound"),
]

LABEL = {"vllm": "vLLM-like (FCFS+LRU)", "continuum": "Continuum-like (TTL pin, tuned)", "thunderagent": "ThunderAgent",
         "thunderagent_official_marks": "ThunderAgent (official-code marks)", "thunderagent_aging": "ThunderAgent + aging fix"}
COLOR = {"vllm": "C0", "continuum": "C1", "thunderagent": "C2", "thunderagent_aging": "C3",
         "thunderagent_official_marks": "C4"}
EVERY_N = ("vllm", "continuum", "thunderagent", "thunderagent_official_marks")   # arms run at every N of the sweep


class Config(ReportConfig):
    pass


def _m(v):
    x = np.array([np.nan if e is None else e for e in v], dtype=float)
    return float(np.nanmean(x)) if np.isfinite(x).any() else float("nan")


def _ns(block: dict) -> list[int]:
    return sorted(int(k[1:]) for k in block)


def run(cfg: Config, ctx: StageContext) -> None:
    cpu0 = time.process_time()
    ev = read_json(ctx.input("evaluate") / "results.json")
    tr = ctx.input("train")
    fit, eng = read_json(tr / "fit.json"), read_json(tr / "engine.json")
    head, seeds = ev["headline_regime"], ev["seeds"]
    sw = ev["sweep"]
    H = sw[head]
    ns = _ns(H["vllm"])
    top = f"N{ns[-1]}"

    def win(block, a, n):
        return block[a][f"N{n}"]["window_steps_per_min"]

    def per_seed_peak(block, a, nn):
        return [max(win(block, a, n)[i] for n in nn) for i in range(len(win(block, a, nn[0])))]

    vpeak, tpeak = per_seed_peak(H, "vllm", ns), per_seed_peak(H, "thunderagent", ns)
    vmean = [_m(win(H, "vllm", n)) for n in ns]
    n_star = ns[int(np.argmax(vmean))]
    dem = ev["demand"][head]["demand_over_capacity"]
    card = [r for r in sw if r != head]
    card_metrics = {}
    for r in card:
        cns = _ns(sw[r]["vllm"])
        card_metrics = {"ta_over_vllm": [a / b for a, b in zip(win(sw[r], "thunderagent", cns[-1]),
                                                                  win(sw[r], "vllm", cns[-1]))],
                        "ta_over_continuum": [a / b for a, b in zip(win(sw[r], "thunderagent", cns[-1]),
                                                                       win(sw[r], "continuum", cns[-1]))],
                        "regime": r, "concurrency": cns[-1]}
    ta_top = win(H, "thunderagent", ns[-1])
    om_top = win(H, "thunderagent_official_marks", ns[-1])
    cpeak = per_seed_peak(H, "continuum", ns)
    same_n = [max(b, c) for b, c in zip(win(H, "vllm", ns[-1]), win(H, "continuum", ns[-1]))]
    strongest = [max(a, b) for a, b in zip(vpeak, cpeak)]   # oracle admission cap: best N per seed, either baseline
    vpeak_n = [ns[int(np.argmax([win(H, "vllm", n)[i] for n in ns]))] for i in range(len(seeds))]
    cpeak_n = [ns[int(np.argmax([win(H, "continuum", n)[i] for n in ns]))] for i in range(len(seeds))]
    lat = ev["latency"]
    sens = ev["sensitivity"]
    st_seeds = ev["starvation"]["seeds"]
    st = {a: b for a, b in ev["starvation"].items() if a != "seeds"}
    mk = ev["makespan"]
    valid = all(all(b["window_valid"]) for r in sw.values() for a in r.values() for b in a.values())
    metrics = {
        "seeds": seeds, "concurrency": ns, "headline_regime": head, "window_s": ev["cfg"]["window_s"],
        "windows_valid": valid, "collapse_point_programs": n_star,
        "collapse_point_demand_over_capacity": dem[f"N{n_star}"],
        "head": {"ta_over_vllm": [a / b for a, b in zip(win(H, "thunderagent", ns[-1]), win(H, "vllm", ns[-1]))],
                 "ta_over_best_baseline_same_n": [a / b for a, b in zip(ta_top, same_n)],
                 "ta_over_continuum_tuned": [a / b for a, b in zip(ta_top, win(H, "continuum", ns[-1]))],
                 "ta_over_capped_vllm": [a / b for a, b in zip(ta_top, vpeak)],
                 "ta_over_capped_continuum": [a / b for a, b in zip(ta_top, cpeak)],
                 "ta_over_strongest_tuned": [a / b for a, b in zip(ta_top, strongest)],
                 "vllm_peak_n": vpeak_n, "continuum_peak_n": cpeak_n,
                 "continuum_ttl_s": ev["pilot"][head]["chosen_ttl_s"],
                 "official_marks_over_vllm": [a / b for a, b in zip(om_top, win(H, "vllm", ns[-1]))],
                 "official_marks_over_strongest_tuned": [a / b for a, b in zip(om_top, strongest)],
                 "official_marks_over_paper_marks": [a / b for a, b in zip(om_top, ta_top)],
                 "aging_over_official_window": [a / b for a, b in zip(win(H, "thunderagent_aging", ns[-1]), ta_top)],
                 "vllm_over_peak": [a / b for a, b in zip(win(H, "vllm", ns[-1]), vpeak)],
                 "ta_over_peak": [a / b for a, b in zip(win(H, "thunderagent", ns[-1]), tpeak)],
                 "ta_reuse": H["thunderagent"][top]["kv_reuse_rate"], "vllm_reuse": H["vllm"][top]["kv_reuse_rate"],
                 "ta_hit_official": H["thunderagent"][top]["kv_hit_rate"],
                 "ta_ttfr_p95": H["thunderagent"][top]["window_ttfr_p95_s"],
                 "aging_ttfr_p95": H["thunderagent_aging"][top]["window_ttfr_p95_s"],
                 "vllm_ttfr_p95": H["vllm"][top]["window_ttfr_p95_s"]},
        "low": {"ta_over_vllm": [a / b for a, b in zip(win(H, "thunderagent", ns[0]), win(H, "vllm", ns[0]))]},
        "makespan": {"ta_over_vllm": [a / b for a, b in zip(mk["thunderagent"][top]["steps_per_min"],
                                                              mk["vllm"][top]["steps_per_min"])]},
        "card": card_metrics,
        # (recomputed + 1) / (recomputed + 1): the +1 token keeps the ratio defined when nothing is recomputed
        "victims": {"longest_over_shortest": [(a + 1) / (b + 1) for a, b in zip(
                        ev["victims"]["longest"]["recomputed_tokens"], ev["victims"]["shortest"]["recomputed_tokens"])],
                    "random_over_shortest": [(a + 1) / (b + 1) for a, b in zip(
                        ev["victims"]["random"]["recomputed_tokens"], ev["victims"]["shortest"]["recomputed_tokens"])],
                    "recomputed_tokens": {o: v["recomputed_tokens"] for o, v in ev["victims"].items()}},
        "starvation": {"official_large_ttfr": st["thunderagent"]["large_ttfr_max_s"],
                       "aging_large_ttfr": st["thunderagent_aging"]["large_ttfr_max_s"],
                       "vllm_large_ttfr": st["vllm"]["large_ttfr_max_s"],
                       "aging_over_official_makespan_throughput": [
                           a / b for a, b in zip(st["thunderagent_aging"]["steps_per_min"], st["thunderagent"]["steps_per_min"])],
                       "seeds": st_seeds},
        "latency": {"aging_over_official_p95": [a / b for a, b in zip(lat["thunderagent_aging"]["p95_s"],
                                                                      lat["thunderagent"]["p95_s"])],
                    "ta_over_vllm_p95": [a / b for a, b in zip(lat["thunderagent"]["p95_s"], lat["vllm"]["p95_s"])],
                    **{a: lat[a] for a in ("vllm", "thunderagent", "thunderagent_aging")},
                    "cohort_s": lat["cohort_s"], "stop_s": lat["stop_s"]},
        "pilot": ev["pilot"],
        "sensitivity": {k: {**v, "ta_over_vllm": [a / b for a, b in zip(v["thunderagent"], v["vllm"])]}
                        for k, v in sens.items()},
        "engine": {"mismatches": sum(e["mismatches"] for e in eng.values()),
                   "steps_done": sum(e["steps_done"] for e in eng.values()),
                   "steps_total": sum(e["steps_total"] for e in eng.values()),
                   "generated_tokens": sum(e["generated_tokens"] for e in eng.values()), "per_trace": eng},
        "cost_fit": fit,
        "cost_model_gpu": ev["cost_model"],
        # raw per-run data: a non-finite number (e.g. TTFR of a window nobody started in) is written as null
        "sweep": finite_json(sw), "makespan_runs": finite_json(mk), "demand": ev["demand"],
        "official": finite_json(ev["official"]),
    }
    rep = Report(ctx, "ThunderAgent: program-aware agentic inference (thunderagent)", CLAIM)
    cm = ev["cost_model"]
    cl = ev["cluster"]
    reg = ev["regimes"]
    w0, w1 = ev["cfg"]["window_s"]
    rep.section("Setup", f"""
**What runs.** One scheduling module (`stages/thunderagent/policy.py`) implements ThunderAgent (capacity rule
Σ_R c + w·Σ_A c + 100 per program with w = 1, no acting decay, as in the official serving runs; pause shortest ACTING
first, then mark shortest REASONING; resume Reasoning > New > Acting, smallest first with skip, Best-Fit-Decreasing
onto the roomiest backend; one global pool; new programs start only when the pool is empty; forced resume after
1,800 s). It follows the official code except on one point: **pause marks lower the remaining capacity** (the paper's
algorithm; headline arm), while the official code as read does not (`marks_lower_capacity=False`, reported as its own
arm "{LABEL['thunderagent_official_marks']}" at every N). The discrete-event simulator (`sim.py`) and the HTTP proxy
(`serve.py`) both call it. Baselines: vLLM-like (request FCFS per backend, LRU prefix cache, recompute preemption,
router = fewest programs, sticky) and Continuum-like (same router, program-level FCFS, a TTL pin during tool calls).
**Baseline tuning:** the Continuum TTL is chosen per regime from the grid {ev['cfg']['ttl_grid_s']} s (params) on the
pilot seeds {ev['pilot'][head]['pilot_seeds']} (disjoint from the evaluation seeds) at the regime's largest N:
{', '.join(f"`{r}` {p['chosen_ttl_s']:g} s" for r, p in ev['pilot'].items())}; vLLM is also reported with an oracle
admission cap (its best N of the sweep, per seed).

**Cluster and cost model.** {cl['backends']} backends × {cl['kv_capacity_tokens']:,} KV tokens. Iteration time
a + b·(KV read) + p·(prefill) + q·(prefill·context) with a = {cm['cost_model']['a'] * 1e3:.2f} ms,
b = {cm['cost_model']['b']:.3g} s/token, p = {cm['cost_model']['p']:.3g} s/token, q = {cm['cost_model']['q']:.3g} s
— arithmetic on cited numbers (see *Cost model*). All times below are **{SIM}** of the simulator, not wall-clock.

**Closed-loop sweep (headline).** N ∈ {ns} workers ({len(seeds)} seeds) run a task list as the official benchmark's
worker pools (`--num_workers 1..64` in the official SWE-agent profile): each finished program's worker starts the
next one; the first N are started warm (each resumed at a random step of its trajectory) so the pool begins near its
steady mix. **Throughput = LLM calls completed in the window [{w0:g}, {w1:g}) s per minute** — the official
steady-state metric (official windows: 10–70 min mini-swe-agent, 600–7,800 s ToolOrchestra), a common window for
every policy; every run's worker pool stayed full through it: {valid}. TTFR = arrival → first reply of the programs
started in the window. Secondary metric: calls ÷ makespan of a closed burst of the first N programs. Per-program
latency: completion time (pickup → last reply) of the programs picked up in [{lat['cohort_s'][0]:g},
{lat['cohort_s'][1]:g}) s at N = {ns[-1]}, runs continued to {lat['stop_s']:g} s.

**Workload regimes.** Headline `{head}`: {reg[head]['source']}. Second regime `{', '.join(card)}`:
{reg[card[0]]['source'] if card else ''} ({len(reg[card[0]]['seeds']) if card else 0} seeds). Mean context per call
c̄ = {ev['demand'][head]['mean_context_tokens']:,.0f} tokens (headline), so demand/capacity = N·c̄ / (backends·C)
ranges {min(dem.values()):.2f}–{max(dem.values()):.2f} over the sweep.

**Starvation study (#46).** {len(st_seeds)} burst seeds; {sum(st['vllm']['n_large']) // len(st_seeds)} large (≥ {ev['cfg']['large_prompt_tokens']}
tokens) prompts on average among a burst of 1.4k–8k-token programs at t = 0 plus a stream of small ones, on one
backend; fix (ours) = aging of the new-program key (c·2^(−wait/{ev['cfg']['aging_half_life_s']:g} s)) + a new program
waiting > {ev['cfg']['no_skip_after_s']:g} s for its first call goes first, is never skipped, and room is made for it
by pausing the shortest Acting programs. Paired per seed against official ThunderAgent and vLLM.
""")
    # ---------------------------------------------------------------- sweep table + figures
    rows = []
    for a in ("vllm", "continuum", "thunderagent", "thunderagent_official_marks", "thunderagent_aging"):
        for n in _ns(H[a]):
            b = H[a][f"N{n}"]
            m = mk.get(a, {}).get(f"N{n}")
            rows.append({"policy": LABEL[a], "programs": n, "demand/cap": dem[f"N{n}"],
                         "window steps/min": _m(b["window_steps_per_min"]),
                         "makespan steps/min": _m(m["steps_per_min"]) if m else float("nan"),
                         "TTFR p50 s": _m(b["window_ttfr_p50_s"]), "TTFR p95 s": _m(b["window_ttfr_p95_s"]),
                         "KV hit (official)": _m(b["kv_hit_rate"]), "KV reuse": _m(b["kv_reuse_rate"]),
                         "recomputed Mtok": _m(b["recomputed_tokens"]) / 1e6, "preemptions": _m(b["preemptions"]),
                         "pauses": _m(b["pauses"])})
    rep.table(f"Closed-loop sweep, regime `{head}` (means over {len(seeds)} seeds; TTFR in {SIM})", pl.DataFrame(rows))
    rep.section("Collapse point", f"""
vLLM's steady-state throughput (mean over seeds) peaks at **N = {n_star}** programs ({vmean[int(np.argmax(vmean))]:.1f} calls/min,
demand/capacity {dem[f'N{n_star}']:.2f}) and falls beyond it: {', '.join(f'N = {n}: {v:.1f}' for n, v in zip(ns, vmean))}
calls/min. At the largest N it keeps {_m(metrics['head']['vllm_over_peak']):.2f} of its per-seed peak (KV reuse
{_m(H['vllm'][top]['kv_reuse_rate']):.2f}, {_m(H['vllm'][top]['recomputed_tokens']) / 1e6:.1f} M tokens recomputed in the
run), while ThunderAgent keeps {_m(metrics['head']['ta_over_peak']):.2f} of its peak (reuse
{_m(H['thunderagent'][top]['kv_reuse_rate']):.2f}). Ratio ThunderAgent/vLLM at N = {ns[-1]}: window
{_m(metrics['head']['ta_over_vllm']):.2f}×, makespan {_m(metrics['makespan']['ta_over_vllm']):.2f}×.
""")
    hm = metrics["head"]

    def _ps(v):
        return ", ".join(f"{x:.3f}" for x in v)
    rep.section("Against each baseline", f"ThunderAgent's window calls/min at N = {ns[-1]} divided by each baseline's, "
                f"per seed (seeds {seeds}); the oracle cap takes each baseline at its best N of the sweep, per seed.")
    rep.table(f"ThunderAgent at N = {ns[-1]} vs each baseline",
              pl.DataFrame([
                  {"baseline": "vLLM at the same N", "per-seed ratio": _ps(hm["ta_over_vllm"]),
                   "mean": _m(hm["ta_over_vllm"])},
                  {"baseline": f"Continuum, tuned TTL {hm['continuum_ttl_s']:g} s, same N",
                   "per-seed ratio": _ps(hm["ta_over_continuum_tuned"]), "mean": _m(hm["ta_over_continuum_tuned"])},
                  {"baseline": f"vLLM with an oracle admission cap (best N per seed: {hm['vllm_peak_n']})",
                   "per-seed ratio": _ps(hm["ta_over_capped_vllm"]), "mean": _m(hm["ta_over_capped_vllm"])},
                  {"baseline": f"Continuum (tuned TTL) with an oracle cap (best N: {hm['continuum_peak_n']})",
                   "per-seed ratio": _ps(hm["ta_over_capped_continuum"]), "mean": _m(hm["ta_over_capped_continuum"])},
                  {"baseline": "strongest tuned baseline (max of the above; the finding)",
                   "per-seed ratio": _ps(hm["ta_over_strongest_tuned"]), "mean": _m(hm["ta_over_strongest_tuned"])},
                  {"baseline": "— official-code pause marks (ThunderAgent arm) vs vLLM at the same N",
                   "per-seed ratio": _ps(hm["official_marks_over_vllm"]), "mean": _m(hm["official_marks_over_vllm"])},
                  {"baseline": "— official-code pause marks vs the strongest tuned baseline",
                   "per-seed ratio": _ps(hm["official_marks_over_strongest_tuned"]),
                   "mean": _m(hm["official_marks_over_strongest_tuned"])},
                  {"baseline": "— official-code marks ÷ paper's marks (ThunderAgent's own cost of the rule)",
                   "per-seed ratio": _ps(hm["official_marks_over_paper_marks"]),
                   "mean": _m(hm["official_marks_over_paper_marks"])}]))
    prow = [{"regime": r, "TTL s": float(t), "pilot seeds": str(p["pilot_seeds"]), "N": p["concurrency"],
             "Continuum calls/min (mean over pilot seeds)": _m(v), "chosen": float(t) == p["chosen_ttl_s"]}
            for r, p in ev["pilot"].items() for t, v in sorted(p["window_steps_per_min"].items(), key=lambda kv: float(kv[0]))]
    rep.table("Continuum TTL pilot (pilot seeds only)",
              pl.DataFrame(prow))
    srow = []
    for k, v in metrics["sensitivity"].items():
        srow.append({"MFU (prefill)": v["mfu"], "decode BW efficiency": v["bw_efficiency"],
                     "vLLM calls/min": _m(v["vllm"]), "ThunderAgent calls/min": _m(v["thunderagent"]),
                     "TA/vLLM per seed": _ps(v["ta_over_vllm"]), "TA/vLLM mean": _m(v["ta_over_vllm"])})
    if srow:
        rep.section("Cost-model sensitivity", f"The two ASSUMED GPU efficiencies (prefill MFU, decode fraction of HBM "
                    f"bandwidth) over a grid fixed in params, N = {ns[-1]}, seeds "
                    f"{seeds[:len(next(iter(metrics['sensitivity'].values()))['vllm'])]}; every other number in this report "
                    f"uses MFU {ev['cfg']['cost']['mfu']:g}, BW {ev['cfg']['cost']['bw_efficiency']:g}.")
        rep.table("Cost-model sensitivity: TA/vLLM at the largest N", pl.DataFrame(srow))
    lrow = []
    for a in ("vllm", "thunderagent", "thunderagent_aging"):
        b = lat[a]
        lrow.append({"arm": LABEL[a], "cohort programs": _m(b["cohort"]), "censored": sum(b["censored"]),
                     "p50 s": _m(b["p50_s"]), "p90 s": _m(b["p90_s"]), "p95 s": _m(b["p95_s"]), "p99 s": _m(b["p99_s"]),
                     "max s": _m(b["max_s"]), "forced resumes": _m(b["forced_resumes"]),
                     "task list lasted": all(b["list_lasted"])})
    rep.section("Per-program latency", f"Completion time (pickup → last reply, {SIM}) of the programs picked up in "
                f"[{lat['cohort_s'][0]:g}, {lat['cohort_s'][1]:g}) s at N = {ns[-1]}, runs continued to {lat['stop_s']:g} s; "
                "means over seeds of per-seed quantiles; a censored (unfinished) program counts its time so far.")
    rep.table("Per-program completion time at the largest N", pl.DataFrame(lrow))
    fig, ax = plt.subplots(1, 3, figsize=(15, 4))
    plot_rows, mk_rows, reuse_rows = [], [], []
    for a in EVERY_N:
        y = [_m(win(H, a, n)) for n in ns]
        e = [np.std(win(H, a, n), ddof=1) / np.sqrt(len(seeds)) if len(seeds) > 1 else 0 for n in ns]
        ax[0].errorbar(ns, y, yerr=e, marker="o", label=LABEL[a], color=COLOR[a])
        plot_rows += [{"programs": n, "policy": LABEL[a], "steps_per_min": v} for n, v in zip(ns, y)]
        reuse_rows += [{"programs": n, "policy": LABEL[a], "kv_reuse": _m(H[a][f"N{n}"]["kv_reuse_rate"])} for n in ns]
        if a in mk:
            ym = [_m(mk[a][f"N{n}"]["steps_per_min"]) for n in ns]
            ax[1].plot(ns, ym, marker="o", label=LABEL[a], color=COLOR[a])
            mk_rows += [{"programs": n, "policy": LABEL[a], "steps_per_min": v} for n, v in zip(ns, ym)]
    ax[0].axvline(n_star, color="k", ls=":", lw=0.8)
    for k, (t, yl) in enumerate((("steady-state window (headline)", "calls / min in the window"),
                                 ("closed burst (secondary)", "calls ÷ makespan, per min"))):
        ax[k].set_xscale("log", base=2)
        ax[k].set_xlabel("concurrent programs N (log)")
        ax[k].set_ylabel(yl)
        ax[k].set_title(f"regime {head}: {t}")
        ax[k].legend(fontsize=7)
    for r in card:
        cns = _ns(sw[r]["vllm"])
        for a in ("vllm", "thunderagent"):
            ax[2].plot(cns, [_m(win(sw[r], a, n)) for n in cns], marker="s", label=LABEL[a], color=COLOR[a])
        ax[2].set_xscale("log", base=2)
        ax[2].set_title(f"regime {r} (card): steady-state window")
        ax[2].set_xlabel("concurrent programs N (log)")
        ax[2].set_ylabel("calls / min in the window")
        ax[2].legend(fontsize=7)
    rep.figure("throughput_vs_concurrency", fig,
               f"Throughput vs concurrency (mean ± s.e. over seeds): the dotted line marks vLLM's peak (N = {n_star}); "
               f"right: the card's regime, where no collapse occurs.")
    rep.plot("throughput_vs_concurrency", pl.DataFrame(plot_rows), x="programs", y="steps_per_min", series="policy",
             title=f"steady-state window calls/min vs concurrent programs (regime {head})")
    rep.plot("makespan_throughput_vs_concurrency", pl.DataFrame(mk_rows), x="programs", y="steps_per_min",
             series="policy", title="calls/min over a closed burst's makespan vs concurrent programs")
    rep.plot("kv_reuse_vs_concurrency", pl.DataFrame(reuse_rows), x="programs", y="kv_reuse", series="policy",
             title="KV reuse (cached / (cached + recomputed)) vs concurrent programs")
    if card:
        r = card[0]
        cns = _ns(sw[r]["vllm"])
        crow = [{"programs": n, "policy": LABEL[a], "steps_per_min": _m(win(sw[r], a, n))}
                for a in ("vllm", "thunderagent") for n in cns]
        rep.plot("card_regime_throughput", pl.DataFrame(crow), x="programs", y="steps_per_min", series="policy",
                 title=f"regime {r}: steady-state window calls/min vs concurrent programs")
        rep.table(f"Regime `{r}` (the card's): window calls/min (means over {len(reg[r]['seeds'])} seeds; "
                  f"Continuum TTL {ev['pilot'][r]['chosen_ttl_s']:g} s, largest N only)",
                  pl.DataFrame([{"programs": n, **{LABEL[a]: (_m(win(sw[r], a, n)) if f"N{n}" in sw[r][a] else None)
                                                   for a in ("vllm", "continuum", "thunderagent")}} for n in cns]))
    # ---------------------------------------------------------------- TTFR / throughput trade-off
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.2))
    t_rows, t50_rows = [], []
    for a in EVERY_N:
        x = [_m(win(H, a, n)) for n in ns]
        p95 = [_m(H[a][f"N{n}"]["window_ttfr_p95_s"]) for n in ns]
        p50 = [_m(H[a][f"N{n}"]["window_ttfr_p50_s"]) for n in ns]
        ax[0].plot(x, p95, marker="o", color=COLOR[a], label=f"{LABEL[a]} p95")
        ax[0].plot(x, p50, marker=".", ls="--", color=COLOR[a], label=f"{LABEL[a]} p50")
        for xi, yi, n in zip(x, p95, ns):
            if n in (ns[0], ns[-1]):
                ax[0].annotate(f"N={n}", (xi, yi), fontsize=6)
        t_rows += [{"steps_per_min": xi, "policy": LABEL[a], "ttfr_p95_s": yi} for xi, yi in zip(x, p95)]
        t50_rows += [{"steps_per_min": xi, "policy": LABEL[a], "ttfr_p50_s": yi} for xi, yi in zip(x, p50)]
    ax[0].set_yscale("log")
    ax[0].set_xlabel("steady-state calls / min")
    ax[0].set_ylabel(f"TTFR ({SIM}, log)")
    ax[0].set_title("closed loop: TTFR vs throughput over N")
    ax[0].legend(fontsize=6, ncol=2)
    for a, b in st.items():
        x, y95 = np.array(b["steps_per_min"]), np.array(b["ttfr_p95_s"])
        ax[1].errorbar(_m(x), _m(b["large_ttfr_max_s"]), xerr=np.std(x), yerr=np.std(b["large_ttfr_max_s"]), fmt="s",
                       color=COLOR[a], label=f"{LABEL[a]}: large-prompt max")
        ax[1].errorbar(_m(x), _m(y95), xerr=np.std(x), yerr=np.std(y95), fmt="o", mfc="none", color=COLOR[a],
                       label=f"{LABEL[a]}: all p95")
    ax[1].set_xlabel("calls / min (makespan)")
    ax[1].set_ylabel(f"TTFR ({SIM})")
    ax[1].set_title("#46 burst (mean ± sd over seeds)")
    ax[1].legend(fontsize=6)
    rep.figure("ttfr_vs_throughput", fig, "TTFR/throughput trade-off per policy: left, the closed-loop sweep (one point per "
               "N; p95 solid, p50 dashed); right, the #46 burst.")
    rep.plot("ttfr_p95_vs_throughput", pl.DataFrame(t_rows), x="steps_per_min", y="ttfr_p95_s", series="policy",
             template="scatter", title="closed loop: p95 TTFR (simulated s) vs steady-state calls/min, one point per N")
    rep.plot("ttfr_p50_vs_throughput", pl.DataFrame(t50_rows), x="steps_per_min", y="ttfr_p50_s", series="policy",
             template="scatter", title="closed loop: p50 TTFR (simulated s) vs steady-state calls/min, one point per N")
    srows = [{"arm": LABEL[a], "large-prompt max TTFR s": _m(b["large_ttfr_max_s"]),
              "large-prompt mean TTFR s": _m(b["large_ttfr_mean_s"]), "small p95 TTFR s": _m(b["small_ttfr_p95_s"]),
              "TTFR p95 s": _m(b["ttfr_p95_s"]), "calls/min": _m(b["steps_per_min"])} for a, b in st.items()]
    rep.table(f"Starvation study (#46 burst; means over {len(seeds)} seeds, {SIM})", pl.DataFrame(srows))
    rep.plot("starvation_large_prompt_ttfr", pl.DataFrame([{"arm": LABEL[a], "large_ttfr_max_s": _m(b["large_ttfr_max_s"])}
                                                            for a, b in st.items()]),
             x="arm", y="large_ttfr_max_s", template="bar_horizontal",
             title="#46 burst: max TTFR of large prompts (simulated s), mean over seeds")
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for a, b in st.items():
        pts = np.array(b["ttfr_by_prompt"][0], dtype=float)
        ax.scatter(pts[:, 0], pts[:, 1], s=10, label=LABEL[a], color=COLOR[a], alpha=0.7)
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel(f"TTFR ({SIM})")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    rep.figure("ttfr_vs_prompt", fig, f"TTFR vs prompt size on the #46 burst (seed {seeds[0]}).")
    vt = pl.DataFrame([{"victim order": o, "recomputed Mtok": _m(v["recomputed_tokens"]) / 1e6,
                        "calls/min": _m(v["steps_per_min"])} for o, v in ev["victims"].items()])
    rep.table(f"Victim-order ablation (ThunderAgent, closed burst of {ns[-1]} programs)", vt)
    rep.plot("victim_recompute", vt.rename({"victim order": "order", "recomputed Mtok": "recomputed_mtok"}),
             x="order", y="recomputed_mtok", template="bar_horizontal", title="recomputed tokens (M) by victim order")
    # ---------------------------------------------------------------- cost model
    d = cm
    held = fit["heldout_traces"]
    rep.section("Cost model", f"""
**GPU constants (used by every simulation).** {d['gpu']['name']}: {d['gpu']['hbm_bytes_per_s'] / 1e12:.2f} TB/s,
{d['gpu']['bf16_dense_flops'] / 1e12:.1f} TFLOP/s dense BF16 — {d['gpu']['source']}. Model {d['model']['name']},
{d['model']['params'] / 1e9:.1f} B parameters, {d['model']['layers']} layers, {d['model']['heads']} heads,
{d['model']['kv_heads']} KV heads × {d['model']['head_dim']} — {d['model']['source']}. Tensor parallel
{d['deployment']['tensor_parallel']} (official config). **Assumed** (no GPU here): decode at
{d['deployment']['bw_efficiency']:.0%} of HBM bandwidth, prefill at {d['deployment']['mfu']:.0%} MFU. Hence
a = weights/(TP·BW·η) = {d['cost_model']['a'] * 1e3:.2f} ms, b = {d['kv_bytes_per_token'] / 1024:.0f} KiB per token/(TP·BW·η)
= {d['cost_model']['b']:.3g} s, p = 2·params/(TP·FLOPS·MFU) = {d['cost_model']['p']:.3g} s, q = 4·layers·heads·head_dim
/(TP·FLOPS·MFU) = {d['cost_model']['q']:.3g} s. The KV pool per backend ({cl['kv_capacity_tokens']:,} tokens) is
assumed smaller than the official config's (≈ {d['official_config_kv_pool_tokens']:,.0f} tokens at 0.8 utilisation) so
that the sweep stays affordable; the x axis's demand/capacity is what carries over.

**Fit to the real engine (validation of the form).** The tiny GPT with a paged KV cache replays simulator traces on
this CPU; {fit['n_fit_ops']} timed operations (engine workloads {fit['fit_seeds']}; {fit['timer']}) give a =
{fit['coef']['a']:.3g} s, b = {fit['coef']['b']:.3g} s, p = {fit['coef']['p']:.3g} s, q = {fit['coef']['q']:.3g} s and a
per-prefill constant r = {fit['coef']['r']:.3g} s (the CPU engine's Python overhead; 0 on the GPU, assumed).
In-sample R² {fit['fit_in_sample']['op_r2']:.3f}. **Held out** (workloads {fit['heldout_seeds']}, each scheduled by the
simulator *with the fitted model* and then executed): total-time relative error {fit['heldout_total_rel_err']:.3f}
(per trace: {', '.join(f'{k} {v["rel_err"]:.3f}' for k, v in held.items())}); per operation median |rel. err|
{fit['heldout_ops']['op_median_abs_rel_err']:.3f}, R² {fit['heldout_ops']['op_r2']:.3f}. These are wall/CPU-time
measurements on a shared machine (the claim is labelled wall-clock); the GPU constants are not validated here.
""")
    fig, ax = plt.subplots(figsize=(5, 4))
    xs = [h["measured_cpu_s"] for h in held.values()]
    ys = [h["sim_predicted_s"] for h in held.values()]
    ax.scatter(xs, ys, color="C2")
    lim = [0, max(xs + ys) * 1.1]
    ax.plot(lim, lim, "k--", lw=0.8)
    ax.set_xlabel("measured engine CPU time of a held-out trace (s)")
    ax.set_ylabel("simulator's prediction with the fitted model (s)")
    rep.figure("cost_model_heldout", fig, "Held-out traces: the simulator (fitted cost model) vs the real engine.")
    rep.section("Real scheduler (proxy)", """
`python -m stages.thunderagent.serve --backend URL --backend URL ...` runs the same policy module as an
OpenAI-compatible proxy (aiohttp): programs are named by `program_id` (body or `extra_body`) or `X-Session-ID`, as
the official code; held calls wait in the proxy until a tick releases them; `GET /metrics` serves Prometheus text
(programs per state, KV estimate and capacity per backend, backend up, pauses, marks, resumes, forced resumes,
migrations, requests by outcome). `tests/thunderagent/test_serve.py` runs it on loopback in front of two processes of
the project's tiny engine (`backend_server`): a lock-step replay of a simulator trace gives a decision log identical
to the simulator's, and each call is served by the backend the policy chose; a backend killed mid-run fails its
in-flight calls with a 502 naming it while the other keeps serving. Deployment in front of vLLM / SGLang:
`stages/thunderagent/README.md`.
""")
    if ev["official"]:
        o = ev["official"]
        rep.section("Official traces", f"Converted official traces ({o['workers']} workers): ThunderAgent "
                    f"{o['thunderagent']['steps_per_min']:.1f} vs vLLM {o['vllm']['steps_per_min']:.1f} calls/min.")
    engine_rows = [{"trace": k, "generated tokens": v["generated_tokens"], "mismatches": v["mismatches"],
                    "peak blocks": max(v["peak_blocks"]), "pool blocks": max(v["pool_blocks"]),
                    "sim preemptions": v["sim_preemptions"]} for k, v in eng.items()]
    rep.table("Real engine replays (exactness against the dense model)", pl.DataFrame(engine_rows))
    rep.section("Deviations", """
| what | paper / official code | here | why |
| --- | --- | --- | --- |
| hardware, models | H100 clusters, SWE-agent-LM-32B / real agents | simulator with GPU constants derived from cited specs (two efficiencies assumed); tiny GPT on CPU for the real path | laptop scale |
| workload | real SWE-agent / OpenHands / RL rollouts | synthetic programs; headline regime takes decode and tool times from the official traces, the card's regime is run too | no traces downloaded; `official_trace.py` loads them at `full` |
| KV capacity | official config ≈ 240k tokens per TP-2 backend | 100k tokens per backend (full profile: 240k) | affordable sweep; demand/capacity reported |
| pause marks | official marks do not lower remaining capacity (all Reasoning programs get marked once Acting run out) | headline: marks lower it (the paper's algorithm); the official rule runs as its own arm at every N (`marks_lower_capacity=False`; `--official-marks` in the proxy) and both ratios are reported | the paper's algorithm is what the claim describes; the as-read official behaviour is reported, not hidden |
| Continuum baseline | Continuum predicts tool durations to set its TTL | TTL pin, TTL chosen per regime from a grid in params on pilot seeds | no tool-time predictor here |
| forced resume | official: a per-call 1,800 s timer | checked at ticks (≤ Δt late) | one code path for simulator and proxy |
| acting decay | paper: f(t)=2^(−t); official serving: off | off (`acting_decay` available, resume capacity only, as official) | matches the serving runs |
| KV hit metric | cached / prompt tokens per call | reported; the reuse claim uses cached / (cached + recomputed) | new observation tokens can never hit, so the official rate is capped below 1 here |
| Σc² victim choice | shortest-first heuristic | same; longest/random ablation | — |
| async env prep, cleanup hooks | paper only (not in repo) | simulated (prep for the next 4 queued programs; baselines free envs at the end) | — |
| starvation fix | open issue #46 | aging + no-skip-after-wait (ours) | the issue asks for a fix |
| throughput metric | calls in a 10–70 min window (mini-swe), 600–7,800 s (ToolOrchestra) | calls in [600, 2,400) s of a closed loop started warm (full profile: 10–70 min); makespan of a closed burst as secondary | affordable; the two agree within the seeds' spread here |
| proxy tokens | chars/5 with an EMA from usage; streaming progress every 20 tokens | same (`--token-estimate chars`), or the backend's /tokenize; streaming progress per chunk | exact counts on the loopback tests |
""")
    sens_r = [_m(v["ta_over_vllm"]) for v in metrics["sensitivity"].values()]
    lt = metrics["latency"]
    rep.section("Threats to validity", f"""
An independent red-team review (2026-12-01, `/work/wt/reviews/thunderagent.md`) found the first version's strongest
baseline below full strength, two aging claims that could not fail or measured the wrong thing, and an unreported
pause-mark variant. This run answers those points (tuned TTL on pilot seeds, oracle-capped baselines, both mark
rules, a closed-loop throughput ratio and a per-program tail-latency ratio for the fix, {len(st_seeds)} burst seeds,
a sensitivity grid). What remains:

- **Margins fixed after the red team saw pilot data.** The 1.1 margin of `gain_over_strongest_baseline` first appeared
  in the same commit as the first results (its pre-registration cannot be verified); it was kept unchanged when the
  baselines were strengthened. The 10 % non-inferiority margin of `aging_keeps_program_latency_p95` and the 0.95 bound
  of `aging_keeps_throughput` (paired closed-loop window) were set after the red team had seen these metrics on the
  evaluation seeds 0–2 (the paper gives no number for a starvation fix). The shortest-victim 1.05 bounds also first
  appeared with the results.
- **Baselines are tuned only as far as the grids go.** Continuum's TTL is the best of {ev['cfg']['ttl_grid_s']} s on
  {len(ev['pilot'][head]['pilot_seeds'])} pilot seeds at the largest N (a TTL-pin approximation, not Continuum's
  tool-time predictor); the oracle cap picks each baseline's best N of the sweep per seed *on the evaluation seeds*
  (favourable to the baselines); peaks are located only to the grid's resolution
  (mean peak at N = {n_star}; per-seed peaks at N = {hm['vllm_peak_n']}). In the card's regime the pilot chose
  {ev['pilot'][card[0]]['chosen_ttl_s'] if card else float('nan'):g} s, the grid's edge
  (`card`: {', '.join(f"{float(t):g} s {_m(v):.1f}" for t, v in sorted(ev['pilot'][card[0]]['window_steps_per_min'].items(), key=lambda kv: float(kv[0]))) if card else ''} calls/min
  on the pilot seeds), so Continuum there may be under-tuned; no finding reads it.
- **Independent re-run (outside the pipeline, evaluation seed 7, never used above).** Workload files written through
  the public format and run with `python -m stages.thunderagent.simulate --workers N --window 600 2400 --stop-at 2700`
  (Continuum through the Python API, TTL 5 s, since the CLI has no TTL flag): ThunderAgent N = 96 93.6 calls/min;
  vLLM N = 10 87.2, N = 12 86.6; Continuum N = 10 88.0, N = 12 93.5 — ThunderAgent ÷ strongest tuned baseline
  1.00, ÷ capped vLLM 1.07, consistent with the evaluation seeds. The per-seed ratios of the strongest-baseline table
  were also recomputed from the raw sweep in `metrics.json` with separate code (identical).
- **Pause-mark rule.** The headline uses the paper's rule (marks lower the remaining capacity). The official code as
  read does not; that arm reaches {_m(hm['official_marks_over_paper_marks']):.2f}× the paper-rule throughput at
  N = {ns[-1]}, i.e. {_m(hm['official_marks_over_vllm']):.2f}× vLLM and {_m(hm['official_marks_over_strongest_tuned']):.2f}×
  the strongest tuned baseline (table *ThunderAgent at N = {ns[-1]} vs each baseline*).
- **A simulator, not GPUs.** Every finding is a simulator output whose GPU constants are arithmetic on spec sheets plus
  two ASSUMED efficiencies; over the sensitivity grid the TA/vLLM ratio at N = {ns[-1]} ranges
  {min(sens_r) if sens_r else float('nan'):.2f}–{max(sens_r) if sens_r else float('nan'):.2f}× (table *Cost-model
  sensitivity*): the ≥ 1.5× verdict depends on them (it weakens as prefill gets cheaper, i.e. higher MFU). The CPU fit
  validates the cost model's form on a tiny engine (contexts ≤ 512), not the GPU constants. The simulated vLLM has no
  chunked-prefill budget, CUDA-graph buckets, scheduler overheads or swap.
- **Regime dependence (found by this run).** The collapse and the gain appear in the regime whose decode lengths and
  tool times come from the official traces (short tools). In the card's regime (tools of 5–30 s, long decodes) vLLM
  does not collapse and ThunderAgent with w = 1 is *slower* (`card_regime_gain`). The headline regime was chosen after
  a pilot on seeds 100–101 (not the evaluation seeds); the red team's load of the official SWE-agent-profile traces
  (bs32 run, 64 instances: decode mean 169 tokens, ~1 s tool gaps) supports it as the regime the paper measured, but
  those traces are not in this default run (no download; `official_trace.py` loads them at `full`).
- **Latency tail.** ThunderAgent's median program latency is far below vLLM's; its tail is another matter: p95 completion
  time {_m(lt['thunderagent']['p95_s']):.0f} s vs vLLM {_m(lt['vllm']['p95_s']):.0f} s (ratio per seed
  {', '.join(f'{x:.2f}' for x in lt['ta_over_vllm_p95'])}), max {_m(lt['thunderagent']['max_s']):.0f} s vs
  {_m(lt['vllm']['max_s']):.0f} s, with ~{_m(lt['thunderagent']['forced_resumes']):.0f} forced resumes (the 1,800 s bound)
  per run: parked programs pay for the throughput (the closed-loop form of #46); the aging fix targets *new* programs
  and does not bound this: its p95 ratio to official ThunderAgent is {', '.join(f'{x:.2f}' for x in lt['aging_over_official_p95'])}
  per seed (`aging_keeps_program_latency_p95`; 5 seeds cannot resolve a spread this wide). The window metric rewards
  deferring expensive work; the makespan metric guards the mean ({_m(metrics['makespan']['ta_over_vllm']):.2f}× vs window
  {_m(metrics['head']['ta_over_vllm']):.2f}×), not the tail.
- **Claims that are nearly true by design.** `thunderagent_holds` follows from the capacity rule capping the active set
  (it could fail only through pause/migration overhead); `kv_reuse_beats_vllm` restates the collapse;
  `starvation_vs_vllm` reproduces a defect on a workload built to show it. `baselines_equal_below_capacity` runs where
  nothing can be evicted, so it checks the shared engine, not the baselines' strength; `engine_exact`'s replays contain
  no preemption. The victim-order claims count recomputed tokens, not the paper's Σc² space-time cost, and their
  throughput effect is small (victim table).
- **The starvation fix was redesigned once, on pilot seeds 100–102** (not the evaluation seeds): the first version
  (aging + "never skip" without making room) left large-prompt TTFR unchanged and raised closed-loop p95 TTFR ~5×;
  the version measured here makes room for the oldest starving *new* program only. Its thresholds (60 s half-life,
  120 s bound) were not tuned. The #46 burst is an open-loop stream whose makespan is fixed by the arrivals, so
  throughput on it cannot show a cost (the makespan ratio is reported, not claimed).
- **Seeds.** Findings use {len(seeds)} workload seeds (card regime {len(reg[card[0]]['seeds']) if card else 0}; #46 burst
  {len(st_seeds)}); simulated metrics are deterministic given a seed, so the spread is across workloads only.
- **The real path.** The proxy is tested on loopback in front of the tiny CPU engine (no prefix cache, one request at
  a time), not in front of real vLLM/SGLang (no GPU or network here); its default token estimate is the official
  characters ÷ ratio heuristic, which can mis-size programs in a real deployment.
- **Not reproduced:** disk savings (4.2×), RL rollout throughput, real tool environments.
""")
    cpu = time.process_time() - cpu0
    rep.section("CPU time", "Process CPU time per stage (this run; wall-clock above includes waiting for the shared "
                "machine's 2 cores): " + ", ".join(f"{k} {v:.1f} s" for k, v in _stage_cpu(ctx).items())
                + f", report {cpu:.1f} s.")
    rep.finish(CLAIMS, metrics, wallclock=("cost_fit",))


def _stage_cpu(ctx) -> dict:
    from stages.common.paths import stage_dir

    out = {}
    for s in ("prepare", "train", "evaluate"):
        f = stage_dir(ctx.slug, s, ctx.root).parent / f"{s}.cpu.json"
        if f.exists():
            out[s] = float(read_json(f)["cpu_s"])
    return out
