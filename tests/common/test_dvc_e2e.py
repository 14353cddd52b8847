"""End to end through DVC: repro at smoke, everything cached on rerun, a train param change
reruns exactly train/evaluate/report."""
from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml

from tests.repo_copy import copy_repo, tool_env

pytestmark = pytest.mark.slow
STAGES = ["prepare@reversal_curse", "train@reversal_curse", "evaluate@reversal_curse", "report@reversal_curse"]


def repro(root, *args):
    res = subprocess.run(["dvc", "repro", *args], cwd=root, env=tool_env(), capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def ran(output: str) -> set[str]:
    return set(re.findall(r"Running stage '([^']+)'", output))


def skipped(output: str) -> set[str]:
    return set(re.findall(r"Stage '([^']+)' didn't change, skipping", output))


def test_repro_cache_and_partial_rerun(tmp_path):
    root = copy_repo(tmp_path / "repo", profile="smoke")
    first = repro(root, "report@reversal_curse")
    assert ran(first) == set(STAGES)
    assert (root / "reports/reversal_curse/metrics.json").exists()
    assert (root / "dvc.lock").exists()

    second = repro(root, "report@reversal_curse")
    assert ran(second) == set() and skipped(second) == set(STAGES)
    status = subprocess.run(["dvc", "status", *STAGES], cwd=root, env=tool_env(), capture_output=True,
                            text=True, check=True).stdout
    assert "Data and pipelines are up to date" in status, status  # no stage wrote into another's output

    # results where DVC users look: metrics show reads the flat scalars, plots are declared
    shown = subprocess.run(["dvc", "metrics", "show", "--json"], cwd=root, env=tool_env(),
                           capture_output=True, text=True, check=True).stdout
    (workspace,) = json.loads(shown).values()  # DVC keys the workspace as "" (older versions: "workspace")
    flat = workspace["data"]["reports/reversal_curse/dvc_metrics.json"]["data"]
    verdicts = json.loads((root / "reports/reversal_curse/metrics.json").read_text())["claims"]
    assert {k: v for k, v in flat.items() if k.startswith("reversal_curse.claim.")} == \
        {f"reversal_curse.claim.{c['name']}": c["verdict"] for c in verdicts}  # keyed by paper, 3-way verdict

    # byte-identical outputs: a forced rerun of prepare gives the same hash, so train stays cached
    lock_before = (root / "dvc.lock").read_text()
    forced = repro(root, "-f", "-s", "prepare@reversal_curse")
    assert ran(forced) == {"prepare@reversal_curse"}
    assert (root / "dvc.lock").read_text() == lock_before
    after = repro(root, "report@reversal_curse")
    assert ran(after) == set(), after

    params = yaml.safe_load((root / "params.yaml").read_text())
    smoke = params["papers"]["reversal_curse"]["train"]["profiles"]["smoke"]
    smoke["transformer"]["steps"] = smoke["transformer"]["steps"] + 7  # a change that reaches train's outputs
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    third = repro(root, "report@reversal_curse")
    assert ran(third) == {"train@reversal_curse", "evaluate@reversal_curse", "report@reversal_curse"}
    assert skipped(third) == {"prepare@reversal_curse"}


def test_dvc_parses_yaml_with_the_c_parser_and_the_same_result():
    """The install pins ruamel.yaml.clib: DVC's safe loads (params.yaml for every stage's params, dvc.yaml,
    dvc.lock) run ruamel's C parser (`dvc status` over all papers: 34 -> 12 CPU-s here), with the same data as
    its pure-Python parser."""
    from dvc.utils.serialize._yaml import parse_yaml
    from ruamel.yaml import YAML

    from stages.common.paths import ROOT

    assert YAML(typ="safe").Parser.__name__ == "CParser"
    for name in ("params.yaml", "dvc.yaml", "dvc.lock"):
        text = (ROOT / name).read_text()
        assert parse_yaml(text, name) == YAML(typ="safe", pure=True).load(text), name
