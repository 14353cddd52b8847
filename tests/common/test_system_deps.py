"""The one install step for system packages (issue 58): every executable a stage looks up is declared,
the dry run names each missing one, and make repro / make test / .ci/run share the step."""
from __future__ import annotations

import ast
import re
import subprocess
import sys

from stages.common import system_deps
from stages.common.paths import ROOT


def _looked_up_executables() -> set[str]:
    """String literals passed to shutil.which(...) or listed in a *_CANDIDATES tuple, anywhere in stages/."""
    found: set[str] = set()
    for path in (p for p in (ROOT / "stages").rglob("*.py") if p.name != "system_deps.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "which"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                found.add(node.args[0].value)
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id.endswith("_CANDIDATES")
                                                    for t in node.targets):
                found |= {e.value for e in ast.walk(node.value) if isinstance(e, ast.Constant)
                          and isinstance(e.value, str)}
    return found


def test_every_looked_up_executable_is_a_declared_system_dep():
    declared = {e for d in system_deps.SYSTEM_DEPS for e in d.executables}
    looked_up = _looked_up_executables()
    assert "chromium" in looked_up  # vision2web's verifier
    assert looked_up <= declared, f"undeclared system executables: {sorted(looked_up - declared)}"


def test_dry_run_names_each_missing_package(monkeypatch, capsys):
    monkeypatch.setattr(system_deps.shutil, "which", lambda name: None)  # a machine with nothing installed
    assert system_deps.install(required=True, dry_run=True) == 0
    out = capsys.readouterr().out
    for d in system_deps.SYSTEM_DEPS:
        assert f"would install {d.apt} (needed by" in out
    assert "apt-get install -y -qq " + " ".join(d.apt for d in system_deps.SYSTEM_DEPS) in out


def test_without_apt_required_is_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(system_deps.shutil, "which", lambda name: None)
    monkeypatch.setattr(system_deps, "_can_apt", lambda: False)
    assert system_deps.install(required=True) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: missing system packages: chromium (needed by")
    assert system_deps.install(required=False) == 0  # make test: a warning, the browser tests skip


def test_cli_runs_with_the_system_python_standard_library_only():
    out = subprocess.run([sys.executable, "-S", "-m", "stages.common.system_deps", "install", "--dry-run"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_make_targets_and_ci_share_the_step():
    make = (ROOT / "Makefile").read_text()
    repro = re.search(r"^repro:.*?(?=^\S)", make, re.S | re.M).group(0)
    test = re.search(r"^test:.*?(?=^\S|\Z)", make, re.S | re.M).group(0)
    assert "stages.common.system_deps install --required" in repro and "flows.parallel_repro" in repro
    driver = (ROOT / "flows" / "parallel_repro.py").read_text()   # one paper's failure does not stop the others
    assert driver.count('"--keep-going"') == 2   # each paper's dvc repro and the closing one
    assert "stages.common.system_deps install" in test
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci and "apt-get" not in ci  # no second copy of the install step
