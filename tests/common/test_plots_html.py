"""The offline `dvc plots` page: DVC's plot specs (as `dvc plots show --json` gives them) become one
self-contained HTML page with inline SVG charts and data-URI images — no network reference."""
from __future__ import annotations

import re

from stages.common.plots_html import render_html


def test_render_is_self_contained(tmp_path):
    img = tmp_path / "reports" / "demo" / "figures" / "f.png"
    img.parent.mkdir(parents=True)
    img.write_bytes(b"\x89PNG\r\n\x1a\nfake")
    spec = {"$schema": "https://vega.github.io/schema/vega-lite/v5.json", "mark": "line",
            "data": {"values": [{"step": 0, "loss": 2.5}, {"step": 1, "loss": 1.25}, {"step": 2, "loss": 0.75}]},
            "encoding": {"x": {"field": "step", "type": "quantitative"},
                         "y": {"field": "loss", "type": "quantitative"}}}
    page = render_html({"reports/demo/plots/loss.csv": [{"type": "vega", "revisions": ["workspace"], "content": spec}],
                        "reports/demo/figures/f.png": [{"type": "image", "revisions": ["workspace"],
                                                        "url": str(img)}]}, root=tmp_path)
    assert page.count("<svg") == 1 and "data:image/png;base64," in page
    assert "<h2 id='demo'>demo <a" in page and "<a href='#demo'>demo (2)</a>" in page  # table of contents
    assert 'figure:target' in page and 'href="#fig0"' in page  # a figure opens at full width
    external = [u for u in re.findall(r'(?:src|href)="(https?://[^"]+)"', page)]
    assert external == []  # renders offline (DVC's own page loads vega from a CDN)


def test_plots_page_of_one_paper_renders_in_chromium(tmp_path):
    """Issue 39: what a user sees — the offline page for one paper, screenshot by headless Chromium, has
    its table of contents and charts drawn (a blank or broken page is one colour)."""
    import shutil
    import subprocess

    import pytest
    from PIL import Image

    from stages.common.paths import ROOT
    from stages.common.plots_html import write_plots_html

    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian chromium is not installed (make system-deps)")
    slug = "cv_stability"
    page = write_plots_html(tmp_path / "index.html", ROOT, slugs=[slug])
    html_text = page.read_text()
    assert f"<a href='#{slug}'>{slug} (" in html_text and html_text.count("<svg") >= 1
    shot = tmp_path / "shot.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,1600",
                    f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120, check=False)
    img = Image.open(shot).convert("L")
    colours = len(set(img.getdata()))
    assert img.size == (1280, 1600) and colours > 20  # text and chart strokes, not a blank page
