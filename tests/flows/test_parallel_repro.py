"""flows/parallel_repro.py on a toy DVC project: papers' `dvc repro` run two at a time in one checkout,
DVC records every stage (dvc.lock, run-cache), the final `dvc repro` finds them current, a deleted
output comes back from the cache, a failing paper is reported in dvc repro's words and stops only
itself, an unchanged upstream output leaves its downstream stages alone, SIGTERM stops the lanes."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from io import StringIO
from pathlib import Path

import pytest
import yaml

from flows.parallel_repro import Printer, expected_runtime, longest_first, main, parallel_repro
from tests.repo_copy import git, tool_env

STAGE_PY = textwrap.dedent('''
    import json, sys, time, pathlib, yaml
    stage, slug = sys.argv[1], sys.argv[2]
    p = yaml.safe_load(open("params.yaml"))["papers"][slug][stage]
    log = pathlib.Path("times"); log.mkdir(exist_ok=True)
    start = time.time()
    time.sleep(p.get("sleep", 0))
    if p.get("fail"):
        print("error: " + slug + " cannot " + stage, file=sys.stderr); sys.exit(2)
    up = {"prepare": None, "train": "prepare", "evaluate": "train", "report": "evaluate"}[stage]
    prev = pathlib.Path("data", slug, up, "out.txt").read_text() if up else ""
    out = pathlib.Path("reports" if stage == "report" else "data", slug, *([] if stage == "report" else [stage]))
    out.mkdir(parents=True, exist_ok=True)
    (out / "out.txt").write_text(prev + f"{stage}:{p.get('value', 0)};")
    if stage == "report":   # a claim whose verdict follows the value (flows.verdicts reads it)
        v = p.get("value", 0)
        (out / "claims.json").write_text(json.dumps({"claims": [{"name": "odd", "kind": "finding",
            "verdict": "holds" if v % 2 else "fails", "values": {"v": [v]}}]}))
    with open(log / f"{slug}-{stage}.jsonl", "a") as f:
        f.write(json.dumps({"start": start, "end": time.time(), "threads": __import__("os").environ.get("OMP_NUM_THREADS"), "workers": __import__("os").environ.get("STAGES_MAX_WORKERS")}) + "\\n")
''')


def dvc_yaml(slugs: list[str], git_claims: bool = False) -> str:
    """git_claims: the report's claims.json is an uncached output kept in git, as in the project."""
    stages: dict = {}
    for stage, up in (("prepare", None), ("train", "prepare"), ("evaluate", "train"), ("report", "evaluate")):
        outs = [f"data/${{key}}/{stage}"] if stage != "report" else (
            [{"reports/${key}/out.txt": {}}, {"reports/${key}/claims.json": {"cache": False}}] if git_claims
            else ["reports/${key}"])
        stages[stage] = {"foreach": "${papers}", "do": {
            "cmd": f"python stage.py {stage} ${{key}}", "deps": ["stage.py"] + ([f"data/${{key}}/{up}"] if up else []),
            "params": [f"papers.${{key}}.{stage}"], "outs": outs}}
    stages["summary"] = {"cmd": "cat " + " ".join(f"reports/{s}/out.txt" for s in slugs) + " > summary.txt",
                         "deps": [f"reports/{s}" for s in slugs], "outs": ["summary.txt"]}
    return yaml.safe_dump({"stages": stages}, sort_keys=False)


def make_project(root: Path, papers: dict[str, dict], git_claims: bool = False) -> Path:
    root.mkdir(parents=True)
    (root / "stage.py").write_text(STAGE_PY)
    (root / "params.yaml").write_text(yaml.safe_dump({"papers": papers}, sort_keys=False))
    (root / "dvc.yaml").write_text(dvc_yaml(list(papers), git_claims))
    (root / ".gitignore").write_text("times/\n")
    git(root, "init", "-q", "-b", "main")
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=root, check=True, env=tool_env())
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "toy")
    return root


def paper(sleep_train: float = 0.0, fail: str | None = None, value: int = 3) -> dict:
    return {s: {"value": value, "sleep": sleep_train if s == "train" else 0, **({"fail": True} if s == fail else {})}
            for s in ("prepare", "train", "evaluate", "report")}


def dvc_status(root: Path, *targets: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "dvc", "status", "--json", *targets], cwd=root, check=True,
                         capture_output=True, text=True, env=tool_env()).stdout
    return json.loads(out or "{}")


def runs(root: Path, slug: str, stage: str) -> list[dict]:
    path = root / "times" / f"{slug}-{stage}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def in_path(monkeypatch):
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + ":" + __import__("os").environ["PATH"])


def test_two_lanes_record_every_stage_and_dvc_repro_finds_them_current(tmp_path, in_path, monkeypatch):
    import os

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("STAGES_MAX_WORKERS", raising=False)
    root = make_project(tmp_path / "p", {"alpha": paper(5, value=5), "beta": paper(5, value=7)})
    log = StringIO()
    assert parallel_repro(root, jobs=2, printer=Printer(log)) == 0
    text = log.getvalue()
    # the two papers' train commands overlapped in time (two lanes), each ran exactly once
    (a,), (b,) = runs(root, "alpha", "train"), runs(root, "beta", "train")
    assert a["start"] < b["end"] and b["start"] < a["end"], text
    assert a["threads"] == b["threads"] == str(max(1, (os.cpu_count() or 1) // 2))   # the cores shared out
    assert a["workers"] == b["workers"] == a["threads"]                  # and the stages' pool processes
    assert all(len(runs(root, s, st)) == 1 for s in ("alpha", "beta")
               for st in ("prepare", "train", "evaluate", "report"))
    # DVC recorded them: nothing stale, the final dvc repro ran only the summary
    assert dvc_status(root) == {}
    assert "Running stage 'summary'" in text and "Running stage 'train@alpha'" not in text.split("$ dvc repro")[1]
    assert (root / "summary.txt").read_text() == ("prepare:5;train:5;evaluate:5;report:5;"
                                                   "prepare:7;train:7;evaluate:7;report:7;")
    lock = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
    assert {"train@alpha", "report@beta", "summary"} <= set(lock)
    # each recorded stage got its run-cache entry, as under dvc repro (one per stage: 8 + the summary)
    assert len([p for p in (root / ".dvc" / "cache" / "runs").rglob("*") if p.is_file()]) == 9
    # a second run runs nothing
    log2 = StringIO()
    assert parallel_repro(root, jobs=2, printer=Printer(log2)) == 0
    assert "Running stage" not in log2.getvalue() and "didn't change, skipping" in log2.getvalue()
    assert len(runs(root, "alpha", "train")) == 1
    # an output deleted from the workspace comes back from DVC's cache, not from a re-run
    import shutil

    shutil.rmtree(root / "data" / "alpha" / "train")
    assert parallel_repro(root, jobs=2, printer=Printer(StringIO())) == 0
    assert (root / "data" / "alpha" / "train" / "out.txt").read_text() == "prepare:5;train:5;"
    assert len(runs(root, "alpha", "train")) == 1 and dvc_status(root) == {}


def test_failing_paper_stops_only_itself_and_is_reported_like_dvc(tmp_path, in_path):
    from stages.common.summary import repro_failures

    root = make_project(tmp_path / "p", {"good": paper(value=2), "bad": paper(fail="train")})
    log = StringIO()
    assert parallel_repro(root, jobs=2, printer=Printer(log)) == 1
    (tmp_path / "repro.log").write_text(log.getvalue())
    assert repro_failures(tmp_path / "repro.log") == ["1 paper(s) failed:", "  bad: train — error: bad cannot train"]
    assert dvc_status(root, "report@good") == {}
    assert (root / "reports" / "good" / "out.txt").exists()
    assert not runs(root, "bad", "evaluate") and not (root / "summary.txt").exists()
    assert "train@bad" in dvc_status(root)
    assert "verdicts vs" not in log.getvalue()       # no comparison after a failed paper


def test_prints_how_the_verdicts_compare_with_the_committed_reports(tmp_path, in_path):
    root = make_project(tmp_path / "p", {"alpha": paper(value=5), "beta": paper(value=7)}, git_claims=True)
    log = StringIO()
    assert parallel_repro(root, jobs=2, printer=Printer(log)) == 0
    assert "papers with no committed claims.json at" in log.getvalue()     # not committed yet
    git(root, "add", "reports/alpha/claims.json", "reports/beta/claims.json")
    git(root, "commit", "-q", "-m", "the reports")
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["papers"]["beta"]["report"]["value"] = 8                        # beta's claim: holds -> fails
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    log = StringIO()
    assert parallel_repro(root, jobs=2, printer=Printer(log)) == 0        # informational: still exit 0
    text = log.getvalue()
    assert "committed verdicts reproduced" in text.split("$ dvc repro")[-1]   # after the last dvc repro
    assert "1 of 2 committed verdicts reproduced (findings 1/2, checks 0/0)" in text, text
    assert "| beta | odd | finding | holds | fails |" in text and "this machine: cpu " in text


def test_unchanged_upstream_output_leaves_downstream_alone(tmp_path, in_path):
    root = make_project(tmp_path / "p", {"alpha": paper(value=1), "beta": paper(value=1)})
    assert parallel_repro(root, jobs=2, printer=Printer(StringIO())) == 0
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["papers"]["alpha"]["train"]["sleep"] = 0.01   # a param change that leaves train's output as it was
    params["papers"]["beta"]["evaluate"]["value"] = 9     # a change of beta's evaluate output
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    assert parallel_repro(root, jobs=2, printer=Printer(StringIO())) == 0
    assert [len(runs(root, "alpha", s)) for s in ("prepare", "train", "evaluate", "report")] == [1, 2, 1, 1]
    assert [len(runs(root, "beta", s)) for s in ("prepare", "train", "evaluate", "report")] == [1, 1, 2, 2]
    assert (root / "reports" / "beta" / "out.txt").read_text() == "prepare:1;train:1;evaluate:9;report:1;"
    assert dvc_status(root) == {}


def test_longest_first_reads_committed_runtimes(tmp_path):
    for slug, rt in (("a", {"train": 10.0, "report": 1.5}), ("b", {"train": 40.0}), ("c", None)):
        (tmp_path / "reports" / slug).mkdir(parents=True)
        if rt is not None:
            (tmp_path / "reports" / slug / "metrics.json").write_text(json.dumps({"runtime_s": rt}))
    assert expected_runtime(tmp_path, "a") == 11.5 and expected_runtime(tmp_path, "c") == 0.0
    assert longest_first(["c", "a", "b", "d"], lambda s: expected_runtime(tmp_path, s)) == ["b", "a", "c", "d"]


@pytest.mark.parametrize("argv, needle", [(["--jobs", "0"], "--jobs: expected a positive"),
                                          (["--papers", "nope"], "unknown paper 'nope'"),
                                          (["--papers"], "--papers: name at least one paper")])
def test_cli_rejects_bad_arguments_in_one_line(tmp_path, capsys, argv, needle):
    root = make_project(tmp_path / "p", {"alpha": paper()})
    assert main([*argv, "--root", str(root)]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1 and not (root / "data").exists()


def test_sigterm_stops_the_running_stages_and_starts_no_other(tmp_path):
    import os
    import signal
    import time

    root = make_project(tmp_path / "p", {"alpha": paper(60), "beta": paper(60), "gamma": paper()})
    env = tool_env(PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.Popen([sys.executable, "-m", "flows.parallel_repro", "--jobs", "2", "--root", str(root)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    seen: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:   # wait until both lanes run their 60 s train
        seen.append(line)
        if sum("> python stage.py train" in s for s in seen) == 2:
            break
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out = proc.stdout.read()
    assert proc.wait(timeout=30) == 130, "".join(seen) + out
    assert time.monotonic() - start < 20
    assert "error: interrupted" in out and "Running stage 'prepare@gamma'" not in out
    assert not runs(root, "alpha", "train") and not runs(root, "gamma", "prepare")
    time.sleep(0.5)
    pids = subprocess.run(["pgrep", "-f", "stage.py train"], capture_output=True, text=True).stdout.split()
    left = [p for p in pids if os.path.realpath(f"/proc/{p}/cwd") == os.path.realpath(root)]
    assert not left, f"stage commands still running: {left}"
