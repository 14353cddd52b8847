"""Issue 51 runtime changes keep the math: the last-layer-rows decoder equals the full decoder, the
sped-up solo step equals the old one (full decoder, single-tensor AdamW), the vectorized seeds equal
their solo runs, the learning curve continued past `steps` equals one uninterrupted run, and the
Gumbel-max negatives follow the softmax they replace."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

from stages.common.trainer import TrainerConfig, make_trainer
from stages.tgdt import model as M
from stages.tgdt import train as T
from tests.tgdt.test_model_brute import make, toy_data

META = {"obs_dim": 3, "act_dim": 2, "max_steps": 7, "vocab": [f"w{i}" for i in range(11)],
        "tasks": [{"vector": [0.1 * t, -0.2 * t]} for t in range(5)]}


def cfg(**kw):
    base = dict(seeds=[3, 8], steps=4, batch_size=5, context=4, seg_len=3, text_len=5, d_model=16, n_layers=2,
                n_heads=2, proj_dim=8, lr=3e-3, weight_decay=0.02, nce_weight=0.7, itm_weight=1.3)
    return T.Config(**{**base, **kw})


def data():
    d = toy_data()
    d["val"] = T.val_windows(d, torch.tensor([1, 4, 7]), 7, 4)      # a validation curve that is not nan
    return d


def fit(module, steps):
    tr = make_trainer(TrainerConfig(enable_progress_bar=False), None, max_steps=steps)
    tr.fit(module, torch.utils.data.DataLoader(range(steps), batch_size=None))
    return tr


def solo(arm, seed, c, steps, backend="torch"):
    m = T.build(arm, seed, META, c)
    m.kernel_backend = backend
    m.attach(data())
    tr = fit(m, steps)
    return m, tr


def same_history(a, b, rel=1e-4):
    assert [h["step"] for h in a] == [h["step"] for h in b]
    for x, y in zip(a, b):
        assert set(x) == set(y)
        for k in x:
            assert x[k] == pytest.approx(y[k], rel=rel, abs=1e-6), (x["step"], k)


def same_state(a, b, atol=2e-5):
    """Equal weights, except the key thirds of attention in-projection biases: their true gradient is
    0 (a key bias shifts a whole softmax row), so AdamW steps them by ±lr on float rounding noise."""
    assert a.keys() == b.keys()
    for k in a:
        x, y = a[k], b[k]
        if k.endswith("in_proj_bias"):
            d = x.shape[0] // 3
            x, y = torch.cat([x[:d], x[2 * d:]]), torch.cat([y[:d], y[2 * d:]])
        torch.testing.assert_close(x, y, atol=atol, rtol=1e-4, msg=k)


@pytest.mark.parametrize("arm", ["tgdt", "dt", "oracle"])
def test_decode_rows_equal_the_full_decoder(arm):
    m = make(arm, seed=4, n_layers=2)
    g = torch.Generator().manual_seed(11)
    B, K = 5, 4
    rtg, obs, act = torch.randn(B, K, generator=g), torch.randn(B, K, 3, generator=g), torch.randn(B, K, 2, generator=g)
    ts, pad = torch.randint(0, 7, (B, K), generator=g), torch.rand(B, K, generator=g) < 0.3
    cond = {"task": torch.tensor([0, 1, 2, 3, 4]), "vector": torch.randn(B, 2, generator=g),
            "text": toy_data()["text"][torch.tensor([0, 1, 2, 3, 4]), 1]}
    te = m.embed_t(ts)
    tok = torch.stack([m.embed_r(rtg[..., None]) + te, m.embed_s(obs) + te, m.embed_a(act) + te], 2)
    tok = torch.where(pad[:, :, None, None], m.pad_tok, tok).reshape(B, 3 * K, -1)
    mem, mpad = m.memory(cond)
    causal = nn.Transformer.generate_square_subsequent_mask(3 * K)
    full = torch.tanh(m.head(m.dt(m.ln_in(tok), mem, tgt_mask=causal, tgt_is_causal=True,
                                  memory_key_padding_mask=mpad)))                       # every token
    torch.testing.assert_close(m.act(rtg, obs, act, ts, pad, cond), full[:, 1::3], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(m.act(rtg, obs, act, ts, pad, cond, last_only=True)[:, 0], full[:, 3 * K - 2],
                               atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("arm", ["tgdt", "oracle_id"])
def test_faster_solo_step_keeps_the_loss_curve(arm, monkeypatch):
    """Same seed -> the same curve and weights as the old step (whole decoder, single-tensor AdamW).
    oracle_id: the one-key cross-attention shortcut; its norm2 LayerNorms then get no gradient (they
    only shaped queries of a softmax over one key, which is 1 whatever the query: a true gradient of 0,
    which AdamW's weight decay would still shrink) and neither do the cross-attention's query/key
    projections (the old path stepped them on rounding noise): only the value third is compared."""
    monkeypatch.setattr(M, "CURVE_EVERY", 1)
    c = cfg(steps=5)
    new, _ = solo(arm, 3, c, 5)

    def full_decode(self, x, mem, mem_pad, rows):
        causal = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        return self.dt(x, mem, tgt_mask=causal, tgt_is_causal=True, memory_key_padding_mask=mem_pad)[:, rows]

    def single_tensor_adamw(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay,
                                 foreach=False)

    monkeypatch.setattr(M.TGDT, "decode", full_decode)
    monkeypatch.setattr(M.TGDT, "configure_optimizers", single_tensor_adamw)
    old, _ = solo(arm, 3, c, 5)
    assert len(new.history) == 5 and all(math.isfinite(h["val_mse"]) for h in new.history)
    same_history(new.history, old.history)
    def kept(state):
        if arm != "oracle_id":
            return state
        out = {k: v for k, v in state.items() if ".norm2." not in k}
        for k in [k for k in out if ".multihead_attn.in_proj_" in k]:
            out[k] = out[k][2 * out[k].shape[0] // 3:]                 # the value third: q, k never matter
        return out

    same_state(kept(new.state_dict()), kept(old.state_dict()))


@pytest.mark.parametrize("arm,backend", [("tgdt", "torch"), ("dt", "torch"), ("tgdt", "triton")])
def test_ensemble_members_equal_solo_runs(arm, backend, monkeypatch):
    """triton: the fused InfoNCE's Triton path (interpreted here) inside vmap, through its vmap rule."""
    monkeypatch.setattr(M, "CURVE_EVERY", 2)
    c = cfg()
    ens = T.EnsembleTGDT(arm, c.seeds, META, c, data())
    ens.template.kernel_backend = backend
    fit(ens, c.steps)
    assert ens.kernel_calls == (len(c.seeds) * c.steps if arm == "tgdt" else 0)
    for k, seed in enumerate(c.seeds):
        m, _ = solo(arm, seed, c, c.steps, backend)
        assert m.kernel_calls == (c.steps if arm == "tgdt" else 0)
        same_history(ens.history[k], m.history)
        same_state(ens.ensemble.member_state_dict(k), m.state_dict())
    # the two seeds really differ (the comparison above is not between copies)
    assert ens.history[0][-1]["mse"] != pytest.approx(ens.history[1][-1]["mse"], rel=1e-3)


@pytest.mark.parametrize("vectorized", [False, True])
def test_continued_curve_equals_one_long_run(vectorized, monkeypatch):
    """`steps` steps (solo or ensemble member 0) + continue_curve to `curve_steps` == one solo run of
    `curve_steps` steps: the recorded long curve is the evaluated model's own continuation."""
    monkeypatch.setattr(M, "CURVE_EVERY", 2)
    c = cfg(steps=3, curve_steps=6)
    long, _ = solo("tgdt", 3, c, 6)
    if vectorized:
        ens = T.EnsembleTGDT("tgdt", c.seeds, META, c, data())
        tr = fit(ens, c.steps)
        first, state = ens.history[0], ens.ensemble.member_state_dict(0)
        opt, gen = T.member_optimizer_state(tr.optimizers[0], 0), ens.gens[0].get_state()
    else:
        m, tr = solo("tgdt", 3, c, c.steps)
        first, state = m.history, m.state_dict()
        opt, gen = T.member_optimizer_state(tr.optimizers[0], None), m.gen.get_state()
    rest = T.continue_curve("tgdt", 3, META, c, data(), state, opt, gen, TrainerConfig(enable_progress_bar=False),
                            None, "torch")
    assert [h["step"] for h in first] == [0, 2] and [h["step"] for h in rest] == [4, 5]
    same_history(first + rest, long.history)                       # steps 0, 2, 4, 5


def test_gumbel_negatives_follow_the_softmax_without_the_diagonal():
    sim = torch.tensor([[0.0, 1.0, -0.5, 2.0], [0.3, 5.0, 0.3, -1.0], [1.0, 1.0, 9.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    g = torch.Generator().manual_seed(5)
    n = 20000
    u = torch.rand((n, 4, 4), generator=g).clamp(1e-12, 1 - 1e-7)
    neg = M.gumbel_negatives(sim.expand(n, 4, 4), -torch.log(-torch.log(u)))              # (n, 4)
    for i in range(4):
        p = [0.0 if j == i else math.exp(float(sim[i, j])) for j in range(4)]
        p = [x / sum(p) for x in p]
        freq = torch.bincount(neg[:, i], minlength=4).float() / n
        assert float(freq[i]) == 0.0
        for j in range(4):
            assert float(freq[j]) == pytest.approx(p[j], abs=0.015)
