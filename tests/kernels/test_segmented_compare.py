"""segmented_compare: Triton (interpreter) == torch reference == plain Python loops, exactly."""
from __future__ import annotations

import pytest
import torch

from kernels.segmented_compare import random_inputs, segmented_compare, segmented_compare_reference


def _brute(proto, actual, seg, k):
    out = torch.zeros(proto.shape[0], k, 7, dtype=torch.int64)
    B, H, W, _ = proto.shape
    for b in range(B):
        for y in range(H):
            for x in range(W):
                s = int(seg[b, y, x])
                if s < 0 or s >= k:
                    continue
                for c in range(3):
                    p, a = int(proto[b, y, x, c]), int(actual[b, y, x, c])
                    out[b, s] += torch.tensor([1, abs(p - a), p, a, p * p, a * a, p * a])
    return out


def test_reference_matches_brute_force():
    proto, actual, seg, k = random_inputs(2, 5, 7, 4, seed=1)
    assert torch.equal(segmented_compare_reference(proto, actual, seg, k), _brute(proto, actual, seg, k))


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 37, 29, 5), (3, 13, 61, 9), (1, 70, 33, 40)])
def test_triton_interpreter_parity_exact(shape):
    b, h, w, k = shape
    proto, actual, seg, k = random_inputs(b, h, w, k, seed=sum(shape))
    tri = segmented_compare(proto, actual, seg, k, backend="triton")
    ref = segmented_compare(proto, actual, seg, k, backend="torch")
    assert tri.dtype == torch.int64 and torch.equal(tri, ref)


def test_identical_images_and_ids_outside_range():
    proto, _, seg, k = random_inputs(1, 9, 11, 3, seed=3)
    seg[0, 0, :] = 7  # ids >= K are ignored like negative ids
    out = segmented_compare(proto, proto.clone(), seg, k, backend="triton")
    assert int(out[..., 1].sum()) == 0 and torch.equal(out[..., 4], out[..., 6])
    assert int(out[..., 0].sum()) == 3 * int(((seg >= 0) & (seg < k)).sum())


def test_bad_shapes():
    proto, actual, seg, k = random_inputs(1, 4, 4, 2, seed=0)
    with pytest.raises(ValueError, match="seg must be"):
        segmented_compare(proto, actual, seg[:, :3], k)
    with pytest.raises(ValueError, match="proto/actual"):
        segmented_compare(proto, actual[:, :3], seg, k)
