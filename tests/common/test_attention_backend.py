"""stages.common.device.attention_backend: the SDPA path it picks per device."""
from __future__ import annotations

import contextlib

import torch

from stages.common.device import attention_backend
from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig

V = 13


def test_attention_backend_cpu_math_path_computes_the_same_attention():
    """attention_backend: math SDPA on CPU (same logits as PyTorch's default dispatch to float rounding, and the
    flash kernel really is off inside it); a CUDA device or cpu_math=False leaves the dispatch alone."""
    torch.manual_seed(3)
    model = TinyTransformer(TinyTransformerConfig(vocab_size=V, d_model=24, n_layers=2, n_heads=4, max_seq_len=11,
                                                  causal=False)).eval()
    x = torch.randint(0, V, (5, 11))
    ref = model(x)
    with attention_backend(torch.device("cpu"), True):
        out = model(x)
    assert torch.allclose(out, ref, atol=1e-5) and not torch.equal(out, torch.zeros_like(out))
    assert isinstance(attention_backend(torch.device("cuda"), True), contextlib.nullcontext)
    assert isinstance(attention_backend(torch.device("cpu"), False), contextlib.nullcontext)
    assert not isinstance(attention_backend(torch.device("cpu"), True), contextlib.nullcontext)
