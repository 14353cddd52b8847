"""walrus model.py against hand formulas and an independent re-implementation (explicit attention loops,
F.conv2d on the rolled, circularly padded field): window stats, RMS channel norm (eps matters), axial RoPE
(table by hand, norm preservation, relative-position property), the space-time block (causal time
attention with clamped relative bias, axial-RoPE space attention ∥ SwiGLU), patch jitter and token roll,
normalised L1 and rollout with a stub model. Tiny shapes, float64, fixed seeds, non-unit parameters."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from stages.walrus import model as M
from stages.walrus.jitter import PERIODIC, PERIODIC_2D, WALL
from stages.walrus.model import (RMSChannelNorm, SpaceTimeBlock, Walrus, apply_rope, axial_rope, axial_rope_2d,
                                 normalized_l1, rollout, window_stats)


# ----------------------------------------------------------------------------- normalisation
def test_window_stats_by_hand_and_single_frame_branch():
    g = torch.Generator().manual_seed(0)
    u = torch.randn(2, 3, 2, 4, 5, generator=g, dtype=torch.float64) * torch.tensor([0.3, 4.0])[None, None, :, None, None]
    rms_in, rms_d = window_stats(u)
    assert rms_in.shape == (2, 1, 2, 1, 1) and rms_d.shape == (2, 1, 2, 1, 1)
    un = u.numpy()
    for b in range(2):
        for c in range(2):
            ref_in = math.sqrt(float((un[b, :, c] ** 2).mean())) + 1e-6
            d = un[b, 1:, c] - un[b, :-1, c]
            ref_d = math.sqrt(float((d ** 2).mean())) + 1e-6
            assert float(rms_in[b, 0, c, 0, 0]) == pytest.approx(ref_in, rel=1e-12)
            assert float(rms_d[b, 0, c, 0, 0]) == pytest.approx(ref_d, rel=1e-12)
    one_in, one_d = window_stats(u[:, :1])         # a single frame: Δ stats fall back to the input RMS
    assert torch.equal(one_in, one_d)
    assert float(one_in[1, 0, 0, 0, 0]) == pytest.approx(math.sqrt(float((un[1, 0, 0] ** 2).mean())) + 1e-6, rel=1e-12)
    two_in, two_d = window_stats(u[:, :2])          # two frames: one difference
    d = un[0, 1, 1] - un[0, 0, 1]
    assert float(two_d[0, 0, 1, 0, 0]) == pytest.approx(math.sqrt(float((d ** 2).mean())) + 1e-6, rel=1e-12)
    z_in, z_d = window_stats(torch.zeros(1, 3, 1, 2, 2, dtype=torch.float64))
    assert float(z_in) == 1e-6 and float(z_d) == 1e-6          # EPS exactly


def test_rms_channel_norm_hand_formula_with_small_signal():
    norm = RMSChannelNorm(3).double()
    with torch.no_grad():
        norm.gain.copy_(torch.tensor([0.5, -2.0, 3.0]))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 4, 5, generator=g, dtype=torch.float64) * 2e-3   # ms ~ 4e-6: eps 1e-6 matters
    y = norm(x)
    xn = x.numpy()
    for b in range(2):
        for c in range(3):
            ms = float((xn[b, c] ** 2).mean())
            np.testing.assert_allclose(y[b, c].detach().numpy(), xn[b, c] / math.sqrt(ms + 1e-6) * [0.5, -2.0, 3.0][c],
                                       rtol=1e-10)
    assert torch.equal(RMSChannelNorm(4).gain.detach(), torch.ones(4))


# ----------------------------------------------------------------------------- axial RoPE
def test_axial_rope_table_by_hand():
    n, hd = 3, 8
    cos, sin = axial_rope(n, hd, "cpu", torch.float64)
    assert cos.shape == (9, 4) and sin.shape == (9, 4)
    pos = [-1.0, 0.0, 1.0]
    for i in range(n):
        for j in range(n):
            l = i * n + j
            ang = [pos[i] * math.pi * 1, pos[i] * math.pi * 2, pos[j] * math.pi * 1, pos[j] * math.pi * 2]
            np.testing.assert_allclose(cos[l].numpy(), np.cos(ang), atol=1e-12)
            np.testing.assert_allclose(sin[l].numpy(), np.sin(ang), atol=1e-12)
    c4, _ = axial_rope(4, 12, "cpu", torch.float64)
    assert c4.shape == (16, 6)
    # position of column 1 of n = 4 is -1/3; frequency 3π in the third pair
    assert float(c4[1, 5]) == pytest.approx(math.cos(-1 / 3 * 3 * math.pi), abs=1e-12)
    assert float(c4[4, 2]) == pytest.approx(math.cos(-1 / 3 * 3 * math.pi), abs=1e-12)


def test_apply_rope_pairs_norm_and_relative_position():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 5, 6, generator=g, dtype=torch.float64)
    ang = torch.rand(5, 3, generator=g, dtype=torch.float64) * 6
    y = apply_rope(x, ang.cos(), ang.sin())
    for l in range(5):
        for p in range(3):
            c, s = math.cos(float(ang[l, p])), math.sin(float(ang[l, p]))
            a, b = x[:, l, 2 * p], x[:, l, 2 * p + 1]
            torch.testing.assert_close(y[:, l, 2 * p], a * c - b * s)
            torch.testing.assert_close(y[:, l, 2 * p + 1], a * s + b * c)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))          # rotations preserve norms
    # relative position: <R(θ1) q, R(θ2) k> depends on θ1 − θ2 only
    q, k = x[0, :1], x[1, :1]
    t1, t2, d = torch.rand(1, 3, generator=g, dtype=torch.float64), torch.rand(1, 3, generator=g, dtype=torch.float64), 0.7
    dot = lambda a, b: float((apply_rope(q, a.cos(), a.sin()) * apply_rope(k, b.cos(), b.sin())).sum())
    assert dot(t1, t2) == pytest.approx(dot(t1 + d, t2 + d), abs=1e-12)
    assert abs(dot(t1, t2) - dot(t1 + d, t2)) > 1e-4


# ----------------------------------------------------------------------------- space-time block by loops
def _perturb(module, g, scale=0.3):
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "weight" in name and p.dim() == 1:       # LayerNorm gains: non-unit
                p.copy_(1.0 + scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
            elif "bias" in name or "rel_bias" in name:
                p.copy_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))


def rope_ref(v, i, j, n, quarter):
    """v (hd,) at grid cell (i, j): pair p < quarter rotated by pos_i·π(p+1), else pos_j·π(p−quarter+1)."""
    pos = np.linspace(-1, 1, n)
    out = v.clone()
    for p in range(2 * quarter):
        ang = pos[i] * math.pi * (p + 1) if p < quarter else pos[j] * math.pi * (p - quarter + 1)
        c, s = math.cos(ang), math.sin(ang)
        out[2 * p] = v[2 * p] * c - v[2 * p + 1] * s
        out[2 * p + 1] = v[2 * p] * s + v[2 * p + 1] * c
    return out


def block_ref(blk, x):
    """x (B, T, n, n, d) float64 -> the block output, by explicit loops over tokens and heads."""
    B, T, n, _, d = x.shape
    H = blk.h
    hd = d // H
    max_t = blk.rel_bias.shape[1]
    x1 = x.clone()
    with torch.no_grad():
        # causal time attention, per spatial cell
        for b in range(B):
            for i in range(n):
                for j in range(n):
                    seq = blk.norm_t(x[b, :, i, j])                   # (T, d)
                    qkv = seq @ blk.qkv_t.weight.T
                    out = torch.zeros(T, d, dtype=x.dtype)
                    for h in range(H):
                        sl = slice(h * hd, (h + 1) * hd)
                        q = blk.qn_t(qkv[:, sl])
                        k = blk.kn_t(qkv[:, d + h * hd:d + (h + 1) * hd])
                        v = qkv[:, 2 * d + h * hd:2 * d + (h + 1) * hd]
                        for t in range(T):
                            sc = torch.stack([q[t] @ k[s] / math.sqrt(hd) + blk.rel_bias[h, min(t - s, max_t - 1)]
                                              for s in range(t + 1)])
                            w = torch.softmax(sc, 0)
                            out[t, sl] = sum(w[s] * v[s] for s in range(t + 1))
                    x1[b, :, i, j] = x[b, :, i, j] + out @ blk.out_t.weight.T
        # space attention (axial RoPE) in parallel with SwiGLU
        x2 = x1.clone()
        for b in range(B):
            for t in range(T):
                y = blk.norm_s(x1[b, t].reshape(n * n, d))
                qkv = y @ blk.qkv_s.weight.T
                out = torch.zeros(n * n, d, dtype=x.dtype)
                for h in range(H):
                    sl = slice(h * hd, (h + 1) * hd)
                    q = blk.qn_s(qkv[:, sl])
                    k = blk.kn_s(qkv[:, d + h * hd:d + (h + 1) * hd])
                    v = qkv[:, 2 * d + h * hd:2 * d + (h + 1) * hd]
                    q = torch.stack([rope_ref(q[l], l // n, l % n, n, hd // 4) for l in range(n * n)])
                    k = torch.stack([rope_ref(k[l], l // n, l % n, n, hd // 4) for l in range(n * n)])
                    w = torch.softmax(q @ k.T / math.sqrt(hd), -1)
                    out[:, sl] = w @ v
                a = out @ blk.out_s.weight.T
                gu = y @ blk.w12.weight.T
                g, u = gu[:, :gu.shape[1] // 2], gu[:, gu.shape[1] // 2:]
                m = (g * torch.sigmoid(g) * u) @ blk.w3.weight.T
                x2[b, t] = x1[b, t] + (a + m).reshape(n, n, d)
    return x2


def _block(seed=0, d=16, heads=2, mlp=2, max_t=2):
    torch.manual_seed(seed)
    blk = SpaceTimeBlock(d, heads, mlp, max_t).double()
    _perturb(blk, torch.Generator().manual_seed(seed + 100))
    return blk


def test_space_time_block_equals_loop_reference():
    blk = _block()
    assert blk.rel_bias.shape == (2, 2) and blk.w12.out_features == 2 * 2 * 16 and blk.w3.in_features == 32
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 4, 3, 3, 16, generator=g, dtype=torch.float64)   # T = 4 > max_t = 2: lag bias clamps
    cos, sin = axial_rope(3, 8, "cpu", torch.float64)
    with torch.no_grad():
        got = blk(x, cos, sin)
    torch.testing.assert_close(got, block_ref(blk, x), atol=1e-10, rtol=1e-10)


def test_space_time_block_time_attention_is_causal():
    blk = _block(1, heads=1)
    g = torch.Generator().manual_seed(6)
    x = torch.randn(1, 3, 2, 2, 16, generator=g, dtype=torch.float64)
    cos, sin = axial_rope(2, 16, "cpu", torch.float64)
    x2 = x.clone()
    x2[:, 2] += torch.randn(2, 2, 16, generator=g, dtype=torch.float64)
    with torch.no_grad():
        a, b = blk(x, cos, sin), blk(x2, cos, sin)
    torch.testing.assert_close(a[:, :2], b[:, :2], atol=1e-12, rtol=0)
    assert float((a[:, 2] - b[:, 2]).abs().max()) > 1e-3
    x3 = x.clone()
    x3[:, 0] += torch.randn(2, 2, 16, generator=g, dtype=torch.float64)   # the past does change the future
    with torch.no_grad():
        assert float((blk(x3, cos, sin)[:, 2] - a[:, 2]).abs().max()) > 1e-3


# ----------------------------------------------------------------------------- the whole model
def rms_ref(x, gain):
    return x * torch.rsqrt(x.pow(2).mean(dim=(-2, -1), keepdim=True) + 1e-6) * gain[:, None, None]


def walrus_ref(m, x, shift, rolls, walls=False):
    """Independent forward (official fixed jitterer): N = 16 with 4 tokens per axis: strides (2, 2), e = 5.
    Periodic: roll, circular pad e, flags (bias 1). walls (rows wall/wall, columns periodic): zero pad
    P = p/2 + e = 7 rows, flags (bias 0 and wall 1 on the padded rows), roll both axes, circular pad e columns.
    Then conv2d encoder, blocks (tested above) on rolled tokens, transposed-conv decoder, un-jitter."""
    B, T, C, N, _ = x.shape
    s1, s2, e, P = 2, 2, 5, 7
    with torch.no_grad():
        xf = x.reshape(B * T, C, N, N)
        if walls:
            xf = F.pad(xf, (0, 0, P, P))
            flags = torch.zeros(B * T, 3, N + 2 * P, N, dtype=x.dtype)
            flags[:, 0, P:P + N] = 1.0
            flags[:, 1, :P] = 1.0
            flags[:, 1, P + N:] = 1.0
            xf = torch.roll(torch.cat([xf, flags], 1), shifts=shift, dims=(-2, -1))
            xf = F.pad(xf, (e, e, 0, 0), mode="circular")
        else:
            xf = torch.roll(xf, shifts=shift, dims=(-2, -1))
            xf = torch.cat([xf, torch.ones(B * T, 1, N, N, dtype=x.dtype), torch.zeros(B * T, 2, N, N, dtype=x.dtype)], 1)
            xf = F.pad(xf, (e, e, e, e), mode="circular")
        h = F.conv2d(xf, m.enc1.view(m.enc1.shape[0], C + 3, 8, 8), stride=s1)
        h = F.silu(rms_ref(h, m.enc_n1.gain))
        h = F.silu(rms_ref(F.conv2d(h, m.enc2, stride=s2), m.enc_n2.gain))
        n, mm = h.shape[-2:]
        tok = h.view(B, T, m.d, n, mm).permute(0, 1, 3, 4, 2)
        cos, sin = axial_rope_2d(n, mm, m.d // m.blocks[0].h, "cpu", x.dtype)
        tot = [0, 0]
        for blk, r in zip(m.blocks, rolls):
            tok = torch.roll(tok, shifts=tuple(r), dims=(2, 3))
            tot = [tot[0] + r[0], tot[1] + r[1]]
            tok = blk(tok, cos, sin)
        tok = torch.roll(tok, shifts=(-tot[0], -tot[1]), dims=(2, 3))
        h = m.dec_norm(tok).permute(0, 1, 4, 2, 3).reshape(B * T, m.d, n, mm)
        h = F.silu(rms_ref(F.conv_transpose2d(h, m.dec1, stride=s2), m.dec_n1.gain))
        y = F.conv_transpose2d(h, m.dec2, stride=s1)
        if walls:
            y = torch.roll(y[..., e:e + N], shifts=(-shift[0], -shift[1]), dims=(-2, -1))[..., P:P + N, :]
        else:
            y = torch.roll(y[..., e:e + N, e:e + N], shifts=(-shift[0], -shift[1]), dims=(-2, -1))
        return y.reshape(B, T, C, N, N)


def _walrus(jitter="domain", token_roll=True, seed=7, channels=2):
    torch.manual_seed(seed)
    m = Walrus(channels=channels, d=16, depth=2, heads=2, mlp_ratio=2, max_t=3, jitter=jitter, token_roll=token_roll,
               tokens_per_axis=4).double()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        m.dec2.normal_(0, 0.2, generator=g)
        for norm in (m.enc_n1, m.enc_n2, m.dec_n1):
            norm.gain.copy_(1 + 0.4 * torch.randn(norm.gain.shape, generator=g, dtype=torch.float64))
    for blk in m.blocks:
        _perturb(blk, g)
    _perturb(m.dec_norm, g)
    return m


CHANNEL = ((WALL, WALL), (PERIODIC, PERIODIC))


def test_walrus_forward_equals_independent_reference_with_drawn_jitter_and_rolls():
    m = _walrus()
    x = torch.randn(2, 3, 2, 16, 16, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    rng = np.random.default_rng(7)
    shift, rolls = m.draw(rng, (16, 16))
    ref = np.random.default_rng(7)                                   # replay the draws by hand
    s = (int(ref.integers(-7, 8)), int(ref.integers(-7, 8)))          # domain jitter: U{-(N/2-1) .. N/2-1}, N = 16
    r = [(int(a), int(b)) for a, b in zip(ref.integers(0, 4, size=2), ref.integers(0, 4, size=2))]
    assert tuple(shift.tolist()) == s and [tuple(v) for v in rolls.tolist()] == r
    assert s != (0, 0) and any(v != (0, 0) for v in r)
    calls = m.kernel_calls
    with torch.no_grad():
        got = m(x, PERIODIC_2D, shift, rolls)
    assert got.shape == x.shape and m.kernel_calls == calls + 2
    torch.testing.assert_close(got, walrus_ref(m, x, s, r), atol=1e-10, rtol=1e-9)


def test_walrus_wall_bounded_rows_equal_independent_reference():
    """the non-periodic branch: constant pad + wall flag on the rows, shift within the pad (|r| <= P-1 = 6),
    no token roll along the wall axis; columns periodic."""
    m = _walrus()
    x = torch.randn(2, 3, 2, 16, 16, generator=torch.Generator().manual_seed(18), dtype=torch.float64)
    draws = [m.draw(np.random.default_rng(k), (16, 16), CHANNEL) for k in range(200)]
    assert {int(d[0][0]) for d in draws} == set(range(-6, 7))        # wall axis: U{-(P-1)..P-1}
    assert {int(d[0][1]) for d in draws} == set(range(-7, 8))        # periodic axis: U{-(N/2-1)..N/2-1}
    assert all(int(d[1][:, 0].abs().max()) == 0 for d in draws)      # no token roll along the wall rows
    for shift, rolls in (draws[3], (torch.tensor([-6, 5]), torch.tensor([[0, 1], [0, 4]]))):
        with torch.no_grad():
            got = m(x, CHANNEL, shift, rolls)
        ref = walrus_ref(m, x, tuple(shift.tolist()), [tuple(v) for v in rolls.tolist()], walls=True)
        torch.testing.assert_close(got, ref, atol=1e-10, rtol=1e-9)
    tok = m.enc_n2  # token grid: (16 + 2*7 - 8)/2 + 1 = 12 -> (12 - 4)/2 + 1 = 5 rows = N/p + 1; 4 columns
    h = {}
    hook = tok.register_forward_hook(lambda mod, i, o: h.update(shape=tuple(o.shape)))
    with torch.no_grad():
        m(x, CHANNEL, *draws[0])
    hook.remove()
    assert h["shape"][-2:] == (5, 4)


def test_walrus_no_token_roll_and_no_jitter():
    m = _walrus(token_roll=False)
    x = torch.randn(1, 2, 2, 16, 16, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    shift, rolls = m.draw(np.random.default_rng(3), (16, 16))
    assert int(rolls.abs().max()) == 0                               # no token roll drawn
    with torch.no_grad():
        got = m(x, PERIODIC_2D, torch.tensor([1, 2]), rolls)
    torch.testing.assert_close(got, walrus_ref(m, x, (1, 2), [(0, 0), (0, 0)]), atol=1e-10, rtol=1e-9)
    m = _walrus(jitter="none")
    shift, rolls = m.draw(np.random.default_rng(3), (16, 16))
    assert int(shift.abs().max()) == 0 and int(rolls.abs().max()) == 0
    with torch.no_grad():
        got = m(x)
    torch.testing.assert_close(got, walrus_ref(m, x, (0, 0), [(0, 0), (0, 0)]), atol=1e-10, rtol=1e-9)


def test_patch_jitter_forward_is_pad_then_roll_of_the_padded_grid():
    """patch mode (official PatchJittererBoundaryPad): circular pad e, then roll the padded grid by
    U{-(p/2-1)..p/2-1} (p = 4: -1..1); un-jitter: roll back, crop. Not a pure shift of the field."""
    m = _walrus(jitter="patch", token_roll=False, channels=1)
    x = torch.randn(1, 2, 1, 16, 16, generator=torch.Generator().manual_seed(10), dtype=torch.float64)
    draws = {tuple(m.draw(np.random.default_rng(k), (16, 16))[0].tolist()) for k in range(60)}
    assert {a for a, _ in draws} == {-1, 0, 1}
    e = 5
    zero = torch.zeros(2, 2, dtype=torch.long)
    for shift in ((1, -1), (-1, 0)):
        with torch.no_grad():
            got = m(x, PERIODIC_2D, torch.tensor(shift), zero)
            xf = x.reshape(2, 1, 16, 16)
            xp = F.pad(torch.cat([xf, torch.ones_like(xf), torch.zeros(2, 2, 16, 16, dtype=x.dtype)], 1),
                       (e, e, e, e), mode="circular")
            xp = torch.roll(xp, shifts=shift, dims=(-2, -1))
            h = F.silu(rms_ref(F.conv2d(xp, m.enc1.view(m.enc1.shape[0], 4, 8, 8), stride=2), m.enc_n1.gain))
            h = F.silu(rms_ref(F.conv2d(h, m.enc2, stride=2), m.enc_n2.gain))
            tok = h.view(1, 2, m.d, 4, 4).permute(0, 1, 3, 4, 2)
            cos, sin = axial_rope(4, m.d // 2, "cpu", x.dtype)
            for blk in m.blocks:
                tok = blk(tok, cos, sin)
            h = m.dec_norm(tok).permute(0, 1, 4, 2, 3).reshape(2, m.d, 4, 4)
            h = F.silu(rms_ref(F.conv_transpose2d(h, m.dec1, stride=2), m.dec_n1.gain))
            y = torch.roll(F.conv_transpose2d(h, m.dec2, stride=2), shifts=(-shift[0], -shift[1]), dims=(-2, -1))
            ref = y[..., e:e + 16, e:e + 16].reshape(1, 2, 1, 16, 16)
        torch.testing.assert_close(got, ref, atol=1e-10, rtol=1e-9)


def test_draw_exact_support():
    for jitter, n, tpa, h in (("domain", 16, 4, 8), ("patch", 64, 8, 4), ("patch", 64, 4, 8), ("domain", 64, 4, 32)):
        m = Walrus(d=16, heads=1, jitter=jitter, tokens_per_axis=tpa)
        draws = [m.draw(np.random.default_rng(k), (n, n)) for k in range(1500)]
        assert {int(d[0][0]) for d in draws} == set(range(-(h - 1), h)) == {int(d[0][1]) for d in draws}
        assert {int(d[1].max()) for d in draws} <= set(range(tpa)) and max(int(d[1].max()) for d in draws) == tpa - 1


def test_strides_and_errors():
    ada = Walrus(d=16, heads=1, tokens_per_axis=4)
    assert ada.strides(16) == (2, 2) and ada.strides(32) == (4, 2) and ada.strides(64) == (4, 4)
    fix = Walrus(d=16, heads=1, tokenization="fixed", patch_size=8)
    assert fix.strides(32) == (4, 2) and fix.strides(64) == (4, 2)
    with pytest.raises(ValueError, match=r"patch 8 does not divide grid 36 into a known stride \[4, 8, 16\]"):
        fix.strides(36)
    with pytest.raises(ValueError, match="patch 2 does not divide grid 16"):
        Walrus(d=16, heads=1, tokens_per_axis=8).strides(16)
    with pytest.raises(ValueError, match="patch 3 does not divide"):
        Walrus(d=16, heads=1, tokens_per_axis=4).strides(12)
    with pytest.raises(ValueError, match=r"^d=24 must be a multiple of 4\*heads for axial RoPE$"):
        Walrus(d=24, heads=4)
    with pytest.raises(ValueError, match="same hMLP strides"):
        ada(torch.zeros(1, 1, 2, 32, 64))
    Walrus(d=32, heads=8)                                            # 32 % 32 == 0 is fine


def test_constructor_defaults_and_init_scales():
    m = Walrus()
    assert (m.c, m.d, len(m.blocks), m.blocks[0].h) == (2, 64, 4, 4)
    assert m.blocks[0].rel_bias.shape == (4, 8) and m.blocks[0].w3.in_features == 4 * 64
    assert (m.jitter, m.token_roll, m.tokenization, m.tokens_per_axis, m.patch_size) == ("domain", True, "adaptive", 8, 4)
    assert m.kernel_backend == "train" and m.kernel_calls == 0
    assert m.enc1.shape == (16, (2 + 3) * 64) and m.enc2.shape == (64, 16, 4, 4)     # fields + 3 flag channels
    assert m.dec1.shape == (64, 16, 4, 4) and m.dec2.shape == (16, 2, 8, 8)
    assert float(m.dec2.abs().max()) == 0 and m.dec_norm.normalized_shape == (64,)
    assert m.enc_n1.gain.shape == (16,) and m.enc_n2.gain.shape == (64,) and m.dec_n1.gain.shape == (16,)
    torch.manual_seed(0)
    big = Walrus(channels=3, d=128, heads=4, depth=1)
    # randn / sqrt(fan-in): std 1/sqrt(6·64), 1/sqrt(32·16), 1/sqrt(128)
    assert float(big.enc1.std()) == pytest.approx(1 / math.sqrt(384), rel=0.05)
    assert float(big.enc2.std()) == pytest.approx(1 / math.sqrt(512), rel=0.05)
    assert float(big.dec1.std()) == pytest.approx(1 / math.sqrt(128), rel=0.05)


# ----------------------------------------------------------------------------- loss and rollout (stub model)
class Stub:
    """A fixed non-linear map standing in for the network: (B, T, C, N, N) -> same shape."""

    def __call__(self, x, *jitter_args):
        return 0.4 * x - 0.25 * x.roll(1, dims=-1) ** 2 + 0.1 * x.cumsum(1)


def test_normalized_l1_by_hand():
    g = torch.Generator().manual_seed(11)
    w = torch.randn(2, 4, 2, 3, 3, generator=g, dtype=torch.float64) * torch.tensor([2.0, 0.5])[None, None, :, None, None]
    f = Stub()
    for context in (3, 2, 1):
        win = w[:, :context + 1]
        u = win[:, :context].numpy()
        rin = np.sqrt((u ** 2).mean(axis=(1, 3, 4), keepdims=True)) + 1e-6
        if context > 1:
            dd = u[:, 1:] - u[:, :-1]
            rd = np.sqrt((dd ** 2).mean(axis=(1, 3, 4), keepdims=True)) + 1e-6
        else:
            rd = rin
        target = (win[:, 1:] - win[:, :-1]).numpy() / rd
        pred = f(torch.from_numpy(u / rin)).numpy()
        start = 1 if context > 1 else 0
        ref = np.abs(pred[:, start:] - target[:, start:]).mean()
        assert float(normalized_l1(f, win, context)) == pytest.approx(float(ref), rel=1e-12)


def test_rollout_by_hand():
    g = torch.Generator().manual_seed(12)
    init = torch.randn(2, 3, 2, 3, 3, generator=g, dtype=torch.float64) * 1.7
    f = Stub()
    got = rollout(f, init, 4)
    win = init.numpy().copy()
    outs = []
    for _ in range(4):
        rin = np.sqrt((win ** 2).mean(axis=(1, 3, 4), keepdims=True)) + 1e-6
        dd = win[:, 1:] - win[:, :-1]
        rd = np.sqrt((dd ** 2).mean(axis=(1, 3, 4), keepdims=True)) + 1e-6
        pred = f(torch.from_numpy(win / rin)).numpy()[:, -1:]
        nxt = win[:, -1:] + rd * pred
        outs.append(nxt)
        win = np.concatenate([win[:, 1:], nxt], 1)
    assert got.shape == (2, 4, 2, 3, 3)
    np.testing.assert_allclose(got.numpy(), np.concatenate(outs, 1), rtol=1e-12, atol=1e-12)
    assert torch.equal(init, init.clone())                              # input not modified in place


def test_eps_constant():
    assert M.EPS == 1e-6
