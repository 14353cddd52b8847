"""A W&B Report per paper: its title, the report.md text, and a panel grid over the paper's runs
(the W&B group ``<slug>``), grouped by stage (the run's ``job_type``).

    python -m flows.wandb_report reversal_curse            # build and publish (needs online + API key)
    python -m flows.wandb_report reversal_curse --dry-run  # build only, print its outline

Runs are logged offline by default; upload them first (``make wandb-sync``, after ``wandb login``),
then publish with ``WANDB_MODE=online``. Without online mode or an API key, publishing stops with
one line saying so (exit 2).
"""
from __future__ import annotations

import argparse
import json
import netrc
import os
import sys
from pathlib import Path
from urllib.parse import urlparse

from flows.proc import ROOT


class PublishError(RuntimeError):
    """Publishing is impossible here (offline mode, no API key, missing report)."""


def _project() -> str:
    from stages.common.tracking import PROJECT

    return PROJECT


def logged_keys(slug: str, root: Path = ROOT) -> dict[str, list[str]]:
    """History and media keys the paper's stage runs logged (wandb/keys/<slug>.<stage>.json, written
    by stages.common.tracking); figures under reports/<slug>/figures count as media keys too; ``stages``:
    the pipeline stages whose runs were logged here (their runtimes)."""
    history: set[str] = set()
    media: set[str] = set()
    stages: set[str] = set()
    for path in sorted((Path(root) / "wandb" / "keys").glob(f"{slug}.*.json")):
        data = json.loads(path.read_text())
        history.update(data.get("history", []))
        media.update(data.get("media", []))
        stage = path.name[len(slug) + 1:].removesuffix(".json")
        if stage in ("prepare", "train", "evaluate"):
            stages.add(stage)
    media.update(f"figures/{p.stem}" for p in (Path(root) / "reports" / slug / "figures").glob("*.png"))
    return {"history": sorted(history), "media": sorted(media), "stages": sorted(stages)}


def _curve_panels(wr, history: list[str]) -> list:
    """One line plot per key prefix (``train/*``, ``val/*``, ...), each over that prefix's keys."""
    groups: dict[str, list[str]] = {}
    for key in history:
        if key in ("epoch", "trainer/global_step", "runtime_s"):
            continue
        prefix = key.split("/", 1)[0] if "/" in key else key.split("_", 1)[0]
        groups.setdefault(prefix, []).append(key)
    return [wr.LinePlot(title=f"{prefix} curves", x="Step", y=keys[:12]) for prefix, keys in sorted(groups.items())]


def build_report(slug: str, root: Path = ROOT, entity: str | None = None, project: str | None = None):
    """The ``wandb_workspaces.reports.v2.Report`` for ``slug`` (built offline; nothing is sent)."""
    import wandb_workspaces.reports.v2 as wr

    params = Path(root) / "params.yaml"
    if params.exists():
        from stages.common.config import read_params

        registered = list(read_params(params)["papers"])
        if slug not in registered:
            raise PublishError(f"papers.{slug}: unknown paper (registered: {', '.join(registered)})")
    report_dir = Path(root) / "reports" / slug
    md_path, metrics_path = report_dir / "report.md", report_dir / "metrics.json"
    if not md_path.exists():
        raise PublishError(f"{md_path}: missing; run `dvc repro report@{slug}` first")
    text = md_path.read_text()
    metrics = json.loads(metrics_path.read_text()) if metrics_path.exists() else {}
    claims = metrics.get("claims", [])
    title = next((line.lstrip("# ").strip() for line in text.splitlines() if line.startswith("# ")), slug)
    verdicts = ", ".join(f"{c['name']}: {c.get('verdict') or ('holds' if c['holds'] else 'does not hold')}"
                         for c in claims)
    keys = logged_keys(slug, root)
    project = project or _project()
    entity = entity or os.environ.get("WANDB_ENTITY", "")  # "" = the API key's default entity

    runs = wr.Runset(entity=entity, project=project, name=f"{slug} runs",
                     filters=f"Group = '{slug}'", groupby=["JobType"])  # one group per stage
    # only panels whose data exists: verdicts and findings come from the report run (the report stage,
    # or `python -m stages wandb-log`, which logs the committed report when DVC skipped the stage);
    # runtimes only when stage runs were logged here; curves and figures only for logged keys
    panels = []
    if claims:
        panels.append(wr.BarPlot(title="findings (holds / fails / inconclusive) and checks passed",
                                 metrics=[wr.SummaryMetric(k) for k in ("findings_holds", "findings_fails",
                                                                        "findings_inconclusive", "checks_pass")]))
        panels.append(wr.BarPlot(title="claim verdicts (1 holds, 0 inconclusive, -1 fails)",
                                 metrics=[wr.SummaryMetric(f"claim/{c['name']}") for c in claims]))
    if keys["stages"]:
        panels.append(wr.BarPlot(title="runtime per stage (s)", metrics=[wr.SummaryMetric("runtime_s")],
                                 groupby="JobType"))
    panels += _curve_panels(wr, keys["history"])
    if keys["media"]:
        panels.append(wr.MediaBrowser(title="figures", media_keys=keys["media"], num_columns=2))
    panels.append(wr.RunComparer(diff_only=True))
    grid = wr.PanelGrid(runsets=[runs], panels=panels)
    blocks = [
        wr.H1(title),
        wr.P(f"Paper pipeline `{slug}` — claims: {verdicts or 'none reported'}."),
        wr.MarkdownBlock(text=text),
        wr.H2("Runs, grouped by stage"),
        grid,
    ]
    return wr.Report(project=project, entity=entity, title=f"{slug}: {title}",
                     description=f"DVC + Lightning + Prefect pipeline for {slug}", blocks=blocks)


def _api_key() -> str | None:
    if os.environ.get("WANDB_API_KEY"):
        return os.environ["WANDB_API_KEY"]
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    try:
        auth = netrc.netrc().authenticators(host)
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return None
    return auth[2] if auth else None


def publish_check() -> None:
    mode = os.environ.get("WANDB_MODE", "offline")
    if mode != "online":
        raise PublishError(f"W&B report: publishing needs WANDB_MODE=online (it is {mode!r}); "
                           "run `make wandb-sync` and retry with WANDB_MODE=online")
    if not _api_key():
        raise PublishError("W&B report: no API key (set WANDB_API_KEY or run `wandb login`)")


def publish(report) -> str:
    publish_check()
    report.save()
    return report.url


def outline(report) -> dict:
    blocks = []
    for b in report.blocks:
        entry: dict = {"block": type(b).__name__}
        if hasattr(b, "panels"):
            entry["panels"] = [f"{type(p).__name__}: {getattr(p, 'title', None) or ''}".rstrip(": ") for p in b.panels]
        blocks.append(entry)
    return {"title": report.title, "project": report.project, "blocks": blocks}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.wandb_report", description=__doc__.splitlines()[0])
    parser.add_argument("slug")
    parser.add_argument("--dry-run", action="store_true", help="build the report only; print its outline")
    parser.add_argument("--entity", default=None)
    args = parser.parse_args(argv)
    try:
        if not args.dry_run:
            publish_check()  # before building: a clear line instead of a network traceback
        report = build_report(args.slug, entity=args.entity)
        if args.dry_run:
            print(json.dumps(outline(report), indent=2))
            return 0
        print(f"W&B report published: {publish(report)}")
        return 0
    except PublishError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
