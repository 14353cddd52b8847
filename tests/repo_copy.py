"""Copy this checkout into a fresh git repository for end-to-end tests (DVC, Prefect).

The copy holds the tracked files plus the untracked, not-ignored ones (work in progress of the
current tree), ``profile: <profile>`` in its params.yaml, and one commit (DVC and Prefect's git
pull step need a git repository). Nothing in the copy touches the original checkout.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from stages.common.paths import ROOT

GIT_ENV = {"GIT_AUTHOR_NAME": "tests", "GIT_AUTHOR_EMAIL": "tests@localhost",
           "GIT_COMMITTER_NAME": "tests", "GIT_COMMITTER_EMAIL": "tests@localhost"}


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True,
                          env={**os.environ, **GIT_ENV}).stdout


def copy_repo(dest: Path, profile: str = "smoke", src: Path = ROOT) -> Path:
    """Copy ``src``'s working tree into a fresh one-commit git repo at ``dest``."""
    listed = git(src, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    dest.mkdir(parents=True, exist_ok=True)
    for rel in filter(None, listed):
        source = src / rel
        if not source.is_file() or rel.startswith(("data/", "wandb/")) or rel.endswith("MUJOCO_LOG.TXT"):
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    (dest / ".dvc").mkdir(exist_ok=True)
    (dest / ".dvc" / "config.local").unlink(missing_ok=True)
    params = dest / "params.yaml"
    params.write_text(re.sub(r"(?m)^profile:.*$", f"profile: {profile}", params.read_text()))
    git(dest, "init", "-q", "-b", "main")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", f"test copy at profile {profile}")
    return dest


def tool_env(**extra: str) -> dict[str, str]:
    """Environment for subprocesses: the venv's python/dvc first on PATH, W&B off."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(WANDB_MODE="disabled", DVC_NO_ANALYTICS="1", PYTHONDONTWRITEBYTECODE="1")
    env.pop("PAPERS_ROOT", None)
    env.update(extra)
    return env
