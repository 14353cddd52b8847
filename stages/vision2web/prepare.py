"""prepare: generate L1/L2/L3 tasks, their reference sites' prototypes (rendered in Chromium), and
the judge's calibration set (controlled perturbations of reference pages, labelled with the rubric).

``source.kind: toy`` (default) builds tasks procedurally; ``source: {kind: file, dataset: <datasets/>}``
(the `full` profile) converts the official Vision2Web layout (official.py) into the same task folders.
"""
from __future__ import annotations

import asyncio
import json
import math
import tempfile
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from stages.common.config import Seeds, StageConfig, unique_items
from stages.common.sources import SourceConfig
from stages.vision2web.calibrate import PERTURBATIONS, TYPO_JS, css_for, plan
from stages.vision2web.schema import Task, TaskMeta, Workflow, load_task
from stages.vision2web.sitegen import VIEWPORTS, make_spec, prompt_text, render_site, workflows

# generated sites answer on loopback within milliseconds: tighter bounds than the documented defaults
ACTION_MS, VALID_MS = 3000, 2000
LEVEL_DIRS = ("L1", "L2", "L3")


class Calibration(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    tasks: int = Field(4, ge=2, le=20)          # dedicated L1 pages (specs of seed 1000 + k), 3 viewports each
    train_tasks: int = Field(2, ge=1, le=19)    # ... of which the first `train_tasks` form the training split
    viewports: list[Literal["desktop", "tablet", "mobile"]] = Field(
        default_factory=lambda: ["desktop", "tablet", "mobile"], min_length=1, max_length=3)
    perturbations: list[str] | None = Field(None, min_length=1, max_length=20)   # None: every key of targets
    targets: dict[str, float] = Field(default_factory=lambda: {
        "identity": 1.0, "shift_1px": 0.75, "typo": 0.75, "color_slight": 0.75, "shift_4px": 0.5,
        "font_serif": 0.5, "color_large": 0.5, "shift_far": 0.25, "resized": 0.25, "missing": 0.0})

    @field_validator("targets")
    @classmethod
    def _targets(cls, v):
        for k, x in v.items():
            if k not in PERTURBATIONS:
                raise ValueError(f"unknown perturbation {k!r} (known: {', '.join(PERTURBATIONS)})")
            if x not in (0.0, 0.25, 0.5, 0.75, 1.0):
                raise ValueError(f"{k}: expected score {x} is not a rubric step (0, .25, .5, .75, 1)")
        if not v:
            raise ValueError("at least one perturbation")
        return v

    @model_validator(mode="after")
    def _split(self):
        if self.train_tasks >= self.tasks:
            raise ValueError("train_tasks must be smaller than tasks (the rest is the held-out split)")
        for p in self.perturbations or []:
            if p not in self.targets:
                raise ValueError(f"perturbations: {p!r} has no expected score in targets")
        return self


class Config(StageConfig):
    seeds: Seeds = [0, 1, 2, 3, 4]
    tasks_per_level: int = Field(2, ge=1, le=50)
    concurrency: int = Field(4, ge=1, le=16)
    calibration: Calibration = Calibration()
    # toy: the generator; file: the official Vision2Web datasets/ folder (dataset: its path; `full` only)
    source: SourceConfig = SourceConfig()
    official_tasks_per_level: int = Field(1000, ge=1, le=1000)

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


def _meta(spec: dict) -> TaskMeta:
    return TaskMeta(level=spec["level"], category=spec["category"], action_timeout_ms=ACTION_MS,
                    validation_timeout_ms=VALID_MS)


async def build_task(spec: dict, task_dir: Path, browser, deadline_s: float = 300.0) -> dict:
    """Write one task folder; prototypes are the reference site's screenshots at the visual nodes."""
    from stages.vision2web.browser import png_to_array, run_task, serve_site

    task_dir.mkdir(parents=True)
    wfs = workflows(spec)
    (task_dir / "workflow.json").write_text(json.dumps(wfs, indent=1))
    (task_dir / "task.json").write_text(_meta(spec).model_dump_json())
    (task_dir / ("prd.md" if spec["level"] == "L3" else "prompt.txt")).write_text(prompt_text(spec))
    (task_dir / "prototypes").mkdir()
    # the prototypes do not exist yet: build the Task from the validated workflows directly
    task = Task(root=task_dir, meta=_meta(spec), workflows=[Workflow.model_validate(w) for w in wfs],
                prototypes={}, components={})
    with tempfile.TemporaryDirectory(prefix="v2w-ref-") as tmp:
        render_site(spec, Path(tmp) / "site")
        async with serve_site(Path(tmp) / "site") as url:
            runs, info = await run_task(task, url, browser, capture_components=True, deadline_s=deadline_s)
    bad = [c for r in runs for c in r["cases"] if c["result"] != "Pass"]
    for r in runs:
        for name, shot in r["shots"].items():
            if shot["png"] is None:
                raise RuntimeError(f"{task_dir.name}: reference screenshot {name} failed: {shot.get('error')}")
            img = png_to_array(shot["png"])
            (task_dir / "prototypes" / f"{name}.png").write_bytes(shot["png"])
            comps = _components(shot["components"], *img.shape[:2])
            (task_dir / "prototypes" / f"{name}.components.json").write_text(json.dumps(comps))
    load_task(task_dir)   # the written folder must pass the public validator
    return {"reference_non_pass": len(bad), "cases": sum(len(r["cases"]) for r in runs)}


CAL_SEED = 1000   # calibration pages come from their own specs, never from the benchmark's tasks


async def calibration_pages(cal_dir: Path, cfg: Calibration, browser, sem) -> list[dict]:
    """Reference screenshots of ``cfg.tasks`` dedicated L1 pages at every viewport, and every planned
    (page, perturbation, component) rendered; returns the labels (also written to labels.json)."""
    from stages.vision2web.browser import _COMPONENTS_JS, png_to_array, serve_site

    cal_dir.mkdir(parents=True)
    (cal_dir / "ref").mkdir()
    perts = list(cfg.perturbations or cfg.targets)
    names = [f"cal{k}" for k in range(cfg.tasks)]
    train = set(names[: cfg.train_tasks])
    todo = plan([f"{n}|{dev}" for n in names for dev in cfg.viewports], perts)
    labels: list[dict] = []

    async def one_task(k: int, name: str):
        spec = make_spec("L1", CAL_SEED + k, 0)
        async with sem:
            with tempfile.TemporaryDirectory(prefix="v2w-cal-") as tmp:
                render_site(spec, Path(tmp) / "site")
                async with serve_site(Path(tmp) / "site") as url:
                    ctx = await asyncio.wait_for(browser.new_context(device_scale_factor=1, reduced_motion="reduce"), 30)
                    try:
                        page = await ctx.new_page()
                        for dev in cfg.viewports:
                            w, h = VIEWPORTS[dev]
                            await asyncio.wait_for(page.set_viewport_size({"width": w, "height": h}), 30)
                            await asyncio.wait_for(page.goto(url + "/"), 30)
                            ref = await asyncio.wait_for(page.screenshot(full_page=True, caret="hide"), 30)
                            img = png_to_array(ref)
                            comps = _components(await asyncio.wait_for(page.evaluate(_COMPONENTS_JS), 30), *img.shape[:2])
                            (cal_dir / "ref" / f"{name}_{dev}.png").write_bytes(ref)
                            (cal_dir / "ref" / f"{name}_{dev}.components.json").write_text(json.dumps(comps))
                            for pg, pert, comp in todo:
                                if pg != f"{name}|{dev}":
                                    continue
                                await asyncio.wait_for(page.goto(url + "/"), 30)
                                css = css_for(pert, comp)
                                if css:
                                    await asyncio.wait_for(page.add_style_tag(content=css), 30)
                                if PERTURBATIONS[pert][1] == "typo":
                                    if not await asyncio.wait_for(page.evaluate(TYPO_JS, f'[data-v2w="{comp}"]'), 30):
                                        continue
                                fname = f"{name}_{dev}_{pert}_{comp}.png"
                                data = await asyncio.wait_for(page.screenshot(
                                    full_page=True, clip={"x": 0, "y": 0, "width": w, "height": img.shape[0]},
                                    caret="hide"), 30)
                                (cal_dir / fname).write_bytes(data)
                                labels.append({"file": fname, "page": f"{name}_{dev}", "viewport": dev,
                                               "perturbation": pert, "component": comp, "expected": cfg.targets[pert],
                                               "split": "train" if name in train else "test"})
                    finally:
                        await asyncio.wait_for(ctx.close(), 30)

    await asyncio.gather(*(one_task(k, n) for k, n in enumerate(names)))
    labels.sort(key=lambda r: r["file"])
    (cal_dir / "labels.json").write_text(json.dumps(labels, indent=1))
    return labels


def run(cfg: Config, ctx) -> None:
    if cfg.source.kind != "toy":
        from stages.vision2web.official import convert_official

        if cfg.source.kind != "file" or not cfg.source.dataset:
            raise ValueError("source: vision2web reads the official tasks as kind file with dataset: <datasets/ folder>")
        index = convert_official(Path(cfg.source.dataset), ctx.out / "tasks", cfg.official_tasks_per_level)
        (ctx.out / "specs").mkdir()
        (ctx.out / "index.json").write_text(json.dumps(index, indent=1))
        return
    asyncio.run(_run_generator(cfg, ctx))


async def _run_generator(cfg: Config, ctx) -> None:
    from stages.vision2web.browser import browser_session

    tasks_root, specs_root = ctx.out / "tasks", ctx.out / "specs"
    specs_root.mkdir(parents=True)
    jobs = []
    for seed in cfg.seeds:
        for level in LEVEL_DIRS:
            for i in range(cfg.tasks_per_level):
                jobs.append((f"s{seed}_{level}_{i}", seed, level, make_spec(level, seed, i)))
    sem = asyncio.Semaphore(cfg.concurrency)
    async with browser_session() as browser:
        async def one(name, seed, level, spec):
            async with sem:
                info = await build_task(spec, tasks_root / name, browser)
            (specs_root / f"{name}.json").write_text(json.dumps(spec, indent=1))
            return {"task": name, "seed": seed, "level": level, "category": spec["category"], **info}

        index, _ = await asyncio.gather(asyncio.gather(*(one(*j) for j in jobs)),
                                        calibration_pages(ctx.out / "calibration", cfg.calibration, browser, sem))
    bad = [r for r in index if r["reference_non_pass"]]
    if bad:
        raise RuntimeError(f"reference site of {bad[0]['task']} fails {bad[0]['reference_non_pass']} of its own cases")
    (ctx.out / "index.json").write_text(json.dumps(list(index), indent=1))
