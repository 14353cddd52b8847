"""Aggregation exactly as the paper's analyzer (analyze/analyzer.py, as read):

* prototype score = mean of its component scores; a missing/empty prototype -> 0;
* VS = mean prototype score POOLED (micro) over all prototypes of a level (not per-task means);
* FS = passed / counted cases, pooled over the level; only cases with non-empty validations count;
  a case scores 1 iff its result is "Pass" (Blocked = Fail = 0);
* a task whose evaluation failed (site never came up) keeps all its prototypes and counted cases in
  the denominators with score 0;
* L1 = VS; L2 = L3 = (VS + FS) / 2; overall = mean of the three levels x 100;
* device columns: VS over prototypes named desktop / tablet / mobile (or ending in _<device>).
"""
from __future__ import annotations

from typing import Any

from stages.vision2web.schema import DEVICES, device_of


def level_scores(results: list[dict[str, Any]]) -> dict[str, Any]:
    """results: verify outputs (R.json dicts) of one agent. Returns per-level VS/FS/score, devices,
    overall (x100)."""
    acc: dict[str, dict[str, float]] = {}
    dev: dict[str, list[float]] = {d: [] for d in DEVICES}
    for r in results:
        a = acc.setdefault(r["level"], {"proto_sum": 0.0, "proto_n": 0, "pass": 0, "counted": 0})
        ok = r["status"] == "success"
        for wf in r["workflows"]:
            for name, p in wf["prototypes"].items():
                s = float(p["score"]) if ok else 0.0     # ALGO: failed eval -> 0, kept in denominator
                a["proto_sum"] += s
                a["proto_n"] += 1
                d = device_of(name)
                if d is not None:
                    dev[d].append(s)
            for c in wf["cases"]:
                if not c["counted"]:                      # ALGO: validation-less cases are not in FS
                    continue
                a["counted"] += 1
                a["pass"] += int(ok and c["result"] == "Pass")   # ALGO: Blocked = Fail = 0
    levels: dict[str, dict[str, float | None]] = {}
    for lv, a in sorted(acc.items()):
        vs = a["proto_sum"] / a["proto_n"] if a["proto_n"] else 0.0
        fs = a["pass"] / a["counted"] if a["counted"] else None
        score = vs if lv == "L1" or fs is None else (vs + fs) / 2   # ALGO: L2/L3 = (VS + FS) / 2
        levels[lv] = {"VS": vs, "FS": fs, "score": score, "prototypes": a["proto_n"], "cases": a["counted"]}
    overall = 100.0 * sum(v["score"] for v in levels.values()) / len(levels) if levels else 0.0
    devices = {d: (sum(v) / len(v) if v else None) for d, v in dev.items()}
    return {"levels": levels, "devices": devices, "overall": overall}
