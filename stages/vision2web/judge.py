"""Deterministic visual judge: per-component 0/.25/.5/.75/1 rubric from segmented image statistics,
with a mapping **calibrated** against the paper's rubric (calibrate.py).

The paper's VLM judge segments the prototype into components and scores each on
{0, .25, .5, .75, 1} (1 = identical, .75 = <2 px misalignment / minor typo, 0 = missing). Here the
components come with the prototype (prototypes/<name>.components.json, painted in order into an
id map; absent -> the whole image is one component), the agent's screenshot is cropped/padded to
the prototype's size (padding = black, i.e. missing content), and the kernel
kernels/segmented_compare.py returns per-component integer sums at two scales (``fine``: s x s area
means of the screenshots; ``coarse``: (coarse/fine)-blocks of the fine images). From the one-window SSIM of the component's
samples (Wang et al. 2004), the mean absolute difference MAD in [0, 1] and dlum = |mean(P) - mean(A)|
/ 255 (a colour/brightness shift), the features are

    changed                               1 if any fine sample differs (sum |P - A| > 0), else 0
    sqrt_dssim_fine, sqrt_dssim_coarse    sqrt(clip(1 - SSIM, 0, 1)) at each scale
    sqrt_mad_fine, sqrt_mad_coarse        sqrt(MAD) at each scale
    sqrt_dlum                             sqrt(dlum)

The coarse scale forgives 1-2 px misalignment that the fine scale sees; the two together separate
"shifted a little" from "different". The score is the fitted linear map of the features rounded to
the nearest rubric step and clipped to [0, 1]:

    score = clip(round(4 * (w0 + w . features)) / 4, 0, 1)

with w fitted by least squares on the training half of the calibration set (``calibrate.py``; the
weights live in params.yaml, papers.vision2web.evaluate.judge.weights). A component of a missing
screenshot scores 0.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from kernels.segmented_compare import segmented_compare
from stages.vision2web.schema import Component

RUBRIC = (0.0, 0.25, 0.5, 0.75, 1.0)
FEATURES = ("changed", "sqrt_dssim_fine", "sqrt_dssim_coarse", "sqrt_mad_fine", "sqrt_mad_coarse", "sqrt_dlum")


@dataclass(frozen=True)
class Mapping:
    """Judge mapping: bias + one weight per feature (FEATURES order), and the two scales."""
    weights: tuple[float, ...] = (1.0, 0.0, -0.5, -0.5, 0.0, 0.0, 0.0)   # placeholder; the pipeline reads params
    fine: int = 2
    coarse: int = 8

    def __post_init__(self):
        if len(self.weights) != 1 + len(FEATURES):
            raise ValueError(f"judge weights: need {1 + len(FEATURES)} numbers (bias + {', '.join(FEATURES)})")
        if not (1 <= self.fine <= self.coarse) or self.coarse % self.fine:
            raise ValueError("judge scales: need 1 <= fine <= coarse, coarse a multiple of fine")


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


def _pool(img: np.ndarray, s: int) -> np.ndarray:
    """s x s area mean (rounded half to even) of an (H, W, ...) uint8 array cropped to multiples of s."""
    h, w = img.shape[0] // s * s, img.shape[1] // s * s
    if s == 1:
        return img[:h, :w].copy()
    if h == 0 or w == 0:
        return np.zeros((h // s, w // s, *img.shape[2:]), dtype=np.uint8)
    x = torch.from_numpy(np.array(img[:h, :w], dtype=np.float32, copy=True))
    x = x.reshape(h, w, -1).permute(2, 0, 1)[None]                         # (1, C, H, W)
    # block sums of <= s*s uint8 values are exact in float32; / s^2 is one correctly rounded division
    t = torch.nn.functional.avg_pool2d(x, s, s)[0].permute(1, 2, 0)
    t = torch.round(t).to(torch.uint8).numpy()
    return t.reshape(h // s, w // s, *img.shape[2:])


def raw_score(feats: np.ndarray, mapping: Mapping) -> np.ndarray:
    """(…, len(FEATURES)) -> the mapping's unrounded score."""
    w = np.asarray(mapping.weights, dtype=np.float64)
    return w[0] + feats @ w[1:]


def quantize(raw: np.ndarray | float) -> np.ndarray:
    # ALGO: VISUAL_PROMPT rubric, score in {0, .25, .5, .75, 1}
    return np.clip(np.round(np.asarray(raw, dtype=np.float64) * 4) / 4, 0.0, 1.0)


class ProtoCache:
    """LRU of pooled prototypes and id maps, keyed by the caller (e.g. (task, prototype name)): the
    same prototype is judged for every agent."""

    def __init__(self, size: int = 64):
        from collections import OrderedDict

        self.size, self.data = size, OrderedDict()

    def get(self, key, make):
        if key is None:
            return make()
        if key in self.data:
            self.data.move_to_end(key)
            return self.data[key]
        value = self.data[key] = make()
        if len(self.data) > self.size:
            self.data.popitem(last=False)
        return value


def _pooled(p: np.ndarray, comps, mapping: Mapping):
    """(fine image, fine id map, coarse image, coarse id map, names). The coarse image is pooled from
    the fine one (coarse / fine blocks), the id maps take each block's top-left id."""
    h, w = p.shape[:2]
    seg, names = component_map(h, w, comps)
    k = mapping.coarse // mapping.fine
    pf = _pool(p, mapping.fine)
    sf = seg[: h // mapping.fine * mapping.fine: mapping.fine, : w // mapping.fine * mapping.fine: mapping.fine]
    pc = _pool(pf, k)
    sc = sf[: pf.shape[0] // k * k: k, : pf.shape[1] // k * k: k]
    return pf, sf, pc, sc, names


def _batch_stats(imgs: list[tuple[np.ndarray, np.ndarray, np.ndarray]], K: int, device, rec):
    """One kernel call over (proto, actual, seg) triples padded to a common size (padding id -1)."""
    H = max(max(1, p.shape[0]) for p, _, _ in imgs)
    W = max(max(1, p.shape[1]) for p, _, _ in imgs)
    B = len(imgs)
    proto = np.zeros((B, H, W, 3), dtype=np.uint8)
    act = np.zeros((B, H, W, 3), dtype=np.uint8)
    seg = np.full((B, H, W), -1, dtype=np.int32)
    for b, (p, a, s) in enumerate(imgs):
        h, w = p.shape[:2]
        proto[b, :h, :w], act[b, :h, :w], seg[b, :h, :w] = p, a[:h, :w], s
    tp, ta, ts = (torch.from_numpy(x).to(device) for x in (proto, act, seg))
    if rec is not None:
        return rec.call("segmented_compare", segmented_compare, tp, ta, ts, K).cpu()
    return segmented_compare(tp, ta, ts, K, backend="torch").cpu()


def component_features(items: list[tuple[np.ndarray, np.ndarray | None, list[Component] | None]],
                       device: torch.device, mapping: Mapping = Mapping(), rec=None,
                       keys: list | None = None, cache: ProtoCache | None = None) -> list[list[dict]]:
    """Per item, per scorable component: {name, features (FEATURES order), count}. A component with no
    pixel at the fine scale (fully painted over) is skipped; at the coarse scale it falls back to the
    fine values. ``keys``/``cache``: reuse the pooled prototypes across calls."""
    if not items:
        return []
    cache = cache or ProtoCache(0)
    fine_imgs, coarse_imgs, names = [], [], []
    for i, (p, a, comps) in enumerate(items):
        pf, sf, pc, sc, nm = cache.get(keys[i] if keys else None, lambda p=p, comps=comps: _pooled(p, comps, mapping))
        af, _, ac, _, _ = _pooled(fit(a, *p.shape[:2]), None, mapping)
        fine_imgs.append((pf, af, sf))
        coarse_imgs.append((pc, ac, sc))
        names.append(nm)
    K = max(1, max(len(n) for n in names))
    fine = _batch_stats(fine_imgs, K, device, rec)
    coarse = _batch_stats(coarse_imgs, K, device, rec)
    mad_f, ssim_f, cnt_f = stats_to_mad_ssim(fine)
    mad_c, ssim_c, cnt_c = stats_to_mad_ssim(coarse)
    f64 = fine.double()
    n = f64[..., 0].clamp(min=1)
    dlum = ((f64[..., 2] - f64[..., 3]) / n).abs() / 255.0
    out = []
    for b, nm in enumerate(names):
        comps = []
        for k, name in enumerate(nm):
            if int(cnt_f[b, k]) == 0:
                continue
            has_c = int(cnt_c[b, k]) > 0
            sf, mf = float(ssim_f[b, k]), float(mad_f[b, k])
            sc, mc = (float(ssim_c[b, k]), float(mad_c[b, k])) if has_c else (sf, mf)
            f = [1.0 if int(fine[b, k, 1]) > 0 else 0.0, min(1.0, max(0.0, 1 - sf)) ** 0.5,
                 min(1.0, max(0.0, 1 - sc)) ** 0.5, mf ** 0.5, mc ** 0.5, float(dlum[b, k]) ** 0.5]
            comps.append({"name": name, "features": f, "count": int(cnt_f[b, k]), "ssim": sf, "mad": mf})
        out.append(comps)
    return out


def judge_batch(items: list[tuple[np.ndarray, np.ndarray | None, list[Component] | None]], device: torch.device,
                mapping: Mapping = Mapping(), rec=None, keys: list | None = None,
                cache: ProtoCache | None = None) -> list[dict]:
    """Score prototypes vs screenshots (two kernel calls over the batch, padding ignored).

    items: (prototype RGB, actual RGB or None, components). Returns per item
    {"score": mean component score, "components": [{name, score, raw, ssim, mad}]}."""
    feats = component_features(items, device, mapping, rec, keys, cache)
    out = []
    for (p, a, _), comps in zip(items, feats):
        rows = []
        for c in comps:
            f = np.asarray(c["features"])
            raw = float(raw_score(f, mapping))
            score = 0.0 if a is None else float(quantize(raw))
            rows.append({"name": c["name"], "score": score, "raw": round(raw, 6),
                         "ssim": round(c["ssim"], 6), "mad": round(c["mad"], 6)})
        out.append({"score": float(np.mean([r["score"] for r in rows])) if rows else 0.0, "components": rows})
    return out
