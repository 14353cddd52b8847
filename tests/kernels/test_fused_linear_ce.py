"""Fused linear + cross-entropy: Triton (interpreter) vs the torch reference, values and grads."""
from __future__ import annotations

import os

import pytest
import torch

from kernels.dispatch import use_triton
from kernels.fused_linear_ce import (linear_cross_entropy, linear_cross_entropy_reference,
                                     linear_cross_entropy_stats, linear_cross_entropy_stats_reference)
from kernels.testing import check_parity

assert os.environ.get("TRITON_INTERPRET") == "1", "tests/conftest.py must set TRITON_INTERPRET before triton loads"

SHAPES = [(1, 1, 2), (37, 19, 101), (5, 64, 7), (70, 33, 130), (64, 32, 64)]  # (N, C, V), odd and tile-aligned


@pytest.mark.parametrize("n, c, v", SHAPES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_forward_and_gradients_match_reference(n, c, v, reduction):
    g = torch.Generator().manual_seed(n * 1000 + c + v)
    h = torch.randn(n, c, generator=g) * 2
    w = torch.randn(v, c, generator=g)
    y = torch.randint(0, v, (n,), generator=g)
    if n > 3:
        y[::4] = -100  # ignored rows contribute neither loss nor gradient
    check_parity(lambda h, w: linear_cross_entropy(h, w, y, reduction, backend="triton"),
                 lambda h, w: linear_cross_entropy_reference(h, w, y, reduction),
                 [h, w], atol=2e-4, rtol=2e-4)


def test_stats_give_per_row_loss_and_argmax():
    g = torch.Generator().manual_seed(7)
    h, w = torch.randn(45, 23, generator=g), torch.randn(150, 23, generator=g)
    y = torch.randint(0, 150, (45,), generator=g)
    loss, pred = linear_cross_entropy_stats(h, w, y, backend="triton")
    ref_loss, ref_pred = linear_cross_entropy_stats_reference(h, w, y)
    torch.testing.assert_close(loss, ref_loss, atol=1e-4, rtol=1e-4)
    assert torch.equal(pred, ref_pred)


def test_large_logits_are_stable():
    h = torch.randn(9, 8) * 100  # logits in the thousands: a naive exp overflows
    w = torch.randn(77, 8)
    y = torch.randint(0, 77, (9,))
    out = linear_cross_entropy(h, w, y, backend="triton")
    assert torch.isfinite(out)
    torch.testing.assert_close(out, linear_cross_entropy_reference(h, w, y), atol=1e-3, rtol=1e-4)


def test_dispatcher_and_shape_errors():
    h, w, y = torch.randn(4, 3), torch.randn(5, 3), torch.zeros(4, dtype=torch.long)
    assert use_triton(h, backend="auto")  # interpreter on
    assert not use_triton(h, backend="torch")
    with pytest.raises(ValueError, match="backend"):
        use_triton(h, backend="cuda")
    with pytest.raises(ValueError, match="shape mismatch"):
        linear_cross_entropy(h, torch.randn(5, 4), y)
    with pytest.raises(ValueError, match="reduction"):
        linear_cross_entropy(h, w, y, reduction="max")


def test_benchmark_entry_point_reports_a_ratio(capsys):
    from kernels.bench import main

    main(["--only", "fused_linear_ce", "--small", "--reps", "1"])
    out = capsys.readouterr().out
    assert "Triton/torch" in out and "fused_linear_ce" in out
