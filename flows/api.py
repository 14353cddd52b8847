"""Talking to a Prefect API: the one error type of the flows CLIs, and fail-fast health checks.

A small module of its own so that serve, paper_flow, all_papers and pools all import it and none
of them imports another (no import circle).
"""
from __future__ import annotations

import subprocess
import time
import urllib.request


class ServeError(RuntimeError):
    """Bad schedule, unreachable API or a server that did not start (the message names it)."""


def wait_healthy(api_url: str, timeout: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ServeError(f"prefect server exited with {proc.returncode} before answering at {api_url}")
        try:
            with urllib.request.urlopen(f"{api_url}/health", timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError as err:
            last = str(err)
        time.sleep(0.5)
    raise ServeError(f"Prefect API {api_url}: no answer within {timeout:.0f} s ({last})")


def check_api(timeout: float = 5.0) -> str:
    """The configured PREFECT_API_URL must answer (fail fast, naming it)."""
    from prefect.settings import PREFECT_API_URL

    api = PREFECT_API_URL.value()
    if not api:
        raise ServeError("PREFECT_API_URL is not set: start a server (`make ui`, or `prefect server start`) "
                         "and `prefect config set PREFECT_API_URL=http://127.0.0.1:4200/api`")
    wait_healthy(api.rstrip("/"), timeout)
    return api


def check_configured_api() -> None:
    """With PREFECT_API_URL set, it must answer (else one line naming it); unset = ephemeral API."""
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        check_api()
