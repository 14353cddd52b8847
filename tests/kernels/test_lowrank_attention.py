"""kernels/lowrank_attention.py: Triton (interpreter) vs reference on odd shapes, an independent brute force
(explicit rotation matrices, per-head loops, exp/sum softmax), the quantized path and bit-exact packing."""
from __future__ import annotations

import math

import pytest
import torch

from kernels.lowrank_attention import (BENCHMARKS_SMALL, decode, decode_quant, decode_ref, dequantize_latent,
                                       kv_bytes, materialize_sdpa, pack_int4, quantize_latent, random_inputs,
                                       unpack_int4)


def brute_force(q, kl, ku, vl, vu, pos, base):
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
            th = p * base ** (-2.0 * i / D)
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


SHAPES = [  # B, Hq, Hkv, D, T, Rk, Rv
    (2, 4, 2, 32, 37, 8, 12),     # GQA group 2, odd T, Rk < D with zero-padded heads
    (1, 6, 2, 64, 23, 64, 100),   # group 3, head_dim 64, full Rk
    (3, 2, 2, 32, 1, 5, 1),       # single cached token, Rv = 1
    (2, 8, 2, 64, 50, 17, 31),    # group 4, T spans several blocks
    (1, 3, 1, 24, 19, 7, 33),     # D/2 not a power of two, MQA
]


@pytest.mark.parametrize("shape", SHAPES)
def test_triton_matches_reference(shape):
    x = random_inputs(*shape, seed=sum(shape), pos_offset=11)
    torch.testing.assert_close(decode(*x, 500.0, backend="triton"), decode_ref(*x, 500.0), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("shape", SHAPES[:3])
def test_reference_matches_brute_force(shape):
    q, kl, ku, vl, vu, pos = random_inputs(*shape, seed=7, pos_offset=3)
    assert int(pos[0]) > 0 and (pos[1:] - pos[:-1] > 0).all() if pos.numel() > 1 else True
    bf = brute_force(q, kl, ku, vl, vu, pos, 1000.0)
    torch.testing.assert_close(decode_ref(q, kl, ku, vl, vu, pos, 1000.0).double(), bf, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(decode(q, kl, ku, vl, vu, pos, 1000.0, backend="triton").double(), bf,
                               atol=1e-4, rtol=1e-4)


def test_random_unsorted_positions_and_float64():
    q, kl, ku, vl, vu, _ = random_inputs(2, 4, 2, 32, 13, 9, 20, seed=5, dtype=torch.float64)
    pos = torch.randperm(200)[:13] + 40  # arbitrary positions, not sorted, not from 0
    bf = brute_force(q, kl, ku, vl, vu, pos, 10000.0)
    torch.testing.assert_close(decode_ref(q, kl, ku, vl, vu, pos, 10000.0), bf, atol=1e-5, rtol=1e-5)  # angles in fp32
    torch.testing.assert_close(decode(q, kl, ku, vl, vu, pos, 10000.0, backend="triton").double(), bf,
                               atol=1e-4, rtol=1e-4)


def test_zero_padding_is_inert():
    """A head padded with zero latent columns gives the same output as without the padding."""
    q, kl, ku, vl, vu, pos = random_inputs(1, 2, 2, 32, 9, 6, 8, seed=2, pad_heads=False)
    pad_l = torch.cat([kl, torch.randn(1, 9, 2, 5)], dim=-1)
    pad_u = torch.cat([ku, torch.zeros(2, 5, 32)], dim=1)
    torch.testing.assert_close(decode(q, pad_l, pad_u, vl, vu, pos, backend="triton"), decode_ref(q, kl, ku, vl, vu, pos),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("bits", [4, 8, 16])
def test_pack_unpack_bit_exact(bits):
    g = torch.Generator().manual_seed(bits)
    for n in (1, 2, 7, 16):
        codes = torch.randint(-8, 8, (5, 3, n), generator=g).to(torch.int8)
        packed = pack_int4(codes)
        assert packed.dtype == torch.uint8 and packed.shape[-1] == (n + 1) // 2
        assert torch.equal(unpack_int4(packed, n), codes)
    # a full mixed-precision round trip is exact on values that are already on the grid
    x = torch.randint(-7, 8, (4, 6, 10), generator=g).float() * 0.25
    x[..., 0] = 7 * 0.25  # the int4 grid step equals max|x|/7 per row
    x[..., 3] = -7 * 0.25
    ql = quantize_latent(x, n_hi=3, hi_bits=8 if bits != 16 else 16)
    torch.testing.assert_close(dequantize_latent(ql)[..., 3:], x[..., 3:], atol=0, rtol=0)


def test_quant_error_is_bounded_and_decreases_with_more_hi_ranks():
    g = torch.Generator().manual_seed(11)
    x = torch.randn(8, 20, 16, generator=g) * torch.linspace(3, 0.1, 16)
    diffs = [(dequantize_latent(quantize_latent(x, n)) - x).abs() for n in (0, 4, 16)]
    # the max error need not move (its column may stay int4), the mean error must fall
    mean = [float(d.mean()) for d in diffs]
    assert mean[2] < mean[1] < mean[0]
    assert float(diffs[0].max()) <= float(x.abs().amax()) / 7 / 2 + 1e-6  # int4: half a step of amax/7


@pytest.mark.parametrize("shape,n_hi,hi_bits", [((2, 4, 2, 32, 37, 8, 12), 3, 8), ((1, 6, 3, 64, 21, 17, 40), 16, 16),
                                                 ((2, 2, 1, 32, 5, 5, 3), 0, 8)])
def test_quantized_path_matches_reference(shape, n_hi, hi_bits):
    q, kl, ku, vl, vu, pos = random_inputs(*shape, seed=3, pos_offset=9)
    kq = quantize_latent(kl, min(n_hi, kl.shape[-1]), hi_bits)
    vq = quantize_latent(vl, min(n_hi, vl.shape[-1]), hi_bits)
    tri = decode_quant(q, kq, ku, vq, vu, pos, backend="triton")
    ref = decode_quant(q, kq, ku, vq, vu, pos, backend="torch")
    torch.testing.assert_close(tri, ref, atol=1e-4, rtol=1e-4)
    # and it approximates the unquantized attention
    assert float((ref - decode_ref(q, kl, ku, vl, vu, pos)).abs().max()) < 0.5


def test_bad_shapes_rejected():
    q, kl, ku, vl, vu, pos = random_inputs(1, 3, 2, 32, 4, 4, 4)
    with pytest.raises(ValueError, match="multiple"):
        decode(q, kl, ku, vl, vu, pos, backend="torch")
    q, kl, ku, vl, vu, pos = random_inputs(1, 2, 2, 32, 4, 4, 4)
    with pytest.raises(ValueError, match="positions"):
        decode(q, kl, ku, vl, vu, pos[:2], backend="torch")


def test_bench_entry_runs_and_reports_bytes():
    label, make, kern, ref, nbytes, _ = BENCHMARKS_SMALL[0]
    x = make("cpu")
    torch.testing.assert_close(kern(*x), ref(*x), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(materialize_sdpa(*x), decode_ref(*x), atol=1e-5, rtol=1e-5)
    by = kv_bytes(2, 37, 2, 32, 8, 12)
    assert nbytes == by["latent"] < by["dense"]
