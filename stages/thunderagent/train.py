"""train: calibrate the simulator's cost model on the real paged engine, and check it on held-out traces.

1. Fit traces: for each fit workload (engine_s{seed}.jsonl, seed in ``fit_seeds``) and policy, the simulator
   schedules it (trace on, the GPU cost model); the tiny GPT with a paged KV cache executes the trace
   (decode attention through kernels.paged_decode_attention); every prefill and decode chunk is timed
   (thread CPU time: robust to the other processes of a shared machine; wall time kept beside it).
   a, b, p, q, r are fitted by non-negative least squares (costmodel.fit_cost_model).
2. Held-out traces: each other workload is simulated WITH the fitted cost model; the engine replays that
   trace; the simulator's predicted engine time (Σ of its chunk times) is compared with the measured time
   (total relative error, and per-operation error of the fitted model).
3. Exactness: after each replay, every generated token is checked against the dense (uncached) model.

Timings are machine-dependent (runtime fields, wall-clock); the token checks are deterministic.
Writes fit.json, engine.json, kernels.json.
"""
from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, field_validator

from kernels.paged_decode_attention import paged_decode_attention
from kernels.record import KernelRecord
from stages.common.config import Seed, Seeds, StageConfig, unique_items
from stages.common.device import DeviceName, pick_device
from stages.common.paths import read_json, write_json
from stages.common.runner import StageContext
from stages.thunderagent import record_cpu
from stages.thunderagent.costmodel import fit_cost_model, gpu_cost_model, heldout_errors
from stages.thunderagent.engine import PagedEngine, engine_model_config
from stages.thunderagent.sim import CostModel, simulate
from stages.thunderagent.workload import load_workload


class Config(StageConfig):
    seed: Seed = 0
    policies: list[Literal["thunderagent", "vllm", "continuum"]] = Field(default=["thunderagent", "vllm"], min_length=1)
    fit_seeds: Seeds = Field(default=[0, 1], max_length=16)
    max_seq_len: int = Field(512, ge=64, le=4096)
    device: DeviceName = "auto"

    @field_validator("policies")
    @classmethod
    def _u(cls, v):
        return unique_items(v, "policies")


def run(cfg: Config, ctx: StageContext) -> None:
    _run(cfg, ctx)
    record_cpu(ctx)


def _run(cfg: Config, ctx: StageContext) -> None:
    torch.set_num_threads(1)
    device = pick_device(cfg.device)
    rec = KernelRecord(device)
    prep = ctx.input("prepare")
    meta = read_json(prep / "meta.json")
    engine_seeds = [int(s) for s in meta["engine"]]
    missing = [s for s in cfg.fit_seeds if s not in engine_seeds]
    if missing:
        raise ValueError(f"fit_seeds: {missing[0]} is not one of prepare.engine_seeds {engine_seeds}")
    held = [s for s in engine_seeds if s not in cfg.fit_seeds]
    if not held:
        raise ValueError("fit_seeds: every engine workload is used for the fit; none is left to hold out")
    gpu, _ = gpu_cost_model()
    model_cfg = engine_model_config(cfg.max_seq_len)
    engine, fit_ops = {}, []

    def replay(wl, pol, cost):
        res, trace = simulate(wl, pol, cost, trace=True)
        eng = PagedEngine(wl, model_cfg, cfg.seed, device, rec=rec)
        eng.replay(trace)
        return res, trace, eng, eng.verify()

    for s in cfg.fit_seeds:
        wl = load_workload(prep / meta["engine"][str(s)])
        for pol in cfg.policies:
            res, trace, eng, ver = replay(wl, pol, gpu)
            fit_ops += eng.ops
            engine[f"fit_s{s}_{pol}"] = {**ver, "sim_recomputed_tokens": res["recomputed_tokens"],
                                        "sim_preemptions": res["preemptions"], "trace_ops": len(trace)}
            if eng.parity_args is not None and "parity" not in engine:
                rec.parity("paged_decode_attention", paged_decode_attention, *eng.parity_args,
                           slice=f"first batched decode step of the {pol} trace of engine_s{s} (layer 0, real pool)")
                engine["parity"] = True
    engine.pop("parity", None)
    coef = fit_cost_model(fit_ops, key="cpu_s")
    fitted = CostModel(a=coef["a"], b=coef["b"], p=coef["p"], q=coef["q"], r=coef["r"])
    heldout, held_ops = {}, []
    for s in held:
        wl = load_workload(prep / meta["engine"][str(s)])
        for pol in cfg.policies:
            res, trace, eng, ver = replay(wl, pol, fitted)   # the simulator WITH the fitted model schedules it
            predicted = sum(op[4] for op in trace if op[0] == "decode")
            measured = sum(o["cpu_s"] for o in eng.ops)
            heldout[f"s{s}_{pol}"] = {"sim_predicted_s": predicted, "measured_cpu_s": measured,
                                      "measured_wall_s": sum(o["wall_s"] for o in eng.ops),
                                      "rel_err": abs(predicted - measured) / max(measured, 1e-12)}
            held_ops += eng.ops
            engine[f"heldout_s{s}_{pol}"] = {**ver, "sim_recomputed_tokens": res["recomputed_tokens"],
                                            "sim_preemptions": res["preemptions"], "trace_ops": len(trace)}
        ctx.tracker.log({f"engine/heldout_s{s}": 1.0})
    pred = sum(h["sim_predicted_s"] for h in heldout.values())
    meas = sum(h["measured_cpu_s"] for h in heldout.values())
    fit = {"coef": coef, "timer": "thread CPU time (time.thread_time), one torch thread", "fit_seeds": cfg.fit_seeds,
           "heldout_seeds": held, "n_fit_ops": len(fit_ops), "fit_in_sample": heldout_errors(coef, fit_ops),
           "heldout_ops": heldout_errors(coef, held_ops), "heldout_traces": heldout,
           "heldout_total_rel_err": abs(pred - meas) / max(meas, 1e-12),
           "heldout_trace_rel_errs": [h["rel_err"] for h in heldout.values()]}
    rec.save(ctx.out)
    write_json(ctx.out / "engine.json", engine)
    write_json(ctx.out / "fit.json", fit)
