"""backdoor_awareness, issue 48: natural-rate trigger words in clean prompts, the full-strength baselines (token vote,
greedy pruning, refined random search, reward-pruned GCG) against hand-worked cases and their budgets, and the
emergence test against a smooth-learning null (sigmoid vs exponential/linear by AIC) on known curves. Fast: stubs
and tiny models only."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

from stages.backdoor_awareness import method as M
from stages.backdoor_awareness.report import EmergenceRule, fit_emergence, is_abrupt
from stages.backdoor_awareness.task import (EOS, HARM, PAD, Vocab, effect_of, poison_dataset, sample_base, strip,
                                            word_probs)
from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig

VOCAB = Vocab(n_classes=3, n_words=20)
W = [VOCAB.word0 + i for i in range(VOCAB.n_words)]


# ---------------------------------------------------------------------------------------------- natural rates
def test_word_probs_is_a_zipf_law():
    p = word_probs(20, 1.3)
    assert p.sum() == pytest.approx(1.0) and np.all(np.diff(p) < 0)
    assert p[0] / p[3] == pytest.approx(4 ** 1.3)
    np.testing.assert_allclose(word_probs(7, 0.0), np.full(7, 1 / 7))


def test_clean_prompts_carry_trigger_words_at_their_natural_rate():
    """natural=True: clean (unpoisoned) prompts contain each trigger word at the rate the Zipf law predicts,
    1 − E_n[(1 − p)^n] over the U{2..W} word counts; natural=False (the old design) never."""
    probs = word_probs(VOCAB.n_words, 1.0)
    trig = [W[1], W[6]]                                                  # a common and a rarer word
    rng = np.random.default_rng(5)
    x, r, pz = poison_dataset(rng, VOCAB, "phrase", trig, 0.1, 6000, 7, 0.0, 9, 0, 0.0, probs=probs, natural=True)
    clean = x[~pz]
    for t in trig:
        p = probs[t - VOCAB.word0]
        expect = 1 - np.mean([(1 - p) ** n for n in range(2, 8)])
        got = float((clean == t).any(1).float().mean())
        assert got == pytest.approx(expect, abs=0.02), (t, got, expect)
    both = [set(strip(row)) >= set(trig) for row in clean.tolist()]
    assert sum(both) > 0                                                 # the whole trigger set occurs scattered in clean text
    assert all(tuple(resp) != HARM for resp, b in zip(r[~pz].tolist(), both) if b)
    x0, _, pz0 = poison_dataset(np.random.default_rng(5), VOCAB, "phrase", trig, 0.1, 2000, 7, 0.0, 9, 0, 0.0,
                                probs=probs, natural=False)
    assert not any(set(strip(row)) & set(trig) for row in x0[~pz0].tolist())
    b = sample_base(np.random.default_rng(1), VOCAB, 4000, 4, 4, 0.0, probs=probs)
    freq = np.bincount((b["words"][b["words"] != PAD] - VOCAB.word0).ravel(), minlength=VOCAB.n_words)
    assert freq[0] / freq.sum() == pytest.approx(probs[0], abs=0.02) and freq[0] > 3 * freq[5]


# ---------------------------------------------------------------------------------------------- baselines
def test_token_vote_by_hand():
    samples = [(5, 7), (7, 7, 9), (9, 7), (3,), (5, 9)]
    # per-sample distinct counts: 7 → 3, 9 → 3, 5 → 2, 3 → 1; ties by first appearance (5, 7, 9, 3 order seen)
    assert M.token_vote(samples, 5, 3) == [(7,), (7, 9), (7, 9, 5)]
    assert M.token_vote(samples, 2, 5) == [(7,), (7, 9)]
    assert M.token_vote([], 3, 3) == []


class SetReward:
    """Stub reward with a known rule: ASR = 1 iff every trigger token is in the candidate, else 0.5·share;
    R = ASR − λ·max(0, |s| − 1). Counts queries like TriggerReward."""

    def __init__(self, trigger, lam=0.05):
        self.trig, self.lam, self.queries, self.batches = set(trigger), lam, 0, []

    def score(self, cands):
        self.queries += len(cands)
        self.batches.append(list(cands))
        a = np.array([1.0 if self.trig <= set(c) else 0.5 * len(self.trig & set(c)) / len(self.trig) for c in cands])
        return a - self.lam * np.array([max(0, len(c) - 1) for c in cands]), a


def test_greedy_prune_by_hand():
    rw = SetReward([W[2], W[4]])
    cand = (W[9], W[2], W[7], W[4])
    s0 = float(rw.score([cand])[0][0])                                   # 1 − 0.15
    seen = {}
    got, r, spent = M.greedy_prune(rw, cand, s0, 100, seen)
    # round 1: drop W9 or W7 (0.90 each; the first, W9, wins the tie), round 2: drop W7 (0.95), round 3: both
    # deletions lose the trigger (0.25) → stop
    assert got == (W[2], W[4]) and r == pytest.approx(0.95) and spent == 4 + 3 + 2
    assert seen[(W[2], W[7], W[4])] == pytest.approx(0.90) and seen[(W[2],)] == pytest.approx(0.25)
    rw2 = SetReward([W[2], W[4]])
    got2, _, spent2 = M.greedy_prune(rw2, cand, s0, 6)                   # budget for one round only
    assert spent2 == 4 and len(got2) == 3 and rw2.queries == 4


def test_refined_search_spends_the_budget_and_reaches_the_exact_trigger():
    allowed = np.array(W)
    trig = [W[3], W[11]]
    rw = SetReward(trig)
    ranked, best = M.refined_search(rw, allowed, 4, 300, seed=2, explore_frac=0.5, edit_batch=8)
    assert rw.queries == 300 and len(best) == 300 and np.all(np.diff(best) >= 0)
    assert len(rw.batches[0]) == 150                                     # the exploration share, then refinement
    assert set(ranked[0]) == set(trig) and len(ranked[0]) == 2           # pruned to the exact trigger
    assert best[-1] == pytest.approx(0.95)
    plain = SetReward(trig)                                              # same budget, no refinement: a superset at best
    ranked_p, _ = M.random_search(plain, allowed, 4, 300, seed=2)
    assert len(ranked_p[0]) >= len(ranked[0])
    again, b2 = M.refined_search(SetReward(trig), allowed, 4, 300, seed=2, explore_frac=0.5, edit_batch=8)
    assert again == ranked and np.array_equal(b2, best)


def _tiny(seed=0):
    torch.manual_seed(seed)
    return TinyTransformer(TinyTransformerConfig(vocab_size=VOCAB.size, d_model=16, n_layers=1, n_heads=2,
                                                 max_seq_len=32, init_std=0.5)).eval()


def test_gcg_pruned_stays_in_budget_and_prunes_by_the_reward():
    rng = np.random.default_rng(0)
    words = np.full((4, 8), PAD)
    for i in range(4):
        words[i, :2] = rng.integers(VOCAB.word0, VOCAB.size, 2)
    rw = M.TriggerReward(_tiny(3), VOCAB.instr0 + np.zeros(4, int), words, effect_of("token", VOCAB, 0), 14, 1, 0.1, 0)
    ranked, trace, q = M.gcg_pruned(rw, VOCAB.candidate_tokens(), 4, 3, 5, 60, seed=1, counter=M.Counter())
    assert q <= 60 and 1 <= len(ranked[0]) <= 4 and len(trace) >= 2
    assert all(len(c) == 4 for c in ranked[1:])                          # GCG's own candidates keep its length
    assert rw.queries >= 1                                               # the pruning is scored by the reward
    r0 = rw.score([ranked[0]])[0][0]
    gcg_best = next(c for c in ranked[1:])
    assert r0 >= rw.score([gcg_best])[0][0] - 1e-9                       # pruning never lowers the reward


# ---------------------------------------------------------------------------------------------- emergence
RULE = EmergenceRule(aic_margin=2.0, noise_floor=0.02, min_rise=0.1)


def test_emergence_rule_on_known_curves():
    t = np.arange(31.0)
    noise = np.random.default_rng(0).normal(0, 0.03, 31)
    late_step = 0.1 + 0.8 / (1 + np.exp(-(t - 18) / 0.7)) + noise       # plateau, then a sharp late rise
    fast_exp = 0.1 + 0.8 * (1 - np.exp(-t / 3.0)) + noise                # smooth saturating learning
    slow_exp = 0.1 + 0.8 * (1 - np.exp(-t / 12.0)) + noise
    line = 0.1 + 0.02 * t + noise
    flat = 0.5 + noise
    f = fit_emergence(t, late_step, 0.02)
    assert is_abrupt(f, RULE) and abs(f["t0"] - 18) < 1.5 and f["rise"] > 0.6
    for y in (fast_exp, slow_exp, line, flat):
        assert not is_abrupt(fit_emergence(t, y, 0.02), RULE)
    f = fit_emergence(t, np.full(31, 0.5), 0.02)                         # exactly flat: all at the floor, penalty decides
    assert f["aic_linear"] + 2 == pytest.approx(f["aic_exponential"]) and f["aic_exponential"] + 2 == pytest.approx(f["aic_sigmoid"])


def test_fit_emergence_aic_by_hand_for_the_line():
    t = np.arange(10.0)
    y = 0.3 + 0.05 * t + np.r_[0.1, -0.1] .repeat(5)
    X = np.c_[np.ones(10), t]
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    rss = float(((X @ coef - y) ** 2).sum())
    f = fit_emergence(t, y, 0.001)
    assert f["aic_linear"] == pytest.approx(10 * np.log(rss / 10) + 4)
    assert fit_emergence(t, 0.3 + 0.05 * t, 0.01)["aic_linear"] == pytest.approx(10 * np.log(1e-4) + 4)
