"""Parity of the tiled Chamfer kernel (Triton under TRITON_INTERPRET=1) with its torch.cdist reference on
odd shapes, and independent checks of the reference (brute-force loops, symmetry, identity, translation)."""
from __future__ import annotations

import pytest
import torch

from kernels.chamfer import chamfer_distance, chamfer_distance_reference, nearest_sq, nearest_sq_reference
from kernels.testing import assert_close


def _clouds(b, p, q, d, seed, scale=2.5):
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(b, p, d, generator=g), scale * torch.randn(b, q, d, generator=g) + 0.3


@pytest.mark.parametrize("b,p,q,d", [(1, 1, 1, 3), (2, 5, 3, 3), (3, 33, 65, 3), (1, 67, 31, 2), (2, 40, 97, 5)])
def test_parity_odd_shapes(b, p, q, d):
    x, y = _clouds(b, p, q, d, seed=p * 7 + q)
    for a, r in zip(nearest_sq(x, y, backend="triton"), nearest_sq_reference(x, y)):
        assert_close(a, r, 1e-4, 1e-5, "nearest squared distance")
    assert_close(chamfer_distance(x, y, backend="triton"), chamfer_distance_reference(x, y), 1e-5, 1e-5, "chamfer")


def test_reference_matches_brute_force():
    x, y = _clouds(1, 9, 7, 3, seed=1)
    dxy = [min(float(((x[0, i] - y[0, j]) ** 2).sum()) for j in range(7)) for i in range(9)]
    dyx = [min(float(((y[0, j] - x[0, i]) ** 2).sum()) for i in range(9)) for j in range(7)]
    a, b = nearest_sq_reference(x, y)
    assert_close(a[0], torch.tensor(dxy), 1e-4, 1e-5)
    assert_close(b[0], torch.tensor(dyx), 1e-4, 1e-5)


def test_symmetric_zero_on_identity_and_translation():
    x, y = _clouds(2, 21, 13, 3, seed=2)
    for backend in ("torch", "triton"):
        assert_close(chamfer_distance(x, y, backend=backend), chamfer_distance(y, x, backend=backend), 1e-5, 1e-5)
        assert float(chamfer_distance(x, x, backend=backend).abs().max()) < 1e-3
        shift = torch.tensor([0.0, 0.0, 0.7])                      # a single-point cloud moved by 0.7 → CD = 1.4
        one = x[:, :1]
        assert_close(chamfer_distance(one, one + shift, backend=backend), torch.full((2,), 1.4), 1e-5, 1e-5)


def test_bad_shapes():
    with pytest.raises(ValueError, match="batch"):
        nearest_sq(torch.zeros(2, 3, 3), torch.zeros(1, 3, 3))
    with pytest.raises(ValueError, match="empty"):
        nearest_sq(torch.zeros(1, 0, 3), torch.zeros(1, 3, 3))
