"""Dispatcher: ``python -m stages <stage> <slug> [--profile smoke|default|full]``.

Also ``python -m stages summary`` (collect every paper's metrics into reports/summary.*) and
``python -m stages readme`` (refresh README's results table from reports/summary.json).
Configuration and missing-input problems print one line naming the problem and exit 2,
before anything is written.
"""
from __future__ import annotations

import time

PROCESS_START = time.perf_counter()  # runtime_s counts imports too: they are part of a stage's cost

import argparse  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402


def _kernel_environment() -> None:
    """Without CUDA, turn the Triton interpreter on before triton is imported (kernels.record runs
    each kernel's Triton path on a slice of real inputs) while hot loops take the torch reference."""
    import torch

    if not torch.cuda.is_available() and "triton" not in sys.modules:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        os.environ.setdefault("PAPERS_CPU_KERNELS", "reference")

from stages.common.config import PROFILES, STAGES, ConfigError  # noqa: E402
from stages.common.paths import ROOT as ROOT_DIR  # noqa: E402
from stages.common.runner import InputModifiedError, MissingInputError  # noqa: E402


class StageInterrupted(BaseException):
    """SIGTERM/SIGINT: unwinds the stage so its temporary output dir is removed."""


def _on_signal(signum, _frame):
    import signal

    raise StageInterrupted(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    import signal

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _on_signal)
    parser = argparse.ArgumentParser(prog="python -m stages", description=__doc__.splitlines()[0])
    parser.add_argument("stage", help=f"one of {', '.join(STAGES)}, or summary / readme / dvcplots / plots / claims / sources / wandb-log")
    parser.add_argument("slug", nargs="?", help="registered paper slug")
    parser.add_argument("--profile", choices=PROFILES, default=None,
                        help="override params.yaml's top-level `profile`")
    parser.add_argument("--table", action="store_true",
                        help="with `claims`: every claim of every paper as one table (findings first)")
    parser.add_argument("--root", default=None,
                        help="write data/ and reports/ under this folder instead of the checkout "
                             "(params still come from the checkout's params.yaml); e.g. a smoke run that "
                             "leaves the committed results alone")
    args = parser.parse_args(argv)
    try:
        if args.stage == "summary":
            from stages.common.summary import write_summary

            write_summary()
            return 0
        if args.stage == "readme":
            from stages.common.summary import update_readme

            update_readme()
            return 0
        if args.stage == "dvcplots":
            from stages.common.summary import update_dvc_plots

            print(f"dvc.yaml: {update_dvc_plots()} plot entries")
            return 0
        if args.stage == "plots":
            from stages.common.plots_html import write_plots_html

            print(f"DVC plots (offline HTML): {write_plots_html(slugs=[args.slug] if args.slug else None)}")
            return 0
        if args.stage == "claims":
            from stages.common.config import registered_papers
            from stages.common.summary import claims_line, claims_table

            slugs = [args.slug] if args.slug else registered_papers()
            unknown = [s for s in slugs if s not in registered_papers()]
            if unknown:
                raise ConfigError(f"papers.{unknown[0]}: unknown paper (registered: {', '.join(registered_papers())})")
            if args.table:
                print(claims_table(slugs))
                return 0
            for slug in slugs:
                print(claims_line(slug))
            return 0
        if args.stage == "wandb-log":
            from stages.common.config import registered_papers
            from stages.common.tracking import log_committed_report

            slugs = [args.slug] if args.slug else registered_papers()
            for slug in slugs:
                if slug not in registered_papers():
                    raise ConfigError(f"papers.{slug}: unknown paper (registered: {', '.join(registered_papers())})")
                if not (ROOT_DIR / "reports" / slug / "metrics.json").exists():
                    print(f"{slug}: no reports/{slug}/metrics.json yet (run `dvc repro report@{slug}`)")
                    continue
                print(f"{slug}: W&B {log_committed_report(slug)}")
            return 0
        if args.stage == "repro-failures":
            from stages.common.summary import repro_failures

            lines = repro_failures(args.slug or ".dvc/tmp/repro.log")
            print("\n".join(lines) if lines else "dvc repro: every stage succeeded or was up to date")
            return 0
        if args.stage == "sources":
            from stages.common.config import registered_papers
            from stages.common.sources import sources_table

            print(sources_table([args.slug] if args.slug else registered_papers()))
            return 0
        if args.stage not in STAGES:
            raise ConfigError(f"stage: unknown stage {args.stage!r} (stages: {', '.join(STAGES)}, summary, readme, "
                              "dvcplots, plots, claims, sources, wandb-log)")
        if not args.slug:
            raise ConfigError(f"slug: `{args.stage}` needs a paper slug")
        _kernel_environment()
        from stages.common.runner import run_stage

        if args.root:
            from pathlib import Path

            from stages.common.paths import ROOT

            out = run_stage(args.slug, args.stage, args.profile, root=Path(args.root).resolve(),
                            params_path=ROOT / "params.yaml", started=PROCESS_START)
        else:
            out = run_stage(args.slug, args.stage, args.profile, started=PROCESS_START)
        print(f"{args.stage}@{args.slug}: wrote {out}")
        return 0
    except (ConfigError, MissingInputError, InputModifiedError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except StageInterrupted as sig:
        what = f"{args.stage}@{args.slug}" if args.slug else args.stage
        print(f"{what}: interrupted by {sig}; nothing was written (temporary output removed)", file=sys.stderr)
        return 130 if str(sig) == "SIGINT" else 143


if __name__ == "__main__":
    sys.exit(main())
