"""prepare: generate L1/L2/L3 tasks, their reference sites, and prototypes rendered in Chromium."""
from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

from PIL import Image
from pydantic import Field, field_validator

from stages.common.config import Seeds, StageConfig, unique_items
from stages.vision2web.browser import browser_session, run_task, serve_site
from stages.vision2web.schema import Task, TaskMeta, Workflow, load_task
from stages.vision2web.sitegen import make_spec, prompt_text, render_site, workflows


# generated sites answer on loopback within milliseconds: tighter bounds than the documented defaults
ACTION_MS, VALID_MS = 800, 800


class Config(StageConfig):
    seeds: Seeds = [0, 1, 2]
    tasks_l1: int = Field(1, ge=1, le=50)
    tasks_l2: int = Field(1, ge=1, le=50)
    tasks_l3: int = Field(1, ge=1, le=30)

    @field_validator("seeds")
    @classmethod
    def _distinct(cls, v):
        return unique_items(v, "seeds")


def _components(raw: list[dict], h: int, w: int) -> list[dict]:
    out = []
    for c in raw:
        x0, y0 = max(0, math.floor(c["x"])), max(0, math.floor(c["y"]))
        x1, y1 = min(w, math.ceil(c["x"] + c["w"])), min(h, math.ceil(c["y"] + c["h"]))
        if c["vis"] and x1 > x0 and y1 > y0:
            out.append({"name": c["name"], "bbox": [x0, y0, x1 - x0, y1 - y0]})
    return out


def build_task(spec: dict, task_dir: Path, browser) -> dict:
    """Write one task folder; prototypes are the reference site's screenshots at the visual nodes."""
    task_dir.mkdir(parents=True)
    (task_dir / "workflow.json").write_text(json.dumps(workflows(spec), indent=1))
    (task_dir / "task.json").write_text(json.dumps({"level": spec["level"], "category": spec["category"],
                                                    "action_timeout_ms": ACTION_MS, "validation_timeout_ms": VALID_MS}))
    (task_dir / ("prd.md" if spec["level"] == "L3" else "prompt.txt")).write_text(prompt_text(spec))
    (task_dir / "prototypes").mkdir()
    # the prototypes do not exist yet: build the Task from the validated workflows directly
    task = Task(root=task_dir, meta=TaskMeta(level=spec["level"], category=spec["category"],
                                             action_timeout_ms=ACTION_MS, validation_timeout_ms=VALID_MS),
                workflows=[Workflow.model_validate(w) for w in workflows(spec)], prototypes={}, components={})
    with tempfile.TemporaryDirectory(prefix="v2w-ref-") as tmp:
        render_site(spec, Path(tmp) / "site")
        with serve_site(Path(tmp) / "site") as url:
            runs = run_task(task, url, browser, capture_components=True)
    bad = [c for r in runs for c in r["cases"] if c["result"] != "Pass"]
    for r in runs:
        for name, shot in r["shots"].items():
            img = shot["image"]
            if img is None:
                raise RuntimeError(f"{task_dir.name}: reference screenshot {name} failed: {shot.get('error')}")
            Image.fromarray(img).save(task_dir / "prototypes" / f"{name}.png")
            comps = _components(shot["components"], *img.shape[:2])
            (task_dir / "prototypes" / f"{name}.components.json").write_text(json.dumps(comps))
    load_task(task_dir)   # the written folder must pass the public validator
    return {"reference_non_pass": len(bad), "cases": sum(len(r["cases"]) for r in runs)}


def run(cfg: Config, ctx) -> None:
    tasks_root, specs_root = ctx.out / "tasks", ctx.out / "specs"
    specs_root.mkdir(parents=True)
    index = []
    with browser_session() as browser:
        for seed in cfg.seeds:
            for level, n in (("L1", cfg.tasks_l1), ("L2", cfg.tasks_l2), ("L3", cfg.tasks_l3)):
                for i in range(n):
                    spec = make_spec(level, seed, i)
                    name = f"s{seed}_{level}_{i}"
                    info = build_task(spec, tasks_root / name, browser)
                    (specs_root / f"{name}.json").write_text(json.dumps(spec, indent=1))
                    index.append({"task": name, "seed": seed, "level": level, "category": spec["category"], **info})
    (ctx.out / "index.json").write_text(json.dumps(index, indent=1))
