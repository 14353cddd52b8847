"""kernels/lowrank_attention.py: Triton (interpreter) vs reference on odd shapes, an independent brute force
(explicit rotation matrices, per-head loops, exp/sum softmax), the quantized path (mixed precision, scale
groups, fp16 hi part), bit-exact packing, stored bytes, the torch version of the fused algorithm, the bench row."""
from __future__ import annotations

import math

import pytest
import torch

from kernels.lowrank_attention import (BENCHMARKS_SMALL, bench_rows, decode, decode_latent_torch, decode_quant,
                                       decode_ref, dense_sdpa, dequantize_latent, inv_freq, kv_bytes,
                                       materialize_sdpa, pack_int4, quantize_latent, random_inputs, rope_rotate_half,
                                       unpack_int4)


def brute_force(q, kl, ku, vl, vu, pos, freqs):
    """Written independently of the module: float64, rotation matrix per position, loop over heads."""
    q, kl, ku, vl, vu = (t.double() for t in (q, kl, ku, vl, vu))
    B, Hq, D = q.shape
    T, Hkv = kl.shape[1:3]
    half = D // 2
    out = torch.zeros(B, Hq, D, dtype=torch.float64)
    rots = []
    for p in pos.tolist():
        R = torch.zeros(D, D, dtype=torch.float64)
        for i in range(half):
            th = p * float(freqs[i])
            c, s = math.cos(th), math.sin(th)
            R[i, i], R[i, i + half], R[i + half, i], R[i + half, i + half] = c, -s, s, c
        rots.append(R)
    for b in range(B):
        V = (vl[b] @ vu).view(T, Hkv, D)
        for h in range(Hq):
            g = h // (Hq // Hkv)
            K = torch.stack([rots[t] @ (kl[b, t, g] @ ku[g]) for t in range(T)])
            sc = K @ q[b, h] / math.sqrt(D)
            w = torch.exp(sc - sc.max())
            out[b, h] = (w / w.sum()) @ V[:, g]
    return out


def base_freqs(D, base):
    return [base ** (-2.0 * i / D) for i in range(D // 2)]


SHAPES = [  # B, Hq, Hkv, D, T, Rk, Rv
    (2, 4, 2, 32, 37, 8, 12),     # GQA group 2, T spans 3 blocks of 16, Rk < D with zero-padded heads
    (1, 6, 2, 64, 23, 64, 100),   # group 3, head_dim 64, full Rk
    (3, 2, 2, 32, 1, 5, 1),       # single cached token, Rv = 1
    (1, 3, 1, 24, 19, 40, 33),    # D/2 not a power of two, MQA, joint-K rank above head_dim
]


@pytest.mark.parametrize("shape", SHAPES)
def test_triton_matches_reference(shape):
    x = random_inputs(*shape, seed=sum(shape), pos_offset=11)
    torch.testing.assert_close(decode(*x, 500.0, backend="triton"), decode_ref(*x, 500.0), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(decode_latent_torch(*x, 500.0), decode_ref(*x, 500.0), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape", SHAPES[:2])
def test_reference_matches_brute_force(shape):
    q, kl, ku, vl, vu, pos = random_inputs(*shape, seed=7, pos_offset=3)
    bf = brute_force(q, kl, ku, vl, vu, pos, base_freqs(shape[3], 1000.0))
    torch.testing.assert_close(decode_ref(q, kl, ku, vl, vu, pos, 1000.0).double(), bf, atol=1e-5, rtol=1e-5)


def test_inverse_frequency_tensor_unsorted_positions_and_float64():
    """rope given as the model's own inverse frequencies (e.g. Llama-3.1's scaled ones) instead of a base."""
    q, kl, ku, vl, vu, _ = random_inputs(2, 4, 2, 32, 13, 9, 20, seed=5, dtype=torch.float64)
    pos = torch.randperm(200, generator=torch.Generator().manual_seed(1))[:13] + 40   # not sorted, not from 0
    freqs = torch.tensor(base_freqs(32, 10000.0)) * torch.linspace(1.0, 0.125, 16)   # a non-geometric spectrum
    bf = brute_force(q, kl, ku, vl, vu, pos, freqs.tolist())
    torch.testing.assert_close(decode_ref(q, kl, ku, vl, vu, pos, freqs), bf, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(decode(q, kl, ku, vl, vu, pos, freqs, backend="triton").double(), bf,
                               atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(inv_freq(32, 10000.0, "cpu"), torch.tensor(base_freqs(32, 10000.0)), atol=1e-7, rtol=1e-6)
    with pytest.raises(ValueError, match="inverse frequencies must be"):
        inv_freq(32, torch.ones(8), "cpu")
    with pytest.raises(ValueError, match="finite number > 1"):
        rope_rotate_half(torch.ones(1, 4), torch.zeros(1), float("nan"))


def test_zero_padding_is_inert():
    """A head padded with zero latent columns gives the same output as without the padding."""
    q, kl, ku, vl, vu, pos = random_inputs(1, 2, 2, 32, 9, 6, 8, seed=2, pad_heads=False)
    pad_l = torch.cat([kl, torch.randn(1, 9, 2, 5)], dim=-1)
    pad_u = torch.cat([ku, torch.zeros(2, 5, 32)], dim=1)
    torch.testing.assert_close(decode(q, pad_l, pad_u, vl, vu, pos, backend="triton"), decode_ref(q, kl, ku, vl, vu, pos),
                               atol=1e-5, rtol=1e-5)


def test_pack_unpack_bit_exact_and_grid_round_trip():
    g = torch.Generator().manual_seed(3)
    for n in (1, 2, 7, 16):
        codes = torch.randint(-8, 8, (5, 3, n), generator=g).to(torch.int8)
        packed = pack_int4(codes)
        assert packed.dtype == torch.uint8 and packed.shape[-1] == (n + 1) // 2
        assert torch.equal(unpack_int4(packed, n), codes)
    x = torch.randint(-7, 8, (4, 6, 10), generator=g).float() * 0.25   # already on the int4 grid (step 0.25)
    x[..., 3] = 7 * 0.25
    x[..., 4] = -7 * 0.25
    for hi_bits in (8, 16):
        ql = quantize_latent(x, n_hi=3, hi_bits=hi_bits)
        torch.testing.assert_close(dequantize_latent(ql)[..., 3:], x[..., 3:], atol=0, rtol=0)


def test_stored_bytes_and_scale_groups_by_hand():
    x = torch.randn(2, 5, 11, generator=torch.Generator().manual_seed(4))
    ql = quantize_latent(x, 3, 8)
    # per row: 3 int8 + 1 fp16 scale + ceil(8/2) packed + 1 fp16 scale = 3 + 2 + 4 + 2
    assert ql.nbytes() == 10 * (3 + 2 + 4 + 2) and ql.hi_scale.dtype == torch.float16
    qg = quantize_latent(x, 0, 8, lo_group=4)
    assert qg.lo_scale.shape == (2, 5, 3) and qg.hi_scale.shape == (2, 5, 0)
    assert qg.nbytes() == 10 * (6 + 3 * 2)
    qf = quantize_latent(x, 4, 16)
    assert qf.hi.dtype == torch.float16 and qf.nbytes() == 10 * (4 * 2 + 4 + 2)
    # each group's scale is its own max/7 (fp16): a group of small values keeps its precision
    y = torch.cat([torch.full((1, 4), 100.0), torch.full((1, 4), 0.01)], -1)
    torch.testing.assert_close(dequantize_latent(quantize_latent(y, 0, 8, lo_group=4)), y, atol=1e-4, rtol=1e-3)
    assert float(dequantize_latent(quantize_latent(y, 0, 8))[0, 4:].abs().max()) == 0   # one scale: rounded away


def test_quant_error_is_bounded_and_decreases_with_more_hi_ranks():
    g = torch.Generator().manual_seed(11)
    x = torch.randn(8, 20, 16, generator=g) * torch.linspace(3, 0.1, 16)
    diffs = [(dequantize_latent(quantize_latent(x, n)) - x).abs() for n in (0, 4, 16)]
    mean = [float(d.mean()) for d in diffs]
    assert mean[2] < mean[1] < mean[0]
    assert float(diffs[0].max()) <= float(x.abs().amax()) / 7 / 2 * 1.001 + 1e-6  # half a step (fp16-rounded scale)


@pytest.mark.parametrize("shape,n_hi,hi_bits,group", [((2, 4, 2, 32, 37, 8, 12), 3, 8, None),
                                                       ((1, 6, 3, 64, 21, 17, 40), 16, 16, 5),
                                                       ((2, 2, 1, 32, 5, 5, 3), 0, 8, 2)])
def test_quantized_path_matches_reference(shape, n_hi, hi_bits, group):
    q, kl, ku, vl, vu, pos = random_inputs(*shape, seed=3, pos_offset=9)
    kq = quantize_latent(kl, min(n_hi, kl.shape[-1]), hi_bits, group)
    vq = quantize_latent(vl, min(n_hi, vl.shape[-1]), hi_bits, group)
    tri = decode_quant(q, kq, ku, vq, vu, pos, backend="triton")
    ref = decode_quant(q, kq, ku, vq, vu, pos, backend="torch")
    torch.testing.assert_close(tri, ref, atol=1e-4, rtol=1e-4)
    assert float((ref - decode_ref(q, kl, ku, vl, vu, pos)).abs().max()) < 0.5   # and it approximates fp attention


def test_bad_shapes_rejected():
    q, kl, ku, vl, vu, pos = random_inputs(1, 3, 2, 32, 4, 4, 4)
    with pytest.raises(ValueError, match="multiple"):
        decode(q, kl, ku, vl, vu, pos, backend="torch")
    q, kl, ku, vl, vu, pos = random_inputs(1, 2, 2, 32, 4, 4, 4)
    with pytest.raises(ValueError, match="positions"):
        decode(q, kl, ku, vl, vu, pos[:2], backend="torch")
    with pytest.raises(ValueError, match="n_hi"):
        quantize_latent(kl, 5)
    with pytest.raises(ValueError, match="lo_group"):
        quantize_latent(kl, 0, 8, 0)


def test_bench_paths_agree_and_row_reports_ratios():
    label, make, kern, ref, nbytes, _ = BENCHMARKS_SMALL[0]
    x = make("cpu")
    q, kl, ku, vl, vu, pos = x
    torch.testing.assert_close(materialize_sdpa(*x), decode_ref(*x), atol=1e-5, rtol=1e-5)
    k = rope_rotate_half(torch.einsum("bthr,hrd->bhtd", kl, ku), pos, 10000.0)
    v = (vl @ vu).view(2, 37, 2, 32).transpose(1, 2)
    torch.testing.assert_close(dense_sdpa(q, k, v), decode_ref(*x), atol=1e-5, rtol=1e-5)
    by = kv_bytes(2, 37, 2, 32, 8, 12)
    assert nbytes == by["latent"] == 4 * 2 * 37 * 2 * (8 + 12) and by["dense"] == 4 * 2 * 37 * 2 * 2 * 32
    (row,) = bench_rows("cpu", small=True, reps=1)
    assert row["device"] == "cpu" and row["paper_speedup"] == 6.9 and "skipped" in row["gpu_entry"]
    assert row["ratio_materialize_over_latent"] > 0 and row["ratio_dense_over_latent"] > 0


def test_cpu_shapes_run_the_split_merge_path():
    """The decode kernel splits the cached tokens (flash-decoding) and merges the partial softmaxes after it: the
    interpreter runs several splits at the test shapes (T = 37: 3 splits, the last one partial), so the parity
    tests above check the merge; a single-token cache is one split."""
    from kernels.lowrank_attention import n_splits

    assert n_splits(2, 2, 37, torch.device("cpu")) == 3
    assert n_splits(2, 2, 1, torch.device("cpu")) == 1
    q, kl, ku, vl, vu, pos = random_inputs(1, 4, 2, 16, 1, 4, 6)
    torch.testing.assert_close(decode(q, kl, ku, vl, vu, pos, backend="triton"), decode_ref(q, kl, ku, vl, vu, pos),
                               atol=1e-5, rtol=1e-5)
