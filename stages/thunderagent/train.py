"""train: the real paged engine replays the schedulers' traces; fit the simulator's cost model to it.

For each policy in `policies`, the simulator schedules engine.jsonl (trace on); the tiny GPT with a
paged KV cache executes the trace (decode attention through kernels.paged_decode_attention), and the
dense re-run counts tokens that differ. Chunk wall times are fitted by non-negative least squares to
a + b·(KV read) + p·prefill + q·prefill·ctx (the simulator's cost model); held-out error on odd
chunks. Wall-clock values are runtime fields (machine-dependent); the token check is deterministic.
Writes fit.json, engine.json, kernels.json.
"""
from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, field_validator

from kernels.paged_decode_attention import paged_decode_attention
from kernels.record import KernelRecord
from stages.common.config import Seed, StageConfig, unique_items
from stages.common.device import DeviceName, pick_device
from stages.common.paths import read_json, write_json
from stages.common.runner import StageContext
from stages.thunderagent.engine import PagedEngine, engine_model_config, fit_cost_model
from stages.thunderagent.sim import simulate
from stages.thunderagent.workload import load_workload


class Config(StageConfig):
    seed: Seed = 0
    policies: list[Literal["thunderagent", "vllm", "continuum"]] = Field(default=["thunderagent", "vllm"], min_length=1)
    max_seq_len: int = Field(512, ge=64, le=4096)
    device: DeviceName = "auto"

    @field_validator("policies")
    @classmethod
    def _u(cls, v):
        return unique_items(v, "policies")


def run(cfg: Config, ctx: StageContext) -> None:
    torch.set_num_threads(1)
    device = pick_device(cfg.device)
    rec = KernelRecord(device)
    prep = ctx.input("prepare")
    meta = read_json(prep / "meta.json")
    wl = load_workload(prep / meta["engine"])
    chunks, out = [], {}
    for pol in cfg.policies:
        res, trace = simulate(wl, pol, trace=True)
        eng = PagedEngine(wl, engine_model_config(cfg.max_seq_len), cfg.seed, device, rec=rec)
        eng.replay(trace)
        ver = eng.verify()
        out[pol] = {**ver, "sim_recomputed_tokens": res["recomputed_tokens"], "sim_preemptions": res["preemptions"],
                    "sim_kv_hit_rate": res["kv_hit_rate"], "trace_ops": len(trace)}
        chunks += eng.chunks
        if eng.parity_args is not None and pol == cfg.policies[0]:
            rec.parity("paged_decode_attention", paged_decode_attention, *eng.parity_args,
                       slice=f"first batched decode step of the {pol} trace (layer 0, real engine pool)")
        ctx.tracker.log({f"engine/{pol}/mismatches": float(ver["mismatches"])})
    fit = fit_cost_model(chunks)
    rec.save(ctx.out)
    write_json(ctx.out / "engine.json", out)
    write_json(ctx.out / "fit.json", fit)
