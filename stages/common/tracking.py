"""W&B tracking: one run per stage, grouped by paper, offline by default.

Runs are written under ``<root>/wandb/`` (ignored by git and DVC); ``make wandb-sync`` uploads
them later. ``WANDB_MODE`` picks the mode (``offline`` default, ``online``, ``disabled``).
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from stages.common.paths import ROOT

PROJECT = os.environ.get("WANDB_PROJECT", "icml2026-papers")


def wandb_mode() -> str:
    mode = os.environ.get("WANDB_MODE", "offline")
    if mode not in ("offline", "online", "disabled", "dryrun", "run"):
        raise ValueError(f"WANDB_MODE: expected offline, online or disabled (got {mode!r})")
    return mode


class Tracker:
    """Thin wrapper around a wandb run (or nothing, when disabled)."""

    def __init__(self, run: Any = None):
        self.run = run

    @property
    def enabled(self) -> bool:
        return self.run is not None

    def log(self, data: dict[str, Any], step: int | None = None) -> None:
        if self.run is not None:
            self.run.log(data, step=step)

    def summary(self, data: dict[str, Any]) -> None:
        if self.run is not None:
            for key, value in data.items():
                self.run.summary[key] = value

    def log_table(self, key: str, frame) -> None:
        """Log a polars DataFrame as a wandb.Table."""
        if self.run is None:
            return
        import wandb

        self.run.log({key: wandb.Table(columns=list(frame.columns), data=[list(r) for r in frame.iter_rows()])})

    def log_image(self, key: str, path: Path) -> None:
        if self.run is None:
            return
        import wandb

        self.run.log({key: wandb.Image(str(path))})

    def lightning_logger(self):
        """A Lightning WandbLogger bound to this run, or False when tracking is disabled."""
        if self.run is None:
            return False
        from lightning.pytorch.loggers import WandbLogger

        return WandbLogger(experiment=self.run)


@contextmanager
def stage_run(slug: str, stage: str, config: dict[str, Any], profile: str,
              root: Path = ROOT) -> Iterator[Tracker]:
    mode = wandb_mode()
    if mode == "disabled":
        yield Tracker(None)
        return
    from stages.common.trainer import global_rank

    if global_rank() != 0:
        yield Tracker(None)  # only the global-zero process of a distributed run tracks
        return
    import wandb

    (root / "wandb").mkdir(exist_ok=True)
    run = wandb.init(project=PROJECT, group=slug, job_type=stage, name=f"{slug}-{stage}",
                     config={"profile": profile, **config}, tags=[slug, stage, profile],
                     dir=str(root), mode=mode, reinit="finish_previous",
                     settings=wandb.Settings(silent=True, console="off", x_disable_stats=True))
    ok = False
    try:
        yield Tracker(run)
        ok = True
    finally:
        run.finish(exit_code=0 if ok else 1)
