"""Verify one site against one task folder: GUI verifier (Pass/Fail/Blocked) + visual judge.

    python -m stages.vision2web.verify --task DIR --site DIR --out R.json [--shots DIR]

Writes R.json: {"status": "success"|"failed", "reason", "level", "workflows": [{"summary",
"resolution", "cases": [{"objective", "result", "detail", "counted"}], "prototypes": {name: {"score",
"device", "components": [...]}}}], "VS", "FS", "score"}. A site that does not start is recorded as
status "failed" with the reason (it scores 0). Bad input (missing/malformed workflow.json, bad
start.json, --out a directory or equal to an input) -> one-line error on stderr, exit code 2,
nothing written.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from stages.vision2web.schema import Task, TaskFormatError, device_of, load_start, load_task
from stages.vision2web.scoring import level_scores

# torch, the kernel and playwright are imported lazily: bad input fails fast, before heavy imports


def verify_loaded(task: Task, site: Path, browser, device, rec=None, th=None,
                  shots_dir: Path | None = None, scale: int = 1) -> dict[str, Any]:
    from stages.vision2web.browser import SiteStartError, png_to_array, run_task, serve_site
    from stages.vision2web.judge import Thresholds, judge_batch

    th = th or Thresholds()
    protos = {name: png_to_array(path.read_bytes()) for name, path in task.prototypes.items()}
    try:
        with serve_site(site) as url:
            runs = run_task(task, url, browser)
        status, reason = "success", None
    except SiteStartError as err:
        runs, status, reason = None, "failed", str(err)
    workflows = []
    for i, wf in enumerate(task.workflows):
        run = runs[i] if runs else None
        items, names = [], []
        for name in wf.prototype:
            shot = run["shots"].get(name, {}).get("image") if run else None
            items.append((protos[name], shot, task.components[name]))
            names.append(name)
            if shots_dir is not None and shot is not None:
                from PIL import Image

                Image.fromarray(shot).save(shots_dir / f"{name}.png")
        judged = judge_batch(items, device, th, rec, scale) if run else [{"score": 0.0, "components": []} for _ in items]
        cases = run["cases"] if run else [
            {"objective": c.objective, "result": "Blocked", "detail": reason, "counted": bool(c.validations)}
            for c in wf.content]
        workflows.append({"summary": wf.summary, "resolution": [wf.resolution.width, wf.resolution.height],
                          "cases": cases,
                          "prototypes": {n: {**j, "device": device_of(n)} for n, j in zip(names, judged)}})
    result = {"status": status, "reason": reason, "level": task.meta.level, "workflows": workflows}
    lv = level_scores([result])["levels"].get(task.meta.level, {})
    result.update(VS=lv.get("VS", 0.0), FS=lv.get("FS"), score=lv.get("score", 0.0))
    return result


def _fail(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stages.vision2web.verify", description=__doc__.splitlines()[0])
    ap.add_argument("--task", required=True, type=Path, help="task folder (workflow.json, prototypes/, task.json)")
    ap.add_argument("--site", required=True, type=Path, help="site folder (index.html, or start.json)")
    ap.add_argument("--out", required=True, type=Path, help="result JSON file to write")
    ap.add_argument("--shots", type=Path, help="optional folder for the site's screenshots")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    ap.add_argument("--scale", type=int, default=1, choices=[1, 2, 4], help="judge on s x s area-averaged images")
    args = ap.parse_args(argv)
    out = args.out
    if out.is_dir():
        _fail(f"--out {out}: is a directory")
    for name, path in (("--task", args.task), ("--site", args.site)):
        if not path.is_dir():
            _fail(f"{name} {path}: not a folder")
        if out.resolve() == path.resolve() or path.resolve() in out.resolve().parents:
            _fail(f"--out {out}: must not be inside or equal to {name}")
    if not out.parent.resolve().is_dir():
        _fail(f"--out {out}: parent folder does not exist")
    try:
        task = load_task(args.task)
        load_start(args.site)
    except TaskFormatError as err:
        _fail(str(err))
    if args.shots is not None:
        args.shots.mkdir(parents=True, exist_ok=True)
    from stages.common.device import pick_device

    from stages.vision2web.browser import browser_session

    device = pick_device(args.device)
    try:
        with browser_session() as browser:
            result = verify_loaded(task, args.site, browser, device, shots_dir=args.shots, scale=args.scale)
    except RuntimeError as err:
        _fail(str(err).splitlines()[0])
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=".v2w-", suffix=".json")
    with os.fdopen(fd, "w") as fh:
        json.dump(result, fh, indent=1)
    os.replace(tmp, out)   # atomic: never a half-written R.json
    print(json.dumps({"status": result["status"], "VS": result["VS"], "FS": result["FS"], "score": result["score"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
