"""Deterministic visual judge: per-component 0/.25/.5/.75/1 rubric from segmented image statistics.

The paper's VLM judge segments the prototype into components and scores each on
{0, .25, .5, .75, 1} (1 = identical, .75 = <2 px misalignment / minor typo, 0 = missing). Here the
components come with the prototype (prototypes/<name>.components.json, painted in order into an
id map; absent -> the whole image is one component), the agent's screenshot is cropped/padded to
the prototype's size (padding = black, i.e. missing content), and the kernel
kernels/segmented_compare.py returns per-component sums from which the mean absolute difference
(MAD, in [0, 1]) and a per-component SSIM (from the moments) are read. Rubric (defaults):

    1    MAD <= 0.005 and SSIM >= 0.98
    .75  MAD <= 0.03  and SSIM >= 0.90
    .5   MAD <= 0.08  and SSIM >= 0.60
    .25  MAD <= 0.20  and SSIM >= 0.25
    0    otherwise (missing or unrelated)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from kernels.segmented_compare import segmented_compare
from stages.vision2web.schema import Component

RUBRIC = (1.0, 0.75, 0.5, 0.25)


@dataclass(frozen=True)
class Thresholds:
    mad: tuple[float, float, float, float] = (0.005, 0.03, 0.08, 0.20)
    ssim: tuple[float, float, float, float] = (0.98, 0.90, 0.60, 0.25)


def component_map(h: int, w: int, comps: list[Component] | None) -> tuple[np.ndarray, list[str]]:
    """(H, W) int32 id map; -1 = not part of any component (not scored). Later components paint
    over earlier ones (children after parents)."""
    seg = np.full((h, w), -1, dtype=np.int32)
    if comps is None:
        seg[:] = 0
        return seg, ["page"]
    names = []
    for k, c in enumerate(comps):
        x, y, cw, ch = c.bbox
        seg[min(y, h):min(y + ch, h), min(x, w):min(x + cw, w)] = k
        names.append(c.name)
    return seg, names


def fit(actual: np.ndarray | None, h: int, w: int) -> np.ndarray:
    """The agent screenshot cropped/padded (black) to the prototype's size; None -> all black."""
    out = np.zeros((h, w, 3), dtype=np.uint8)
    if actual is not None:
        ah, aw = min(h, actual.shape[0]), min(w, actual.shape[1])
        out[:ah, :aw] = actual[:ah, :aw]
    return out


def stats_to_mad_ssim(stats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(…, 7) int64 sums -> (MAD, SSIM, count). SSIM: the global SSIM of the component's samples."""
    s = stats.double()
    n = s[..., 0].clamp(min=1)
    mad = s[..., 1] / n / 255.0
    mp, ma = s[..., 2] / n, s[..., 3] / n
    vp = s[..., 4] / n - mp * mp
    va = s[..., 5] / n - ma * ma
    cov = s[..., 6] / n - mp * ma
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    # ALGO: SSIM (Wang et al. 2004) from first and second moments, one window = the component
    ssim = ((2 * mp * ma + c1) * (2 * cov + c2)) / ((mp * mp + ma * ma + c1) * (vp + va + c2))
    return mad, ssim, stats[..., 0]


def rubric(mad: float, ssim: float, th: Thresholds = Thresholds()) -> float:
    # ALGO: VISUAL_PROMPT rubric, score in {0, .25, .5, .75, 1}
    for score, m, s in zip(RUBRIC, th.mad, th.ssim):
        if mad <= m and ssim >= s:
            return score
    return 0.0


def _pool(img: np.ndarray, s: int) -> np.ndarray:
    """s x s area mean (rounded) of an (H, W, ...) array cropped to multiples of s."""
    h, w = img.shape[0] // s * s, img.shape[1] // s * s
    x = img[:h, :w].reshape(h // s, s, w // s, s, *img.shape[2:]).astype(np.float32).mean(axis=(1, 3))
    return np.rint(x).astype(np.uint8)


def judge_batch(items: list[tuple[np.ndarray, np.ndarray | None, list[Component] | None]], device: torch.device,
                th: Thresholds = Thresholds(), rec=None, scale: int = 1) -> list[dict]:
    """Score prototypes vs screenshots: one kernel call over the batch (padded, padding ignored).
    scale > 1: both images are s x s area-averaged first (the id map takes each block's top-left id).

    items: (prototype RGB, actual RGB or None, components). Returns per item
    {"score": mean component score, "components": [{name, score, mad, ssim}]}."""
    if not items:
        return []
    H = max(p.shape[0] // scale for p, _, _ in items)
    W = max(p.shape[1] // scale for p, _, _ in items)
    B = len(items)
    proto = np.zeros((B, H, W, 3), dtype=np.uint8)
    act = np.zeros((B, H, W, 3), dtype=np.uint8)
    seg = np.full((B, H, W), -1, dtype=np.int32)
    names: list[list[str]] = []
    for b, (p, a, comps) in enumerate(items):
        h, w = p.shape[:2]
        s, nm = component_map(h, w, comps)
        pa = fit(a, h, w)
        if scale > 1:
            p, pa, s = _pool(p, scale), _pool(pa, scale), s[: h // scale * scale: scale, : w // scale * scale: scale]
            h, w = p.shape[:2]
        proto[b, :h, :w] = p
        act[b, :h, :w] = pa
        seg[b, :h, :w] = s
        names.append(nm)
    K = max(1, max(len(n) for n in names))
    tp, ta, ts = (torch.from_numpy(x).to(device) for x in (proto, act, seg))
    if rec is not None:
        stats = rec.call("segmented_compare", segmented_compare, tp, ta, ts, K)
    else:
        stats = segmented_compare(tp, ta, ts, K, backend="torch")
    mad, ssim, cnt = stats_to_mad_ssim(stats.cpu())
    out = []
    for b, nm in enumerate(names):
        comps = []
        for k, name in enumerate(nm):
            if int(cnt[b, k]) == 0:      # fully covered by later components: nothing to score
                continue
            m, s_ = float(mad[b, k]), float(ssim[b, k])
            score = 0.0 if items[b][1] is None else rubric(m, s_, th)
            comps.append({"name": name, "score": score, "mad": round(m, 6), "ssim": round(s_, 6)})
        mean = float(np.mean([c["score"] for c in comps])) if comps else 0.0
        out.append({"score": mean, "components": comps})
    return out
