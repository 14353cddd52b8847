"""Choosing between a kernel's Triton path and its torch reference."""
from __future__ import annotations

import os
from typing import Literal

import torch

Backend = Literal["auto", "triton", "torch"]


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def cpu_prefers_reference() -> bool:
    """Set by ``python -m stages`` on machines without CUDA: there the interpreter is on (for the
    parity slices of kernels.record) but whole evaluations run the torch reference."""
    return os.environ.get("PAPERS_CPU_KERNELS", "") == "reference"


def use_triton(*tensors: torch.Tensor, backend: Backend = "auto") -> bool:
    """True when the Triton path should run for these tensors.

    auto: on CUDA tensors, or on CPU tensors under TRITON_INTERPRET=1 (unless a stage process asked
    for the reference on CPU, see cpu_prefers_reference); torch: never;
    triton: always, and a clear error when it cannot run here.
    """
    if backend not in ("auto", "triton", "torch"):
        raise ValueError(f"backend: expected auto, triton or torch (got {backend!r})")
    if backend == "torch":
        return False
    on_cuda = all(t.is_cuda for t in tensors)
    runnable = triton_available() and (on_cuda or interpreting())
    if backend == "auto" and not on_cuda and cpu_prefers_reference():
        return False
    if backend == "triton" and not runnable:
        raise RuntimeError("backend='triton' needs CUDA tensors or TRITON_INTERPRET=1 set before importing triton")
    return runnable
