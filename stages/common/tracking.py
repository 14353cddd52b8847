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


KEYS_DIR = "keys"  # wandb/keys/<slug>.<stage>.json: the history keys a stage logged (for report panels)


class Tracker:
    """Thin wrapper around a wandb run (or nothing, when disabled). Per-step curves go to history
    (``log``); final numbers go to the run summary (``summary``), not one-point charts."""

    def __init__(self, run: Any = None):
        self.run = run
        self.history_keys: set[str] = set()
        self.media_keys: set[str] = set()

    @property
    def enabled(self) -> bool:
        return self.run is not None

    def log(self, data: dict[str, Any], step: int | None = None) -> None:
        if self.run is not None:
            self.history_keys.update(k for k, v in data.items() if isinstance(v, (int, float)))
            self.run.log(data, step=step)

    def record_keys(self, path: Path) -> None:
        """Write the keys this run logged (history curves, images) for flows.wandb_report."""
        import json

        if self.run is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"history": sorted(self.history_keys), "media": sorted(self.media_keys)}))

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

        self.media_keys.add(key)
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
    tracker = Tracker(run)
    try:
        yield tracker
        ok = True
    finally:
        if ok:
            tracker.record_keys(root / "wandb" / KEYS_DIR / f"{slug}.{stage}.json")
        run.finish(exit_code=0 if ok else 1)


def log_committed_report(slug: str, root: Path = ROOT) -> str:
    """Log a paper's committed report (verdicts, findings counts, figures, the claims table) to W&B once
    per report content: ``make repro`` ends with this, so W&B shows every paper's verdicts even when DVC
    skipped the report stage (its inputs cached). Idempotent: keyed by paper and the sha of metrics.json,
    remembered in wandb/logged/. Returns what it did ("logged", "already logged", "disabled")."""
    import hashlib
    import json

    mode = wandb_mode()
    if mode == "disabled":
        return "disabled"
    report = root / "reports" / slug
    raw = (report / "metrics.json").read_bytes()
    key = hashlib.sha256(raw).hexdigest()[:12]
    marker = root / "wandb" / "logged" / f"{slug}-{key}.json"
    if marker.exists():
        return "already logged"
    doc = json.loads(raw)
    import wandb

    from stages.common.claims import findings_summary

    (root / "wandb").mkdir(exist_ok=True)
    run = wandb.init(project=PROJECT, group=slug, job_type="report", name=f"{slug}-report-{key}",
                     config={"profile": doc.get("profile"), "metrics_sha": key}, tags=[slug, "report", "committed"],
                     dir=str(root), mode=mode, reinit="finish_previous",
                     settings=wandb.Settings(silent=True, console="off", x_disable_stats=True))
    tracker = Tracker(run)
    try:
        claims = doc["claims"]
        code = {"holds": 1, "inconclusive": 0, "fails": -1}
        tracker.summary({**findings_summary(claims), **{f"claim/{c['name']}": code[c["verdict"]] for c in claims},
                         **{f"verdict/{c['name']}": c["verdict"] for c in claims},
                         **{f"kind/{c['name']}": c.get("kind", "finding") for c in claims}})
        import polars as pl

        tracker.log_table("claims", pl.DataFrame([{"name": c["name"], "kind": c.get("kind", "finding"),
                                                   "verdict": c["verdict"], "statement": c["statement"]}
                                                  for c in claims]))
        for png in sorted((report / "figures").glob("*.png")):
            tracker.log_image(f"figures/{png.stem}", png)
        tracker.record_keys(root / "wandb" / KEYS_DIR / f"{slug}.report.json")
    finally:
        run.finish()
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps({"slug": slug, "metrics_sha": key, "run": run.id}))
    return "logged"
