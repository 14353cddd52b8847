"""A study: one paper's four stages at the default profile with a few params changed, outside the DVC graph.

A study answers "what does this pipeline say at another size?" with the pipeline's own code, claims and report,
and leaves the committed default results alone. It copies ``params.yaml``, applies ``--set`` overrides to
``papers.<slug>.<stage>`` (the default block; profile overrides are left as they are), runs prepare → train →
evaluate → report under a scratch root, and copies the report folder (report.md, metrics.json, claims.json,
figures) to ``--out`` beside a ``study.json`` naming the overrides, the command and the stage times.

    python -m stages.common.study clip_binding --out reports/studies/clip_binding_v6 \\
        --set prepare.v=6 --set train.d_model=64 --set train.steps=3000

A value is read as YAML (``3000`` an int, ``[0, 1, 2]`` a list, ``null`` None). An override must name a key the
paper's params already have (a typo is an error before any work); the stage Configs then validate the values as
``dvc repro`` would.
"""
from __future__ import annotations

import argparse
import copy
import shlex
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from stages.common.config import STAGES, ConfigError, read_params
from stages.common.paths import ROOT, read_json, write_json


def parse_override(text: str) -> tuple[str, list[str], Any]:
    """``stage.key.sub=value`` -> (stage, [key, sub], value read as YAML)."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected stage.key=value")
    path, raw = text.split("=", 1)
    keys = path.strip().split(".")
    if len(keys) < 2 or not all(keys):
        raise ConfigError(f"--set {text!r}: the key must name a stage and a key, e.g. train.steps=3000")
    if keys[0] not in STAGES:
        raise ConfigError(f"--set {text!r}: {keys[0]!r} is not a stage (one of {', '.join(STAGES)})")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        raise ConfigError(f"--set {text!r}: the value is not YAML ({e.__class__.__name__})") from None
    return keys[0], keys[1:], value


def apply_overrides(params: dict, slug: str, overrides: list[str]) -> dict:
    """A copy of ``params`` with each override set in ``papers.<slug>.<stage>``; unknown keys are errors."""
    out = copy.deepcopy(params)
    paper = out.get("papers", {}).get(slug)
    if paper is None:
        raise ConfigError(f"papers.{slug}: no such paper in params.yaml")
    for text in overrides:
        stage, keys, value = parse_override(text)
        node = paper.get(stage)
        where = f"papers.{slug}.{stage}"
        for k in keys[:-1]:
            if not isinstance(node, dict) or k not in node:
                raise ConfigError(f"--set {text!r}: {where}.{k} is not in params.yaml")
            node, where = node[k], f"{where}.{k}"
        if not isinstance(node, dict) or keys[-1] not in node:
            raise ConfigError(f"--set {text!r}: {where}.{keys[-1]} is not in params.yaml")
        node[keys[-1]] = value
    return out


def _shown(path: Path) -> str:
    """The path relative to the checkout when inside it (the command then runs from any clone)."""
    try:
        return str(path.resolve().relative_to(ROOT.resolve()))
    except ValueError:
        return str(path)


def study_banner(info: dict) -> str:
    sets = ", ".join(f"`{o}`" for o in info["overrides"]) or "none"
    at = ""
    if info.get("commit"):
        at = f"; code at commit `{info['commit'][:10]}`" + (" with uncommitted changes" if info.get("code_dirty") else "")
    return (f"> **Study, not the default run** (`stages/common/study.py`; not re-run by `dvc repro`). Overrides of "
            f"`papers.{info['slug']}` in params.yaml: {sets}; profile `{info['profile']}`{at}. Every number and verdict "
            f"below is this run's; prose written for the default configuration (e.g. how its budget was chosen) may "
            f"not describe this one. Regenerate: `{info['command']}`.\n\n")


def code_version(root: Path = ROOT) -> dict:
    """The commit the study's code is at and whether the code (stages/, kernels/, params.yaml) had uncommitted
    changes: a study is a snapshot, and a later change to the paper's code can move its numbers when re-run.
    {"commit": None, "code_dirty": None} outside a git checkout."""
    import subprocess
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "stages", "kernels", "params.yaml"], cwd=root,
                               capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "code_dirty": None}
    return {"commit": head.stdout.strip(), "code_dirty": bool(dirty.stdout.strip())}


def only_profile(params: dict, slug: str, profile: str) -> dict:
    """A copy of ``params`` whose ``papers.<slug>`` stage blocks keep only ``profile``'s overrides (none for the
    default): a study runs that one profile, and a value changed in the default block can contradict another
    profile's own (star_kv's smoke seeds [0] against side_seeds [5]), which the runner's cross-profile config
    check would refuse although that profile never runs."""
    out = copy.deepcopy(params)
    for stage in STAGES:
        block = out["papers"][slug].get(stage)
        if isinstance(block, dict) and isinstance(block.get("profiles"), dict):
            kept = {name: v for name, v in block["profiles"].items() if name == profile}
            if kept:
                block["profiles"] = kept
            else:
                del block["profiles"]
    return out


def run_study(slug: str, overrides: list[str], out: Path, scratch: Path | None = None,
              profile: str = "default") -> dict:
    """Run the four stages with the overrides under a scratch root; copy the report folder to ``out``.
    (``profile`` other than default: that profile's own overrides are merged over the changed default block.)"""
    from stages.common.runner import run_pipeline, runtime_file    # imports torch & co. only when a study runs

    params = only_profile(apply_overrides(read_params(), slug, overrides), slug, profile)
    params["profile"] = profile
    version = code_version()                    # at the start: the code the stages run
    own = scratch is None
    root = Path(tempfile.mkdtemp(prefix=f"study-{slug}-")) if own else scratch
    try:
        params_path = root / "params.yaml"
        params_path.write_text(yaml.safe_dump(params, sort_keys=False))
        run_pipeline(slug, root=root, profile=profile, params_path=params_path)
        times = {stage: round(read_json(runtime_file(slug, stage, root))["runtime_s"], 1) for stage in STAGES}
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(root / "reports" / slug, tmp)
        info = {"slug": slug, "profile": profile, "overrides": overrides, "stage_wall_s": times, **version,
                "command": " ".join(["python -m stages.common.study", slug, "--out", _shown(out)]
                                   + [f"--set {shlex.quote(o)}" for o in overrides])}
        write_json(tmp / "study.json", info)
        report = tmp / "report.md"
        if report.is_file():      # a banner: the prose was written for the default configuration, the numbers not
            report.write_text(study_banner(info) + report.read_text())
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
        return info
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("slug")
    ap.add_argument("--out", type=Path, required=True, help="folder for the study's report (replaced)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="STAGE.KEY=VALUE")
    a = ap.parse_args(argv)
    try:
        apply_overrides(read_params(), a.slug, a.overrides)     # every override checked before any work
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = a.out if a.out.is_absolute() else ROOT / a.out
    from stages.common.runner import MissingInputError
    try:
        info = run_study(a.slug, a.overrides, out)
    except (ConfigError, MissingInputError) as e:        # a value the stage Configs refuse: one line, no --out
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"[study] {a.slug}: report in {out} (stage wall times {info['stage_wall_s']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
