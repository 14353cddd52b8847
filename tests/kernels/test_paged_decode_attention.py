"""kernels/paged_decode_attention.py: Triton (interpreter) vs reference on odd shapes; reference vs dense SDPA."""
from __future__ import annotations

import math

import pytest
import torch

from kernels.paged_decode_attention import BENCHMARKS_SMALL, paged_decode_attention, random_inputs


@pytest.mark.parametrize("B,H,D,BS,L,S", [(3, 2, 16, 4, 37, 2), (5, 3, 12, 8, 29, 1), (1, 1, 8, 16, 5, 0),
                                          (4, 2, 32, 4, 64, 3)])
def test_triton_matches_reference_on_odd_shapes(B, H, D, BS, L, S):
    x = random_inputs(B, H, D, BS, L, S, seed=B * 11 + D)
    tri = paged_decode_attention(*x, backend="triton")
    ref = paged_decode_attention(*x, backend="torch")
    torch.testing.assert_close(tri, ref, atol=1e-5, rtol=1e-5)


def test_reference_equals_dense_attention_with_shared_prefix():
    q, k, v, table, lengths = random_inputs(4, 2, 8, 4, 23, 2, seed=3, dtype=torch.float64)
    out = paged_decode_attention(q, k, v, table, lengths, backend="torch")
    assert (table[:, :2] == table[0, :2]).all()  # prefix blocks are shared
    for b in range(4):
        n = int(lengths[b])
        ks = torch.cat([k[int(i)] for i in table[b]])[:n]   # (n, H, D) built independently of the reference
        vs = torch.cat([v[int(i)] for i in table[b]])[:n]
        for h in range(2):
            w = torch.softmax(ks[:, h] @ q[b, h] / math.sqrt(8), 0)
            torch.testing.assert_close(out[b, h], w @ vs[:, h])


def test_bad_lengths_rejected():
    q, k, v, table, lengths = random_inputs(2, 1, 4, 4, 8, 0)
    with pytest.raises(ValueError, match="lengths"):
        paged_decode_attention(q, k, v, table, lengths * 0, backend="torch")


def test_bench_entry_runs():
    label, make, kern, ref, _, _ = BENCHMARKS_SMALL[0]
    x = make("cpu")
    torch.testing.assert_close(kern(*x), ref(*x), atol=1e-5, rtol=1e-5)
