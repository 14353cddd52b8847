"""Shared bits of the walrus stages: the task spec (tokenization table) and a thread guard."""
from __future__ import annotations

from contextlib import contextmanager

import torch

# Compute-adaptive tokenization (official flexi_utils.py: N // tokens -> hMLP strides (s1, s2); the
# conv kernels stay (8, 4) so neighbouring patches overlap).
STRIDES = {4: (2, 2), 8: (4, 2), 16: (4, 4)}
K1, K2 = 8, 4


def hmlp_pad(s1: int, s2: int) -> int:
    """Circular pad e so that the two convs give N/(s1 s2) tokens: 2e = k1 + s1 (k2 - 1 - s2)."""
    return (K1 + s1 * (K2 - 1) - s1 * s2) // 2


@contextmanager
def torch_threads(n: int):
    """Run with n intra-op threads (the shared 2-core machine thrashes with more), then restore."""
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)
