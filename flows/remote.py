"""The shared DVC remote: configure it, check it before use, pull and push with the run-cache.

    make remote REMOTE=/mnt/shared/dvc-store      # or s3://bucket/path, ssh://host/path, ...
    python -m flows.remote set /mnt/shared/dvc-store [--local]
    python -m flows.remote check                  # one line: the default remote and whether it answers

The remote is DVC's own mechanism: ``dvc push --run-cache`` uploads outputs *and* the run-cache
(stage hash -> outputs), so ``dvc repro --pull`` on another machine restores a stage computed
elsewhere instead of recomputing it. Problems (no remote, missing folder, unsupported URL, no
answer in time) raise :class:`RemoteError` with one line naming the remote, before anything is
pulled or pushed.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from pathlib import Path
from urllib.parse import urlparse

from flows.proc import ROOT, CommandFailed, dvc, run_streaming

DEFAULT_NAME = "shared"
CHECK_TIMEOUT_S = 30.0


class RemoteError(RuntimeError):
    """A misconfigured or unreachable DVC remote (the message names it)."""


def _is_local(url: str) -> bool:
    scheme = urlparse(url).scheme
    return scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt")


def _local_path(url: str, base: Path) -> Path:
    path = Path(url.split("://", 1)[-1]) if url.startswith("file://") else Path(url)
    return path if path.is_absolute() else (base / path)


def configure(url: str, root: Path = ROOT, name: str = DEFAULT_NAME, local: bool = False,
              logger: logging.Logger | None = None) -> str:
    """Make ``url`` the default DVC remote of the checkout at ``root`` (project config, or
    ``.dvc/config.local`` with ``local=True``), after checking it. Returns the stored URL."""
    url = url.strip()
    if not url:
        raise RemoteError("DVC remote: empty URL (make remote REMOTE=<folder-or-url>)")
    if _is_local(url):
        path = _local_path(url, Path.cwd()).resolve()
        if not path.is_dir():
            raise RemoteError(f"DVC remote {name!r}: folder {path} does not exist (create it first: mkdir -p {path})")
        url = str(path)
    flags = ["--local"] if local else []
    try:
        run_streaming(dvc("remote", "add", *flags, "--force", "--default", name, url), root, logger,
                      timeout=60, what="dvc remote add")
    except CommandFailed as err:
        raise RemoteError(f"DVC remote {name!r} ({url}): {err.tail.strip().splitlines()[-1] if err.tail.strip() else err}") from None
    check(root)
    return url


def check(root: Path = ROOT, timeout: float = CHECK_TIMEOUT_S) -> str:
    """Raise RemoteError unless the checkout's default remote exists and answers; returns
    ``"<name> (<url>)"``. Runs in a thread so an unreachable host fails within ``timeout``."""
    result: dict[str, object] = {}

    def probe() -> None:
        try:
            from dvc.repo import Repo

            with Repo(str(root)) as repo:
                name = repo.config["core"].get("remote")
                if not name:
                    result["error"] = ("no default DVC remote is configured in "
                                       f"{root} (make remote REMOTE=<folder-or-url>)")
                    return
                remotes = repo.config.get("remote", {})
                if name not in remotes:
                    result["error"] = f"DVC remote {name!r}: default remote is not defined in .dvc/config"
                    return
                url = remotes[name].get("url", "")
                result["label"] = f"{name!r} ({url})"
                if _is_local(url) and not _local_path(url, root / ".dvc").is_dir():
                    result["error"] = f"DVC remote {name!r}: folder {url} does not exist"
                    return
                remote = repo.cloud.get_remote(name)
                if not remote.fs.exists(remote.path):
                    result["error"] = f"DVC remote {name!r} ({url}): not found or not readable"
                    return
        except Exception as err:  # DVC's own config/URL/plugin errors, named by the remote
            label = result.get("label", "default")
            msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            result["error"] = f"DVC remote {label}: {msg}"

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise RemoteError(f"DVC remote {result.get('label', '(default)')}: no answer within {timeout:.0f} s (unreachable?)")
    if "error" in result:
        raise RemoteError(str(result["error"]))
    return str(result["label"])


def push(root: Path, targets: list[str], logger: logging.Logger | None = None, timeout: float = 1800) -> None:
    """``dvc push --run-cache <targets>``: the stages' outputs and their run-cache entries."""
    run_streaming(dvc("push", "--run-cache", *targets), root, logger, timeout=timeout, what="dvc push --run-cache")


def pull(root: Path, targets: list[str], logger: logging.Logger | None = None, timeout: float = 1800) -> None:
    """``dvc pull --run-cache --allow-missing <targets>``: what the remote already has."""
    run_streaming(dvc("pull", "--run-cache", "--allow-missing", *targets), root, logger, timeout=timeout,
                  what="dvc pull --run-cache")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.remote", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_set = sub.add_parser("set", help="make URL (or folder) the default DVC remote, then check it")
    p_set.add_argument("url")
    p_set.add_argument("--name", default=DEFAULT_NAME)
    p_set.add_argument("--local", action="store_true", help="write .dvc/config.local (not committed)")
    sub.add_parser("check", help="check the default remote answers")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "set":
            url = configure(args.url, ROOT, args.name, args.local)
            where = ".dvc/config.local" if args.local else ".dvc/config (commit it so workers' clones use it)"
            print(f"DVC remote {args.name!r} -> {url} (default, in {where})")
        else:
            print(f"DVC remote {check(ROOT)}: ok")
        return 0
    except RemoteError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
