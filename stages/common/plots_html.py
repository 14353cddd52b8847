"""`dvc plots show`, rendered so that it works offline: DVC's own HTML loads vega from a CDN, so
this takes DVC's plot specs (`dvc plots show --json`: vega-lite with the data inlined, and image
plots), renders every vega-lite spec to SVG with vl-convert (vega bundled in the wheel) and writes
one self-contained HTML page (SVGs inline, images as data URIs).

    python -m stages plots            # -> dvc_plots/index.html (what `make plots` runs)
"""
from __future__ import annotations

import base64
import html
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from stages.common.config import ConfigError
from stages.common.paths import ROOT, atomic_write_text


def dvc_plot_specs(root: Path = ROOT, targets: list[str] | None = None) -> dict[str, list[dict[str, Any]]]:
    res = subprocess.run([sys.executable, "-m", "dvc", "plots", "show", "--json", *(targets or [])], cwd=root,
                         capture_output=True, text=True)
    if res.returncode != 0:
        raise ConfigError(f"dvc plots show failed: {(res.stderr or res.stdout).strip().splitlines()[-1]}")
    return json.loads(res.stdout).get("data", {})


def render_html(specs: dict[str, list[dict[str, Any]]], root: Path = ROOT) -> str:
    import vl_convert as vlc

    sections: dict[str, list[str]] = {}
    for path, entries in sorted(specs.items()):
        slug = path.split("/")[1] if path.startswith("reports/") else path
        for entry in entries:
            if entry.get("type") == "vega":
                svg = vlc.vegalite_to_svg(entry["content"])
                body = svg
            elif entry.get("type") == "image":
                img = Path(entry.get("url", ""))
                img = img if img.is_absolute() else root / path
                if not img.is_file():
                    continue
                data = base64.b64encode(img.read_bytes()).decode()
                body = f'<img src="data:image/png;base64,{data}" alt="{html.escape(path)}">'
            else:
                continue
            n = sum(len(v) for v in sections.values())
            sections.setdefault(slug, []).append(
                f'<figure id="fig{n}"><figcaption>{html.escape(path)} '
                f'<a href="#fig{n}" class="open" title="full width">⤢</a></figcaption>{body}</figure>')
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>DVC plots</title>",
             "<style>body{font-family:sans-serif;margin:1em 2em} figure{display:inline-block;"
             "vertical-align:top;margin:.5em;border:1px solid #ddd;padding:.5em;max-width:45%} "
             "figure svg,figure img{max-width:100%;height:auto;cursor:zoom-in} figcaption{font-size:12px;color:#555} "
             "figure:target{display:block;max-width:none;width:auto} figure:target svg,figure:target img"
             "{max-width:100%;width:100%;cursor:default} nav{column-count:4;font-size:14px;margin-bottom:1em} "
             "nav a{display:block}</style></head><body><h1>DVC plots (workspace)</h1>",
             "<p>One section per paper; click ⤢ (or a figure) to show it at full width.</p><nav>"]
    parts += [f"<a href='#{html.escape(slug)}'>{html.escape(slug)} ({len(figs)})</a>" for slug, figs in sections.items()]
    parts.append("</nav>")
    for slug, figs in sections.items():
        parts.append(f"<h2 id='{html.escape(slug)}'>{html.escape(slug)} <a href='#' style='font-size:12px'>top</a></h2>")
        parts.extend(figs)
    parts.append("<script>document.querySelectorAll('figure').forEach(f=>f.addEventListener('click',e=>{"
                 "if(e.target.tagName!=='A'){location.hash=f.id}}))</script></body></html>")
    return "\n".join(parts)


def write_plots_html(out: Path | None = None, root: Path = ROOT, slugs: list[str] | None = None) -> Path:
    """The page for every paper, or only `slugs` (their plot CSVs and figures)."""
    out = Path(out) if out is not None else root / "dvc_plots" / "index.html"
    targets = None
    if slugs:
        targets = [str(p.relative_to(root)) for slug in slugs
                   for p in sorted((root / "reports" / slug / "plots").glob("*.csv"))]
        targets += [f"reports/{slug}/figures" for slug in slugs]
    atomic_write_text(out, render_html(dvc_plot_specs(root, targets), root))
    return out
