"""Per-stage default-profile runtimes of the committed runs: one git revision against another (or this tree).

    python -m benchmarks.runtimes --before 1e2828a                 # then vs the working tree, slowest 8
    python -m benchmarks.runtimes --before 1e2828a --after HEAD --top 19

Reads ``runtime_s`` (wall-clock seconds per stage, written by the stage runner) from every paper's
``reports/<slug>/metrics.json`` at both revisions and prints one markdown table: the papers that were
slowest before, each stage before -> after, the paper's total and the ratio, then the sum over every
paper. The numbers are what the committed runs recorded: they move with the machine and its load as
well as with the code (README "Runtime" says how each set was measured).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from stages.common.config import STAGES, read_params, registered_papers

ROOT = Path(__file__).resolve().parents[1]


def _metrics_at(rev: str | None, slug: str, root: Path) -> dict:
    rel = f"reports/{slug}/metrics.json"
    if rev is None:
        path = root / rel
        return json.loads(path.read_text()) if path.exists() else {}
    out = subprocess.run(["git", "show", f"{rev}:{rel}"], cwd=root, capture_output=True, text=True)
    return json.loads(out.stdout) if out.returncode == 0 else {}


def runtimes(rev: str | None, slugs: list[str], root: Path = ROOT) -> dict[str, dict[str, float]]:
    """{slug: {stage: seconds}} at ``rev`` (None: the working tree); papers without a record are left out."""
    table = {}
    for slug in slugs:
        rt = _metrics_at(rev, slug, root).get("runtime_s") or {}
        stages = {s: float(rt[s]) for s in STAGES if isinstance(rt.get(s), (int, float))}
        if stages:
            table[slug] = stages
    return table


def markdown(before: dict, after: dict, top: int) -> str:
    total = lambda d: sum(d.values())  # noqa: E731
    slowest = sorted(before, key=lambda s: -total(before[s]))[:top]
    head = "| paper | " + " | ".join(f"{s} (s)" for s in STAGES) + " | total (s) | after / before |"
    rows = [head, "| " + " | ".join(["---"] * (len(STAGES) + 3)) + " |"]
    for slug in slowest:
        b, a = before[slug], after.get(slug, {})
        cells = [f"{b[s]:.0f} → {a[s]:.0f}" if s in b and s in a else "—" for s in STAGES]
        ratio = f"{total(a) / total(b):.2f}" if a and total(b) > 0 else "—"
        rows.append(f"| {slug} | " + " | ".join(cells) + f" | {total(b):.0f} → {total(a):.0f} | {ratio} |")
    both = [s for s in before if s in after]
    tb, ta = sum(total(before[s]) for s in both), sum(total(after[s]) for s in both)
    rows.append(f"| all {len(both)} papers | | | | | {tb:.0f} → {ta:.0f} ({tb / 60:.0f} → {ta / 60:.0f} min) | "
                f"{ta / tb:.2f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.runtimes", description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="git revision of the earlier committed runs")
    parser.add_argument("--after", default=None, help="git revision (default: the working tree)")
    parser.add_argument("--top", type=int, default=8, help="the slowest this many papers (before)")
    args = parser.parse_args(argv)
    slugs = registered_papers(read_params(ROOT / "params.yaml"))
    for rev in filter(None, (args.before, args.after)):
        if subprocess.run(["git", "rev-parse", "--verify", "-q", f"{rev}^{{commit}}"], cwd=ROOT,
                          capture_output=True).returncode != 0:
            print(f"error: {rev!r} is not a git revision of this repository", file=sys.stderr)
            return 2
    if args.top < 1:
        print(f"error: --top: expected a positive number of papers (got {args.top})", file=sys.stderr)
        return 2
    before, after = runtimes(args.before, slugs), runtimes(args.after, slugs)
    if not before:
        print(f"error: no paper has runtimes at {args.before}", file=sys.stderr)
        return 2
    print(markdown(before, after, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
