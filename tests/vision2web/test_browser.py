"""Real-browser tests (skipped without Debian's chromium + playwright): a start failure is recorded,
never hung; the smoke pipeline end to end (oracle ~100, one-bug sites caught, the synthesis agent
scored through the adapter, the report rendered)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from stages.common.paths import ROOT
from stages.vision2web.browser import browser_available

pytestmark = pytest.mark.skipif(not browser_available(),
                                reason="needs Debian's chromium (apt-get install chromium) and the playwright package")


def test_site_that_never_starts_scores_zero_with_reason(tmp_path):
    task = tmp_path / "task"
    (task / "prototypes").mkdir(parents=True)
    from PIL import Image
    import numpy as np

    Image.fromarray(np.zeros((10, 10, 3), np.uint8)).save(task / "prototypes" / "desktop.png")
    (task / "workflow.json").write_text(json.dumps([{"summary": "s", "prototype": {"desktop": {"idx": 0}},
        "content": [{"objective": "o", "validations": [{"op": "visible", "selector": "body"}]}]}]))
    site = tmp_path / "site"
    site.mkdir()
    (site / "start.json").write_text(json.dumps({"command": ["{python}", "-c", "import time; time.sleep(60)"],
                                                 "ready_timeout_s": 1.5}))
    out = tmp_path / "R.json"
    r = subprocess.run([sys.executable, "-m", "stages.vision2web.verify", "--task", task, "--site", site, "--out", out],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["status"] == "failed" and "not ready" in res["reason"]
    assert res["score"] == 0 and res["workflows"][0]["cases"][0]["result"] == "Blocked"


def _tree_hash(root) -> dict:
    import hashlib

    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_smoke_pipeline_end_to_end(smoke_run):
    up = smoke_run("vision2web", stages=("prepare", "train"))
    before = {k: _tree_hash(v) for k, v in up.items()}
    out = {**up, **smoke_run("vision2web", stages=("evaluate", "report"))}
    # issue 57: evaluate runs agents' backends inside the train output; nothing upstream changes
    assert {k: _tree_hash(up[k]) for k in up} == before
    ev = json.loads((out["evaluate"] / "evaluation.json").read_text())
    assert ev["agents"]["oracle"]["overall"] == [pytest.approx(100.0)]
    assert ev["verifier"]["oracle_false_alarm_items"] == [[0.0, 0.0]]
    # the two outside misses, one site each, caught without false alarms
    # (8 L3 / 6 L2 cases x 3 viewports, minus the bug's one case per workflow)
    assert ev["verifier"]["per_bug"] == {
        "delete_oldest": {"sites": 1, "caught": 1, "outside": 21, "outside_bad": 0},
        "delete_wrong_item": {"sites": 1, "caught": 1, "outside": 21, "outside_bad": 0},
        "remove_first_row": {"sites": 1, "caught": 1, "outside": 15, "outside_bad": 0},
        "remove_wrong_item": {"sites": 1, "caught": 1, "outside": 15, "outside_bad": 0}}
    assert ev["visual_bugs"]["detection"]["mobile"] == 1.0 and ev["visual_bugs"]["unexposed_drop_max"] == 0.0
    synth = ev["agents"]["synth"]
    assert synth["agent_errors"] == 0 and synth["start_failures"] == 0
    failed = [(f.name, w["summary"], c["objective"], c["result"], c["detail"])
              for f in sorted((out["evaluate"] / "results" / "synth").glob("*_L3_*.json"))
              for w in json.loads(f.read_text())["workflows"] for c in w["cases"] if c["result"] != "Pass"]
    assert 20.0 < synth["overall"][0] < 100.0
    assert synth["L3_FS"][0] == 100.0, failed   # its own backend passes every case
    assert len(synth["items"]["L2"]) == 1 and len(synth["items"]["all"][0]) == 3
    assert ev["calibration"]["test"]["n"] > 0 and ev["sandbox"]["stuck"] == 0
    rec = json.loads((out["evaluate"] / "kernels.json").read_text())["segmented_compare"]
    assert rec["calls"] > 0 and rec["parity_max_abs_err"] == 0.0
    metrics = json.loads((out["report"] / "metrics.json").read_text())
    assert {c["name"] for c in metrics["claims"]} >= {"verifier_recall", "oracle_near_100", "synth_gap_L3"}
    for c in metrics["claims"]:
        assert c["verdict"] in ("holds", "fails", "inconclusive") and c["refuted_by"] and c["kind"] in ("finding", "check")
    assert (out["report"] / "figures" / "screenshots.png").stat().st_size > 0
    # the public CLI on a generated task and the oracle's site
    task = next((out["prepare"] / "tasks").glob("*_L2_*"))
    site = out["train"] / "sites" / "oracle" / task.name
    r = subprocess.run([sys.executable, "-m", "stages.vision2web.verify", "--task", task, "--site", site,
                        "--out", out["report"].parent / "R.json"], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    res = json.loads((out["report"].parent / "R.json").read_text())
    assert res["status"] == "success" and res["score"] == pytest.approx(1.0)
