"""Helpers for the flow tests: a git repo copy of this checkout at the smoke profile.

The copy holds the tracked files plus the untracked, not-ignored ones (work in progress of the
current tree), ``profile: smoke`` in its params.yaml, and one commit (DVC and Prefect's git pull
step need a git repository). Nothing in the copy touches /work/main.
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SLUG = "reversal_curse"  # the paper the flow tests run (smoke profile)
GIT_ENV = {"GIT_AUTHOR_NAME": "tests", "GIT_AUTHOR_EMAIL": "tests@localhost",
           "GIT_COMMITTER_NAME": "tests", "GIT_COMMITTER_EMAIL": "tests@localhost"}


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True,
                          env={**os.environ, **GIT_ENV}).stdout


def copy_repo(dst: Path, src: Path = REPO, profile: str = "smoke") -> Path:
    """Copy ``src``'s working tree (tracked + untracked-not-ignored files) into a fresh git repo."""
    listed = git(src, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    dst.mkdir(parents=True, exist_ok=True)
    for rel in filter(None, listed):
        source = src / rel
        if not source.is_file() or rel.startswith(("data/", "wandb/")) or rel.endswith("MUJOCO_LOG.TXT"):
            continue
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    (dst / ".dvc").mkdir(exist_ok=True)
    (dst / ".dvc" / "config.local").unlink(missing_ok=True)
    params = dst / "params.yaml"
    params.write_text(re.sub(r"(?m)^profile:.*$", f"profile: {profile}", params.read_text()))
    git(dst, "init", "-q", "-b", "main")
    git(dst, "add", "-A")
    git(dst, "commit", "-q", "-m", f"test copy at profile {profile}")
    return dst


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


