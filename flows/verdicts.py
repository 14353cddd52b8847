"""Your run against the committed one: which verdicts reproduced, which moved, on what machine.

    python -m flows.verdicts                     # reports/*/claims.json here vs the same files at git HEAD
    python -m flows.verdicts --against 3a9decf   # vs another commit or tag
    python -m flows.verdicts --root /tmp/x       # another checkout (compared with its own git history)
    python -m flows.verdicts --json cmp.json     # the comparison as JSON too
    python -m flows.verdicts --strict            # exit 1 when any verdict moved (scripts, CI)
    python -m flows.verdicts --study reports/studies/sciql_seeds345   # a study vs its paper's committed report

``make repro`` prints it after the last stage. Each claim counts as *reproduced* when its verdict
(holds / inconclusive / fails) equals the committed one; *identical* when its per-seed values are also
equal to the last bit. Training runs are deterministic on one machine, but float results depend on the
CPU's kernels (AVX2, AVX-512, ...): on another CPU the numbers move, and a verdict decided within seed
noise can move to a neighbouring one. The table lists each moved claim with both runs' effect and
t-bounds, how long this run's stages took against the committed runs' (a machine speed check: `make repro` runs
two papers at a time, the committed runs mostly ran alone), and the machine this run used (the committed reports
do not record theirs). Wall-clock claims
(``wallclock: true``) are counted apart: they measure this machine's load as well as the code.

Problems (not a git checkout, an unknown revision, a claims file that is not the report's JSON) print
one line naming the file or revision and exit 2.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.runtimes import runtimes
from flows.proc import ROOT
from stages.common.config import ConfigError, read_params, registered_papers

VERDICTS = ("holds", "inconclusive", "fails")


class VerdictError(ValueError):
    """A comparison that cannot be made (the message names the file or revision)."""


@dataclass
class ClaimRow:
    paper: str
    name: str
    kind: str                      # finding | check
    status: str                    # same | moved | new | gone
    committed: str | None          # verdict at the revision (None: not there)
    current: str | None            # verdict in the checkout (None: not there)
    identical: bool                # per-seed values equal to the last bit (same and moved rows)
    wallclock: bool
    committed_stats: dict[str, float] = field(default_factory=dict)   # mean, lower, upper
    current_stats: dict[str, float] = field(default_factory=dict)


@dataclass
class Comparison:
    revision: str                  # as given
    commit: str                    # its short hash
    rows: list[ClaimRow]
    not_run: list[str]             # papers committed at the revision with no claims in the checkout
    not_committed: list[str]       # papers with claims in the checkout but none at the revision
    runtime_ratio: dict[str, float] = field(default_factory=dict)   # paper: its run's stage seconds / committed

    def counted(self, kind: str | None = None, wallclock: bool = False) -> tuple[int, int]:
        """(reproduced, compared) over the claims present in both runs."""
        rows = in_both(self.rows, kind, wallclock)
        return sum(r.status == "same" for r in rows), len(rows)


def in_both(rows: list[ClaimRow], kind: str | None = None, wallclock: bool = False) -> list[ClaimRow]:
    """The rows of claims present in both runs, of one kind (None: both) and wall-clock or not."""
    return [r for r in rows if r.status in ("same", "moved") and r.wallclock == wallclock
            and (kind is None or r.kind == kind)]


def moved_table(rows: list[ClaimRow], column: str, mark=lambda r: "") -> list[str]:
    """Markdown rows of the claims whose verdict moved, both runs' effect and t-bounds (``column``: the
    second run's header; ``mark(row)``: text after its verdict)."""
    moved = [r for r in rows if r.status == "moved"]
    if not moved:
        return []
    return ["", f"| paper | claim | kind | committed (effect [t-bounds]) | {column} |", "| --- | --- | --- | --- | --- |"] + [
        f"| {r.paper} | {r.name}{' (wall-clock)' if r.wallclock else ''} | {r.kind} | "
        f"{r.committed}{_effect(r.committed_stats)} | {r.current}{_effect(r.current_stats)}{mark(r)} |" for r in moved]


def verdict_of(claim: dict[str, Any]) -> str:
    """The claim's verdict (older claims files carry only ``holds``)."""
    verdict = claim.get("verdict")
    if verdict is None:
        return "holds" if claim.get("holds") else "fails"
    return verdict


def parse_claims(text: str, where: str) -> dict[str, dict[str, Any]]:
    """The claims of one ``reports/<slug>/claims.json`` by name; VerdictError naming ``where`` otherwise."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise VerdictError(f"{where}: not JSON ({err.msg} at line {err.lineno})") from None
    claims = doc.get("claims") if isinstance(doc, dict) else None
    if not isinstance(claims, list):
        raise VerdictError(f"{where}: no `claims` list (is this a report's claims.json?)")
    out: dict[str, dict[str, Any]] = {}
    for i, c in enumerate(claims):
        if not isinstance(c, dict) or not isinstance(c.get("name"), str):
            raise VerdictError(f"{where}: claim {i} has no name")
        if c.get("verdict") is None and not isinstance(c.get("holds"), bool):
            raise VerdictError(f"{where}: claim {c['name']!r} has neither `verdict` nor `holds`")
        if verdict_of(c) not in VERDICTS:
            raise VerdictError(f"{where}: claim {c['name']!r} has verdict {verdict_of(c)!r} "
                               f"(expected one of {', '.join(VERDICTS)})")
        out[c["name"]] = c
    return out


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)


def resolve(root: Path, revision: str) -> str:
    """The short hash of ``revision`` in the git checkout at ``root``."""
    probe = _git(root, "rev-parse", "--is-inside-work-tree")
    if probe.returncode != 0:
        raise VerdictError(f"{root}: not a git checkout (the committed reports are read from its history)")
    out = _git(root, "rev-parse", "--verify", "--quiet", "--short", f"{revision}^{{commit}}")
    if out.returncode != 0 or not out.stdout.strip():
        raise VerdictError(f"{root}: unknown revision {revision!r}")
    return out.stdout.strip()


def committed_text(root: Path, commit: str, path: str) -> str | None:
    """The file at ``commit`` (None when that commit has no such file)."""
    out = _git(root, "show", f"{commit}:{path}")
    return out.stdout if out.returncode == 0 else None


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise VerdictError(f"{path}: not UTF-8 text") from None


def _stats(claim: dict[str, Any]) -> dict[str, float]:
    stats = claim.get("stats") or {}
    return {k: float(stats[k]) for k in ("mean", "lower", "upper")
            if isinstance(stats.get(k), (int, float)) and not isinstance(stats.get(k), bool)}


def _same_values(a: Any, b: Any) -> bool:
    """Equal to the last bit (NaN equals NaN: a value that is undefined in both runs)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_values(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_values(a[k], b[k]) for k in a)
    return a == b


def claim_rows(slug: str, old: dict[str, dict[str, Any]], new: dict[str, dict[str, Any]]) -> list[ClaimRow]:
    """One paper's claims, committed (``old``) against this run's (``new``), in the committed order."""
    rows: list[ClaimRow] = []
    for name in list(old) + [n for n in new if n not in old]:
        o, n = old.get(name), new.get(name)
        ref = n if n is not None else o
        row = ClaimRow(paper=slug, name=name, kind=str(ref.get("kind", "finding")), status="same",
                       committed=verdict_of(o) if o is not None else None,
                       current=verdict_of(n) if n is not None else None, identical=False,
                       wallclock=bool(ref.get("wallclock", False)),
                       committed_stats=_stats(o) if o is not None else {},
                       current_stats=_stats(n) if n is not None else {})
        if o is None:
            row.status = "new"
        elif n is None:
            row.status = "gone"
        else:
            row.status = "same" if row.committed == row.current else "moved"
            row.identical = _same_values(o.get("values"), n.get("values"))
        rows.append(row)
    return rows


def compare(root: Path = ROOT, revision: str = "HEAD", papers: list[str] | None = None) -> Comparison:
    """Every registered paper's claims in the checkout at ``root`` against the same files at ``revision``."""
    root = Path(root)
    commit = resolve(root, revision)
    try:
        registered = registered_papers(read_params(root / "params.yaml"))
    except ConfigError as err:
        raise VerdictError(str(err)) from None
    unknown = [p for p in papers or [] if p not in registered]
    if unknown:
        raise VerdictError(f"unknown paper {unknown[0]!r} (registered: {', '.join(registered)})")
    papers = registered if papers is None else papers
    rows: list[ClaimRow] = []
    not_run: list[str] = []
    not_committed: list[str] = []
    compared: list[str] = []
    for slug in papers:
        rel = f"reports/{slug}/claims.json"
        old_text = committed_text(root, commit, rel)
        path = root / rel
        new = parse_claims(_read_text(path), str(path)) if path.is_file() else None
        old = parse_claims(old_text, f"{rel} at {commit}") if old_text is not None else None
        if old is None and new is None:
            continue
        if new is None:
            not_run.append(slug)
            continue
        if old is None:
            not_committed.append(slug)
            continue
        compared.append(slug)
        rows += claim_rows(slug, old, new)
    return Comparison(revision=revision, commit=commit, rows=rows, not_run=not_run, not_committed=not_committed,
                      runtime_ratio=_runtime_ratio(root, commit, compared))


def _runtime_ratio(root: Path, commit: str, slugs: list[str]) -> dict[str, float]:
    """Per paper, its stage seconds in the checkout over those at ``commit`` (benchmarks.runtimes reads both);
    papers whose report did not re-run (equal totals) or that lack a record are left out."""
    try:
        now, then = runtimes(None, slugs, root), runtimes(commit, slugs, root)
    except ValueError:                  # a metrics.json that is not JSON: no speed check, the verdicts stand
        return {}
    totals = {s: (sum(now[s].values()), sum(then[s].values())) for s in slugs if s in now and s in then}
    return {s: a / b for s, (a, b) in totals.items() if b > 0 and a != b}


def machine() -> dict[str, Any]:
    """What this run's numbers depend on: the CPU (model, the kernels torch picks for it), cores, versions."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info: dict[str, Any] = {"cpu": model, "cores": os.cpu_count(), "python": platform.python_version()}
    try:
        import torch

        info.update(torch=torch.__version__, torch_cpu_capability=torch.backends.cpu.get_cpu_capability())
    except Exception as err:  # noqa: BLE001  (the comparison stands without it)
        info["torch"] = f"unavailable ({type(err).__name__})"
    return info


def _effect(stats: dict[str, float]) -> str:
    if "mean" not in stats:
        return ""
    bounds = f" [{stats['lower']:.3g}, {stats['upper']:.3g}]" if "lower" in stats and "upper" in stats else ""
    return f" ({stats['mean']:.3g}{bounds})"


def format_comparison(cmp: Comparison, info: dict[str, Any] | None = None) -> str:
    same, total = cmp.counted()
    f_same, f_total = cmp.counted("finding")
    c_same, c_total = cmp.counted("check")
    w_same, w_total = cmp.counted(wallclock=True)
    identical = sum(r.identical for r in cmp.rows if r.status in ("same", "moved") and not r.wallclock)
    lines = [f"verdicts vs {cmp.revision} ({cmp.commit}): {same} of {total} committed verdicts reproduced "
             f"(findings {f_same}/{f_total}, checks {c_same}/{c_total}); {identical} of {total} with identical "
             "per-seed values"
             + (f"; wall-clock claims {w_same}/{w_total} (they measure this machine's load too)" if w_total else "")]
    lines += moved_table(cmp.rows, "this run")
    new = [f"{r.paper}/{r.name}" for r in cmp.rows if r.status == "new"]
    gone = [f"{r.paper}/{r.name}" for r in cmp.rows if r.status == "gone"]
    if new:
        lines.append(f"claims not in the committed reports: {', '.join(new)}")
    if gone:
        lines.append(f"committed claims this run did not make: {', '.join(gone)}")
    if cmp.not_run:
        lines.append(f"papers with no claims.json in this checkout (not run?): {', '.join(cmp.not_run)}")
    if cmp.not_committed:
        lines.append(f"papers with no committed claims.json at {cmp.commit}: {', '.join(cmp.not_committed)}")
    if cmp.runtime_ratio:
        ratios = sorted(cmp.runtime_ratio.values())
        median = statistics.median(ratios)
        slow = max(cmp.runtime_ratio, key=cmp.runtime_ratio.get)
        lines.append(f"stage seconds, this run / committed: median {median:.2f}x over {len(ratios)} papers "
                     f"({ratios[0]:.2f}-{ratios[-1]:.2f}x; most: {slow}); runs beside another paper share the cores")
    if info:
        lines.append("this machine: " + ", ".join(f"{k} {v}" for k, v in info.items()))
    return "\n".join(lines)


NEIGHBOURS = {frozenset(("holds", "inconclusive")), frozenset(("fails", "inconclusive"))}


@dataclass
class StudyComparison:
    """A study's claims (``stages.common.study``: the paper's own pipeline with some params changed) against
    its paper's committed report. With only seed lists changed it is a replication on fresh draws."""
    study: str                     # the study folder
    paper: str
    overrides: list[str]
    commit: str                    # the committed reports' commit
    rows: list[ClaimRow]

    def counted(self, kind: str | None = None, wallclock: bool = False) -> tuple[int, int, int]:
        """(same verdict, moved to the opposite verdict (holds <-> fails), compared) over claims in both."""
        rows = in_both(self.rows, kind, wallclock)
        return (sum(r.status == "same" for r in rows), sum(r.status == "moved" and not neighbours(r) for r in rows),
                len(rows))


def neighbours(row: ClaimRow) -> bool:
    """A move between neighbouring verdicts (to or from inconclusive), not holds <-> fails."""
    return frozenset((row.committed, row.current)) in NEIGHBOURS


def compare_study(study: Path, root: Path = ROOT, revision: str = "HEAD") -> StudyComparison:
    """The study folder's ``claims.json`` against ``reports/<its paper>/claims.json`` at ``revision``."""
    study, root = Path(study), Path(root)
    info_path = study / "study.json"
    if not info_path.is_file():
        raise VerdictError(f"{info_path}: no study.json (is {study} a study folder of stages.common.study?)")
    try:
        info = json.loads(_read_text(info_path))
    except json.JSONDecodeError as err:
        raise VerdictError(f"{info_path}: not JSON ({err.msg} at line {err.lineno})") from None
    slug = info.get("slug") if isinstance(info, dict) else None
    if not isinstance(slug, str):
        raise VerdictError(f"{info_path}: no `slug` naming the study's paper")
    claims_path = study / "claims.json"
    if not claims_path.is_file():
        raise VerdictError(f"{claims_path}: missing (the study did not finish?)")
    new = parse_claims(_read_text(claims_path), str(claims_path))
    commit = resolve(root, revision)
    rel = f"reports/{slug}/claims.json"
    old_text = committed_text(root, commit, rel)
    if old_text is None:
        raise VerdictError(f"{rel}: not committed at {commit} (the study's paper has no committed report)")
    old = parse_claims(old_text, f"{rel} at {commit}")
    overrides = info.get("overrides") if isinstance(info.get("overrides"), list) else []
    return StudyComparison(study=study.name, paper=slug, overrides=[str(o) for o in overrides], commit=commit,
                           rows=claim_rows(slug, old, new))


def format_studies(studies: list[StudyComparison], revision: str = "HEAD") -> str:
    """One row per study (findings and checks apart, wall-clock claims apart), then every claim whose verdict
    moved with both runs' effect and t-bounds; moves between holds and fails are marked."""
    if not studies:
        return "no studies compared"
    commits = sorted({s.commit for s in studies})
    tot = [0, 0, 0, 0]
    lines = [f"study verdicts vs the committed reports at {revision} ({', '.join(commits)})", "",
             "| study | paper | overrides | findings same | checks same | holds <-> fails | identical values | "
             "wall-clock same |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for s in studies:
        f_same, f_opp, f_n = s.counted("finding")
        c_same, c_opp, c_n = s.counted("check")
        w_same, _, w_n = s.counted(wallclock=True)
        for i, v in enumerate((f_same + c_same, f_opp + c_opp, f_n + c_n)):
            tot[i] += v
        sets = ", ".join(f"`{o}`" for o in s.overrides) or "none"
        ident = sum(r.identical for r in in_both(s.rows))
        tot[3] += ident
        lines.append(f"| {s.study} | {s.paper} | {sets} | {f_same}/{f_n} | {c_same}/{c_n} | {f_opp + c_opp} | "
                     f"{ident} | " + (f"{w_same}/{w_n} |" if w_n else "- |"))
    lines += ["", f"{tot[0]} of {tot[2]} committed verdicts the same in the studies, {tot[1]} moved between holds "
                  "and fails, the rest between a verdict and inconclusive; "
                  f"{tot[3]} of the {tot[2]} with values identical to the committed ones to the last bit (claims the "
                  "changed params do not reach, or values at a bound such as an accuracy of 1)"]
    lines += moved_table([r for s in studies for r in s.rows], "study",
                         lambda r: "" if neighbours(r) else " (**opposite**)")
    for s in studies:
        new = [r.name for r in s.rows if r.status == "new"]
        gone = [r.name for r in s.rows if r.status == "gone"]
        if new:
            lines.append(f"{s.study}: claims not in the committed report: {', '.join(new)}")
        if gone:
            lines.append(f"{s.study}: committed claims the study did not make: {', '.join(gone)}")
    return "\n".join(lines)


def summary_lines(root: Path, revision: str = "HEAD") -> list[str]:
    """The comparison as printable lines, or one line saying why there is none (never raises for a
    checkout it cannot compare: ``make repro`` prints this after its last stage)."""
    try:
        return format_comparison(compare(root, revision), machine()).splitlines()
    except (VerdictError, OSError) as err:
        return [f"verdicts: not compared with the committed reports ({err})"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.verdicts", description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="HEAD", help="the git revision holding the committed reports (HEAD)")
    parser.add_argument("--root", default=str(ROOT), help="the checkout whose reports/ to compare (default: this one)")
    parser.add_argument("--papers", nargs="+", default=None, help="only these papers")
    parser.add_argument("--json", default=None, help="also write the comparison (and the machine) to this file")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a verdict moved")
    parser.add_argument("--study", nargs="+", default=None, metavar="DIR",
                        help="compare these study folders (stages.common.study) with their papers' committed reports "
                             "instead of the checkout's reports")
    args = parser.parse_args(argv)
    if args.study:
        try:
            studies = [compare_study(Path(d), Path(args.root).resolve(), args.against) for d in args.study]
        except (VerdictError, OSError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print(format_studies(studies, args.against))
        if args.json:
            Path(args.json).write_text(json.dumps([asdict(s) for s in studies], indent=1) + "\n")
        return 1 if args.strict and any(r.status == "moved" for s in studies for r in s.rows) else 0
    try:
        cmp = compare(Path(args.root).resolve(), args.against, args.papers)
    except (VerdictError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    info = machine()
    print(format_comparison(cmp, info))
    if args.json:
        Path(args.json).write_text(json.dumps({**asdict(cmp), "machine": info}, indent=1) + "\n")
    return 1 if args.strict and any(r.status == "moved" for r in cmp.rows) else 0


if __name__ == "__main__":
    sys.exit(main())
