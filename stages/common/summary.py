"""The scoreboard: every registered paper's claims and runtimes in reports/summary.{md,json},
and the same table in README.md between the results markers."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from stages.common.config import ConfigError, read_params, registered_papers
from stages.common.paths import ROOT, atomic_write_text, read_json, write_json

START, END = "<!-- results:start -->", "<!-- results:end -->"


def collect(root: Path = ROOT) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for slug in registered_papers(read_params(root / "params.yaml")):
        path = root / "reports" / slug / "metrics.json"
        if not path.exists():
            raise ConfigError(f"reports/{slug}/metrics.json: missing; run `dvc repro report@{slug}` first")
        doc = read_json(path)
        if "claims" not in doc or "runtime_s" not in doc:
            raise ConfigError(f"reports/{slug}/metrics.json: lacks 'claims' or 'runtime_s'")
        summary[slug] = {"claims": doc["claims"], "runtime_s": doc["runtime_s"],
                         "profile": doc.get("profile", "default")}
    return summary


def results_table(summary: dict[str, Any], link_prefix: str = "reports/") -> str:
    lines = ["| paper | claims held | verdicts | runtime (default profile) | report |",
             "| --- | --- | --- | --- | --- |"]
    for slug, entry in summary.items():
        claims = entry["claims"]
        held = sum(c["holds"] for c in claims)
        verdicts = "; ".join(f"{c['name']}: {'holds' if c['holds'] else 'does not hold'}" for c in claims)
        total = sum(entry["runtime_s"].values())
        lines.append(f"| {slug} | {held}/{len(claims)} | {verdicts} | {total:.0f} s | "
                     f"[report]({link_prefix}{slug}/report.md) |")
    return "\n".join(lines)


def write_summary(root: Path = ROOT) -> dict[str, Any]:
    summary = collect(root)
    write_json(root / "reports" / "summary.json", summary)
    md = ["# Scoreboard", "", "Each paper's claims, as measured by its own pipeline "
          "(`dvc repro`); a claim that did not hold at this scale is reported as such.", "",
          results_table(summary, link_prefix=""), ""]
    atomic_write_text(root / "reports" / "summary.md", "\n".join(md))
    return summary


def update_readme(root: Path = ROOT) -> None:
    readme = root / "README.md"
    text = readme.read_text()
    if START not in text or END not in text:
        raise ConfigError(f"README.md: missing the {START} / {END} markers")
    summary = read_json(root / "reports" / "summary.json")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    atomic_write_text(readme, f"{head}{START}\n{results_table(summary)}\n{END}{tail}")
