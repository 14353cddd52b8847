"""evaluate: concurrency sweep to the collapse (official steady-state window metric), makespan runs, victim-order
ablation, starvation (#46) study with the aging fix, and the official trace (full profile).

Every workload is read back through the public format (workload.load_workload). The cost model is
costmodel.gpu_cost_model (GPU constants with their sources; the deployment knobs from params), so every
number here is deterministic and in *simulated* seconds. Writes results.json:

- sweep[regime][arm]["N<n>"]: per-seed lists of the closed-loop run with n workers (first n started warm):
  window_steps_per_min (calls completed in [w0, w1) per minute — the headline), window_valid, TTFR
  p50/p95 of fresh programs picked up in the window, KV hit / reuse, recomputed tokens, pauses, ...
- makespan[arm]["N<n>"]: a closed burst of the first n programs of the same task list: calls ÷ makespan.
- victims[order]: ThunderAgent on the closed burst at the largest n with shortest/longest/random victims.
- starvation[arm]: the #46 burst under vLLM, official ThunderAgent and ThunderAgent with the aging fix.
- official[arm] (only when prepare converted an official trace directory).
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from stages.common.config import StageConfig
from stages.common.paths import read_json, write_json
from stages.common.runner import StageContext
from stages.thunderagent import record_cpu
from stages.thunderagent.costmodel import Deployment, gpu_cost_model
from stages.thunderagent.sim import SchedConfig, simulate
from stages.thunderagent.workload import Workload, load_workload, warm_start

KEYS = ("window_steps_per_min", "window_valid", "window_ttfr_p50_s", "window_ttfr_p95_s", "window_programs",
        "window_ttfr_censored", "calls", "kv_hit_rate", "kv_reuse_rate", "recomputed_tokens", "preemptions", "pauses",
        "marks", "migrations", "forced_resumes", "memory_imbalance", "peak_live_envs", "env_seconds")
MAKESPAN_KEYS = ("steps_per_min", "makespan_s", "kv_hit_rate", "kv_reuse_rate", "recomputed_tokens", "preemptions",
                 "pauses", "ttfr_p50_s", "ttfr_p95_s", "ttfr_max_s", "memory_imbalance", "peak_live_envs",
                 "env_seconds", "migrations")


class CostCfg(StageConfig):
    tensor_parallel: int = Field(2, ge=1, le=64, description="official vllm_batch_32B.yaml")
    bw_efficiency: float = Field(0.7, gt=0, le=1.0, description="ASSUMED decode fraction of HBM bandwidth")
    mfu: float = Field(0.4, gt=0, le=1.0, description="ASSUMED prefill model-FLOPs utilisation")


class Config(StageConfig):
    tick_s: float = Field(5.0, gt=0, le=600)
    ttl_s: float = Field(15.0, ge=0, le=3600, description="Continuum TTL pin")
    aging_half_life_s: float = Field(60.0, gt=0, le=3600, description="starvation fix: key c·2^{-wait/h}")
    no_skip_after_s: float = Field(120.0, gt=0, le=3600,
                                   description="starvation fix: a new program waiting longer goes first, room is made")
    large_prompt_tokens: int = Field(6000, ge=1, le=10**6, description="'large' programs of the #46 study")
    window_s: list[float] = Field(default=[600.0, 2400.0], min_length=2, max_length=2,
                                  description="steady-state window [w0, w1) in simulated s (official: 10-70 min)")
    grace_s: float = Field(300.0, ge=0, le=7200, description="run past w1 so programs picked up late can reply")
    victim_orders: list[Literal["shortest", "longest", "random"]] = Field(default=["shortest", "longest", "random"],
                                                                         min_length=1)
    cost: CostCfg = Field(default_factory=CostCfg)

    @model_validator(mode="after")
    def _w(self):
        if not 0 < self.window_s[0] < self.window_s[1] <= 10**6:
            raise ValueError(f"window_s: need 0 < w0 < w1 <= 1e6 (got {self.window_s})")
        return self


def arms(cfg: Config) -> dict[str, tuple[str, SchedConfig]]:
    base = SchedConfig(tick_s=cfg.tick_s, ttl_s=cfg.ttl_s)
    aging = SchedConfig(tick_s=cfg.tick_s, ttl_s=cfg.ttl_s, aging_half_life_s=cfg.aging_half_life_s,
                        no_skip_after_s=cfg.no_skip_after_s)
    return {"vllm": ("vllm", base), "continuum": ("continuum", base), "thunderagent": ("thunderagent", base),
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


def run(cfg: Config, ctx: StageContext) -> None:
    _run(cfg, ctx)
    record_cpu(ctx)


def _run(cfg: Config, ctx: StageContext) -> None:
    prep = ctx.input("prepare")
    meta = read_json(prep / "meta.json")
    cost, derivation = gpu_cost_model(dep=Deployment(tensor_parallel=cfg.cost.tensor_parallel,
                                                     bw_efficiency=cfg.cost.bw_efficiency, mfu=cfg.cost.mfu))
    A = arms(cfg)
    w0, w1 = cfg.window_s
    head = meta["headline_regime"]
    sweep, makespan, demand = {}, {}, {}
    tasks_head = {}
    for regime, info in meta["regimes"].items():
        is_head = regime == head
        names = list(A) if is_head else ["vllm", "thunderagent"]
        ns, seeds = info["concurrency"], info["seeds"]
        rows = {a: {n: [] for n in ns} for a in names}
        mrows = {a: {n: [] for n in ns} for a in ("vllm", "continuum", "thunderagent")} if is_head else {}
        cbar = []
        for s in seeds:
            tasks = load_workload(prep / info["files"][str(s)])
            if is_head:
                tasks_head[s] = tasks
            cbar.append(mean_context(tasks))
            for n in ns:
                wl = warm_start(tasks, n, s)
                for a in names:
                    pol, sc = A[a]
                    rows[a][n].append(simulate(wl, pol, cost, sc, seed=s, workers=n, window_s=(w0, w1),
                                               stop_at_s=w1 + cfg.grace_s))
                for a in mrows:
                    pol, sc = A[a]
                    mrows[a][n].append(simulate(Workload(tasks.programs[:n], tasks.cluster), pol, cost, sc, seed=s))
            ctx.tracker.log({f"{regime}/seed{s}/done": 1.0})
        sweep[regime] = {a: {f"N{n}": _collect(rows[a][n], KEYS) for n in ns} for a in names}
        if is_head:
            makespan = {a: {f"N{n}": _collect(mrows[a][n], MAKESPAN_KEYS) for n in ns} for a in mrows}
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
    starvation = {}
    for a in ("vllm", "thunderagent", "thunderagent_aging"):
        pol, sc = A[a]
        rows = [simulate(load_workload(prep / meta["burst"][str(s)]), pol, cost, sc, seed=s) for s in meta["seeds"]]
        block = _collect(rows, MAKESPAN_KEYS)
        big = [[t for c, t in r["ttfr_by_prompt"] if c >= cfg.large_prompt_tokens] for r in rows]
        small = [[t for c, t in r["ttfr_by_prompt"] if c < cfg.large_prompt_tokens] for r in rows]
        block["large_ttfr_max_s"] = [max(b) if b else 0.0 for b in big]
        block["large_ttfr_mean_s"] = [sum(b) / len(b) if b else 0.0 for b in big]
        block["small_ttfr_p95_s"] = [sorted(x)[int(0.95 * (len(x) - 1))] if x else 0.0 for x in small]
        block["n_large"] = [len(b) for b in big]
        block["ttfr_by_prompt"] = [r["ttfr_by_prompt"] for r in rows]
        starvation[a] = block
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
        "regimes": {r: {k: v for k, v in i.items() if k != "files"} for r, i in meta["regimes"].items()},
        "sweep": sweep, "makespan": makespan, "victims": victims, "starvation": starvation, "demand": demand,
        "official": official, "cost_model": derivation, "cluster": meta["cluster"], "cfg": cfg.model_dump()})
