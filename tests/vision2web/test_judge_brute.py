"""stages/vision2web/judge.py against independent references (mutation-tested, see mutation.json).

Component maps, the crop/pad fit and the area pooling by plain pixel loops; MAD and the global SSIM of a
component's samples by numpy from the raw pixels (Wang et al. 2004, C1 = (0.01·255)², C2 = (0.03·255)²,
population variances); the two-scale features, the fitted linear map and its rounding to the rubric
pinned by hand; judge_batch rebuilt whole."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from stages.vision2web.judge import (FEATURES, RUBRIC, Mapping, ProtoCache, _pool, component_features,
                                     component_map, fit, judge_batch, quantize, raw_score, stats_to_mad_ssim)
from stages.vision2web.schema import Component

C1, C2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
CPU = torch.device("cpu")
W7 = (0.9, -0.2, -0.3, -0.25, -1.1, 0.7, -0.4)   # non-unit weights (bias + 6 features)


def ref_mad_ssim(p: np.ndarray, a: np.ndarray) -> tuple[float, float]:
    """Flattened samples of one component (all channels) -> MAD in [0, 1] and the one-window SSIM."""
    p, a = p.astype(np.float64).ravel(), a.astype(np.float64).ravel()
    mad = np.abs(p - a).mean() / 255.0
    mp, ma = p.mean(), a.mean()
    vp, va, cov = p.var(), a.var(), ((p - mp) * (a - ma)).mean()
    ssim = ((2 * mp * ma + C1) * (2 * cov + C2)) / ((mp ** 2 + ma ** 2 + C1) * (vp + va + C2))
    return float(mad), float(ssim)


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


# ---------------------------------------------------------------- mapping to the rubric


def test_quantize_rounds_to_quarter_steps_and_clips():
    assert RUBRIC == (0.0, 0.25, 0.5, 0.75, 1.0)
    raw = np.array([-0.3, 0.0, 0.12, 0.13, 0.374, 0.376, 0.62, 0.88, 1.0, 1.4])
    assert quantize(raw).tolist() == [0.0, 0.0, 0.0, 0.25, 0.25, 0.5, 0.5, 1.0, 1.0, 1.0]
    assert quantize(0.125).tolist() == 0.0 and quantize(0.375).tolist() == 0.5     # half to even (x4: .5 -> 0, 1.5 -> 2)


def test_raw_score_is_bias_plus_dot():
    m = Mapping(W7)
    f = np.array([[1, 0.1, 0.2, 0.3, 0.4, 0.5], [0, 0, 0, 0, 0, 0]])
    want = [0.9 - 0.2 - 0.03 - 0.05 - 0.33 + 0.28 - 0.2, 0.9]
    np.testing.assert_allclose(raw_score(f, m), want, atol=1e-12)


def test_mapping_validates_its_shape():
    with pytest.raises(ValueError, match="weights"):
        Mapping((1.0, 2.0))
    with pytest.raises(ValueError, match="multiple"):
        Mapping(W7, fine=2, coarse=5)
    assert len(FEATURES) == 6


# ---------------------------------------------------------------- features and judge_batch, whole


def _scene(rng, h, w, comps, sigmas):
    """A textured prototype and an actual page with noise of sigma_k added inside component k."""
    proto = rng.integers(30, 220, (h, w, 3)).astype(np.uint8)
    act = proto.astype(np.float64)
    seg = ref_map(h, w, comps)
    for k, sig in enumerate(sigmas):
        m = seg == k
        act[m] += rng.normal(0, sig, act[m].shape) if sig >= 0 else -act[m] + 255   # sig < 0: inverted
    return proto, np.clip(np.rint(act), 0, 255).astype(np.uint8)


def ref_features(proto, actual, comps, fine, coarse):
    """Brute force: pool fine, pool coarse from the fine images, ids at block top-left corners."""
    h, w = proto.shape[:2]
    seg = ref_map(h, w, comps) if comps is not None else np.zeros((h, w), np.int64)
    names = [c.name for c in comps] if comps is not None else ["page"]
    pa = ref_fit(actual, h, w)
    pf, af = (ref_pool(x, fine) if fine > 1 else x for x in (proto, pa))
    sf = seg[: h // fine * fine: fine, : w // fine * fine: fine]
    k = coarse // fine
    pc, ac = (ref_pool(x, k) if k > 1 else x for x in (pf, af))
    sc = sf[: pf.shape[0] // k * k: k, : pf.shape[1] // k * k: k]
    out = []
    for i, name in enumerate(names):
        m = sf == i
        if not m.any():
            continue
        mad_f, ssim_f = ref_mad_ssim(pf[m], af[m])
        mc = sc == i
        mad_c, ssim_c = ref_mad_ssim(pc[mc], ac[mc]) if mc.any() else (mad_f, ssim_f)
        dlum = abs(pf[m].astype(np.float64).mean() - af[m].astype(np.float64).mean()) / 255
        changed = float(np.abs(pf[m].astype(int) - af[m].astype(int)).sum() > 0)
        f = [changed, np.sqrt(np.clip(1 - ssim_f, 0, 1)), np.sqrt(np.clip(1 - ssim_c, 0, 1)), np.sqrt(mad_f),
             np.sqrt(mad_c), np.sqrt(dlum)]
        out.append({"name": name, "features": f, "ssim": ssim_f, "mad": mad_f})
    return out


def ref_judge(proto, actual, comps, mapping):
    comps_f = ref_features(proto, actual, comps, mapping.fine, mapping.coarse)
    out = []
    for c in comps_f:
        raw = mapping.weights[0] + float(np.dot(mapping.weights[1:], c["features"]))
        score = 0.0 if actual is None else min(1.0, max(0.0, round(raw * 4) / 4))
        out.append({**c, "score": score, "raw": raw})
    return {"score": float(np.mean([c["score"] for c in out])) if out else 0.0, "components": out}


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


@pytest.mark.parametrize("fine,coarse", [(1, 1), (1, 3), (2, 4), (2, 2)])
def test_features_match_brute_force(fine, coarse):
    items = _items()
    m = Mapping(W7, fine, coarse)
    got = component_features(items, CPU, m)
    for g, (p, a, c) in zip(got, items):
        want = ref_features(p, a, c, fine, coarse)
        assert [x["name"] for x in g] == [x["name"] for x in want]
        for gx, wx in zip(g, want):
            np.testing.assert_allclose(gx["features"], wx["features"], rtol=1e-9, atol=1e-9)
    names = [x["name"] for x in got[0]]
    assert "hidden" not in names and "gone" not in names       # painted over / off the page: skipped


def test_judge_batch_matches_brute_force_and_reaches_several_steps():
    items = _items()
    m = Mapping(W7, 1, 2)
    got = judge_batch(items, CPU, m)
    for g, (p, a, c) in zip(got, items):
        want = ref_judge(p, a, c, m)
        assert g["score"] == pytest.approx(want["score"], abs=1e-12)
        for gx, wx in zip(g["components"], want["components"]):
            assert gx["score"] == wx["score"] and gx["raw"] == pytest.approx(wx["raw"], abs=1e-5), gx["name"]
            assert gx["ssim"] == pytest.approx(round(wx["ssim"], 6), abs=1e-12)
        assert judge_batch([(p, a, c)], CPU, m) == [g]      # batch padding changes nothing
    scores = [c["score"] for r in got[:3] for c in r["components"]]
    assert len(set(scores)) >= 3
    assert got[3]["score"] == 0.0 and all(c["score"] == 0.0 for c in got[3]["components"])


def test_identical_scores_one_and_missing_content_scores_zero_under_a_sane_mapping():
    m = Mapping((1.0, -0.3, 0.0, 0.0, -2.0, 0.0, 0.0), 1, 2)      # changed costs .3, sqrt(MAD) costs 2
    rng = np.random.default_rng(4)
    proto = rng.integers(0, 255, (8, 10, 3)).astype(np.uint8)
    out = judge_batch([(proto, proto.copy(), None), (proto, np.zeros_like(proto), None), (proto, None, None)], CPU, m)
    assert [o["score"] for o in out] == [1.0, 0.0, 0.0]


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


def test_judge_batch_two_kernel_calls_through_the_record_and_the_cache_changes_nothing():
    items = _items(2)
    rec = _Rec()
    m = Mapping(W7, 2, 4)
    got = judge_batch(items, CPU, m, rec)
    assert [c[0] for c in rec.calls] == ["segmented_compare"] * 2
    (_, (tp, ta, ts, K)), (_, (cp, ca, cs, K2)) = rec.calls
    assert K == K2 == 6
    # fine: H = max(13, 16, 9) // 2 = 8 rows, W = max(17, 11, 21) // 2 = 10; coarse: 4 x 5
    assert tp.shape == ta.shape == (len(items), 8, 10, 3) and ts.shape == (len(items), 8, 10)
    assert cp.shape == (len(items), 4, 5, 3) and cs.shape == (len(items), 4, 5)
    assert tp.dtype == ta.dtype == torch.uint8 and ts.dtype == torch.int32 and int(ts.min()) == -1
    cache = ProtoCache(8)
    keys = [("t", i) for i in range(len(items))]
    assert judge_batch(items, CPU, m, None, keys, cache) == got
    assert len(cache.data) == len(items)
    assert judge_batch(items, CPU, m, None, keys, cache) == got      # served from the cache
