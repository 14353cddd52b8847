"""A Prefect server that other machines reach must require basic auth: with
PREFECT_SERVER_API_AUTH_STRING set, a client without PREFECT_API_AUTH_STRING is refused and one
with it is served (the Scaling-out recipe in the README)."""
from __future__ import annotations

import base64
import urllib.error
import urllib.request

import pytest

from flows.serve import start_server, stop_server

pytestmark = pytest.mark.slow


def _get(url: str, auth: str | None) -> int:
    req = urllib.request.Request(url)
    if auth is not None:
        req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:  # not listening yet
        return 0


def test_unauthenticated_client_is_refused(tmp_path, monkeypatch):
    secret = "papers:s3cret-for-test"
    # the health probe inside start_server is unauthenticated, so probe readiness ourselves
    monkeypatch.setattr("flows.serve.wait_healthy", lambda *a, **k: None)
    proc, api = start_server(home=tmp_path / "home", log_path=tmp_path / "server.log",
                             extra_env={"PREFECT_SERVER_API_AUTH_STRING": secret})
    try:
        import time

        deadline = time.monotonic() + 180
        while _get(f"{api}/admin/version", secret) != 200:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "server never answered"
            time.sleep(0.5)
        assert _get(f"{api}/admin/version", None) == 401
        assert _get(f"{api}/admin/version", "papers:wrong") == 401
        assert _get(f"{api}/admin/version", secret) == 200
    finally:
        stop_server(proc)
