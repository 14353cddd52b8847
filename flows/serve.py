"""Deployments with cron schedules for the Prefect UI: one per registered paper, plus all-papers.

    make ui                                             # = python -m flows.serve --with-server
    python -m flows.serve                               # against $PREFECT_API_URL (or Prefect's default)
    python -m flows.serve --cron "0 3 * * *"            # schedule every paper without its own entry
    python -m flows.serve --list                        # print the deployments and exit

Schedules come from params.yaml's optional top-level ``schedules: {<slug>: "<cron>", all: "<cron>"}``;
``--cron`` schedules the papers without an entry; with neither a deployment is unscheduled (run it
from the UI). Served runs execute in this checkout, one at a time (one DVC lock per checkout);
for many workers see flows/pools.py. ``--with-server`` first starts ``prefect server start`` on
127.0.0.1 (port 4200, or a free one) and prints the UI address.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from flows.api import ServeError, check_api, wait_healthy  # noqa: F401 (re-exported)
from flows.proc import ROOT

SERVER_START_TIMEOUT_S = 180.0


def schedules_for(params: dict[str, Any], slugs: list[str], cli_cron: str | None) -> dict[str, str | None]:
    """Cron per deployment name (each slug and ``all``), validated; None = unscheduled."""
    from prefect.client.schemas.schedules import CronSchedule

    table = params.get("schedules") or {}
    if not isinstance(table, dict):
        raise ServeError("schedules: expected a mapping of <slug or all> -> cron string")
    unknown = sorted(set(table) - set(slugs) - {"all"})
    if unknown:
        raise ServeError(f"schedules.{unknown[0]}: unknown paper (registered: {', '.join(slugs)})")
    out: dict[str, str | None] = {}
    for name in [*slugs, "all"]:
        cron = table.get(name, cli_cron if name != "all" else table.get("all"))
        where = f"schedules.{name}" if name in table else "--cron"
        if cron is not None:
            try:
                CronSchedule(cron=str(cron))
            except Exception:
                raise ServeError(f"{where}: invalid cron string {cron!r}") from None
        out[name] = None if cron is None else str(cron)
    return out


def build_deployments(root: Path = ROOT, cli_cron: str | None = None, papers: list[str] | None = None,
                      remote: str | None = None) -> list:
    from flows.all_papers import all_papers
    from flows.paper_flow import paper_flow
    from stages.common.config import read_params

    params = read_params(root / "params.yaml")
    registered = list(params["papers"])
    slugs = papers or registered
    bad = sorted(set(slugs) - set(registered))
    if bad:
        raise ServeError(f"papers.{bad[0]}: unknown paper (registered: {', '.join(registered)})")
    crons = schedules_for(params, registered, cli_cron)
    extra = {"remote": remote} if remote else {}
    deployments = [paper_flow.to_deployment(name=slug, cron=crons[slug], parameters={"slug": slug, **extra},
                                            tags=["paper", slug], description=f"dvc repro of {slug}'s four stages")
                   for slug in slugs]
    if papers is None:
        deployments.append(all_papers.to_deployment(name="all", cron=crons["all"], parameters=extra,
                                                    tags=["all-papers"], description="every paper, then summary"))
    return deployments


def free_port(preferred: int | None = None) -> int:
    if preferred:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", preferred))
                return preferred
            except OSError:
                pass
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(port: int | None = None, log_path: Path | None = None, home: Path | None = None,
                 timeout: float = SERVER_START_TIMEOUT_S,
                 extra_env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """``prefect server start`` bound to 127.0.0.1; returns (process, API URL) once healthy."""
    port = port or free_port()
    env = dict(os.environ)
    env.pop("PREFECT_API_URL", None)
    env.update(PREFECT_SERVER_API_HOST="127.0.0.1", PREFECT_SERVER_API_PORT=str(port),
               PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_UI_API_URL=f"http://127.0.0.1:{port}/api")
    env.setdefault("PREFECT_SERVER_DATABASE_TIMEOUT", "60")  # SQLite under load: wait, don't fail
    if home is not None:
        env["PREFECT_HOME"] = str(home)
    env.update(extra_env or {})
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen([str(Path(sys.executable).parent / "prefect"), "server", "start",
                             "--host", "127.0.0.1", "--port", str(port)],
                            env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    api = f"http://127.0.0.1:{port}/api"
    try:
        wait_healthy(api, timeout, proc)
    except BaseException:
        stop_server(proc)
        raise
    return proc, api


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.serve", description=__doc__.splitlines()[0])
    parser.add_argument("--with-server", action="store_true", help="start `prefect server` on 127.0.0.1 first")
    parser.add_argument("--port", type=int, default=4200, help="server port with --with-server (else a free one)")
    parser.add_argument("--cron", default=None, help="cron for papers without a `schedules` entry")
    parser.add_argument("--papers", nargs="*", default=None, help="serve only these papers (no all-papers)")
    parser.add_argument("--remote", default=None, help="DVC remote passed to every run")
    parser.add_argument("--list", action="store_true", help="print the deployments and exit")
    args = parser.parse_args(argv)
    from prefect import serve
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from stages.common.config import ConfigError

    server = None
    try:
        deployments = build_deployments(ROOT, args.cron, args.papers, args.remote)
        if args.list:
            for d in deployments:
                cron = [s.schedule.cron for s in (d.schedules or [])]
                print(f"{d.flow_name}/{d.name}\tcron={cron[0] if cron else '-'}\tparameters={d.parameters}")
            return 0
        api = None
        if args.with_server:
            log = ROOT / ".prefect" / "server.log"
            log.parent.mkdir(exist_ok=True)
            server, api = start_server(free_port(args.port), log_path=log)
            print(f"Prefect UI: {api.removesuffix('/api')}  (API {api}; server log {log})", flush=True)
        with temporary_settings({PREFECT_API_URL: api} if api else {}):
            api = check_api()
            if not args.with_server:
                print(f"Prefect API: {api}", flush=True)
            serve(*deployments, limit=1)
        return 0
    except (ServeError, ConfigError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    finally:
        if server is not None:
            stop_server(server)


if __name__ == "__main__":
    sys.exit(main())
