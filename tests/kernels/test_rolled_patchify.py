"""Fused rolled patchify / unpatchify (walrus patch jitter) as index-map gathers: Triton (TRITON_INTERPRET=1)
vs the torch reference, exact equality with torch.roll / F.pad + F.unfold, constant-pad strips, round
trips, odd shapes, and the element formula by hand."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.rolled_patchify import (BENCHMARKS_SMALL, rolled_patchify, rolled_patchify_reference,
                                     rolled_unpatchify, rolled_unpatchify_reference)


def _field(b, c, n, m, seed):
    g = torch.Generator().manual_seed(seed)
    return 3.7 * torch.randn(b, c, n, m, generator=g) - 1.3


def _roll_map(n, shift, pad=0):
    """roll by `shift`, then circular pad `pad`: padded index -> source index."""
    return torch.remainder(torch.arange(n + 2 * pad) - pad - shift, n)


@pytest.mark.parametrize("n,p,shift", [(32, 4, (3, -5)), (64, 8, (-31, 17)), (64, 4, (1, 0)), (32, 4, (-15, 15))])
def test_nonoverlapping_equals_roll_unfold_exactly(n, p, shift):
    """kernel == stride, no pad: exactly torch.roll + F.unfold, on both resolutions and odd shifts."""
    x = _field(2, 3, n, n, seed=n + p)
    expect = F.unfold(torch.roll(x, shifts=shift, dims=(-2, -1)), kernel_size=p, stride=p)
    my, mx = _roll_map(n, shift[0]), _roll_map(n, shift[1])
    for backend in ("triton", "torch"):
        assert torch.equal(rolled_patchify(x, my, mx, p, p, backend=backend), expect), backend


@pytest.mark.parametrize("n,m,k,s,e,shift", [(32, 32, 8, 2, 5, (7, -3)), (64, 64, 8, 4, 6, (-29, 31)),
                                             (17, 23, 5, 3, 4, (9, -11)), (13, 13, 3, 1, 1, (0, 1))])
def test_overlapping_gather_parity_and_circular_pad(n, m, k, s, e, shift):
    """the gather that feeds the first strided hMLP conv (overlapping patches), odd shapes: Triton == reference
    == roll + circular F.pad + F.unfold; one element by the closed formula."""
    x = _field(3, 2, n, m, seed=n * m + k)
    my, mx = _roll_map(n, shift[0], e), _roll_map(m, shift[1], e)
    ref = rolled_patchify_reference(x, my, mx, k, s)
    tri = rolled_patchify(x, my, mx, k, s, backend="triton")
    assert torch.equal(tri, ref)
    rolled = torch.roll(x, shifts=shift, dims=(-2, -1))
    assert torch.equal(ref, F.unfold(F.pad(rolled, (e, e, e, e), mode="circular"), k, stride=s))
    n1, m1 = (n + 2 * e - k) // s + 1, (m + 2 * e - k) // s + 1
    b, c, i, j, ky, kx = 1, 1, n1 - 1, 0, k - 1, 2 % k
    val = x[b, c, (i * s + ky - e - shift[0]) % n, (j * s + kx - e - shift[1]) % m]
    assert tri[b, c * k * k + ky * k + kx, i * m1 + j] == val


@pytest.mark.parametrize("n,P,shift", [(16, 6, 3), (32, 9, -8), (12, 3, 0)])
def test_constant_strips_are_zero_and_match_pad_then_roll(n, P, shift):
    """a wall axis: constant pad P, then roll the padded rows (the non-periodic branch); columns periodic."""
    x = _field(2, 3, n, n, seed=P)
    c = torch.remainder(torch.arange(n + 2 * P) - shift, n + 2 * P)
    my = torch.where(c < P, -1, torch.where(c >= n + P, -2, c - P))
    mx = _roll_map(n, 5, 2)
    expect = F.pad(F.pad(torch.roll(x, 5, dims=-1), (2, 2, 0, 0), mode="circular"), (0, 0, P, P))
    expect = torch.roll(expect, shift, dims=-2)
    for backend in ("triton", "torch"):
        got = rolled_patchify(x, my, mx, 4, 2, backend=backend)
        assert torch.equal(got, F.unfold(expect, 4, stride=2)), backend
    assert (F.unfold(expect, 4, stride=2) == 0).any()


@pytest.mark.parametrize("n,e,shift", [(32, 5, (3, -13)), (64, 6, (-31, 1)), (19, 0, (5, 7))])
def test_unpatchify_parity_and_round_trip(n, e, shift):
    x = _field(2, 2, n, n, seed=3 * n + e)
    y = torch.roll(x, shifts=shift, dims=(-2, -1))
    if e:
        y = F.pad(y, (e, e, e, e), mode="circular")
    iy = e + torch.remainder(torch.arange(n) + shift[0], n)
    ix = e + torch.remainder(torch.arange(n) + shift[1], n)
    for backend in ("triton", "torch"):
        assert torch.equal(rolled_unpatchify(y, iy, ix, backend=backend), x), backend
    z = _field(2, 2, n + 2 * e, n + 2 * e, seed=99)                # an arbitrary decoded field
    expect = torch.roll(z[..., e:e + n, e:e + n], shifts=(-shift[0], -shift[1]), dims=(-2, -1))
    assert torch.equal(rolled_unpatchify(z, iy, ix, backend="triton"), rolled_unpatchify_reference(z, iy, ix))
    assert torch.equal(rolled_unpatchify_reference(z, iy, ix), expect)


@pytest.mark.parametrize("n,p", [(32, 4), (64, 8)])
def test_patch_round_trip_through_fold(n, p):
    """patchify -> fold -> unpatchify recovers the field exactly (non-overlapping patches)."""
    x = _field(2, 2, n, n, seed=n)
    shift = (p + 1, -(n // 2 - 1))
    patches = rolled_patchify(x, _roll_map(n, shift[0]), _roll_map(n, shift[1]), p, p, backend="triton")
    rolled = F.fold(patches, output_size=(n, n), kernel_size=p, stride=p)
    iy, ix = torch.remainder(torch.arange(n) + shift[0], n), torch.remainder(torch.arange(n) + shift[1], n)
    assert torch.equal(rolled_unpatchify(rolled, iy, ix, backend="triton"), x)


def test_gradient_path_uses_reference():
    x = _field(1, 2, 16, 16, seed=5).requires_grad_(True)
    out = rolled_patchify(x, _roll_map(16, 3, 1), _roll_map(16, -2, 1), 4, 2, backend="auto")
    out.sum().backward()
    # every pixel appears in the same number of patches of a circular domain: uniform gradient
    assert torch.allclose(x.grad, x.grad.flatten()[0].expand_as(x.grad))


def test_bad_inputs():
    m = torch.arange(4)
    with pytest.raises(ValueError, match="expected a"):
        rolled_patchify(torch.zeros(3, 4, 4), m, m, 2, 2)
    with pytest.raises(ValueError, match="outside"):
        rolled_patchify(torch.zeros(1, 1, 4, 4), torch.tensor([0, 1, 4, 2]), m, 2, 2)
    with pytest.raises(ValueError, match="outside"):
        rolled_patchify(torch.zeros(1, 1, 4, 4), torch.tensor([0, -3, 1, 2]), m, 2, 2)
    with pytest.raises(ValueError, match="larger than"):
        rolled_patchify(torch.zeros(1, 1, 4, 4), m, m, 5, 1)
    with pytest.raises(ValueError, match="outside"):
        rolled_unpatchify(torch.zeros(1, 1, 4, 4), torch.tensor([0, 4]), torch.tensor([0, 1]))


def test_bench_entry_runs():
    label, make, kern, ref, nbytes, _ = BENCHMARKS_SMALL[0]
    (x,) = make("cpu")
    for a, b in zip(kern(x), ref(x)):
        assert torch.equal(a, b)
    assert nbytes > 0
