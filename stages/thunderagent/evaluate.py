"""evaluate: policy sweep over concurrency, victim-order ablation, starvation (#46) study.

Every workload is read back through the public format (workload.load_workload). Writes results.json:
sweep[policy][N] = per-seed lists of steps/min, KV hit rate, KV reuse rate, recomputed tokens, TTFR;
victims[order] at the largest N; starvation[arm] on the burst workloads. The simulator's cost model
is the nominal (GPU-scale) one of sim.CostModel, so the metrics are deterministic; the CPU fit from
train is reported beside it, not used (see the report's Deviations).
"""
from __future__ import annotations

from pydantic import Field

from stages.common.config import StageConfig
from stages.common.paths import read_json, write_json
from stages.common.runner import StageContext
from stages.thunderagent.sim import SchedConfig, simulate
from stages.thunderagent.workload import load_workload

KEYS = ("steps_per_min", "kv_hit_rate", "kv_reuse_rate", "recomputed_tokens", "preemptions", "pauses", "migrations",
        "ttfr_p50_s", "ttfr_p95_s", "ttfr_max_s", "memory_imbalance", "peak_live_envs", "env_seconds")


class Config(StageConfig):
    tick_s: float = Field(5.0, gt=0, le=600)
    ttl_s: float = Field(15.0, ge=0, le=3600, description="Continuum TTL pin")
    aging_half_life_s: float = Field(60.0, gt=0, le=3600, description="starvation fix: key c·2^{-wait/h}")
    no_skip_after_s: float = Field(120.0, gt=0, le=3600, description="starvation fix: never skip a program waiting longer")
    ttfr_bound_s: float = Field(300.0, gt=0, le=10_000, description="claimed TTFR bound under the fix")
    large_prompt_tokens: int = Field(6000, ge=1, le=10**6, description="'large' programs of the #46 study")


def _collect(rows: list[dict]) -> dict:
    return {k: [r[k] for r in rows] for k in KEYS}


def run(cfg: Config, ctx: StageContext) -> None:
    prep = ctx.input("prepare")
    meta = read_json(prep / "meta.json")
    seeds, ns = meta["seeds"], meta["concurrency"]
    base = SchedConfig(tick_s=cfg.tick_s, ttl_s=cfg.ttl_s)
    sweep = {}
    for pol in ("vllm", "continuum", "thunderagent"):
        sweep[pol] = {}
        for n in ns:
            rows = [simulate(load_workload(prep / meta["sweep"][f"n{n}_s{s}"]), pol, sched=base, seed=s) for s in seeds]
            sweep[pol][f"N{n}"] = _collect(rows)
            ctx.tracker.log({f"{pol}/N{n}/steps_per_min": sum(sweep[pol][f"N{n}"]["steps_per_min"]) / len(seeds)})
    nmax = ns[-1]
    victims = {}
    for order in ("shortest", "longest", "random"):
        sc = SchedConfig(tick_s=cfg.tick_s, victim_order=order)
        rows = [simulate(load_workload(prep / meta["sweep"][f"n{nmax}_s{s}"]), "thunderagent", sched=sc, seed=s)
                for s in seeds]
        victims[order] = _collect(rows)
    arms = {"thunderagent_official": SchedConfig(tick_s=cfg.tick_s),
            "thunderagent_aging": SchedConfig(tick_s=cfg.tick_s, aging_half_life_s=cfg.aging_half_life_s,
                                              no_skip_after_s=cfg.no_skip_after_s)}
    starvation = {}
    for arm, sc in list(arms.items()) + [("vllm", base)]:
        pol = "vllm" if arm == "vllm" else "thunderagent"
        rows = [simulate(load_workload(prep / meta["burst"][str(s)]), pol, sched=sc, seed=s) for s in seeds]
        block = _collect(rows)
        big = [[t for c, t in r["ttfr_by_prompt"] if c >= cfg.large_prompt_tokens] for r in rows]
        block["large_ttfr_max_s"] = [max(b) if b else 0.0 for b in big]
        block["ttfr_by_prompt"] = [r["ttfr_by_prompt"] for r in rows]
        starvation[arm] = block
    write_json(ctx.out / "results.json", {"seeds": seeds, "concurrency": ns, "sweep": sweep, "victims": victims,
                                          "starvation": starvation, "cfg": cfg.model_dump()})
