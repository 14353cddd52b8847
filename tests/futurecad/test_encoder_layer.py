"""EncoderLayer (model.py) against torch's own nn.TransformerEncoderLayer, and the grounder's optimizer and logging
(lit.py): the speedups of the grounder's training step must not change a single bit of what it computes.

The reference is torch's layer built from the same seed (its multi_head_attention_forward is independent of the
code under test); comparisons are exact (torch.equal), on inputs of scale 1.7 with key padding."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from stages.futurecad.lit import GroundModule
from stages.futurecad.model import BRepGround, EncoderLayer, GroundLoader, pad_parts
from tests.futurecad.helpers import random_part

D, H = 24, 3


def _pair(layers: int = 2, d: int = D, heads: int = H, dropout: float = 0.0, **kw):
    out = []
    for cls in (nn.TransformerEncoderLayer, EncoderLayer):
        torch.manual_seed(7)
        layer = cls(d, heads, 2 * d, dropout=dropout, **{"batch_first": True, "norm_first": True, **kw})
        out.append(nn.TransformerEncoder(layer, layers, enable_nested_tensor=False))
    return out


def _inputs(B: int = 5, L: int = 9, d: int = D):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(B, L, d, generator=g) * 1.7 + 0.3
    pad = torch.zeros(B, L, dtype=torch.bool)
    pad[0, 6:] = True          # a row with padding at the end
    pad[2, 1:] = True          # a row with one real token
    pad[3, 3:5] = True         # padding in the middle
    w = torch.randn(B, L, d, generator=g)
    return x, pad, w


def _grads(enc, x, pad, w, **kw):
    enc.zero_grad()
    xi = x.clone().requires_grad_()
    y = enc(xi, src_key_padding_mask=pad, **kw)
    (y * w).sum().backward()
    return y.detach(), xi.grad, [p.grad.clone() for p in enc.parameters()]


def test_same_parameters_and_state_dict():
    ref, new = _pair()
    assert isinstance(new.layers[0], EncoderLayer) and isinstance(new.layers[1], EncoderLayer)
    assert list(ref.state_dict()) == list(new.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(ref.state_dict().values(), new.state_dict().values()))
    new.load_state_dict(ref.state_dict())         # a checkpoint of torch's layer loads (and the reverse)
    ref.load_state_dict(new.state_dict())


def test_outputs_and_every_gradient_bitwise_equal_with_padding():
    ref, new = _pair()
    x, pad, w = _inputs()
    y0, gx0, gp0 = _grads(ref, x, pad, w)
    y1, gx1, gp1 = _grads(new, x, pad, w)
    assert torch.equal(y0, y1) and torch.equal(gx0, gx1)
    assert len(gp0) == len(gp1) == 2 * 12
    assert all(torch.equal(a, b) for a, b in zip(gp0, gp1))
    assert gp1[0].abs().sum() > 0                 # the in-projection gets a gradient (q, k and v all reach it)
    # the in-projection's three (E, E) blocks each differ from zero: q, k and v gradients are routed apart
    assert all(blk.abs().sum() > 0 for blk in gp1[0].chunk(3))


def test_without_padding_mask_and_other_shapes():
    for B, L, d, heads in ((1, 1, 8, 2), (4, 13, 16, 4), (3, 5, 24, 1)):
        ref, new = _pair(layers=1, d=d, heads=heads)
        g = torch.Generator().manual_seed(B * 31 + L)
        x = torch.randn(B, L, d, generator=g) * 2.5
        w = torch.randn(B, L, d, generator=g)
        for enc in (ref, new):
            enc.zero_grad()
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = ref(xa), new(xb)
        (ya * w).sum().backward()
        (yb * w).sum().backward()
        assert torch.equal(ya, yb) and torch.equal(xa.grad, xb.grad), (B, L, d, heads)
        assert all(torch.equal(p.grad, q.grad) for p, q in zip(ref.parameters(), new.parameters()))


def test_attn_mask_and_causal_calls_take_torchs_block():
    ref, new = _pair(layers=1)
    x, pad, w = _inputs()
    L = x.shape[1]
    causal = nn.Transformer.generate_square_subsequent_mask(L)
    a = _grads(ref, x, pad, w, mask=causal, is_causal=True)
    b = _grads(new, x, pad, w, mask=causal, is_causal=True)
    assert torch.equal(a[0], b[0]) and all(torch.equal(p, q) for p, q in zip(a[2], b[2]))
    bias = torch.randn(L, L, generator=torch.Generator().manual_seed(5))     # an additive float attn_mask
    a = _grads(ref, x, pad, w, mask=bias)
    b = _grads(new, x, pad, w, mask=bias)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    # and the float bias does change the output (the masked call is not ignored)
    assert not torch.equal(a[0], _grads(new, x, pad, w)[0])


def test_attention_dropout_follows_training_mode():
    ref, new = _pair(layers=1, dropout=0.3)
    x, pad, w = _inputs()
    for mode in ("train", "eval"):
        for enc in (ref, new):
            getattr(enc, mode)()
        torch.manual_seed(11)
        a = _grads(ref, x, pad, w)
        torch.manual_seed(11)
        b = _grads(new, x, pad, w)
        assert torch.equal(a[0], b[0]) and all(torch.equal(p, q) for p, q in zip(a[2], b[2])), mode
    torch.manual_seed(11)
    new.train()
    assert not torch.equal(_grads(new, x, pad, w)[0], a[0])      # train mode drops, eval mode does not


def test_inference_unchanged(monkeypatch):
    ref, new = _pair()
    x, pad, _ = _inputs()
    ref.eval()
    new.eval()
    with torch.no_grad():
        assert torch.equal(ref(x, src_key_padding_mask=pad), new(x, src_key_padding_mask=pad))
    # the grounder's shapes (d = 64, 4 heads) at inference: torch's fused encoder-layer kernel, no block is run
    ref, new = _pair(d=64, heads=4)
    calls = []
    block = EncoderLayer._sa_block
    monkeypatch.setattr(EncoderLayer, "_sa_block", lambda self, *a, **k: calls.append(1) or block(self, *a, **k))
    x = torch.randn(4, 9, 64, generator=torch.Generator().manual_seed(8)) * 1.7
    with torch.no_grad():
        assert torch.equal(ref.eval()(x, src_key_padding_mask=pad[:4]), new.eval()(x, src_key_padding_mask=pad[:4]))
        assert calls == []
        new.train()(x, src_key_padding_mask=pad[:4])
    assert len(calls) == 2                            # in training mode both layers run the block


def test_float_masks_padded_rows_and_other_settings():
    """A float key-padding mask with finite values (not only -inf), rows that are all padding, one token, float64,
    no biases, post-norm: still bit for bit."""
    x, pad, w = _inputs()
    fmask = torch.randn(pad.shape, generator=torch.Generator().manual_seed(6)) * 2.0
    fmask[pad] = float("-inf")
    ref, new = _pair()
    a, b = _grads(ref, x, fmask, w), _grads(new, x, fmask, w)
    assert torch.equal(a[0], b[0]) and all(torch.equal(p, q) for p, q in zip(a[2], b[2]))
    assert not torch.equal(a[0], _grads(ref, x, pad, w)[0])     # the finite values matter
    full = pad.clone()
    full[1] = True                                              # a row that is all padding
    a, b = _grads(ref, x, full, w), _grads(new, x, full, w)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    one = torch.zeros(1, 1, dtype=torch.bool)
    a, b = _grads(ref, x[:1, :1], one, w[:1, :1]), _grads(new, x[:1, :1], one, w[:1, :1])
    assert torch.equal(a[0], b[0]) and all(torch.equal(p, q) for p, q in zip(a[2], b[2]))
    for kw in ({"bias": False}, {"norm_first": False}):
        ref, new = _pair(**kw)
        a, b = _grads(ref, x, pad, w), _grads(new, x, pad, w)
        assert torch.equal(a[0], b[0]) and all(torch.equal(p, q) for p, q in zip(a[2], b[2])), kw
    ref, new = (e.double() for e in _pair())
    a, b = _grads(ref, x.double(), pad, w.double()), _grads(new, x.double(), pad, w.double())
    assert a[0].dtype == torch.float64 and torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_other_layouts_take_torchs_block():
    """Sequence-first input, unbatched input, a mask of the wrong shape: torch's own block (equal results, or the
    same refusal), never a silently different attention."""
    x, pad, w = _inputs()
    ref, new = _pair(batch_first=False)
    xs, ws = x.transpose(0, 1).contiguous(), w.transpose(0, 1).contiguous()      # (L, B, E)
    for mask in (pad, None):
        a, b = _grads(ref, xs, mask, ws), _grads(new, xs, mask, ws)
        assert torch.equal(a[0], b[0]) and all(torch.equal(p, q) for p, q in zip(a[2], b[2]))
    ref, new = _pair()
    for mask in (pad[0], None):                                 # (L, E): one unbatched sequence
        assert torch.equal(ref(x[0], src_key_padding_mask=mask), new(x[0], src_key_padding_mask=mask))
    with pytest.raises(Exception) as theirs:
        ref(x, src_key_padding_mask=pad.T.contiguous())
    with pytest.raises(type(theirs.value)) as ours:
        new(x, src_key_padding_mask=pad.T.contiguous())
    assert str(ours.value) == str(theirs.value)


def test_attention_dropout_follows_the_attention_modules_mode():
    ref, new = _pair(layers=1, dropout=0.4)
    x, pad, w = _inputs()
    for enc in (ref, new):
        enc.eval()
        enc.layers[0].self_attn.train()             # only the attention module in training mode
    torch.manual_seed(12)
    a = _grads(ref, x, pad, w)
    torch.manual_seed(12)
    b = _grads(new, x, pad, w)
    assert torch.equal(a[0], b[0]) and all(torch.equal(p, q) for p, q in zip(a[2], b[2]))


def test_foreach_adamw_equals_the_per_tensor_loop_on_the_grounders_parameters():
    """The grounder's 51 parameter tensors, 40 AdamW steps with gradients from 1e-8 to 1e2 and zeros: torch's
    foreach update (what GroundModule asks for) and its CPU default loop give the same weights and moments."""
    states = []
    for foreach in (True, False):
        torch.manual_seed(0)
        net = BRepGround(40)
        ps = list(net.parameters())
        opt = torch.optim.AdamW(ps, lr=0.002, weight_decay=0.0, foreach=foreach)
        g = torch.Generator().manual_seed(9)
        for _ in range(40):
            for p in ps:
                scale = 10.0 ** torch.randint(-8, 3, (), generator=g).item()
                p.grad = torch.randn(p.shape, generator=g) * scale * (torch.rand(p.shape, generator=g) > 0.2)
            opt.step()
        states.append(([p.detach().clone() for p in ps], [opt.state[p]["exp_avg_sq"].clone() for p in ps]))
    assert len(states[0][0]) == 51
    assert all(torch.equal(a, b) for a, b in zip(states[0][0], states[1][0]))
    assert all(torch.equal(a, b) for a, b in zip(states[0][1], states[1][1]))


def _part(nf: int, ne: int, seed: int) -> dict:
    return random_part(nf, ne, seed, face_scale=1.3, edge_scale=0.7)


def test_grounder_training_bitwise_equal_to_torchs_layer_and_per_tensor_adamw(monkeypatch):
    """Twelve steps of the stage's GroundModule (EncoderLayer, foreach AdamW) against BRepGround built on torch's
    layer and trained by torch's default (per-tensor) AdamW in a plain loop: the same weights, bit for bit."""
    import stages.futurecad.model as model

    parts = pad_parts([_part(3, 5, 1), _part(4, 7, 2), _part(2, 4, 3)], 6, 9)
    g = torch.Generator().manual_seed(4)
    n = 18
    words = torch.randint(2, 15, (n, 6), generator=g)
    words[::3, 4:] = 0
    part_idx = torch.tensor([0, 1, 2] * 6)
    y = (torch.rand(n, 6 + 9, generator=g) < 0.3).float()
    batches = list(GroundLoader(words, part_idx, y, parts, batch=6, steps=12, seed=2, per_part=2))

    def build():
        torch.manual_seed(0)
        return BRepGround(15, d=16, heads=2, text_layers=1, fusion_layers=2, max_words=6)

    net = build()
    module = GroundModule(net, lr=0.004, weight_decay=0.01)
    opt = module.configure_optimizers()
    assert opt.defaults["foreach"] is True
    monkeypatch.setattr(module, "log", lambda *a, **k: pytest.fail("logged without a logger"))
    for i, b in enumerate(batches):
        opt.zero_grad()
        module.training_step(b, i).backward()
        opt.step()

    torch_layer = lambda d, heads, layers: nn.TransformerEncoder(  # noqa: E731
        nn.TransformerEncoderLayer(d, heads, 2 * d, dropout=0.0, batch_first=True, norm_first=True), layers,
        enable_nested_tensor=False)
    monkeypatch.setattr(model, "_encoder", torch_layer)
    ref = build()
    assert not isinstance(ref.fusion.layers[0], EncoderLayer)
    ropt = torch.optim.AdamW(ref.parameters(), lr=0.004, weight_decay=0.01, foreach=False)
    for b in batches:
        ropt.zero_grad()
        logits = ref(b["words"], b["faces"], b["edges"], b["face_type"], b["edge_type"], b["fmask"], b["emask"],
                     b["rows"])
        mask = torch.cat([b["fmask"], b["emask"]], 1)[b["rows"]].float()
        loss = (F.binary_cross_entropy_with_logits(logits, b["y"], reduction="none") * mask).sum() / mask.sum()
        loss.backward()
        ropt.step()
    assert [h["loss"] for h in module.history] != [module.history[0]["loss"]] * 12   # it trained
    assert all(torch.equal(a, b) for a, b in zip(net.parameters(), ref.parameters()))


def test_ground_loss_logged_only_with_a_logger(monkeypatch):
    parts = pad_parts([_part(2, 3, 5)], 2, 3)
    b = {"words": torch.tensor([[3, 4, 0]]), "y": torch.tensor([[1.0, 0, 0, 1, 0]]), **parts}
    torch.manual_seed(0)
    module = GroundModule(BRepGround(6, d=8, heads=2, max_words=3), lr=0.01)
    calls = []
    monkeypatch.setattr(module, "log", lambda *a, **k: calls.append((a, k)))
    module.training_step(b, 0)
    assert calls == []
    monkeypatch.setattr(GroundModule, "logger", property(lambda self: object()))
    loss = module.training_step(b, 1)
    assert calls == [(("ground/loss", loss), {"on_step": True, "prog_bar": False})]


def test_the_grounders_case_runs_this_block_and_the_others_torchs(monkeypatch):
    """Equal values cannot tell which block ran: count calls of torch's own block. The grounder's case (batched,
    batch-first, a (B, L) mask or none, training) must not reach it; each other case must, once per layer."""
    calls = []
    torch_block = nn.TransformerEncoderLayer._sa_block
    monkeypatch.setattr(nn.TransformerEncoderLayer, "_sa_block",
                        lambda self, *a, **k: calls.append(type(self).__name__) or torch_block(self, *a, **k))
    _, new = _pair()                                   # 2 layers
    x, pad, w = _inputs()
    _grads(new, x, pad, w)
    _grads(new, x, None, w)
    assert calls == []
    causal = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
    for kw in ({"mask": causal}, {"mask": causal, "is_causal": True}):
        _grads(new, x, pad, w, **kw)
        assert calls == ["EncoderLayer"] * 2, kw
        calls.clear()
    new(x[0], src_key_padding_mask=pad[0])             # unbatched
    assert calls == ["EncoderLayer"] * 2
    calls.clear()
    _, seq_first = _pair(batch_first=False)
    seq_first(x.transpose(0, 1))
    assert calls == ["EncoderLayer"] * 2
    calls.clear()
    with pytest.raises(Exception):
        new(x, src_key_padding_mask=pad.T.contiguous())
    assert calls == ["EncoderLayer"]                   # torch's block refuses the mask in the first layer
