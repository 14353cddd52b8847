"""train: run every learner on every world, horizon and seed — one batch per group of worlds.

Worlds whose learners see the same tensors (arms, θ*, probabilities; they may differ in τ, fairness
mode and effect cells) form a group; every (world, method, horizon, seed) instance of a group runs
in ONE batch of max-horizon rounds (simulate.run_group), each round one kernels.fair_round_step
call (Triton on CUDA, the torch reference on CPU; its Triton path is checked under the interpreter
on one real round). The tabular variant runs in its own batch where a world asks for it. Writes
logs_<world>.pt = {"instances": [(method, horizon, seed)], "act": (B, T) int16, "excluded":
(B, T) int8, "cert_slack": (B, T) float32, "beta": (T,)} (+ "tabular": {...}) and meta.json.
"""
from __future__ import annotations

import torch
from pydantic import Field

from kernels.record import KernelRecord
from stages.common.config import StageConfig
from stages.common.device import DeviceName, pick_device
from stages.common.paths import read_json, write_json
from stages.common.runner import StageContext
from stages.fair_bandits.scm import World, load_scm
from stages.fair_bandits.simulate import Instance, run_group, run_tabular


class Config(StageConfig):
    rho: float = Field(10.0, gt=0, le=1e4, description="primal_dual dual cap ρ; dual step ρ/√T")
    beta_scale: float = Field(0.1, gt=0, le=1.0, description="dologb_scaled: multiplier of the radius β_t")
    parity_round: int = Field(200, ge=1, description="round whose real kernel inputs are checked against Triton")
    threads: int = Field(1, ge=1, le=64, description="torch intra-op threads (1: the rounds are tiny ops)")
    device: DeviceName = "auto"


def instances_of(name: str, w: dict, seeds: list[int]) -> list[Instance]:
    """Every method at the longest horizon; the sweep methods also at each shorter one."""
    T = w["horizons"][-1]
    out = [Instance(name, m, T, s) for m in w["methods"] for s in seeds]
    out += [Instance(name, m, h, s) for h in w["horizons"][:-1] for m in w["sweep_methods"] for s in seeds]
    return out


def run(cfg: Config, ctx: StageContext) -> None:
    torch.set_num_threads(cfg.threads)
    device = pick_device(cfg.device)
    rec = KernelRecord(device)
    prep = ctx.input("prepare")
    meta = read_json(prep / "meta.json")
    contexts = torch.load(prep / "contexts.pt")
    seeds = meta["seeds"]
    worlds = {n: World(load_scm(prep / f"{n}.scm.json"), device) for n in meta["worlds"]}
    groups: dict[str, list[str]] = {}
    for n, w in meta["worlds"].items():
        groups.setdefault(w["learner_key"], []).append(n)
    info = {"groups": list(groups.values()), "device": str(device), "rho": cfg.rho, "beta_scale": cfg.beta_scale,
            "instances": {}}
    checked = False
    for names in groups.values():
        inst = [i for n in names for i in instances_of(n, meta["worlds"][n], seeds)]
        ctxs = {(n, s): contexts[n][j].long().numpy() for n in names for j, s in enumerate(seeds)}
        T = max(i.horizon for i in inst)
        out = run_group({n: worlds[n] for n in names}, inst, ctxs, rec.backend, cfg.rho, cfg.beta_scale, rec=rec,
                        parity_round=None if checked else min(cfg.parity_round, T))
        checked = True
        for n in names:
            idx = [b for b, i in enumerate(inst) if i.world == n]
            Tn = meta["worlds"][n]["horizons"][-1]
            log = {"instances": [(inst[b].method, inst[b].horizon, inst[b].seed) for b in idx],
                   "act": out["act"][idx, :Tn].cpu(), "excluded": out["excluded"][idx, :Tn].cpu(),
                   "excluded_fair": out["excluded_fair"][idx, :Tn].cpu(),
                   "cert_slack": out["cert_slack"][idx, :Tn].cpu(), "beta": out["beta"][:Tn]}
            th = meta["worlds"][n]["tabular_horizon"]
            if th is not None:
                tab = run_tabular(worlds[n], seeds, th, ctxs, rec.backend)
                log["tabular"] = {"horizon": th, "seeds": seeds, "act": tab["act"].cpu(), "excluded": tab["excluded"].cpu()}
            torch.save(log, ctx.out / f"logs_{n}.pt")
            info["instances"][n] = len(idx)
            ctx.tracker.log({f"{n}/instances": float(len(idx))})
    rec.save(ctx.out)
    write_json(ctx.out / "meta.json", info)
