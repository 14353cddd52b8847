"""Fused rolled patchify (walrus patch jittering) and its inverse, gathered straight from the field.

    patches = rolled_patchify(x, (sy, sx), kernel=8, stride=2, pad=5)   # x (B, C, N, M) -> (B, C*k*k, L)
    x_back  = rolled_unpatchify(y, (sy, sx), crop=5)                    # y (B, C, N+2e, M+2e) -> (B, C, N, M)

Walrus' periodic patch jitter (models/shared_utils/patch_jitterers.py of the official code) rolls the
field by an integer shift per axis, circularly pads it by e for the overlapping hMLP patches and then
lets the first strided conv see the patches; after the decoder it crops the pad and rolls back. As
index maps (torch.roll: y[i] = x[(i - s) mod N]; circular pad: z[i] = y[(i - e) mod N]):

    patchify:   P[b, c*k*k + ky*k + kx, i*n1 + j] = x[b, c, (i*st + ky - e - sy) mod N, (j*st + kx - e - sx) mod M]
    unpatchify: x[b, c, i, j] = y[b, c, ((i + sy) mod N) + e, ((j + sx) mod M) + e]

The reference materialises roll -> circular pad -> F.unfold (resp. crop -> roll back); the Triton
kernels compute the source index of every output element and gather once: no rolled or padded copy.
With kernel == stride and pad == 0 the patchify is exactly torch.roll + F.unfold.
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


def _out_side(n: int, kernel: int, stride: int, pad: int) -> int:
    return (n + 2 * pad - kernel) // stride + 1


def _check(x: torch.Tensor, kernel: int, stride: int, pad: int) -> None:
    if x.dim() != 4:
        raise ValueError(f"rolled_patchify: expected a (B, C, N, M) field, got shape {tuple(x.shape)}")
    if kernel < 1 or stride < 1 or pad < 0:
        raise ValueError(f"rolled_patchify: kernel/stride must be >= 1 and pad >= 0 (got {kernel}, {stride}, {pad})")
    if pad > min(x.shape[-2:]):
        raise ValueError(f"rolled_patchify: circular pad {pad} exceeds the field {tuple(x.shape[-2:])}")
    if x.shape[-1] + 2 * pad < kernel or x.shape[-2] + 2 * pad < kernel:
        raise ValueError("rolled_patchify: kernel larger than the padded field")


# ----------------------------------------------------------------------------------------------
# torch reference
# ----------------------------------------------------------------------------------------------
def rolled_patchify_reference(x: torch.Tensor, shift: tuple[int, int], kernel: int, stride: int,
                              pad: int = 0) -> torch.Tensor:
    """ALGO: patch jitter = roll by (sy, sx), circular pad e, then the patches of the first conv."""
    _check(x, kernel, stride, pad)
    y = torch.roll(x, shifts=(int(shift[0]), int(shift[1])), dims=(-2, -1))
    if pad:
        y = F.pad(y, (pad, pad, pad, pad), mode="circular")
    return F.unfold(y, kernel_size=kernel, stride=stride)


def rolled_unpatchify_reference(y: torch.Tensor, shift: tuple[int, int], crop: int = 0) -> torch.Tensor:
    """ALGO: undo the jitter after the decoder: crop the pad, roll back by (-sy, -sx)."""
    h, w = y.shape[-2] - 2 * crop, y.shape[-1] - 2 * crop
    if h < 1 or w < 1:
        raise ValueError(f"rolled_unpatchify: crop {crop} leaves nothing of {tuple(y.shape[-2:])}")
    z = y[..., crop:crop + h, crop:crop + w]
    return torch.roll(z, shifts=(-int(shift[0]), -int(shift[1])), dims=(-2, -1))


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------
if triton is not None:

    @triton.jit
    def _patchify_kernel(X, P, total, C, N, M, n1, m1, sy, sx, pad,
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
        src_y = ((i * ST + ky - pad - sy) % N + N) % N       # circular wrap of roll + pad
        src_x = ((j * ST + kx - pad - sx) % M + M) % M
        v = tl.load(X + ((b * C + c) * N + src_y) * M + src_x, mask=mask, other=0.0)
        tl.store(P + offs, v, mask=mask)

    @triton.jit
    def _unpatchify_kernel(Y, X, total, N, M, H, W, sy, sx, crop, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < total
        j = offs % M
        i = (offs // M) % N
        bc = offs // (N * M)
        src_y = ((i + sy) % N + N) % N + crop
        src_x = ((j + sx) % M + M) % M + crop
        v = tl.load(Y + (bc * H + src_y) * W + src_x, mask=mask, other=0.0)
        tl.store(X + offs, v, mask=mask)


def _patchify_triton(x, shift, kernel, stride, pad):
    x = x.contiguous()
    B, C, N, M = x.shape
    n1, m1 = _out_side(N, kernel, stride, pad), _out_side(M, kernel, stride, pad)
    out = torch.empty(B, C * kernel * kernel, n1 * m1, device=x.device, dtype=x.dtype)
    total = out.numel()
    if total:
        _patchify_kernel[(triton.cdiv(total, BLOCK),)](x, out, total, C, N, M, n1, m1, int(shift[0]),
                                                       int(shift[1]), pad, KS=kernel, ST=stride, BLOCK=BLOCK)
    return out


def _unpatchify_triton(y, shift, crop):
    y = y.contiguous()
    lead = y.shape[:-2]
    H, W = y.shape[-2:]
    N, M = H - 2 * crop, W - 2 * crop
    out = torch.empty(*lead, N, M, device=y.device, dtype=y.dtype)
    total = out.numel()
    if total:
        _unpatchify_kernel[(triton.cdiv(total, BLOCK),)](y, out, total, N, M, H, W, int(shift[0]),
                                                         int(shift[1]), crop, BLOCK=BLOCK)
    return out


# ----------------------------------------------------------------------------------------------
# dispatchers
# ----------------------------------------------------------------------------------------------
def rolled_patchify(x: torch.Tensor, shift: tuple[int, int], kernel: int, stride: int, pad: int = 0,
                    backend: Backend = "auto") -> torch.Tensor:
    """(B, C, N, M) field -> (B, C*k*k, L) patches of the rolled, circularly padded field."""
    _check(x, kernel, stride, pad)
    if use_triton(x, backend=backend) and not x.requires_grad:
        return _patchify_triton(x, shift, kernel, stride, pad)
    return rolled_patchify_reference(x, shift, kernel, stride, pad)


def rolled_unpatchify(y: torch.Tensor, shift: tuple[int, int], crop: int = 0,
                      backend: Backend = "auto") -> torch.Tensor:
    """(..., N+2e, M+2e) decoded field -> (..., N, M): crop e and roll back, one gather."""
    if y.shape[-2] - 2 * crop < 1 or y.shape[-1] - 2 * crop < 1:
        raise ValueError(f"rolled_unpatchify: crop {crop} leaves nothing of {tuple(y.shape[-2:])}")
    if use_triton(y, backend=backend) and not y.requires_grad:
        return _unpatchify_triton(y, shift, crop)
    return rolled_unpatchify_reference(y, shift, crop)


# ----------------------------------------------------------------------------------------------
# benchmarks (python -m kernels.bench --only rolled_patchify)
# ----------------------------------------------------------------------------------------------
def _bench_inputs(b, c, n, device):
    g = torch.Generator(device=device).manual_seed(0)
    return (torch.randn(b, c, n, n, device=device, generator=g),)


def _round(backend, kernel, stride, pad, shift=(13, -7)):
    def run(x):
        p = rolled_patchify(x, shift, kernel, stride, pad, backend=backend)
        y = F.pad(x, (pad, pad, pad, pad), mode="circular") if pad else x
        return p, rolled_unpatchify(y, shift, pad, backend=backend)
    return run


def _bytes(b, c, n, kernel, stride, pad):
    n1 = _out_side(n, kernel, stride, pad)
    return 4 * (b * c * n * n * 2 + b * c * kernel * kernel * n1 * n1 + b * c * (n + 2 * pad) ** 2)


BENCHMARKS = [
    ("rolled_patchify k8 s2 e5 + unpatchify B=96 C=2 N=128", lambda device: _bench_inputs(96, 2, 128, device),
     _round("triton", 8, 2, 5), _round("torch", 8, 2, 5), _bytes(96, 2, 128, 8, 2, 5), 0),
]
BENCHMARKS_SMALL = [
    ("rolled_patchify k8 s2 e5 + unpatchify B=3 C=2 N=32", lambda device: _bench_inputs(3, 2, 32, device),
     _round("triton", 8, 2, 5), _round("torch", 8, 2, 5), _bytes(3, 2, 32, 8, 2, 5), 0),
]
