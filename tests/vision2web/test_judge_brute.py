"""stages/vision2web/judge.py against independent references (mutation-tested, see mutation.json).

Component maps, the crop/pad fit and the area pooling by plain pixel loops; MAD and the global SSIM of a
component's samples by numpy from the raw pixels (Wang et al. 2004, C1 = (0.01·255)², C2 = (0.03·255)²,
population variances); the rubric pinned on both sides of every threshold; judge_batch rebuilt whole."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from stages.vision2web.judge import (RUBRIC, Thresholds, _pool, component_map, fit, judge_batch, rubric,
                                     stats_to_mad_ssim)
from stages.vision2web.schema import Component

C1, C2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
CPU = torch.device("cpu")
DEFAULT_MAD = (0.005, 0.03, 0.08, 0.20)       # the module docstring's rubric table
DEFAULT_SSIM = (0.98, 0.90, 0.60, 0.25)


def ref_mad_ssim(p: np.ndarray, a: np.ndarray) -> tuple[float, float]:
    """Flattened samples of one component (all channels) -> MAD in [0, 1] and the one-window SSIM."""
    p, a = p.astype(np.float64).ravel(), a.astype(np.float64).ravel()
    mad = np.abs(p - a).mean() / 255.0
    mp, ma = p.mean(), a.mean()
    vp, va, cov = p.var(), a.var(), ((p - mp) * (a - ma)).mean()
    ssim = ((2 * mp * ma + C1) * (2 * cov + C2)) / ((mp ** 2 + ma ** 2 + C1) * (vp + va + C2))
    return float(mad), float(ssim)


def ref_rubric(mad: float, ssim: float, mads=DEFAULT_MAD, ssims=DEFAULT_SSIM) -> float:
    if mad <= mads[0] and ssim >= ssims[0]:
        return 1.0
    if mad <= mads[1] and ssim >= ssims[1]:
        return 0.75
    if mad <= mads[2] and ssim >= ssims[2]:
        return 0.5
    if mad <= mads[3] and ssim >= ssims[3]:
        return 0.25
    return 0.0


def ref_map(h, w, comps):
    seg = np.full((h, w), -1, dtype=np.int64)
    for y in range(h):
        for x in range(w):
            for k, c in enumerate(comps):
                bx, by, bw, bh = c.bbox
                if bx <= x < bx + bw and by <= y < by + bh:
                    seg[y, x] = k            # the last containing component wins
    return seg


def ref_fit(actual, h, w):
    out = np.zeros((h, w, 3), dtype=np.uint8)
    if actual is None:
        return out
    for y in range(h):
        for x in range(w):
            if y < actual.shape[0] and x < actual.shape[1]:
                out[y, x] = actual[y, x]
    return out


def ref_pool(img, s):
    h, w = img.shape[0] // s, img.shape[1] // s
    out = np.zeros((h, w) + img.shape[2:], dtype=np.uint8)
    for i in range(h):
        for j in range(w):
            block = img[i * s:(i + 1) * s, j * s:(j + 1) * s].astype(np.float64)
            out[i, j] = np.vectorize(round)(block.mean(axis=(0, 1)))   # round half to even, like np.rint
    return out


# ---------------------------------------------------------------- component map, fit, pooling


def test_component_map_whole_page_when_no_components():
    seg, names = component_map(5, 7, None)
    assert seg.shape == (5, 7) and seg.dtype == np.int32 and names == ["page"]
    assert (seg == 0).all()


def test_component_map_later_paints_over_and_clips_by_brute_force():
    comps = [Component(name="body", bbox=[0, 0, 9, 6]), Component(name="nav", bbox=[2, 1, 4, 3]),
             Component(name="edge", bbox=[7, 4, 10, 10]), Component(name="off", bbox=[20, 2, 3, 3]),
             Component(name="low", bbox=[1, 8, 2, 5]), Component(name="inner", bbox=[3, 2, 1, 1])]
    h, w = 9, 11
    seg, names = component_map(h, w, comps)
    assert names == ["body", "nav", "edge", "off", "low", "inner"]
    assert seg.dtype == np.int32 and seg.shape == (h, w)
    np.testing.assert_array_equal(seg, ref_map(h, w, comps))
    assert seg[0, 10] == -1 and seg[2, 3] == 5 and seg[1, 2] == 1 and seg[8, 10] == 2 and seg[8, 1] == 4


def test_component_map_random_bboxes_by_brute_force():
    rng = np.random.default_rng(2)
    for h, w in [(6, 13), (11, 4)]:
        comps = [Component(name=f"c{i}", bbox=[int(rng.integers(0, w + 3)), int(rng.integers(0, h + 3)),
                                               int(rng.integers(1, w)), int(rng.integers(1, h))]) for i in range(7)]
        np.testing.assert_array_equal(component_map(h, w, comps)[0], ref_map(h, w, comps))


@pytest.mark.parametrize("ah,aw", [(9, 13), (4, 5), (4, 13), (9, 3), (7, 10)])
def test_fit_crops_and_pads_black_by_brute_force(ah, aw):
    rng = np.random.default_rng(ah * 31 + aw)
    actual = rng.integers(1, 256, (ah, aw, 3)).astype(np.uint8)     # no zeros: padding is visible
    out = fit(actual, 7, 10)
    assert out.shape == (7, 10, 3) and out.dtype == np.uint8
    np.testing.assert_array_equal(out, ref_fit(actual, 7, 10))


def test_fit_none_is_all_black():
    out = fit(None, 3, 4)
    assert out.shape == (3, 4, 3) and out.dtype == np.uint8 and not out.any()


def test_pool_by_brute_force_and_half_to_even():
    # 2 x 2 means 0.25 -> 0, 0.5 -> 0, 0.75 -> 1, 1.5 -> 2, 2.5 -> 2 (np.rint rounds half to even)
    img = np.array([[0, 1, 1, 1, 1, 1, 1, 1, 3, 3, 9],
                    [0, 0, 0, 0, 1, 0, 2, 2, 2, 2, 9],
                    [7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7]], dtype=np.uint8)
    assert _pool(img, 2).tolist() == [[0, 0, 1, 2, 2]]
    rng = np.random.default_rng(0)
    for shape, s in [((7, 8, 3), 3), ((9, 10, 3), 2), ((5, 7), 2), ((8, 8, 3), 4)]:
        x = rng.integers(0, 256, shape).astype(np.uint8)
        got = _pool(x, s)
        assert got.dtype == np.uint8
        np.testing.assert_array_equal(got, ref_pool(x, s))


# ---------------------------------------------------------------- stats -> MAD, SSIM


def _sums(p, a):
    p, a = p.astype(np.int64).ravel(), a.astype(np.int64).ravel()
    return [p.size, np.abs(p - a).sum(), p.sum(), a.sum(), (p * p).sum(), (a * a).sum(), (p * a).sum()]


def test_stats_to_mad_ssim_hand_worked_single_sample():
    # one sample P = 10, A = 20: MAD = 10/255; means 10, 20; variances and covariance 0
    # SSIM = (2·10·20 + C1)(0 + C2) / ((100 + 400 + C1)(0 + C2)) = (400 + C1) / (500 + C1)
    mad, ssim, cnt = stats_to_mad_ssim(torch.tensor([1, 10, 10, 20, 100, 400, 200], dtype=torch.int64))
    assert float(mad) == pytest.approx(10 / 255, abs=1e-15)
    assert float(ssim) == pytest.approx((400 + 6.5025) / (500 + 6.5025), abs=1e-15)
    assert int(cnt) == 1 and cnt.dtype == torch.int64


def test_stats_to_mad_ssim_empty_component_has_no_nan():
    mad, ssim, cnt = stats_to_mad_ssim(torch.zeros(2, 7, dtype=torch.int64))
    assert mad.tolist() == [0.0, 0.0] and ssim.tolist() == [1.0, 1.0] and cnt.tolist() == [0, 0]


def test_stats_to_mad_ssim_matches_numpy_on_pixels():
    rng = np.random.default_rng(7)
    stats, want = [], []
    for b in range(2):
        row, wrow = [], []
        for k, (n, sigma, shift) in enumerate([(5, 3.0, 0), (12, 40.0, 17), (9, 0.0, -30)]):
            p = rng.integers(20, 230, (n, 3))
            a = np.clip(p * (0.6 + 0.2 * b) + shift + rng.normal(0, sigma, p.shape), 0, 255).astype(np.int64)
            row.append(_sums(p, a))
            wrow.append(ref_mad_ssim(p, a))
        stats.append(row)
        want.append(wrow)
    mad, ssim, cnt = stats_to_mad_ssim(torch.tensor(stats, dtype=torch.int64))
    assert mad.shape == ssim.shape == cnt.shape == (2, 3)
    assert cnt.tolist() == [[15, 36, 27]] * 2
    np.testing.assert_allclose(mad.numpy(), np.array(want)[..., 0], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(ssim.numpy(), np.array(want)[..., 1], rtol=1e-9, atol=1e-12)
    assert len({round(float(s), 3) for s in ssim.ravel()}) == 6     # the cases are distinct


# ---------------------------------------------------------------- rubric


def test_default_thresholds_are_the_documented_table():
    assert Thresholds().mad == DEFAULT_MAD and Thresholds().ssim == DEFAULT_SSIM
    assert RUBRIC == (1.0, 0.75, 0.5, 0.25)


@pytest.mark.parametrize("level", range(4))
def test_rubric_boundaries_non_strict_on_both_sides(level):
    m, s = DEFAULT_MAD[level], DEFAULT_SSIM[level]
    lower = (0.75, 0.5, 0.25, 0.0)[level]
    assert rubric(m, s) == RUBRIC[level]                           # mad <= m and ssim >= s: inclusive
    assert rubric(m, s, Thresholds()) == RUBRIC[level]
    assert rubric(np.nextafter(m, 1.0), s) == lower                # just above the MAD threshold
    assert rubric(m, np.nextafter(s, -1.0)) == lower               # just below the SSIM threshold
    assert rubric(np.nextafter(m, 1.0), np.nextafter(s, -1.0)) == lower


def test_rubric_extremes_and_each_condition_alone():
    assert rubric(0.0, 1.0) == 1.0
    assert rubric(1.0, 1.0) == 0.0 and rubric(0.0, -1.0) == 0.0 and rubric(0.21, 0.99) == 0.0
    assert rubric(0.001, 0.97) == 0.75 and rubric(0.02, 0.999) == 0.75    # one condition fails -> next level
    assert rubric(0.001, 0.5) == 0.25 and rubric(0.19, 0.999) == 0.25


def test_rubric_uses_the_given_thresholds_in_order():
    th = Thresholds(mad=(0.1, 0.2, 0.3, 0.4), ssim=(0.5, 0.4, 0.3, 0.2))
    for (m, s), want in {(0.1, 0.5): 1.0, (0.15, 0.5): 0.75, (0.2, 0.4): 0.75, (0.1, 0.45): 0.75,
                         (0.3, 0.3): 0.5, (0.25, 0.35): 0.5, (0.4, 0.2): 0.25, (0.05, 0.25): 0.25,
                         (0.41, 0.9): 0.0, (0.0, 0.19): 0.0}.items():
        assert rubric(m, s, th) == want == ref_rubric(m, s, th.mad, th.ssim), (m, s)


# ---------------------------------------------------------------- judge_batch, whole


def _scene(rng, h, w, comps, sigmas):
    """A textured prototype and an actual page with noise of sigma_k added inside component k."""
    proto = rng.integers(30, 220, (h, w, 3)).astype(np.uint8)
    act = proto.astype(np.float64)
    seg = ref_map(h, w, comps)
    for k, sig in enumerate(sigmas):
        m = seg == k
        act[m] += rng.normal(0, sig, act[m].shape) if sig >= 0 else -act[m] + 255   # sig < 0: inverted
    return proto, np.clip(np.rint(act), 0, 255).astype(np.uint8)


def ref_judge(proto, actual, comps, scale=1, mads=DEFAULT_MAD, ssims=DEFAULT_SSIM):
    h, w = proto.shape[:2]
    seg = ref_map(h, w, comps) if comps is not None else np.zeros((h, w), np.int64)
    names = [c.name for c in comps] if comps is not None else ["page"]
    pa = ref_fit(actual, h, w)
    p = proto
    if scale > 1:
        p, pa = ref_pool(proto, scale), ref_pool(pa, scale)
        seg = np.array([[seg[i * scale, j * scale] for j in range(w // scale)] for i in range(h // scale)])
    out = []
    for k, name in enumerate(names):
        m = seg == k
        if not m.any():
            continue
        mad, ssim = ref_mad_ssim(p[m], pa[m])
        score = 0.0 if actual is None else ref_rubric(mad, ssim, mads, ssims)
        out.append({"name": name, "score": score, "mad": mad, "ssim": ssim})
    return {"score": float(np.mean([c["score"] for c in out])) if out else 0.0, "components": out}


def _assert_same(got, want):
    assert got["score"] == pytest.approx(want["score"], abs=1e-12)
    assert [c["name"] for c in got["components"]] == [c["name"] for c in want["components"]]
    for g, w in zip(got["components"], want["components"]):
        assert g["score"] == w["score"], g["name"]
        assert g["mad"] == pytest.approx(round(w["mad"], 6), abs=1e-12), g["name"]
        assert g["ssim"] == pytest.approx(round(w["ssim"], 6), abs=1e-12), g["name"]


def _items(seed=0):
    rng = np.random.default_rng(seed)
    c1 = [Component(name="hero", bbox=[0, 0, 14, 6]), Component(name="nav", bbox=[2, 1, 5, 3]),
          Component(name="card", bbox=[8, 7, 9, 6]), Component(name="hidden", bbox=[3, 2, 2, 1]),
          Component(name="cover", bbox=[3, 2, 2, 1]), Component(name="gone", bbox=[40, 0, 4, 4])]
    p1, a1 = _scene(rng, 13, 17, c1, [0.6, 3.0, 12.0, 0.0, 40.0])
    c2 = [Component(name="a", bbox=[0, 0, 6, 9]), Component(name="b", bbox=[6, 0, 5, 20]),
          Component(name="c", bbox=[0, 9, 6, 7])]
    p2, a2 = _scene(rng, 16, 11, c2, [1.5, -1, 0.0])
    p3, a3 = _scene(rng, 9, 21, [Component(name="x", bbox=[0, 0, 21, 9])], [6.0])
    return [(p1, a1, c1),
            (p2, a2[:12, :9], c2),              # tall: sets H; short narrow screenshot padded black
            (p3, np.concatenate([a3, a3], 0), None),   # widest (sets W); page mode; taller screenshot
            (p1, None, c1)]                     # no screenshot: every component scores 0


@pytest.mark.parametrize("scale", [1, 2, 3])
def test_judge_batch_matches_brute_force(scale):
    items = _items()
    got = judge_batch(items, CPU, scale=scale)
    assert len(got) == len(items)
    for g, (p, a, c) in zip(got, items):
        _assert_same(g, ref_judge(p, a, c, scale))
        assert judge_batch([(p, a, c)], CPU, scale=scale) == [g]      # batch padding changes nothing
    if scale == 1:     # the scene reaches several rubric levels, and the covered/off-page ones are skipped
        scores = [c["score"] for r in got for c in r["components"]]
        assert {1.0, 0.75, 0.0} <= set(scores) and len(set(scores)) >= 4
        assert "hidden" not in [c["name"] for c in got[0]["components"]]
        assert "gone" not in [c["name"] for c in got[0]["components"]]
        assert got[3]["score"] == 0.0 and got[3]["components"][0]["mad"] > 0


def test_judge_batch_missing_screenshot_scores_zero_even_on_black():
    proto = np.zeros((6, 5, 3), np.uint8)
    out = judge_batch([(proto, None, None), (proto, proto.copy(), None)], CPU)
    assert out[0] == {"score": 0.0, "components": [{"name": "page", "score": 0.0, "mad": 0.0, "ssim": 1.0}]}
    assert out[1]["score"] == 1.0


def test_judge_batch_thresholds_are_passed_through():
    items = _items(1)[:2]
    th = Thresholds(mad=(0.001, 0.01, 0.02, 0.5), ssim=(0.999, 0.99, 0.9, 0.0))
    got = judge_batch(items, CPU, th)
    for g, (p, a, c) in zip(got, items):
        _assert_same(g, ref_judge(p, a, c, 1, th.mad, th.ssim))
    assert [c["score"] for c in got[0]["components"]] != [c["score"] for c in judge_batch(items, CPU)[0]["components"]]


def test_judge_batch_empty_and_no_scorable_components():
    assert judge_batch([], CPU) == []
    proto = np.full((4, 6, 3), 9, np.uint8)
    off = [Component(name="off", bbox=[10, 10, 2, 2])]
    assert judge_batch([(proto, proto, []), (proto, proto, off)], CPU) == [{"score": 0.0, "components": []}] * 2


class _Rec:
    def __init__(self):
        self.calls = []

    def call(self, name, fn, *args):
        self.calls.append((name, args))
        return fn(*args, backend="torch")


def test_judge_batch_goes_through_the_kernel_record():
    items = _items(2)
    rec = _Rec()
    got = judge_batch(items, CPU, Thresholds(), rec, 2)
    assert len(rec.calls) == 1
    name, (tp, ta, ts, K) = rec.calls[0]
    assert name == "segmented_compare" and K == 6
    # H = max(13, 16, 9) // 2 = 8 rows, W = max(17, 11, 21) // 2 = 10 columns
    assert tp.shape == ta.shape == (len(items), 8, 10, 3) and ts.shape == (len(items), 8, 10)
    assert tp.dtype == ta.dtype == torch.uint8 and ts.dtype == torch.int32
    assert int(ts.min()) == -1                      # padding (and uncovered pixels) ignored
    for g, (p, a, c) in zip(got, items):
        _assert_same(g, ref_judge(p, a, c, 2))
    assert got == judge_batch(items, CPU, scale=2)


def test_judge_batch_default_scale_is_full_resolution():
    items = _items(3)[:2]
    for g, (p, a, c) in zip(judge_batch(items, CPU), items):
        _assert_same(g, ref_judge(p, a, c, 1))
