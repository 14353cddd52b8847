"""Processes that only run trained models must not import Lightning (~3-4.5 CPU-s in every process that does):
the CAD sandbox workers, the evaluate and report stages and their pool workers, the grounding CLI. The probe
imports those modules and also runs the code paths that import inside functions (the sandbox worker loading a
model grounder, the grounding CLI on a STEP part), in one fresh process."""
from __future__ import annotations

import subprocess
import sys

from stages.common.paths import ROOT

LIGHT = ["stages.futurecad.model", "stages.futurecad.infer", "stages.futurecad.sandbox", "stages.futurecad.ground",
         "stages.futurecad.evaluate", "stages.futurecad.report", "stages.plantain.model", "stages.plantain.evaluate",
         "stages.plantain.report"]
HEAVY = ("lightning", "torchmetrics")
# one fresh process: import each module, then exercise the function-level imports; prints "HEAVY <step>" for the
# first step after which Lightning is loaded
PROBE = """
import importlib, json, sys, tempfile
from pathlib import Path
HEAVY = %r
def heavy():
    return any(m in sys.modules for m in HEAVY)
def check(step):
    if heavy():
        print("HEAVY", step)
        sys.exit(0)
for m in sys.argv[1:]:
    importlib.import_module(m)
    check(m)
if "stages.futurecad.ground" in sys.argv[1:]:
    import torch
    from stages.futurecad import cad, ground, sandbox
    from stages.futurecad.model import BRepGround, build_vocab
    tmp = Path(tempfile.mkdtemp())
    vocab = build_vocab(["fillet the circular edges on the top"])
    g = {"d_model": 16, "n_heads": 2, "text_layers": 1, "fusion_layers": 1, "max_words": 12, "max_faces": 64,
         "max_edges": 160, "threshold": 0.5, "abstain_threshold": 0.5}
    net = BRepGround(len(vocab), g["d_model"], g["n_heads"], g["text_layers"], g["fusion_layers"], g["max_words"])
    ckpt = tmp / "ground.pt"
    torch.save({"state": net.state_dict(), "meta": json.dumps({"vocab": vocab, "ground": g})}, ckpt)
    step = Path(%r) / "stages" / "futurecad" / "step_parts" / "flange.step"
    grounder = sandbox._load_grounder(("model", str(ckpt)))       # what a sandbox worker runs on set_grounder
    grounder(cad.load_step(step), "fillet the circular edges on the top")
    check("sandbox._load_grounder")
    rc = ground.main(["--step", str(step), "--query", "fillet the circular edges on the top", "--out",
                      str(tmp / "r.json"), "--checkpoint", str(ckpt)])
    assert rc == 0, rc
    check("ground.main")
"""


def _first_heavy(modules: list[str]) -> str:
    out = subprocess.run([sys.executable, "-c", PROBE % (HEAVY, str(ROOT)), *modules], capture_output=True,
                         text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    marks = [line.split(" ", 1)[1] for line in out.stdout.splitlines() if line.startswith("HEAVY ")]
    return marks[0] if marks else ""


def test_inference_processes_do_not_import_lightning():
    assert _first_heavy(LIGHT) == ""


def test_the_probe_names_a_module_that_imports_lightning():
    assert _first_heavy(["stages.futurecad.model", "stages.futurecad.lit", "stages.plantain.model"]) == "stages.futurecad.lit"
