"""tgdt model.py against an independent re-implementation: pre-norm transformer layers rebuilt by hand
(explicit per-head attention with key-padding / causal masks), the decision transformer's token layout,
the symmetric InfoNCE and the matching BCE rebuilt with loops, data-sharing weights by hand (scale clamp,
top-k), window sampling by replaying the generator, the training-step loss composition. Tiny models,
fixed seeds, non-unit weights (λ_nce ≠ λ_itm ≠ 1, logit scale ≠ init)."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from stages.tgdt.model import ARMS, TEXT_ARMS, TGDT

KW = dict(obs_dim=3, act_dim=2, n_tasks=5, task_dim=2, vocab_size=11, text_len=5, context=4, seg_len=3,
          max_steps=12, d_model=16, n_layers=2, n_heads=2, proj_dim=6)


def make(arm="tgdt", seed=0, **kw):
    torch.manual_seed(seed)
    m = TGDT(arm=arm, **{**KW, **kw})
    g = torch.Generator().manual_seed(seed + 50)
    with torch.no_grad():                         # non-trivial LayerNorm gains/biases everywhere
        for name, p in m.named_parameters():
            if p.dim() == 1 and ("norm" in name or name.startswith("ln_in")):
                p.add_(0.3 * torch.randn(p.shape, generator=g))
        m.pad_tok.copy_(torch.randn(m.pad_tok.shape, generator=g))
    return m


# ----------------------------------------------------------------------------- hand transformer layers
def mha_ref(attn, xq, xkv, mask=None):
    """nn.MultiheadAttention by loops. xq (Lq, d), xkv (Lk, d); mask (Lq, Lk) True = blocked."""
    d = xq.shape[-1]
    H = attn.num_heads
    hd = d // H
    W, b = attn.in_proj_weight, attn.in_proj_bias
    q = xq @ W[:d].T + b[:d]
    k = xkv @ W[d:2 * d].T + b[d:2 * d]
    v = xkv @ W[2 * d:].T + b[2 * d:]
    out = torch.zeros(xq.shape[0], d)
    for h in range(H):
        sl = slice(h * hd, (h + 1) * hd)
        for i in range(xq.shape[0]):
            sc = torch.tensor([float(q[i, sl] @ k[j, sl]) / math.sqrt(hd) for j in range(xkv.shape[0])])
            if mask is not None:
                sc = sc.masked_fill(mask[i], float("-inf"))
            w = torch.softmax(sc, 0)
            out[i, sl] = (w[:, None] * v[:, sl]).sum(0)
    return out @ attn.out_proj.weight.T + attn.out_proj.bias


def ff_ref(layer, x):
    return layer.linear2(torch.relu(layer.linear1(x)))


def enc_ref(encoder, x, key_pad):
    """pre-norm TransformerEncoder on one sample x (L, d), key_pad (L,) True = padding."""
    mask = key_pad[None, :].expand(x.shape[0], -1)
    for layer in encoder.layers:
        x = x + mha_ref(layer.self_attn, layer.norm1(x), layer.norm1(x), mask)
        x = x + ff_ref(layer, layer.norm2(x))
    return x


def dec_ref(decoder, x, mem, mem_pad, causal):
    L = x.shape[0]
    self_mask = torch.triu(torch.ones(L, L, dtype=torch.bool), 1) if causal else None
    cross_mask = mem_pad[None, :].expand(L, -1)
    for layer in decoder.layers:
        x = x + mha_ref(layer.self_attn, layer.norm1(x), layer.norm1(x), self_mask)
        x = x + mha_ref(layer.multihead_attn, layer.norm2(x), mem, cross_mask)
        x = x + ff_ref(layer, layer.norm3(x))
    return x


def text_ids():
    return torch.tensor([[1, 4, 7, 2, 0, 0], [1, 9, 3, 0, 0, 0], [1, 5, 5, 8, 6, 10]])


# ----------------------------------------------------------------------------- construction
def test_constructor_errors_and_arm_modules():
    with pytest.raises(ValueError, match=r"^arm: unknown arm 'bc' \(known: tgdt, tgdt_noalign, dt, onehot, oracle_id, "
                                         r"oracle, tgdt_share\)$"):
        TGDT(arm="bc", **KW)
    with pytest.raises(ValueError, match=r"^context: must be a positive number of timesteps \(got 0\)$"):
        TGDT(arm="dt", **{**KW, "context": 0})
    with pytest.raises(ValueError, match=r"got -2"):
        TGDT(arm="dt", **{**KW, "context": -2})
    TGDT(arm="dt", **{**KW, "context": 1})
    assert ARMS == ("tgdt", "tgdt_noalign", "dt", "onehot", "oracle_id", "oracle", "tgdt_share")
    assert TEXT_ARMS == ("tgdt", "tgdt_noalign", "tgdt_share")
    for arm in TEXT_ARMS:
        m = TGDT(arm=arm, **KW)
        assert m.tpos.shape == (6, 16) and m.traj_pos.shape == (4, 16) and m.traj_cls.shape == (16,)
        assert m.tok.padding_idx == 0 and m.tok.num_embeddings == 11
        assert m.text_proj.out_features == 6 and m.traj_proj.out_features == 6
        assert float(m.logit_scale) == pytest.approx(math.log(1 / 0.07))
        assert len(m.text_enc.layers) == 2 and len(m.traj_enc.layers) == 1 and len(m.match_fuse.layers) == 1
        assert m.match_head.out_features == 1
        for enc, heads in ((m.text_enc, 2), (m.traj_enc, 2), (m.match_fuse, 2)):
            lay = enc.layers[0]
            assert lay.linear1.out_features == 64 and lay.self_attn.num_heads == heads and lay.self_attn.batch_first
            assert lay.norm_first and lay.dropout.p == 0.0
        assert m.text_enc.layers[1].linear1.out_features == 64
        for p in (m.tpos, m.traj_pos, m.traj_cls):                    # 0.02·N(0, 1) initialisation
            assert 0.005 < float(p.std()) < 0.05
        assert not hasattr(m, "null") and not hasattr(m, "task_emb")
    m = TGDT(arm="dt", **KW)
    assert m.null.shape == (1, 1, 16) and not hasattr(m, "tok") and 0.005 < float(m.null.std()) < 0.05
    assert m.dt.layers[1].linear1.out_features == 64 and m.dt.layers[0].norm_first and m.dt.layers[0].dropout.p == 0
    assert m.dt.layers[0].self_attn.batch_first
    for arm in ("onehot", "oracle_id"):
        m = TGDT(arm=arm, **KW)
        assert m.task_emb.num_embeddings == 5 and not hasattr(m, "tok")
    m = TGDT(arm="oracle", **KW)
    assert m.task_mlp[0].in_features == 2 and m.task_mlp[2].out_features == 16
    assert m.embed_t.num_embeddings == 13 and m.embed_s.in_features == 3 and m.embed_a.in_features == 2
    assert m.embed_r.in_features == 1 and m.head.out_features == 2 and len(m.dt.layers) == 2
    assert m.dt.layers[0].self_attn.num_heads == 2 and m.dt.layers[0].linear1.out_features == 64
    assert float(m.pad_tok.abs().max()) == 0
    assert (m.kernel_backend, m.kernel_calls, m.data, m.share, m.history) == ("torch", 0, None, None, [])
    d = TGDT(arm="dt", obs_dim=3, act_dim=2, n_tasks=5, task_dim=2, vocab_size=11, text_len=5, context=4,
             seg_len=3, max_steps=12)
    hp = d.hparams
    assert (hp.d_model, hp.n_layers, hp.n_heads, hp.proj_dim, hp.lr, hp.weight_decay, hp.batch_size, hp.nce_weight,
            hp.itm_weight, hp.seed) == (64, 2, 4, 32, 1e-3, 1e-4, 64, 1.0, 1.0, 0)
    assert len(d.dt.layers) == 2 and d.dt.layers[0].self_attn.num_heads == 4


def test_configure_optimizers():
    m = make("dt", lr=3e-3, weight_decay=0.02)
    opt = m.configure_optimizers()
    assert isinstance(opt, torch.optim.AdamW)
    assert opt.param_groups[0]["lr"] == 3e-3 and opt.param_groups[0]["weight_decay"] == 0.02
    assert sum(p.numel() for g in opt.param_groups for p in g["params"]) == sum(p.numel() for p in m.parameters())


# ----------------------------------------------------------------------------- encoders
def test_text_encoder_and_embedding_equal_hand_layers():
    m = make("tgdt", 1)
    ids = text_ids()
    with torch.no_grad():
        h, pad = m.encode_text(ids)
        e = m.text_embedding(ids)
        assert torch.equal(pad, ids == 0)
        for b in range(3):
            x = m.tok.weight[ids[b]] + m.tpos[:6]
            ref = enc_ref(m.text_enc, x, ids[b] == 0)
            keep = ids[b] != 0
            torch.testing.assert_close(h[b][keep], ref[keep], atol=1e-5, rtol=1e-5)
            p = m.text_proj(ref[0])
            torch.testing.assert_close(e[b], p / p.norm(), atol=1e-5, rtol=1e-5)
    # a shorter id sequence uses the first rows of the positional table
    with torch.no_grad():
        h3, _ = m.encode_text(ids[:, :4])
        ref = enc_ref(m.text_enc, m.tok.weight[ids[0, :4]] + m.tpos[:4], ids[0, :4] == 0)
        torch.testing.assert_close(h3[0, :3], ref[:3], atol=1e-5, rtol=1e-5)


def test_trajectory_encoder_and_embedding_equal_hand_layers():
    m = make("tgdt", 2)
    g = torch.Generator().manual_seed(3)
    obs, act = torch.randn(2, 3, 3, generator=g), torch.randn(2, 3, 2, generator=g)
    with torch.no_grad():
        tok = m.encode_traj(obs, act)
        z = m.traj_embedding(obs, act)
        assert tok.shape == (2, 4, 16)
        for b in range(2):
            x = torch.cat([m.traj_cls[None], m.embed_s(obs[b]) + m.embed_a(act[b])]) + m.traj_pos
            ref = enc_ref(m.traj_enc, x, torch.zeros(4, dtype=torch.bool))
            torch.testing.assert_close(tok[b], ref, atol=1e-5, rtol=1e-5)
            p = m.traj_proj(ref[0])
            torch.testing.assert_close(z[b], p / p.norm(), atol=1e-5, rtol=1e-5)
        tok2 = m.encode_traj(obs[:, :2], act[:, :2])            # shorter segment: first traj_pos rows
        x = torch.cat([m.traj_cls[None], m.embed_s(obs[0, :2]) + m.embed_a(act[0, :2])]) + m.traj_pos[:3]
        torch.testing.assert_close(tok2[0], enc_ref(m.traj_enc, x, torch.zeros(3, dtype=torch.bool)), atol=1e-5,
                                   rtol=1e-5)


def test_memory_per_arm():
    cond = {"task": torch.tensor([3, 0, 4]), "vector": torch.tensor([[0.5, -1.0], [2.0, 0.3], [-0.7, 0.1]]),
            "text": text_ids()}
    with torch.no_grad():
        m = make("dt")
        mem, pad = m.memory(cond)
        assert mem.shape == (3, 1, 16) and torch.equal(mem[2, 0], m.null[0, 0])
        assert pad.dtype == torch.bool and pad.shape == (3, 1) and not bool(pad.any())
        m = make("onehot")
        mem, pad = m.memory(cond)
        assert torch.equal(mem[:, 0], m.task_emb.weight[[3, 0, 4]]) and pad.shape == (3, 1) and not bool(pad.any())
        m = make("oracle")
        mem, pad = m.memory(cond)
        ref = m.task_mlp[2](F.gelu(m.task_mlp[0](cond["vector"])))
        torch.testing.assert_close(mem[:, 0], ref)
        assert pad.shape == (3, 1) and not bool(pad.any())
        for arm in TEXT_ARMS:
            m = make(arm)
            mem, pad = m.memory(cond)
            h, p = m.encode_text(cond["text"])
            torch.testing.assert_close(mem, h)
            assert torch.equal(pad, p)


# ----------------------------------------------------------------------------- decision transformer
def act_ref(m, rtg, obs, act, ts, pad, mem, mem_pad):
    B, K = rtg.shape
    out = torch.zeros(B, K, act.shape[-1])
    for b in range(B):
        toks = []
        for t in range(K):                               # (R̂_t, s_t, a_t) interleaved, padded steps → pad token
            te = m.embed_t.weight[ts[b, t]]
            trio = [m.embed_r(rtg[b, t:t + 1]) + te, m.embed_s(obs[b, t]) + te, m.embed_a(act[b, t]) + te]
            toks += [m.pad_tok] * 3 if pad[b, t] else trio
        x = m.ln_in(torch.stack(toks))
        h = dec_ref(m.dt, x, mem[b], mem_pad[b], causal=True)
        out[b] = torch.tanh(m.head(h[1::3]))             # from the s_t tokens
    return out


@pytest.mark.parametrize("arm", ["tgdt", "oracle"])
def test_act_equals_hand_decision_transformer(arm):
    m = make(arm, 4)
    g = torch.Generator().manual_seed(5)
    B, K = 3, 4
    rtg, obs, act = 2 * torch.randn(B, K, generator=g), torch.randn(B, K, 3, generator=g), torch.randn(B, K, 2, generator=g)
    ts = torch.tensor([[0, 0, 1, 2], [5, 6, 7, 8], [9, 10, 11, 12]])
    pad = torch.tensor([[True, True, False, False], [False] * 4, [True, False, False, False]])
    cond = {"text": text_ids(), "task": torch.tensor([0, 1, 2]), "vector": torch.randn(3, 2, generator=g)}
    with torch.no_grad():
        got = m.act(rtg, obs, act, ts, pad, cond)
        mem, mem_pad = m.memory(cond)
        ref = act_ref(m, rtg, obs, act, ts, pad, mem, mem_pad)
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
        # a precomputed memory is used as given (here: another description's)
        other = m.memory({**cond, "text": text_ids().flip(0)})
        torch.testing.assert_close(m.act(rtg, obs, act, ts, pad, cond, memory=other),
                                   act_ref(m, rtg, obs, act, ts, pad, *other), atol=1e-5, rtol=1e-5)
        # causality: a_t and later inputs never change â_t; s_t does
        act2, obs2, rtg2 = act.clone(), obs.clone(), rtg.clone()
        act2[:, 2:] += 3.0
        obs2[:, 3:] -= 2.0
        rtg2[:, 3:] += 4.0
        got2 = m.act(rtg2, obs2, act2, ts, pad, cond)
        torch.testing.assert_close(got2[:, :3], got[:, :3], atol=1e-6, rtol=0)
        assert float((got2[:, 3] - got[:, 3]).abs().max()) > 1e-4


# ----------------------------------------------------------------------------- data, sampling, sharing
def toy_data(N=10, T=7, n_tasks=5, n_tmpl=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    task = torch.tensor([0, 0, 1, 1, 2, 2, 3, 4, 4, 1])
    held = torch.isin(task, torch.tensor([3, 4]))
    text = torch.randint(1, 11, (n_tasks, n_tmpl, 6), generator=g)
    text[..., 0] = 1
    text[:, :, 4:] = 0
    expert = torch.tensor([True, False, True, True, False, True, True, True, False, False])
    return {"obs": torch.randn(N, T, 3, generator=g), "act": torch.randn(N, T, 2, generator=g),
            "rtg": torch.randn(N, T, generator=g), "task": task, "held_out": held,
            "train_eps": torch.nonzero(~held).squeeze(1), "train_tasks": torch.tensor([0, 1, 2]),
            "expert_eps": {t: torch.nonzero(expert & (task == t)).squeeze(1) for t in range(n_tasks)},
            "task_eps": {t: torch.nonzero(task == t).squeeze(1) for t in range(n_tasks)},
            "text": text, "vector": torch.randn(n_tasks, 2, generator=g)}


def attached(arm="tgdt", seed=0, **kw):
    m = make(arm, seed, **kw)
    m.attach(toy_data())
    m.on_fit_start()
    return m


def test_on_fit_start_builds_padded_episode_matrices():
    m = attached(seed=3)
    D = m.data
    assert D["expert_eps_mat"].tolist() == [[0, 0], [2, 3], [5, 0], [6, 0], [7, 0]]
    assert D["expert_eps_cnt"].tolist() == [1, 2, 1, 1, 1]
    assert D["task_eps_mat"].tolist() == [[0, 1, 0], [2, 3, 9], [4, 5, 0], [6, 0, 0], [7, 8, 0]]
    assert D["task_eps_cnt"].tolist() == [2, 3, 2, 1, 2]
    m2 = make("tgdt")
    data = toy_data()
    data["expert_eps"] = {0: torch.tensor([0]), 1: torch.tensor([2]), 2: torch.tensor([5]),
                          3: torch.tensor([], dtype=torch.long), 4: torch.tensor([7])}   # empty: count 1, zeros
    m2.attach(data)
    m2.on_fit_start()
    assert m2.data["expert_eps_cnt"].tolist() == [1, 1, 1, 1, 1]
    assert m2.data["expert_eps_mat"].tolist() == [[0], [2], [5], [0], [7]]
    assert m2.gen.initial_seed() == 12345


def test_sample_windows_replayed():
    m = attached(seed=4, context=3)
    m.hparams.seed = 7
    m.on_fit_start()
    D = m.data
    n, K, T = 6, 3, 7
    g = torch.Generator().manual_seed(7 + 12345)
    rtg, obs, act, idx, pad, cond = m.sample_windows(n)
    ep = D["train_eps"][torch.randint(len(D["train_eps"]), (n,), generator=g)]
    end = torch.randint(1, T + 1, (n,), generator=g)
    tmpl = torch.randint(3, (n,), generator=g)
    for b in range(n):
        for k in range(K):
            i = int(end[b]) - K + k
            assert int(idx[b, k]) == max(i, 0) and bool(pad[b, k]) == (i < 0)
            assert torch.equal(obs[b, k], D["obs"][ep[b], max(i, 0)])
            assert torch.equal(act[b, k], D["act"][ep[b], max(i, 0)])
            assert float(rtg[b, k]) == float(D["rtg"][ep[b], max(i, 0)])
        task = int(D["task"][ep[b]])
        assert int(cond["task"][b]) == task and torch.equal(cond["vector"][b], D["vector"][task])
        assert torch.equal(cond["text"][b], D["text"][task, tmpl[b]])
    assert bool(pad.any()) and not bool(pad.all())


def test_share_with_weights_by_hand_and_shared_sampling():
    m = attached(seed=5)
    with torch.no_grad():
        m.logit_scale.fill_(math.log(3.0))
    m.share_with(top_k=2)
    held, w = m.share
    assert held.tolist() == [3, 4]
    with torch.no_grad():
        e = m.text_embedding(m.data["text"][:, 0])
    for r, u in enumerate([3, 4]):
        sims = [3.0 * float(e[u] @ e[j]) for j in (0, 1, 2)]
        top = sorted(range(3), key=lambda j: -sims[j])[:2]
        z = sum(math.exp(sims[j]) for j in top)
        exp = [math.exp(sims[j]) / z if j in top else 0.0 for j in range(3)]
        assert w[r].tolist() == pytest.approx(exp, abs=1e-6)
    with torch.no_grad():
        m.logit_scale.fill_(math.log(250.0))                        # clamped to 100
    m.share_with(top_k=5)                                           # k > #train tasks: all three kept
    held, w = m.share
    for r, u in enumerate([3, 4]):
        sims = [100.0 * float(e[u] @ e[j]) for j in (0, 1, 2)]
        mx = max(sims)
        z = sum(math.exp(s - mx) for s in sims)
        assert w[r].tolist() == pytest.approx([math.exp(s - mx) / z for s in sims], abs=1e-5)
    m.share_with()                                                  # default top-3 == all three here
    assert bool((m.share[1] > 0).all())
    m.data["train_tasks"] = torch.tensor([0, 1, 2, 3])              # four training tasks: default keeps 3
    m.share_with()
    held, w = m.share
    assert held.tolist() == [4] and w.shape == (1, 4)
    sims = [float(e[4] @ e[j]) for j in range(4)]
    assert [float(x) > 0 for x in w[0]] == [x != min(sims) for x in sims]
    m.data["train_tasks"] = torch.tensor([0, 1, 2])
    # shared sampling: second half pairs a held-out description with a training task's episode
    m.share = (torch.tensor([3, 4]), torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]))
    n = 7
    g = torch.Generator().manual_seed(m.gen.initial_seed())
    g.set_state(m.gen.get_state())
    rtg, obs, act, idx, pad, cond = m.sample_windows(n)
    D = m.data
    ep = D["train_eps"][torch.randint(len(D["train_eps"]), (n,), generator=g)]
    half = n // 2
    u = torch.randint(2, (half,), generator=g)
    jj = torch.multinomial(m.share[1][u], 1, generator=g).squeeze(1)  # consumes the generator like the model
    j = torch.tensor([1 if int(x) == 0 else 2 for x in u])           # the one-hot weights pick task 1 / 2
    assert D["train_tasks"][jj].tolist() == j.tolist()
    pick = torch.randint(10 ** 9, (half,), generator=g)
    eps_j = [D["task_eps"][int(t)][int(p) % len(D["task_eps"][int(t)])] for t, p in zip(j, pick)]
    end = torch.randint(1, 8, (n,), generator=g)
    tmpl = torch.randint(3, (n,), generator=g)
    ep = torch.cat([ep[:n - half], torch.stack(eps_j)])
    for b in range(n):
        i = max(int(end[b]) - 1, 0)
        assert torch.equal(obs[b, -1], D["obs"][ep[b], i])
        task = int(D["task"][ep[b]])
        assert int(cond["task"][b]) == task
        text_task = task if b < n - half else [3, 4][int(u[b - (n - half)])]
        assert torch.equal(cond["text"][b], D["text"][text_task, tmpl[b]])
    assert [int(D["task"][e]) for e in ep[n - half:]] == j.tolist()


# ----------------------------------------------------------------------------- alignment losses and the step
def infonce_ref(t, z, s):
    n = t.shape[0]
    L = [[s * float(t[i] @ z[j]) for j in range(n)] for i in range(n)]
    row = sum(math.log(sum(math.exp(L[i][j]) for j in range(n))) - L[i][i] for i in range(n)) / n
    col = sum(math.log(sum(math.exp(L[i][j]) for i in range(n))) - L[j][j] for j in range(n)) / n
    return 0.5 * (row + col)


def test_alignment_losses_rebuilt_by_hand():
    m = attached(seed=6, seg_len=3)
    with torch.no_grad():
        m.logit_scale.fill_(math.log(4.5))
    D = m.data
    g = torch.Generator()
    g.set_state(m.gen.get_state())
    calls = m.kernel_calls
    nce, itm = m.alignment_losses()
    assert m.kernel_calls == calls + 1
    n, T, Lg = 3, 7, 3
    pick = torch.randint(10 ** 9, (n,), generator=g)
    ep = [D["expert_eps"][t][int(p) % len(D["expert_eps"][t])] for t, p in zip((0, 1, 2), pick)]
    start = torch.randint(0, T - Lg + 1, (n,), generator=g)
    tmpl = torch.randint(3, (n,), generator=g)
    u = torch.rand((n, n), generator=g)                             # Gumbel-max noise of the negatives
    with torch.no_grad():
        obs = torch.stack([D["obs"][e, s:s + Lg] for e, s in zip(ep, start)])
        act = torch.stack([D["act"][e, s:s + Lg] for e, s in zip(ep, start)])
        text = torch.stack([D["text"][t, k] for t, k in zip((0, 1, 2), tmpl)])
        temb = m.text_embedding(text)
        zemb = m.traj_embedding(obs, act)
        assert float(nce) == pytest.approx(infonce_ref(temb, zemb, 4.5), rel=1e-5)
        sim = 4.5 * zemb @ temb.T
        neg = [max((j for j in range(n) if j != i), key=lambda j: float(sim[i, j]) - math.log(-math.log(float(u[i, j]))))
               for i in range(n)]
        assert all(int(neg[i]) != i for i in range(n))
        th, tpad = m.encode_text(text)
        traj = m.encode_traj(obs, act)
        bce = 0.0
        for i in range(2 * n):
            src = i if i < n else int(neg[i - n])
            fused = dec_ref(m.match_fuse, traj[i % n], th[src], tpad[src], causal=False)
            logit = float(m.match_head(fused[0]))
            y = 1.0 if i < n else 0.0
            bce += -(y * math.log(1 / (1 + math.exp(-logit))) + (1 - y) * math.log(1 - 1 / (1 + math.exp(-logit))))
        assert float(itm) == pytest.approx(bce / (2 * n), rel=1e-5)
    nce.backward()
    assert m.logit_scale.grad is not None and float(m.logit_scale.grad.abs()) > 0


def test_alignment_scale_is_clamped_at_100():
    m = attached(seed=7)
    with torch.no_grad():
        m.logit_scale.fill_(math.log(400.0))
    D = m.data
    g = torch.Generator()
    g.set_state(m.gen.get_state())
    nce, _ = m.alignment_losses()
    pick = torch.randint(10 ** 9, (3,), generator=g)
    ep = [D["expert_eps"][t][int(p) % len(D["expert_eps"][t])] for t, p in zip((0, 1, 2), pick)]
    start = torch.randint(0, 7 - 3 + 1, (3,), generator=g)
    tmpl = torch.randint(3, (3,), generator=g)
    with torch.no_grad():
        obs = torch.stack([D["obs"][e, s:s + 3] for e, s in zip(ep, start)])
        act = torch.stack([D["act"][e, s:s + 3] for e, s in zip(ep, start)])
        text = torch.stack([D["text"][t, k] for t, k in zip((0, 1, 2), tmpl)])
        ref = infonce_ref(m.text_embedding(text), m.traj_embedding(obs, act), 100.0)
    assert float(nce) == pytest.approx(ref, rel=1e-4)


@pytest.mark.parametrize("arm,aligned", [("tgdt", True), ("tgdt_share", True), ("tgdt_noalign", False), ("dt", False)])
def test_training_step_loss_composition(arm, aligned):
    m = attached(arm, seed=8, batch_size=5, nce_weight=0.3, itm_weight=1.7)
    def log_dict(logs, **kw):
        assert kw == {"prog_bar": True}
        m._logged = logs
    m.log_dict = log_dict
    m._trainer = SimpleNamespace(max_steps=6)
    state = m.gen.get_state()
    loss = m.training_step(None, 0)
    m.gen.set_state(state)
    rtg, obs, act, ts, pad, cond = m.sample_windows(5)
    with torch.no_grad():
        pred = m.act(rtg, obs, act, ts, pad, cond)
        num = sum(float(((pred[b, k] - act[b, k]) ** 2).sum()) for b in range(5) for k in range(4) if not pad[b, k])
        mse = num / (int((~pad).sum()) * 2)
        exp = mse
        if aligned:
            nce, itm = m.alignment_losses()
            exp = mse + 0.3 * float(nce) + 1.7 * float(itm)
            assert set(m._logged) == {"mse", "nce", "itm"}
            assert float(m._logged["nce"]) == pytest.approx(float(nce), rel=1e-5)
        else:
            assert set(m._logged) == {"mse"}
    assert bool(pad.any())
    assert float(loss) == pytest.approx(exp, rel=1e-5)
    assert float(m._logged["mse"]) == pytest.approx(mse, rel=1e-5)
    assert math.isnan(m.history[0].pop("val_mse"))                  # no validation windows attached here
    assert m.history == [{"step": 0, **{k: pytest.approx(float(v)) for k, v in m._logged.items()}}]
    for i in (1, 4, 19):
        m.training_step(None, i)
    assert [h["step"] for h in m.history] == [0]
    m.training_step(None, 5)                                       # the last step (max_steps − 1)
    m.training_step(None, 20)
    m.training_step(None, 40)
    assert [h["step"] for h in m.history] == [0, 5, 20, 40]
