"""Walrus' patch jitterers as per-axis index maps (official models/shared_utils/patch_jitterers.py).

Boundary conditions use The Well's codes (the_well.data.datasets.BoundaryCondition): WALL 0, OPEN 1,
PERIODIC 2; ``bcs`` is one (low, high) pair per spatial axis of a (…, H, W) field, axis 0 = rows.
With the hMLP strides (s1, s2), patch p = s1·s2 and the overlap pad e = hmlp_pad(s1, s2):

``domain`` = FixedPatchJittererBoundaryPad (the one the official runs use, use_periodic_fixed_jitter):
    non-periodic axes: constant pad P = p/2 + e, then 3 flag channels are appended; every axis is
    rolled by one integer r (periodic: r ~ U{-(N/2-1)..N/2-1} on the unpadded axis; non-periodic:
    r ~ U{-(P-1)..P-1} on the padded one), then periodic axes are circularly padded by e.
    Un-jitter: crop the circular pad, roll back, crop the constant pad.
``patch``  = PatchJittererBoundaryPad (the paper's description): constant pad P on non-periodic axes,
    circular pad e on periodic ones, flags, then roll the PADDED grid by r ~ U{-(p/2-1)..p/2-1}.
    Un-jitter: roll back, then crop every pad.
``none``   = jitter_patches=False with the learned pad: pads of e (constant or circular), flags, no roll.

Flag channels (appended after the fields, as torch.cat((x, bc_flags), dim=2)): channel 0 is a constant
1 (the bias channel) except on constant-padded strips, channel 1 counts the WALL strips a cell lies in,
channel 2 the OPEN strips. The per-block token roll (isotropic_model.py:371) rolls periodic axes only.

Each pad/roll sequence is one index map per axis (kernels/rolled_patchify.py gathers with it);
``official_sequence`` below replays the official torch.roll / F.pad order for the tests.
"""
from __future__ import annotations

from typing import Literal, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from stages.walrus.common import hmlp_pad

WALL, OPEN, PERIODIC = 0, 1, 2
BC_NAMES = {"wall": WALL, "open": OPEN, "periodic": PERIODIC}
Mode = Literal["none", "patch", "domain"]
BCs = tuple[tuple[int, int], ...]
PERIODIC_2D: BCs = ((PERIODIC, PERIODIC), (PERIODIC, PERIODIC))


def as_bcs(bcs: Sequence[Sequence[int | str]]) -> BCs:
    """((lo, hi), ...) of ints from ints or names; a periodic axis must be periodic on both sides."""
    out = []
    for ax, pair in enumerate(bcs):
        lo, hi = (BC_NAMES[v] if isinstance(v, str) else int(v) for v in pair)
        if (lo == PERIODIC) != (hi == PERIODIC):
            raise ValueError(f"bcs: axis {ax} is periodic on one side only ({pair})")
        if lo not in (WALL, OPEN, PERIODIC) or hi not in (WALL, OPEN, PERIODIC):
            raise ValueError(f"bcs: axis {ax} has an unknown boundary code ({pair})")
        out.append((lo, hi))
    return tuple(out)


def constant_pad(bc: tuple[int, int], mode: Mode, p: int, e: int) -> int:
    """Per-side constant pad of a non-periodic axis (get_paddings: stride/2 + extra when jittering)."""
    return 0 if bc[0] == PERIODIC else (e if mode == "none" else p // 2 + e)


def padded_size(n: int, bc: tuple[int, int], mode: Mode, p: int, e: int) -> int:
    return n + 2 * (e if bc[0] == PERIODIC else constant_pad(bc, mode, p, e))


def shift_half(n: int, bc: tuple[int, int], mode: Mode, p: int, e: int) -> int:
    """h of the official draw randint(-(h-1), h): shifts lie in -(h-1)..h-1 (h <= 1: no shift)."""
    if mode == "none":
        return 0
    if mode == "patch":
        return p // 2
    return n // 2 if bc[0] == PERIODIC else constant_pad(bc, mode, p, e)


def forward_map(n: int, bc: tuple[int, int], mode: Mode, shift, p: int, e: int,
                device: torch.device | str = "cpu") -> torch.Tensor:
    """Source index along one axis for every position of the grid the encoder sees (-1 / -2: the low /
    high constant strip). ``shift`` is an int or a 0-d tensor (batched under vmap)."""
    if bc[0] == PERIODIC:
        i = torch.arange(n + 2 * e, device=device)
        if mode == "patch":     # circular pad, then roll the padded grid
            return torch.remainder(torch.remainder(i - shift, n + 2 * e) - e, n)
        return torch.remainder(i - e - shift, n)      # roll, then circular pad (domain; none: shift 0)
    P = constant_pad(bc, mode, p, e)
    i = torch.arange(n + 2 * P, device=device)
    c = torch.remainder(i - shift, n + 2 * P)         # constant pad, then roll the padded grid
    return torch.where(c < P, torch.full_like(c, -1), torch.where(c >= n + P, torch.full_like(c, -2), c - P))


def inverse_map(n: int, bc: tuple[int, int], mode: Mode, shift, p: int, e: int,
                device: torch.device | str = "cpu") -> torch.Tensor:
    """Index into the decoded padded grid for every output position (un-jitter: roll back + crop)."""
    i = torch.arange(n, device=device)
    if bc[0] == PERIODIC:
        if mode == "patch":     # roll back on the padded grid, then crop e
            return torch.remainder(i + e + shift, n + 2 * e)
        return e + torch.remainder(i + shift, n)      # crop e, roll back
    P = constant_pad(bc, mode, p, e)
    return torch.remainder(i + P + shift, n + 2 * P)  # roll back, crop P


def boundary_flags(map_y: torch.Tensor, map_x: torch.Tensor, bcs: BCs, dtype=torch.float32) -> torch.Tensor:
    """(3, H', W') flag channels of the padded grid: bias (1 off constant strips), #WALL strips, #OPEN strips."""
    cy, cx = map_y[:, None], map_x[None, :]
    inside = ((cy >= 0) & (cx >= 0)).to(dtype)
    counts = []
    for kind in (WALL, OPEN):
        total = torch.zeros_like(inside)
        for code, bc in ((cy, bcs[0]), (cx, bcs[1])):
            if bc[0] == PERIODIC:
                continue
            total = total + ((code == -1) & (bc[0] == kind)).to(dtype) + ((code == -2) & (bc[1] == kind)).to(dtype)
        counts.append(total)
    return torch.stack([inside, *counts])


def draw_jitter(rng: np.random.Generator, shape: tuple[int, int], bcs: BCs, mode: Mode, p: int, e: int,
                depth: int, token_roll: bool) -> tuple[np.ndarray, np.ndarray]:
    """ALGO: one integer shift per axis per forward call (shared over batch and time), and the per-block
    token rolls randint(0, n_tokens) of periodic axes. Returns shift (2,), rolls (depth, 2), int64."""
    shift = np.zeros(2, dtype=np.int64)
    for ax, (n, bc) in enumerate(zip(shape, bcs)):
        h = shift_half(n, bc, mode, p, e)
        if h > 1:
            shift[ax] = rng.integers(-(h - 1), h)
    rolls = np.zeros((depth, 2), dtype=np.int64)
    if token_roll and mode != "none":
        for ax, (n, bc) in enumerate(zip(shape, bcs)):
            if bc[0] == PERIODIC:
                rolls[:, ax] = rng.integers(0, n // p, size=depth)
    return shift, rolls


def axis_maps(shape: tuple[int, int], bcs: BCs, mode: Mode, shift, s1: int, s2: int, device="cpu"):
    """(map_y, map_x, inv_y, inv_x) for one forward call; shift (2,) ints or a tensor."""
    p, e = s1 * s2, hmlp_pad(s1, s2)
    fw = [forward_map(n, bc, mode, shift[ax], p, e, device) for ax, (n, bc) in enumerate(zip(shape, bcs))]
    inv = [inverse_map(n, bc, mode, shift[ax], p, e, device) for ax, (n, bc) in enumerate(zip(shape, bcs))]
    return fw[0], fw[1], inv[0], inv[1]


# ---------------------------------------------------------------------------------------------
# the official sequences, replayed with torch.roll / F.pad (tests compare the maps against these)
# ---------------------------------------------------------------------------------------------
def official_sequence(x: torch.Tensor, bcs: BCs, mode: Mode, shift: tuple[int, int], s1: int, s2: int):
    """x (B, C, H, W) -> (jittered grid with flags (B, C+3, H', W'), unjitter function), replaying
    FixedPatchJittererBoundaryPad (domain), PatchJittererBoundaryPad (patch) or no jitter (none)."""
    p, e = s1 * s2, hmlp_pad(s1, s2)
    const = [constant_pad(bc, mode, p, e) for bc in bcs]
    per = [e if bc[0] == PERIODIC else 0 for bc in bcs]
    cpad = (const[1], const[1], const[0], const[0])
    ppad = (per[1], per[1], per[0], per[0])

    def flags_for(shape_hw, periodic_done: bool):
        f = torch.zeros(x.shape[0], 3, *shape_hw, dtype=x.dtype)
        f[:, 0] = 1.0
        for ax, bc in enumerate(bcs):
            if bc[0] == PERIODIC:
                continue
            lo = [slice(None)] * 4
            hi = [slice(None)] * 4
            lo[2 + ax] = slice(None, const[ax])
            hi[2 + ax] = slice(-const[ax], None)
            lo[1], hi[1] = 1 + bc[0], 1 + bc[1]
            f[tuple(lo)] += 1.0
            f[tuple(hi)] += 1.0
            lo[1] = hi[1] = 0
            f[tuple(lo)] = 0.0
            f[tuple(hi)] = 0.0
        return f

    y = F.pad(x, cpad, mode="constant") if sum(cpad) else x
    if mode == "domain":
        y = torch.cat([y, flags_for(y.shape[-2:], False)], 1)
        y = torch.roll(y, shifts=tuple(shift), dims=(-2, -1))
        if sum(ppad):
            y = F.pad(y, ppad, mode="circular")

        def unjitter(z):
            h, w = z.shape[-2:]
            z = z[..., per[0]:h - per[0], per[1]:w - per[1]]
            z = torch.roll(z, shifts=(-shift[0], -shift[1]), dims=(-2, -1))
            h, w = z.shape[-2:]
            return z[..., const[0]:h - const[0], const[1]:w - const[1]]
    else:
        if sum(ppad):
            y = F.pad(y, ppad, mode="circular")
        y = torch.cat([y, flags_for(y.shape[-2:], True)], 1)
        if mode == "patch":
            y = torch.roll(y, shifts=tuple(shift), dims=(-2, -1))

        def unjitter(z):
            if mode == "patch":
                z = torch.roll(z, shifts=(-shift[0], -shift[1]), dims=(-2, -1))
            h, w = z.shape[-2:]
            a, b = const[0] + per[0], const[1] + per[1]
            return z[..., a:h - a, b:w - b]
    return y, unjitter
