"""The official Vision2Web task layout (zai-org/Vision2Web datasets/) through the real loader, on a small
fixture built here in that layout: levels from folder names, .jpg prototypes, default resolution, prose steps,
validation-less cases out of FS, resources copied without symlinks; bad layouts are one-line errors."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from stages.vision2web.official import LEVEL_DIRS, load_official
from stages.vision2web.schema import TaskFormatError

pytestmark = pytest.mark.real_source


def official_fixture(root: Path) -> Path:
    """datasets/{webpage,frontend,website}/<task>/ as the official README describes them."""
    ds = root / "datasets"
    rng = np.random.default_rng(0)

    def jpg(path: Path, h: int, w: int):
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (h, w, 3)).astype(np.uint8)).save(path, quality=90)

    # L1: static page, three device prototypes, no test cases (scripted screenshots only)
    t1 = ds / "webpage" / "portfolio_001"
    for dev, (w, h) in {"desktop": (64, 40), "tablet": (40, 52), "mobile": (24, 50)}.items():
        jpg(t1 / "prototypes" / f"{dev}.jpg", h, w)
    (t1 / "workflow.json").write_text(json.dumps([
        {"summary": f"{dev} view", "resolution": {"width": w, "height": 600},
         "prototype": {dev: {"idx": 0, "fullpage": True}}, "content": []}
        for dev, w in (("desktop", 1280), ("tablet", 768), ("mobile", 390))]))
    (t1 / "resources").mkdir()
    (t1 / "resources" / "logo.png").write_bytes(b"\x89PNG fake logo")
    (t1 / "resources" / "link").symlink_to("/etc/passwd")
    # L2: a prompt, prose steps, no resolution (-> 1024 x 768), a validation-less case
    t2 = ds / "frontend" / "shop_007"
    jpg(t2 / "prototypes" / "home.jpg", 30, 48)
    jpg(t2 / "prototypes" / "cart.jpg", 30, 48)
    (t2 / "prompt.txt").write_text("A small shop with a cart.")
    (t2 / "workflow.json").write_text(json.dumps([
        {"summary": "buy", "prototype": {"home": {"idx": 0}, "cart": {"idx": 2}}, "content": [
            {"objective": "Add an item", "actions": ["Click 'Add to cart' on the first product"],
             "validations": ["The cart badge shows 1"]},
            {"objective": "Look around", "actions": ["Scroll to the footer"], "validations": []},
        ]}]))
    # L3: a PRD
    t3 = ds / "website" / "notes_003"
    jpg(t3 / "prototypes" / "login.jpg", 20, 32)
    (t3 / "prd.md").write_text("# Notes app\nRegister, log in, CRUD notes.")
    (t3 / "workflow.json").write_text(json.dumps([
        {"summary": "auth", "resolution": {"width": 1440, "height": 900}, "prototype": {"login": {"idx": 1}},
         "content": [{"objective": "Register", "actions": ["Fill the form and submit"],
                      "validations": ["The board greets the new user"]}]}]))
    return ds


def test_official_layout_fixture(tmp_path):
    ds = official_fixture(tmp_path)
    tasks = load_official(ds, tmp_path / "out")
    assert [t.root.name for t in tasks] == ["L1_portfolio_001", "L2_shop_007", "L3_notes_003"]
    assert [t.meta.level for t in tasks] == ["L1", "L2", "L3"] and LEVEL_DIRS["frontend"] == "L2"
    t1, t2, t3 = tasks
    assert sorted(t1.prototypes) == ["desktop", "mobile", "tablet"]
    assert all(p.suffix == ".jpg" for p in t1.prototypes.values()) and t1.n_counted_cases() == 0
    assert [w.resolution.width for w in t1.workflows] == [1280, 768, 390]
    assert (t1.root / "resources" / "logo.png").exists() and not (t1.root / "resources" / "link").exists()
    wf = t2.workflows[0]
    assert (wf.resolution.width, wf.resolution.height) == (1024, 768)            # official default
    assert wf.prototype["cart"].idx == 2 and wf.prototype["home"].fullpage is True
    assert wf.content[0].actions[0].op == "nl" and wf.content[0].validations[0].text == "The cart badge shows 1"
    assert t2.n_counted_cases() == 1                                              # validation-less case not in FS
    assert (t2.root / "prompt.txt").read_text() == "A small shop with a cart."
    assert (t3.root / "prd.md").exists() and t3.workflows[0].resolution.width == 1440
    assert load_official(ds, tmp_path / "out2", max_tasks_per_level=1)[0].root.name == "L1_portfolio_001"


def test_official_layout_errors_are_one_line(tmp_path):
    with pytest.raises(TaskFormatError, match="does not exist"):
        load_official(tmp_path / "nope", tmp_path / "o1")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TaskFormatError, match="expected the official datasets"):
        load_official(tmp_path / "empty", tmp_path / "o2")
    bad = tmp_path / "ds" / "frontend" / "t"
    (bad / "prototypes").mkdir(parents=True)
    (bad / "workflow.json").write_text(json.dumps([{"summary": "s", "content": [{"objective": "o", "actions": [3]}]}]))
    with pytest.raises(TaskFormatError) as err:
        load_official(tmp_path / "ds", tmp_path / "o3")
    assert "content.0.actions.0" in str(err.value) and "\n" not in str(err.value)


def test_official_task_runs_through_the_verifier(tmp_path):
    """A converted official task is verified like any other: the prose case is Blocked (an LLM verifier
    would be needed), the prototypes are judged."""
    from stages.vision2web.browser import browser_available

    if not browser_available():
        pytest.skip("needs Debian's chromium (apt-get install chromium) and the playwright package")
    import asyncio

    import torch

    from stages.vision2web.browser import browser_session
    from stages.vision2web.judge import Mapping
    from stages.vision2web.verify import browse, judge_raw

    task = load_official(official_fixture(tmp_path), tmp_path / "out")[1]
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("<h1>shop</h1>")

    async def go():
        async with browser_session() as browser:
            return await browse(task, site, browser, deadline_s=60)

    raw = asyncio.run(go())
    res = judge_raw(task, raw, torch.device("cpu"), Mapping())
    cases = res["workflows"][0]["cases"]
    assert [c["result"] for c in cases] == ["Blocked", "Blocked"] and "natural-language" in cases[0]["detail"]
    assert res["FS"] == 0.0 and set(res["workflows"][0]["prototypes"]) == {"home", "cart"}
