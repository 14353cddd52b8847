"""The W&B Report is built offline; publishing without online mode / API key stops with one line."""
from __future__ import annotations

import json

import pytest

from flows import wandb_report


@pytest.fixture
def report_root(tmp_path):
    rep = tmp_path / "reports" / "toy_paper"
    rep.mkdir(parents=True)
    (rep / "report.md").write_text("# Toy paper: a claim\n\nSome text with a table.\n")
    (rep / "metrics.json").write_text(json.dumps({"claims": [
        {"name": "c1", "statement": "s", "holds": True, "verdict": "holds", "values": {"x": 1.0}},
        {"name": "c2", "statement": "t", "holds": False, "verdict": "inconclusive", "values": {"y": 2.0}}]}))
    (rep / "figures").mkdir()
    (rep / "figures" / "curve.png").write_bytes(b"png")
    keys = tmp_path / "wandb" / "keys"
    keys.mkdir(parents=True)
    (keys / "toy_paper.train.json").write_text(json.dumps({"history": ["train/loss", "val/acc", "train/lr"],
                                                           "media": []}))
    (keys / "other_paper.train.json").write_text(json.dumps({"history": ["zzz/never"], "media": []}))
    return tmp_path


def test_report_has_title_text_and_runs_grouped_by_stage(report_root):
    import wandb_workspaces.reports.v2 as wr

    report = wandb_report.build_report("toy_paper", root=report_root, entity="me", project="proj")
    assert report.title == "toy_paper: Toy paper: a claim"
    assert report.project == "proj" and report.entity == "me"
    kinds = [type(b) for b in report.blocks]
    assert kinds == [wr.H1, wr.P, wr.MarkdownBlock, wr.H2, wr.PanelGrid]
    assert report.blocks[2].text == (report_root / "reports/toy_paper/report.md").read_text()
    assert "c1: holds" in str(report.blocks[1].text) and "c2: inconclusive" in str(report.blocks[1].text)
    grid = report.blocks[-1]
    (runset,) = grid.runsets
    assert runset.filters == "Group = 'toy_paper'" and runset.groupby == ["JobType"]
    assert runset.project == "proj" and runset.entity == "me"
    assert {type(p) for p in grid.panels} == {wr.BarPlot, wr.LinePlot, wr.MediaBrowser, wr.RunComparer}
    lines = {p.title: p.y for p in grid.panels if isinstance(p, wr.LinePlot)}
    assert lines == {"train curves": ["train/loss", "train/lr"], "val curves": ["val/acc"]}  # this paper's keys only
    (media,) = [p for p in grid.panels if isinstance(p, wr.MediaBrowser)]
    assert media.media_keys == ["figures/curve"]


def test_missing_report_is_a_clear_error(tmp_path):
    with pytest.raises(wandb_report.PublishError, match="report.md: missing; run `dvc repro report@nope`"):
        wandb_report.build_report("nope", root=tmp_path, entity="e", project="p")


def test_publish_offline_stops_with_one_line(monkeypatch, capsys):
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert wandb_report.main(["reversal_curse"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "needs WANDB_MODE=online" in err


def test_publish_online_without_key_stops_with_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("HOME", str(tmp_path))
    assert wandb_report.main(["reversal_curse"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no API key" in err


def test_dry_run_prints_outline(report_root, monkeypatch, capsys):
    monkeypatch.setattr(wandb_report, "ROOT", report_root)
    monkeypatch.setattr(wandb_report, "build_report",
                        lambda slug, entity=None, _b=wandb_report.build_report: _b(slug, report_root, entity or "e", "p"))
    assert wandb_report.main(["toy_paper", "--dry-run"]) == 0
    outline = json.loads(capsys.readouterr().out)
    assert outline["blocks"][-1]["block"] == "PanelGrid" and outline["title"].startswith("toy_paper")
    assert "LinePlot: train curves" in outline["blocks"][-1]["panels"]
    assert "MediaBrowser: figures" in outline["blocks"][-1]["panels"]


def test_unknown_paper(report_root):
    (report_root / "params.yaml").write_text("profile: default\npapers:\n  toy_paper: {}\n")
    with pytest.raises(wandb_report.PublishError, match="papers.nope: unknown paper"):
        wandb_report.build_report("nope", root=report_root, entity="e", project="p")


def test_only_panels_with_data(report_root):
    """A fresh clone (no stage runs logged here, only the committed report) gets the verdict panels but
    no empty runtime or curve panels; stage runs add the runtime panel."""
    import shutil

    import wandb_workspaces.reports.v2 as wr

    shutil.rmtree(report_root / "wandb" / "keys")
    grid = wandb_report.build_report("toy_paper", root=report_root, entity="e", project="p").blocks[-1]
    titles = [p.title for p in grid.panels if isinstance(p, wr.BarPlot)]
    assert titles == ["findings (holds / fails / inconclusive) and checks passed",
                      "claim verdicts (1 holds, 0 inconclusive, -1 fails)"]
    assert not [p for p in grid.panels if isinstance(p, wr.LinePlot)]
    keys = report_root / "wandb" / "keys"
    keys.mkdir(parents=True)
    (keys / "toy_paper.train.json").write_text(json.dumps({"history": [], "media": []}))
    grid = wandb_report.build_report("toy_paper", root=report_root, entity="e", project="p").blocks[-1]
    assert "runtime per stage (s)" in [p.title for p in grid.panels if isinstance(p, wr.BarPlot)]
