"""Fused rolled patchify / unpatchify (walrus patch jitter): Triton (TRITON_INTERPRET=1) vs torch reference,
exact equality with torch.roll + F.unfold, round trips, odd shifts, both resolutions, independent index maps."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.rolled_patchify import (BENCHMARKS_SMALL, rolled_patchify, rolled_patchify_reference,
                                     rolled_unpatchify, rolled_unpatchify_reference)


def _field(b, c, n, m, seed):
    g = torch.Generator().manual_seed(seed)
    return 3.7 * torch.randn(b, c, n, m, generator=g) - 1.3


@pytest.mark.parametrize("n,p,shift", [(32, 4, (3, -5)), (64, 8, (-31, 17)), (64, 4, (1, 0)), (32, 4, (-15, 15))])
def test_nonoverlapping_equals_roll_unfold_exactly(n, p, shift):
    """kernel == stride, no pad: exactly torch.roll + F.unfold, on both resolutions and odd shifts."""
    x = _field(2, 3, n, n, seed=n + p)
    expect = F.unfold(torch.roll(x, shifts=shift, dims=(-2, -1)), kernel_size=p, stride=p)
    for backend in ("triton", "torch"):
        got = rolled_patchify(x, shift, p, p, 0, backend=backend)
        assert torch.equal(got, expect), backend


@pytest.mark.parametrize("n,m,k,s,e,shift", [(32, 32, 8, 2, 5, (7, -3)), (64, 64, 8, 4, 6, (-29, 31)),
                                             (17, 23, 5, 3, 4, (9, -11)), (13, 13, 3, 1, 1, (0, 1))])
def test_overlapping_gather_parity(n, m, k, s, e, shift):
    """the gather that feeds the first strided hMLP conv (overlapping patches, circular pad), odd shapes."""
    x = _field(3, 2, n, m, seed=n * m + k)
    ref = rolled_patchify_reference(x, shift, k, s, e)
    tri = rolled_patchify(x, shift, k, s, e, backend="triton")
    assert torch.equal(tri, ref)
    # independent index map: periodic extension by modular indexing
    n1, m1 = (n + 2 * e - k) // s + 1, (m + 2 * e - k) // s + 1
    b, c, i, j, ky, kx = 1, 1, n1 - 1, 0, k - 1, 2 % k
    val = x[b, c, (i * s + ky - e - shift[0]) % n, (j * s + kx - e - shift[1]) % m]
    assert tri[b, c * k * k + ky * k + kx, i * m1 + j] == val


@pytest.mark.parametrize("n,e,shift", [(32, 5, (3, -13)), (64, 6, (-31, 1)), (19, 0, (5, 7))])
def test_unpatchify_parity_and_round_trip(n, e, shift):
    x = _field(2, 2, n, n, seed=3 * n + e)
    y = F.pad(torch.roll(x, shifts=shift, dims=(-2, -1)), (e, e, e, e), mode="circular") if e else \
        torch.roll(x, shifts=shift, dims=(-2, -1))
    for backend in ("triton", "torch"):
        assert torch.equal(rolled_unpatchify(y, shift, e, backend=backend), x), backend
    # arbitrary decoded field: parity with the reference (crop + roll back)
    z = _field(2, 2, n + 2 * e, n + 2 * e, seed=99)
    assert torch.equal(rolled_unpatchify(z, shift, e, backend="triton"), rolled_unpatchify_reference(z, shift, e))


@pytest.mark.parametrize("n,p", [(32, 4), (64, 8)])
def test_patch_round_trip_through_fold(n, p):
    """patchify -> fold -> unpatchify recovers the field exactly (non-overlapping patches)."""
    x = _field(2, 2, n, n, seed=n)
    shift = (p + 1, -(n // 2 - 1))
    patches = rolled_patchify(x, shift, p, p, 0, backend="triton")
    rolled = F.fold(patches, output_size=(n, n), kernel_size=p, stride=p)
    assert torch.equal(rolled_unpatchify(rolled, shift, 0, backend="triton"), x)


def test_gradient_path_uses_reference():
    x = _field(1, 2, 16, 16, seed=5).requires_grad_(True)
    out = rolled_patchify(x, (3, -2), 4, 2, 1, backend="auto")
    out.sum().backward()
    # every pixel appears in the same number of patches of a circular domain: uniform gradient
    assert torch.allclose(x.grad, x.grad.flatten()[0].expand_as(x.grad))


def test_bad_inputs():
    with pytest.raises(ValueError, match="expected a"):
        rolled_patchify(torch.zeros(3, 4, 4), (0, 0), 2, 2)
    with pytest.raises(ValueError, match="crop"):
        rolled_unpatchify(torch.zeros(1, 1, 4, 4), (0, 0), 2)


def test_bench_entry_runs():
    label, make, kern, ref, nbytes, _ = BENCHMARKS_SMALL[0]
    (x,) = make("cpu")
    for a, b in zip(kern(x), ref(x)):
        assert torch.equal(a, b)
    assert nbytes > 0
