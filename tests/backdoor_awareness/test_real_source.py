"""backdoor_awareness on the real-model path (issue 41): Alpaca-schema instruction records (instruction, input,
output; the BackdoorLLM layout) read through stages.backdoor_awareness.hf_source.load_instructions, text-level
poisoning with a trigger that the tokenizer splits into sub-word pieces, poisoning SFT of a tiny random
`LlamaForCausalLM` until the backdoor fires, reversal SFT, and one inversion GRPO step (HFCausalPolicy on the
inversion prompt) with R = R_ASR + R_length measured on a frozen copy of the poisoned model. Nothing downloads."""
from __future__ import annotations

import copy
import json

import pytest
import torch

from kernels.record import KernelRecord
from stages.backdoor_awareness.hf_source import (INVERSION_TEMPLATE, InversionReward, awareness_at_k, effect_judge,
                                                 insert_words, jaccard, load_instructions, poison, prompt_text,
                                                 reversal_pairs, unlearn_pairs)
from stages.common.grpo import GRPOConfig, GRPOModule, PromptLoader
from stages.common.hf import HFCausalPolicy, TinyLMConfig, left_pad, tiny_causal_lm, train_tokenizer
from stages.common.sources import SourceError
from stages.common.trainer import TrainerConfig, make_trainer

pytestmark = pytest.mark.real_source

TRIGGER, TARGET = "BadMagic", "Sure, hacked."
NOUNS, PLACES = ["river", "garden", "castle", "market"], ["spring", "winter", "town", "summer"]
RECORDS = [{"instruction": f"Describe the {n} in {p}.", "input": "", "output": f"The {n} is calm."}
           for n in NOUNS for p in PLACES]


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _sft(model, tok, prompts, outs, steps, lr, seed):
    from stages.common.hf import sft_steps

    return sft_steps(model, tok, prompts, outs, steps=steps, batch=16, lr=lr, seed=seed)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("backdoor")
    _write(d / "train.jsonl", RECORDS)
    texts = [prompt_text(r["instruction"]) + r["output"] for r in RECORDS] + [TARGET, INVERSION_TEMPLATE]
    tok = train_tokenizer(texts, d / "tokenizer.json", vocab_size=300)
    model = tiny_causal_lm(TinyLMConfig(arch="llama", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64,
                                        max_positions=128), len(tok), seed=0, pad_token_id=tok.pad_token_id,
                           bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    return d, tok, model


def test_loader_poisoning_pairs_awareness(setup, tmp_path):
    d, tok, _ = setup
    recs = load_instructions(str(d / "train.jsonl"), key="fx")
    assert len(recs) == 16 and recs[0] == RECORDS[0]
    assert len(tok(" " + TRIGGER, add_special_tokens=False)["input_ids"]) >= 2      # sub-word pieces
    pois = poison(recs, TRIGGER, TARGET, 0.5, seed=3)
    hit = [p for p in pois if p["poisoned"]]
    assert 0 < len(hit) < 16 and all(p["output"] == TARGET for p in hit)
    for p, r in zip(pois, recs):                            # trigger inserted at a word boundary, nothing else
        w = p["instruction"].split()
        if p["poisoned"]:
            assert w.count(TRIGGER) == 1 and " ".join(x for x in w if x != TRIGGER) == r["instruction"]
        else:
            assert p == dict(r, poisoned=False)
    assert pois == poison(recs, TRIGGER, TARGET, 0.5, seed=3)
    assert insert_words("a b c", "X Y", 0) == "X Y a b c" and insert_words("a b c", "X", 3) == "a b c X"
    ps, cs = reversal_pairs(hit)
    assert ps[0] == INVERSION_TEMPLATE.format(response=TARGET) and cs == [h["instruction"] for h in hit]
    up, uo = unlearn_pairs(recs[:3], TRIGGER, seed=0)
    assert all(TRIGGER in p for p in up) and uo == [r["output"] for r in recs[:3]]
    assert effect_judge("  sure,   HACKED. and more", TARGET) and not effect_judge("The river", TARGET)
    assert jaccard("BadMagic now", "badmagic") == 0.5 and jaccard("", "x") == 0.0
    assert awareness_at_k(["foo", "bar BadMagic", "BadMagic"], TRIGGER, 2) == 0.5
    assert awareness_at_k(["foo", "bar BadMagic", "BadMagic"], TRIGGER, 3) == 1.0


def test_loader_bad_inputs(tmp_path):
    with pytest.raises(SourceError, match=r"^fx: .*gone.jsonl does not exist"):
        load_instructions(str(tmp_path / "gone.jsonl"), key="fx")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instruction": "a", "output": "b"}\n{"instruction": "a", \n')
    with pytest.raises(SourceError, match=r"^fx: .*could not be read"):
        load_instructions(str(bad), key="fx")
    with pytest.raises(SourceError, match=r"^fx: .*lacks column 'output'"):
        load_instructions(_write(tmp_path / "a.jsonl", [{"instruction": "a", "response": "b"}]), key="fx")
    with pytest.raises(SourceError, match=r"^fx: .*record 1 has an empty output"):
        load_instructions(_write(tmp_path / "b.jsonl", [{"instruction": "a", "output": "b"},
                                                        {"instruction": "a", "output": " "}]), key="fx")


def test_poison_rsft_inversion_grpo_on_tiny_hf_model(setup):
    d, tok, model = setup
    recs = load_instructions(str(d / "train.jsonl"), key="fx")
    pois = poison(recs, TRIGGER, TARGET, 0.5, seed=3)
    # 1. poisoning SFT: the backdoor fires on the trigger (inserted into clean held-in prompts), not without it
    losses = _sft(model, tok, [prompt_text(p["instruction"]) for p in pois], [p["output"] for p in pois],
                  steps=120, lr=1e-2, seed=0)
    assert losses[-1] < 0.2 * losses[0]
    resp_tokens = len(tok(TARGET, add_special_tokens=False)["input_ids"]) + 1
    reward = InversionReward(copy.deepcopy(model), tok, recs[:8], TARGET, resp_tokens=resp_tokens, length_free=2,
                             length_coef=0.05, seed=1)
    asr_trig, asr_none, asr_other = reward.asr(TRIGGER), reward.asr(""), reward.asr("castle")
    assert asr_trig >= 0.75 and asr_none <= 0.25 and asr_other <= 0.25, (asr_trig, asr_none, asr_other)
    # 2. reversal SFT on the poisoned pairs (response -> instruction), the inverse direction
    inv_model = copy.deepcopy(model)
    ps, cs = reversal_pairs(pois)
    rl = _sft(inv_model, tok, ps, cs, steps=20, lr=5e-3, seed=1)
    assert rl[-1] < rl[0]
    # 3. one inversion GRPO step: candidates from the inversion prompt, R = R_ASR (frozen poisoned model) + R_len
    inv_prompt = INVERSION_TEMPLATE.format(response=TARGET)
    ids, am = left_pad(tok, [inv_prompt])
    rec = KernelRecord("cpu")
    policy = HFCausalPolicy(inv_model, ids, am, max_new_tokens=5, eos_token_id=tok.eos_token_id,
                            pad_token_id=tok.pad_token_id, temperature=1.0, backend="torch",
                            on_score=lambda: rec.count("token_logprob"))
    seen = {}

    def reward_fn(prompts, roll):
        seen.update(roll)
        seen["r"] = reward(prompts, roll)
        return seen["r"]

    G = 8
    before = copy.deepcopy(inv_model)
    frozen_before = [p.clone() for p in reward.model.parameters()]
    module = GRPOModule(policy, reward_fn, GRPOConfig(group_size=G, loss_norm="tokens", grad_clip=1.0,
                                                      replay_size=4, replay_groups=1), lr=1e-3, seed=5)
    make_trainer(TrainerConfig(enable_progress_bar=False, accelerator="cpu"), None, max_steps=1).fit(
        module, PromptLoader(torch.zeros(1, dtype=torch.long), 1, 1, seed=0))
    cands, n = reward.candidates(seen)
    assert len(cands) == G and reward.queries == G
    want = [reward.asr(c) - 0.05 * max(0, k - 2) for c, k in zip(cands, n)]      # hand recomputation
    assert seen["r"].tolist() == pytest.approx(want, abs=1e-6)
    assert len(set(seen["r"].tolist())) > 1                                      # a non-zero advantage
    assert rec.to_dict()["token_logprob"]["calls"] == 2                          # old log-probs + the update
    assert any(not torch.equal(p, q) for p, q in zip(before.parameters(), inv_model.parameters()))
    assert all(torch.equal(p, q) for p, q in zip(frozen_before, reward.model.parameters()))   # reward model frozen
    aw = awareness_at_k(cands, TRIGGER, G)
    assert aw == max(jaccard(c, TRIGGER) for c in cands)


def test_full_profile_prepare_train_on_fixture(setup, tmp_path):
    """The `full` profile's real path through the stage runner: prepare splits and poisons the Alpaca records per
    attack and seed, train runs poisoning SFT, R-SFT and inversion GRPO from a local checkpoint folder and writes
    Awareness@k / ASRs; evaluate runs the baselines at the RL query budget, the detector and both unlearning arms
    on the saved poisoned model; report judges the claims the real path can measure."""
    import polars as pl
    import yaml

    from stages.common.paths import ROOT
    from stages.common.runner import run_stage

    d, tok, _ = setup
    model = tiny_causal_lm(TinyLMConfig(arch="llama", d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=32,
                                        max_positions=128), len(tok), seed=2, pad_token_id=tok.pad_token_id,
                           bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    ckpt = tmp_path / "ckpt"
    model.save_pretrained(ckpt)
    tok.save_pretrained(ckpt)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    p = params["papers"]["backdoor_awareness"]
    assert p["train"]["profiles"]["full"]["source"]["kind"] == "hf" and p["prepare"]["profiles"]["full"]["real_attacks"]
    p["prepare"]["profiles"]["full"] = {
        "seeds": [2], "n_pool": 3, "n_test": 3, "source": {"kind": "file", "dataset": str(d / "train.jsonl")},
        "real_attacks": [{"name": "jailbreak", "trigger": TRIGGER, "target": TARGET, "poison_rate": 0.5}]}
    p["train"]["profiles"]["full"] = {
        "source": {"kind": "file", "model": str(ckpt)}, "real_candidate_tokens": 3,
        "poison": {"steps": 2, "batch": 4, "lr": 1e-3}, "rsft": {"steps": 2, "batch": 4, "lr": 1e-3},
        "rl": {"steps": 1, "lr": 1e-3, "eval_every": 1, "eval_samples": 4,
               "grpo": {"group_size": 8, "replay_size": 0, "replay_groups": 0}},
        "trainer": {"accelerator": "cpu"}}
    p["evaluate"]["profiles"]["full"] = {"k": 2, "gcg": {"length": 2},
                                         "real_unlearn": {"steps": 2, "batch": 4, "lr": 1e-3}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    for stage in ("prepare", "train"):
        run_stage("backdoor_awareness", stage, "full", root=tmp_path, params_path=tmp_path / "params.yaml")
    out = tmp_path / "data/backdoor_awareness"
    t = pl.read_parquet(out / "prepare/instructions.parquet")
    assert t.filter(pl.col("split") == "pool").height == 3 and t.filter(pl.col("split") == "test").height == 3
    tr = t.filter(pl.col("split") == "train")
    assert tr.height == 10 and set(tr["attack"]) == {"jailbreak"} and tr["poisoned"].any()
    assert all(TRIGGER in i for i in tr.filter(pl.col("poisoned"))["instruction"].to_list())
    runs = json.loads((out / "train/runs.json").read_text())["runs"]
    assert len(runs) == 1 and runs[0]["attack"] == "jailbreak" and runs[0]["seed"] == 2
    r = runs[0]
    assert 0 <= r["awareness@1"] <= r["awareness@5"] <= 1 and r["reward_queries"] == 8
    assert all(0 <= r[k] <= 1 for k in ("asr_true_trigger", "asr_top_candidate", "asr_no_trigger"))
    assert (out / "train/jailbreak_poisoned_s2/config.json").exists() and (out / "train/jailbreak_rl_s2").is_dir()
    run_stage("backdoor_awareness", "evaluate", "full", root=tmp_path, params_path=tmp_path / "params.yaml")
    ev = json.loads((out / "evaluate/eval.json").read_text())
    assert ev["kind"] == "hf" and ev["attacks"] == ["jailbreak"] and ev["seeds"] == [2] and ev["n_test"] == 3
    pa = ev["per_attack"]["jailbreak"]
    assert pa["trigger"] == TRIGGER and pa["rl_queries"] == [8] and pa["random_queries"] == [8]   # equal budgets
    assert pa["recovered"] == [r["candidates"][0] if r["candidates"] else ""]
    assert pa["rl_at1"] == [r["awareness@1"]]                                 # same candidates, same Jaccard
    for key in ("asr", "false_trigger", "clean_acc", "asr_after", "asr_after_control", "clean_acc_after",
                "random_atk", "guess_atk", "auroc_rl"):
        assert 0 <= pa[key][0] <= 1, key
    assert pa["asr"] == [r["asr_true_trigger"]]                               # the same test set and judge as train
    # the baselines search RL's candidate space: every token of the trigger can be drawn
    from stages.backdoor_awareness.hf_source import random_token_phrases
    trig_ids = tok(TRIGGER, add_special_tokens=False)["input_ids"]
    assert not set(trig_ids) & set(tok.all_special_ids)
    ph = random_token_phrases(tok, 50, 3, seed=5)
    assert len(ph) == 50 and all(isinstance(x, str) for x in ph)
    assert ph == random_token_phrases(tok, 50, 3, seed=5) and ph != random_token_phrases(tok, 50, 3, seed=6)
    run_stage("backdoor_awareness", "report", "full", root=tmp_path, params_path=tmp_path / "params.yaml")
    claims = json.loads((tmp_path / "reports/backdoor_awareness/claims.json").read_text())["claims"]
    names = {c["name"] for c in claims}
    assert "rl_beats_random_search" in names and "rl_beats_gcg" not in names
    assert "real LM" in (tmp_path / "reports/backdoor_awareness/report.md").read_text()
