"""benchmarks/runtimes.py: the before/after table of committed stage runtimes (README "Runtime")."""
from __future__ import annotations

import json
import subprocess

import pytest

from benchmarks.runtimes import main, markdown, runtimes
from tests.repo_copy import git


def test_markdown_rows_totals_and_ratio():
    before = {"a": {"prepare": 10.0, "train": 290.0}, "b": {"train": 50.0, "report": 10.0}, "c": {"train": 5.0}}
    after = {"a": {"prepare": 12.0, "train": 138.0}, "b": {"train": 30.0, "report": 15.0}}
    lines = markdown(before, after, top=2).splitlines()
    assert lines[2] == "| a | 10 → 12 | 290 → 138 | — | — | 300 → 150 | 0.50 |"
    assert lines[3] == "| b | — | 50 → 30 | — | 10 → 15 | 60 → 45 | 0.75 |"
    assert len(lines) == 5   # header, rule, the two slowest, the sum (c has no 'after': left out of the sum)
    assert lines[4] == "| all 2 papers | | | | | 360 → 195 (6 → 3 min) | 0.54 |"


def test_runtimes_read_a_git_revision_and_the_tree(tmp_path):
    (tmp_path / "reports" / "p").mkdir(parents=True)
    metrics = tmp_path / "reports" / "p" / "metrics.json"
    metrics.write_text(json.dumps({"runtime_s": {"train": 7.5, "evaluate": "n/a"}}))
    git(tmp_path, "init", "-q", "-b", "main")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-q", "-m", "one")
    metrics.write_text(json.dumps({"runtime_s": {"train": 2.5, "prepare": 1.0}}))
    assert runtimes("HEAD", ["p", "missing"], tmp_path) == {"p": {"train": 7.5}}
    assert runtimes(None, ["p"], tmp_path) == {"p": {"prepare": 1.0, "train": 2.5}}


@pytest.mark.parametrize("argv, needle", [(["--before", "no-such-rev"], "not a git revision"),
                                          (["--before", "HEAD", "--top", "0"], "--top: expected a positive")])
def test_cli_bad_arguments_one_line(capsys, argv, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1
