"""Verify one site against one task folder: GUI verifier (Pass/Fail/Blocked) + visual judge.

    python -m stages.vision2web.verify --task DIR --site DIR --out R.json [--shots DIR] [--deadline-s S]

Writes R.json: {"status": "success"|"failed", "reason", "level", "workflows": [{"summary",
"resolution", "cases": [{"objective", "result", "detail", "counted"}], "prototypes": {name: {"score",
"device", "components": [...]}}}], "VS", "FS", "score", "sandbox": {"blocked_requests", "stuck",
"deadline_hit"}}. A site that does not start is recorded as status "failed" with the reason (it
scores 0). Bad input (missing/malformed workflow.json, an unreadable prototype image, bad
start.json, --out a directory or inside/equal to an input) -> one-line error on stderr, exit code 2,
nothing written. R.json is written atomically with the usual file mode (0666 minus the umask).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from stages.vision2web.schema import Task, TaskFormatError, check_image, device_of, load_start, load_task
from stages.vision2web.scoring import level_scores

# torch, the kernel and playwright are imported lazily: bad input fails fast, before heavy imports


async def browse(task: Task, site: Path, browser, *, shots: bool = True, deadline_s: float = 300.0,
                 capture_components: bool = False, jail: bool | None = None, context=None) -> dict[str, Any]:
    """Serve the site and run the task's workflows in the browser: {status, reason, runs, info}."""
    from stages.vision2web.browser import SiteStartError, Stuck, run_task, serve_site

    clip = {name: check_image(path)[1] for name, path in task.prototypes.items()}
    info = {"blocked_requests": 0, "stuck": 0, "deadline_hit": False, "context_ok": True}
    try:
        async with serve_site(site, jail) as url:
            runs, info = await run_task(task, url, browser, shots=shots, clip_heights=clip,
                                        capture_components=capture_components, deadline_s=deadline_s,
                                        context=context)
        return {"status": "success", "reason": None, "runs": runs, "info": info}
    except SiteStartError as err:
        return {"status": "failed", "reason": str(err), "runs": None, "info": info}
    except Stuck as err:   # could not even open a browser context within the deadline
        return {"status": "failed", "reason": str(err), "runs": None, "info": {**info, "stuck": 1}}


def judge_raw(task: Task, raw: dict[str, Any], device, mapping, rec=None,
              shots_dir: Path | None = None, visual: bool = True, cache=None) -> dict[str, Any]:
    """R.json from a browse() result: judge every prototype (one batch), aggregate like the paper.
    ``cache`` (judge.ProtoCache): reuse decoded/pooled prototypes across agents of one task."""
    from stages.vision2web.browser import png_to_array
    from stages.vision2web.judge import judge_batch

    runs = raw["runs"]
    items, where, keys = [], [], []
    if cache is None:
        from stages.vision2web.judge import ProtoCache

        cache = ProtoCache(0)
    for i, wf in enumerate(task.workflows):
        for name in wf.prototype:
            shot = None
            png = runs[i]["shots"].get(name, {}).get("png") if runs else None
            if png is not None:
                try:
                    shot = png_to_array(png)
                except Exception:  # noqa: BLE001 - an undecodable screenshot is a missing one
                    shot = None
                if shots_dir is not None and shot is not None:
                    (shots_dir / f"{name}.png").write_bytes(png)
            key = (str(task.root), name)
            proto = cache.get(("png",) + key, lambda n=name: png_to_array(task.prototypes[n].read_bytes()))
            items.append((proto, shot, task.components[name]))
            where.append((i, name))
            keys.append(key)
    judged = judge_batch(items, device, mapping, rec, keys, cache) if (visual and runs) else [
        {"score": 0.0, "components": []} for _ in items]
    per_wf: list[dict[str, Any]] = [{} for _ in task.workflows]
    for (i, name), j in zip(where, judged):
        per_wf[i][name] = {**j, "device": device_of(name)}
    workflows = []
    for i, wf in enumerate(task.workflows):
        cases = runs[i]["cases"] if runs else [
            {"objective": c.objective, "result": "Blocked", "detail": raw["reason"], "counted": bool(c.validations)}
            for c in wf.content]
        workflows.append({"summary": wf.summary, "resolution": [wf.resolution.width, wf.resolution.height],
                          "cases": cases, "prototypes": per_wf[i] if visual else {}})
    result = {"status": raw["status"], "reason": raw["reason"], "level": task.meta.level, "visual": visual,
              "workflows": workflows, "sandbox": raw["info"]}
    lv = level_scores([result])["levels"].get(task.meta.level, {})
    result.update(VS=lv.get("VS", 0.0) if visual else None, FS=lv.get("FS"), score=lv.get("score", 0.0) if visual else None)
    return result


def _fail(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def default_mapping():
    """The calibrated judge mapping of params.yaml (papers.vision2web.evaluate.judge, default profile)."""
    from stages.common.config import ConfigError
    from stages.common.runner import load_config
    from stages.vision2web.judge import Mapping

    try:
        _, cfg, _ = load_config("vision2web", "evaluate", "default")
    except ConfigError as err:
        _fail(f"params.yaml: {str(err).splitlines()[0]}")
    return Mapping(tuple(cfg.judge.weights), cfg.judge.fine, cfg.judge.coarse)


def write_json_atomic(out: Path, obj: Any) -> None:
    """Temp file + rename (never a half-written file), with the mode a plain open() would give."""
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=".v2w-", suffix=".json")
    with os.fdopen(fd, "w") as fh:
        json.dump(obj, fh, indent=1)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stages.vision2web.verify", description=__doc__.splitlines()[0])
    ap.add_argument("--task", required=True, type=Path, help="task folder (workflow.json, prototypes/, task.json)")
    ap.add_argument("--site", required=True, type=Path, help="site folder (index.html, or start.json)")
    ap.add_argument("--out", required=True, type=Path, help="result JSON file to write")
    ap.add_argument("--shots", type=Path, help="optional folder for the site's screenshots")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    ap.add_argument("--deadline-s", type=float, default=300.0, help="whole-task deadline in seconds (1-3600)")
    args = ap.parse_args(argv)
    out = args.out
    if not 1 <= args.deadline_s <= 3600:
        _fail(f"--deadline-s {args.deadline_s:g}: must lie in [1, 3600]")
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
    mapping = default_mapping()
    if args.shots is not None:
        args.shots.mkdir(parents=True, exist_ok=True)
    from stages.common.device import pick_device

    from stages.vision2web.browser import browser_session

    device = pick_device(args.device)

    async def go():
        async with browser_session() as browser:
            return await browse(task, args.site, browser, deadline_s=args.deadline_s)

    try:
        raw = asyncio.run(go())
    except RuntimeError as err:
        _fail(str(err).splitlines()[0])
    result = judge_raw(task, raw, device, mapping, shots_dir=args.shots)
    write_json_atomic(out, result)
    print(json.dumps({"status": result["status"], "VS": result["VS"], "FS": result["FS"], "score": result["score"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
