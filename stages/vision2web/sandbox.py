"""Running untrusted agent-built sites: a confined static server and a contained backend process.

Threat model (README.md beside this file): a site folder is untrusted code and data. Here:

* ``static_server(root)`` serves only **regular files inside the site root** (the resolved path must
  lie under the resolved root: a symlink that points outside, ``..`` segments, device files, fifos
  and directories without index.html give 404); GET/HEAD only; a client that hangs up mid-transfer
  (e.g. on a 50 MB page) ends that request silently, never with a traceback.
* ``backend(site, spec, port)`` runs a site's start command
  - in its own session and process group, with a scrubbed environment (PATH, LANG, PORT, HOST,
    HOME/TMPDIR = a private temp dir deleted afterwards) and resource limits (CPU seconds, file
    size, no core dumps);
  - inside ``unshare`` PID + mount namespaces when available (root, util-linux): the site folder is
    bind-mounted read-only and every process the backend spawns lives in the PID namespace, which
    the kernel tears down when its first process dies;
  - tagged with a unique environment marker; at the end the whole group is sent SIGTERM, then
    SIGKILL, and every process still carrying the marker (one that called setsid() or double-forked
    out of the group) is killed too.
  The backend keeps the host's network (the browser must reach it on loopback); the pages it serves
  are confined by the browser's routing (browser.py). Running the verifier itself as an
  unprivileged user in a container without network removes the remaining exposure.
"""
from __future__ import annotations

import contextlib
import functools
import http.server
import mimetypes
import os
import resource
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from pathlib import Path

MARKER = "V2W_SANDBOX_ID"
CPU_LIMIT_S = 900               # RLIMIT_CPU of a backend (whole process tree counts per process)
FSIZE_LIMIT = 256 * 2 ** 20     # largest file a backend may write


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- static files
class _ConfinedHandler(http.server.BaseHTTPRequestHandler):
    """GET/HEAD of regular files inside ``root`` (resolved), nothing else."""

    root: str = "/nonexistent"
    server_version = "v2w-static"

    def log_message(self, *args) -> None:   # no request log on stderr
        pass

    def _resolve(self) -> str | None:
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        if "\x00" in path:
            return None
        target = os.path.realpath(os.path.join(self.root, path.lstrip("/")))
        if target != self.root and not target.startswith(self.root + os.sep):
            return None                       # outside the site (.., or a symlink pointing out)
        if os.path.isdir(target):
            target = os.path.realpath(os.path.join(target, "index.html"))
            if not target.startswith(self.root + os.sep):
                return None
        try:
            st = os.stat(target)
        except OSError:
            return None
        return target if stat.S_ISREG(st.st_mode) else None

    def _send(self, body: bool) -> None:
        target = self._resolve()
        if target is None:
            self.send_error(404, "not found")
            return
        try:
            fh = open(target, "rb")
        except OSError:
            self.send_error(404, "not found")
            return
        with fh:
            size = os.fstat(fh.fileno()).st_size
            self.send_response(200)
            self.send_header("Content-Type", mimetypes.guess_type(target)[0] or "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if body:
                shutil.copyfileobj(fh, self.wfile, 1 << 16)

    def do_GET(self) -> None:  # noqa: N802
        self._send(True)

    def do_HEAD(self) -> None:  # noqa: N802
        self._send(False)

    def handle(self) -> None:
        try:
            super().handle()
        except (ConnectionError, TimeoutError, OSError):   # the browser hung up: not our problem
            pass


class _QuietServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:   # never print a traceback
        pass


@contextlib.contextmanager
def static_server(root: Path | str):
    """Serve ``root`` on a free loopback port; yields the base URL."""
    real = os.path.realpath(root)
    handler = type("Handler", (_ConfinedHandler,), {"root": real})
    server = _QuietServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------- backends
@functools.lru_cache(maxsize=1)
def unshare_available() -> bool:
    """PID + mount namespaces through util-linux ``unshare`` (needs root or user namespaces)."""
    exe = shutil.which("unshare")
    if exe is None or shutil.which("mount") is None:
        return False
    try:
        r = subprocess.run([exe, "--pid", "--fork", "--kill-child", "--mount", "--mount-proc", "--propagation",
                            "private", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def _limits() -> None:   # runs in the child before exec
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_LIMIT_S, CPU_LIMIT_S))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE_LIMIT, FSIZE_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def marked_pids(marker: str) -> list[int]:
    """Processes whose environment carries ``V2W_SANDBOX_ID=<marker>`` (readable ones)."""
    needle = f"{MARKER}={marker}".encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if needle in fh.read().split(b"\0"):
                    out.append(int(entry))
        except OSError:
            continue
    return out


def kill_marked(marker: str, grace_s: float = 2.0) -> int:
    """SIGTERM, then SIGKILL, every process carrying the marker; returns how many were found."""
    pids = marked_pids(marker)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        end = time.monotonic() + grace_s
        while time.monotonic() < end and marked_pids(marker):
            time.sleep(0.05)
        pids = marked_pids(marker)
        if not pids:
            break
    return len(pids)


class Backend:
    """A started backend: ``proc`` (the launcher), ``marker``, ``tmp`` (private temp dir)."""

    def __init__(self, proc: subprocess.Popen, marker: str, tmp: str, jailed: bool):
        self.proc, self.marker, self.tmp, self.jailed = proc, marker, tmp, jailed

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=3)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)   # stragglers still in the group
        kill_marked(self.marker)                        # ... and those that left it (setsid, double fork)


def launch(site: Path, command: list[str], port: int, tmp: str, jail: bool | None = None) -> Backend:
    """Start ``command`` (already substituted) for ``site``; raises OSError when it cannot be executed."""
    marker = uuid.uuid4().hex
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "PORT": str(port),
           "HOST": "127.0.0.1", "HOME": tmp, "TMPDIR": tmp, MARKER: marker, "PYTHONDONTWRITEBYTECODE": "1"}
    jailed = unshare_available() if jail is None else jail
    if jailed:
        # ALGO (sandbox): PID + mount namespace; the site is re-mounted read-only inside it; when the
        # namespace's first process (the jail script) exits, the kernel kills every process in it
        script = ('set -e; mount --bind "$1" "$1"; mount -o remount,bind,ro "$1"; cd "$1"; shift; '
                  '"$@" & child=$!; trap "kill -TERM $child 2>/dev/null" TERM; wait $child')
        argv = [shutil.which("unshare") or "unshare", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc",
                "--propagation", "private", "sh", "-c", script, "v2w-jail", str(site), *command]
    else:
        argv = list(command)
    proc = subprocess.Popen(argv, cwd=site, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, preexec_fn=_limits)
    return Backend(proc, marker, tmp, jailed)


@contextlib.contextmanager
def private_tmp():
    tmp = tempfile.mkdtemp(prefix="v2w-site-")
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def python_exe() -> str:
    return sys.executable
