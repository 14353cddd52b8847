"""evaluate: Continuum TTL tuned on pilot seeds, concurrency sweep to the collapse (official steady-state window
metric), per-program latency runs, makespan runs, victim-order ablation, cost-model sensitivity grid,
starvation (#46) study with the aging fix, and the official trace (full profile).

Every workload is read back through the public format (workload.load_workload). The cost model is
costmodel.gpu_cost_model (GPU constants with their sources; the deployment knobs from params), so every
number here is deterministic and in *simulated* seconds. Writes results.json:

- pilot[regime]: the Continuum-like baseline's window throughput at the regime's largest N for every TTL of
  ``ttl_grid_s`` on the PILOT seeds (disjoint from the evaluation seeds), and the TTL chosen (the best mean);
  every Continuum run below uses its regime's chosen TTL.
- sweep[regime][arm]["N<n>"]: per-seed lists of the closed-loop run with n workers (first n started warm):
  window_steps_per_min (calls completed in [w0, w1) per minute — the headline), window_valid, TTFR
  p50/p95 of fresh programs picked up in the window, KV hit / reuse, recomputed tokens, pauses, ...
  Headline regime: vllm, continuum, thunderagent (paper's pause marks), thunderagent_official_marks (the
  official code's rule as read: marks do not lower the remaining capacity) at every N; thunderagent_aging at
  the largest N. Other regimes: vllm and thunderagent at every N, continuum at the largest N.
- latency[arm]: per-program completion time (pickup → last reply) of the programs picked up in
  [w0, w0 + latency_cohort_s) at the largest N, runs continued to latency_stop_s (p50/p95/p99/max, censored count).
- makespan[arm]["N<n>"]: a closed burst of the first n programs of the same task list: calls ÷ makespan.
- victims[order]: ThunderAgent on the closed burst at the largest n with shortest/longest/random victims.
- sensitivity["mfu<m>_bw<b>"]: vLLM and ThunderAgent window throughput at the largest N under other assumed
  GPU efficiencies (first k evaluation seeds).
- starvation[arm]: the #46 burst under vLLM, official ThunderAgent and ThunderAgent with the aging fix.
- official[arm] (only when prepare converted an official trace directory).
"""
from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from stages.common.config import StageConfig
from stages.common.paths import read_json, write_json
from stages.common.runner import StageContext
from stages.thunderagent import record_cpu
from stages.thunderagent.costmodel import Deployment, gpu_cost_model
from stages.thunderagent.sim import SchedConfig, Simulator, simulate
from stages.thunderagent.workload import Workload, load_workload, warm_start

KEYS = ("window_steps_per_min", "window_valid", "window_ttfr_p50_s", "window_ttfr_p95_s", "window_programs",
        "window_ttfr_censored", "calls", "kv_hit_rate", "kv_reuse_rate", "recomputed_tokens", "preemptions", "pauses",
        "marks", "migrations", "forced_resumes", "memory_imbalance", "peak_live_envs", "env_seconds")
MAKESPAN_KEYS = ("steps_per_min", "makespan_s", "kv_hit_rate", "kv_reuse_rate", "recomputed_tokens", "preemptions",
                 "pauses", "ttfr_p50_s", "ttfr_p95_s", "ttfr_max_s", "memory_imbalance", "peak_live_envs",
                 "env_seconds", "migrations")
LATENCY_ARMS = ("vllm", "thunderagent", "thunderagent_aging")


class CostCfg(StageConfig):
    tensor_parallel: int = Field(2, ge=1, le=64, description="official vllm_batch_32B.yaml")
    bw_efficiency: float = Field(0.7, gt=0, le=1.0, description="ASSUMED decode fraction of HBM bandwidth")
    mfu: float = Field(0.4, gt=0, le=1.0, description="ASSUMED prefill model-FLOPs utilisation")


class SensitivityCfg(StageConfig):
    mfu: list[float] = Field(default=[0.25, 0.4, 0.55, 0.7], min_length=1, max_length=8)
    bw_efficiency: list[float] = Field(default=[0.4, 0.7, 0.9], min_length=1, max_length=8)
    seeds: int = Field(2, ge=0, le=32, description="the first k evaluation seeds (0 = no sensitivity grid)")

    @model_validator(mode="after")
    def _r(self):
        for v in self.mfu + self.bw_efficiency:
            if not 0 < v <= 1:
                raise ValueError(f"sensitivity: efficiencies must lie in (0, 1] (got {v})")
        return self


class Config(StageConfig):
    tick_s: float = Field(5.0, gt=0, le=600)
    ttl_grid_s: list[float] = Field(default=[2.0, 5.0, 10.0, 15.0, 30.0], min_length=1, max_length=12,
                                    description="Continuum TTL pin candidates; the best on the pilot seeds is used")
    aging_half_life_s: float = Field(60.0, gt=0, le=3600, description="starvation fix: key c·2^{-wait/h}")
    no_skip_after_s: float = Field(120.0, gt=0, le=3600,
                                   description="starvation fix: a new program waiting longer goes first, room is made")
    large_prompt_tokens: int = Field(6000, ge=1, le=10**6, description="'large' programs of the #46 study")
    window_s: list[float] = Field(default=[600.0, 2400.0], min_length=2, max_length=2,
                                  description="steady-state window [w0, w1) in simulated s (official: 10-70 min)")
    grace_s: float = Field(300.0, ge=0, le=7200, description="run past w1 so programs picked up late can reply")
    latency_cohort_s: float = Field(600.0, gt=0, le=10**5,
                                    description="per-program latency: programs picked up in [w0, w0 + this)")
    latency_stop_s: float = Field(7200.0, gt=0, le=10**6, description="horizon of the per-program latency runs")
    victim_orders: list[Literal["shortest", "longest", "random"]] = Field(default=["shortest", "longest", "random"],
                                                                         min_length=1)
    cost: CostCfg = Field(default_factory=CostCfg)
    sensitivity: SensitivityCfg = Field(default_factory=SensitivityCfg)

    @model_validator(mode="after")
    def _w(self):
        if not 0 < self.window_s[0] < self.window_s[1] <= 10**6:
            raise ValueError(f"window_s: need 0 < w0 < w1 <= 1e6 (got {self.window_s})")
        if any(not 0 <= t <= 3600 for t in self.ttl_grid_s) or len(set(self.ttl_grid_s)) != len(self.ttl_grid_s):
            raise ValueError(f"ttl_grid_s: need distinct values in [0, 3600] s (got {self.ttl_grid_s})")
        if self.latency_stop_s <= self.window_s[0] + self.latency_cohort_s:
            raise ValueError("latency_stop_s: must lie after the cohort's pickup window [w0, w0 + latency_cohort_s)")
        return self


def arms(cfg: Config, ttl_s: float = 15.0) -> dict[str, tuple[str, SchedConfig]]:
    """Scheduler arms; ``ttl_s`` = the Continuum TTL chosen on the pilot seeds for the regime."""
    base = SchedConfig(tick_s=cfg.tick_s, ttl_s=ttl_s)
    aging = SchedConfig(tick_s=cfg.tick_s, aging_half_life_s=cfg.aging_half_life_s, no_skip_after_s=cfg.no_skip_after_s)
    return {"vllm": ("vllm", base), "continuum": ("continuum", base), "thunderagent": ("thunderagent", base),
            "thunderagent_official_marks": ("thunderagent", SchedConfig(tick_s=cfg.tick_s, marks_lower_capacity=False)),
            "thunderagent_aging": ("thunderagent", aging)}


def mean_context(wl: Workload) -> float:
    """Mean over all steps of all programs of the context before the call (c̄): demand/capacity = N·c̄/(B·C)."""
    tot = n = 0
    for p in wl.programs:
        c = p.prompt_tokens
        for s in p.steps:
            tot += c
            n += 1
            c += s.decode_tokens + s.obs_tokens
    return tot / max(n, 1)


def _collect(rows: list[dict], keys) -> dict:
    return {k: [r[k] for r in rows] for k in keys}


def choose_ttl(pilot: dict[str, list[float]]) -> float:
    """The TTL (key) with the highest mean pilot throughput; ties go to the smaller TTL."""
    return min((-float(np.mean(v)), float(k)) for k, v in pilot.items())[1]


def program_latency(wl: Workload, policy: str, cost, sc: SchedConfig, seed: int, n: int, cfg: Config) -> dict:
    """Closed loop with n workers run to latency_stop_s: completion time (pickup → last reply) of the programs picked
    up in [w0, w0 + latency_cohort_s); an unfinished one counts its time so far (censored, a lower bound)."""
    w0, w1 = cfg.window_s
    sim = Simulator(wl, policy, cost, sc, seed, workers=n, window_s=(w0, w1), stop_at_s=cfg.latency_stop_s)
    out = sim.run()
    lo, hi = w0, w0 + cfg.latency_cohort_s
    cohort = [p for p in sim.P if not math.isnan(p.started_at) and lo <= p.started_at < hi]
    lat = np.array([(p.end if p.phase == "done" else sim.now) - p.started_at for p in cohort], dtype=float)
    if not len(lat):
        lat = np.full(1, np.nan)
    q = {f"p{k}_s": float(np.percentile(lat, k)) for k in (50, 90, 95, 99)}
    return {**q, "max_s": float(np.max(lat)), "mean_s": float(np.mean(lat)), "cohort": len(cohort),
            "censored": sum(p.phase != "done" for p in cohort), "window_steps_per_min": out["window_steps_per_min"],
            "forced_resumes": out["forced_resumes"],
            # the task list lasted to the horizon (no worker idled before the cohort's last program finished)
            "list_lasted": bool(not (sim.exhausted_at < cfg.latency_stop_s))}


def run(cfg: Config, ctx: StageContext) -> None:
    _run(cfg, ctx)
    record_cpu(ctx)


def _run(cfg: Config, ctx: StageContext) -> None:
    prep = ctx.input("prepare")
    meta = read_json(prep / "meta.json")
    cost, derivation = gpu_cost_model(dep=Deployment(tensor_parallel=cfg.cost.tensor_parallel,
                                                     bw_efficiency=cfg.cost.bw_efficiency, mfu=cfg.cost.mfu))
    w0, w1 = cfg.window_s
    head = meta["headline_regime"]
    stop = w1 + cfg.grace_s
    sweep, makespan, demand, pilot, latency = {}, {}, {}, {}, {}
    tasks_head = {}
    for regime, info in meta["regimes"].items():
        is_head = regime == head
        ns, seeds = info["concurrency"], info["seeds"]
        nmax = ns[-1]
        # ---- Continuum TTL on the pilot seeds (never the evaluation seeds), at the regime's largest N
        ptl = {s: load_workload(prep / f) for s, f in info["pilot_files"].items()}
        runs = {f"{t:g}": [simulate(warm_start(tl, nmax, int(s)), "continuum", cost,
                                    SchedConfig(tick_s=cfg.tick_s, ttl_s=t), seed=int(s), workers=nmax,
                                    window_s=(w0, w1), stop_at_s=stop)["window_steps_per_min"]
                           for s, tl in ptl.items()] for t in cfg.ttl_grid_s}
        ttl = choose_ttl(runs)
        pilot[regime] = {"pilot_seeds": [int(s) for s in ptl], "concurrency": nmax, "window_steps_per_min": runs,
                         "chosen_ttl_s": ttl}
        ctx.tracker.log({f"{regime}/pilot_ttl_s": ttl})
        A = arms(cfg, ttl)
        every = (["vllm", "continuum", "thunderagent", "thunderagent_official_marks"] if is_head
                 else ["vllm", "thunderagent"])
        top_only = ["thunderagent_aging"] if is_head else ["continuum"]
        rows = {a: {n: [] for n in ns} for a in every}
        rows.update({a: {nmax: []} for a in top_only})
        mrows = {a: {n: [] for n in ns} for a in ("vllm", "continuum", "thunderagent")} if is_head else {}
        lat = {a: [] for a in LATENCY_ARMS} if is_head else {}
        cbar = []
        for s in seeds:
            tasks = load_workload(prep / info["files"][str(s)])
            if is_head:
                tasks_head[s] = tasks
            cbar.append(mean_context(tasks))
            for n in ns:
                wl = warm_start(tasks, n, s)
                for a in rows:
                    if n in rows[a]:
                        pol, sc = A[a]
                        rows[a][n].append(simulate(wl, pol, cost, sc, seed=s, workers=n, window_s=(w0, w1),
                                                   stop_at_s=stop))
                for a in mrows:
                    pol, sc = A[a]
                    mrows[a][n].append(simulate(Workload(tasks.programs[:n], tasks.cluster), pol, cost, sc, seed=s))
            for a in lat:
                pol, sc = A[a]
                lat[a].append(program_latency(warm_start(tasks, nmax, s), pol, cost, sc, s, nmax, cfg))
            ctx.tracker.log({f"{regime}/seed{s}/done": 1.0})
        sweep[regime] = {a: {f"N{n}": _collect(rows[a][n], KEYS) for n in rows[a]} for a in rows}
        if is_head:
            makespan = {a: {f"N{n}": _collect(mrows[a][n], MAKESPAN_KEYS) for n in ns} for a in mrows}
            latency = {a: {k: [r[k] for r in v] for k in v[0]} for a, v in lat.items()}
            latency["cohort_s"] = [w0, w0 + cfg.latency_cohort_s]
            latency["stop_s"] = cfg.latency_stop_s
            latency["workers"] = nmax
        cl = meta["cluster"]
        c = sum(cbar) / len(cbar)
        demand[regime] = {"mean_context_tokens": c,
                          "demand_over_capacity": {f"N{n}": n * c / (cl["backends"] * cl["kv_capacity_tokens"])
                                                   for n in ns}}
    nmax = meta["regimes"][head]["concurrency"][-1]
    victims = {}
    for order in cfg.victim_orders:
        sc = SchedConfig(tick_s=cfg.tick_s, victim_order=order)
        rows = [simulate(Workload(tasks_head[s].programs[:nmax], tasks_head[s].cluster), "thunderagent", cost, sc, seed=s)
                for s in meta["seeds"]]
        victims[order] = _collect(rows, MAKESPAN_KEYS)
    # ---- cost-model sensitivity: the two ASSUMED efficiencies (grid fixed in params), first k evaluation seeds
    sensitivity = {}
    ks = meta["seeds"][: cfg.sensitivity.seeds]
    for mfu in cfg.sensitivity.mfu:
        for bw in cfg.sensitivity.bw_efficiency:
            cst, _ = gpu_cost_model(dep=Deployment(tensor_parallel=cfg.cost.tensor_parallel, bw_efficiency=bw, mfu=mfu))
            cell = {"mfu": mfu, "bw_efficiency": bw}
            for a in ("vllm", "thunderagent"):
                cell[a] = [simulate(warm_start(tasks_head[s], nmax, s), a, cst, SchedConfig(tick_s=cfg.tick_s), seed=s,
                                    workers=nmax, window_s=(w0, w1), stop_at_s=stop)["window_steps_per_min"] for s in ks]
            sensitivity[f"mfu{mfu:g}_bw{bw:g}"] = cell
    starvation = {}
    A = arms(cfg)
    bseeds = sorted(int(s) for s in meta["burst"])
    for a in ("vllm", "thunderagent", "thunderagent_aging"):
        pol, sc = A[a]
        rows = [simulate(load_workload(prep / meta["burst"][str(s)]), pol, cost, sc, seed=s) for s in bseeds]
        block = _collect(rows, MAKESPAN_KEYS)
        big = [[t for c, t in r["ttfr_by_prompt"] if c >= cfg.large_prompt_tokens] for r in rows]
        small = [[t for c, t in r["ttfr_by_prompt"] if c < cfg.large_prompt_tokens] for r in rows]
        block["large_ttfr_max_s"] = [max(b) if b else 0.0 for b in big]
        block["large_ttfr_mean_s"] = [sum(b) / len(b) if b else 0.0 for b in big]
        block["small_ttfr_p95_s"] = [sorted(x)[int(0.95 * (len(x) - 1))] if x else 0.0 for x in small]
        block["n_large"] = [len(b) for b in big]
        block["ttfr_by_prompt"] = [r["ttfr_by_prompt"] for r in rows[:1]]
        starvation[a] = block
    starvation["seeds"] = bseeds
    official = {}
    if "official" in meta:
        wl = load_workload(prep / meta["official"])
        n = min(nmax, len(wl.programs))
        for a in ("vllm", "thunderagent"):
            pol, sc = A[a]
            official[a] = {k: v for k, v in simulate(wl, pol, cost, sc, workers=n).items() if k != "ttfr_by_prompt"}
        official["workers"] = n
    write_json(ctx.out / "results.json", {
        "seeds": meta["seeds"], "headline_regime": head, "concurrency": meta["regimes"][head]["concurrency"],
        "regimes": {r: {k: v for k, v in i.items() if k not in ("files", "pilot_files")} for r, i in meta["regimes"].items()},
        "pilot": pilot, "sweep": sweep, "latency": latency, "makespan": makespan, "victims": victims,
        "sensitivity": sensitivity, "starvation": starvation, "demand": demand, "official": official,
        "cost_model": derivation, "cluster": meta["cluster"], "cfg": cfg.model_dump()})
