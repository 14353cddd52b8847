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
