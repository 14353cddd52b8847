"""The registered papers (params.yaml `papers`) drive dvc.yaml, the summary and the README."""
from __future__ import annotations

import json

import yaml

from stages.common.config import registered_papers
from stages.common.paths import ROOT
from stages.common.summary import END, START, results_table


def test_summary_stage_depends_on_every_registered_paper():
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    deps = dvc["stages"]["summary"]["deps"]
    expected = {f"reports/{slug}/claims.json" for slug in registered_papers()}
    assert {d for d in deps if d.startswith("reports/")} == expected
    for name in ("prepare", "train", "evaluate", "report"):
        assert dvc["stages"][name]["foreach"] == "${papers}"
    outs = [next(iter(o)) if isinstance(o, dict) else o for o in dvc["stages"]["report"]["do"]["outs"]]
    assert "reports/${key}/claims.json" in outs  # the summary's inputs are declared outputs (dvc dag)


def test_every_registered_paper_has_its_stage_modules_and_tests():
    for slug in registered_papers():
        for stage in ("prepare", "train", "evaluate", "report"):
            assert (ROOT / "stages" / slug / f"{stage}.py").exists(), f"{slug}: no stages/{slug}/{stage}.py"
        assert (ROOT / "tests" / slug).is_dir(), f"{slug}: no tests/{slug}/"


def test_readme_results_table_matches_the_committed_summary():
    summary_path = ROOT / "reports" / "summary.json"
    readme = (ROOT / "README.md").read_text()
    assert START in readme and END in readme
    if not summary_path.exists():
        return
    summary = json.loads(summary_path.read_text())
    table = readme.split(START, 1)[1].split(END, 1)[0].strip()
    assert table == results_table(summary)
