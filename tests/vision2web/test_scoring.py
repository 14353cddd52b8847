"""Aggregation (by hand), the judge rubric on known images, the agent adapter (no browser)."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import numpy as np
import pytest
import torch

from stages.vision2web.agents import OpenAICompatibleAgent, TaskInputs
from stages.vision2web.judge import Thresholds, judge_batch, rubric
from stages.vision2web.schema import Component
from stages.vision2web.scoring import level_scores


def _r(level, status, protos, cases):
    return {"level": level, "status": status, "workflows": [{"prototypes": {n: {"score": s} for n, s in protos},
            "cases": [{"result": r, "counted": c} for r, c in cases]}]}


def test_pooled_micro_aggregation_by_hand():
    res = [
        _r("L2", "success", [("home_desktop", 1.0), ("home_mobile", 0.5)],
           [("Pass", True), ("Fail", True), ("Blocked", True), ("Fail", False)]),
        _r("L2", "success", [("a_desktop", 0.25)], [("Pass", True)]),
        _r("L2", "failed", [("b_tablet", 0.9)], [("Pass", True)]),   # failed start: zeros, kept
        _r("L1", "success", [("desktop", 0.75)], []),
        _r("L3", "success", [("x_mobile", 0.0)], [("Pass", True), ("Pass", True)]),
    ]
    s = level_scores(res)
    vs2 = (1.0 + 0.5 + 0.25 + 0.0) / 4            # pooled over prototypes, not per-task means
    fs2 = 2 / 5                                  # validation-less case excluded; Blocked = Fail = 0
    assert s["levels"]["L2"]["VS"] == pytest.approx(vs2) and s["levels"]["L2"]["FS"] == pytest.approx(fs2)
    assert s["levels"]["L2"]["score"] == pytest.approx((vs2 + fs2) / 2)
    assert s["levels"]["L1"]["score"] == pytest.approx(0.75) and s["levels"]["L3"]["score"] == pytest.approx(0.5)
    assert s["overall"] == pytest.approx(100 * (0.75 + (vs2 + fs2) / 2 + 0.5) / 3)
    assert s["devices"]["desktop"] == pytest.approx((1.0 + 0.25 + 0.75) / 3)
    assert s["devices"]["tablet"] == pytest.approx(0.0)


def test_rubric_levels():
    th = Thresholds()
    assert rubric(0.0, 1.0, th) == 1.0 and rubric(0.02, 0.95, th) == 0.75
    assert rubric(0.05, 0.7, th) == 0.5 and rubric(0.15, 0.3, th) == 0.25 and rubric(0.5, 0.9, th) == 0.0


def test_judge_identical_shifted_missing():
    rng = np.random.default_rng(0)
    proto = np.full((60, 80, 3), 240, np.uint8)
    proto[10:30, 5:45] = rng.integers(0, 255, (20, 40, 3))          # a textured component
    proto[40:55, 50:75] = (200, 30, 30)                             # a flat red component
    comps = [Component(name="tex", bbox=[5, 10, 40, 20]), Component(name="red", bbox=[50, 40, 25, 15])]
    shifted = np.full_like(proto, 240)
    shifted[10:30, 5:45] = proto[10:30, 5:45]
    shifted[40:55, 50:75] = (30, 30, 200)                           # colour wrong
    out = judge_batch([(proto, proto.copy(), comps), (proto, shifted, comps), (proto, None, comps),
                       (proto, proto[:30], None)], torch.device("cpu"))
    assert out[0]["score"] == 1.0
    assert [c["score"] for c in out[1]["components"]] == [1.0, 0.0]
    assert out[2]["score"] == 0.0                                      # no screenshot: missing
    assert out[3]["components"][0]["name"] == "page" and out[3]["score"] < 1.0   # short page padded black


def test_openai_adapter_against_fake_endpoint(tmp_path):
    task = tmp_path / "task"
    (task / "prototypes").mkdir(parents=True)
    (task / "prompt.txt").write_text("build it")
    (task / "workflow.json").write_text(json.dumps([{"summary": "s", "content": [{"objective": "click buy"}]}]))
    (task / "prototypes" / "home_desktop.png").write_bytes(b"\x89PNG fake")
    seen = {}

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            seen["body"] = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen["auth"] = self.headers.get("Authorization")
            reply = "```file:index.html\n<p>ok</p>\n```\n```file:../evil.txt\nx\n```"
            data = json.dumps({"choices": [{"message": {"content": reply}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    srv = HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.handle_request, daemon=True).start()
    agent = OpenAICompatibleAgent(f"http://127.0.0.1:{srv.server_port}/v1", "m", api_key="k", timeout_s=10)
    info = agent.build(TaskInputs(task), tmp_path / "site")
    srv.server_close()
    assert info["files"] == ["index.html"] and not (tmp_path / "evil.txt").exists()
    assert seen["auth"] == "Bearer k" and seen["body"]["model"] == "m"
    parts = seen["body"]["messages"][0]["content"]
    assert "build it" in parts[0]["text"] and "click buy" in parts[0]["text"]
    assert parts[2]["image_url"]["url"].startswith("data:image/png;base64,")


def test_detection_attribution_by_hand():
    from stages.vision2web.evaluate import detection

    wf = {"cases": [{"result": r, "counted": True} for r in ("Pass", "Fail", "Blocked", "Fail", "Fail")]}
    m = {"level": "L2", "bugs": ["remove_broken", "nav_about_broken", "color_shift"]}
    caught, bad, attributed = detection(m, {"status": "success", "workflows": [wf]})
    assert caught == [True, False]                 # remove (case 4) failed; about (case 0) passed: missed
    assert (bad, attributed) == (4, 1)             # cases 1-3 fail outside any injected bug's cases
    failed = {"status": "failed", "workflows": [wf]}
    caught, bad, attributed = detection({"level": "L3", "bugs": ["start_broken"]}, failed)
    assert caught == [True] and bad == attributed == 5
