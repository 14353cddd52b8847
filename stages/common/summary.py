"""The scoreboard: every registered paper's claims and runtimes in reports/summary.{md,json},
and the same table in README.md between the results markers."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from stages.common.claims import findings_line, findings_summary
from stages.common.config import ConfigError, read_params, registered_papers
from stages.common.paths import ROOT, atomic_write_text, read_json, write_json

START, END = "<!-- results:start -->", "<!-- results:end -->"


def collect(root: Path = ROOT) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for slug in registered_papers(read_params(root / "params.yaml")):
        path = root / "reports" / slug / "metrics.json"
        if not path.exists():
            raise ConfigError(f"reports/{slug}/metrics.json: missing; run `dvc repro report@{slug}` first")
        try:
            doc = read_json(path)
        except (OSError, UnicodeDecodeError, ValueError) as err:
            raise ConfigError(f"reports/{slug}/metrics.json: unreadable ({type(err).__name__}: "
                              f"{str(err).splitlines()[0][:80]})") from None
        if not isinstance(doc, dict) or "claims" not in doc or "runtime_s" not in doc:
            raise ConfigError(f"reports/{slug}/metrics.json: lacks 'claims' or 'runtime_s'")
        claims_file = root / "reports" / slug / "claims.json"
        if claims_file.exists():  # the declared output the summary stage depends on
            doc = {**doc, "claims": read_json(claims_file)["claims"]}
        missing_kind = [c.get("name") for c in doc["claims"] if c.get("kind") not in ("finding", "check")]
        if missing_kind:
            raise ConfigError(f"reports/{slug}/metrics.json: claim {missing_kind[0]!r} has no kind "
                              f"(finding/check); re-run `dvc repro report@{slug}`")
        summary[slug] = {"claims": doc["claims"], "findings": findings_summary(doc["claims"]),
                         "runtime_s": doc["runtime_s"], "kernels": doc.get("kernels", {}),
                         "profile": doc.get("profile", "default")}
    return summary


def _verdict(claim: dict[str, Any]) -> str:
    return claim.get("verdict") or ("holds" if claim["holds"] else "fails")


def _kernels_cell(kernels: dict[str, Any]) -> str:
    if not kernels:
        return "none recorded"
    cells = []
    for name, e in kernels.items():
        parity = e.get("parity_max_abs_err")
        checked = f", {e.get('parity_backend')} Δ {parity:.1g}" if parity is not None else ", parity unchecked"
        cells.append(f"{name} ({e['backend']}{checked})")
    return "; ".join(cells)


def results_table(summary: dict[str, Any], link_prefix: str = "reports/") -> str:
    """One row per paper: findings (hold / fail / inconclusive) first, checks apart, then every verdict."""
    lines = ["| paper | findings (hold / fail / inconclusive) | checks pass | finding verdicts | check verdicts | "
             "kernels (path, Triton parity) | runtime (default profile) | report |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for slug, entry in summary.items():
        claims = entry["claims"]
        c = findings_summary(claims)
        find = "; ".join(f"{x['name']}: {_verdict(x)}" for x in claims if x.get("kind") == "finding") or "—"
        chk = "; ".join(f"{x['name']}: {'pass' if _verdict(x) == 'holds' else _verdict(x)}"
                        for x in claims if x.get("kind") == "check") or "—"
        total = sum(v for v in entry["runtime_s"].values() if v is not None)
        lines.append(f"| {slug} | {c['findings_holds']} / {c['findings_fails']} / {c['findings_inconclusive']} "
                     f"| {c['checks_pass']}/{c['checks']} | {find} | {chk} | "
                     f"{_kernels_cell(entry.get('kernels', {}))} | {total:.0f} s | "
                     f"[report]({link_prefix}{slug}/report.md) |")
    return "\n".join(lines)


def claims_line(slug: str, root: Path = ROOT) -> str:
    """One line per paper for the end of a run:
    'opus: findings: 3 hold, 1 fails, 2 inconclusive; checks: 5/5 pass'."""
    path = root / "reports" / slug / "metrics.json"
    if not path.exists():
        raise ConfigError(f"reports/{slug}/metrics.json: missing; run `dvc repro report@{slug}` first")
    doc = read_json(path)
    return f"{slug}: {findings_line(doc['claims'])}"


def claims_table(slugs: list[str], root: Path = ROOT) -> str:
    """Every claim of every paper, one row each (findings first): the cross-paper view of the verdicts."""
    rows = []
    for slug in slugs:
        path = root / "reports" / slug / "metrics.json"
        if not path.exists():
            raise ConfigError(f"reports/{slug}/metrics.json: missing; run `dvc repro report@{slug}` first")
        for c in read_json(path)["claims"]:
            st = c.get("stats") or {}
            gap = f"{st['mean']:.3g}" if "mean" in st else "—"
            bounds = f"[{st['lower']:.3g}, {st['upper']:.3g}]" if "lower" in st else "—"
            thr = ", ".join(f"{k} {v:g}" for k, v in (c.get("params") or {}).items() if isinstance(v, (int, float)))
            rows.append((0 if c.get("kind") == "finding" else 1, slug, c.get("kind", "?"), c["name"], _verdict(c),
                         gap, bounds, thr or "—"))
    rows.sort(key=lambda r: (r[0], r[1]))
    lines = ["| paper | kind | claim | verdict | gap | 95% t-bounds | thresholds |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {' | '.join(r[1:])} |" for r in rows]
    return "\n".join(lines)


def plots_section(root: Path = ROOT) -> list[dict[str, Any]]:
    """dvc.yaml's top-level `plots:` from every registered paper's plots/_specs.json (CSV files with
    their x/y/title) plus its figures/ folder as image plots."""
    out: list[dict[str, Any]] = []
    for slug in registered_papers(read_params(root / "params.yaml")):
        plots = root / "reports" / slug / "plots"
        specs_file = plots / "_specs.json"
        specs = read_json(specs_file) if specs_file.exists() else {}
        for csv in sorted(plots.glob("*.csv")):
            spec = specs.get(csv.stem)
            if spec is None:  # a report written before plot specs existed: first column vs the rest
                header = csv.read_text().splitlines()[0].split(",")
                spec = {"x": header[0], "y": header[1:], "title": csv.stem.replace("_", " "), "template": "linear"}
            y = spec["y"][0] if len(spec["y"]) == 1 else spec["y"]
            out.append({f"reports/{slug}/plots/{csv.name}": {"x": spec["x"], "y": y,
                                                               "title": f"{slug}: {spec['title']}",
                                                               "template": spec.get("template", "linear")}})
        if (root / "reports" / slug / "figures").is_dir():
            out.append({f"reports/{slug}/figures": {}})
    return out


def update_dvc_plots(root: Path = ROOT) -> int:
    """Rewrite only the top-level `plots:` block of dvc.yaml (between its markers)."""
    import yaml

    path = root / "dvc.yaml"
    text = path.read_text()
    start, end = "# plots:start (generated by `python -m stages dvcplots`)", "# plots:end"
    if start not in text or end not in text:
        raise ConfigError(f"dvc.yaml: missing the '{start}' / '{end}' markers")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    section = plots_section(root)
    body = yaml.safe_dump({"plots": section}, sort_keys=False, default_flow_style=False, width=200) if section else ""
    atomic_write_text(path, f"{head}{start}\n{body}{end}{tail}")
    return len(section)


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


def repro_failures(log_path: str | Path) -> list[str]:
    """The papers whose stages failed in a `dvc repro --keep-going` log, each with the stage's own one-line
    error (what `make repro` prints at the end so one failure does not hide eighteen results)."""
    import re

    path = Path(log_path)
    if not path.exists():
        return [f"dvc repro: no log at {path}"]
    failed: dict[str, tuple[str, str]] = {}
    last_error = ""
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("error: ") or "Error:" in line:
            last_error = line.strip()
        m = re.search(r"failed to reproduce '([a-z_]+)@([a-z0-9_]+)'", line)
        if m and m.group(2) not in failed:
            failed[m.group(2)] = (m.group(1), last_error or line.strip())
    if not failed:
        return []
    return [f"{len(failed)} paper(s) failed:"] + [f"  {slug}: {stage} — {why}" for slug, (stage, why) in failed.items()]
