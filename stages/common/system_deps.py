"""System packages the pipelines need beyond the pinned Python set, installed by one step that
`make repro`, `make test` and `.ci/run` share (issue 58). Standard library only: it runs before the
virtualenv exists.

    python3 -m stages.common.system_deps check             # list what is missing (exit 0)
    python3 -m stages.common.system_deps install           # apt-get what is missing (root + apt), else warn
    python3 -m stages.common.system_deps install --required  # ... else one line and exit 2 (make repro)
    python3 -m stages.common.system_deps install --dry-run   # print what would run, change nothing
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class SystemDep:
    executables: tuple[str, ...]   # any one of these on PATH satisfies it
    apt: str                       # the Debian package that provides it
    needed_by: str                 # which stage needs it, in words


# Every executable a stage looks up with shutil.which() must be listed here (tests/common/test_system_deps.py).
SYSTEM_DEPS = (
    SystemDep(("chromium", "chromium-browser", "google-chrome", "chrome", "/usr/bin/chromium"), "chromium",
              "vision2web's browser verifier (Playwright drives Debian's chromium; no browser download)"),
    SystemDep(("git",), "git", "DVC (the pipeline's lock file and experiments) and the Prefect git-sourced deployments"),
    SystemDep(("unshare",), "util-linux", "vision2web's verifier sandbox (a private mount/network namespace per site)"),
    SystemDep(("mount",), "mount", "vision2web's verifier sandbox (read-only bind of the site folder)"),
)


def missing() -> list[SystemDep]:
    return [d for d in SYSTEM_DEPS if not any(shutil.which(e) for e in d.executables)]


def _can_apt() -> bool:
    return shutil.which("apt-get") is not None and hasattr(os, "geteuid") and os.geteuid() == 0


def install(required: bool = False, dry_run: bool = False) -> int:
    todo = missing()
    if not todo:
        print("system packages: all present (" + ", ".join(d.apt for d in SYSTEM_DEPS) + ")")
        return 0
    pkgs = [d.apt for d in todo]
    cmd = ["apt-get", "install", "-y", "-qq", *pkgs]
    if dry_run:
        for d in todo:
            print(f"would install {d.apt} (needed by {d.needed_by})")
        print("would run: apt-get update -qq && DEBIAN_FRONTEND=noninteractive " + " ".join(cmd))
        return 0
    if _can_apt():
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        ok = (subprocess.run(["apt-get", "update", "-qq"], env=env, stdout=subprocess.DEVNULL).returncode == 0
              and subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL).returncode == 0)
        todo = missing()
        if ok and not todo:
            print("system packages: installed " + ", ".join(pkgs))
            return 0
    line = ("missing system package" + ("s" if len(todo) > 1 else "") + ": "
            + "; ".join(f"{d.apt} (needed by {d.needed_by})" for d in todo)
            + f" — install with: sudo apt-get install {' '.join(d.apt for d in todo)}")
    print(("error: " if required else "warning: ") + line, file=sys.stderr)
    return 2 if required else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m stages.common.system_deps", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("check", "install"))
    parser.add_argument("--required", action="store_true", help="exit 2 if anything stays missing")
    parser.add_argument("--dry-run", action="store_true", help="print what would be installed; change nothing")
    args = parser.parse_args(argv)
    if args.action == "check":
        for d in SYSTEM_DEPS:
            found = next((shutil.which(e) for e in d.executables if shutil.which(e)), None)
            print(f"{d.apt}: {found or 'MISSING'} — {d.needed_by}")
        return 0
    return install(required=args.required, dry_run=args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
