"""Parity helpers for kernel tests: kernel vs reference on fresh random inputs, values and grads."""
from __future__ import annotations

from typing import Callable, Sequence

import torch


def assert_close(actual, expected, atol: float, rtol: float, what: str = "output") -> None:
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol, check_dtype=False,
                               msg=lambda m: f"{what}: kernel differs from reference\n{m}")


def check_parity(kernel: Callable[..., torch.Tensor], reference: Callable[..., torch.Tensor],
                 inputs: Sequence[torch.Tensor], atol: float = 1e-5, rtol: float = 1e-5,
                 grads: bool = True) -> None:
    """Forward values and (optionally) input gradients of kernel and reference agree.

    For the gradient check the (scalar-reduced) outputs are back-propagated with the same random
    cotangent, so every input gradient is compared.
    """
    k_in = [x.detach().clone().requires_grad_(grads and x.is_floating_point()) for x in inputs]
    r_in = [x.detach().clone().requires_grad_(grads and x.is_floating_point()) for x in inputs]
    k_out, r_out = kernel(*k_in), reference(*r_in)
    assert_close(k_out, r_out, atol, rtol, "forward")
    if not grads:
        return
    cot = torch.randn_like(r_out)
    (k_out * cot).sum().backward()
    (r_out * cot).sum().backward()
    for i, (a, b) in enumerate(zip(k_in, r_in)):
        if b.grad is not None:
            assert a.grad is not None, f"input {i}: kernel produced no gradient"
            assert_close(a.grad, b.grad, atol, rtol, f"grad of input {i}")
