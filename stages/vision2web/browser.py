"""Starting a site on loopback and driving it in headless Chromium: the GUI verifier (async, bounded).

* ``serve_site(site)`` (async context manager) -> base URL: the confined static server for a folder
  without start.json, else the folder's start command (``{python}``, ``{port}``, ``{tmp}``
  substituted) launched by ``sandbox.launch``; readiness is polled for at most ``ready_timeout_s``
  (raises SiteStartError); the backend's whole process tree is killed on exit.
* ``run_task(task, base_url, browser, ...)``: ONE browser context (one session) for all workflows of
  a task, in file order, never reset (cookies, localStorage and the backend's state carry over).
  Each workflow: set the viewport, load the site root, take the visual nodes (idx 0 before case 0,
  idx N after case N-1), run the cases in order. A case is Blocked when an action cannot be
  performed within action_timeout_ms, Fail when a validation does not hold within
  validation_timeout_ms, Pass otherwise; a failing case never stops the run.
* Bounds (issue: hostile sites): every browser call runs under an asyncio cap (its Playwright
  timeout + slack, and never past the whole-task deadline). A page that stops answering (a JS
  infinite loop) is detected by a liveness probe before each case: that case and the rest of its
  workflow are Blocked, the next workflow gets a fresh page in the same context, and the run goes
  on. Past the deadline every remaining case is Blocked and every remaining screenshot missing.
* Origin confinement: the context routes every request; anything but the site's own origin
  (``http://127.0.0.1:<port>``) is aborted, and a per-context proxy that goes nowhere catches what
  routing does not see (WebSockets): other loopback ports, other hosts, exfiltration beacons.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import os
import re
import shutil
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from stages.vision2web import sandbox
from stages.vision2web.schema import Task, load_start

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome", "chrome")
SLACK_S = 2.0            # asyncio cap beyond a call's own Playwright timeout
PROBE_S = 2.0            # liveness probe of a page before each case
CLOSE_S = 5.0
DEFAULT_DEADLINE_S = 300.0
MAX_SHOT_PIXELS = 40_000_000   # decoded screenshot/prototype size bound (PIL bomb guard)
LAUNCH_ARGS = ["--no-sandbox", "--font-render-hinting=none", "--disable-gpu", "--hide-scrollbars",
               "--force-color-profile=srgb", "--disable-background-networking", "--disable-sync",
               "--no-first-run", "--disable-extensions", "--disable-component-update",
               "--force-webrtc-ip-handling-policy=disable_non_proxied_udp", "--disable-dev-shm-usage"]


class SiteStartError(RuntimeError):
    """The site did not come up (reason in the message); the run then scores 0."""


class Stuck(Exception):
    """A browser call did not return within its cap (hung page) or the task deadline passed."""


def find_chromium() -> str | None:
    env = os.environ.get("V2W_CHROMIUM")
    if env:
        return env if Path(env).is_file() else None
    for name in CHROMIUM_CANDIDATES:
        path = shutil.which(name) if not name.startswith("/") else (name if Path(name).is_file() else None)
        if path:
            return path
    return None


def browser_available() -> bool:
    if find_chromium() is None:
        return False
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        return False
    return True


def free_port() -> int:
    return sandbox.free_port()


def png_to_array(data: bytes) -> np.ndarray:
    """Decode PNG/JPEG bytes to (H, W, 3) uint8; refuses images over MAX_SHOT_PIXELS."""
    from PIL import Image

    Image.MAX_IMAGE_PIXELS = MAX_SHOT_PIXELS
    with Image.open(io.BytesIO(data)) as im:
        if im.width * im.height > MAX_SHOT_PIXELS:
            raise ValueError(f"image of {im.width}x{im.height} pixels exceeds {MAX_SHOT_PIXELS}")
        return np.asarray(im.convert("RGB"), dtype=np.uint8)


# ---------------------------------------------------------------- serving
def _ready(url: str) -> str | None:
    """None when the site answers HTTP < 500, else a short reason."""
    try:
        with urllib.request.urlopen(url, timeout=1.0) as resp:
            return None if resp.status < 500 else f"HTTP {resp.status}"
    except urllib.error.HTTPError as err:
        return None if err.code < 500 else f"HTTP {err.code}"
    except Exception as err:  # noqa: BLE001 - any failure means "not ready yet"
        return type(err).__name__


@contextlib.asynccontextmanager
async def serve_site(site: Path | str, jail: bool | None = None):
    site = Path(site).resolve()
    spec = load_start(site)
    if spec is None:
        with sandbox.static_server(site) as url:
            yield url
        return
    port = sandbox.free_port()
    with sandbox.private_tmp() as tmp:
        subs = {"{python}": sandbox.python_exe(), "{port}": str(port), "{tmp}": tmp}
        cmd = [functools.reduce(lambda s, kv: s.replace(*kv), subs.items(), part) for part in spec.command]
        try:
            backend = sandbox.launch(site, cmd, port, tmp, jail)
        except OSError as err:
            raise SiteStartError(f"start command failed: {err.strerror or err}") from None
        try:
            url = f"http://127.0.0.1:{port}"
            loop = asyncio.get_running_loop()
            end = loop.time() + spec.ready_timeout_s
            last = "no answer"
            while True:
                if backend.proc.poll() is not None:
                    raise SiteStartError(f"start command exited with code {backend.proc.returncode} before serving {url}")
                last = await asyncio.to_thread(_ready, url + spec.ready_path)
                if last is None:
                    break
                if loop.time() >= end:
                    raise SiteStartError(f"site not ready at {url}{spec.ready_path} within {spec.ready_timeout_s:g} s ({last})")
                await asyncio.sleep(0.1)
            yield url
        finally:
            await asyncio.to_thread(backend.stop)


# ---------------------------------------------------------------- the browser
@contextlib.asynccontextmanager
async def browser_session():
    """One headless Chromium (Debian's, via Playwright with an explicit executable path)."""
    path = find_chromium()
    if path is None:
        raise RuntimeError("chromium not found (install Debian's `chromium` or set V2W_CHROMIUM)")
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=path, timeout=60_000, args=LAUNCH_ARGS)
        try:
            yield browser
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(browser.close(), 20)


_COMPONENTS_JS = """() => Array.from(document.querySelectorAll('[data-v2w]')).map(e => {
  const r = e.getBoundingClientRect();
  return {name: e.getAttribute('data-v2w'), x: r.left + window.scrollX, y: r.top + window.scrollY,
          w: r.width, h: r.height, vis: getComputedStyle(e).visibility !== 'hidden'};
})"""


NL_DETAIL = "natural-language step: needs an LLM GUI agent verifier (none offline)"


class NotExecutable(Exception):
    """A step the deterministic verifier cannot execute (prose): its case is Blocked."""


async def _do_action(page, base_url: str, act, timeout: int) -> None:
    if act.op == "nl":
        raise NotExecutable(NL_DETAIL)
    if act.op == "goto":
        await page.goto(base_url + act.path, timeout=timeout * 3)
    elif act.op == "click":
        await page.locator(act.selector).first.click(timeout=timeout)
    elif act.op == "fill":
        await page.locator(act.selector).first.fill(act.value, timeout=timeout)
    elif act.op == "press":
        await page.locator(act.selector).first.press(act.key, timeout=timeout)
    elif act.op == "reload":
        await page.reload(timeout=timeout * 3)
    else:  # pragma: no cover - the schema admits no other op
        raise ValueError(f"unknown action {act.op}")


async def _check(page, val, timeout: int) -> None:
    from playwright.async_api import expect

    if val.op == "nl":
        raise NotExecutable(NL_DETAIL)
    if val.op == "visible":
        await expect(page.locator(val.selector).first).to_be_visible(timeout=timeout)
    elif val.op == "hidden":
        await expect(page.locator(val.selector).first).to_be_hidden(timeout=timeout)
    elif val.op == "text_contains":
        await expect(page.locator(val.selector).first).to_contain_text(val.value, timeout=timeout)
    elif val.op == "text_equals":
        await expect(page.locator(val.selector).first).to_have_text(val.value, timeout=timeout)
    elif val.op == "count":
        await expect(page.locator(val.selector)).to_have_count(val.equals, timeout=timeout)
    elif val.op == "url_contains":
        await expect(page).to_have_url(re.compile(".*" + re.escape(val.value) + ".*"), timeout=timeout)
    else:  # pragma: no cover
        raise ValueError(f"unknown validation {val.op}")


def _short(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:200]


class _Clock:
    """Caps every browser call: its own bound, never past the whole-task deadline."""

    def __init__(self, deadline_s: float):
        self.loop = asyncio.get_running_loop()
        self.end = self.loop.time() + deadline_s

    def left(self) -> float:
        return self.end - self.loop.time()

    async def call(self, make, cap_s: float, what: str):
        budget = min(cap_s, self.left())
        if budget <= 0:
            raise Stuck("task deadline exceeded")
        try:
            return await asyncio.wait_for(make(), budget)
        except asyncio.TimeoutError:
            raise Stuck(f"{what}: no answer within {budget:.1f} s"
                        + (" (task deadline)" if self.left() <= 0 else " (page unresponsive)")) from None


def context_options(port: int | None) -> dict[str, Any]:
    """A fresh session: no service workers, no downloads, and a proxy that goes nowhere for everything
    but the site's own loopback port (``port=None``: any loopback port, for a context reused across
    tasks, where routing alone confines each task to its origin)."""
    bypass = f"<-loopback>;127.0.0.1:{port}" if port else "<-loopback>;127.0.0.1"
    return {"viewport": {"width": 1024, "height": 768}, "device_scale_factor": 1, "reduced_motion": "reduce",
            "service_workers": "block", "accept_downloads": False,
            "proxy": {"server": "http://127.0.0.1:9", "bypass": bypass}}


async def new_pooled_context(browser):
    return await asyncio.wait_for(browser.new_context(**context_options(None)), 60)


async def run_task(task: Task, base_url: str, browser, *, shots: bool = True, capture_components: bool = False,
                   clip_heights: dict[str, int] | None = None, deadline_s: float = DEFAULT_DEADLINE_S,
                   context=None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run every workflow of ``task`` against ``base_url`` in one context. Returns (per-workflow results
    with the cases' Pass/Fail/Blocked and the visual nodes' PNG bytes [and component boxes], info
    {blocked_requests, stuck, deadline_hit, context_ok}).

    ``context``: a context from ``new_pooled_context`` reused across tasks (the pipeline: one per
    concurrent slot, saving a renderer start per task); it is handed back clean (routes removed,
    cookies and the origin's storage cleared) or, when that fails, ``info["context_ok"]`` is False and
    the caller must discard it. Without it, a fresh context is created and closed (the CLI)."""
    meta = task.meta
    clock = _Clock(deadline_s)
    origin = base_url.rstrip("/")
    port = origin.rsplit(":", 1)[1]
    nav_s = meta.navigation_timeout_ms / 1000 + SLACK_S
    act_s = meta.action_timeout_ms / 1000 * 3 + SLACK_S    # goto/reload get 3x the action bound
    val_s = meta.validation_timeout_ms / 1000 + SLACK_S
    info: dict[str, Any] = {"blocked_requests": 0, "stuck": 0, "deadline_hit": False, "context_ok": True}
    pooled = context is not None

    async def route(r):
        url = r.request.url
        if url == origin or url.startswith(origin + "/"):
            await r.continue_()
        else:                                   # ALGO (sandbox): only the site's own origin
            info["blocked_requests"] += 1
            await r.abort("blockedbyclient")

    async def ws_route(ws):
        info["blocked_requests"] += 1
        await ws.close(code=1008, reason="blocked by the verifier")

    if context is None:
        context = await clock.call(lambda: browser.new_context(**context_options(int(port))), CLOSE_S + nav_s,
                                   "new_context")
    results = []
    page = None
    try:
        context.set_default_timeout(meta.action_timeout_ms)
        context.set_default_navigation_timeout(meta.navigation_timeout_ms)
        await clock.call(lambda: context.route("**/*", route), CLOSE_S, "route")
        await clock.call(lambda: context.route_web_socket(re.compile(".*"), ws_route), CLOSE_S, "route_web_socket")
        for wf in task.workflows:
            shots_out: dict[str, Any] = {}
            cases: list[dict[str, Any]] = []
            start_err = None
            try:
                if page is None:
                    page = await clock.call(context.new_page, nav_s, "new_page")
                await clock.call(lambda: page.set_viewport_size(
                    {"width": wf.resolution.width, "height": wf.resolution.height}), nav_s, "set_viewport_size")
                await clock.call(lambda: page.goto(base_url + "/", timeout=meta.navigation_timeout_ms), nav_s, "goto /")
            except Stuck as err:
                start_err = str(err)
            except Exception as err:  # noqa: BLE001
                start_err = f"could not load the site root: {_short(err)}"
            page_ok = start_err is None or not start_err.endswith("(page unresponsive)")

            async def snap(i: int) -> None:
                for name, node in wf.prototype.items():
                    if node.idx != i:
                        continue
                    if not shots or not page_ok or page is None:
                        shots_out[name] = {"png": None, "error": "not captured" if not shots else "page unresponsive"}
                        continue
                    try:
                        h = (clip_heights or {}).get(name)
                        kw: dict[str, Any] = {"full_page": node.fullpage, "animations": "allow", "caret": "hide",
                                              "timeout": meta.navigation_timeout_ms}
                        if h and node.fullpage:
                            kw["clip"] = {"x": 0, "y": 0, "width": wf.resolution.width, "height": h}
                        data = await clock.call(lambda: page.screenshot(**kw), nav_s, f"screenshot {name}")
                        shot: dict[str, Any] = {"png": data}
                        if capture_components:
                            shot["components"] = await clock.call(lambda: page.evaluate(_COMPONENTS_JS), nav_s,
                                                                  "components")
                    except Exception as err:  # noqa: BLE001 - a missing screenshot scores 0
                        shot = {"png": None, "error": _short(err)}
                    shots_out[name] = shot

            await snap(0)
            for i, case in enumerate(wf.content):
                result, detail = "Pass", ""
                if clock.left() <= 0:
                    result, detail = "Blocked", "task deadline exceeded"
                    info["deadline_hit"] = True
                elif not page_ok:
                    result, detail = "Blocked", start_err or "page unresponsive"
                elif start_err is not None:
                    result, detail = "Blocked", start_err
                else:
                    try:   # liveness probe: a page stuck in a script loop never answers
                        await clock.call(lambda: page.evaluate("1"), PROBE_S, "liveness probe")
                        for act in case.actions:
                            try:
                                await clock.call(lambda: _do_action(page, base_url, act, meta.action_timeout_ms),
                                                 act_s, act.op)
                            except Stuck:
                                raise
                            except Exception as err:  # noqa: BLE001
                                result, detail = "Blocked", f"{act.op}: {_short(err)}"
                                break
                        if result == "Pass":
                            for val in case.validations:
                                try:
                                    await clock.call(lambda: _check(page, val, meta.validation_timeout_ms), val_s, val.op)
                                except Stuck:
                                    raise
                                except AssertionError as err:
                                    result, detail = "Fail", f"{val.op}: {_short(err)}"
                                    break
                                except Exception as err:  # noqa: BLE001 - e.g. an invalid selector
                                    result, detail = "Blocked", f"{val.op}: {_short(err)}"
                                    break
                    except Stuck as err:
                        result, detail = "Blocked", str(err)
                        page_ok = False
                        start_err = str(err)
                        info["stuck"] += 1
                        info["deadline_hit"] |= clock.left() <= 0
                cases.append({"objective": case.objective, "result": result, "detail": detail,
                              "counted": bool(case.validations)})
                await snap(i + 1)
            if not page_ok and page is not None:   # abandon the hung page; the next workflow gets a fresh one
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(page.close(run_before_unload=False), CLOSE_S)
                page = None
            results.append({"summary": wf.summary, "resolution": [wf.resolution.width, wf.resolution.height],
                            "cases": cases, "shots": shots_out})
    finally:
        if pooled:
            info["context_ok"] = await _clean(context, page, origin)
        else:
            try:
                await asyncio.wait_for(context.close(), CLOSE_S)
            except Exception:  # noqa: BLE001
                info["stuck"] += 1
    return results, info


async def _clean(context, page, origin: str) -> bool:
    """Hand a reused context back as a fresh session; False when it could not be cleaned in time."""
    async def go():
        p = page or await context.new_page()
        cdp = await context.new_cdp_session(p)
        await cdp.send("Storage.clearDataForOrigin", {"origin": origin, "storageTypes": "all"})
        await cdp.detach()
        await context.clear_cookies()
        await context.clear_permissions()
        await context.unroute_all(behavior="ignoreErrors")
        for pg in list(context.pages):
            await pg.close(run_before_unload=False)
    try:
        await asyncio.wait_for(go(), CLOSE_S)
        return True
    except Exception:  # noqa: BLE001
        return False
