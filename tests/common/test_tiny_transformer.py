"""The shared tiny transformer: shapes, causality, KV-cache equivalence, options."""
from __future__ import annotations

import pytest
import torch

from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig

VARIANTS = [
    dict(),
    dict(positional="learned", norm="layernorm", mlp="gelu", tie_embeddings=False),
    dict(positional="none", n_layers=1, n_heads=1),
]


@pytest.mark.parametrize("opts", VARIANTS)
def test_shapes_and_tied_unembedding(opts):
    cfg = TinyTransformerConfig(**{**dict(vocab_size=37, d_model=24, n_layers=2, n_heads=4, max_seq_len=16), **opts})
    model = TinyTransformer(cfg)
    idx = torch.randint(0, 37, (5, 11))
    assert model(idx).shape == (5, 11, 37)
    assert model.hidden(idx).shape == (5, 11, 24)
    assert model.unembed.shape == (37, 24)
    assert (model.unembed is model.embed.weight) == cfg.tie_embeddings


@pytest.mark.parametrize("opts", VARIANTS)
def test_causal_model_ignores_the_future(opts):
    torch.manual_seed(0)
    model = TinyTransformer(TinyTransformerConfig(**{**dict(vocab_size=31, d_model=16, n_heads=2, max_seq_len=12), **opts})).eval()
    idx = torch.randint(0, 31, (3, 12))
    changed = idx.clone()
    changed[:, 7:] = torch.randint(0, 31, (3, 5))
    a, b = model(idx), model(changed)
    torch.testing.assert_close(a[:, :7], b[:, :7])
    assert not torch.allclose(a[:, 7:], b[:, 7:])


def test_bidirectional_model_sees_the_future():
    torch.manual_seed(0)
    model = TinyTransformer(TinyTransformerConfig(vocab_size=31, d_model=16, n_heads=2, causal=False)).eval()
    idx = torch.randint(0, 31, (2, 9))
    changed = idx.clone()
    changed[:, -1] = (idx[:, -1] + 1) % 31
    assert not torch.allclose(model(idx)[:, 0], model(changed)[:, 0])
    with pytest.raises(ValueError, match="causal"):
        model.new_cache()


@pytest.mark.parametrize("opts", VARIANTS)
def test_kv_cache_decoding_matches_full_recompute(opts):
    torch.manual_seed(1)
    model = TinyTransformer(TinyTransformerConfig(**{**dict(vocab_size=29, d_model=32, n_heads=4, max_seq_len=24), **opts})).eval()
    prompt = torch.randint(0, 29, (4, 5))
    with_cache = model.generate(prompt, 12, use_cache=True)
    without = model.generate(prompt, 12, use_cache=False)
    assert torch.equal(with_cache, without)
    # incremental logits equal the full forward pass at every position
    cache = model.new_cache()
    steps = [model(with_cache[:, :5], cache)[:, -1]] + [model(with_cache[:, t:t + 1], cache)[:, -1]
                                                         for t in range(5, 16)]
    full = model(with_cache[:, :16])
    torch.testing.assert_close(torch.stack(steps, 1), full[:, 4:16], atol=1e-5, rtol=1e-5)


def test_config_errors():
    with pytest.raises(ValueError, match="divisible"):
        TinyTransformerConfig(d_model=30, n_heads=4)
    model = TinyTransformer(TinyTransformerConfig(max_seq_len=4))
    with pytest.raises(ValueError, match="exceeds max_seq_len"):
        model(torch.zeros(1, 5, dtype=torch.long))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("opts", VARIANTS)
def test_hidden_at_rows_equals_the_full_pass_gathered(opts, causal):
    """hidden(x, rows=r): the last block computes only the rows asked for; values and gradients equal the full
    pass's rows (rows differ per batch row, repeat, and come in any order)."""
    torch.manual_seed(2)
    cfg = TinyTransformerConfig(**{**dict(vocab_size=23, d_model=24, n_layers=3, n_heads=4, max_seq_len=14,
                                          causal=causal), **opts})
    model = TinyTransformer(cfg).eval()
    idx = torch.randint(0, 23, (4, 13))
    rows = torch.tensor([[12, 0, 5], [3, 3, 1], [7, 11, 2], [0, 6, 12]])
    full = model.hidden(idx)
    want = torch.stack([full[b, rows[b]] for b in range(4)])
    got = model.hidden(idx, rows=rows)
    assert got.shape == (4, 3, 24)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)
    g_rows = torch.autograd.grad((got * torch.linspace(-1.5, 2.5, 24)).sum(), list(model.parameters()),
                                 allow_unused=True)
    g_full = torch.autograd.grad((want * torch.linspace(-1.5, 2.5, 24)).sum(), list(model.parameters()),
                                 allow_unused=True)
    for a, b in zip(g_rows, g_full):
        if b is None:
            assert a is None or not a.abs().any()
        else:
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_hidden_at_rows_errors():
    model = TinyTransformer(TinyTransformerConfig(vocab_size=11, d_model=8, n_heads=2, max_seq_len=6))
    idx = torch.randint(0, 11, (2, 6))
    with pytest.raises(ValueError, match="rows must lie"):
        model.hidden(idx, rows=torch.tensor([[0], [6]]))
    with pytest.raises(ValueError, match=r"\(B=2, R\) long"):
        model.hidden(idx, rows=torch.tensor([[0, 1]]))
    with pytest.raises(ValueError, match="KV cache"):
        model.hidden(idx, model.new_cache(), rows=torch.tensor([[0], [1]]))
