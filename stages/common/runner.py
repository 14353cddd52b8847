"""Run one stage of one paper: validate config, open tracking, write outputs atomically.

A paper ``<slug>`` is a package ``stages/<slug>/`` with one module per stage
(``prepare.py``, ``train.py``, ``evaluate.py``, ``report.py``). Each module defines

    class Config(StageConfig): ...           # typed params of papers.<slug>.<stage>
    def run(cfg: Config, ctx: StageContext) -> None

``run_stage`` is what ``python -m stages <stage> <slug>``, pytest and Prefect all call.
"""
from __future__ import annotations

import importlib
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stages.common.config import (PROFILES, STAGES, ConfigError, StageConfig, active_profile, load_stage_config,
                                  read_params, stage_block, validate)
from stages.common.paths import ROOT, atomic_dir, read_json, stage_dir, write_json
from stages.common.seeding import seed_everything
from stages.common.sources import check_source_profiles
from stages.common.trainer import global_rank, scratch_dir

STAGE_INFO = "_stage.json"  # {slug, stage, profile}: inside the output, so deterministic (no timings)


def runtime_file(slug: str, stage: str, root: Path = ROOT) -> Path:
    """Wall-clock of a stage's last run, kept beside (not inside) its DVC output so that output
    hashes do not change with machine load: data/<slug>/<stage>.runtime.json."""
    return stage_dir(slug, "prepare", root).parent / f"{stage}.runtime.json"


class MissingInputError(RuntimeError):
    """A stage's declared input is absent (the upstream stage has not run)."""


class InputModifiedError(RuntimeError):
    """A stage wrote into an upstream stage's output (DVC would then see its dependency change)."""


def input_fingerprint(slug: str, stage: str, root: Path = ROOT) -> dict[str, tuple[int, int]]:
    """(size, mtime_ns) of every file in the paper's upstream stage outputs, by path relative to root."""
    out: dict[str, tuple[int, int]] = {}
    for up in STAGES[: STAGES.index(stage)]:
        base = stage_dir(slug, up, root)
        if not base.is_dir():
            continue
        for f in base.rglob("*"):
            if f.is_file() or f.is_symlink():
                st = f.lstat()
                out[str(f.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


def check_inputs_untouched(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]],
                           where: str) -> None:
    """Refuse a stage that added, removed or changed a file of an upstream output (issue 57)."""
    changed = sorted(set(before) ^ set(after)) + sorted(k for k in set(before) & set(after) if before[k] != after[k])
    if changed:
        first = changed[0]
        what = "added" if first not in before else "removed" if first not in after else "modified"
        more = f" (+{len(changed) - 1} more)" if len(changed) > 1 else ""
        raise InputModifiedError(f"{where}: {what} {first}{more} inside an upstream stage's output; a stage must "
                                 "never write into its inputs (e.g. HF datasets cache files: use keep_in_memory=True)")


@dataclass
class StageContext:
    """What a stage function gets besides its config: where to read, where to write, tracking."""

    slug: str
    stage: str
    profile: str
    out: Path  # temporary output dir; renamed into place when run() returns
    root: Path = ROOT
    started: float = field(default_factory=time.perf_counter)
    tracker: Any = None  # stages.common.tracking.Tracker
    cfg: Any = None  # the stage's validated Config (the report reads its claim thresholds from cfg.claims)

    def input(self, stage: str) -> Path:
        """Output dir of an upstream stage of the same paper; errors clearly if it is missing."""
        path = stage_dir(self.slug, stage, self.root)
        if not (path / STAGE_INFO).exists():
            raise MissingInputError(
                f"{self.stage}@{self.slug}: input {path.relative_to(self.root)} is missing or incomplete; "
                f"run `dvc repro {stage}@{self.slug}` (or `python -m stages {stage} {self.slug}`) first")
        return path

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def upstream_runtimes(self) -> dict[str, float | None]:
        """runtime_s of every earlier stage that ran here (None when its output was restored from a
        DVC cache/remote without a local run)."""
        out: dict[str, float | None] = {}
        for stage in STAGES[: STAGES.index(self.stage)]:
            if not (stage_dir(self.slug, stage, self.root) / STAGE_INFO).exists():
                continue
            info = runtime_file(self.slug, stage, self.root)
            out[stage] = float(read_json(info)["runtime_s"]) if info.exists() else None
        return out


def lane_capped(cfg: StageConfig) -> StageConfig:
    """The stage's config with its ``torch_threads`` (a paper's intra-op threads) capped by ``STAGES_MAX_WORKERS``,
    the share of the cores ``make repro`` gives each lane (cores // lanes), as that variable caps the stage's process
    pool (``stages.common.jobs``). Without the cap a paper's 2 threads in each of two lanes put 4 busy threads on 2
    cores: in one fresh-clone ``make repro`` star_kv's train, 252 s alone, had used 20 CPU-minutes in its lane
    without finishing. Unset (a single ``dvc repro``): unchanged."""
    from stages.common.jobs import max_workers
    threads = getattr(cfg, "torch_threads", None)
    if isinstance(threads, int) and threads > max_workers():
        return cfg.model_copy(update={"torch_threads": max_workers()})
    return cfg


def stage_module(slug: str, stage: str):
    if stage not in STAGES:
        raise ConfigError(f"stage: unknown stage {stage!r} (stages: {', '.join(STAGES)})")
    try:
        return importlib.import_module(f"stages.{slug}.{stage}")
    except ModuleNotFoundError as err:
        if err.name in (f"stages.{slug}", f"stages.{slug}.{stage}"):
            raise ConfigError(f"papers.{slug}: no stage module stages/{slug}/{stage}.py") from None
        raise


def load_config(slug: str, stage: str, profile: str | None = None, params_path: Path | None = None):
    """Validate papers.<slug>.<stage> against the stage's Config; returns (module, cfg, profile)."""
    params = read_params(params_path)
    if slug not in params["papers"]:
        known = ", ".join(sorted(params["papers"])) or "none"
        raise ConfigError(f"papers.{slug}: unknown paper (registered: {known})")
    module = stage_module(slug, stage)
    config_cls = getattr(module, "Config", None)
    if config_cls is None or not issubclass(config_cls, StageConfig):
        raise ConfigError(f"stages/{slug}/{stage}.py: defines no Config(StageConfig)")
    prof = active_profile(params, profile)
    cfg = load_stage_config(slug, stage, config_cls, prof, params_path)
    check_source_profiles(params, slug, stage, config_cls)
    check_cross_stage(slug, params)
    if stage == "report":
        check_claim_thresholds(slug, module, cfg)
    return module, cfg, prof


def check_claim_thresholds(slug: str, module, cfg) -> None:
    """A report whose claims are a static list (``CLAIMS``) has its thresholds bound at config load:
    a missing or unknown threshold in papers.<slug>.report.claims fails before any work."""
    from stages.common.claims import ClaimError, bind

    claims = getattr(module, "CLAIMS", None)
    if not isinstance(claims, list):
        return
    try:
        bind(claims, getattr(cfg, "claims", None) or {}, f"papers.{slug}.report", strict_unused=True)
    except ClaimError as err:
        raise ConfigError(str(err)) from None


def check_cross_stage(slug: str, params: dict) -> None:
    """Run the paper's rules that tie keys of different stages together, under every profile.

    A paper opts in by defining ``check_params(configs)`` in ``stages/<slug>/__init__.py``: it gets
    ``{stage: validated Config}`` of one profile and raises ``ValueError("<stage>.<key>: ...")``.
    Such a rule (e.g. an evaluate rank larger than the head_dim the train stage builds) fails at
    config load of every stage, before any work, instead of stages later.
    """
    rule = getattr(importlib.import_module(f"stages.{slug}"), "check_params", None)
    if rule is None:
        return
    for name in ("default", *(p for p in PROFILES if p != "default")):
        configs = {}
        for stage in STAGES:
            model = stage_module(slug, stage).Config
            configs[stage] = validate(model, stage_block(params, slug, stage, name),
                                      f"papers.{slug}.{stage}" + ("" if name == "default" else f" (profile {name})"))
        try:
            rule(configs)
        except ValueError as err:
            where = f"papers.{slug}" + ("" if name == "default" else f" (profile {name})")
            raise ConfigError(f"{where}.{err}") from None


def run_stage(slug: str, stage: str, profile: str | None = None, root: Path = ROOT,
              params_path: Path | None = None, started: float | None = None) -> Path:
    """Run ``<stage>@<slug>``; returns the final output dir. Config errors happen before any work.

    ``started`` (a perf_counter value) is when the stage's clock started; the CLI passes its
    process start so that runtime_s includes interpreter start-up and imports.
    """
    from stages.common.tracking import stage_run

    started = time.perf_counter() if started is None else started
    module, cfg, prof = load_config(slug, stage, profile, params_path)
    cfg = lane_capped(cfg)
    seed = getattr(cfg, "seed", 0)
    seed_everything(seed)
    final = stage_dir(slug, stage, root)
    # DDP (Lightning "ddp", torchrun, SLURM) runs the whole stage once per rank: only global rank 0
    # writes and renames the outputs; other ranks write into a scratch dir that is then deleted.
    for up in STAGES[: STAGES.index(stage)]:  # every upstream output must exist before any work (and
        StageContext(slug=slug, stage=stage, profile=prof, out=final, root=root).input(up)  # before a W&B run)
    inputs_before = input_fingerprint(slug, stage, root)
    if "datasets" in sys.modules:  # HF datasets: map/filter caches go to temp files, never into an input
        sys.modules["datasets"].disable_caching()
    with (atomic_dir(final) if global_rank() == 0 else scratch_dir(stage)) as tmp:
        ctx = StageContext(slug=slug, stage=stage, profile=prof, out=tmp, root=root, started=started, cfg=cfg)
        with stage_run(slug, stage, cfg.model_dump(mode="json"), prof, root) as tracker:
            ctx.tracker = tracker
            module.run(cfg, ctx)
            check_inputs_untouched(inputs_before, input_fingerprint(slug, stage, root), f"{stage}@{slug}")
            runtime = time.perf_counter() - started
            tracker.summary({"runtime_s": runtime})
        write_json(tmp / STAGE_INFO, {"slug": slug, "stage": stage, "profile": prof})
    if global_rank() == 0:
        write_json(runtime_file(slug, stage, root), {"slug": slug, "stage": stage, "profile": prof,
                                                     "runtime_s": round(runtime, 3),
                                                     "cpu_s": round(time.process_time(), 3)})  # this process, imports included
    return final


def run_pipeline(slug: str, root: Path = ROOT, profile: str | None = None,
                 stages: tuple[str, ...] = STAGES, params_path: Path | None = None) -> dict[str, Path]:
    """Run several stages of one paper in order (tests use this with profile="smoke"; a study with its own
    params file)."""
    return {stage: run_stage(slug, stage, profile, root, params_path) for stage in stages}
