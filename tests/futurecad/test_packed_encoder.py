"""PackedEncoderLayer / packed_encode (model.py) against torch's own nn.TransformerEncoderLayer, and the grounder's
optimizer and logging (lit.py).

The packed path runs the position-wise ops on the real tokens only; it must compute what torch's layer computes on
each sequence alone. References: torch's encoder run on every sequence by itself, without padding or mask (the
brute force), and torch's encoder on the padded batch with a key-padding mask. Comparisons in float64 at 1e-12
(float32 at 1e-5), inputs of scale 1.7 with padding at the end, in the middle and rows with one real token."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from stages.futurecad import cad
from stages.futurecad.lit import GroundModule
from stages.futurecad.model import PAD, BRepGround, GroundLoader, PackedEncoderLayer, pad_parts, packed_encode
from tests.futurecad.helpers import random_part

D, H = 24, 3


def _pair(layers: int = 2, d: int = D, heads: int = H, dtype=torch.float64, **kw):
    """torch's encoder and the packed one, from the same seed (the same weights)."""
    out = []
    for cls in (nn.TransformerEncoderLayer, PackedEncoderLayer):
        torch.manual_seed(7)
        layer = cls(d, heads, 2 * d, **{"dropout": 0.0, "batch_first": True, "norm_first": True, **kw})
        out.append(nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).to(dtype))
    return out


def _inputs(B: int = 5, L: int = 9, d: int = D, dtype=torch.float64):
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(B, L, d, generator=g) * 1.7 + 0.3).to(dtype)
    keep = torch.ones(B, L, dtype=torch.bool)
    keep[0, 6:] = False        # padding at the end
    keep[2, 1:] = False        # one real token
    keep[3, 3:5] = False       # padding in the middle
    return x, keep


def _packed_grads(enc, x, keep, w):
    enc.zero_grad()
    xi = x.clone().requires_grad_()
    yp, idx = packed_encode(enc, xi, keep)
    (yp * w.reshape(-1, w.shape[-1])[idx]).sum().backward()
    return yp.detach(), idx, xi.grad, [p.grad.clone() for p in enc.parameters()]


def test_same_parameters_and_state_dict():
    ref, new = _pair()
    assert all(isinstance(layer, PackedEncoderLayer) for layer in new.layers)
    assert list(ref.state_dict()) == list(new.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(ref.state_dict().values(), new.state_dict().values()))
    new.load_state_dict(ref.state_dict())         # a checkpoint of torch's layer loads (and the reverse)
    ref.load_state_dict(new.state_dict())


def test_packed_equals_each_sequence_alone():
    """The brute force: every sequence's real tokens through torch's encoder by themselves (no padding, no mask)."""
    ref, new = _pair()
    x, keep = _inputs()
    with torch.no_grad():
        yp, idx = packed_encode(new, x, keep)
    assert idx.tolist() == keep.reshape(-1).nonzero().flatten().tolist()
    assert yp.shape == (int(keep.sum()), D)
    rows = []
    for b in range(x.shape[0]):
        with torch.no_grad():
            rows.append(ref(x[b: b + 1, keep[b]])[0])
    alone = torch.cat(rows)
    assert torch.allclose(yp, alone, rtol=0, atol=1e-12)
    assert (yp - x.reshape(-1, D)[idx]).abs().max() > 0.1          # the layers did something


def test_packed_gradients_equal_torchs_masked_layer():
    ref, new = _pair()
    x, keep = _inputs()
    w = torch.randn(x.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    yp, idx, gx, gp = _packed_grads(new, x, keep, w)
    ref.zero_grad()
    xi = x.clone().requires_grad_()
    y = ref(xi, src_key_padding_mask=~keep)
    (y * w * keep[..., None]).sum().backward()           # the padded slots' outputs are not used
    assert torch.allclose(yp, y.detach().reshape(-1, D)[idx], rtol=0, atol=1e-12)
    assert torch.allclose(gx, xi.grad, rtol=0, atol=1e-12)
    assert gx[~keep].abs().max() == 0                      # a padded slot's input reaches nothing
    assert len(gp) == 2 * 12
    for a, b in zip(gp, [p.grad for p in ref.parameters()]):
        assert torch.allclose(a, b, rtol=0, atol=1e-11)
    assert all(blk.abs().sum() > 0 for blk in gp[0].chunk(3))     # q, k and v each reach the in-projection


def test_float32_and_other_shapes():
    for B, L, d, heads in ((1, 1, 8, 2), (4, 13, 16, 4), (3, 5, 24, 1)):
        ref, new = _pair(layers=1, d=d, heads=heads, dtype=torch.float32)
        g = torch.Generator().manual_seed(B * 31 + L)
        x = torch.randn(B, L, d, generator=g) * 2.5
        keep = torch.rand(B, L, generator=g) < 0.7
        keep[:, 0] = True
        with torch.no_grad():
            yp, idx = packed_encode(new, x, keep)
            y = ref(x, src_key_padding_mask=~keep)
        assert torch.allclose(yp, y.reshape(-1, d)[idx], atol=1e-5), (B, L, d, heads)


def test_packed_refuses_post_norm_and_training_dropout():
    x, keep = _inputs()
    _, post = _pair(norm_first=False)
    msg = r"^PackedEncoderLayer\.packed: needs norm_first=True and no dropout in training$"
    with pytest.raises(ValueError, match=msg):
        packed_encode(post, x, keep)
    _, drop = _pair(dropout=0.2)
    with pytest.raises(ValueError, match=msg):
        packed_encode(drop.train(), x, keep)
    with torch.no_grad():                                   # eval mode: dropout is off, the packed path runs
        packed_encode(drop.eval(), x, keep)


# ------------------------------------------------------------------------------------ the grounder
def _part(nf: int, ne: int, seed: int) -> dict:
    return random_part(nf, ne, seed, face_scale=1.3, edge_scale=0.7)


def _padded_forward(net: BRepGround, words, faces, edges, face_type, edge_type, fmask, emask, rows=None):
    """The grounder on padded batches through torch's own encoder forward (key-padding masks): every slot
    computed, as the module did before packing."""
    B, W = words.shape
    P, Fn = faces.shape[:2]
    En = edges.shape[1]
    wmask = words != PAD
    t = net.text(net.word(words) + net.wpos(torch.arange(W)), src_key_padding_mask=~wmask)
    f = net.face_enc(faces.reshape(P * Fn, cad.UV, cad.UV, -1).permute(0, 3, 1, 2)).reshape(P, Fn, -1)
    f = f + net.ftype(face_type) + net.kind.weight[1]
    e = net.edge_enc(edges.reshape(P * En, cad.CURVE, -1).permute(0, 2, 1)).reshape(P, En, -1)
    e = e + net.etype(edge_type) + net.kind.weight[2]
    if rows is not None:
        f, e, fmask, emask = f[rows], e[rows], fmask[rows], emask[rows]
    x = torch.cat([t + net.kind.weight[0], f, e], 1)
    h = net.fusion(x, src_key_padding_mask=~torch.cat([wmask, fmask, emask], 1))
    return net.head(h[:, W:]).squeeze(-1)


def _batches(steps: int = 12):
    parts = pad_parts([_part(3, 5, 1), _part(4, 7, 2), _part(2, 4, 3)], 6, 9)
    g = torch.Generator().manual_seed(4)
    n = 18
    words = torch.randint(2, 15, (n, 6), generator=g)
    words[::3, 4:] = 0
    part_idx = torch.tensor([0, 1, 2] * 6)
    y = (torch.rand(n, 6 + 9, generator=g) < 0.3).float()
    return list(GroundLoader(words, part_idx, y, parts, batch=6, steps=steps, seed=2, per_part=2))


def _build():
    torch.manual_seed(0)
    return BRepGround(15, d=16, heads=2, text_layers=1, fusion_layers=2, max_words=6).double()


def _args(b):
    return (b["words"], b["faces"].double(), b["edges"].double(), b["face_type"], b["edge_type"], b["fmask"],
            b["emask"], b["rows"])


def test_grounder_logits_equal_the_padded_forward_and_padding_logits_are_zero():
    net = _build()
    for b in _batches(4):
        keep = torch.cat([b["fmask"], b["emask"]], 1)[b["rows"]]
        assert not keep.all()                                 # the batches have padded primitives
        with torch.no_grad():
            out, ref = net(*_args(b)), _padded_forward(net, *_args(b))
        assert torch.allclose(out[keep], ref[keep], rtol=0, atol=1e-12)
        assert (out[~keep] == 0).all()


def test_grounder_training_equals_the_padded_grounder(monkeypatch):
    """Twelve steps of the stage's GroundModule (packed, foreach AdamW) against the padded forward trained by
    torch's default (per-tensor) AdamW in a plain loop, float64: the same weights to 1e-9."""
    batches = _batches()
    net = _build()
    module = GroundModule(net, lr=0.004, weight_decay=0.01)
    opt = module.configure_optimizers()
    assert opt.defaults["foreach"] is True
    monkeypatch.setattr(module, "log", lambda *a, **k: pytest.fail("logged without a logger"))
    for i, b in enumerate(batches):
        opt.zero_grad()
        module.training_step(dict(b, faces=b["faces"].double(), edges=b["edges"].double(), y=b["y"].double()),
                             i).backward()
        opt.step()
    ref = _build()
    ropt = torch.optim.AdamW(ref.parameters(), lr=0.004, weight_decay=0.01, foreach=False)
    for b in batches:
        ropt.zero_grad()
        logits = _padded_forward(ref, *_args(b))
        mask = torch.cat([b["fmask"], b["emask"]], 1)[b["rows"]].double()
        loss = (F.binary_cross_entropy_with_logits(logits, b["y"].double(), reduction="none") * mask).sum() / mask.sum()
        loss.backward()
        ropt.step()
    assert [h["loss"] for h in module.history] != [module.history[0]["loss"]] * 12   # it trained
    start = _build()
    assert max(float((a - s).abs().max()) for a, s in zip(net.parameters(), start.parameters())) > 1e-3
    assert all(torch.allclose(a, b, rtol=0, atol=1e-9) for a, b in zip(net.parameters(), ref.parameters()))


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
