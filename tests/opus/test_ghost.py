"""Ghost technique on the shared TinyTransformer vs torch.func per-sample gradients."""
from __future__ import annotations

import torch
from torch.func import functional_call, grad, vmap

from kernels.testing import assert_close
from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig
from stages.opus.ghost import capture_linear_grads, ghost_dot, ghost_gram, linear_layers, per_sample_loss, summed_gradient


def _model_and_tokens(seed=0, b=5, t=9):
    torch.manual_seed(seed)
    cfg = TinyTransformerConfig(vocab_size=23, d_model=16, n_layers=2, n_heads=2, max_seq_len=16)
    model = TinyTransformer(cfg)
    for p in model.parameters():  # a random model, not the near-zero init, so gradients are generic
        torch.nn.init.normal_(p, std=0.3)
    return model, torch.randint(0, 23, (b, t))


def _torch_func_per_sample(model, tokens):
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss_one(p, seq):
        return per_sample_loss(lambda x: functional_call(model, p, (x,)), seq[None])[0]

    return vmap(grad(loss_one), in_dims=(None, 0))(params, tokens)


def test_captured_grads_rebuild_torch_func_per_sample_gradients():
    model, tokens = _model_and_tokens()
    ref = _torch_func_per_sample(model, tokens)
    losses, cap = capture_linear_grads(model, tokens)
    assert set(cap) == set(linear_layers(model)) and len(cap) == 10  # qkv, proj, gate, up, down x 2 blocks
    assert all(p.grad is None for p in model.parameters())  # scoring never touches .grad
    assert_close(losses, per_sample_loss(model, tokens).detach(), 1e-6, 1e-5)
    for name, (a, b) in cap.items():
        g = torch.einsum("bto,bti->boi", b, a)  # G(z) = Σ_t b_t a_tᵀ, materialized only in this test
        assert_close(g, ref[f"{name}.weight"], 1e-5, 1e-4, name)


def test_ghost_gram_and_dot_equal_per_sample_inner_products():
    model, tokens = _model_and_tokens(seed=1, b=6)
    ref = _torch_func_per_sample(model, tokens)
    _, cap = capture_linear_grads(model, tokens)
    _, proxy_cap = capture_linear_grads(model, torch.randint(0, 23, (3, 9)))
    total_gram = torch.zeros(6, 6)
    for name, (a, b) in cap.items():
        g = ref[f"{name}.weight"].flatten(1)
        assert_close(ghost_gram(a, b, a, b), g @ g.T, 1e-5, 1e-4, f"gram {name}")
        mat = torch.randn(b.shape[2], a.shape[2])
        assert_close(ghost_dot(a, b, mat), g @ mat.flatten(), 1e-5, 1e-4, f"dot {name}")
        pa, pb = proxy_cap[name]
        assert_close(ghost_gram(a, b, pa, pb).sum(1), g @ summed_gradient(pa, pb).flatten(), 1e-5, 1e-4,
                     f"cross gram {name}")
        total_gram += ghost_gram(a, b, a, b)
    assert (total_gram.diag() > 0).all()
