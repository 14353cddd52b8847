"""Judge calibration against the paper's rubric: controlled perturbations with expected scores.

The rubric (official VISUAL_PROMPT as summarised in the paper card, steps between its anchors read
by us): 1 = identical; .75 = minor (< 2 px misalignment, a minor typo, a slight colour variation);
.5 = noticeable (a clearly shifted component, another font, a clearly different colour); .25 = major
(a component far out of place or resized); 0 = missing. ``PERTURBATIONS`` renders each case on a
reference page in Chromium (prepare stage): one component of a prototype page is changed by CSS/JS,
the page is screenshot, and the (prototype, screenshot, component) triple is labelled with the
expected score from params (``papers.vision2web.prepare.calibration.targets``).

    python -m stages.vision2web.calibrate [--prepare DIR]    # fit on the training split, print params

The fit: least squares of the expected score on [1, features] (judge.FEATURES) over the training
split's labelled components; the weights go into params.yaml (papers.vision2web.evaluate.judge.weights)
before the run, and the evaluate stage reports the error of those weights on the held-out split (and
refits on the training split to check that params are current).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

# perturbation -> (CSS applied to the target component, JS on the target or None, targets allowed)
# targets are the data-v2w component names of an L1 home page: header, hero, card-<i>, footer
CHROMATIC = ("header", "hero", "card-0", "card-1")
ANY = ("header", "hero", "card-0", "card-1", "footer")
TEXTUAL = ("header", "hero", "card-0", "card-1", "footer")
PERTURBATIONS: dict[str, tuple[str, str | None, tuple[str, ...]]] = {
    "identity": ("", None, ANY),
    "shift_1px": ("transform:translate(1px,1px)", None, ANY),
    "typo": ("", "typo", TEXTUAL),
    "color_slight": ("filter:hue-rotate(14deg)", None, CHROMATIC),
    "shift_4px": ("transform:translate(4px,3px)", None, ANY),
    "font_serif": ("font-family:'DejaVu Serif',serif !important", None, TEXTUAL),
    "color_large": ("filter:hue-rotate(180deg)", None, CHROMATIC),
    "shift_far": ("transform:translate(40px,24px)", None, ANY),
    "resized": ("transform:scale(1.5);transform-origin:0 0", None, ANY),
    "missing": ("visibility:hidden !important", None, ANY),
}

# JS: change one letter of the first text node with >= 4 letters inside the component
TYPO_JS = """(sel) => { const root = document.querySelector(sel); if (!root) return false;
  const w = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  while (w.nextNode()) { const t = w.currentNode.nodeValue; const m = t.match(/[a-z]{4,}/);
    if (m) { const i = m.index + 2; const c = t[i] === 'e' ? 'a' : 'e';
      w.currentNode.nodeValue = t.slice(0, i) + c + t.slice(i + 1); return true; } }
  return false; }"""


def css_for(pert: str, component: str) -> str:
    css, _, _ = PERTURBATIONS[pert]
    if not css:
        return ""
    sel = f'[data-v2w="{component}"]'
    if pert == "font_serif":
        return f"{sel}, {sel} * {{{css}}}"
    return f"{sel} {{{css}}}"


def plan(pages: list[str], perturbations: list[str]) -> list[tuple[str, str, str]]:
    """(page, perturbation, component): each page gets every perturbation once, the target component
    rotating over the perturbation's allowed components (deterministic)."""
    out = []
    for p_i, page in enumerate(pages):
        for k, pert in enumerate(perturbations):
            allowed = PERTURBATIONS[pert][2]
            out.append((page, pert, allowed[(p_i + k) % len(allowed)]))
    return out


def fit_weights(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares of y on [1, X] (bias first)."""
    A = np.concatenate([np.ones((len(X), 1)), X], axis=1)
    w, *_ = np.linalg.lstsq(A, y, rcond=None)
    return w


def errors(pred: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Mean absolute error, share of exact agreements and of errors > .25 (more than one rubric step)."""
    d = np.abs(pred - y)
    return {"mae": float(d.mean()), "exact": float((d < 1e-9).mean()), "off_by_more_than_one_step": float((d > 0.25 + 1e-9).mean()),
            "n": int(len(y))}


def load_features(prepare_dir: Path, device, mapping, rec=None) -> list[dict[str, Any]]:
    """Each labelled calibration sample with its target component's features (judge.component_features)."""
    from stages.vision2web.browser import png_to_array
    from stages.vision2web.judge import component_features
    from stages.vision2web.schema import Component

    cal = prepare_dir / "calibration"
    labels = json.loads((cal / "labels.json").read_text())
    refs: dict[str, Any] = {}
    items, rows = [], []
    for lab in labels:
        if lab["page"] not in refs:
            comps = json.loads((cal / "ref" / f"{lab['page']}.components.json").read_text())
            refs[lab["page"]] = (png_to_array((cal / "ref" / f"{lab['page']}.png").read_bytes()),
                                 [Component.model_validate(c) for c in comps])
        proto, comps = refs[lab["page"]]
        items.append((proto, png_to_array((cal / lab["file"]).read_bytes()), comps))
        rows.append(lab)
    out = []
    for start in range(0, len(items), 16):   # batches of 16 screenshots per kernel call
        feats = component_features(items[start:start + 16], device, mapping, rec)
        for lab, comps in zip(rows[start:start + 16], feats):
            hit = [c for c in comps if c["name"] == lab["component"]]
            if hit:
                out.append({**lab, "features": hit[0]["features"]})
    return out


def fit_from_samples(samples: list[dict[str, Any]]) -> np.ndarray:
    train = [s for s in samples if s["split"] == "train"]
    X = np.array([s["features"] for s in train], dtype=np.float64)
    y = np.array([s["expected"] for s in train], dtype=np.float64)
    return fit_weights(X, y)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stages.vision2web.calibrate", description=__doc__.splitlines()[0])
    ap.add_argument("--prepare", type=Path, default=None, help="prepare output (default data/vision2web/prepare)")
    args = ap.parse_args(argv)
    import torch

    from stages.common.paths import ROOT
    from stages.vision2web.judge import FEATURES, Mapping, quantize, raw_score
    from stages.vision2web.verify import default_mapping

    prep = args.prepare or ROOT / "data" / "vision2web" / "prepare"
    if not (prep / "calibration" / "labels.json").is_file():
        print(f"error: {prep}/calibration/labels.json: missing (run `python -m stages prepare vision2web`)", file=sys.stderr)
        return 2
    cur = default_mapping()
    samples = load_features(prep, torch.device("cpu"), cur)
    w = fit_from_samples(samples)
    m = Mapping(tuple(float(x) for x in w), cur.fine, cur.coarse)
    for split in ("train", "test"):
        S = [s for s in samples if s["split"] == split]
        pred = quantize(raw_score(np.array([s["features"] for s in S]), m))
        print(f"# {split}: {errors(pred, np.array([s['expected'] for s in S]))}")
    print("# papers.vision2web.evaluate.judge.weights (bias, " + ", ".join(FEATURES) + "):")
    print("weights: [" + ", ".join(f"{x:.6g}" for x in w) + "]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
