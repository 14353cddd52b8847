"""Task/site format validation, the verify CLI's bad-input errors, generator determinism (no browser)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from stages.common.paths import ROOT
from stages.vision2web.schema import TaskFormatError, device_of, load_start, load_task
from stages.vision2web.sitegen import BUG_AFFECTS, make_spec, render_site, workflows

CASE = {"objective": "o", "actions": [{"op": "click", "selector": "#a"}],
        "validations": [{"op": "count", "selector": ".r", "equals": 2}]}


def _task(tmp: Path, wf, meta=None, comps=None) -> Path:
    d = tmp / "task"
    (d / "prototypes").mkdir(parents=True)
    (d / "workflow.json").write_text(json.dumps(wf))
    if meta is not None:
        (d / "task.json").write_text(json.dumps(meta))
    Image.fromarray(np.zeros((20, 30, 3), np.uint8)).save(d / "prototypes" / "home_mobile.png")
    if comps is not None:
        (d / "prototypes" / "home_mobile.components.json").write_text(json.dumps(comps))
    return d


def test_defaults_documented(tmp_path):
    d = _task(tmp_path, [{"summary": "s", "prototype": {"home_mobile": {"idx": 1}}, "content": [CASE]}])
    t = load_task(d)
    wf = t.workflows[0]
    assert (wf.resolution.width, wf.resolution.height) == (1024, 768)
    assert wf.prototype["home_mobile"].fullpage is True
    assert (t.meta.level, t.meta.action_timeout_ms, t.meta.validation_timeout_ms) == ("L1", 3000, 1500)
    assert t.components["home_mobile"] is None and t.n_counted_cases() == 1
    assert device_of("home_mobile") == "mobile" and device_of("desktop") == "desktop" and device_of("x") is None


@pytest.mark.parametrize("wf, needle", [
    ([], "non-empty JSON list"),
    ([{"summary": "s", "content": [{"objective": "o", "actions": [{"op": "jump"}]}]}], "[0].content.0.actions.0"),
    ([{"summary": "s", "content": [{"objective": "o", "actions": [{"op": "click"}]}]}], "selector"),
    ([{"summary": "s", "extra": 1}], "[0].extra"),
    ([{"summary": "s", "resolution": {"width": 50}}], "resolution.width"),
    ([{"summary": "s", "prototype": {"home_mobile": {"idx": 2}}, "content": [CASE]}], "exceeds"),
    ([{"summary": "s", "prototype": {"nope": {"idx": 0}}}], "prototypes/nope.png missing"),
    ([{"summary": "s", "content": [{"objective": "o", "validations": [{"op": "count", "selector": "a", "equals": "2"}]}]}],
     "equals"),
])
def test_malformed_workflow_is_one_line_error(tmp_path, wf, needle):
    d = _task(tmp_path, wf)
    with pytest.raises(TaskFormatError) as err:
        load_task(d)
    assert needle in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("text, needle", [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('[{"summary": "s", "n": ' + "9" * 5000 + "}]", "not valid JSON (Exceeds the limit"),
    ('[{"summary": NaN}]', "not valid JSON (NaN is not valid JSON)"),
    ("\udcff", "not valid JSON"),
])
def test_hostile_json_text_is_one_line_error(tmp_path, text, needle):
    d = tmp_path / "t"
    d.mkdir()
    (d / "workflow.json").write_text(text, encoding="utf-8", errors="surrogateescape")
    with pytest.raises(TaskFormatError) as err:
        load_task(d)
    assert needle in str(err.value) and "\n" not in str(err.value)
    (d / "workflow.json").unlink()
    (d / "workflow.json").mkdir()                                   # a folder where the file should be
    with pytest.raises(TaskFormatError, match="workflow.json: cannot read"):
        load_task(d)


def test_bad_meta_components_start(tmp_path):
    wf = [{"summary": "s", "prototype": {"home_mobile": {"idx": 0}}}]
    with pytest.raises(TaskFormatError, match="action_timeout_ms"):
        load_task(_task(tmp_path / "a", wf, meta={"action_timeout_ms": 10**6}))
    with pytest.raises(TaskFormatError, match="bbox"):
        load_task(_task(tmp_path / "b", wf, comps=[{"name": "x", "bbox": [0, 0, 0, 5]}]))
    (tmp_path / "c").mkdir()
    with pytest.raises(TaskFormatError, match="workflow.json: missing"):
        load_task(tmp_path / "c")
    site = tmp_path / "site"
    site.mkdir()
    with pytest.raises(TaskFormatError, match="no start.json and no index.html"):
        load_start(site)
    (site / "start.json").write_text(json.dumps({"command": [], "ready_timeout_s": 5}))
    with pytest.raises(TaskFormatError, match="command"):
        load_start(site)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "stages.vision2web.verify", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_cli_bad_inputs_exit_2_nothing_written(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("<p>hi</p>")
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "R.json"
    r = _cli("--task", empty, "--site", site, "--out", out)
    assert r.returncode == 2 and "workflow.json: missing" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not out.exists()
    r = _cli("--task", empty, "--site", site, "--out", tmp_path)
    assert r.returncode == 2 and "is a directory" in r.stderr
    r = _cli("--task", empty, "--site", site, "--out", site / "R.json")
    assert r.returncode == 2 and "must not be inside" in r.stderr and not (site / "R.json").exists()


def test_cli_malformed_prototype_and_bad_deadline_exit_2(tmp_path):
    d = _task(tmp_path, [{"summary": "s", "prototype": {"home_mobile": {"idx": 0}}}])
    (d / "prototypes" / "home_mobile.png").write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("<p>hi</p>")
    out = tmp_path / "R.json"
    r = _cli("--task", d, "--site", site, "--out", out)
    assert r.returncode == 2 and "home_mobile.png: not a readable PNG/JPEG image" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr and not out.exists()
    Image.fromarray(np.zeros((20, 30, 3), np.uint8)).save(d / "prototypes" / "home_mobile.png")
    r = _cli("--task", d, "--site", site, "--out", out, "--deadline-s", "0.5")
    assert r.returncode == 2 and "--deadline-s" in r.stderr and not out.exists()


def test_prose_steps_and_jpeg_prototypes_are_accepted(tmp_path):
    d = tmp_path / "task"
    (d / "prototypes").mkdir(parents=True)
    Image.fromarray(np.full((12, 16, 3), 200, np.uint8)).save(d / "prototypes" / "desktop.jpg")
    (d / "workflow.json").write_text(json.dumps([{"summary": "s", "prototype": {"desktop": {"idx": 1}}, "content": [
        {"objective": "o", "actions": [{"op": "nl", "text": "click the buy button"}],
         "validations": [{"op": "nl", "text": "the cart shows one item"}]}]}]))
    t = load_task(d)
    assert t.prototypes["desktop"].suffix == ".jpg" and t.n_counted_cases() == 1
    assert t.workflows[0].content[0].actions[0].text == "click the buy button"


def test_oversized_or_deep_json_is_one_line_error(tmp_path):
    d = _task(tmp_path, [])
    (d / "workflow.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(TaskFormatError) as err:
        load_task(d)
    assert "\n" not in str(err.value) and "workflow.json" in str(err.value)


def test_generator_deterministic_and_valid(tmp_path):
    from stages.vision2web.sitegen import VISUAL_BUGS, bug_viewports

    for level in ("L1", "L2", "L3"):
        a, b = make_spec(level, 3, 1), make_spec(level, 3, 1)
        assert a == b and make_spec(level, 4, 1) != a
        from stages.vision2web.schema import Workflow

        wfs = [Workflow.model_validate(w) for w in workflows(a)]
        assert [w.resolution.width for w in wfs] == [1280, 768, 390]
        for name, bugs in BUG_AFFECTS.get(level, {}).items():
            if bugs != "all":
                assert max(bugs) < len(wfs[0].content), name
        render_site(a, tmp_path / level, {"color_shift"})
        html = (tmp_path / level / "index.html").read_text()
        assert "<html>" in html and ("@media" in html)
        assert (tmp_path / level / "start.json").exists() == (level == "L3")
        with pytest.raises(ValueError, match="do not apply"):
            render_site(a, tmp_path / f"x{level}", {"no_such_bug"})
    # equal exposure: every visual bug at every viewport, layout bugs at exactly one each
    assert sorted(v for b in VISUAL_BUGS if b.startswith("layout_") for v in bug_viewports(b)) == sorted(
        ["desktop", "tablet", "mobile"])
    assert all(len(bug_viewports(b)) == 3 for b in VISUAL_BUGS if not b.startswith("layout_"))


@pytest.mark.parametrize("seed", range(12))
def test_tested_totals_keep_their_cents_and_the_remaining_items_are_checked(seed):
    spec = make_spec("L2", seed, seed % 3)
    a, b, c = (spec["items"][i]["price"] for i in range(3))
    assert round(100 * (a + b + c)) % 100 != 0 and round(100 * (a + c)) % 100 != 0
    cases = workflows(spec)[0]["content"]
    assert [v["value"] for v in cases[4]["validations"] if v["op"] == "text_contains"] == [f"${a + b + c:.2f}"]
    assert {"op": "text_contains", "selector": "[data-testid=cart-total]", "value": f"${a + c:.2f}"} \
        in cases[5]["validations"]


def _rows_after(validations, remaining: list[str], all_names: list[str]) -> bool:
    """Evaluate a remove/delete case's validations on a list of remaining row names (brute force: a row selector
    ':has-text("X")' matches the rows whose name contains X; count/hidden as the verifier defines them)."""
    import re

    ok = True
    for v in validations:
        m = re.search(r':has-text\("(.+)"\)', v.get("selector", ""))
        rows = [r for r in remaining if m is None or m.group(1) in r]
        if v["op"] == "count":
            ok &= len(rows) == v["equals"]
        elif v["op"] == "hidden":
            ok &= not rows
    return ok


@pytest.mark.parametrize("level", ["L2", "L3"])
@pytest.mark.parametrize("seed", range(6))
def test_only_the_correct_removal_passes_the_remove_case(level, seed):
    """Three added, the middle one removed: removing the last, the first, a neighbour or nothing leaves a row
    list on which the case fails; removing the clicked one passes (issue 49: 'deletes the wrong item')."""
    spec = make_spec(level, seed, 0)
    names = [it["name"] for it in spec["items"][:3]] if level == "L2" else list(spec["notes"])
    assert len(set(names)) == 3 and not any(x in y for x in names for y in names if x != y)
    case = workflows(spec)[0]["content"][5]
    counts = [v for v in case["validations"] if v["op"] in ("count", "hidden")]
    variants = {"correct": [names[0], names[2]], "last": names[:2], "first": names[1:], "none": names,
                "both_ends": [names[1]]}
    assert _rows_after(counts, variants.pop("correct"), names)
    for what, remaining in variants.items():
        assert not _rows_after(counts, remaining, names), what
