"""Parity of the fused GAWR actor loss and fused expectile loss (Triton under TRITON_INTERPRET=1) with
their torch references: forward values and gradients, odd shapes, fresh random inputs."""
from __future__ import annotations

import pytest
import torch

from kernels.gawr_loss import (expectile_loss, expectile_loss_reference, gawr_actor_loss,
                               gawr_actor_loss_reference, gawr_weights, gawr_weights_reference)
from kernels.testing import check_parity


@pytest.mark.parametrize("n,d", [(1, 1), (37, 3), (129, 17)])
@pytest.mark.parametrize("gated", [True, False])
def test_gawr_forward_and_grad_parity(n, d, gated):
    g = torch.Generator().manual_seed(1000 * n + d + gated)
    mu, act = torch.randn(n, d, generator=g), torch.randn(n, d, generator=g)
    log_std = 0.5 * torch.randn(n, d, generator=g)
    az, ar = torch.randn(n, generator=g), 2 * torch.randn(n, generator=g)
    check_parity(lambda *x: gawr_actor_loss(*x, beta=3.0, clip=100.0, gated=gated, backend="triton"),
                 lambda *x: gawr_actor_loss_reference(*x, beta=3.0, clip=100.0, gated=gated),
                 [mu, log_std, act, az, ar], atol=1e-5, rtol=1e-4)


def test_gawr_shared_log_std_and_clipped_weights():
    g = torch.Generator().manual_seed(7)
    n, d = 53, 5
    mu, act = torch.randn(n, d, generator=g), torch.randn(n, d, generator=g)
    log_std = 0.3 * torch.randn(d, generator=g)           # state-independent σ: gradient summed over rows
    az, ar = 3 * torch.randn(n, generator=g), 3 * torch.randn(n, generator=g)  # many weights hit the clip
    assert (gawr_weights_reference(az, ar) >= 100.0).any()
    check_parity(lambda *x: gawr_actor_loss(*x, backend="triton"), gawr_actor_loss_reference,
                 [mu, log_std, act, az, ar], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(gawr_weights(az, ar, backend="triton"), gawr_weights_reference(az, ar))


def test_advantages_get_no_gradient():
    n, d = 9, 2
    az = torch.randn(n, requires_grad=True)
    ar = torch.randn(n, requires_grad=True)
    mu = torch.randn(n, d, requires_grad=True)
    loss = gawr_actor_loss(mu, torch.zeros(n, d), torch.randn(n, d), az, ar, backend="triton")
    loss.backward()
    assert az.grad is None and ar.grad is None and mu.grad is not None


@pytest.mark.parametrize("n", [1, 255, 1001])
@pytest.mark.parametrize("tau", [0.1, 0.7, 0.9])
def test_expectile_parity(n, tau):
    g = torch.Generator().manual_seed(n)
    q, v = torch.randn(n, generator=g), torch.randn(n, generator=g)
    check_parity(lambda *x: expectile_loss(*x, tau, backend="triton"),
                 lambda *x: expectile_loss_reference(*x, tau), [q, v], atol=1e-6, rtol=1e-5)


def test_expectile_2d_shape():
    q, v = torch.randn(3, 41), torch.randn(3, 41)
    check_parity(lambda *x: expectile_loss(*x, 0.7, backend="triton"),
                 lambda *x: expectile_loss_reference(*x, 0.7), [q, v])


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="adv_style"):
        gawr_actor_loss(torch.zeros(4, 2), torch.zeros(4, 2), torch.zeros(4, 2), torch.zeros(3), torch.zeros(4))
    with pytest.raises(ValueError, match="log_std"):
        gawr_actor_loss(torch.zeros(4, 2), torch.zeros(3), torch.zeros(4, 2), torch.zeros(4), torch.zeros(4))
    with pytest.raises(ValueError, match="tau"):
        expectile_loss(torch.zeros(3), torch.zeros(3), 1.0)
