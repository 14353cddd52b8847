"""The mutation-testing registry (tests/<area>/mutation.json) is well formed and covers every paper.

mutmut itself is too slow for CI (``make mutants``); this checks what CI can: that every registered core
module and test path exists, that every paper has a core module, that the recorded results belong to
registered modules, and that a malformed registry is rejected with a message naming the file.
"""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from stages.common.config import registered_papers
from tests import mutation

ROOT = Path(__file__).resolve().parents[2]


def test_every_registered_module_and_test_path_exists():
    core, equivalent = mutation.load_registry(ROOT)
    assert "stages/common/claims.py" in core
    for module, args in core.items():
        assert (ROOT / module).is_file(), module
        paths = [a for i, a in enumerate(args) if not a.startswith("-") and (i == 0 or args[i - 1] not in ("-k", "-m"))]
        assert paths, f"{module}: no test path in {shlex.join(args)}"
        for p in paths:
            assert (ROOT / p.split("::")[0]).exists(), f"{module}: {p} does not exist"
    for key, why in equivalent.items():
        module, _, name = key.partition("::")
        assert module in core and name.startswith("stages.") and why.strip()


def test_every_paper_has_a_core_module():
    core, _ = mutation.load_registry(ROOT)
    slugs = {m.split("/")[1] for m in core}
    missing = sorted(set(registered_papers()) - slugs)
    assert not missing, f"papers without a mutation-tested core module: {missing}"


def test_recorded_results_are_for_registered_modules():
    core, _ = mutation.load_registry(ROOT)
    results = json.loads((ROOT / "reports" / "mutation.json").read_text())
    assert set(results) <= set(core)
    for module, r in results.items():
        decided = r["killed"] + r["timeout"] + r["survived"] + r["no_tests"]   # an uncovered mutant counts against
        assert r["survived"] == len(r["survivors"])
        assert r["kill_rate"] == pytest.approx((r["killed"] + r["timeout"]) / decided, abs=5e-4)


def test_malformed_registry_is_rejected_naming_the_file(tmp_path):
    (tmp_path / "stages").mkdir()
    (tmp_path / "stages" / "m.py").write_text("x = 1\n")
    area = tmp_path / "tests" / "p"
    area.mkdir(parents=True)
    (area / "mutation.json").write_text('{"modules": {"stages/m.py": {"tests": []}}}')
    with pytest.raises(SystemExit, match=r"tests/p/mutation.json: stages/m.py: no such module, or no tests"):
        mutation.load_registry(tmp_path)
    (area / "mutation.json").write_text('{"mods": {}}')
    with pytest.raises(SystemExit, match=r"tests/p/mutation.json: not a mutation registry"):
        mutation.load_registry(tmp_path)
    (area / "mutation.json").write_text(
        '{"modules": {"stages/m.py": {"tests": ["tests/p"], "equivalent": {"stages.m.x_f__mutmut_1": " "}}}}')
    with pytest.raises(SystemExit, match=r"equivalent mutant stages.m.x_f__mutmut_1 has no reason"):
        mutation.load_registry(tmp_path)
