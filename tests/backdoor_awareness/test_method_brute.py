"""backdoor_awareness.method against independent brute force (issue 33, mutation testing): the SFT loss and
its data helpers, decoding/attack success, R = R_ASR + R_len (length boundary, λ ≠ 1, deduplication, query
count, the GRPO reward hook), candidate extraction, the inversion policy's sampling distribution (masking,
temperature, stopping), self-consistency ranking, random search and GCG (gradient w.r.t. the one-hot trigger
rebuilt by hand, the budget boundary, top-k swaps, the loss-decreasing walk). Fast: tiny models only."""
from __future__ import annotations

from collections import Counter as Tally
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn as nn

from stages.backdoor_awareness import method as M
from stages.backdoor_awareness.task import (BOS, EOS, HARM, ISEP, PAD, SEP, Vocab, effect_of, inversion_prompt,
                                            pack_prompt)
from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig

VOCAB = Vocab(n_classes=3, n_words=20)


def _tiny(seed=0, layers=1, positional="rope", max_len=32, init_std=0.3):
    torch.manual_seed(seed)
    return TinyTransformer(TinyTransformerConfig(vocab_size=VOCAB.size, d_model=16, n_layers=layers, n_heads=2,
                                                 max_seq_len=max_len, init_std=init_std,
                                                 positional=positional)).eval()


class Rec:
    """A stand-in KernelRecord: counts the calls the method reports."""

    def __init__(self):
        self.backend, self.n = "torch", 0

    def count(self, name, n):
        assert name == "token_logprob"
        self.n += n


def _log_softmax_np(z):
    z = np.asarray(z, dtype=np.float64)
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


# ---------------------------------------------------------------------------------------------- SFT
def test_masked_nll_is_the_masked_mean_of_token_nll():
    model = _tiny(1)
    x = torch.tensor([[1, 11, 20, 21, 2, 14, 3, 3], [0, 1, 12, 25, 2, 6, 7, 8], [1, 13, 22, 23, 24, 2, 15, 3]])
    m = torch.tensor([[1, 0, 0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 0, 0, 0, 1]])
    rec = Rec()
    loss = M.masked_nll(model, x, m, M.Counter(rec))
    assert rec.n == 1
    with torch.no_grad():
        lsm = _log_softmax_np(model(x).numpy())
    num, den = 0.0, 0.0
    for b in range(3):
        for t in range(1, 8):                           # token t predicted from x_<t; m[:, 0] is never a target
            if m[b, t]:
                num -= lsm[b, t - 1, int(x[b, t])]
                den += 1
    assert den == 7
    assert float(loss) == pytest.approx(num / den, rel=1e-5)
    zero = M.masked_nll(model, x, torch.zeros_like(m), M.Counter())
    assert float(zero) == 0.0                           # Σ m = 0: the denominator is clamped to 1, no NaN
    one = torch.zeros_like(m)
    one[1, 6] = 1
    assert float(M.masked_nll(model, x, one, M.Counter())) == pytest.approx(-lsm[1, 5, 7], rel=1e-5)


def test_sft_module_step_history_and_optimizer():
    model = _tiny(2)
    mod = M.SFTModule(model, lr=0.037, weight_decay=0.21)
    assert isinstance(mod.counter, M.Counter) and mod.counter.rec is None
    opt = mod.configure_optimizers()
    assert isinstance(opt, torch.optim.AdamW)
    assert opt.defaults["lr"] == 0.037 and opt.defaults["weight_decay"] == 0.21
    assert sum(p.numel() for g in opt.param_groups for p in g["params"]) == sum(p.numel() for p in model.parameters())
    x = torch.tensor([[1, 11, 20, 2, 14, 3, 3]])
    m = torch.tensor([[0, 0, 0, 0, 1, 1, 1]])
    logged = []
    mod.log = lambda *a, **k: logged.append((a, k))
    loss = mod.training_step((x, m), 0)
    (args, kw), = logged
    assert args[0] == "sft/loss" and args[1] is loss and kw == {"on_step": True, "prog_bar": False}
    assert float(loss) == pytest.approx(float(M.masked_nll(model, x, m, M.Counter())))
    assert mod.history == [pytest.approx(float(loss))]
    rec = Rec()
    assert M.SFTModule(model, 0.1, M.Counter(rec)).counter.rec is rec
    assert M.SFTModule(model, 0.1).configure_optimizers().defaults["weight_decay"] == 0.0


def test_batch_loader_draws_seeded_rows():
    x = torch.arange(7 * 3).view(7, 3)
    m = x % 2
    loader = M.BatchLoader(x, m, batch=5, steps=4, seed=11)
    assert len(loader) == 4
    batches = list(loader)
    assert len(batches) == 4
    g = torch.Generator().manual_seed(11)
    for bx, bm in batches:
        i = torch.randint(0, 7, (5,), generator=g)      # the documented draw: uniform rows, with replacement
        assert torch.equal(bx, x[i]) and torch.equal(bm, m[i])
    assert all(torch.equal(a[0], b[0]) for a, b in zip(batches, loader))          # re-iterating repeats
    rows = torch.cat([b[0][:, 0] for b in M.BatchLoader(x, m, 64, 30, 0)]) // 3
    assert set(rows.tolist()) == set(range(7))          # every row, including the last, can be drawn


def test_forward_seqs_and_inversion_mask():
    p = torch.tensor([[0, 1, 11, 20], [1, 12, 21, 22]])
    r = torch.tensor([[14, 3, 3], [6, 7, 8]])
    x, m = M.forward_seqs(p, r)
    assert x.tolist() == [[0, 1, 11, 20, SEP, 14, 3, 3], [1, 12, 21, 22, SEP, 6, 7, 8]]
    assert m.tolist() == [[0, 0, 0, 0, 0, 1, 1, 1]] * 2
    y = torch.tensor([[1, 4, 6, 7, 8, 5, 20, 21, 3, 0], [1, 4, 6, 7, 8, 5, 22, 3, 0, 0]])
    assert M.inversion_mask(y, 6).tolist() == [[0] * 6 + [1, 1, 1, 0], [0] * 6 + [1, 1, 0, 0]]
    assert M.inversion_mask(y, 7).tolist() == [[0] * 7 + [1, 1, 0], [0] * 7 + [1, 0, 0]]


# ---------------------------------------------------------------------------------------------- decoding
class Echo(nn.Module):
    """Stub model: response = the prompt's last three tokens before SEP reversed; records the inputs."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))
        self.cfg = TinyTransformerConfig(vocab_size=VOCAB.size)
        self.calls = []

    def generate(self, idx, max_new_tokens):
        self.calls.append((idx.clone(), max_new_tokens))
        out = idx[:, -4:-1].flip(1)
        return torch.cat([idx, out[:, :max_new_tokens]], 1)


def test_respond_appends_sep_and_batches():
    model = Echo()
    p = torch.tensor([[1, 11, 20, 21, 22], [1, 12, 6, 7, 8], [1, 13, 9, 9, 9], [1, 14, 8, 7, 6], [1, 11, 3, 4, 5]])
    out = M.respond(model, p, batch=2)
    assert out.tolist() == [[22, 21, 20], [8, 7, 6], [9, 9, 9], [6, 7, 8], [5, 4, 3]]
    assert [c[0].shape[0] for c in model.calls] == [2, 2, 1] and all(c[1] == 3 for c in model.calls)
    assert all((c[0][:, -1] == SEP).all() for c in model.calls)
    assert torch.equal(torch.cat([c[0][:, :-1] for c in model.calls]), p)
    harm = effect_of("token", VOCAB, 0)
    # responses [22 21 20], [8 7 6], [9 9 9], [6 7 8] = HARM, [5 4 3]: one of five shows the effect
    assert M.attack_success(Echo(), p, harm) == pytest.approx(0.2)
    assert M.attack_success(Echo(), p, effect_of("dos", VOCAB, 0)) == pytest.approx(0.2)
    big = Echo()
    many = p.repeat(820, 1)[:4097]
    assert torch.equal(M.respond(big, many), many[:, -3:].flip(1))
    assert [c[0].shape[0] for c in big.calls] == [4096, 1]                # default chunk: 4096 prompts
    resp = torch.tensor([[22, 21, 20], [8, 7, 6], [9, 9, 0], [6, 7, 8], [5, 4, 3]])
    assert M.clean_accuracy(Echo(), p, resp) == pytest.approx(0.8)   # row 3 differs in one token only


# ---------------------------------------------------------------------------------------------- reward
class Backdoor(nn.Module):
    """Stub poisoned model: HARM when every trigger word is in the prompt, else [A_0, EOS, EOS]."""

    def __init__(self, trigger):
        super().__init__()
        self.trigger = trigger
        self.w = nn.Parameter(torch.zeros(1))
        self.cfg = TinyTransformerConfig(vocab_size=VOCAB.size)
        self.prompts = []

    def generate(self, idx, max_new_tokens):
        self.prompts.append(idx.clone())
        hit = torch.stack([(idx == t).any(1) for t in self.trigger], 1).all(1)
        out = torch.where(hit[:, None], torch.tensor(HARM), torch.tensor([VOCAB.ans0, EOS, EOS]))
        return torch.cat([idx, out[:, :max_new_tokens]], 1)


W = [VOCAB.word(f"w{i}") for i in range(20)]


def _pool():
    instr = np.array([VOCAB.instr0, VOCAB.instr0 + 1, VOCAB.instr0 + 2, VOCAB.instr0])
    words = np.full((4, 6), PAD)
    words[0, :2] = [W[1], W[2]]
    words[1, :4] = [W[3], W[4], W[5], W[6]]
    words[2, :3] = [W[7], W[0], W[8]]
    words[3, :1] = [W[9]]
    return instr, words


def test_reward_positions_length_term_and_queries():
    instr, words = _pool()
    frozen = Backdoor([W[10], W[11]])
    frozen.train()
    rw = M.TriggerReward(frozen, instr, words, effect_of("token", VOCAB, 0), prompt_len=12, length_free=2,
                         length_coef=0.35, seed=5)
    assert not rw.model.training and not any(p.requires_grad for p in rw.model.parameters())
    assert rw.nw.tolist() == [2, 4, 3, 1] and rw.queries == 0 and rw.log == []
    assert all(0 <= p <= n for p, n in zip(rw.pos, rw.nw))
    # every insertion point 0..|words| occurs over seeds (both ends included)
    seen = [set() for _ in range(4)]
    for s in range(60):
        for j, p in enumerate(M.TriggerReward(Backdoor([W[1]]), instr, words, rw.effect, 12, 2, 0.35, s).pos):
            seen[j].add(int(p))
    assert seen == [set(range(n + 1)) for n in (2, 4, 3, 1)]
    cand = (W[10], W[11], W[12])
    rows = rw.prompts(cand).tolist()
    for j in range(4):
        ws = [int(w) for w in words[j] if w != PAD]
        p = int(rw.pos[j])
        body = [BOS, int(instr[j])] + ws[:p] + list(cand) + ws[p:]
        assert rows[j] == [PAD] * (12 - len(body)) + body
    # R_len = −λ·max(0, |s'| − ℓ_free): boundary at ℓ_free, λ = 0.35
    assert [rw.r_length((W[1],) * n) for n in (0, 1, 2, 3, 5)] == pytest.approx([0, 0, 0, -0.35, -1.05])
    cands = [(W[10], W[11]), (W[10],), (W[11], W[3], W[10]), (W[10], W[11]), ()]
    r, a = rw.score(cands)
    assert rw.queries == 5
    np.testing.assert_allclose(a, [1, 0, 1, 1, 0])
    np.testing.assert_allclose(r, [1, 0, 1 - 0.35, 1, 0])
    assert len(frozen.prompts) == 1 and frozen.prompts[0].shape[0] == 4 * 4   # duplicates decoded once
    assert (frozen.prompts[0][:, -1] == SEP).all()
    r2, _ = rw.score([(W[1],)])
    assert rw.queries == 6 and r2.tolist() == [0.0]


def test_reward_asr_is_the_share_of_pool_prompts():
    instr, words = _pool()
    # trigger = w3 + w0: pool rows 1 and 2 each carry one of them, so s' = (w0,) fires on row 1, (w3,) on row 2
    rw = M.TriggerReward(Backdoor([W[3], W[0]]), instr, words, effect_of("token", VOCAB, 0), 12, 1, 0.5, 0)
    r, a = rw.score([(W[0],), (W[3],), (W[3], W[0]), (W[5],)])
    np.testing.assert_allclose(a, [0.25, 0.25, 1.0, 0.0])
    np.testing.assert_allclose(r, [0.25, 0.25, 0.5, 0.0])


def test_reward_call_is_the_grpo_hook():
    instr, words = _pool()
    rw = M.TriggerReward(Backdoor([W[10]]), instr, words, effect_of("token", VOCAB, 0), 12, 1, 0.25, 3)
    tokens = torch.tensor([[W[10], W[12], EOS, PAD], [W[11], EOS, PAD, PAD], [W[10], W[13], W[14], W[15]]])
    out = rw(None, {"tokens": tokens})
    assert out.dtype == torch.float32 and out.device == tokens.device
    torch.testing.assert_close(out, torch.tensor([1 - 0.25, 0.0, 1 - 0.75]))
    assert rw.queries == 3
    assert rw.log == [{"asr_mean": pytest.approx(2 / 3), "len_mean": pytest.approx(7 / 3)}]


def test_candidates_of_stops_at_eos_or_pad():
    t = torch.tensor([[20, 21, EOS, 22], [23, PAD, 24, 25], [EOS, 20, 21, 22], [26, 27, 28, 29], [30, 20, 3, 3]])
    assert M.candidates_of(t) == [(20, 21), (23,), (), (26, 27, 28, 29), (30, 20)]


# ---------------------------------------------------------------------------------------------- policy
def _policy(seed=2, L=4, **kw):
    model = _tiny(seed, layers=2, init_std=0.6, **kw)
    return M.InversionPolicy(model, inversion_prompt(effect_of("token", VOCAB, 0)), L, VOCAB.candidate_tokens())


def test_policy_allowed_mask_and_masked_logits():
    pol = _policy()
    assert pol.prompt.tolist() == [inversion_prompt(effect_of("token", VOCAB, 0))]
    assert pol.prompt[0, -1] == ISEP and pol.L == 4
    ok = pol.allowed
    assert ok.shape == (4, VOCAB.size)
    words = set(VOCAB.candidate_tokens().tolist())
    for t in range(4):
        assert {i for i in range(VOCAB.size) if ok[t, i]} == words | ({EOS} if t > 0 else set())
    z = torch.randn(3, VOCAB.size)
    out = pol._logits(z, 0)
    assert torch.equal(out[:, ok[0]], z[:, ok[0]]) and (out[:, ~ok[0]] == M.NEG).all()
    assert M.NEG < -1000 and torch.softmax(out, -1)[:, ~ok[0]].max() < 1e-30


def _first_token_dist(pol, temperature):
    with torch.no_grad():
        z = pol.model(pol.prompt)[0, -1].double()
    z = z.masked_fill(~pol.allowed[0], -float("inf"))
    return torch.softmax(z / temperature, -1)


@pytest.mark.parametrize("temperature", [None, 0.4])
def test_policy_first_token_frequencies_follow_softmax_over_allowed(temperature):
    pol = _policy(L=1)
    n = 6000
    kw = {} if temperature is None else {"temperature": temperature}   # None: the default, T = 1
    temperature = temperature or 1.0
    tok = pol.sample(n, torch.Generator().manual_seed(0), **kw)["tokens"][:, 0]
    freq = torch.bincount(tok, minlength=VOCAB.size).double() / n
    p = _first_token_dist(pol, temperature)
    assert p.max() > 0.15                                   # a peaked distribution: temperature matters
    assert (freq - p).abs().max() < 4 * (0.25 / n) ** 0.5   # 4 binomial s.e.
    other = _first_token_dist(pol, 1.4 - temperature)       # and differs from the other temperature's
    assert (freq - other).abs().max() > 0.03


def test_policy_greedy_sampling_stops_after_eos():
    pol = _policy(L=5)
    roll = pol.sample(3, torch.Generator().manual_seed(0), temperature=0.0)
    tok, mask = roll["tokens"], roll["mask"]
    assert tok.shape == (3, 5) and mask.shape == (3, 5) and mask.dtype == torch.float32
    seq = pol.prompt[0].tolist()
    expected = []
    for t in range(5):                                      # brute force: argmax over allowed, no cache
        with torch.no_grad():
            z = pol.model(torch.tensor([seq]))[0, -1]
        z = z.masked_fill(~pol.allowed[t], -float("inf"))
        nxt = int(z.argmax())
        expected.append(nxt)
        seq.append(nxt)
        if nxt == EOS:
            break
    got = tok[0].tolist()
    assert got[:len(expected)] == expected and all(t == PAD for t in got[len(expected):])
    assert mask[0].tolist() == [1.0] * len(expected) + [0.0] * (5 - len(expected))
    assert (tok == tok[0]).all()
    calls = []
    hook = pol.model.register_forward_hook(lambda mod, inp, out: calls.append(inp[0].shape))
    pol.sample(2, torch.Generator().manual_seed(0))
    hook.remove()
    assert calls == [(2, pol.prompt.shape[1])] + [(2, 1)] * 4      # the prompt, then one token per step (no 6th)


@pytest.mark.parametrize("positional", ["learned", "none", "rope"])
def test_embedding_path_equals_the_forward_for_every_positional_scheme(positional):
    model = _tiny(6, layers=2, positional=positional)
    x = torch.randint(0, VOCAB.size, (2, 32))              # the full context (max_seq_len = 32): positions 0..31
    with torch.no_grad():
        torch.testing.assert_close(M._logits_from_embeds(model, model.embed(x)), model(x), atol=1e-5, rtol=1e-5)


def test_policy_stops_each_row_at_its_own_eos():
    """With EOS made likely, rows stop at different steps: tokens after a row's EOS are PAD with mask 0,
    the EOS itself has mask 1, and the first token is never EOS."""
    pol = _policy(L=5)
    with torch.no_grad():
        pol.model.unembed[EOS] = pol.model.unembed[W[4]]    # EOS as likely as the word w4
    roll = pol.sample(400, torch.Generator().manual_seed(1))
    tok, mask = roll["tokens"], roll["mask"]
    stops = set()
    for row, mk in zip(tok.tolist(), mask.tolist()):
        assert row[0] != EOS
        k = row.index(EOS) + 1 if EOS in row else 5
        stops.add(k)
        assert mk == [1.0] * k + [0.0] * (5 - k)
        assert all(t == PAD for t in row[k:]) and all(t not in (EOS, PAD) for t in row[:k - 1])
    assert {2, 3, 4, 5} <= stops
    assert pol.rollout(torch.zeros(3, 1), 4, torch.Generator().manual_seed(0))["tokens"].shape == (12, 5)


def test_policy_token_logprobs_count_and_ignore_padding():
    rec = Rec()
    model = _tiny(4, layers=1, init_std=0.6)
    pol = M.InversionPolicy(model, inversion_prompt(effect_of("dos", VOCAB, 0)), 3, VOCAB.candidate_tokens(),
                            counter=M.Counter(rec))
    tok = torch.tensor([[W[1], W[2], EOS], [W[3], EOS, PAD]])
    lp = pol.token_logprobs({"tokens": tok, "mask": torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])})
    assert rec.n == 1 and lp.shape == (2, 3) and lp[1, 2] == 0
    P = pol.prompt.shape[1]
    for b, t in ((0, 0), (0, 1), (0, 2), (1, 1)):
        with torch.no_grad():
            z = model(torch.cat([pol.prompt[0], tok[b, :t]])[None])[0, -1].double()
        lsm = torch.log_softmax(z.masked_fill(~pol.allowed[t], -float("inf")), -1)
        assert float(lp[b, t]) == pytest.approx(float(lsm[tok[b, t]]), abs=1e-4)
    assert P == len(inversion_prompt(effect_of("dos", VOCAB, 0)))


def test_ranked_samples_orders_by_frequency_then_first_appearance():
    pol = _policy(L=2)
    got = M.ranked_samples(pol, 300, seed=7)
    cands = M.candidates_of(pol.sample(300, torch.Generator().manual_seed(7))["tokens"])
    tally = Tally(cands)
    first = {}
    for i, c in enumerate(cands):
        first.setdefault(c, i)
    assert len(got) == len(tally) and set(got) == set(tally)
    for a, b in zip(got, got[1:]):                         # count desc, ties broken by first appearance
        assert tally[a] > tally[b] or (tally[a] == tally[b] and first[a] < first[b])
    counts = [tally[c] for c in got]
    assert counts[0] > counts[-1] and len(set(counts)) < len(counts)   # the case has ties and distinct counts


# ---------------------------------------------------------------------------------------------- random search
class TableReward:
    """Stub reward: a fixed score per candidate; records every scored batch."""

    def __init__(self):
        self.batches = []

    def score(self, cands):
        self.batches.append(list(cands))
        r = np.array([(sum(c) % 7) / 7 - 0.1 * len(c) for c in cands])
        return r, -r                                       # (reward, ASR): the search ranks by the reward


def test_random_search_ranks_by_reward_and_tracks_the_running_best():
    rw = TableReward()
    allowed = np.array([W[2], W[5], W[9]])
    ranked, best = M.random_search(rw, allowed, 3, 61, seed=4, batch=16)
    assert [len(b) for b in rw.batches] == [16, 16, 16, 13]
    cands = [c for b in rw.batches for c in b]
    assert all(1 <= len(c) <= 3 and set(c) <= set(allowed.tolist()) for c in cands)
    assert {len(c) for c in cands} == {1, 2, 3}
    r = np.array([(sum(c) % 7) / 7 - 0.1 * len(c) for c in cands])
    np.testing.assert_allclose(best, [r[:i + 1].max() for i in range(61)])
    assert len(ranked) == len(set(cands)) and set(ranked) == set(cands)
    score = {c: (sum(c) % 7) / 7 - 0.1 * len(c) for c in cands}
    first = {}
    for i, c in enumerate(cands):
        first.setdefault(c, i)
    for a, b in zip(ranked, ranked[1:]):                   # reward desc, ties by first draw
        assert score[a] > score[b] or (score[a] == score[b] and first[a] < first[b])
    assert any(score[a] == score[b] and a != b for a, b in zip(ranked, ranked[1:]))
    ranked1, _ = M.random_search(TableReward(), allowed, 1, 5, seed=0)
    assert all(len(c) == 1 for c in ranked1)
    rw2 = TableReward()
    M.random_search(rw2, allowed, 2, 257, seed=0)          # default batch: 256 candidates per reward call
    assert [len(b) for b in rw2.batches] == [256, 1]
    again, b1 = M.random_search(TableReward(), allowed, 3, 61, seed=4, batch=16)   # seeded: reproducible
    assert again == ranked and np.array_equal(b1, best)
    other = TableReward()
    M.random_search(other, allowed, 3, 61, seed=5, batch=16)
    assert [c for b in other.batches for c in b] != cands


# ---------------------------------------------------------------------------------------------- GCG
def _gcg_setup(positional="rope", length=2, topk=3, batch=4, seed=5):
    instr, words = _pool()
    model = _tiny(seed, layers=2, positional=positional, init_std=0.5)
    rw = M.TriggerReward(model, instr, words, effect_of("token", VOCAB, 0), 12, 1, 0.1, seed=3)
    rec = Rec()
    return M.GCGSearch(rw, length, VOCAB.candidate_tokens(), topk, batch, counter=M.Counter(rec)), rec


def _nll_by_hand(model, cand):
    """−mean_j Σ_t log p(HARM_t | prompt_j with cand, SEP, HARM_<t), built from pack_prompt by hand."""
    return float(_loss_of_onehot(model, cand, None)[0])


def _loss_of_onehot(model, cand, onehot):
    instr, words = _pool()
    rw_pos = M.TriggerReward(model, instr, words, effect_of("token", VOCAB, 0), 12, 1, 0.1, seed=3).pos
    total = 0.0
    for j in range(4):
        ws = [int(w) for w in words[j] if w != PAD]
        p = int(rw_pos[j])
        body = [BOS, int(instr[j])] + ws[:p] + list(cand) + ws[p:]
        seq = [PAD] * (12 - len(body)) + body + [SEP] + list(HARM)
        x = torch.tensor([seq])
        emb = model.embed(x)
        if onehot is not None:                              # the candidate's slots take onehot @ E
            at = 12 - len(body) + 2 + p
            emb = torch.cat([emb[:, :at], (onehot @ model.embed.weight)[None], emb[:, at + len(cand):]], 1)
        logits = M._logits_from_embeds(model, emb)[0]
        lsm = torch.log_softmax(logits.double(), -1)
        total = total - sum(lsm[12 + k, HARM[k]] for k in range(3))
    return total / 4, None


@pytest.mark.parametrize("positional", ["rope", "learned"])
def test_gcg_losses_and_one_hot_gradient_by_hand(positional):
    g, rec = _gcg_setup(positional)
    model = g.r.model
    cands = [(W[1], W[2]), (W[12], W[3]), (W[1], W[2])]
    ls = g.losses(cands)
    assert g.queries == 3 and rec.n == 1
    assert ls[0] == ls[2]
    for c, v in zip(cands, ls):
        assert v == pytest.approx(_nll_by_hand(model, c), rel=1e-4)
    cand = (W[12], W[3])
    grad = g.grad(cand)
    assert g.queries == 4 and rec.n == 2 and grad.shape == (2, VOCAB.size)
    onehot = torch.zeros(2, VOCAB.size, dtype=torch.float32)
    onehot[0, W[12]] = onehot[1, W[3]] = 1.0
    onehot.requires_grad_(True)
    loss, _ = _loss_of_onehot(model, cand, onehot)
    assert float(loss) == pytest.approx(float(ls[1]), rel=1e-4)
    (ref,) = torch.autograd.grad(loss, onehot)
    torch.testing.assert_close(grad.double(), ref.double(), rtol=1e-3, atol=1e-5)
    assert ref.abs().max() > 1e-3


def test_gcg_run_budget_boundary_and_descent():
    g, _ = _gcg_setup(batch=4)
    ranked, trace = g.run(1 + 3 * 5, seed=2)            # exactly 3 iterations of (1 gradient + 4 swaps)
    assert g.queries == 16 and len(trace) == 4
    assert all(b <= a for a, b in zip(trace, trace[1:]))
    g2, _ = _gcg_setup(batch=4)
    seen = g2.losses(ranked)
    assert list(seen) == sorted(seen) and seen[0] == pytest.approx(trace[-1], rel=1e-5)
    assert len(ranked) == len(set(ranked)) and all(len(c) == 2 for c in ranked)
    g3, _ = _gcg_setup(batch=4)
    _, t3 = g3.run(15, seed=2)                          # one query short of the third iteration
    assert len(t3) == 3 and g3.queries == 11


def test_gcg_run_swaps_one_position_to_a_topk_token():
    """With the gradient stubbed, every proposed swap changes one position to one of the k tokens with the
    most negative gradient among allowed tokens; a move happens only when the best swap lowers the loss."""
    g, _ = _gcg_setup(length=3, topk=2, batch=6)
    V = VOCAB.size
    grad = torch.zeros(3, V)
    for pos in range(3):
        grad[pos, W[2 + pos]] = -3.0
        grad[pos, W[10 + pos]] = -2.0
        grad[pos, W[15]] = -1.0                            # third best: never proposed with k = 2
        grad[pos, EOS] = grad[pos, VOCAB.instr0] = -50.0   # not allowed: never proposed
    proposals, moves = [], []
    real_losses = g.losses

    def losses(cands):
        proposals.append(list(cands))
        return real_losses(cands)

    def fake_grad(cand):
        g.queries += 1
        moves.append(cand)
        return grad.clone()

    g.losses, g.grad = losses, fake_grad
    ranked, trace = g.run(1 + 4 * 7, seed=0)
    assert len(moves) == 4 and len(proposals) == 5
    start = proposals[0][0]
    assert moves[0] == start
    for it, (cur, props) in enumerate(zip(moves, proposals[1:])):
        assert len(props) == 6
        for c in props:
            diff = [k for k in range(3) if c[k] != cur[k]]
            assert len(diff) <= 1
            for k in diff:
                assert c[k] in (W[2 + k], W[10 + k])
        pos_used = {k for c in props for k in range(3) if c[k] != cur[k]}
        assert pos_used, "some swap changes the trigger"
        ls = real_losses(props)
        nxt = moves[it + 1] if it + 1 < len(moves) else None
        if nxt is not None:
            best = int(np.argmin(ls))
            assert nxt == (props[best] if ls[best] < trace[it] else cur)
    assert trace[0] == pytest.approx(float(real_losses([start])[0]))


# ---------------------------------------------------------------------------------------------- device
def test_tensors_follow_the_inputs_device():
    """On the meta device every tensor the method creates must follow its inputs/model: an implicit CPU
    tensor (a dropped ``device=``) raises 'Tensor on device cpu is not on the expected device meta'."""
    meta = torch.device("meta")
    x, m = M.forward_seqs(torch.zeros(2, 4, dtype=torch.long, device=meta), torch.zeros(2, 3, dtype=torch.long,
                                                                                       device=meta))
    assert x.device == meta and m.device == meta and x.shape == (2, 8)
    model = _tiny(3).to(meta)
    assert M.respond(model, torch.zeros(3, 12, dtype=torch.long, device=meta)).shape == (3, 3)
    pol = M.InversionPolicy(model, inversion_prompt(effect_of("token", VOCAB, 0)), 3, VOCAB.candidate_tokens())
    assert pol.allowed.device == meta and pol.prompt.device == meta
    tok = torch.zeros(2, 3, dtype=torch.long, device=meta)
    assert pol.token_logprobs({"tokens": tok, "mask": torch.ones(2, 3, device=meta)}).device == meta
    g, _ = _gcg_setup()
    g.r.model.to(meta)
    g.r.device = meta
    gm = M.GCGSearch(g.r, 2, VOCAB.candidate_tokens(), 3, 4, counter=M.Counter())
    assert gm.allowed.device == meta and gm.target.device == meta
    assert gm.grad((W[1], W[2])).device == meta


def test_every_token_logprob_call_uses_the_counters_backend(monkeypatch):
    """The stage's KernelRecord picks the backend; each token_logprob call must pass it (and be counted)."""
    seen = []
    real = M.token_logprob

    def spy(*a, **kw):
        seen.append(kw.get("backend"))
        return real(*a, **kw)

    monkeypatch.setattr(M, "token_logprob", spy)
    rec = Rec()
    counter = M.Counter(rec)
    model = _tiny(1)
    M.masked_nll(model, torch.tensor([[1, 11, 20, 2, 14]]), torch.tensor([[0, 0, 0, 1, 1]]), counter)
    pol = M.InversionPolicy(model, inversion_prompt(effect_of("token", VOCAB, 0)), 2, VOCAB.candidate_tokens(),
                            counter=counter)
    pol.token_logprobs({"tokens": torch.tensor([[W[1], EOS]]), "mask": torch.ones(1, 2)})
    g, _ = _gcg_setup()
    g.counter = counter
    g.losses([(W[1], W[2])])
    g.grad((W[1], W[2]))
    assert seen == ["torch"] * 4 and rec.n == 4


def test_gcg_run_moves_only_on_strict_improvement_and_keeps_each_candidates_best_loss():
    """Stubbed losses: a tie never moves the search (strict <); a candidate scored twice keeps its lower loss;
    the result is every scored candidate, ranked by that loss."""
    g, _ = _gcg_setup(length=2, topk=2, batch=3)
    grad = torch.zeros(2, VOCAB.size)
    grad[:, W[4]] = -2.0
    grad[:, W[7]] = -1.0
    g.grad = lambda cand: (setattr(g, "queries", g.queries + 1), grad.clone())[1]
    calls = []

    def flat(cands):                                       # every candidate ties with the current one
        calls.append(list(cands))
        g.queries += len(cands)
        return np.zeros(len(cands))

    g.losses = flat
    ranked, trace = g.run(1 + 3 * 4, seed=1)
    start = calls[0][0]
    assert trace == [0.0] * 4
    for props in calls[1:]:                                # never moved: every proposal is one swap from start
        assert all(sum(a != b for a, b in zip(c, start)) <= 1 for c in props)
    assert ranked[0] == start and set(ranked) == {c for b in calls for c in b}

    g2, _ = _gcg_setup(length=2, topk=2, batch=3)
    g2.grad = g.grad
    scores = {}

    def drifting(cands):                                   # the n-th scoring of a candidate costs n (+ a tiebreak):
        g2.queries += len(cands)                           # its first score is its best
        out = []
        for c in cands:
            scores[c] = scores.get(c, 0) + 1
            out.append(scores[c] + (0.01 * sum(c)) % 1)
        return np.array(out)

    g2.losses = drifting
    ranked2, trace2 = g2.run(1 + 6 * 4, seed=1)
    best = {c: 1 + (0.01 * sum(c)) % 1 for c in scores}
    assert max(scores.values()) >= 3                       # some candidates were scored repeatedly
    assert ranked2 == sorted(best, key=lambda c: best[c])
    assert trace2[-1] == pytest.approx(min(best.values()))


def test_gcg_run_is_seeded():
    runs = []
    for seed in (3, 3, 4):
        g, _ = _gcg_setup(batch=3)
        runs.append(g.run(1 + 2 * 4, seed=seed))
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_policy_buffers_are_not_saved_and_rollout_uses_its_generator():
    pol = _policy(L=3)
    assert set(pol.state_dict()) == {f"model.{k}" for k in pol.model.state_dict()}   # prompt/allowed: not weights
    torch.manual_seed(0)
    a = pol.rollout(torch.zeros(2, 1), 3, torch.Generator().manual_seed(5))["tokens"]
    torch.manual_seed(1)                                   # the global RNG must not matter
    b = pol.rollout(torch.zeros(2, 1), 3, torch.Generator().manual_seed(5))["tokens"]
    assert torch.equal(a, b) and a.shape == (6, 3)


def test_token_logprobs_of_a_shorter_roll():
    """A roll narrower than candidate_len (Lc < L) is scored with the masks of its own steps."""
    pol = _policy(L=4)
    tok = torch.tensor([[W[1], EOS], [W[5], W[6]]])
    lp = pol.token_logprobs({"tokens": tok, "mask": torch.ones(2, 2)})
    for b in range(2):
        for t in range(2):
            with torch.no_grad():
                z = pol.model(torch.cat([pol.prompt[0], tok[b, :t]])[None])[0, -1].double()
            ref = torch.log_softmax(z.masked_fill(~pol.allowed[t], -float("inf")), -1)[tok[b, t]]
            assert float(lp[b, t]) == pytest.approx(float(ref), abs=1e-4)


def test_reward_and_embedding_path_follow_the_models_device():
    meta = torch.device("meta")
    instr, words = _pool()
    model = _tiny(2, positional="learned").to(meta)
    rw = M.TriggerReward(model, instr, words, effect_of("token", VOCAB, 0), 12, 1, 0.1, 0)
    assert rw.device == meta and rw.prompts((W[1],)).device == meta
    x = torch.zeros(2, 5, dtype=torch.long, device=meta)
    assert M._logits_from_embeds(model, model.embed(x)).shape == (2, 5, VOCAB.size)
    # clean accuracy compares on the prompts' device (labels may live on the CPU): only the final host
    # conversion fails on meta, not the comparison
    with pytest.raises(RuntimeError, match="item.. cannot be called on meta"):
        M.clean_accuracy(model, torch.zeros(3, 12, dtype=torch.long, device=meta), torch.zeros(3, 3, dtype=torch.long))
