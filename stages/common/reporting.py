"""The report stage's writer: report.md, metrics.json, figures/*.png, plots/*.csv, and W&B.

    rep = Report(ctx, title="...", claim="the paper's headline, in words")
    rep.section("Setup", "...markdown...")
    rep.table("Results", frame)                  # polars DataFrame -> markdown + wandb.Table
    rep.figure("acc_vs_step", fig, "caption")    # matplotlib Figure -> figures/acc_vs_step.png
    rep.plot("acc_vs_step", frame, x="step", y=["AB", "none"], title="held-out accuracy")
                                                 # plots/acc_vs_step.csv + its x/y spec for `dvc plots show`
    rep.finish(CLAIMS, metrics)                  # verdicts + metrics.json + report.md

Outputs in reports/<slug>/:
- metrics.json: {"slug", "profile", "command", "claims": [{"name", "statement", "check", "holds",
  "verdict", "values", "refuted_by", ("stats")}], "kernels": {name: {"backend", "calls",
  "parity_max_abs_err", "parity_backend", "slice"}}, "runtime_s": {stage: s}, "metrics": {...}}
- dvc_metrics.json: flat scalars for `dvc metrics show/diff` (claim.<name> = 1/0, claim.<name>.verdict
  as 1 holds / 0 inconclusive / -1 fails, and every scalar a claim reads; per-seed lists as their mean)
- plots/<name>.csv and plots/_specs.json (x, y, title per CSV; `python -m stages dvcplots` turns the
  specs into dvc.yaml's top-level `plots:`), figures/<name>.png
- report.md. Timings (runtime_s) appear only in metrics.json and report.md, which are not DVC-hashed
  outputs: DVC hashes dvc_metrics.json, plots/ and figures/, which are byte-identical across reruns.
"""
from __future__ import annotations

import json
from typing import Any

import matplotlib

matplotlib.use("Agg")

import polars as pl  # noqa: E402

import math  # noqa: E402
import os  # noqa: E402

from stages.common.claims import AnyClaim, evaluate_claims  # noqa: E402
from stages.common.paths import atomic_write_text, stage_dir, write_json  # noqa: E402

VERDICT_CODE = {"holds": 1, "inconclusive": 0, "fails": -1}
VERDICT_TEXT = {"holds": "holds", "inconclusive": "*inconclusive*", "fails": "**fails**"}


def producing_command(slug: str) -> str:
    """How this report was produced: dvc exp run, dvc repro, or the stage CLI directly."""
    if os.environ.get("DVC_EXP_NAME") or os.environ.get("DVC_EXP_BASELINE_REV"):
        return "dvc exp run"
    if os.environ.get("DVC_ROOT") or os.environ.get("DVC_STAGE"):
        return f"dvc repro report@{slug}"
    return f"python -m stages report {slug}"


_TIME_NAME = __import__("re").compile(r"(^|_)(s|ms|sec|seconds|runtime|time|timing)($|_)")


def is_wallclock_key(key: str, wallclock=()) -> bool:
    """A metric measured in wall-clock time: under a declared subtree, or named like one
    (`*_s`, `*_ms`, `runtime*`, `time_*`, `timing`)."""
    parts = key.split(".")
    return any(key == w or key.startswith(w + ".") for w in wallclock) or any(_TIME_NAME.search(p) for p in parts)


def flat_scalars(verdicts: list[dict[str, Any]]) -> dict[str, float]:
    """dvc_metrics.json: one scalar per claim verdict and per number a claim reads."""
    out: dict[str, float] = {}
    for v in verdicts:
        out[f"claim.{v['name']}"] = int(v["holds"])
        out[f"claim.{v['name']}.verdict"] = VERDICT_CODE[v["verdict"]]
        for key, val in v["values"].items():
            try:
                float(key)
                continue  # a constant operand of the check (e.g. a threshold), not a measurement
            except ValueError:
                pass
            if isinstance(val, list):
                val = sum(val) / len(val) if val else float("nan")
            if isinstance(val, bool):
                val = int(val)
            if isinstance(val, (int, float)) and math.isfinite(val):
                out[f"{v['name']}.{key}"] = round(float(val), 6)
    return out


def markdown_table(frame: pl.DataFrame, float_fmt: str = "{:.4g}") -> str:
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return float_fmt.format(v)
        return str(v)

    header = "| " + " | ".join(frame.columns) + " |"
    rule = "| " + " | ".join("---" for _ in frame.columns) + " |"
    rows = ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.iter_rows()]
    return "\n".join([header, rule, *rows])


class Report:
    def __init__(self, ctx, title: str, claim: str):
        self.ctx = ctx
        self.title = title
        self.claim = claim
        self.parts: list[str] = []
        self.figures: list[str] = []
        self.plots: dict[str, dict[str, Any]] = {}
        (ctx.out / "figures").mkdir(parents=True, exist_ok=True)
        (ctx.out / "plots").mkdir(parents=True, exist_ok=True)

    def section(self, heading: str, markdown: str) -> None:
        self.parts.append(f"## {heading}\n\n{markdown.strip()}\n")

    def table(self, heading: str, frame: pl.DataFrame, note: str = "") -> None:
        body = markdown_table(frame) + (f"\n\n{note.strip()}" if note else "")
        self.parts.append(f"## {heading}\n\n{body}\n")
        if self.ctx.tracker is not None:
            self.ctx.tracker.log_table(heading.lower().replace(" ", "_"), frame)

    def figure(self, name: str, fig, caption: str) -> None:
        import matplotlib.pyplot as plt

        path = self.ctx.out / "figures" / f"{name}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        self.figures.append(name)
        self.parts.append(f"![{caption}](figures/{name}.png)\n\n*{caption}*\n")
        if self.ctx.tracker is not None:
            self.ctx.tracker.log_image(f"figures/{name}", path)

    def plot(self, name: str, frame: pl.DataFrame, x: str | None = None, y: str | list[str] | None = None,
             title: str = "", template: str = "linear") -> None:
        """plots/<name>.csv for `dvc plots show`, with its x/y fields (default: first column vs the rest)."""
        x = x or frame.columns[0]
        ys = [y] if isinstance(y, str) else list(y or [c for c in frame.columns if c != x])
        missing = [c for c in [x, *ys] if c not in frame.columns]
        if missing:
            raise ValueError(f"report@{self.ctx.slug}: plot {name!r} has no column {missing[0]!r}")
        frame.write_csv(self.ctx.out / "plots" / f"{name}.csv")
        self.plots[name] = {"x": x, "y": ys, "title": title or name.replace("_", " "), "template": template}

    def finish(self, claims: list[AnyClaim], metrics: dict[str, Any],
               wallclock: tuple[str, ...] | list[str] = ()) -> list[dict[str, Any]]:
        """wallclock: metric subtrees measured in wall-clock time (speed, scaling exponents). A claim
        reading them is marked "wall-clock" (its verdict may change with machine load); everything
        else must be identical across reruns with the same params (tests/common/test_determinism.py)."""
        from kernels.record import describe, merge_records

        if not self.figures:
            raise RuntimeError(f"report@{self.ctx.slug}: a report needs at least one figure")
        verdicts = evaluate_claims(claims, metrics)
        for v in verdicts:
            if any(is_wallclock_key(k, wallclock) for k in v["values"]):
                v["wallclock"] = True
        kernels = merge_records(*(stage_dir(self.ctx.slug, s, self.ctx.root) for s in ("train", "evaluate")))
        runtime = self.ctx.upstream_runtimes()
        runtime["report"] = round(self.ctx.elapsed(), 3)
        command = producing_command(self.ctx.slug)
        doc = {"slug": self.ctx.slug, "profile": self.ctx.profile, "command": command, "claims": verdicts,
               "kernels": kernels, "runtime_s": runtime, "wallclock": sorted(wallclock), "metrics": metrics}
        write_json(self.ctx.out / "metrics.json", doc)
        write_json(self.ctx.out / "dvc_metrics.json", flat_scalars(verdicts))
        write_json(self.ctx.out / "plots" / "_specs.json", self.plots)
        self.section("Kernel paths", describe(kernels))
        atomic_write_text(self.ctx.out / "report.md", self._markdown(verdicts, runtime, command))
        if self.ctx.tracker is not None:
            held = sum(v["holds"] for v in verdicts)
            self.ctx.tracker.summary({"claims_held": held, "claims_total": len(verdicts),
                                      **{f"claim/{v['name']}": VERDICT_CODE[v["verdict"]] for v in verdicts},
                                      **{f"metric/{k}": v for k, v in flat_scalars(verdicts).items()}})
        return verdicts

    def _markdown(self, verdicts: list[dict[str, Any]], runtime: dict[str, float | None], command: str) -> str:
        lines = [f"# {self.title}", "", f"**Paper's claim.** {self.claim.strip()}", "",
                 f"Profile: `{self.ctx.profile}` — generated by `{command}`; "
                 "every number below is read from this run's `metrics.json`.", ""]
        held = sum(v["holds"] for v in verdicts)
        lines.append(f"## Verdicts ({held}/{len(verdicts)} hold)\n")
        lines.append("| claim | verdict | statement | measured | would have refuted it |")
        lines.append("| --- | --- | --- | --- | --- |")
        for v in verdicts:
            vals = "; ".join(f"{k} = {_fmt(x)}" for k, x in v["values"].items())
            st = v.get("stats") or {}
            if "mean" in st:
                vals += f"; mean gap {st['mean']:.4g} ± {2 * st['se']:.2g} (2 s.e.), n = {int(st['n'])}"
            clock = " (wall-clock)" if v.get("wallclock") else ""
            lines.append(f"| {v['name']} | {VERDICT_TEXT[v['verdict']]}{clock} | {v['statement']} | "
                         f"{vals} (check: `{v['check']}`) | {v.get('refuted_by') or '—'} |")
        lines.append("")
        lines.extend(self.parts)
        known = [s for s in runtime.values() if s is not None]
        lines.append("## Runtime\n")
        lines.append("| " + " | ".join(runtime) + " | total |")
        lines.append("| " + " | ".join("---" for _ in runtime) + " | --- |")
        lines.append("| " + " | ".join("restored" if s is None else f"{s:.1f} s" for s in runtime.values())
                     + f" | {sum(known):.1f} s |")
        lines.append("")
        return "\n".join(lines)


def _fmt(x: Any) -> str:
    if isinstance(x, list):
        return "[" + ", ".join(_fmt(v) for v in x) + "]"
    return f"{x:.4g}" if isinstance(x, float) else json.dumps(x)
