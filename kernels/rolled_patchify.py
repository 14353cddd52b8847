"""Fused rolled patchify (walrus patch jittering) and its inverse, gathered straight from the field.

    patches = rolled_patchify(x, map_y, map_x, kernel=8, stride=2)   # x (B, C, N, M) -> (B, C*k*k, L)
    x_back  = rolled_unpatchify(y, inv_y, inv_x)                     # y (..., H, W) -> (..., n, m)

Walrus' patch jitterers (models/shared_utils/patch_jitterers.py of the official code) build the grid the
first strided hMLP conv sees from the field by a sequence of pads and rolls: constant pad (walls / open
boundaries), circular pad (periodic axes), an integer roll per axis, in an order that depends on the
jitterer class. Every such sequence is, per axis, an **index map** from a position of the final padded
grid to its source: ``map[i] >= 0`` is a field index along that axis, ``-1`` / ``-2`` mark the
constant-padded strip at the low / high end (value 0). The map is built by the caller
(stages/walrus/jitter.py, tested there against the official pad/roll sequences); this kernel only
gathers, so no rolled or padded copy is materialised:

    patchify:   P[b, c*k*k + ky*k + kx, i*m1 + j] = x[b, c, map_y[i*st + ky], map_x[j*st + kx]]
                (0 where either map entry is negative)
    unpatchify: x[..., i, j] = y[..., inv_y[i], inv_x[j]]     (roll back + crop, one gather)

The torch reference materialises the padded grid by advanced indexing and calls F.unfold (it is what
training differentiates, also under torch.func.vmap with per-member maps); the Triton kernels compute
the source index of every output element and gather once. With identity maps (no pad, no roll) and
kernel == stride the patchify is exactly F.unfold; with a rolled map it is torch.roll + F.unfold.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.dispatch import Backend, use_triton

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

BLOCK = 256


def _out_side(n: int, kernel: int, stride: int) -> int:
    return (n - kernel) // stride + 1


def _check(x: torch.Tensor, map_y: torch.Tensor, map_x: torch.Tensor, kernel: int, stride: int) -> None:
    if x.dim() != 4:
        raise ValueError(f"rolled_patchify: expected a (B, C, N, M) field, got shape {tuple(x.shape)}")
    if kernel < 1 or stride < 1:
        raise ValueError(f"rolled_patchify: kernel and stride must be >= 1 (got {kernel}, {stride})")
    for name, m, n in (("map_y", map_y, x.shape[-2]), ("map_x", map_x, x.shape[-1])):
        if m.dim() != 1 or m.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"rolled_patchify: {name} must be a 1-D integer index map (got {tuple(m.shape)} {m.dtype})")
        if m.numel() < kernel:
            raise ValueError(f"rolled_patchify: kernel {kernel} larger than the padded axis ({name}: {m.numel()})")
        if m.numel() and (int(m.max()) >= n or int(m.min()) < -2):
            raise ValueError(f"rolled_patchify: {name} has entries outside -2..{n - 1}")


def _check_inverse(y: torch.Tensor, inv_y: torch.Tensor, inv_x: torch.Tensor) -> None:
    if y.dim() < 2:
        raise ValueError(f"rolled_unpatchify: expected (..., H, W), got shape {tuple(y.shape)}")
    for name, m, n in (("inv_y", inv_y, y.shape[-2]), ("inv_x", inv_x, y.shape[-1])):
        if m.dim() != 1 or m.numel() < 1 or m.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"rolled_unpatchify: {name} must be a non-empty 1-D integer index map")
        if int(m.min()) < 0 or int(m.max()) >= n:
            raise ValueError(f"rolled_unpatchify: {name} has entries outside 0..{n - 1} (crop leaves nothing "
                             f"of an axis of {n}?)")


# ----------------------------------------------------------------------------------------------
# torch reference
# ----------------------------------------------------------------------------------------------
def padded_grid(x: torch.Tensor, map_y: torch.Tensor, map_x: torch.Tensor) -> torch.Tensor:
    """ALGO: the jittered, padded grid the first conv sees: x[..., map_y, map_x], 0 on constant pads."""
    my, mx = map_y.clamp_min(0), map_x.clamp_min(0)
    grid = x[..., my[:, None], mx[None, :]]
    keep = ((map_y >= 0)[:, None] & (map_x >= 0)[None, :]).to(x.dtype)
    return grid * keep


def rolled_patchify_reference(x: torch.Tensor, map_y: torch.Tensor, map_x: torch.Tensor, kernel: int,
                              stride: int) -> torch.Tensor:
    """Materialise the padded grid (advanced indexing), then the patches of the first conv (F.unfold)."""
    return F.unfold(padded_grid(x, map_y, map_x), kernel_size=kernel, stride=stride)


def rolled_unpatchify_reference(y: torch.Tensor, inv_y: torch.Tensor, inv_x: torch.Tensor) -> torch.Tensor:
    """ALGO: undo the jitter after the decoder (roll back + crop) as one index map per axis."""
    return y[..., inv_y[:, None], inv_x[None, :]]


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------
if triton is not None:

    @triton.jit
    def _patchify_kernel(X, MY, MX, P, total, C, N, M, n1, m1,
                         KS: tl.constexpr, ST: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < total
        L = n1 * m1
        R = C * KS * KS
        l = offs % L
        r = (offs // L) % R
        b = offs // (L * R)
        c = r // (KS * KS)
        ky = (r // KS) % KS
        kx = r % KS
        i = l // m1
        j = l % m1
        src_y = tl.load(MY + i * ST + ky, mask=mask, other=-1)
        src_x = tl.load(MX + j * ST + kx, mask=mask, other=-1)
        inside = mask & (src_y >= 0) & (src_x >= 0)
        v = tl.load(X + ((b * C + c) * N + src_y) * M + src_x, mask=inside, other=0.0)
        tl.store(P + offs, v, mask=mask)

    @triton.jit
    def _unpatchify_kernel(Y, IY, IX, X, total, n, m, H, W, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < total
        j = offs % m
        i = (offs // m) % n
        bc = offs // (n * m)
        src_y = tl.load(IY + i, mask=mask, other=0)
        src_x = tl.load(IX + j, mask=mask, other=0)
        v = tl.load(Y + (bc * H + src_y) * W + src_x, mask=mask, other=0.0)
        tl.store(X + offs, v, mask=mask)


def _patchify_triton(x, map_y, map_x, kernel, stride):
    x = x.contiguous()
    B, C, N, M = x.shape
    n1, m1 = _out_side(map_y.numel(), kernel, stride), _out_side(map_x.numel(), kernel, stride)
    out = torch.empty(B, C * kernel * kernel, n1 * m1, device=x.device, dtype=x.dtype)
    total = out.numel()
    if total:
        my = map_y.to(device=x.device, dtype=torch.int32).contiguous()
        mx = map_x.to(device=x.device, dtype=torch.int32).contiguous()
        _patchify_kernel[(triton.cdiv(total, BLOCK),)](x, my, mx, out, total, C, N, M, n1, m1,
                                                       KS=kernel, ST=stride, BLOCK=BLOCK)
    return out


def _unpatchify_triton(y, inv_y, inv_x):
    y = y.contiguous()
    lead = y.shape[:-2]
    H, W = y.shape[-2:]
    n, m = inv_y.numel(), inv_x.numel()
    out = torch.empty(*lead, n, m, device=y.device, dtype=y.dtype)
    total = out.numel()
    if total:
        iy = inv_y.to(device=y.device, dtype=torch.int32).contiguous()
        ix = inv_x.to(device=y.device, dtype=torch.int32).contiguous()
        _unpatchify_kernel[(triton.cdiv(total, BLOCK),)](y, iy, ix, out, total, n, m, H, W, BLOCK=BLOCK)
    return out


# ----------------------------------------------------------------------------------------------
# dispatchers
# ----------------------------------------------------------------------------------------------
def rolled_patchify(x: torch.Tensor, map_y: torch.Tensor, map_x: torch.Tensor, kernel: int, stride: int,
                    backend: Backend = "auto") -> torch.Tensor:
    """(B, C, N, M) field -> (B, C*k*k, L) patches of the padded, jittered grid given by the index maps."""
    _check(x, map_y, map_x, kernel, stride)
    if use_triton(x, backend=backend) and not x.requires_grad:
        return _patchify_triton(x, map_y, map_x, kernel, stride)
    return rolled_patchify_reference(x, map_y, map_x, kernel, stride)


def rolled_unpatchify(y: torch.Tensor, inv_y: torch.Tensor, inv_x: torch.Tensor,
                      backend: Backend = "auto") -> torch.Tensor:
    """(..., H, W) decoded padded field -> (..., n, m): roll back and crop as one gather."""
    _check_inverse(y, inv_y, inv_x)
    if use_triton(y, backend=backend) and not y.requires_grad:
        return _unpatchify_triton(y, inv_y, inv_x)
    return rolled_unpatchify_reference(y, inv_y, inv_x)


def unchecked_patchify(x, map_y, map_x, kernel, stride):
    """The reference without the host-side range checks (they call .item(), which torch.func.vmap
    refuses): the training path, whose maps are built by stages/walrus/jitter.py and tested there."""
    return rolled_patchify_reference(x, map_y, map_x, kernel, stride)


# ----------------------------------------------------------------------------------------------
# benchmarks (python -m kernels.bench --only rolled_patchify)
# ----------------------------------------------------------------------------------------------
def _bench_inputs(b, c, n, device):
    g = torch.Generator(device=device).manual_seed(0)
    return (torch.randn(b, c, n, n, device=device, generator=g),)


def _periodic_maps(n, shift, pad, device):
    """Whole-domain periodic jitter (official fixed jitterer): roll by `shift`, circular pad `pad`."""
    i = torch.arange(n + 2 * pad, device=device)
    return torch.remainder(i - pad - shift, n), pad + torch.remainder(torch.arange(n, device=device) + shift, n)


def _round(backend, kernel, stride, pad, shift=(13, -7)):
    def run(x):
        n = x.shape[-1]
        (my, iy), (mx, ix) = _periodic_maps(n, shift[0], pad, x.device), _periodic_maps(n, shift[1], pad, x.device)
        p = rolled_patchify(x, my, mx, kernel, stride, backend=backend)
        y = F.pad(x, (pad, pad, pad, pad), mode="circular") if pad else x
        return p, rolled_unpatchify(y, iy, ix, backend=backend)
    return run


def _bytes(b, c, n, kernel, stride, pad):
    n1 = _out_side(n + 2 * pad, kernel, stride)
    return 4 * (b * c * n * n * 2 + b * c * kernel * kernel * n1 * n1 + b * c * (n + 2 * pad) ** 2)


BENCHMARKS = [
    ("rolled_patchify k8 s2 e5 + unpatchify B=96 C=2 N=128", lambda device: _bench_inputs(96, 2, 128, device),
     _round("triton", 8, 2, 5), _round("torch", 8, 2, 5), _bytes(96, 2, 128, 8, 2, 5), 0),
]
BENCHMARKS_SMALL = [
    ("rolled_patchify k8 s2 e5 + unpatchify B=3 C=2 N=32", lambda device: _bench_inputs(3, 2, 32, device),
     _round("triton", 8, 2, 5), _round("torch", 8, 2, 5), _bytes(3, 2, 32, 8, 2, 5), 0),
]
