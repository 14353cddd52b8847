"""Starting a site on loopback and driving it in headless Chromium: the GUI verifier.

* ``serve_site(site)`` (context manager) -> base URL: a static file server on 127.0.0.1 for a
  folder without start.json, else the folder's start command with ``{python}``, ``{port}``,
  ``{tmp}`` substituted; readiness is polled for at most ``ready_timeout_s`` (raises SiteStartError).
* ``run_task(task, base_url, ...)``: ONE browser context (one session) for all workflows of a
  task, in file order, never reset (cookies, localStorage and the backend's state carry over).
  Each workflow: set the viewport to its resolution, load the site root, take the visual nodes
  (idx 0 before case 0, idx N after case N-1), run the cases in order. A case is Blocked when an
  action cannot be performed within action_timeout_ms, Fail when a validation does not hold within
  validation_timeout_ms, Pass otherwise; a failing case never stops the run. Every wait is bounded.
"""
from __future__ import annotations

import contextlib
import functools
import http.server
import io
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from stages.vision2web.schema import Task, load_start

CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "chrome")


class SiteStartError(RuntimeError):
    """The site did not come up (reason in the message); the run then scores 0."""


def find_chromium() -> str | None:
    env = os.environ.get("V2W_CHROMIUM")
    if env and Path(env).is_file():
        return env
    for name in CHROMIUM_CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def browser_available() -> bool:
    if find_chromium() is None:
        return False
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return False
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:  # no request log on stderr
        pass


def _wait_ready(url: str, timeout_s: float, proc: subprocess.Popen | None) -> None:
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SiteStartError(f"start command exited with code {proc.returncode} before serving {url}")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                if resp.status < 500:
                    return
                last = f"HTTP {resp.status}"
        except Exception as err:  # noqa: BLE001 - any failure means "not ready yet"
            last = type(err).__name__
        time.sleep(0.1)
    raise SiteStartError(f"site not ready at {url} within {timeout_s:g} s ({last})")


@contextlib.contextmanager
def serve_site(site: Path | str):
    site = Path(site).resolve()
    spec = load_start(site)
    port = free_port()
    if spec is None:
        handler = functools.partial(_QuietHandler, directory=str(site))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server.shutdown()
            server.server_close()
        return
    import sys

    with tempfile.TemporaryDirectory(prefix="v2w-site-") as tmp:
        subs = {"{python}": sys.executable, "{port}": str(port), "{tmp}": tmp}
        cmd = [functools.reduce(lambda s, kv: s.replace(*kv), subs.items(), part) for part in spec.command]
        env = dict(os.environ, PORT=str(port), HOST="127.0.0.1")
        try:
            proc = subprocess.Popen(cmd, cwd=site, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    start_new_session=True)
        except OSError as err:
            raise SiteStartError(f"start command failed: {err.strerror or err}") from None
        try:
            _wait_ready(f"http://127.0.0.1:{port}{spec.ready_path}", spec.ready_timeout_s, proc)
            yield f"http://127.0.0.1:{port}"
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)


@contextlib.contextmanager
def browser_session():
    """One headless Chromium (Debian's, via Playwright with an explicit executable path)."""
    path = find_chromium()
    if path is None:
        raise RuntimeError("chromium not found (install Debian's `chromium` or set V2W_CHROMIUM)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=path, timeout=60_000,
                                     args=["--no-sandbox", "--font-render-hinting=none", "--disable-gpu",
                                           "--hide-scrollbars", "--force-color-profile=srgb"])
        try:
            yield browser
        finally:
            browser.close()


def png_to_array(data: bytes) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.uint8)


_COMPONENTS_JS = """() => Array.from(document.querySelectorAll('[data-v2w]')).map(e => {
  const r = e.getBoundingClientRect();
  return {name: e.getAttribute('data-v2w'), x: r.left + window.scrollX, y: r.top + window.scrollY,
          w: r.width, h: r.height, vis: getComputedStyle(e).visibility !== 'hidden'};
})"""


def _do_action(page, base_url: str, act, timeout: int) -> None:
    if act.op == "goto":
        page.goto(base_url + act.path, timeout=timeout * 3)
    elif act.op == "click":
        page.locator(act.selector).first.click(timeout=timeout)
    elif act.op == "fill":
        page.locator(act.selector).first.fill(act.value, timeout=timeout)
    elif act.op == "press":
        page.locator(act.selector).first.press(act.key, timeout=timeout)
    elif act.op == "reload":
        page.reload(timeout=timeout * 3)
    else:  # pragma: no cover - the schema admits no other op
        raise ValueError(f"unknown action {act.op}")


def _check(page, val, timeout: int) -> None:
    from playwright.sync_api import expect

    if val.op == "visible":
        expect(page.locator(val.selector).first).to_be_visible(timeout=timeout)
    elif val.op == "hidden":
        expect(page.locator(val.selector).first).to_be_hidden(timeout=timeout)
    elif val.op == "text_contains":
        expect(page.locator(val.selector).first).to_contain_text(val.value, timeout=timeout)
    elif val.op == "text_equals":
        expect(page.locator(val.selector).first).to_have_text(val.value, timeout=timeout)
    elif val.op == "count":
        expect(page.locator(val.selector)).to_have_count(val.equals, timeout=timeout)
    elif val.op == "url_contains":
        expect(page).to_have_url(re.compile(".*" + re.escape(val.value) + ".*"), timeout=timeout)
    else:  # pragma: no cover
        raise ValueError(f"unknown validation {val.op}")


def _short(err: Exception) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:200]


def run_task(task: Task, base_url: str, browser, capture_components: bool = False) -> list[dict[str, Any]]:
    """Run every workflow of ``task`` against ``base_url`` in one context; return per-workflow results
    with the cases' Pass/Fail/Blocked and the visual nodes' screenshots (numpy RGB) [and components]."""
    meta = task.meta
    context = browser.new_context(viewport={"width": 1024, "height": 768}, device_scale_factor=1,
                                  reduced_motion="reduce")
    context.set_default_timeout(meta.action_timeout_ms)
    context.set_default_navigation_timeout(meta.navigation_timeout_ms)
    page = context.new_page()
    results = []
    try:
        for wf in task.workflows:
            page.set_viewport_size({"width": wf.resolution.width, "height": wf.resolution.height})
            shots: dict[str, Any] = {}
            cases: list[dict[str, Any]] = []
            start_err = None
            try:
                page.goto(base_url + "/", timeout=meta.navigation_timeout_ms)
            except Exception as err:  # noqa: BLE001
                start_err = f"could not load the site root: {_short(err)}"

            def snap(i: int) -> None:
                for name, node in wf.prototype.items():
                    if node.idx != i:
                        continue
                    try:
                        data = page.screenshot(full_page=node.fullpage, animations="disabled", caret="hide",
                                               timeout=meta.navigation_timeout_ms)
                        shot = {"image": png_to_array(data)}
                        if capture_components:
                            shot["components"] = page.evaluate(_COMPONENTS_JS)
                    except Exception as err:  # noqa: BLE001 - a missing screenshot scores 0
                        shot = {"image": None, "error": _short(err)}
                    shots[name] = shot

            snap(0)
            for i, case in enumerate(wf.content):
                result, detail = "Pass", ""
                if start_err is not None:
                    result, detail = "Blocked", start_err
                else:
                    for act in case.actions:
                        try:
                            _do_action(page, base_url, act, meta.action_timeout_ms)
                        except Exception as err:  # noqa: BLE001
                            result, detail = "Blocked", f"{act.op}: {_short(err)}"
                            break
                    if result == "Pass":
                        for val in case.validations:
                            try:
                                _check(page, val, meta.validation_timeout_ms)
                            except AssertionError as err:
                                result, detail = "Fail", f"{val.op}: {_short(err)}"
                                break
                            except Exception as err:  # noqa: BLE001 - e.g. an invalid selector
                                result, detail = "Blocked", f"{val.op}: {_short(err)}"
                                break
                cases.append({"objective": case.objective, "result": result, "detail": detail,
                              "counted": bool(case.validations)})
                snap(i + 1)
            results.append({"summary": wf.summary, "resolution": [wf.resolution.width, wf.resolution.height],
                            "cases": cases, "shots": shots})
    finally:
        context.close()
    return results
