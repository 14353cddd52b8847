"""W&B offline: one run per stage, grouped by paper, with job_type = stage, written on disk."""
from __future__ import annotations

import pytest

from stages.common.tracking import stage_run, wandb_mode


def test_offline_run_is_written_to_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    with stage_run("demo", "train", {"lr": 0.1}, "smoke", root=tmp_path) as tracker:
        assert tracker.enabled
        run = tracker.run
        assert (run.group, run.job_type, run.name) == ("demo", "train", "demo-train")
        assert run.config["lr"] == 0.1 and run.config["profile"] == "smoke"
        tracker.log({"loss": 1.0})
        tracker.summary({"runtime_s": 1.5})
        assert tracker.lightning_logger().experiment is run
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    assert list(runs[0].glob("*.wandb"))


def test_disabled_and_bad_modes(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    with stage_run("demo", "train", {}, "smoke", root=tmp_path) as tracker:
        assert not tracker.enabled and tracker.lightning_logger() is False
    monkeypatch.setenv("WANDB_MODE", "sometimes")
    with pytest.raises(ValueError, match="WANDB_MODE"):
        wandb_mode()
