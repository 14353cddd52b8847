"""flows/verdicts.py: a run's claims against the committed ones (git), on a toy repo whose expected counts
are worked out by hand, on the real reports, and its one-line errors."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from flows.paper_flow import claims_rows
from flows.proc import ROOT
from flows.verdicts import (compare, compare_study, format_comparison, format_studies, main, neighbours, parse_claims,
                            summary_lines, verdict_of)
from stages.common.config import read_params, registered_papers
from tests.repo_copy import git


def claim(name, verdict, values, kind="finding", wallclock=False, mean=None, lower=None, upper=None):
    c = {"name": name, "kind": kind, "verdict": verdict, "holds": verdict == "holds", "values": values,
         "statement": name, "wallclock": wallclock}
    if mean is not None:
        c["stats"] = {"mean": mean, "lower": lower, "upper": upper, "n": 5.0}
    return c


def write_claims(root: Path, slug: str, claims: list[dict], runtime: dict | None = None) -> None:
    path = root / "reports" / slug / "claims.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"slug": slug, "profile": "default", "claims": claims}))
    if runtime is not None:
        (path.parent / "metrics.json").write_text(json.dumps({"slug": slug, "runtime_s": runtime}))


@pytest.fixture
def toy(tmp_path) -> Path:
    """Committed: alpha (a finding, two checks, a wall-clock check), beta (an old-format claim: `holds` only).
    gamma is registered but committed without claims."""
    root = tmp_path / "repo"
    root.mkdir()
    (root / "params.yaml").write_text(yaml.safe_dump({"papers": {"alpha": {}, "beta": {}, "gamma": {}}}))
    write_claims(root, "alpha", [
        claim("gap", "holds", {"x": [0.25, 0.5]}, mean=0.5, lower=0.2, upper=0.8),
        claim("above", "inconclusive", {"y": [1.5, 2.5]}, kind="check"),
        claim("below", "holds", {"z": [0.125, float("nan")]}, kind="check"),
        claim("speed", "holds", {"s": [3.0]}, kind="check", wallclock=True),
    ], runtime={"prepare": 2.0, "train": 6.0, "evaluate": 1.5, "report": 0.5})      # 10 s
    (root / "reports" / "beta").mkdir(parents=True)
    (root / "reports" / "beta" / "claims.json").write_text(json.dumps({"claims": [{"name": "old", "holds": False}]}))
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "committed reports")
    return root


def rerun(root: Path) -> None:
    """This 'run': gap moves holds -> fails; above keeps its verdict on other numbers; below identical (NaN
    included); speed (wall-clock) moves; a new claim; beta not run; gamma reported for the first time."""
    write_claims(root, "alpha", [
        claim("gap", "fails", {"x": [-0.25, -0.5]}, mean=-0.3, lower=-0.5, upper=-0.1),
        claim("above", "inconclusive", {"y": [1.5, 2.75]}, kind="check"),
        claim("below", "holds", {"z": [0.125, float("nan")]}, kind="check"),
        claim("speed", "fails", {"s": [9.0]}, kind="check", wallclock=True),
        claim("extra", "holds", {"w": [1.0]}),
    ], runtime={"prepare": 3.0, "train": 9.0, "evaluate": 2.5, "report": 0.5})      # 15 s: 1.5x
    (root / "reports" / "beta" / "claims.json").unlink()
    write_claims(root, "gamma", [claim("first", "holds", {"v": [2.0]})])


def test_counts_and_rows_worked_out_by_hand(toy):
    rerun(toy)
    cmp = compare(toy, "HEAD")
    by = {(r.paper, r.name): r for r in cmp.rows}
    assert set(by) == {("alpha", n) for n in ("gap", "above", "below", "speed", "extra")}
    assert [by["alpha", n].status for n in ("gap", "above", "below", "speed", "extra")] == \
        ["moved", "same", "same", "moved", "new"]
    assert (by["alpha", "gap"].committed, by["alpha", "gap"].current) == ("holds", "fails")
    assert [by["alpha", n].identical for n in ("gap", "above", "below")] == [False, False, True]
    assert by["alpha", "gap"].committed_stats == {"mean": 0.5, "lower": 0.2, "upper": 0.8}
    # non-wall-clock claims in both runs: gap, above, below -> 2 reproduced; findings 0/1, checks 2/2
    assert cmp.counted() == (2, 3)
    assert cmp.counted("finding") == (0, 1) and cmp.counted("check") == (2, 2)
    assert cmp.counted(wallclock=True) == (0, 1)
    assert cmp.not_run == ["beta"] and cmp.not_committed == ["gamma"]
    text = format_comparison(cmp, {"cpu": "toy"})
    first = text.splitlines()[0]
    assert first.startswith(f"verdicts vs HEAD ({git(toy, 'rev-parse', '--short', 'HEAD').strip()}): "
                            "2 of 3 committed verdicts reproduced (findings 0/1, checks 2/2); "
                            "1 of 3 with identical per-seed values; wall-clock claims 0/1"), first
    assert "| alpha | gap | finding | holds (0.5 [0.2, 0.8]) | fails (-0.3 [-0.5, -0.1]) |" in text
    assert "| alpha | speed (wall-clock) | check | holds | fails |" in text
    assert "claims not in the committed reports: alpha/extra" in text
    assert "papers with no claims.json in this checkout (not run?): beta" in text
    assert "papers with no committed claims.json at" in text and text.rstrip().endswith("this machine: cpu toy")
    assert cmp.runtime_ratio == {"alpha": 1.5}
    assert "stage seconds, this run / committed: median 1.50x over 1 papers (1.50-1.50x; most: alpha)" in text


def test_a_claim_the_run_no_longer_makes_and_the_old_format(toy):
    write_claims(toy, "alpha", [claim("gap", "holds", {"x": [0.25, 0.5]})])
    cmp = compare(toy, "HEAD", papers=["alpha", "beta"])
    assert cmp.runtime_ratio == {}                 # metrics.json as committed: its report was not re-run
    gone = sorted(r.name for r in cmp.rows if r.status == "gone")
    assert gone == ["above", "below", "speed"]
    assert [(r.name, r.status, r.committed, r.identical) for r in cmp.rows if r.paper == "beta"] == \
        [("old", "same", "fails", True)]
    assert verdict_of({"holds": True}) == "holds" and verdict_of({"holds": True, "verdict": "inconclusive"}) == \
        "inconclusive"


def test_an_earlier_revision(toy):
    rerun(toy)
    git(toy, "add", "-A")
    git(toy, "commit", "-q", "-m", "the rerun committed")
    assert compare(toy, "HEAD").counted() == (5, 5)                 # HEAD holds this run's: gap, above, below,
    #                                                                 extra and gamma/first (beta is gone)
    assert compare(toy, "HEAD~1").counted() == (2, 3)               # the first commit's, as above


def test_cli_strict_json_and_exit_codes(toy, capsys, tmp_path):
    assert main(["--root", str(toy), "--strict"]) == 0                 # nothing moved
    assert "4 of 4 committed verdicts reproduced (findings 2/2, checks 2/2)" in capsys.readouterr().out
    rerun(toy)
    out_json = tmp_path / "cmp.json"
    assert main(["--root", str(toy), "--json", str(out_json)]) == 0     # informational by default
    assert main(["--root", str(toy), "--strict"]) == 1
    doc = json.loads(out_json.read_text())
    assert {r["name"] for r in doc["rows"] if r["status"] == "moved"} == {"gap", "speed"}
    assert doc["machine"]["cores"] and doc["not_run"] == ["beta"]


@pytest.mark.parametrize("setup, needle", [
    (lambda r: (r / "reports/alpha/claims.json").write_text("{nope"), "reports/alpha/claims.json: not JSON"),
    (lambda r: (r / "reports/alpha/claims.json").write_text("[1, 2]"), "no `claims` list"),
    (lambda r: write_claims(r, "alpha", [{"verdict": "holds"}]), "claim 0 has no name"),
    (lambda r: write_claims(r, "alpha", [{"name": "q"}]), "claim 'q' has neither `verdict` nor `holds`"),
    (lambda r: write_claims(r, "alpha", [{"name": "q", "verdict": "maybe"}]), "claim 'q' has verdict 'maybe'"),
    (lambda r: (r / "reports/alpha/claims.json").write_bytes(b"\xff\xfe{}"), "reports/alpha/claims.json: not UTF-8"),
])
def test_a_malformed_claims_file_is_named(toy, capsys, setup, needle):
    setup(toy)
    assert main(["--root", str(toy)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and needle in err and len(err.splitlines()) == 1, err


def test_no_git_and_unknown_revision_are_one_line(toy, tmp_path, capsys):
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "params.yaml").write_text("papers: {alpha: {}}\n")
    assert main(["--root", str(plain)]) == 2
    assert "not a git checkout" in capsys.readouterr().err
    assert main(["--root", str(toy), "--against", "no-such-tag"]) == 2
    assert capsys.readouterr().err.strip() == f"error: {toy}: unknown revision 'no-such-tag'"
    assert main(["--root", str(toy), "--papers", "alpha", "delta"]) == 2
    assert capsys.readouterr().err.strip() == "error: unknown paper 'delta' (registered: alpha, beta, gamma)"
    # make repro's call never raises: it says why there is no comparison
    assert summary_lines(plain)[0].startswith("verdicts: not compared with the committed reports (")


def test_reads_every_committed_report_of_this_project():
    """The real claims files (git HEAD) parse; every registered paper has one; rows cover its claims."""
    papers = registered_papers(read_params(ROOT / "params.yaml"))
    cmp = compare(ROOT, "HEAD")
    assert cmp.not_run == [] and cmp.not_committed == []
    for slug in papers:
        text = subprocess.run(["git", "-C", str(ROOT), "show", f"HEAD:reports/{slug}/claims.json"],
                              capture_output=True, text=True, check=True).stdout
        committed = parse_claims(text, slug)
        rows = [r for r in cmp.rows if r.paper == slug]
        assert {r.name for r in rows if r.status != "new"} == set(committed), slug
        # the verdicts read here are the ones the Prefect artifact shows (flows.paper_flow.claims_rows)
        shown = {r["name"]: r["verdict"] for r in claims_rows(json.loads(text))}
        assert {r.name: r.committed for r in rows if r.committed} == shown, slug


def write_study(folder: Path, slug: str | None, claims: list[dict] | None, overrides=("prepare.seeds=[3, 4]",)) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if slug is not None:
        (folder / "study.json").write_text(json.dumps({"slug": slug, "overrides": list(overrides)}))
    if claims is not None:
        (folder / "claims.json").write_text(json.dumps({"slug": slug, "claims": claims}))
    return folder


def test_a_study_against_its_papers_committed_report(toy, tmp_path, capsys):
    """A study of alpha on other seeds: gap holds -> fails (opposite verdicts), above inconclusive -> holds (a
    neighbour), below the same, speed (wall-clock) moved, extra new; committed alpha is untouched in the checkout,
    and the study's own claims are read, not the checkout's."""
    write_claims(toy, "alpha", [claim("gap", "holds", {"x": [9.0]})])             # the checkout's: never read
    study = write_study(tmp_path / "alpha_seeds34", "alpha", [
        claim("gap", "fails", {"x": [-0.25, -0.5]}, mean=-0.3, lower=-0.5, upper=-0.1),
        claim("above", "holds", {"y": [1.5, 2.75]}, kind="check"),
        claim("below", "holds", {"z": [0.125, float("nan")]}, kind="check"),       # identical (NaN too)
        claim("speed", "fails", {"s": [9.0]}, kind="check", wallclock=True),
        claim("extra", "holds", {"w": [1.0]}),
    ])
    s = compare_study(study, toy)
    assert (s.study, s.paper, s.overrides) == ("alpha_seeds34", "alpha", ["prepare.seeds=[3, 4]"])
    assert s.counted("finding") == (0, 1, 1) and s.counted("check") == (1, 0, 2)
    assert s.counted() == (1, 1, 3) and s.counted(wallclock=True) == (0, 1, 1)
    by = {r.name: r for r in s.rows}
    assert not neighbours(by["gap"]) and neighbours(by["above"]) and by["extra"].status == "new"
    text = format_studies([s])
    assert ("| alpha_seeds34 | alpha | `prepare.seeds=[3, 4]` | 0/1 | 1/2 | 1 | 1 | 0/1 |") in text   # below
    assert ("1 of 3 committed verdicts the same in the studies, 1 moved between holds and fails, the rest between a "
            "verdict and inconclusive; 1 of the 3 with values identical") in text
    assert "| alpha | gap | finding | holds (0.5 [0.2, 0.8]) | fails (-0.3 [-0.5, -0.1]) (**opposite**) |" in text
    assert "| alpha | above | check | inconclusive | holds |" in text
    assert "| alpha | speed (wall-clock) | check | holds | fails (**opposite**) |" in text
    assert "alpha_seeds34: claims not in the committed report: extra" in text
    out_json = tmp_path / "s.json"
    assert main(["--root", str(toy), "--study", str(study), "--json", str(out_json)]) == 0
    assert "| alpha_seeds34 | alpha |" in capsys.readouterr().out
    assert json.loads(out_json.read_text())[0]["paper"] == "alpha"
    assert main(["--root", str(toy), "--study", str(study), "--strict"]) == 1
    same = write_study(tmp_path / "alpha_same", "alpha", [
        claim("gap", "holds", {"x": [1.0]}), claim("above", "inconclusive", {"y": [1.0]}, kind="check")])
    assert main(["--root", str(toy), "--study", str(same), "--strict"]) == 0     # nothing moved (below gone)
    assert "alpha_same: committed claims the study did not make: below, speed" in capsys.readouterr().out


@pytest.mark.parametrize("make, needle", [
    (lambda d: write_study(d, None, [claim("gap", "holds", {})]), "no study.json"),
    (lambda d: (write_study(d, None, None), (d / "study.json").write_text("{")), "study.json: not JSON"),
    (lambda d: (write_study(d, None, None), (d / "study.json").write_text("[]")), "no `slug`"),
    (lambda d: write_study(d, "alpha", None), "claims.json: missing"),
    (lambda d: write_study(d, "gamma", [claim("first", "holds", {})]), "reports/gamma/claims.json: not committed"),
    (lambda d: write_study(d, "alpha", [{"name": "q", "verdict": "maybe"}]), "claim 'q' has verdict 'maybe'"),
])
def test_a_bad_study_folder_is_one_line(toy, tmp_path, capsys, make, needle):
    folder = tmp_path / "bad"
    folder.mkdir()
    make(folder)
    assert main(["--root", str(toy), "--study", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and needle in err and len(err.splitlines()) == 1, err
