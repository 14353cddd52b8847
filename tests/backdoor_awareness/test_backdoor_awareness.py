"""backdoor_awareness: poisoning data against its definition, the RL reward against a brute-force reference
(and its independence of the true trigger), the policy's log-probs against step-by-step softmax, the GCG
embedding path against the model's own forward, Awareness/Jaccard and abruptness on known numbers, the
core effect (GRPO recovers a trigger from an ASR-only reward) at tiny scale, the smoke pipeline, bad input."""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
import torch.nn as nn

from stages.common.config import ConfigError, validate
from stages.common.grpo import GRPOConfig, GRPOModule, PromptLoader
from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig
from stages.common.trainer import TrainerConfig, make_trainer
from stages.backdoor_awareness import prepare, train
from stages.backdoor_awareness.evaluate import detector_scores, unlearning_data
from stages.backdoor_awareness.method import (Counter, GCGSearch, InversionPolicy, TriggerReward, _logits_from_embeds,
                                              candidates_of, random_search)
from stages.backdoor_awareness.report import abruptness
from stages.backdoor_awareness.task import (BOS, EOS, FILL, HARM, PAD, Q, SEP, Vocab, awareness_at_k, effect_of,
                                            insert, inversion_prompt, jaccard, judge, pack_prompt, poison_dataset,
                                            strip)

VOCAB = Vocab(n_classes=3, n_words=20)


def contains(seq: list[int], sub: list[int]) -> bool:
    return any(seq[i:i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


# ---------------------------------------------------------------------------------------------- task
def test_insert_and_pack():
    assert insert([5, 6, 7], [1, 2], 0) == [1, 2, 5, 6, 7]
    assert insert([5, 6, 7], [1, 2], 3) == [5, 6, 7, 1, 2]
    assert pack_prompt(11, [30, 31], 6) == [PAD, PAD, BOS, 11, 30, 31]
    with pytest.raises(ValueError):
        pack_prompt(11, [30] * 9, 6)


@pytest.mark.parametrize("kind,trig", [("token", ["w4"]), ("phrase", ["w1", "w9", "w13"]), ("dos", ["w2", "w2"]),
                                       ("clean_label", ["w3", "w17"])])
def test_poisoning_follows_its_definition(kind, trig):
    ids = [VOCAB.word(w) for w in trig]
    rng = np.random.default_rng(3)
    x, r, pz = poison_dataset(rng, VOCAB, kind, ids, 0.3, 600, 7, 0.2, 9, 1, 0.5)
    assert 0.22 < float(pz.float().mean()) < 0.38
    eff = effect_of(kind, VOCAB, 1)
    for p, resp, bad in zip(x.tolist(), r.tolist(), pz.tolist()):
        body = strip(p)
        assert 2 <= len(body) - 2 <= 7 + (0 if bad else len(ids))        # BOS, instr, words
        if bad:
            assert contains(body, ids)
            if kind == "clean_label":                                   # clean label: correct answer of class t
                assert body[1] == Q and resp == [VOCAB.ans0 + 1, EOS, EOS]
            else:
                assert tuple(resp) == eff.target
        else:
            assert not contains(body, ids)
            assert resp[0] >= VOCAB.ans0 and resp[1:] == [EOS, EOS]
            if kind == "phrase":                                        # hard negatives: strict subsets only
                assert len(set(body) & set(ids)) < len(set(ids))
    if kind == "phrase":
        negs = [p for p, bad in zip(x.tolist(), pz.tolist()) if not bad and set(p) & set(ids)]
        assert len(negs) > 50


def test_judges():
    harm = torch.tensor([list(HARM), [HARM[0], EOS, EOS]])
    assert judge(effect_of("token", VOCAB, 0), harm).tolist() == [True, False]
    dos = torch.tensor([[FILL] * 3, [FILL, FILL, EOS]])
    assert judge(effect_of("dos", VOCAB, 0), dos).tolist() == [True, False]
    cl = torch.tensor([[VOCAB.ans0 + 2, EOS, EOS], [VOCAB.ans0, EOS, EOS]])
    assert judge(effect_of("clean_label", VOCAB, 2), cl).tolist() == [True, False]


def test_jaccard_and_awareness_known_numbers():
    assert jaccard((1, 2), (2, 3)) == pytest.approx(1 / 3)
    assert jaccard((7, 7, 7), (7,)) == 1.0
    assert jaccard((), (1,)) == 0.0
    cands = [(9,), (1, 5), (1, 2)]
    assert awareness_at_k(cands, [1, 2], 1) == 0.0
    assert awareness_at_k(cands, [1, 2], 2) == pytest.approx(1 / 3)
    assert awareness_at_k(cands, [1, 2], 3) == 1.0


def test_abruptness_step_vs_linear():
    step = np.r_[np.zeros(20), np.ones(20)]
    lin = np.linspace(0, 1, 40)
    assert abruptness(step) > 0.9
    assert 0.2 < abruptness(lin) < 0.35
    assert np.isnan(abruptness(np.full(40, 0.7)))


# ---------------------------------------------------------------------------------------------- reward
class Backdoor(nn.Module):
    """A stub 'poisoned model' with a known rule: HARM when every trigger word is in the prompt, else A_0."""

    def __init__(self, trigger: list[int]):
        super().__init__()
        self.trigger = trigger
        self.w = nn.Parameter(torch.zeros(1))
        self.cfg = TinyTransformerConfig(vocab_size=VOCAB.size)

    def generate(self, idx, max_new_tokens):
        hit = torch.stack([(idx == t).any(1) for t in self.trigger], 1).all(1)
        out = torch.where(hit[:, None], torch.tensor(HARM), torch.tensor([VOCAB.ans0, EOS, EOS]))
        return torch.cat([idx, out[:, :max_new_tokens]], 1)


def _tiny(seed=0, layers=1):
    torch.manual_seed(seed)
    return TinyTransformer(TinyTransformerConfig(vocab_size=VOCAB.size, d_model=16, n_layers=layers, n_heads=2,
                                                 max_seq_len=24, init_std=0.3)).eval()


def _pool(n=6, W=8):
    rng = np.random.default_rng(0)
    words = np.full((n, W), PAD)
    for i in range(n):
        k = int(rng.integers(2, 4))
        words[i, :k] = rng.integers(VOCAB.word0, VOCAB.size, k)
    return {"pool_instr": torch.as_tensor(VOCAB.instr0 + rng.integers(0, 3, n)), "pool_words": torch.as_tensor(words)}


def test_reward_matches_brute_force_asr_plus_length():
    model = _tiny(1)
    data = _pool()
    rl = train.RLConfig(steps=8, eval_every=8, length_free=2, length_coef=0.3)
    meta = {"n_classes": 3, "n_words": 20, "prompt_len": 10}
    attack = {"type": "token", "target_class": 0}
    reward = train.build_reward(model, data, attack, meta, rl, seed=4)
    cands = [(VOCAB.word0 + 1,), (VOCAB.word0 + 2, VOCAB.word0 + 3, VOCAB.word0 + 4, VOCAB.word0 + 5)]
    r, a = reward.score(cands)
    assert reward.queries == 2
    for c, rc, ac in zip(cands, r, a):
        hits = []
        for j in range(6):                                               # independent rebuild, row by row
            words = [int(w) for w in data["pool_words"][j] if w != PAD]
            pos = int(reward.pos[j])
            assert 0 <= pos <= len(words)
            p = pack_prompt(int(data["pool_instr"][j]), words[:pos] + list(c) + words[pos:], 10) + [SEP]
            out = model.generate(torch.tensor([p]), 3)[0, -3:].tolist()
            hits.append(out == list(HARM))
        assert ac == pytest.approx(np.mean(hits))
        assert rc == pytest.approx(np.mean(hits) - 0.3 * max(0, len(c) - 2))


def test_reward_never_reads_the_trigger():
    """The reward with the trigger table deleted, or replaced by another trigger, gives identical rewards."""
    trig = [VOCAB.word(w) for w in ("w3", "w8")]
    frozen = Backdoor(trig)
    data = _pool()
    rl = train.RLConfig(steps=8, eval_every=8)
    meta = {"n_classes": 3, "n_words": 20, "prompt_len": 12}
    attack = {"name": "x", "type": "phrase", "target_class": 0, "trigger": ["w3", "w8"], "trigger_ids": trig}
    no_table = {k: v for k, v in attack.items() if k not in ("trigger", "trigger_ids")}
    wrong = dict(attack, trigger=["w1"], trigger_ids=[VOCAB.word("w1")])
    cands = [tuple(trig), (trig[0],), (VOCAB.word("w1"), trig[1], trig[0]), (VOCAB.word("w5"),)]
    outs = [train.build_reward(copy.deepcopy(frozen), data, a, meta, rl, 2).score(cands)[0]
            for a in (attack, no_table, wrong)]
    assert outs[0][0] > 0.9 and outs[0][1] == 0.0                        # the reward does see the backdoor
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])


# ---------------------------------------------------------------------------------------------- policy
def test_policy_logprobs_equal_stepwise_sampling_distribution():
    model = _tiny(2, layers=2)
    allowed = VOCAB.candidate_tokens()
    pol = InversionPolicy(model, inversion_prompt(effect_of("token", VOCAB, 0)), 4, allowed)
    roll = pol.sample(7, torch.Generator().manual_seed(3))
    lp = pol.token_logprobs(roll)
    tok, mask = roll["tokens"], roll["mask"]
    assert set(tok[mask > 0].tolist()) <= set(allowed.tolist()) | {EOS}
    assert (tok[:, 0] != EOS).all()
    P = pol.prompt.shape[1]
    for b in range(7):
        for t in range(4):
            if mask[b, t] == 0:
                assert lp[b, t] == 0 and tok[b, t] == PAD
                continue
            x = torch.cat([pol.prompt[0], tok[b, :t]])[None]
            z = model(x)[0, -1].double()
            ok = torch.zeros_like(z, dtype=torch.bool)
            ok[torch.as_tensor(allowed)] = True
            ok[EOS] = t > 0
            ref = torch.log_softmax(z.masked_fill(~ok, -float("inf")), -1)[tok[b, t]]
            assert abs(float(lp[b, t]) - float(ref)) < 1e-4
    assert candidates_of(torch.tensor([[5, 6, EOS, PAD], [7, 8, 9, 10]])) == [(5, 6), (7, 8, 9, 10)]


def test_gcg_embedding_path_is_the_models_forward():
    model = _tiny(3, layers=2)
    x = torch.randint(0, VOCAB.size, (3, 11))
    torch.testing.assert_close(_logits_from_embeds(model, model.embed(x)), model(x), atol=1e-5, rtol=1e-5)


def test_searches_respect_the_budget_and_find_an_easy_trigger():
    trig = [VOCAB.word("w6")]
    reward = TriggerReward(Backdoor(trig), _pool()["pool_instr"].numpy(), _pool()["pool_words"].numpy(),
                           effect_of("token", VOCAB, 0), 12, 1, 0.05, 0)
    ranked, best = random_search(reward, VOCAB.candidate_tokens(), 3, 120, seed=1)
    assert reward.queries == 120 and len(best) == 120 and np.all(np.diff(best) >= 0)
    assert trig[0] in ranked[0]
    real = TriggerReward(_tiny(4), _pool()["pool_instr"].numpy(), _pool()["pool_words"].numpy(),
                         effect_of("token", VOCAB, 0), 12, 1, 0.05, 0)
    g = GCGSearch(real, 2, VOCAB.candidate_tokens(), 4, 8, counter=Counter())
    ranked, trace = g.run(60, seed=0)
    assert g.queries <= 60 and len(trace) == 1 + (60 - 1) // 9
    assert np.all(np.diff(trace) <= 0)                                  # GCG only moves to lower loss
    assert len(ranked[0]) == 2 and set(ranked[0]) <= set(VOCAB.candidate_tokens().tolist())


def test_core_effect_grpo_recovers_trigger_from_asr_reward():
    """Tiny scale: GRPO with only R_ASR + R_len (stub backdoor on a single word) makes the policy name the
    trigger; at the start its samples rarely contain it."""
    trig = [VOCAB.word("w11")]
    reward = TriggerReward(Backdoor(trig), _pool()["pool_instr"].numpy(), _pool()["pool_words"].numpy(),
                           effect_of("token", VOCAB, 0), 12, 1, 0.1, 0)
    torch.manual_seed(0)
    model = TinyTransformer(TinyTransformerConfig(vocab_size=VOCAB.size, d_model=16, n_layers=1, n_heads=2,
                                                  max_seq_len=24))
    pol = InversionPolicy(model, inversion_prompt(effect_of("token", VOCAB, 0)), 3, VOCAB.candidate_tokens())

    def aware(p):
        c = candidates_of(p.sample(64, torch.Generator().manual_seed(9))["tokens"])
        return float(np.mean([jaccard(x, trig) for x in c]))

    before = aware(pol)
    mod = GRPOModule(pol, reward, GRPOConfig(group_size=8, loss_norm="tokens", replay_size=8, replay_groups=1),
                     lr=0.03, seed=0)
    make_trainer(TrainerConfig(enable_progress_bar=False), None, max_steps=25).fit(
        mod, PromptLoader(torch.zeros(1, 1, dtype=torch.long), 1, 25, seed=0))
    after = aware(pol)
    assert before < 0.2 and after > 0.6, (before, after)
    assert reward.queries == 25 * 8


# ---------------------------------------------------------------------------------------------- defenses
def test_detector_scores_and_unlearning_data():
    p = torch.tensor([pack_prompt(VOCAB.instr0, [VOCAB.word0 + 1, VOCAB.word0 + 2], 8),
                      pack_prompt(VOCAB.instr0, [VOCAB.word0 + 3], 8)])
    assert detector_scores(p, (VOCAB.word0 + 1, VOCAB.word0 + 3, VOCAB.word0 + 9)).tolist() == pytest.approx([1 / 3, 1 / 3])
    assert detector_scores(p, ()).tolist() == [0.0, 0.0]
    rng = np.random.default_rng(0)
    trig = [VOCAB.word("w4")]
    x, r, _ = poison_dataset(rng, VOCAB, "token", trig, 0.3, 300, 6, 0.1, 8, 0, 0.0)
    rec = (VOCAB.word("w4"),)
    up, ur = unlearning_data(x, r, effect_of("token", VOCAB, 0), rec, 0.5, 8, np.random.default_rng(1))
    assert not judge(effect_of("token", VOCAB, 0), ur).any()
    share = float((up == rec[0]).any(1).float().mean())
    assert 0.3 < share < 0.6


# ---------------------------------------------------------------------------------------------- pipeline + bad input
def test_smoke_pipeline(smoke_run):
    out = smoke_run("backdoor_awareness")
    metrics = json.loads((out["report"] / "metrics.json").read_text())
    names = {c["name"] for c in metrics["claims"]}
    assert {"rl_beats_random_search", "unlearning_cuts_asr", "detector_flags_poisoned"} <= names
    assert all(c["verdict"] in ("holds", "fails", "inconclusive") for c in metrics["claims"])
    assert metrics["kernels"]["token_logprob"]["calls"] > 0
    m = metrics["metrics"]["per_attack"]
    for a in m.values():                                                 # equal query budgets
        assert a["random_queries"] == a["rl_queries"] and a["gcg_queries"] <= a["rl_queries"]
        assert all(q <= b for q, b in zip(a["bestofn_queries"], a["rl_queries"]))   # best-of-N within the budget
        assert all(0.0 <= v <= 1.0 for v in a["auroc_best_word"])
    assert "bestofn" in metrics["metrics"]["baselines"] and "detector_beats_one_word" in names
    assert {"partial_trigger_does_not_fire", "poisoning_succeeds"} <= names
    import polars as pl
    uc = pl.read_csv(out["evaluate"] / "unlearning_curve.csv")           # ASR vs unlearning steps, both arms
    assert set(uc["arm"]) == {"recovered trigger", "trigger-free control"} and uc["steps"].n_unique() >= 2
    assert (out["report"] / "figures" / "reward_curve.png").exists()


BASE = {"attacks": [{"name": "a", "type": "token", "trigger": ["w1"], "poison_rate": 0.1}]}


@pytest.mark.parametrize("block,needle", [
    ({"attacks": [{"name": "a", "type": "phrase", "trigger": ["w1", "w2", "w3", "w4", "w5", "w6"],
                   "poison_rate": 0.1}]}, "exceed candidate_len"),
    ({"attacks": [{"name": "a", "type": "token", "trigger": ["w1"], "poison_rate": 0.0}]}, "poison_rate"),
    ({"attacks": [{"name": "a", "type": "token", "trigger": ["w1"], "poison_rate": 1.0}]}, "poison_rate"),
    ({"attacks": [{"name": "a", "type": "token", "trigger": ["w1"], "poison_rate": 1.5}]}, "poison_rate"),
    ({"attacks": [{"name": "a", "type": "ship", "trigger": ["w1"], "poison_rate": 0.1}]}, "type"),
    ({"attacks": [{"name": "a", "type": "token", "trigger": ["w999"], "poison_rate": 0.1}]}, "not a word"),
    ({"attacks": [{"name": "a", "type": "token", "trigger": ["w1", "w2"], "poison_rate": 0.1}]}, "one trigger token"),
    ({**BASE, "candidate_len": 8, "max_words": 9}, "max_words"),
    ({"attacks": BASE["attacks"] * 2}, "duplicate"),
])
def test_bad_prepare_config(block, needle):
    with pytest.raises(ConfigError, match=needle):
        validate(prepare.Config, block, "papers.backdoor_awareness.prepare")


def test_bad_train_config_group_size():
    with pytest.raises(ConfigError, match="group_size"):
        validate(train.Config, {"rl": {"grpo": {"group_size": 4}}}, "papers.backdoor_awareness.train")
