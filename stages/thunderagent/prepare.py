"""prepare: write every workload through the public JSONL format (workload.py) and re-validate it.

Files (meta.json lists them):
- tasks_{regime}_s{seed}.jsonl — one task list per workload regime and seed: max(concurrency) +
  fresh_programs programs. The closed-loop sweep runs N workers over it (the first N started warm, see
  workload.warm_start); the makespan runs take its first N programs as a closed burst.
  Regimes: ``trace`` — decode and tool times of the official SWE-agent profile traces (headline);
  ``card`` — the paper card's miniature (200–800 decode tokens, tools ~Exp(5–30 s)).
- tasks_{regime}_p{seed}.jsonl — the same for the PILOT seeds (disjoint from the evaluation seeds): evaluate
  tunes the Continuum-like baseline's TTL on them, before and apart from the evaluation runs.
- burst_s{seed}.jsonl — the issue-#46 burst (seeds 0 .. burst_seeds − 1): mixed 1.4k–8k prompts at t = 0 plus a
  stream of small programs.
- engine_s{seed}.jsonl — tiny programs for the real engine (cost-model fit and held-out check).
- official.jsonl — only when ``official_trace_dir`` names an official trace directory (full profile):
  the converted task list (stages/thunderagent/official_trace.py).
"""
from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator, model_validator

from stages.common.config import PositiveInt, Seeds, StageConfig, unique_items
from stages.common.paths import atomic_write_text, write_json
from stages.common.runner import StageContext
from stages.thunderagent import record_cpu
from stages.thunderagent.workload import Cluster, Workload, check_capacity, dump_workload, generate, load_workload


class Regime(StageConfig):
    """Distributions of one synthetic workload regime (ranges are [low, high])."""
    steps: list[int] = Field(default=[15, 25], min_length=2, max_length=2)
    prompt: list[int] = Field(default=[1500, 3000], min_length=2, max_length=2)
    decode: list[int] = Field(default=[30, 500], min_length=2, max_length=2)
    obs: list[int] = Field(default=[100, 2000], min_length=2, max_length=2)
    tool_mean_s: list[float] = Field(default=[0.5, 3.0], min_length=2, max_length=2)
    env_prep_s: list[float] = Field(default=[1.0, 5.0], min_length=2, max_length=2)
    shared_prefix: int = Field(1024, ge=0, le=100_000)
    source: str = Field("", max_length=400, description="where the ranges come from")

    @model_validator(mode="after")
    def _ranges(self):
        for name in ("steps", "prompt", "decode", "obs", "tool_mean_s", "env_prep_s"):
            lo, hi = getattr(self, name)
            if not 0 <= lo <= hi:
                raise ValueError(f"{name}: need 0 <= low <= high (got [{lo}, {hi}])")
            if hi > (200 if name == "steps" else 10**5):
                raise ValueError(f"{name}: high {hi} is beyond this miniature (use the full profile's sources)")
        if self.steps[0] < 1 or self.decode[0] < 1 or self.prompt[0] < 1:
            raise ValueError("steps, decode and prompt: low must be >= 1")
        return self


class Config(StageConfig):
    seeds: Seeds = Field(default=[0, 1, 2, 3, 4], max_length=32)
    pilot_seeds: Seeds = Field(default=[100, 101], max_length=8,
                               description="baseline tuning (Continuum TTL) only; disjoint from seeds")
    concurrency: list[PositiveInt] = Field(default=[4, 8, 16, 24, 32, 64, 96], min_length=2, max_length=16)
    backends: int = Field(2, ge=1, le=16)
    kv_capacity_tokens: int = Field(100_000, ge=10_000, le=10_000_000, description="per backend")
    fresh_programs: int = Field(300, ge=1, le=5000, description="task list beyond the warm-started workers")
    regimes: dict[str, Regime] = Field(default_factory=lambda: {"trace": Regime()}, min_length=1, max_length=4)
    headline_regime: str = "trace"
    side_regime_seeds: int = Field(3, ge=1, le=32, description="seeds (the first k) of the non-headline regimes")
    side_regime_concurrency: list[PositiveInt] = Field(default=[8, 16, 32, 64, 96], min_length=2, max_length=16)
    burst_seeds: int = Field(20, ge=1, le=64, description="#46 burst study: seeds 0 .. burst_seeds-1")
    burst_programs: int = Field(32, ge=2, le=512, description="#46 burst: programs at t=0 with mixed prompts")
    stream_programs: int = Field(48, ge=0, le=1024, description="#46 burst: small programs arriving afterwards")
    stream_rate: float = Field(0.1, gt=0, le=100, description="programs/s of the small-program stream")
    burst_steps: int = Field(6, ge=1, le=100)
    burst_capacity_tokens: int = Field(120_000, ge=10_000, le=10_000_000)
    engine_seeds: Seeds = Field(default=[0, 1, 2, 3], max_length=16)
    engine_programs: int = Field(4, ge=1, le=32)
    engine_steps: int = Field(3, ge=1, le=20)
    engine_capacity_tokens: int = Field(512, ge=128, le=100_000)
    official_trace_dir: str | None = Field(None, max_length=4096, description="full profile: an official trace dir")
    official_shared_prefix: int = Field(0, ge=0, le=100_000)

    @field_validator("seeds", "pilot_seeds", "concurrency", "side_regime_concurrency", "engine_seeds")
    @classmethod
    def _u(cls, v, info):
        return unique_items(v, info.field_name)

    @model_validator(mode="after")
    def _check(self):
        for name in ("concurrency", "side_regime_concurrency"):
            if sorted(getattr(self, name)) != list(getattr(self, name)):
                raise ValueError(f"{name}: must be increasing")
        if self.headline_regime not in self.regimes:
            raise ValueError(f"headline_regime: {self.headline_regime!r} is not one of regimes ({', '.join(self.regimes)})")
        if set(self.pilot_seeds) & set(self.seeds):
            raise ValueError(f"pilot_seeds: must be disjoint from seeds (shared: {sorted(set(self.pilot_seeds) & set(self.seeds))})")
        if self.side_regime_seeds > len(self.seeds):
            raise ValueError("side_regime_seeds: more than the seeds given")
        if len(self.engine_seeds) < 2:
            raise ValueError("engine_seeds: need >= 2 (fit on some, hold out the others)")
        return self


def _write(ctx, name: str, wl: Workload) -> str:
    path = ctx.out / name
    atomic_write_text(path, dump_workload(wl))
    back = load_workload(path)  # round trip through the public format
    check_capacity(back, name)
    return name


def regime_workload(r: Regime, n: int, seed: int, cluster: Cluster) -> Workload:
    return generate(n, seed, steps=tuple(r.steps), prompt=tuple(r.prompt), decode=tuple(r.decode), obs=tuple(r.obs),
                    tool_mean_s=tuple(r.tool_mean_s), env_prep_s=tuple(r.env_prep_s), shared_prefix=r.shared_prefix,
                    cluster=cluster)


def burst_workload(cfg: Config, seed: int) -> Workload:
    cl = Cluster(backends=1, kv_capacity_tokens=cfg.burst_capacity_tokens)
    big = generate(cfg.burst_programs, seed, steps=(cfg.burst_steps, cfg.burst_steps), prompt=(1400, 8000),
                   decode=(200, 400), obs=(100, 600), cluster=cl, id_prefix="b")
    small = generate(cfg.stream_programs, seed + 1000, steps=(cfg.burst_steps, cfg.burst_steps), prompt=(1100, 1500),
                     decode=(200, 400), obs=(100, 600), arrival_rate=cfg.stream_rate, cluster=cl, id_prefix="s")
    return Workload(big.programs + small.programs, cl)


def engine_workload(cfg: Config, seed: int) -> Workload:
    return generate(cfg.engine_programs, seed, steps=(cfg.engine_steps, cfg.engine_steps), decode=(8, 24), obs=(8, 40),
                    tool_mean_s=(0.5, 2.0), prompt=(96, 160), shared_prefix=64, env_prep_s=(0.1, 0.5),
                    cluster=Cluster(backends=1, kv_capacity_tokens=cfg.engine_capacity_tokens, block_size=16))


def run(cfg: Config, ctx: StageContext) -> None:
    _run(cfg, ctx)
    record_cpu(ctx)


def _run(cfg: Config, ctx: StageContext) -> None:
    cl = Cluster(backends=cfg.backends, kv_capacity_tokens=cfg.kv_capacity_tokens)
    meta = {"seeds": cfg.seeds, "concurrency": cfg.concurrency, "headline_regime": cfg.headline_regime,
            "regimes": {}, "burst": {}, "engine": {}, "cluster": {"backends": cfg.backends,
                                                                  "kv_capacity_tokens": cfg.kv_capacity_tokens},
            "fresh_programs": cfg.fresh_programs}
    for name, r in cfg.regimes.items():
        head = name == cfg.headline_regime
        ns = cfg.concurrency if head else cfg.side_regime_concurrency
        seeds = cfg.seeds if head else cfg.seeds[: cfg.side_regime_seeds]
        files = {str(s): _write(ctx, f"tasks_{name}_s{s}.jsonl", regime_workload(r, ns[-1] + cfg.fresh_programs, s, cl))
                 for s in seeds}
        pilot = {str(s): _write(ctx, f"tasks_{name}_p{s}.jsonl", regime_workload(r, ns[-1] + cfg.fresh_programs, s, cl))
                 for s in cfg.pilot_seeds}
        meta["regimes"][name] = {"concurrency": ns, "seeds": seeds, "files": files, "source": r.source,
                                 "spec": r.model_dump(), "pilot_seeds": cfg.pilot_seeds, "pilot_files": pilot}
    for s in range(cfg.burst_seeds):
        meta["burst"][str(s)] = _write(ctx, f"burst_s{s}.jsonl", burst_workload(cfg, s))
    for s in cfg.engine_seeds:
        meta["engine"][str(s)] = _write(ctx, f"engine_s{s}.jsonl", engine_workload(cfg, s))
    if cfg.official_trace_dir:
        from stages.thunderagent.official_trace import load_official_traces

        wl = load_official_traces(Path(cfg.official_trace_dir), cluster=cl, shared_prefix_tokens=cfg.official_shared_prefix)
        meta["official"] = _write(ctx, "official.jsonl", wl)
    write_json(ctx.out / "meta.json", meta)
