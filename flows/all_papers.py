"""Every registered paper (the keys of ``papers`` in params.yaml), then the ``summary`` stage.

    python -m flows.all_papers                  # in this checkout, one paper after another
    python -m flows.all_papers --remote /mnt/dvc

Papers run one after another as subflows, each stage a ``dvc repro`` in this checkout. To run papers
in parallel, submit one ``paper`` deployment run per paper to a work pool (see flows/pools.py):
each worker runs in its own checkout and they share results through the DVC remote. Without
Prefect, ``make repro`` runs two papers' ``dvc --wait-for-lock repro`` at once in one checkout
(flows/parallel_repro.py).
A paper that fails does not stop the others; the flow fails at the end, naming them.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from flows.paper_flow import STAGE_TIMEOUT_S, paper_flow, repro_stage
from flows.proc import ROOT


@flow(name="all-papers", log_prints=True)
def all_papers(remote: str | None = None, sync: bool | None = None, root: str | None = None,
               papers: list[str] | None = None) -> dict[str, Any]:
    from stages.common.config import read_params

    logger = get_run_logger()
    checkout = Path(root).resolve() if root else ROOT
    registered = list(read_params(checkout / "params.yaml")["papers"])
    unknown = sorted(set(papers or []) - set(registered))
    if unknown:
        raise ValueError(f"papers.{unknown[0]}: unknown paper (registered: {', '.join(registered)})")
    slugs = papers or registered
    results: dict[str, Any] = {}
    failed = []
    for slug in slugs:
        state = paper_flow(slug, remote=remote, sync=sync, root=str(checkout), return_state=True)
        if state.is_completed():
            results[slug] = state.result()
        else:
            failed.append(slug)
            logger.error("paper %s: %s (%s)", slug, state.name, state.message)
    if papers is None and not failed:
        repro_stage.with_options(task_run_name="summary")("summary", "", str(checkout), timeout_s=STAGE_TIMEOUT_S)
    if failed:
        raise RuntimeError(f"papers failed: {', '.join(failed)}")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.all_papers", description=__doc__.splitlines()[0])
    parser.add_argument("--remote", default=None)
    parser.add_argument("--papers", nargs="*", default=None, help="a subset (then no summary)")
    args = parser.parse_args(argv)
    from flows.api import ServeError, check_configured_api

    try:
        check_configured_api()
    except ServeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    state = all_papers(remote=args.remote, papers=args.papers, return_state=True)
    if not state.is_completed():
        print(f"error: all-papers: {state.name}: {state.message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
