"""Parity of the fused cosine × soft cross-entropy kernel (Triton under TRITON_INTERPRET=1) with its
torch reference: loss, min-positive / max-negative logits and gradients in x, q and the scale, on odd
shapes with fresh random inputs; plus independent checks of the reference itself."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.cosine_soft_ce import cosine_soft_ce, cosine_soft_ce_mean, cosine_soft_ce_reference
from kernels.testing import assert_close, check_parity


def _inputs(b, m, d, seed, density=0.2, empty_rows=True):
    g = torch.Generator().manual_seed(seed)
    x = 2.5 * torch.randn(b, d, generator=g)
    q = 0.7 * torch.randn(m, d, generator=g)
    t = (torch.rand(b, m, generator=g) < density).float()
    if empty_rows and b > 2:
        t[1] = 0.0                                  # a row without positives (dropped by the loss)
    t[0, 0] = 1.0
    return x, q, t, torch.tensor(2.7)


@pytest.mark.parametrize("b,m,d", [(1, 1, 1), (5, 3, 7), (37, 45, 24), (67, 130, 33)])
def test_loss_and_grad_parity(b, m, d):
    x, q, t, s = _inputs(b, m, d, seed=100 * b + m + d)
    check_parity(lambda x, q, s: cosine_soft_ce(x, q, t, s, backend="triton")[0],
                 lambda x, q, s: cosine_soft_ce_reference(x, q, t, s)[0], [x, q, s], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("b,m,d", [(19, 23, 5), (40, 17, 64)])
def test_min_pos_max_neg_parity(b, m, d):
    x, q, t, s = _inputs(b, m, d, seed=b * m)
    ref = cosine_soft_ce_reference(x, q, t, s)
    tri = cosine_soft_ce(x, q, t, s, backend="triton")
    for a, r, what in zip(tri, ref, ("loss", "min_pos", "max_neg")):
        assert_close(a, r, 1e-5, 1e-5, what)


def test_mean_drops_empty_rows_and_matches_torch_soft_ce():
    """Independent check: the reference equals F.cross_entropy with probability targets."""
    x, q, t, s = _inputs(29, 31, 9, seed=3)
    logits = s * F.normalize(x, dim=-1) @ F.normalize(q, dim=-1).T
    keep = t.sum(-1) > 0
    expect = F.cross_entropy(logits[keep], t[keep] / t[keep].sum(-1, keepdim=True))
    for backend in ("torch", "triton"):
        assert_close(cosine_soft_ce_mean(x, q, t, s, backend=backend), expect, 1e-5, 1e-5, backend)


def test_scale_invariance_of_embedding_norms():
    x, q, t, s = _inputs(11, 13, 6, seed=5)
    a = cosine_soft_ce(x, q, t, s, backend="triton")[0]
    b = cosine_soft_ce(3.3 * x, 0.2 * q, t, s, backend="triton")[0]
    assert_close(a, b, 1e-5, 1e-5, "norm invariance")


def test_bad_shapes_are_named():
    x, q, t, s = _inputs(4, 5, 3, seed=0)
    with pytest.raises(ValueError, match="targets"):
        cosine_soft_ce(x, q, t[:, :4], s)
    with pytest.raises(ValueError, match="x and q"):
        cosine_soft_ce(x, q[:, :2], t, s)
    with pytest.raises(ValueError, match="scale"):
        cosine_soft_ce(x, q, t, torch.ones(2))
