"""The sources registry (stages/common/sources.py): `python -m stages sources` runs and lists every registered
paper; every declared Source passes check_source (loader imports, fixture test exists and is marked
real_source); papers that declare nothing yet are allowed for now and listed by name; check_source itself
flags a bad declaration."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from stages.common.config import registered_papers
from stages.common.paths import ROOT
from stages.common.sources import Source, check_source, paper_sources

pytestmark = pytest.mark.real_source


def test_cli_lists_every_registered_paper():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "stages", "sources"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("| paper | real source (full profile) |")
    listed = {line.split("|")[1].strip() for line in lines[2:]}
    assert listed == set(registered_papers())


def test_every_declared_source_checks_out():
    undeclared, problems = [], {}
    for slug in registered_papers():
        srcs = paper_sources(slug)
        if not srcs:
            undeclared.append(slug)
            continue
        for src in srcs:
            bad = check_source(src)
            if src.real is not None:
                path = ROOT / src.fixture_test.partition("::")[0]
                if path.exists() and "real_source" not in path.read_text():
                    bad.append(f"{src.fixture_test} is not marked real_source")
            if bad:
                problems[f"{slug}: {src.real}"] = bad
    assert problems == {}
    print(f"papers without SOURCES yet ({len(undeclared)}): {', '.join(undeclared) or 'none'}")


def test_check_source_flags_bad_declarations():
    ok = Source(real="Minari mujoco/halfcheetah", params_key="papers.x.prepare.source",
                loader="stages.common.minari_io:load_minari",
                fixture_test="tests/common/test_minari_io.py::test_halfcheetah_episodes_read_back_exactly")
    assert check_source(ok) == []
    assert check_source(Source(real=None)) == ["no real source and no note saying why"]
    assert check_source(Source(real=None, note="synthetic world only")) == []
    bad = Source(real="x", loader="stages.common.minari_io:nope", fixture_test="tests/common/test_nope.py::t")
    assert check_source(bad) == ["loader stages.common.minari_io:nope does not import (AttributeError)",
                                 "fixture test file tests/common/test_nope.py is missing"]
    missing_test = Source(real="x", loader="stages.common.hf:load_records",
                          fixture_test="tests/common/test_hf.py::test_not_there")
    assert check_source(missing_test) == ["fixture test test_not_there not found in tests/common/test_hf.py"]
