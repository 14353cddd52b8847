"""Copy this repository (tracked + untracked-not-ignored files) into a temp dir, as a fresh clone
would see it, for end-to-end tests that run DVC and Prefect against it."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from stages.common.paths import ROOT


def copy_repo(dest: Path, profile: str = "smoke") -> Path:
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                           cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    params = yaml.safe_load((dest / "params.yaml").read_text())
    params["profile"] = profile
    (dest / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run = lambda *a: subprocess.run(a, cwd=dest, check=True, capture_output=True)  # noqa: E731
    run("git", "init", "-q")
    run("git", "add", "-A")
    run("git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "copy")
    return dest


def tool_env(**extra: str) -> dict[str, str]:
    """Environment for subprocesses: the venv's python/dvc first on PATH, W&B off."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(WANDB_MODE="disabled", DVC_NO_ANALYTICS="1", PYTHONDONTWRITEBYTECODE="1")
    env.pop("PAPERS_ROOT", None)
    env.update(extra)
    return env
