"""Fused symmetric InfoNCE: Triton path (TRITON_INTERPRET=1) vs torch reference on odd shapes,
gradcheck of the Triton backward by finite differences, and independent checks of the reference
(F.cross_entropy rows + columns; a brute-force double loop)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from kernels.fused_infonce import fused_infonce, fused_infonce_reference, retrieval_hits
from kernels.testing import assert_close, check_parity


def _inputs(n, d, seed, norm=True):
    g = torch.Generator().manual_seed(seed)
    a, b = 1.7 * torch.randn(n, d, generator=g), 0.6 * torch.randn(n, d, generator=g)
    if norm:
        a, b = F.normalize(a, dim=-1), F.normalize(b, dim=-1)
    return a, b, torch.tensor(7.3)


@pytest.mark.parametrize("n,d", [(1, 1), (5, 7), (17, 33), (40, 64)])
def test_loss_and_grad_parity(n, d):
    a, b, s = _inputs(n, d, seed=10 * n + d)
    check_parity(lambda a, b, s: fused_infonce(a, b, s, backend="triton")[0],
                 lambda a, b, s: fused_infonce_reference(a, b, s)[0], [a, b, s], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("n,d", [(19, 5), (33, 24)])
def test_byproducts_parity(n, d):
    a, b, s = _inputs(n, d, seed=n * d, norm=False)
    for x, y, what in zip(fused_infonce(a, b, s, backend="triton"), fused_infonce_reference(a, b, s),
                          ("loss", "lse_row", "lse_col", "max_row", "max_col", "diag")):
        assert_close(x, y, 1e-4, 1e-5, what)


def test_gradcheck_triton_backward():
    """Finite differences of the Triton forward vs its recomputing backward (float32 tolerances)."""
    a, b, s = _inputs(6, 3, seed=4)
    inputs = (a.requires_grad_(), b.requires_grad_(), s.clone().requires_grad_())
    with pytest.warns(UserWarning):  # gradcheck warns about non-double inputs: the kernel is float32
        assert torch.autograd.gradcheck(lambda a, b, s: fused_infonce(a, b, s, backend="triton")[0], inputs,
                                        eps=1e-3, atol=2e-3, rtol=2e-2, fast_mode=True)


def test_reference_equals_cross_entropy_both_ways():
    a, b, s = _inputs(23, 9, seed=3)
    z = s * a @ b.T
    tgt = torch.arange(23)
    expect = 0.5 * (F.cross_entropy(z, tgt) + F.cross_entropy(z.T, tgt))
    for backend in ("torch", "triton"):
        assert_close(fused_infonce(a, b, s, backend=backend)[0], expect, 1e-5, 1e-5, backend)


def test_brute_force_loop_and_retrieval():
    a, b, s = _inputs(7, 4, seed=8, norm=False)
    n = 7
    z = [[float(s) * float(a[i] @ b[j]) for j in range(n)] for i in range(n)]
    row = sum(math.log(sum(math.exp(z[i][j]) for j in range(n))) - z[i][i] for i in range(n)) / n
    col = sum(math.log(sum(math.exp(z[i][j]) for i in range(n))) - z[j][j] for j in range(n)) / n
    out = fused_infonce(a, b, s, backend="triton")
    assert abs(float(out[0]) - 0.5 * (row + col)) < 1e-4
    hit_r, hit_c = retrieval_hits(out)
    assert hit_r.tolist() == [max(range(n), key=lambda j: z[i][j]) == i for i in range(n)]
    assert hit_c.tolist() == [max(range(n), key=lambda i: z[i][j]) == j for j in range(n)]


def test_perfect_alignment_gives_small_loss():
    a = torch.eye(12)[:, :12] * 1.0
    out = fused_infonce(a, a.clone(), torch.tensor(50.0), backend="triton")
    assert float(out[0]) < 1e-6 and all(h.all() for h in retrieval_hits(out))


def test_bad_shapes_are_named():
    a, b, s = _inputs(4, 3, seed=0)
    with pytest.raises(ValueError, match="a and b"):
        fused_infonce(a, b[:3], s)
    with pytest.raises(ValueError, match="scale"):
        fused_infonce(a, b, torch.ones(2))


@pytest.mark.parametrize("shared_scale", [False, True])
def test_vmap_over_members_equals_each_member(shared_scale):
    """The Triton path under torch.func.vmap (seed ensembles): member k's loss, by-products and
    gradients equal the torch reference on member k alone."""
    S, n, d = 3, 9, 6
    g = torch.Generator().manual_seed(21)
    a = F.normalize(torch.randn(S, n, d, generator=g), dim=-1).requires_grad_()
    b = F.normalize(torch.randn(S, n, d, generator=g), dim=-1).requires_grad_()
    s = (torch.tensor(6.1) if shared_scale else torch.tensor([3.0, 6.1, 11.5])).requires_grad_()
    dims = (0, 0, None if shared_scale else 0)
    out = torch.func.vmap(lambda x, y, z: fused_infonce(x, y, z, backend="triton"), in_dims=dims)(a, b, s)
    (out[0] * torch.tensor([1.0, 2.0, 0.5])).sum().backward()
    for k in range(S):
        ak, bk = a.detach()[k].clone().requires_grad_(), b.detach()[k].clone().requires_grad_()
        sk = (s.detach() if shared_scale else s.detach()[k]).clone().requires_grad_()
        ref = fused_infonce_reference(ak, bk, sk)
        for x, y, what in zip(out, ref, ("loss", "lse_row", "lse_col", "max_row", "max_col", "diag")):
            assert_close(x[k], y, 1e-4, 1e-5, f"member {k} {what}")
        (ref[0] * [1.0, 2.0, 0.5][k]).backward()
        assert_close(a.grad[k], ak.grad, 1e-4, 1e-5, f"member {k} da")
        assert_close(b.grad[k], bk.grad, 1e-4, 1e-5, f"member {k} db")
        if not shared_scale:
            assert_close(s.grad[k], sk.grad, 1e-4, 1e-5, f"member {k} ds")
    if shared_scale:   # a shared scale's gradient sums the members' (weighted) gradients
        sk = s.detach().clone().requires_grad_()
        sum(w * fused_infonce_reference(a.detach()[k], b.detach()[k], sk)[0]
            for k, w in enumerate([1.0, 2.0, 0.5])).backward()
        assert_close(s.grad, sk.grad, 1e-4, 1e-5, "shared ds")
