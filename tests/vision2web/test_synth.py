"""The program-synthesis agent's measurements on hand-built images, its request parsing through the adapter's
own message format, what it writes (no browser); the calibration fit and plan by hand."""
from __future__ import annotations

import json
import py_compile

import numpy as np
import pytest
from PIL import Image

from stages.vision2web import synth
from stages.vision2web.agents import OpenAICompatibleAgent, TaskInputs
from stages.vision2web.calibrate import PERTURBATIONS, css_for, errors, fit_weights, plan
from stages.vision2web.sitegen import make_spec, prompt_text, workflows

HDR, HERO, BG, FOOT, INK = (30, 80, 60), (250, 210, 220), (245, 252, 250), (34, 34, 34), (255, 255, 255)


def _page(w=200, h=160):
    img = np.zeros((h, w, 3), np.uint8)
    img[:20] = HDR
    img[20:60] = HERO
    img[60:140] = BG
    img[140:] = FOOT
    img[6:14, 10:50] = INK              # brand ink: rows 6-13
    img[8:13, 150:190] = INK            # nav ink
    img[30:42, 12:90] = HDR             # hero title (header colour)
    img[46:52, 12:120] = (34, 34, 34)   # hero text
    img[146:152, 12:70] = (238, 238, 238)
    return img


def test_runs_bands_and_text_lines_by_hand():
    line = np.array([[1, 1, 1]] * 3 + [[2, 2, 2]] * 2 + [[1, 1, 1]])
    assert synth._runs(line) == [(0, 3, (1, 1, 1)), (3, 5, (2, 2, 2)), (5, 6, (1, 1, 1))]
    img = _page()
    bs = synth.bands(img)
    assert [(b.top, b.bottom, b.color) for b in bs] == [(0, 20, HDR), (20, 60, HERO), (60, 140, BG), (140, 160, FOOT)]
    pm = synth.measure_page(img, with_hero=True)
    assert pm.hero.top == 20 and pm.footer.top == 140 and pm.body_bg == BG
    assert [(ln.top, ln.bottom, ln.left) for ln in pm.header_lines] == [(6, 14, 10)]
    segs = synth.segments(img, pm.header_lines[0], HDR)
    assert [(s.left, s.right) for s in segs] == [(10, 50), (150, 190)]
    assert [(ln.top, ln.bottom, ln.color) for ln in pm.hero_lines] == [(30, 42, HDR), (46, 52, (34, 34, 34))]


@pytest.mark.parametrize("h,text,want", [(16, "Blue Garden", 21), (22, "happy", round(22 / (0.76 + 0.24))),
                                         (11, "ooo", 20), (15, "$74.15", round(15 / 0.89)), (3, "x", 8)])
def test_font_size_from_ink_height(h, text, want):
    assert synth.font_px(h, text) == want


def test_find_cards_grid_by_hand():
    img = np.zeros((120, 220, 3), np.uint8)
    img[:] = BG
    for k, x in enumerate((10, 80, 150)):           # 3 cards of 60 px, gap 10, border (221,221,221)
        img[10:70, x:x + 60] = (221, 221, 221)
        img[11:69, x + 1:x + 59] = 255
        img[16:36, x + 6:x + 54] = (10 * k, 100, 200)  # swatch
    cards = synth.find_cards(img, 0, 120, BG)
    assert [(c.left, c.right, c.top, c.bottom) for c in cards] == [(10, 70, 10, 70), (80, 140, 10, 70),
                                                                   (150, 210, 10, 70)]
    assert [c.swatch for c in cards] == [(0, 100, 200), (10, 100, 200), (20, 100, 200)]
    assert cards[0].swatch_top == 16 and cards[0].swatch_h == 20 and cards[0].border == (221, 221, 221)
    assert synth._gaps(cards) == (3, 10, 10)


def _task_dir(tmp_path, level: str, seed: int = 5):
    spec = make_spec(level, seed, 0)
    d = tmp_path / level
    (d / "prototypes").mkdir(parents=True)
    (d / ("prd.md" if level == "L3" else "prompt.txt")).write_text(prompt_text(spec))
    wf = workflows(spec)
    (d / "workflow.json").write_text(json.dumps(wf))
    for w in wf:
        for name in w["prototype"]:
            Image.fromarray(_page(w["resolution"]["width"], 300)).save(d / "prototypes" / f"{name}.png")
    return spec, d


def test_request_parsing_round_trips_the_adapter_messages(tmp_path):
    spec, d = _task_dir(tmp_path, "L2")
    req = synth.parse_request(OpenAICompatibleAgent("http://x", "m").messages(TaskInputs(d)))
    assert req.copy["site_name"] == spec["name"] and req.copy["about_title"] == spec["about_title"]
    assert [it["name"] for it in req.copy["items"]] == [it["name"] for it in spec["items"]]
    assert req.copy["items"][0]["price"] == f"${spec['items'][0]['price']:.2f}"
    assert req.workflow == workflows(spec)
    assert sorted(req.images) == sorted(n for w in workflows(spec) for n in w["prototype"])
    assert req.images["home_mobile"].shape == (300, 390, 3)
    assert synth.archetype(req) == "L2"


@pytest.mark.parametrize("level", ["L1", "L2", "L3"])
def test_synthesis_writes_every_tested_id_and_a_runnable_backend(tmp_path, level):
    spec, d = _task_dir(tmp_path, level)
    msgs = OpenAICompatibleAgent("http://x", "m").messages(TaskInputs(d))
    reply = synth.SynthesisModel("infer")(msgs)
    out = tmp_path / f"site_{level}"
    written = OpenAICompatibleAgent.write_files(reply, out)
    assert "index.html" in written
    html = (out / "index.html").read_text()
    import re

    for t in synth.testids(workflows(spec)):
        dyn = re.match(r"^(.+-)\d+$", t)                  # ids of repeated items are built in JS: prefix-<i>
        assert (dyn.group(1) if dyn and t not in html else t) in html, t
    assert spec["name"] in html and "@media" in html
    if level == "L3":
        assert sorted(written) == ["index.html", "server.py", "start.json"]
        py_compile.compile(str(out / "server.py"), doraise=True)
        assert json.loads((out / "start.json").read_text())["command"][:2] == ["{python}", "server.py"]


def test_template_mode_ignores_the_images_and_infer_mode_reads_them(tmp_path):
    _, d = _task_dir(tmp_path, "L1")
    msgs = OpenAICompatibleAgent("http://x", "m").messages(TaskInputs(d))
    for png in (d / "prototypes").glob("*.png"):
        Image.fromarray(255 - np.asarray(Image.open(png))).save(png)     # other pixels, same task
    msgs2 = OpenAICompatibleAgent("http://x", "m").messages(TaskInputs(d))
    assert synth.SynthesisModel("template")(msgs) == synth.SynthesisModel("template")(msgs2)
    assert synth.SynthesisModel("infer")(msgs) != synth.SynthesisModel("infer")(msgs2)
    with pytest.raises(ValueError):
        synth.SynthesisModel("oracle")


# ---------------------------------------------------------------- calibration


def test_fit_weights_recovers_exact_linear_data_and_errors_by_hand():
    rng = np.random.default_rng(3)
    X = rng.random((20, 6))
    w = np.array([0.7, -0.2, 0.5, -1.3, 0.25, 2.0, -0.6])
    y = w[0] + X @ w[1:]
    np.testing.assert_allclose(fit_weights(X, y), w, atol=1e-10)
    e = errors(np.array([1.0, 0.5, 0.0, 0.25]), np.array([1.0, 0.75, 0.5, 0.25]))
    assert e == {"mae": pytest.approx(0.75 / 4), "exact": 0.5, "off_by_more_than_one_step": 0.25, "n": 4}


def test_plan_rotates_components_and_css_targets_one_component():
    pages = ["p0", "p1", "p2"]
    perts = ["identity", "color_large", "font_serif"]
    got = plan(pages, perts)
    assert len(got) == 9 and [g[:2] for g in got[:3]] == [("p0", "identity"), ("p0", "color_large"), ("p0", "font_serif")]
    for page, pert, comp in got:
        assert comp in PERTURBATIONS[pert][2]
    assert {c for p, pe, c in got if pe == "color_large"} <= {"header", "hero", "card-0", "card-1"}
    assert len({c for _, pe, c in got if pe == "identity"}) == 3          # rotates over pages
    assert css_for("missing", "hero") == '[data-v2w="hero"] {visibility:hidden !important}'
    assert css_for("font_serif", "footer").startswith('[data-v2w="footer"], [data-v2w="footer"] * {')
    assert css_for("identity", "hero") == ""
