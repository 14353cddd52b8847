"""Many workers: a Prefect ``process`` work pool, one queue per worker, crash detection, and the
``paper`` deployment pulled from git into a fresh checkout for every flow run.

    python -m flows.pools setup --repo https://github.com/<you>/<repo>.git   # pool + queues + deployment
    prefect worker start --pool papers --type process --work-queue default   # on each machine
    python -m flows.pools submit reversal_curse [--queue default] [--remote s3://bucket/dvc]

Each flow run's pull step (``prefect.deployments.steps.git_clone``) clones the repository into the
run's own temporary working directory, so two workers (or two runs on one worker) never share a
workspace or DVC's lock; they share results only through the DVC remote (outputs + run-cache).
A worker that dies stops its runs' heartbeats; the automation made by ``setup`` marks such a run
Crashed after ``--crash-after`` seconds, and a new run (on any worker) restores from the remote
every stage that had completed and been pushed.
"""
from __future__ import annotations

import argparse
import sys
from datetime import timedelta
from typing import Any

POOL = "papers"
DEPLOYMENT = "paper"
ENTRYPOINT = "flows/paper_flow.py:paper_flow"
CRASH_AUTOMATION = "papers: crash flow runs whose heartbeats stopped"


def ensure_pool(pool: str = POOL, queues: tuple[str, ...] = (), pool_type: str = "process") -> None:
    """Create the work pool (and its queues) if missing."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate, WorkQueueCreate
    from prefect.exceptions import ObjectAlreadyExists

    with get_client(sync_client=True) as client:
        try:
            client.create_work_pool(WorkPoolCreate(name=pool, type=pool_type))
        except ObjectAlreadyExists:
            pass
        for queue in queues:
            try:
                client.create_work_queue(name=queue, work_pool_name=pool)
            except ObjectAlreadyExists:
                pass


def ensure_crash_detection(within_s: float = 240.0) -> None:
    """An automation that marks a flow run Crashed when its heartbeats stop (its worker died).

    Runs emit ``prefect.flow-run.heartbeat`` every PREFECT_FLOWS_HEARTBEAT_FREQUENCY seconds
    (>= 30); ``within_s`` must exceed that frequency.
    """
    from prefect.automations import Automation
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    try:
        Automation.read(name=CRASH_AUTOMATION)
        return
    except ValueError:
        pass
    Automation(
        name=CRASH_AUTOMATION,
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", "prefect.flow-run.Completed", "prefect.flow-run.Failed",
                    "prefect.flow-run.Cancelled", "prefect.flow-run.Crashed"},
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=within_s),
        ),
        actions=[ChangeFlowRunState(state=StateType.CRASHED,
                                    message=f"no heartbeat for {within_s:.0f} s: its worker died")],
    ).create()


def deploy(repo: str, branch: str | None = None, pool: str = POOL, name: str = DEPLOYMENT,
           queue: str | None = None, parameters: dict[str, Any] | None = None,
           job_variables: dict[str, Any] | None = None) -> str:
    """Deploy the paper flow from git (``flow.from_source(...).deploy``); returns its id."""
    from prefect import Flow
    from prefect.runner.storage import GitRepository

    flow = Flow.from_source(source=GitRepository(url=repo, branch=branch), entrypoint=ENTRYPOINT)
    return str(flow.deploy(name=name, work_pool_name=pool, work_queue_name=queue,
                           parameters=parameters or {}, job_variables=job_variables or {},
                           build=False, push=False, print_next_steps=False))


def submit(slug: str, queue: str | None = None, remote: str | None = None, name: str = DEPLOYMENT,
           timeout: float | None = 0) -> Any:
    """One run of the paper deployment (on ``queue`` if given); timeout=0 returns at once."""
    from prefect.deployments import run_deployment

    params: dict[str, Any] = {"slug": slug}
    if remote:
        params["remote"] = remote
    return run_deployment(f"paper/{name}", parameters=params, work_queue_name=queue, timeout=timeout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.pools", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("setup", help="work pool + queues + crash detection + git-sourced deployment")
    p.add_argument("--repo", required=True, help="git URL (or path) every run clones")
    p.add_argument("--branch", default=None)
    p.add_argument("--pool", default=POOL)
    p.add_argument("--type", default="process", help="work pool type (process, docker, kubernetes)")
    p.add_argument("--queues", nargs="*", default=[])
    p.add_argument("--crash-after", type=float, default=240.0,
                   help="seconds without heartbeat -> Crashed (> PREFECT_FLOWS_HEARTBEAT_FREQUENCY, default 180)")
    p.add_argument("--remote", default=None, help="DVC remote every run uses (default: the repo's)")
    s = sub.add_parser("submit", help="one run of the paper deployment")
    s.add_argument("slug")
    s.add_argument("--queue", default=None)
    s.add_argument("--remote", default=None)
    args = parser.parse_args(argv)
    from flows.api import ServeError, check_api

    try:
        check_api()
        if args.cmd == "setup":
            ensure_pool(args.pool, tuple(args.queues), args.type)
            ensure_crash_detection(args.crash_after)
            dep = deploy(args.repo, args.branch, args.pool,
                         parameters={"remote": args.remote} if args.remote else None)
            print(f"work pool {args.pool!r} ({args.type}), deployment paper/{DEPLOYMENT} ({dep}); "
                  f"start workers with: prefect worker start --pool {args.pool} --type {args.type}")
        else:
            run = submit(args.slug, args.queue, args.remote)
            print(f"flow run {run.name} ({run.id}) submitted")
        return 0
    except ServeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
