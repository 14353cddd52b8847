"""Loader for the official Vision2Web task layout (zai-org/Vision2Web), converted into this project's
task folders (README.md beside this file).

Assumed layout (from the paper card's "Official code notes"; the repository itself was not
reachable from here, so every assumption is listed and checked by the loader):

    datasets/
      webpage/<task>/   -> L1    prototypes/*.jpg, resources/, workflow.json
      frontend/<task>/  -> L2    ... + prompt.txt
      website/<task>/   -> L3    ... + prd.md

* workflow.json: a list of {summary, resolution{width,height} (absent -> 1024x768), prototype
  {name: {idx, fullpage = true}}, content [{objective, actions [], validations []}]}; idx 0 = before
  case 0, N = after case N-1. Prototype ``name`` is the file stem in prototypes/ (.jpg, .jpeg or .png).
* actions / validations are natural-language strings (the official verifier is an LLM GUI agent);
  each string becomes ``{"op": "nl", "text": ...}`` (the deterministic verifier marks such a case
  Blocked, which scores 0 like the official Blocked). Objects already in this project's structured
  form are kept as they are.
* a case with an empty validations list is not counted in FS (official analyzer).
* resources/ and the prompt/PRD are copied for the agents; start.sh belongs to the agent's site.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from stages.vision2web.schema import PROTO_EXTS, Task, TaskFormatError, load_json_file, load_task

LEVEL_DIRS = {"webpage": "L1", "frontend": "L2", "website": "L3"}
MAX_RESOURCES_BYTES = 200 * 2 ** 20


def _step(x: Any, where: str) -> dict:
    if isinstance(x, str):
        if not x.strip():
            raise TaskFormatError(f"{where}: empty step")
        return {"op": "nl", "text": x.strip()[:2000]}
    if isinstance(x, dict):
        return x
    raise TaskFormatError(f"{where}: a step must be a string or an object (got {type(x).__name__})")


def convert_workflow(raw: Any, where: str) -> list[dict]:
    if not isinstance(raw, list) or not raw:
        raise TaskFormatError(f"{where}: must be a non-empty JSON list of workflows")
    out = []
    for i, wf in enumerate(raw):
        if not isinstance(wf, dict):
            raise TaskFormatError(f"{where}: [{i}] must be an object")
        wf = dict(wf)
        content = []
        for j, case in enumerate(wf.get("content") or []):
            if not isinstance(case, dict):
                raise TaskFormatError(f"{where}: [{i}].content.{j} must be an object")
            case = dict(case)
            for key in ("actions", "validations"):
                steps = case.get(key) or []
                if not isinstance(steps, list):
                    raise TaskFormatError(f"{where}: [{i}].content.{j}.{key} must be a list")
                case[key] = [_step(x, f"{where}: [{i}].content.{j}.{key}.{k}") for k, x in enumerate(steps)]
            content.append(case)
        wf["content"] = content
        out.append(wf)
    return out


def iter_official(root: Path | str):
    """(level, task dir) of every task under datasets/{webpage,frontend,website}/, sorted."""
    root = Path(root)
    if not root.is_dir():
        raise TaskFormatError(f"{root}: official datasets folder does not exist")
    found = False
    for sub, level in LEVEL_DIRS.items():
        d = root / sub
        if not d.is_dir():
            continue
        found = True
        for task in sorted(p for p in d.iterdir() if p.is_dir()):
            yield level, task
    if not found:
        raise TaskFormatError(f"{root}: none of {', '.join(LEVEL_DIRS)} found (expected the official datasets/ folder)")


def convert_task(src: Path, level: str, dst: Path) -> Task:
    """One official task folder -> a project task folder at ``dst`` (validated)."""
    raw = load_json_file(src / "workflow.json")
    wfs = convert_workflow(raw, str(src / "workflow.json"))
    dst.mkdir(parents=True)
    (dst / "prototypes").mkdir()
    for img in sorted((src / "prototypes").iterdir()) if (src / "prototypes").is_dir() else []:
        if img.suffix.lower() in PROTO_EXTS and img.is_file() and not img.is_symlink():
            shutil.copyfile(img, dst / "prototypes" / img.name)
    (dst / "workflow.json").write_text(json.dumps(wfs, indent=1))
    (dst / "task.json").write_text(json.dumps({"level": level, "category": src.parent.name}))
    for f in ("prompt.txt", "prd.md"):
        if (src / f).is_file():
            shutil.copyfile(src / f, dst / f)
    res = src / "resources"
    if res.is_dir():
        total = sum(p.stat().st_size for p in res.rglob("*") if p.is_file() and not p.is_symlink())
        if total > MAX_RESOURCES_BYTES:
            raise TaskFormatError(f"{res}: {total} bytes of resources (at most {MAX_RESOURCES_BYTES})")
        shutil.copytree(res, dst / "resources", symlinks=False, ignore_dangling_symlinks=True,
                        ignore=lambda d, names: [n for n in names if (Path(d) / n).is_symlink()])
    return load_task(dst)


def load_official(root: Path | str, out: Path | str, max_tasks_per_level: int = 1000) -> list[Task]:
    """Convert every official task under ``root`` into ``out/<level>_<name>`` and load it."""
    out = Path(out)
    tasks, count = [], {}
    for level, src in iter_official(root):
        if count.get(level, 0) >= max_tasks_per_level:
            continue
        count[level] = count.get(level, 0) + 1
        tasks.append(convert_task(src, level, out / f"{level}_{src.name}"))
    return tasks


def convert_official(root: Path, out: Path, max_tasks_per_level: int) -> list[dict]:
    """The prepare stage's index rows for the converted official tasks (seed 0: one fixed sample)."""
    tasks = load_official(root, out, max_tasks_per_level)
    return [{"task": t.root.name, "seed": 0, "level": t.meta.level, "category": t.meta.category,
             "reference_non_pass": 0, "cases": sum(len(w.content) for w in t.workflows)} for t in tasks]
