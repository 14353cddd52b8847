"""The one place that picks the compute device.

    from stages.common.device import pick_device
    device = pick_device(cfg.device)          # cfg.device: Literal["auto", "cpu", "cuda"] = "auto"
    x = torch.zeros(n, device=device)         # modules then create tensors on their inputs' device

``auto`` is CUDA when available, else CPU; ``cuda`` without a GPU is a clear error. Stage configs
declare ``device: DeviceName = "auto"``; code below the stage (modules, kernels) never picks a
device itself: it uses ``x.device`` of its inputs.
"""
from __future__ import annotations

import contextlib
from typing import Literal

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from stages.common.config import ConfigError

DeviceName = Literal["auto", "cpu", "cuda"]


class DeviceError(ConfigError):
    """The requested device is not available here."""


def pick_device(name: DeviceName = "auto") -> torch.device:
    if name not in ("auto", "cpu", "cuda"):
        raise DeviceError(f"device: expected auto, cpu or cuda (got {name!r})")
    if name == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    if name == "cuda":
        raise DeviceError("device: cuda requested but no CUDA device is available (use auto or cpu)")
    return torch.device("cpu")


def generator(device: torch.device, seed: int) -> torch.Generator:
    """A seeded torch.Generator on ``device`` (CPU generators cannot drive CUDA sampling)."""
    g = torch.Generator(device=device)
    g.manual_seed(int(seed))
    return g


def attention_backend(device: torch.device, cpu_math: bool = True):
    """The SDPA path for this device: on CPU with ``cpu_math``, PyTorch's math path — on tiny rows (justgrpo's
    25-token rows, 4 heads of 12) the CPU flash kernel costs more than it saves (measured there: a pretraining step
    at batch 128 39 → 31 ms on 2 threads, an RL rollout of 64 rows 0.29 → 0.19 s, its exact-likelihood pass with
    backward 0.80 → 0.65 s); the two paths compute the same attention (float rounding). Elsewhere: PyTorch's
    dispatch. Use as ``with attention_backend(device, cfg.cpu_math_attention): ...``."""
    if cpu_math and device.type == "cpu":
        return sdpa_kernel(SDPBackend.MATH)
    return contextlib.nullcontext()
