"""star_kv model.py against hand formulas and brute force (numpy SVD, explicit attention loops, hand-counted
bytes). Non-default s, c, α, scales; boundary values for every comparison. Fast: tiny models only."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig
from stages.star_kv.model import (LowRankAttn, SoftThreshold, StarKVLM, dense_kv_bytes_per_token, half_perm,
                                  kv_bytes_per_token, qspec, quant_bytes_per_token, quant_roundtrip, soft_threshold)

D_MODEL, HEADS, LAYERS = 16, 2, 2   # head_dim 8


def teacher(seed=0, std=0.2, tie=False):
    torch.manual_seed(seed)
    t = TinyTransformer(TinyTransformerConfig(vocab_size=40, d_model=D_MODEL, n_layers=LAYERS, n_heads=HEADS,
                                              max_seq_len=16, tie_embeddings=tie)).eval()
    for m in t.modules():
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.normal_(m.weight, std=std)
    return t


# ----------------------------------------------------------------------------- soft threshold
def st_ref(sig, a, s, c):
    z = s * (sig - a)
    return sig * math.tanh(z) if sig > a else -c * math.tanh(z)


def st_grad_ref(sig, a, s, c):
    t = math.tanh(s * (sig - a))
    sech2 = 1 - t * t
    if sig > a:
        return t + sig * s * sech2, -sig * s * sech2
    return -c * s * sech2, c * s * sech2


def test_soft_threshold_forward_backward_by_hand():
    sig = [0.1, 0.4, 0.55, 0.6, 0.75, 1.3]
    al = [0.55, 0.55, 0.55, 0.55, 0.5, 0.5]        # σ == α at index 2 (boundary: "below" branch)
    s, c = 3.0, 0.4
    up = [2.0, -1.5, 0.7, 1.3, -0.9, 2.5]           # non-unit upstream gradient
    x = torch.tensor(sig, dtype=torch.float64, requires_grad=True)
    a = torch.tensor(al, dtype=torch.float64, requires_grad=True)
    out = SoftThreshold.apply(x, a, s, c)
    out.backward(torch.tensor(up, dtype=torch.float64))
    for i in range(len(sig)):
        assert float(out[i]) == pytest.approx(st_ref(sig[i], al[i], s, c), abs=1e-12)
        gs, ga = st_grad_ref(sig[i], al[i], s, c)
        assert float(x.grad[i]) == pytest.approx(up[i] * gs, abs=1e-12)
        assert float(a.grad[i]) == pytest.approx(up[i] * ga, abs=1e-12)
    # boundary σ == α: gradient is the "below" one, −c·s and +c·s (not σ·s)
    assert float(x.grad[2]) == pytest.approx(0.7 * -c * s, abs=1e-12)
    assert float(a.grad[2]) == pytest.approx(0.7 * c * s, abs=1e-12)


def test_soft_threshold_wrapper_defaults_and_broadcast():
    sig = torch.tensor([[0.49, 0.51, 0.53, 0.6], [0.2, 0.31, 0.32, 0.5]], dtype=torch.float64)
    alpha = torch.tensor([[0.5], [0.3]], dtype=torch.float64)   # one α per row, broadcast over columns
    out = soft_threshold(sig, alpha)                             # defaults s = 50, c = 0
    for i in range(2):
        for j in range(4):
            assert float(out[i, j]) == pytest.approx(st_ref(float(sig[i, j]), float(alpha[i, 0]), 50.0, 0.0), abs=1e-12)
    out2 = soft_threshold(sig, alpha, 7.0, 0.25)
    assert float(out2[0, 0]) == pytest.approx(st_ref(0.49, 0.5, 7.0, 0.25), abs=1e-12)
    assert float(out2[1, 1]) == pytest.approx(st_ref(0.31, 0.3, 7.0, 0.25), abs=1e-12)


def test_half_perm():
    assert half_perm(8).tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    assert half_perm(4).tolist() == [0, 2, 1, 3]


# ----------------------------------------------------------------------------- factorization
def test_init_factorizes_k_per_head_and_jointly_and_v_jointly():
    t = teacher(1)
    W = t.blocks[0].attn.qkv.weight.detach().numpy().astype(np.float64)
    C, D = D_MODEL, D_MODEL // HEADS
    Wk, Wv = W[C:2 * C], W[2 * C:]
    a = LowRankAttn(t.blocks[0].attn, "head", 1.7, 0.6)
    assert a.uk.shape == (HEADS, D, D) and a.sk.shape == (HEADS, D) and a.vk.shape == (HEADS, D, C)
    assert a.alpha_k.shape == (HEADS, 1) and a.alpha_v.shape == (1,)
    for h in range(HEADS):
        rec = a.uk[h].double() @ torch.diag(a.sk[h].double()) @ a.vk[h].double()
        np.testing.assert_allclose(rec.detach().numpy(), Wk[h * D:(h + 1) * D], atol=1e-5)
        np.testing.assert_allclose(a.sk[h].detach().numpy(), np.linalg.svd(Wk[h * D:(h + 1) * D], compute_uv=False),
                                   atol=1e-5)
    np.testing.assert_allclose(a.sv.detach().numpy(), np.linalg.svd(Wv, compute_uv=False), atol=1e-5)
    recv = a.uv.double() @ torch.diag(a.sv.double()) @ a.vv.double()
    np.testing.assert_allclose(recv.detach().numpy(), Wv, atol=1e-5)
    np.testing.assert_allclose(a.wq.detach().numpy(), W[:C], atol=0)
    assert float(a.scale_k) == pytest.approx(1.7) and float(a.scale_v) == pytest.approx(0.6)
    assert a.mask_k.shape == (HEADS, D) and bool((a.mask_k == 1).all()) and bool((a.mask_v == 1).all())
    assert a.s == 50.0 and a.fused is False
    j = LowRankAttn(t.blocks[0].attn, "joint", 1.0, 1.0)
    assert j.uk.shape == (1, C, C) and j.sk.shape == (1, C) and j.alpha_k.shape == (1, 1)
    recj = j.uk[0].double() @ torch.diag(j.sk[0].double()) @ j.vk[0].double()
    np.testing.assert_allclose(recj.detach().numpy(), Wk, atol=1e-5)


def test_gates_and_ranks_by_hand():
    t = teacher(2)
    a = LowRankAttn(t.blocks[1].attn, "head", 1.3, 0.8)
    sk, sv = a.sk.detach().double(), a.sv.detach().double()
    with torch.no_grad():
        a.alpha_k.copy_(torch.stack([a.sk[0, 2] / a.scale_k, torch.tensor(0.25)])[:, None])   # head 0: α exactly at σ̂_2 (boundary)
        a.alpha_v.fill_(0.4)
    gk, gv = a.gate_k().detach(), a.gate_v().detach()
    for h in range(HEADS):
        al = float(a.alpha_k[h, 0])
        for r in range(sk.shape[1]):
            exp = 1.3 * st_ref(float(sk[h, r]) / 1.3, al, 50.0, 0.0)
            assert float(gk[h, r]) == pytest.approx(exp, abs=1e-5)
    for r in range(sv.shape[0]):
        assert float(gv[r]) == pytest.approx(0.8 * st_ref(float(sv[r]) / 0.8, 0.4, 50.0, 0.0), abs=1e-5)
    rk, rv = a.ranks()
    exp_k = [sum(1 for r in range(sk.shape[1]) if float(a.sk[h, r] / a.scale_k) > float(a.alpha_k[h, 0])) for h in range(HEADS)]
    assert rk == exp_k and rk[0] == 2   # σ̂ == α is not counted
    assert rv == sum(1 for x in sv.tolist() if x / 0.8 > 0.4)
    assert 0 < rv < len(sv)
    # a changed s is used by the gate
    a.s = 4.0
    assert float(a.gate_v()[0]) == pytest.approx(0.8 * st_ref(float(sv[0]) / 0.8, 0.4, 4.0, 0.0), abs=1e-5)


def _trunc(U, S, Vh, keep):
    return U[:, keep] @ np.diag(S[keep]) @ Vh[keep]


@pytest.mark.parametrize("mode", ["head", "joint"])
def test_fuse_with_alpha_equals_shrunk_svd_brute_force(mode):
    t = teacher(3)
    W = t.blocks[0].attn.qkv.weight.detach().numpy().astype(np.float64)
    C, D = D_MODEL, D_MODEL // HEADS
    a = LowRankAttn(t.blocks[0].attn, mode, 1.1, 0.9)
    mats = [W[C + h * D:C + (h + 1) * D] for h in range(HEADS)] if mode == "head" else [W[C:2 * C]]
    svals = [np.linalg.svd(m, compute_uv=False) for m in mats]
    alphas = [0.5 * s[2] / 1.1 + 0.5 * s[3] / 1.1 for s in svals]    # between σ̂_2 and σ̂_3 → rank 3
    with torch.no_grad():
        a.alpha_k.copy_(torch.tensor(alphas)[:, None])
        sv = np.linalg.svd(W[2 * C:], compute_uv=False)
        a.alpha_v.fill_(float(0.5 * (sv[4] + sv[5]) / 0.9))               # between σ̂_4 and σ̂_5 → rank 5
    a.fuse()
    assert a.fused and float(a.alpha_k.abs().sum()) == 0 and float(a.alpha_v.abs().sum()) == 0
    assert not a.alpha_k.requires_grad and not a.alpha_v.requires_grad
    assert not a.sk.requires_grad and not a.sv.requires_grad
    assert bool((a.sk == 1).all()) and bool((a.sv == 1).all())
    for i, m in enumerate(mats):
        U, S, Vh = np.linalg.svd(m, full_matrices=False)
        exp = U @ np.diag(np.clip(S - alphas[i] * 1.1, 0, None)) @ Vh          # ALGO: V ← V·(σ−α)₊
        got = (a.uk[i].double() @ torch.diag(a.mask_k[i].double()) @ a.vk[i].double()).detach().numpy()
        np.testing.assert_allclose(got, exp, atol=1e-5)
        assert a.mask_k[i].tolist() == [1.0] * 3 + [0.0] * (len(S) - 3)
    U, S, Vh = np.linalg.svd(W[2 * C:], full_matrices=False)
    np.testing.assert_allclose((a.uv.double() @ a.vv.double()).detach().numpy(),
                               U @ np.diag(np.clip(S - 0.5 * (S[4] + S[5]), 0, None)) @ Vh, atol=1e-5)
    assert a.mask_v.tolist() == [1.0] * 5 + [0.0] * (len(S) - 5)
    assert a.ranks() == ([3] * len(mats), 5)
    assert torch.equal(a.gate_k(), a.mask_k) and torch.equal(a.gate_v(), a.mask_v)


def test_fuse_explicit_ranks_keep_top_singular_directions():
    t = teacher(4)
    W = t.blocks[1].attn.qkv.weight.detach().numpy().astype(np.float64)
    C, D = D_MODEL, D_MODEL // HEADS
    a = LowRankAttn(t.blocks[1].attn, "head", 1.0, 1.0)
    with torch.no_grad():
        a.alpha_k.fill_(0.3)   # ignored by use_alpha=False
    a.fuse(ranks_k=[2, 5], rank_v=7, use_alpha=False)
    for h, r in enumerate([2, 5]):
        U, S, Vh = np.linalg.svd(W[C + h * D:C + (h + 1) * D], full_matrices=False)
        got = (a.uk[h].double() @ torch.diag(a.mask_k[h].double()) @ a.vk[h].double()).detach().numpy()
        np.testing.assert_allclose(got, _trunc(U, S, Vh, slice(0, r)), atol=1e-5)
        assert a.mask_k[h].tolist() == [1.0] * r + [0.0] * (D - r)
    U, S, Vh = np.linalg.svd(W[2 * C:], full_matrices=False)
    got = (a.uv.double() @ torch.diag(a.mask_v.double()) @ a.vv.double()).detach().numpy()
    np.testing.assert_allclose(got, _trunc(U, S, Vh, slice(0, 7)), atol=1e-5)
    assert a.ranks() == ([2, 5], 7)


def test_fuse_gate_uses_soft_threshold_value():
    t = teacher(5)
    W = t.blocks[0].attn.qkv.weight.detach().numpy().astype(np.float64)
    C, D = D_MODEL, D_MODEL // HEADS
    a = LowRankAttn(t.blocks[0].attn, "head", 1.2, 0.7)
    a.s = 6.0                                  # soft transition: gate value differs from both σ and σ−α
    with torch.no_grad():
        a.alpha_k.fill_(0.2)
        a.alpha_v.fill_(0.3)
    a.fuse(gate=True)
    for h in range(HEADS):
        U, S, Vh = np.linalg.svd(W[C + h * D:C + (h + 1) * D], full_matrices=False)
        eff = np.array([1.2 * st_ref(x / 1.2, 0.2, 6.0, 0.0) for x in S])
        got = (a.uk[h].double() @ torch.diag(a.mask_k[h].double()) @ a.vk[h].double()).detach().numpy()
        np.testing.assert_allclose(got, U @ np.diag(eff) @ Vh, atol=1e-5)
        assert a.mask_k[h].tolist() == [1.0 if e > 0 else 0.0 for e in eff]


def test_fuse_sorts_by_fused_value_descending():
    """gate=True with per-direction values out of σ order: columns are re-sorted by the fused value."""
    t = teacher(6)
    a = LowRankAttn(t.blocks[0].attn, "joint", 1.0, 1.0)
    a.s = 50.0
    with torch.no_grad():
        a.alpha_k.fill_(float(a.sk[0, 4]))          # σ_4 == α → fused value 0 (and below: 0)
        a.alpha_v.fill_(-1.0)
    a.fuse(gate=True)
    assert a.mask_k[0].tolist() == [1.0] * 4 + [0.0] * (D_MODEL - 4)
    norms = a.vk[0].norm(dim=1)                   # row norms = fused values, must be non-increasing
    assert all(float(x) >= float(y) - 1e-6 for x, y in zip(norms, norms[1:]))
    assert float(norms[3]) > 0 and float(norms[4:].abs().max()) == 0


# ----------------------------------------------------------------------------- forward by explicit loops
def rope_ref(x, pos, cos, sin):
    """interleaved pairs (2i, 2i+1) rotated by table row `pos` (x: (D,))."""
    out = x.clone()
    for i in range(x.shape[0] // 2):
        c, s = float(cos[pos, i]), float(sin[pos, i])
        out[2 * i] = x[2 * i] * c - x[2 * i + 1] * s
        out[2 * i + 1] = x[2 * i] * s + x[2 * i + 1] * c
    return out


def attn_ref(a, x, cos, sin, Wk_eff, Wv_eff):
    """Causal multi-head attention with given effective K/V weights, by loops. x (B, T, C)."""
    B, T, C = x.shape
    H, D = a.H, a.D
    x = x.double()
    Wq = a.wq.detach().double()
    out = torch.zeros(B, T, C, dtype=torch.float64)
    for b in range(B):
        q = x[b] @ Wq.T
        k = x[b] @ Wk_eff.T
        v = x[b] @ Wv_eff.T
        for h in range(H):
            sl = slice(h * D, (h + 1) * D)
            qs = [rope_ref(q[t, sl], t, cos, sin) for t in range(T)]
            ks = [rope_ref(k[t, sl], t, cos, sin) for t in range(T)]
            for t in range(T):
                sc = torch.tensor([float(qs[t] @ ks[j]) / math.sqrt(D) for j in range(t + 1)], dtype=torch.float64)
                w = torch.softmax(sc, 0)
                out[b, t, sl] = sum(w[j] * v[j, sl] for j in range(t + 1))
    P = a.proj.weight.detach().double()
    y = out @ P.T
    if a.proj.bias is not None:
        y = y + a.proj.bias.detach().double()
    return y


@pytest.mark.parametrize("mode", ["head", "joint"])
def test_unfused_forward_equals_loop_attention_with_gated_weights(mode):
    t = teacher(7)
    a = LowRankAttn(t.blocks[0].attn, mode, 1.4, 0.9)
    a.s = 5.0
    with torch.no_grad():
        a.alpha_k.copy_(torch.linspace(0.1, 0.3, a.alpha_k.shape[0])[:, None])
        a.alpha_v.fill_(0.2)
    g_k, g_v = a.gate_k().detach().double(), a.gate_v().detach().double()
    if mode == "head":
        Wk = torch.cat([a.uk[h].double() @ torch.diag(g_k[h]) @ a.vk[h].double() for h in range(HEADS)]).detach()
    else:
        Wk = (a.uk[0].double() @ torch.diag(g_k[0]) @ a.vk[0].double()).detach()
    Wv = (a.uv.double() @ torch.diag(g_v) @ a.vv.double()).detach()
    torch.manual_seed(0)
    x = torch.randn(2, 5, D_MODEL)
    rope = (t.rope_cos, t.rope_sin)
    with torch.no_grad():
        got = a(x, rope)
    ref = attn_ref(a, x, t.rope_cos, t.rope_sin, Wk, Wv)
    torch.testing.assert_close(got.double(), ref, atol=2e-5, rtol=1e-4)
    # causality: changing the last token does not change earlier outputs
    x2 = x.clone()
    x2[:, -1] += 3.0
    with torch.no_grad():
        got2 = a(x2, rope)
    torch.testing.assert_close(got2[:, :-1], got[:, :-1], atol=1e-6, rtol=0)
    assert float((got2[:, -1] - got[:, -1]).abs().max()) > 1e-3


def test_latents_fold_gates():
    t = teacher(8)
    a = LowRankAttn(t.blocks[0].attn, "head", 0.9, 1.1)
    with torch.no_grad():
        a.alpha_k.fill_(0.15)
        a.alpha_v.fill_(0.05)
    x = torch.randn(2, 3, D_MODEL)
    lk, lv = a.latents(x)
    gk, gv = a.gate_k().detach(), a.gate_v().detach()
    for h in range(HEADS):
        exp = (x @ a.vk[h].detach().T) * gk[h]
        torch.testing.assert_close(lk[:, :, h].detach(), exp, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(lv.detach(), (x @ a.vv.detach().T) * gv, atol=1e-6, rtol=1e-5)


# ----------------------------------------------------------------------------- export
def test_export_head_mode_rows_padding_and_perm():
    t = teacher(9)
    a = LowRankAttn(t.blocks[0].attn, "head", 1.0, 1.0)
    a.fuse(ranks_k=[3, 1], rank_v=4, use_alpha=False)
    kd, ku, rk, vd, vu = a.export()
    assert rk == [3, 1] and kd.shape == (HEADS, 3, D_MODEL) and ku.shape == (HEADS, 3, 8)
    assert vd.shape == (4, D_MODEL) and vu.shape == (4, D_MODEL)
    perm = [0, 2, 4, 6, 1, 3, 5, 7]
    for h, r in enumerate(rk):
        for i in range(3):
            if i < r:
                assert torch.equal(kd[h, i], a.vk[h, i].detach())
                assert torch.equal(ku[h, i], a.uk[h][:, i].detach()[perm])
            else:
                assert float(kd[h, i].abs().max()) == 0 and float(ku[h, i].abs().max()) == 0
    assert torch.equal(vd, a.vv[:4].detach()) and torch.equal(vu, a.uv[:, :4].T.detach())
    assert not any(x.requires_grad for x in (kd, ku, vd, vu)) and ku.is_contiguous() and vu.is_contiguous()


def test_export_joint_mode_and_rank_zero():
    t = teacher(10)
    a = LowRankAttn(t.blocks[1].attn, "joint", 1.0, 1.0)
    a.fuse(ranks_k=[5], rank_v=3, use_alpha=False)
    kd, ku, rk, vd, vu = a.export()
    assert rk == [5] and kd.shape == (1, 5, D_MODEL) and ku.shape == (HEADS, 5, 8)
    perm = [0, 2, 4, 6, 1, 3, 5, 7]
    assert torch.equal(kd[0], a.vk[0, :5].detach())
    for h in range(HEADS):
        for i in range(5):
            assert torch.equal(ku[h, i], a.uk[0][h * 8:(h + 1) * 8, i].detach()[perm])
    assert vd.shape == (3, D_MODEL) and vu.shape == (3, D_MODEL) and not any(x.requires_grad for x in (kd, ku, vd, vu))
    assert ku.is_contiguous() and vu.is_contiguous()
    z = LowRankAttn(t.blocks[1].attn, "head", 1.0, 1.0)
    z.fuse(ranks_k=[0, 0], rank_v=0, use_alpha=False)
    kd, ku, rk, vd, vu = z.export()
    assert rk == [0, 0] and kd.shape == (HEADS, 1, D_MODEL) and float(kd.abs().max()) == 0
    assert vd.shape == (1, D_MODEL)
    with pytest.raises(AssertionError):
        LowRankAttn(t.blocks[1].attn, "head", 1.0, 1.0).export()


# ----------------------------------------------------------------------------- quantization
def test_qspec_boundaries():
    assert qspec(3, 5, 4) == (0, 8)
    assert qspec(3, 5, 8) == (3, 8)
    assert qspec(7, 5, 16) == (5, 16)
    assert qspec(5, 5, 8) == (5, 8)


def sym_ref(row, qmax):
    m = max(abs(v) for v in row) / qmax
    m = m if m > 0 else 1.0
    return [max(-qmax, min(qmax, round(v / m))) * m for v in row]


def test_quant_roundtrip_against_hand_quantizer():
    t = teacher(11)
    a = LowRankAttn(t.blocks[0].attn, "head", 1.0, 1.0)
    a.fuse(ranks_k=[4, 0], rank_v=5, use_alpha=False)
    torch.manual_seed(3)
    lk, lv = torch.randn(2, 3, HEADS, 8) * 2.5, torch.randn(2, 3, D_MODEL) * 1.5
    for hi_k, hi_v, bits in [(1, 2, 8), (9, 9, 8), (2, 3, 4)]:
        ok, ov = quant_roundtrip(a, lk, lv, hi_k, hi_v, bits)
        nk = 0 if bits == 4 else min(hi_k, 4)
        nv = 0 if bits == 4 else min(hi_v, 5)
        for b in range(2):
            for tt in range(3):
                row = lk[b, tt, 0, :4].tolist()
                exp = (sym_ref(row[:nk], 127) if nk else []) + (sym_ref(row[nk:], 7) if nk < 4 else [])
                np.testing.assert_allclose(ok[b, tt, 0, :4].numpy(), exp, rtol=1e-5, atol=1e-6)
                row = lv[b, tt, :5].tolist()
                exp = (sym_ref(row[:nv], 127) if nv else []) + (sym_ref(row[nv:], 7) if nv < 5 else [])
                np.testing.assert_allclose(ov[b, tt, :5].numpy(), exp, rtol=1e-5, atol=1e-6)
        assert float(ok[:, :, 0, 4:].abs().max()) == 0 and float(ok[:, :, 1].abs().max()) == 0  # rank-0 head
        assert float(ov[..., 5:].abs().max()) == 0
    a.fuse(ranks_k=[4, 2], rank_v=0, use_alpha=False)
    ok, ov = quant_roundtrip(a, lk, lv, 1, 1, 8)
    assert float(ov.abs().max()) == 0 and float(ok[:, :, 1, :2].abs().min()) > 0


# ----------------------------------------------------------------------------- the whole student
def test_student_scales_are_median_spectral_norms():
    t = teacher(12)
    t2 = TinyTransformer(TinyTransformerConfig(vocab_size=40, d_model=D_MODEL, n_layers=3, n_heads=HEADS,
                                               max_seq_len=16, tie_embeddings=False))
    for m, mode in [(t, "head"), (t, "joint"), (t2, "head"), (t2, "joint")]:
        sk, sv = [], []
        for b in m.blocks:
            W = b.attn.qkv.weight.detach().numpy().astype(np.float64)
            Wk = W[D_MODEL:2 * D_MODEL]
            if mode == "head":
                sk += [np.linalg.norm(Wk[h * 8:(h + 1) * 8], 2) for h in range(HEADS)]
            else:
                sk.append(np.linalg.norm(Wk, 2))
            sv.append(np.linalg.norm(W[2 * D_MODEL:], 2))
        lower_median = lambda v: sorted(v)[(len(v) - 1) // 2]    # torch.median: the lower middle value
        s = StarKVLM(m, mode)
        assert s.k_mode == mode
        for a in s.attn:
            assert float(a.scale_k) == pytest.approx(lower_median(sk), rel=1e-5)
            assert float(a.scale_v) == pytest.approx(lower_median(sv), rel=1e-5)
            assert a.k_mode == mode


def test_student_unembed_alphas_rank_totals_and_bytes():
    t = teacher(13)
    s = StarKVLM(t, "head")
    assert s.unembed is s.lm_head.weight
    tied = StarKVLM(teacher(13, tie=True), "head")
    assert tied.unembed is tied.embed.weight
    assert [x is a.alpha_k for x, a in zip(s.alphas("k"), s.attn)] == [True, True]
    assert [x is a.alpha_v for x, a in zip(s.alphas("v"), s.attn)] == [True, True]
    s.attn[0].fuse(ranks_k=[3, 1], rank_v=4, use_alpha=False)
    s.attn[1].fuse(ranks_k=[0, 6], rank_v=5, use_alpha=False)
    assert s.rank_totals() == (10, 9)
    assert kv_bytes_per_token(s) == (10 + 9) * 2            # fp16 default: 2 bytes/element
    assert kv_bytes_per_token(s, bits=3.0) == pytest.approx(19 * 3 / 8)
    assert dense_kv_bytes_per_token(t.cfg) == 2 * 2 * 16 * 2  # 128
    assert dense_kv_bytes_per_token(t.cfg, bits=4.0) == 32
    # hand count, hi_k=2, hi_v=4, int8 high part, fp16 scales (2 bytes):
    #   K ranks 3,1,(0 skipped),6: hi = 2,1,2 → bytes 2+.5+4 | 1+0+4 | 2+2+4 = 6.5 + 5 + 8 = 19.5
    #   V ranks 4,5: hi = 4,4 → 4+0+4 = 8 | 4+.5+4 = 8.5                                   = 16.5
    assert quant_bytes_per_token(s, 2, 4, 8) == pytest.approx(36.0)
    # int4 only (hi_bits 4): no high part, one scale per row: ranks 3,1,6,4,5 → .5·19 + 2·5 = 19.5
    assert quant_bytes_per_token(s, 2, 4, 4) == pytest.approx(19.5)
    # 16-bit high part and 4-byte scales: K: 2·2+.5+8, 1·2+8, 2·2+2+8 ; V: 4·2+8, 4·2+.5+8
    assert quant_bytes_per_token(s, 2, 4, 16, scale_bytes=4) == pytest.approx(12.5 + 10 + 14 + 16 + 16.5)


class Rec:
    def __init__(self):
        self.names = []

    def count(self, name):
        self.names.append(name)


@pytest.mark.parametrize("mode,rk", [("joint", 6), ("joint", 12), ("head", 5)])
def test_decode_logits_equals_forward(mode, rk):
    """joint K rank 6 ≤ head_dim goes through the kernel API; 12 > head_dim through decode_ref."""
    t = teacher(14)
    s = StarKVLM(t, mode).eval()
    for a in s.attn:
        a.fuse(ranks_k=[rk] if mode == "joint" else [rk, rk - 2], rank_v=7, use_alpha=False)
    idx = torch.randint(0, 40, (2, 6))
    rec = Rec()
    with torch.no_grad():
        got = s.decode_logits(idx, backend="torch", rec=rec, name="lr")
        ref = s(idx)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    assert rec.names == ["lr"] * (6 * LAYERS)


def test_forward_full_rank_matches_teacher_and_quant_changes_output():
    t = teacher(15)
    s = StarKVLM(t, "joint").eval()
    for a in s.attn:
        a.fuse(use_alpha=False)
    idx = torch.randint(0, 40, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(s(idx), t(idx), atol=1e-4, rtol=1e-4)
        q = {"hi_k": 3, "hi_v": 3, "hi_bits": 8}
        torch.testing.assert_close(s.decode_logits(idx, quant=q), s(idx, quant=q), atol=1e-4, rtol=1e-4)
        assert float((s(idx, quant=q) - s(idx)).abs().max()) > 1e-4


def test_fuse_reorders_trained_out_of_order_singular_values():
    """After training, σ (a parameter) need not be sorted: fuse re-sorts directions by the fused value so the
    kept ranks are the leading ones; explicit ranks keep the r largest fused values."""
    t = teacher(16)
    C, D = D_MODEL, D_MODEL // HEADS
    for ranks in (None, [2, 3]):
        a = LowRankAttn(t.blocks[0].attn, "head", 1.0, 1.0)
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            a.sk.copy_(torch.rand(a.sk.shape, generator=g) + 0.1)       # unsorted "trained" σ
            a.sv.copy_(torch.rand(a.sv.shape, generator=g) + 0.1)
            a.alpha_k.fill_(0.5)
            a.alpha_v.fill_(0.4)
        U, S, V = a.uk.detach().double().clone(), a.sk.detach().double().clone(), a.vk.detach().double().clone()
        Uv, Sv, Vv = a.uv.detach().double().clone(), a.sv.detach().double().clone(), a.vv.detach().double().clone()
        a.fuse(ranks_k=ranks, rank_v=None if ranks is None else 4)
        for h in range(HEADS):
            eff = (S[h] - 0.5).clamp_min(0)
            keep = eff > 0 if ranks is None else torch.zeros(D, dtype=torch.bool).index_fill_(
                0, torch.argsort(eff, descending=True)[:ranks[h]], True)
            exp = U[h] @ torch.diag(eff * keep) @ V[h]
            got = a.uk[h].double() @ torch.diag(a.mask_k[h].double()) @ a.vk[h].double()
            torch.testing.assert_close(got.detach(), exp, atol=1e-5, rtol=1e-5)
            r = int(keep.sum())
            assert a.mask_k[h].tolist() == [1.0] * r + [0.0] * (D - r)
            norms = a.vk[h].detach().norm(dim=1)                         # ‖row‖ = fused value, non-increasing
            assert all(float(x) >= float(y) - 1e-6 for x, y in zip(norms, norms[1:]))
            torch.testing.assert_close(norms[:r].double(), eff.sort(descending=True).values[:r], atol=1e-5, rtol=1e-5)
        effv = (Sv - 0.4).clamp_min(0)
        rv = int((effv > 0).sum()) if ranks is None else 4
        top = torch.argsort(effv, descending=True)[:rv]
        exp = Uv[:, top] @ torch.diag(effv[top]) @ Vv[top]
        torch.testing.assert_close((a.uv[:, :rv].double() @ a.vv[:rv].double()).detach(), exp, atol=1e-5, rtol=1e-5)


def test_decode_default_name_and_buffers_not_persistent():
    t = teacher(17)
    s = StarKVLM(t, "head").eval()
    for a in s.attn:
        a.fuse(ranks_k=[4, 6], rank_v=8, use_alpha=False)
    rec = Rec()
    idx = torch.randint(0, 40, (1, 3))
    with torch.no_grad():
        torch.testing.assert_close(s.decode_logits(idx, rec=rec), s(idx), atol=1e-4, rtol=1e-4)
    assert rec.names == ["lowrank_attention"] * (3 * LAYERS)
    keys = s.state_dict().keys()
    assert "rope_cos" not in keys and "rope_sin" not in keys
    assert torch.equal(s.rope_cos, t.rope_cos) and torch.equal(s.rope_sin, t.rope_sin)
    assert "attn.0.scale_k" in keys and "attn.0.mask_v" in keys


def test_student_owns_copies_and_defaults():
    t = teacher(18)
    s = StarKVLM(t)
    assert s.k_mode == "head" and s.attn[0].k_mode == "head" and s.cfg == t.cfg and s.cfg is not None
    assert s.embed.weight.data_ptr() != t.embed.weight.data_ptr()              # a deep copy: training the
    assert s.mlp[0].up.weight.data_ptr() != t.blocks[0].mlp.up.weight.data_ptr()   # student leaves the teacher
    assert s.attn[1].proj.weight.data_ptr() != t.blocks[1].attn.proj.weight.data_ptr()
    a = LowRankAttn(t.blocks[0].attn, "head", 1.0, 1.0)
    assert a.proj.weight.data_ptr() != t.blocks[0].attn.proj.weight.data_ptr()


def test_gate_k_uses_module_s_and_v_rank_boundary():
    t = teacher(19)
    a = LowRankAttn(t.blocks[0].attn, "joint", 1.3, 0.8)
    a.s = 3.0
    with torch.no_grad():
        a.alpha_k.fill_(0.2)
        a.alpha_v.copy_((a.sv[4] / a.scale_v).reshape(1))               # α exactly at σ̂_4: not counted
    gk = a.gate_k().detach()
    for r in range(D_MODEL):
        assert float(gk[0, r]) == pytest.approx(1.3 * st_ref(float(a.sk[0, r]) / 1.3, 0.2, 3.0, 0.0), abs=1e-5)
    assert a.ranks()[1] == 4
