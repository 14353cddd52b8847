"""prepare: write every workload through the public JSONL format (workload.py) and re-validate it.

Files: sweep_n{N}_s{seed}.jsonl (closed burst of N programs on the cluster), burst_s{seed}.jsonl (the
issue-#46 burst: mixed 1.4k–8k prompts at t = 0 plus a stream of small programs), engine.jsonl (a
handful of tiny programs for the real engine); meta.json lists them.
"""
from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from stages.common.config import PositiveInt, Seeds, StageConfig, unique_items
from stages.common.paths import atomic_write_text, write_json
from stages.common.runner import StageContext
from stages.thunderagent.workload import Cluster, Workload, check_capacity, dump_workload, generate, load_workload


class Config(StageConfig):
    seeds: Seeds = Field(default=[0, 1, 2], max_length=32)
    concurrency: list[PositiveInt] = Field(default=[8, 16, 32, 64], min_length=2, max_length=12)
    backends: int = Field(2, ge=1, le=16)
    kv_capacity_tokens: int = Field(200_000, ge=10_000, le=10_000_000, description="per backend")
    steps_min: int = Field(15, ge=1, le=200)
    steps_max: int = Field(25, ge=1, le=200)
    burst_programs: int = Field(32, ge=2, le=512, description="#46 burst: programs at t=0 with mixed prompts")
    stream_programs: int = Field(48, ge=0, le=1024, description="#46 burst: small programs arriving afterwards")
    stream_rate: float = Field(0.1, gt=0, le=100, description="programs/s of the small-program stream")
    burst_steps: int = Field(6, ge=1, le=100)
    burst_capacity_tokens: int = Field(120_000, ge=10_000, le=10_000_000)
    engine_programs: int = Field(4, ge=1, le=32)
    engine_steps: int = Field(3, ge=1, le=20)
    engine_capacity_tokens: int = Field(512, ge=128, le=100_000)

    @field_validator("seeds", "concurrency")
    @classmethod
    def _u(cls, v, info):
        return unique_items(v, info.field_name)

    @model_validator(mode="after")
    def _steps(self):
        if self.steps_max < self.steps_min:
            raise ValueError("steps_max: must be >= steps_min")
        if sorted(self.concurrency) != list(self.concurrency):
            raise ValueError("concurrency: must be increasing")
        return self


def _write(ctx, name: str, wl: Workload) -> str:
    path = ctx.out / name
    atomic_write_text(path, dump_workload(wl))
    back = load_workload(path)  # round trip through the public format
    check_capacity(back, name)
    return name


def burst_workload(cfg: Config, seed: int) -> Workload:
    cl = Cluster(backends=1, kv_capacity_tokens=cfg.burst_capacity_tokens)
    big = generate(cfg.burst_programs, seed, steps=(cfg.burst_steps, cfg.burst_steps), prompt=(1400, 8000),
                   decode=(200, 400), obs=(100, 600), cluster=cl, id_prefix="b")
    small = generate(cfg.stream_programs, seed + 1000, steps=(cfg.burst_steps, cfg.burst_steps), prompt=(1100, 1500),
                     decode=(200, 400), obs=(100, 600), arrival_rate=cfg.stream_rate, cluster=cl, id_prefix="s")
    return Workload(big.programs + small.programs, cl)


def run(cfg: Config, ctx: StageContext) -> None:
    meta = {"seeds": cfg.seeds, "concurrency": cfg.concurrency, "sweep": {}, "burst": {}}
    cl = Cluster(backends=cfg.backends, kv_capacity_tokens=cfg.kv_capacity_tokens)
    for s in cfg.seeds:
        for n in cfg.concurrency:
            meta["sweep"][f"n{n}_s{s}"] = _write(ctx, f"sweep_n{n}_s{s}.jsonl",
                                                 generate(n, s, steps=(cfg.steps_min, cfg.steps_max), cluster=cl))
        meta["burst"][str(s)] = _write(ctx, f"burst_s{s}.jsonl", burst_workload(cfg, s))
    eng = generate(cfg.engine_programs, cfg.seeds[0], steps=(cfg.engine_steps, cfg.engine_steps), decode=(8, 24),
                   obs=(8, 40), tool_mean_s=(0.5, 2.0), prompt=(96, 160), shared_prefix=64, env_prep_s=(0.1, 0.5),
                   cluster=Cluster(backends=1, kv_capacity_tokens=cfg.engine_capacity_tokens, block_size=16))
    meta["engine"] = _write(ctx, "engine.jsonl", eng)
    write_json(ctx.out / "meta.json", meta)
