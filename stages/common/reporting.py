"""The report stage's writer: report.md, metrics.json, figures/*.png, plots/*.csv, and W&B.

    rep = Report(ctx, title="...", claim="the paper's headline, in words")
    rep.section("Setup", "...markdown...")
    rep.table("Results", frame)                  # polars DataFrame -> markdown + wandb.Table
    rep.figure("acc_vs_step", fig, "caption")    # matplotlib Figure -> figures/acc_vs_step.png
    rep.plot("acc_vs_step", frame, x="step", y=["AB", "none"], title="held-out accuracy")
                                                 # plots/acc_vs_step.csv + its x/y spec for `dvc plots show`
    rep.finish(CLAIMS, metrics)                  # verdicts + metrics.json + report.md

Outputs in reports/<slug>/:
- metrics.json: {"slug", "profile", "command", "claims": [{"name", "statement", "kind", "check", "holds",
  "verdict", "values", "params", "refuted_by", "wallclock", ("stats")}], "findings": {counts},
  "kernels": {name: {"backend", "calls", "parity_max_abs_err", "parity_backend", "slice"}},
  "runtime_s": {stage: s}, "metrics": {...}}
- dvc_metrics.json: flat values for `dvc metrics show/diff`, keyed by paper so 19 papers never clash:
  <slug>.claim.<name> = "holds" | "fails" | "inconclusive", <slug>.findings.{holds,fails,inconclusive},
  <slug>.checks.{pass,total}, and every scalar a claim reads (<slug>.<claim>.<metric>; per-seed lists as
  their mean)
- claims.json: {"slug", "profile", "findings", "claims"}: the verdicts without timings (a declared DVC
  output: the summary stage depends on it)
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

from stages.common.claims import AnyClaim, evaluate_claims, findings_line, findings_summary  # noqa: E402
from stages.common.paths import atomic_write_text, stage_dir, write_json  # noqa: E402

VERDICT_CODE = {"holds": 1, "inconclusive": 0, "fails": -1}
PLOT_TEMPLATES = ("linear", "simple", "scatter", "smooth", "bar_horizontal", "bar_horizontal_sorted")
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
    """A metrics key that may differ between reruns because it is (or may be) a time: under a declared
    subtree, or named like one (`*_s`, `*_ms`, `runtime*`, `time_*`, `timing`). Used by the determinism
    test to leave such keys out; a *claim* is labelled wall-clock only when declared (see in_wallclock)."""
    parts = key.split(".")
    return in_wallclock(key, wallclock) or any(_TIME_NAME.search(p) for p in parts)


def in_wallclock(key: str, wallclock=()) -> bool:
    """key lies under one of the declared wall-clock subtrees."""
    return any(key == w or key.startswith(w + ".") for w in wallclock)


def flat_scalars(verdicts: list[dict[str, Any]], slug: str) -> dict[str, Any]:
    """dvc_metrics.json: the 3-way verdict per claim, the findings/checks counts and every number a
    claim reads, all keyed <slug>.… so that `dvc metrics show` over 19 papers never merges names."""
    counts = findings_summary(verdicts)
    out: dict[str, Any] = {f"{slug}.findings.holds": counts["findings_holds"],
                           f"{slug}.findings.fails": counts["findings_fails"],
                           f"{slug}.findings.inconclusive": counts["findings_inconclusive"],
                           f"{slug}.checks.pass": counts["checks_pass"], f"{slug}.checks.total": counts["checks"]}
    for v in verdicts:
        out[f"{slug}.claim.{v['name']}"] = v["verdict"]
    for v in verdicts:
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
                out[f"{slug}.{v['name']}.{key}"] = round(float(val), 6)
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

        from stages.common.figures import clear_legends

        path = self.ctx.out / "figures" / f"{name}.png"
        clear_legends(fig)  # a legend over bars/lines/points moves outside the axes
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        self.figures.append(name)
        self.parts.append(f"![{caption}](figures/{name}.png)\n\n*{caption}*\n")
        if self.ctx.tracker is not None:
            self.ctx.tracker.log_image(f"figures/{name}", path)

    def plot(self, name: str, frame: pl.DataFrame, x: str, y: str | list[str], series: str | None = None,
             title: str = "", template: str = "linear") -> None:
        """plots/<name>.csv for `dvc plots show`, with its x/y fields in plots/_specs.json.

        Long format: pass ``series=`` (a column naming the line each row belongs to) and one ``y``; the CSV
        gets one column per series value (DVC draws one line each, with a legend). Wide format: several
        ``y`` columns. x must be numeric, except with a bar template (``bar_horizontal``), where it is an
        ordinal label; every y is numeric. A spec that would render empty or merge series into one zigzag
        (text x on a line template, no finite y, several rows per x) is an error here, at report time."""
        where = f"report@{self.ctx.slug}: plot {name!r}"
        if template not in PLOT_TEMPLATES:
            raise ValueError(f"{where}: unknown template {template!r} (one of {', '.join(PLOT_TEMPLATES)})")
        ys = [y] if isinstance(y, str) else list(y)
        need = [x, *ys] + ([series] if series else [])
        missing = [c for c in need if c not in frame.columns]
        if missing:
            raise ValueError(f"{where} has no column {missing[0]!r}")
        if series:
            if len(ys) != 1:
                raise ValueError(f"{where}: series= takes exactly one y column (got {ys})")
            long = frame.select(x, series, ys[0]).with_columns(pl.col(series).cast(pl.Utf8))
            if long.select(pl.struct(x, series).is_duplicated().any()).item():
                raise ValueError(f"{where}: several rows share one ({x}, {series}) pair; aggregate first")
            order = list(dict.fromkeys(long[series].to_list()))
            frame = long.pivot(on=series, index=x, values=ys[0]).select(x, *order).sort(x)
            ys = order
        bar = template.startswith("bar")
        if not bar and not frame.schema[x].is_numeric():
            raise ValueError(f"{where}: x {x!r} is {frame.schema[x]}, not numeric; use a numeric x or "
                             "template='bar_horizontal' for labels")
        for col in ys:
            if not frame.schema[col].is_numeric():
                raise ValueError(f"{where}: y {col!r} is {frame.schema[col]}, not numeric")
            finite = frame[col].cast(pl.Float64).is_finite().fill_null(False).sum()
            if finite == 0:
                raise ValueError(f"{where}: y {col!r} has no finite value (the plot would be empty)")
        if not bar and template != "scatter" and frame[x].is_duplicated().any():
            raise ValueError(f"{where}: several rows per x value would draw one zigzag line; pass series=")
        frame.select(x, *ys).write_csv(self.ctx.out / "plots" / f"{name}.csv")
        self.plots[name] = {"x": x, "y": ys, "title": title or name.replace("_", " "), "template": template}

    def finish(self, claims: list[AnyClaim], metrics: dict[str, Any],
               wallclock: tuple[str, ...] | list[str] = ()) -> list[dict[str, Any]]:
        """Evaluate the claims with their thresholds from params (papers.<slug>.report.claims, i.e. the
        report Config's ``claims`` field) and write metrics.json, dvc_metrics.json and report.md.

        wallclock: metric subtrees measured in wall-clock time (speed, scaling exponents); a claim reading
        them, or declared ``wallclock=True``, is labelled "(wall-clock)" (its verdict may change with
        machine load); everything else must be identical across reruns with the same params
        (tests/common/test_determinism.py)."""
        from kernels.record import describe, merge_records

        if not self.figures:
            raise RuntimeError(f"report@{self.ctx.slug}: a report needs at least one figure")
        thresholds = getattr(getattr(self.ctx, "cfg", None), "claims", None)
        verdicts = evaluate_claims(claims, metrics, thresholds, where=f"papers.{self.ctx.slug}.report")
        for v in verdicts:
            if v.get("wallclock") or any(in_wallclock(k, wallclock) for k in v["values"]):
                v["wallclock"] = True
        order = {"finding": 0, "check": 1}
        verdicts = sorted(verdicts, key=lambda v: order[v["kind"]])  # findings first (stable within a kind)
        kernels = merge_records(*(stage_dir(self.ctx.slug, s, self.ctx.root) for s in ("train", "evaluate")))
        runtime = self.ctx.upstream_runtimes()
        runtime["report"] = round(self.ctx.elapsed(), 3)
        command = producing_command(self.ctx.slug)
        counts = findings_summary(verdicts)
        doc = {"slug": self.ctx.slug, "profile": self.ctx.profile, "command": command, "claims": verdicts,
               "findings": counts, "kernels": kernels, "runtime_s": runtime, "wallclock": sorted(wallclock),
               "metrics": metrics}
        write_json(self.ctx.out / "metrics.json", doc)
        write_json(self.ctx.out / "dvc_metrics.json", flat_scalars(verdicts, self.ctx.slug))
        write_json(self.ctx.out / "claims.json", {"slug": self.ctx.slug, "profile": self.ctx.profile,
                                                  "findings": counts, "claims": verdicts})
        write_json(self.ctx.out / "plots" / "_specs.json", self.plots)
        self.real_source_sections()
        self.section("Kernel paths", describe(kernels))
        atomic_write_text(self.ctx.out / "report.md", self._markdown(verdicts, runtime, command))
        if self.ctx.tracker is not None:
            self.ctx.tracker.summary({**{k: v for k, v in counts.items()},
                                      "claims_held": sum(v["holds"] for v in verdicts),
                                      "claims_total": len(verdicts),
                                      **{f"claim/{v['name']}": VERDICT_CODE[v["verdict"]] for v in verdicts},
                                      **{f"metric/{k}": v for k, v in flat_scalars(verdicts, self.ctx.slug).items()
                                         if not isinstance(v, str)}})
        return verdicts

    def real_source_sections(self) -> None:
        """At `full` with a real source, the runs a stage wrote under ``<stage>/hf/*.json`` (opus, reversal_curse,
        unembed_rank: the real model's results beside the miniature's) as tables: which model and data, then
        one row per run with its scalar results. Nothing is added when no stage wrote an ``hf/`` folder."""
        for stage in ("train", "evaluate"):
            folder = stage_dir(self.ctx.slug, stage, self.ctx.root) / "hf"
            for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
                if path.name in ("kernels.json", "_stage.json"):
                    continue
                rel = f"data/{self.ctx.slug}/{stage}/hf/{path.name}"
                try:
                    doc = json.loads(path.read_text())
                except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
                    self.section(f"Real source ({stage}: {path.name})", f"`{rel}` is unreadable ({type(err).__name__}).")
                    continue
                if not isinstance(doc, dict):
                    continue
                srcs = [f"`{k}`: " + ", ".join(f"{f} = {v[f]}" for f in ("kind", "model", "tokenizer", "dataset",
                                                                        "split", "revision") if v.get(f))
                        for k, v in doc.items() if isinstance(v, dict) and "kind" in v]
                rows = next((v for k, v in doc.items() if k in ("runs", "rows") and isinstance(v, list)), None)
                frame = real_runs_frame(rows or [])
                note = "; ".join(srcs) or "no source block recorded"
                summary = real_runs_frame([{k: v for k, v in doc.items()                # e.g. unembed_rank's spearman
                                            if k not in ("runs", "rows") and not (isinstance(v, dict) and "kind" in v)}],
                                          max_cols=16)
                if not summary.is_empty():
                    note += "; summary: " + ", ".join(f"{c} = {_fmt(summary[c][0])}" for c in summary.columns)
                if frame.is_empty():
                    self.section(f"Real source ({stage}: {path.name})", f"{note}. No per-run rows in `{rel}`.")
                else:
                    self.table(f"Real source ({stage}: {path.name})", frame,
                               note=f"Read from `{rel}` ({note}). The claims above are the miniature's; these "
                                    "are the real model's numbers from the same stage, shown, not judged.")

    def _markdown(self, verdicts: list[dict[str, Any]], runtime: dict[str, float | None], command: str) -> str:
        lines = [f"# {self.title}", "", f"**Paper's claim.** {self.claim.strip()}", "",
                 f"Profile: `{self.ctx.profile}` — generated by `{command}`; "
                 "every number below is read from this run's `metrics.json`.", "",
                 f"**{findings_line(verdicts)}.** Findings are the paper's statements, tested; checks are "
                 "sanity, machinery, controls and properties of the data or format, shown apart. Verdicts use "
                 "the shared rule (`stages/common/claims.py`): a finding holds when the one-sided 95% t-bound "
                 "of its per-seed gap clears the minimum effect fixed in params and it wins on most seeds; it "
                 "fails when the other bound is below the minimum effect.", ""]
        for kind, heading in (("finding", "Findings"), ("check", "Checks")):
            group = [v for v in verdicts if v["kind"] == kind]
            if not group:
                continue
            c = findings_summary(group)
            head = (f"{c['findings_holds']} hold, {c['findings_fails']} fail, {c['findings_inconclusive']} "
                    "inconclusive" if kind == "finding" else f"{c['checks_pass']}/{c['checks']} pass")
            lines.append(f"## {heading} ({head})\n")
            lines.append("| claim | verdict | statement | measured | thresholds (params) | would have refuted it |")
            lines.append("| --- | --- | --- | --- | --- | --- |")
            for v in group:
                clock = " (wall-clock)" if v.get("wallclock") else ""
                params = ", ".join(f"{k} = {_fmt(x)}" for k, x in (v.get("params") or {}).items()) or "—"
                lines.append(f"| {v['name']} | {VERDICT_TEXT[v['verdict']]}{clock} | {v['statement']} | "
                             f"{measured_text(v)} (check: `{v['check']}`) | {params} | {v.get('refuted_by') or '—'} |")
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


def real_runs_frame(rows: list[Any], max_cols: int = 12, max_rows: int = 60) -> pl.DataFrame:
    """One row per run: its scalar fields (nested dicts flattened to dotted keys, lists of numbers as their
    last value — the end of a curve; the column says "(last)"), the first ``max_cols`` columns, at most
    ``max_rows`` rows."""
    flat_rows: list[dict[str, Any]] = []
    for row in rows[:max_rows]:
        if not isinstance(row, dict):
            continue
        flat: dict[str, Any] = {}

        def walk(prefix: str, v: Any) -> None:
            if isinstance(v, dict):
                for k, x in v.items():
                    walk(f"{prefix}.{k}" if prefix else str(k), x)
            elif isinstance(v, list):
                nums = [x for x in v if isinstance(x, (int, float)) and not isinstance(x, bool)]
                if nums and len(nums) == len(v):
                    flat[f"{prefix} (last)"] = float(nums[-1])
            elif isinstance(v, (bool, int, float, str)) or v is None:
                flat[prefix] = v
        walk("", row)
        flat_rows.append(flat)
    cols: list[str] = []
    for r in flat_rows:
        cols += [c for c in r if c not in cols]
    cols = cols[:max_cols]
    if not cols:
        return pl.DataFrame()
    def numeric(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    data = {}
    for c in cols:
        vals = [r.get(c) for r in flat_rows]
        if all(numeric(v) or v is None for v in vals):
            data[c] = pl.Series(c, [None if v is None else float(v) for v in vals], dtype=pl.Float64)
        else:
            data[c] = pl.Series(c, ["" if v is None else str(v) for v in vals], dtype=pl.Utf8)
    return pl.DataFrame(data)


def measured_text(v: dict[str, Any]) -> str:
    """The numbers a verdict read: values, then the raw gap, the minimum effect / band, the one-sided 95%
    t-bounds, n and wins as separate numbers; for an inconclusive result the detectable gap."""
    vals = "; ".join(f"{k} = {_fmt(x)}" for k, x in v["values"].items())
    st = v.get("stats") or {}
    if "mean" not in st:
        return vals + (f"; n = {int(st['n'])} (fewer than 3 seeds or a non-finite value)" if "n" in st else "")
    parts = [f"gap {st['mean']:.4g}"]
    if "delta" in st:
        parts.append(f"band ±{st['delta']:.4g}")
    else:
        parts.append(f"min effect {st.get('min_effect', 0.0):.4g}")
    parts.append(f"95% t-bounds [{st['lower']:.4g}, {st['upper']:.4g}] (se {st['se']:.2g}"
                 + (f", of which items {st['se_items']:.2g}" if st.get("se_items") else "")
                 + f", df {st['df']:.3g})")
    if "wins" in st:
        parts.append(f"n = {int(st['n'])}, wins {round(st['wins'] * st['n'])}/{int(st['n'])}")
    else:  # one estimate with its own se and df (claims.Estimate): n is the number of points it was fitted to
        parts.append(f"one estimate from {int(st['n'])} points")
    if v["verdict"] == "inconclusive" and "detectable" in st:
        what = "band half-width confirmable" if "delta" in st else "smallest detectable gap"
        parts.append(f"{what} (80% power) {st['detectable']:.3g}")
    return vals + "; " + "; ".join(parts)


def _fmt(x: Any) -> str:
    if isinstance(x, list):
        return "[" + ", ".join(_fmt(v) for v in x) + "]"
    return f"{x:.4g}" if isinstance(x, float) else json.dumps(x)
