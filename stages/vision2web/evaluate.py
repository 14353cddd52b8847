"""evaluate: start every agent site, run the GUI verifier in Chromium, judge prototypes (kernel), aggregate."""
from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import torch
from pydantic import Field, model_validator

from kernels.record import KernelRecord
from kernels.segmented_compare import segmented_compare
from stages.common.config import StageConfig
from stages.common.device import DeviceName, pick_device
from stages.vision2web.browser import browser_session, png_to_array
from stages.vision2web.judge import Thresholds, component_map, fit
from stages.vision2web.schema import load_task
from stages.vision2web.scoring import level_scores
from stages.vision2web.sitegen import BUG_AFFECTS
from stages.vision2web.verify import verify_loaded

Ladder = list[float]


class Config(StageConfig):
    device: DeviceName = "auto"
    mad_thresholds: Ladder = Field(default_factory=lambda: [0.005, 0.03, 0.08, 0.20], min_length=4, max_length=4)
    ssim_thresholds: Ladder = Field(default_factory=lambda: [0.98, 0.90, 0.60, 0.25], min_length=4, max_length=4)
    shots_seed_tasks: int = Field(1, ge=0, le=10)   # tasks per level (first seed) whose screenshots are kept
    judge_scale: int = Field(2, ge=1, le=4)         # s x s area-averaged judging (1 = full resolution)

    @model_validator(mode="after")
    def _ladders(self):
        for key, lad, inc in (("mad_thresholds", self.mad_thresholds, True), ("ssim_thresholds", self.ssim_thresholds, False)):
            if any(not 0 <= x <= 1 for x in lad):
                raise ValueError(f"{key}: values must lie in [0, 1]")
            if lad != sorted(lad, reverse=not inc):
                raise ValueError(f"{key}: must be {'non-decreasing' if inc else 'non-increasing'} from score 1 to .25")
        return self


def detection(manifest_row: dict, result: dict) -> tuple[list[bool], int, int]:
    """Per injected functional bug: caught? plus (non-Pass counted cases, of which attributable)."""
    affects = BUG_AFFECTS.get(manifest_row["level"], {})
    injected = [b for b in manifest_row["bugs"] if b in affects]
    failed = result["status"] != "success"
    caught = []
    for b in injected:
        idx = affects[b]
        caught.append(failed if idx == "all" else any(
            wf["cases"][i]["result"] != "Pass" for wf in result["workflows"] for i in idx if i < len(wf["cases"])))
    union = {i for b in injected if affects[b] != "all" for i in affects[b]}
    bad = attributed = 0
    for wf in result["workflows"]:
        for i, c in enumerate(wf["cases"]):
            if c["counted"] and (failed or c["result"] != "Pass"):
                bad += 1
                attributed += int((failed and "start_broken" in injected) or i in union)
    return caught, bad, attributed


def run(cfg: Config, ctx) -> None:
    device = pick_device(cfg.device)
    rec = KernelRecord(device)
    th = Thresholds(tuple(cfg.mad_thresholds), tuple(cfg.ssim_thresholds))
    prep, train = ctx.input("prepare"), ctx.input("train")
    manifest = json.loads((train / "manifest.json").read_text())
    seeds = sorted({m["seed"] for m in manifest})
    keep = defaultdict(int)
    results = []
    with browser_session() as browser:
        for m in manifest:
            task = load_task(prep / "tasks" / m["task"])
            shots = None
            if m["seed"] == seeds[0] and int(m["task"].rsplit("_", 1)[1]) < cfg.shots_seed_tasks:
                shots = ctx.out / "shots" / m["agent"] / m["task"]
                shots.mkdir(parents=True)
            r = verify_loaded(task, train / "sites" / m["agent"] / m["task"], browser, device, rec, th, shots,
                              cfg.judge_scale)
            results.append((m, r))
            out = ctx.out / "results" / m["agent"]
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{m['task']}.json").write_text(json.dumps(r, indent=1))
    # parity of the Triton path on a slice of real inputs: the first task's first prototype vs its oracle shot
    m0 = manifest[0]
    task0 = load_task(prep / "tasks" / m0["task"])
    name0 = next(iter(task0.prototypes))
    proto = png_to_array(task0.prototypes[name0].read_bytes())[:96].copy()
    seg, names = component_map(*proto.shape[:2], task0.components[name0])
    act = fit(proto[:, ::-1].copy(), *proto.shape[:2])
    rec.parity("segmented_compare", segmented_compare, torch.from_numpy(proto[None]).to(device),
               torch.from_numpy(act[None]).to(device), torch.from_numpy(seg[None]).to(device), max(1, len(names)),
               slice=f"top 96 rows of prototype {name0} vs its mirror image, {len(names)} components")
    rec.save(ctx.out)

    agents = list(dict.fromkeys(m["agent"] for m, _ in results))
    metrics: dict = {"seeds": seeds, "agents": {}, "verifier": {}}
    for a in agents:
        per_seed = [level_scores([r for m, r in results if m["agent"] == a and m["seed"] == s]) for s in seeds]
        pooled = level_scores([r for m, r in results if m["agent"] == a])
        lv = lambda key, L: [p["levels"].get(L, {}).get(key) or 0.0 for p in per_seed]  # noqa: E731
        metrics["agents"][a] = {
            "overall": [p["overall"] for p in per_seed],
            **{L: [100 * x for x in lv("score", L)] for L in ("L1", "L2", "L3")},
            **{f"{L}_VS": [100 * x for x in lv("VS", L)] for L in ("L1", "L2", "L3")},
            **{f"{L}_FS": [100 * x for x in lv("FS", L)] for L in ("L2", "L3")},
            **{d: [100 * (p["devices"][d] or 0.0) for p in per_seed] for d in ("desktop", "tablet", "mobile")},
            "pooled": pooled,
            "start_failures": sum(r["status"] != "success" for m, r in results if m["agent"] == a),
        }
    # imperfect agents = every non-oracle agent, averaged per seed
    imperfect = [a for a in agents if a != "oracle"]
    metrics["imperfect"] = {k: [float(np.mean([metrics["agents"][a][k][i] for a in imperfect])) for i in range(len(seeds))]
                            for k in ("L1", "L2", "L3", "desktop", "tablet", "mobile", "overall")} if imperfect else {}
    # verifier reliability on injected functional bugs
    recall, precision, false_alarm = [], [], []
    bug_rows = []
    for s in seeds:
        caught_all, bad_all, attr_all = [], 0, 0
        for m, r in results:
            if m["seed"] != s or m["kind"] != "buggy":
                continue
            caught, bad, attr = detection(m, r)
            caught_all += caught
            bad_all += bad
            attr_all += attr
            affects = BUG_AFFECTS.get(m["level"], {})
            bug_rows += [{"seed": s, "agent": m["agent"], "task": m["task"], "bug": b, "caught": c}
                         for b, c in zip([b for b in m["bugs"] if b in affects], caught)]
        recall.append(float(np.mean(caught_all)) if caught_all else 1.0)
        precision.append(attr_all / bad_all if bad_all else 1.0)
        orc = [c for m, r in results if m["seed"] == s and m["kind"] == "oracle" for wf in r["workflows"]
               for c in wf["cases"] if c["counted"]]
        orc_bad = sum(c["result"] != "Pass" for c in orc) + sum(
            1 for m, r in results if m["seed"] == s and m["kind"] == "oracle" and r["status"] != "success")
        false_alarm.append(orc_bad / max(1, len(orc)))
    metrics["verifier"] = {"recall": recall, "precision": precision, "false_alarm": false_alarm,
                           "n_bugs": len(bug_rows), "bugs": bug_rows}
    (ctx.out / "evaluation.json").write_text(json.dumps(metrics, indent=1))
