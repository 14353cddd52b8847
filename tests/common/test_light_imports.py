"""Modules that only run trained models must not import Lightning (~4.5 CPU-s in every process that does):
the CAD sandbox workers, the evaluate and report stages and their pool workers, the grounding CLI."""
from __future__ import annotations

import subprocess
import sys

from stages.common.paths import ROOT

LIGHT = ["stages.futurecad.model", "stages.futurecad.infer", "stages.futurecad.sandbox", "stages.futurecad.ground",
         "stages.futurecad.evaluate", "stages.futurecad.report", "stages.plantain.model", "stages.plantain.evaluate",
         "stages.plantain.report"]
# one fresh process imports them in turn and names the first after which Lightning is loaded
PROBE = """
import importlib, sys
for m in sys.argv[1:]:
    importlib.import_module(m)
    if 'lightning' in sys.modules or 'torchmetrics' in sys.modules:
        print(m)
        break
"""


def _first_heavy(modules: list[str]) -> str:
    out = subprocess.run([sys.executable, "-c", PROBE, *modules], capture_output=True, text=True, cwd=ROOT, check=True)
    return out.stdout.strip()


def test_inference_modules_do_not_import_lightning():
    assert _first_heavy(LIGHT) == ""


def test_the_probe_names_a_module_that_imports_lightning():
    assert _first_heavy(["stages.futurecad.model", "stages.futurecad.lit", "stages.plantain.model"]) == "stages.futurecad.lit"
