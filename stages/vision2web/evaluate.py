"""evaluate: verify every site in Chromium (concurrently, every call bounded), judge prototypes through
the kernel, aggregate like the paper per task, measure the verifier on one-bug sites, calibrate the judge.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kernels.record import KernelRecord
from kernels.segmented_compare import segmented_compare
from stages.common.config import StageConfig
from stages.common.device import DeviceName, pick_device
from stages.vision2web.judge import FEATURES, Mapping, component_map, fit, quantize, raw_score
from stages.vision2web.schema import DEVICES, TaskFormatError, device_of, load_start, load_task
from stages.vision2web.scoring import level_scores
from stages.vision2web.sitegen import BUG_AFFECTS, bug_viewports


class JudgeCfg(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    weights: list[float] = Field(min_length=1 + len(FEATURES), max_length=1 + len(FEATURES))  # calibrate.py
    fine: int = Field(2, ge=1, le=8)
    coarse: int = Field(8, ge=2, le=32)

    @field_validator("weights")
    @classmethod
    def _finite(cls, v):
        if any(not np.isfinite(x) or abs(x) > 1e3 for x in v):
            raise ValueError("weights must be finite numbers of magnitude <= 1000")
        return v

    @model_validator(mode="after")
    def _scales(self):
        if self.coarse < self.fine or self.coarse % self.fine:
            raise ValueError("coarse must be a multiple of fine")
        return self


class Config(StageConfig):
    device: DeviceName = "auto"
    concurrency: int = Field(4, ge=1, le=16)          # tasks in flight in one Chromium (waits overlap)
    task_deadline_s: float = Field(120.0, ge=5, le=3600)
    judge: JudgeCfg = JudgeCfg(weights=[1.0, 0.0, -0.5, -0.5, 0.0, 0.0, 0.0])
    shots_tasks: int = Field(1, ge=0, le=10)          # tasks per level (first seed) whose screenshots are kept


def detection(manifest_row: dict, result: dict) -> dict[str, Any]:
    """One-bug site: caught (a case the bug can break is not Pass, or the site failed to start) and the
    non-Pass counted cases outside the bug's cases (false alarms)."""
    bug = manifest_row["bugs"][0]
    affects = BUG_AFFECTS[manifest_row["level"]][bug]
    failed = result["status"] != "success"
    caught, outside, outside_bad = failed, 0, 0
    for wf in result["workflows"]:
        for i, c in enumerate(wf["cases"]):
            inside = affects == "all" or i in affects
            if inside and c["result"] != "Pass":
                caught = True
            if not inside and c["counted"]:
                outside += 1
                outside_bad += int(failed or c["result"] != "Pass")
    return {"bug": bug, "caught": bool(caught), "outside": outside, "outside_bad": outside_bad}


def per_task(result: dict) -> dict[str, float | None]:
    """A task's own scores (x100): level score, VS, FS and the VS of each device's prototypes."""
    lv = level_scores([result])
    L = lv["levels"][result["level"]]
    out: dict[str, float | None] = {"score": 100 * L["score"], "VS": 100 * L["VS"],
                                    "FS": None if L["FS"] is None else 100 * L["FS"]}
    for d in DEVICES:
        out[d] = None if lv["devices"][d] is None else 100 * lv["devices"][d]
    return out


async def _verify_all(jobs, cfg: Config, device, mapping: Mapping, rec, tasks, protos, out_dir: Path):
    from stages.vision2web.browser import browser_session
    from stages.vision2web.verify import browse, judge_raw

    sem = asyncio.Semaphore(cfg.concurrency)
    judge_lock = threading.Lock()   # one judge at a time (the kernel record is not thread-safe)
    results: dict[int, dict] = {}
    from stages.vision2web.judge import ProtoCache

    cache = ProtoCache(80)         # jobs are ordered by task: each prototype is decoded and pooled once

    def judge(task, raw, shots_dir, visual, name):
        with judge_lock:
            return judge_raw(task, raw, device, mapping, rec, shots_dir, visual, cache)

    from stages.vision2web.browser import new_pooled_context

    async with browser_session() as browser:
        pool: asyncio.Queue = asyncio.Queue()
        for _ in range(cfg.concurrency):
            pool.put_nowait(None)   # contexts are created lazily, one per concurrent slot

        async def one(k: int, m: dict, site: Path, visual: bool, shots_dir: Path | None):
            task = tasks[m["task"]]
            context = await pool.get()
            raw = None
            try:
                if context is None:
                    context = await new_pooled_context(browser)
                load_start(site)
                raw = await browse(task, site, browser, shots=visual, deadline_s=cfg.task_deadline_s, context=context)
            except TaskFormatError as err:   # the agent wrote no usable site: it fails to start
                raw = {"status": "failed", "reason": str(err), "runs": None,
                       "info": {"blocked_requests": 0, "stuck": 0, "deadline_hit": False, "context_ok": True}}
            finally:
                if context is not None and not (raw is not None and raw["info"].get("context_ok", True)):
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(context.close(), 10)
                    context = None
                pool.put_nowait(context)
            results[k] = await asyncio.to_thread(judge, task, raw, shots_dir, visual, m["task"])

        coros = []
        for k, (m, site, visual, shots_dir) in enumerate(jobs):
            coros.append(one(k, m, site, visual, shots_dir))
        await asyncio.gather(*coros)
    return [results[k] for k in range(len(jobs))]


def run(cfg: Config, ctx) -> None:
    from stages.vision2web.browser import png_to_array
    from stages.vision2web.calibrate import errors, fit_from_samples, load_features

    device = pick_device(cfg.device)
    rec = KernelRecord(device)
    mapping = Mapping(tuple(cfg.judge.weights), cfg.judge.fine, cfg.judge.coarse)
    prep, train = ctx.input("prepare"), ctx.input("train")
    manifest = json.loads((train / "manifest.json").read_text())
    index = json.loads((prep / "index.json").read_text())
    seeds = sorted({t["seed"] for t in index})
    tasks = {t["task"]: load_task(prep / "tasks" / t["task"]) for t in index}
    protos = {}
    jobs = []
    for m in sorted(manifest, key=lambda m: (m["task"], m["agent"], m.get("site", ""))):
        bug_site = m["agent"] == "bugs"
        site = train / "sites" / m["agent"] / (m["site"] if bug_site else m["task"])
        visual = not (bug_site and m.get("family") == "functional")
        shots = None
        if (not bug_site and m["seed"] == seeds[0] and int(m["task"].rsplit("_", 1)[1]) < cfg.shots_tasks):
            shots = ctx.out / "shots" / m["agent"] / m["task"]
            shots.mkdir(parents=True)
        jobs.append((m, site, visual, shots))
    results = asyncio.run(_verify_all(jobs, cfg, device, mapping, rec, tasks, protos, ctx.out))
    for (m, _, _, _), r in zip(jobs, results):
        out = ctx.out / "results" / m["agent"]
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{m.get('site', m['task'])}.json").write_text(json.dumps(r, indent=1))
    pairs = list(zip([j[0] for j in jobs], results))

    # ---- agents: per seed, per task (tasks are the unit of replication)
    agents = list(dict.fromkeys(m["agent"] for m, _ in pairs if m["agent"] != "bugs"))
    metrics: dict[str, Any] = {"seeds": seeds, "agents": {}, "tasks_per_level": {}}
    for L in ("L1", "L2", "L3"):
        metrics["tasks_per_level"][L] = sum(1 for t in index if t["level"] == L)
    for a in agents:
        rows = [(m, r) for m, r in pairs if m["agent"] == a]
        per_seed = [level_scores([r for m, r in rows if m["seed"] == s]) for s in seeds]
        pooled = level_scores([r for _, r in rows])
        items: dict[str, list[list[float]]] = {k: [] for k in ("L1", "L2", "L3", "all", *DEVICES)}
        for s in seeds:
            pts = [(m, per_task(r)) for m, r in rows if m["seed"] == s]
            for L in ("L1", "L2", "L3"):
                items[L].append([p["score"] for m, p in pts if m["level"] == L])
            items["all"].append([p["score"] for _, p in pts])
            for d in DEVICES:
                items[d].append([p[d] for _, p in pts if p[d] is not None])
        metrics["agents"][a] = {
            "overall": [p["overall"] for p in per_seed],
            **{L: [100 * (p["levels"].get(L, {}).get("score") or 0.0) for p in per_seed] for L in ("L1", "L2", "L3")},
            **{f"{L}_VS": [100 * (p["levels"].get(L, {}).get("VS") or 0.0) for p in per_seed] for L in ("L1", "L2", "L3")},
            **{f"{L}_FS": [100 * (p["levels"].get(L, {}).get("FS") or 0.0) for p in per_seed] for L in ("L2", "L3")},
            **{d: [100 * (p["devices"][d] or 0.0) for p in per_seed] for d in DEVICES},
            "items": items,
            "pooled": {"overall": pooled["overall"], **{L: 100 * v["score"] for L, v in pooled["levels"].items()},
                       **{f"{L}_VS": 100 * v["VS"] for L, v in pooled["levels"].items()},
                       **{f"{L}_FS": 100 * v["FS"] for L, v in pooled["levels"].items() if v["FS"] is not None},
                       **{d: 100 * (pooled["devices"][d] or 0.0) for d in DEVICES}},
            "start_failures": sum(r["status"] != "success" for _, r in rows),
            "agent_errors": sum(1 for m, _ in rows if m.get("error")),
            "blocked_requests": sum(r["sandbox"]["blocked_requests"] for _, r in rows),
        }
        # the per-task means equal the paper's pooled (micro) scores: every task of a level has the same
        # number of prototypes and counted cases (a property of the generator, checked here)
        for L in ("L1", "L2", "L3"):
            flat = [x for s in items[L] for x in s]
            if flat and abs(np.mean(flat) - metrics["agents"][a]["pooled"].get(L, 0.0)) > 1e-6:
                metrics["agents"][a].setdefault("pooled_ne_task_mean", []).append(L)

    # ---- verifier: one bug per site (no masking)
    func = [(m, detection(m, r)) for m, r in pairs if m["agent"] == "bugs" and m["family"] == "functional"]
    fseeds = sorted({m["seed"] for m, _ in func})
    per_bug: dict[str, dict[str, int]] = defaultdict(lambda: {"sites": 0, "caught": 0, "outside": 0, "outside_bad": 0})
    for m, d in func:
        b = per_bug[d["bug"]]
        b["sites"] += 1
        b["caught"] += int(d["caught"])
        b["outside"] += d["outside"]
        b["outside_bad"] += d["outside_bad"]
    orc = [(m, r) for m, r in pairs if m["agent"] == "oracle"]
    metrics["verifier"] = {
        "seeds": fseeds,
        "recall_items": [[float(d["caught"]) for m, d in func if m["seed"] == s] for s in fseeds],
        "bugsite_false_alarm_items": [[d["outside_bad"] / max(1, d["outside"]) for m, d in func if m["seed"] == s]
                                      for s in fseeds],
        "oracle_false_alarm_items": [[sum(c["result"] != "Pass" or r["status"] != "success" for wf in r["workflows"]
                                          for c in wf["cases"] if c["counted"]) / max(1, sum(
                                              c["counted"] for wf in r["workflows"] for c in wf["cases"]))
                                      for m, r in orc if m["seed"] == s and m["level"] != "L1"] for s in seeds],
        "per_bug": dict(sorted(per_bug.items())),
        "n_sites": len(func),
    }
    v = metrics["verifier"]
    v["recall"] = [float(np.mean(x)) if x else 1.0 for x in v["recall_items"]]
    v["outside_misses_caught"] = {b: per_bug[b]["caught"] / per_bug[b]["sites"] for b in
                                  ("remove_wrong_item", "remove_first_row", "total_truncates_cents", "delete_wrong_item",
                                   "delete_oldest") if b in per_bug}
    v["outside_misses_min"] = min(v["outside_misses_caught"].values()) if v["outside_misses_caught"] else 0.0

    # ---- visual bugs: the judge's detection at every viewport (equal exposure)
    oracle_dev = {m["task"]: per_task(r) for m, r in orc}
    vis = defaultdict(lambda: {"sites": 0, "detected": 0})
    vis_rows = []
    for m, r in pairs:
        if m["agent"] != "bugs" or m["family"] != "visual":
            continue
        bug = m["bugs"][0]
        pt = per_task(r)
        for dev in DEVICES:
            exposed = dev in bug_viewports(bug)
            drop = (oracle_dev[m["task"]][dev] or 0.0) - (pt[dev] or 0.0)
            vis_rows.append({"task": m["task"], "level": m["level"], "bug": bug, "viewport": dev, "exposed": exposed,
                             "drop": drop})
            if exposed:
                vis[dev]["sites"] += 1
                vis[dev]["detected"] += int(drop > 0)
    metrics["visual_bugs"] = {"rows": vis_rows,
                              "detection": {d: vis[d]["detected"] / max(1, vis[d]["sites"]) for d in DEVICES},
                              "exposure": {d: vis[d]["sites"] for d in DEVICES},
                              "unexposed_drop_max": max([r["drop"] for r in vis_rows if not r["exposed"]], default=0.0)}
    # min over the viewports that some bug touches (a viewport no bug touches has nothing to detect)
    metrics["visual_bugs"]["detection_min"] = min((vis[d]["detected"] / vis[d]["sites"] for d in DEVICES
                                                   if vis[d]["sites"]), default=0.0)

    # ---- judge calibration: params' mapping on both splits; a refit on the training split
    samples = load_features(prep, device, mapping, rec)
    refit = fit_from_samples(samples)
    cal: dict[str, Any] = {"weights": list(mapping.weights), "refit": [float(x) for x in refit],
                           "weights_drift": float(np.max(np.abs(refit - np.asarray(mapping.weights)))),
                           "features": list(FEATURES)}
    for split in ("train", "test"):
        S = [s for s in samples if s["split"] == split]
        y = np.array([s["expected"] for s in S])
        pred = quantize(raw_score(np.array([s["features"] for s in S]), mapping))
        cal[split] = errors(pred, y)
        if split == "test":
            cal["per_perturbation"] = {}
            for p in dict.fromkeys(s["perturbation"] for s in S):
                idx = [i for i, s in enumerate(S) if s["perturbation"] == p]
                cal["per_perturbation"][p] = {"expected": float(y[idx[0]]), "mean_score": float(pred[idx].mean()),
                                              **errors(pred[idx], y[idx])}
    metrics["calibration"] = cal
    metrics["sandbox"] = {"blocked_requests": sum(r["sandbox"]["blocked_requests"] for _, r in pairs),
                          "stuck": sum(r["sandbox"]["stuck"] for _, r in pairs),
                          "deadline_hit": sum(bool(r["sandbox"]["deadline_hit"]) for _, r in pairs)}

    # parity of the Triton path on a slice of real inputs: the first task's first prototype vs its mirror
    t0 = tasks[index[0]["task"]]
    name0 = next(iter(t0.prototypes))
    proto = png_to_array(t0.prototypes[name0].read_bytes())[:96].copy()
    seg, names = component_map(*proto.shape[:2], t0.components[name0])
    act = fit(proto[:, ::-1].copy(), *proto.shape[:2])
    rec.parity("segmented_compare", segmented_compare, torch.from_numpy(proto[None]).to(device),
               torch.from_numpy(act[None]).to(device), torch.from_numpy(seg[None]).to(device), max(1, len(names)),
               slice=f"top 96 rows of prototype {name0} vs its mirror image, {len(names)} components")
    rec.save(ctx.out)
    (ctx.out / "evaluation.json").write_text(json.dumps(metrics, indent=1))
