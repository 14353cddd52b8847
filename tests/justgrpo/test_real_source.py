"""justgrpo on the real-model path (issue 41): GSM8K-format jsonl (question / answer ending in `#### n`) read
through stages.justgrpo.hf_source.load_gsm8k, the official answer extraction and comparison on hand-made
completions, and JustGRPO (AR-order rollout, exact AR likelihood, ±1 reward, one GRPOModule step) on a tiny
random `LlamaForCausalLM` used as a bidirectional masked-diffusion LM (4D all-true attention mask) with a
tokenizer trained here (a <mask> token added). Nothing downloads."""
from __future__ import annotations

import copy
import json

import pytest
import torch

from kernels.record import KernelCounter, KernelRecord
from stages.common.grpo import GRPOConfig, GRPOModule, PromptLoader
from stages.common.hf import TinyLMConfig, tiny_causal_lm, train_tokenizer
from stages.common.sources import SourceError
from stages.common.trainer import TrainerConfig, make_trainer
from stages.justgrpo.hf_source import (DiffusionLM, HFDLLMPolicy, ar_logprobs, decode, extract_answer,
                                       greedy_accuracy, gsm8k_ground_truth, load_gsm8k, make_reward_fn,
                                       math_equal)

pytestmark = pytest.mark.real_source

RECORDS = [  # the openai/gsm8k `main` schema: question, answer (worked solution, calculator tags, `#### n`)
    {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
                 "How many clips did Natalia sell altogether in April and May?",
     "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips "
               "altogether in April and May.\n#### 72"},
    {"question": "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
                 "How much did she earn?",
     "answer": "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nWorking 50 minutes, she earned 0.2 x 50 = "
               "$<<0.2*50=10>>10.\n#### 10"},
    {"question": "A company pays 1,250 dollars a week for 4 weeks. How much does it pay in total?",
     "answer": "It pays 1,250 * 4 = <<1250*4=5000>>5,000 dollars.\n#### 5,000"},
]


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("gsm8k")
    _write(d / "train.jsonl", RECORDS)
    texts = [r["question"] + " " + r["answer"] for r in RECORDS] + ["The answer is 7. \\boxed{3}"]
    tok = train_tokenizer(texts * 3, d / "tokenizer.json", vocab_size=300)
    tok.add_special_tokens({"mask_token": "<mask>"})
    model = tiny_causal_lm(TinyLMConfig(arch="llama", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48,
                                        max_positions=128), len(tok), seed=0, dtype=torch.float64,
                           pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                           eos_token_id=tok.eos_token_id)
    return d, tok, model


def test_gsm8k_loader_and_official_scoring(setup):
    d, _, _ = setup
    recs = load_gsm8k(str(d / "train.jsonl"), key="fixture.dataset")
    assert [r["gt"] for r in recs] == ["72", "10", "5,000"]                 # after '####' (official: strip only)
    assert math_equal("5000", "5,000") and math_equal("5,000.0", "5,000")
    assert recs[0]["question"].startswith("Natalia") and recs[2]["answer"].endswith("#### 5,000")
    assert len(load_gsm8k(str(d / "train.jsonl"), limit=2)) == 2
    # extraction order: last \boxed{} > "he answer is" > last number
    assert extract_answer("so 3+4=7, then \\boxed{\\frac{1}{2}} and \\boxed{12}. The answer is 9") == "12"
    assert extract_answer("We get 5 apples. The answer is 1,234 apples. Check: 17") == "1234"
    assert extract_answer("She has 3 then 4 then 2,500 left.") == "2500"
    assert extract_answer("no digits here") == ""
    assert gsm8k_ground_truth("a\n#### -3.5") == "-3.5" and gsm8k_ground_truth("no marker") is None
    # comparison: rel_tol 1e-4, gt/100 and gt*100 accepted, otherwise unequal
    assert math_equal("72", "72") and math_equal("72.00001", "72") and not math_equal("72.1", "72")
    assert math_equal("0.72", "72") and math_equal("7200", "72") and math_equal("72%", "0.72")
    assert not math_equal("", "72") and not math_equal("seventy", "72")


def test_gsm8k_loader_bad_inputs(tmp_path):
    with pytest.raises(SourceError, match=r"^fx: .*missing.jsonl does not exist"):
        load_gsm8k(str(tmp_path / "missing.jsonl"), key="fx")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "#### 1"}\n{"question": \n')
    with pytest.raises(SourceError, match=r"^fx: .*could not be read") as e:
        load_gsm8k(str(bad), key="fx")
    assert "\n" not in str(e.value)
    nocol = _write(tmp_path / "nocol.jsonl", [{"question": "q", "solution": "#### 1"}])
    with pytest.raises(SourceError, match=r"^fx: .*lacks column 'answer'"):
        load_gsm8k(nocol, key="fx")
    nomark = _write(tmp_path / "nomark.jsonl", [{"question": "q", "answer": "#### 1"},
                                                {"question": "q", "answer": "2"}])
    with pytest.raises(SourceError, match=r"^fx: .*record 1 answer has no '#### <number>'"):
        load_gsm8k(nomark, key="fx")


def test_justgrpo_step_on_tiny_hf_dllm(setup):
    d, tok, model = setup
    recs = load_gsm8k(str(d / "train.jsonl"), key="fixture.dataset")
    mask_id = tok.mask_token_id
    assert mask_id == len(tok) - 1
    dlm = DiffusionLM(model, mask_id, "4d_mask")
    table = [torch.tensor(tok(r["question"], add_special_tokens=False)["input_ids"]) for r in recs]
    P, L, G = table[0].numel(), 6, 6
    # the 4D mask makes the causal class bidirectional: a later token changes an earlier position's logits
    x = torch.cat([table[0], torch.full((L,), mask_id)])[None]
    x2 = x.clone()
    x2[0, -1] = 5
    with torch.no_grad():
        assert float((dlm(x)[0, :P] - dlm(x2)[0, :P]).abs().max()) > 1e-6
        assert float(dlm(x)[..., mask_id].max()) < -1e3                   # MASK never predicted
    # exact AR likelihood == a brute-force loop (one forward per t over [prompt, y_<t, MASK...])
    gen = torch.randint(4, mask_id, (2, L), generator=torch.Generator().manual_seed(1))
    rows = table[0][None].expand(2, -1)
    lp = ar_logprobs(dlm, rows, gen)
    with torch.no_grad():
        for t in range(L):
            ctx = torch.cat([rows, gen[:, :t], torch.full((2, L - t), mask_id)], 1)
            ref = torch.log_softmax(dlm(ctx)[:, P + t].double(), -1).gather(1, gen[:, t:t + 1])[:, 0]
            torch.testing.assert_close(lp[:, t].double(), ref, atol=1e-5, rtol=0)
    # block-1 decoding is strictly left to right; T = 0 with block 1 = the greedy AR loop
    g0, step = decode(dlm, rows[:1], L, 1, 1, 0.0)
    assert step[0].tolist() == list(range(L))
    with torch.no_grad():
        cur = []
        for t in range(L):
            ctx = torch.cat([rows[:1], torch.tensor([cur], dtype=torch.long).view(1, -1),
                             torch.full((1, L - t), mask_id)], 1)
            cur.append(int(dlm(ctx)[0, P + t].argmax()))
    assert g0[0].tolist() == cur
    # one JustGRPO step through the shared trainer; the reward is the official ±1 on prompt + completion.
    # Question 1's ground truth is set to what the rollout's first row extracts (a probe with the same seed),
    # so the group has both rewards and a non-zero advantage.
    seed = 4
    probe = HFDLLMPolicy(copy.deepcopy(dlm), table, L, "justgrpo")
    proll = probe.rollout(torch.tensor([1]), G, torch.Generator().manual_seed(seed))
    texts = [r["question"] for r in recs]
    comps = tok.batch_decode(proll["tokens"].tolist(), skip_special_tokens=True)
    answers = [extract_answer(texts[1] + c) for c in comps]
    assert len(set(answers)) > 1, answers
    gts = [r["gt"] for r in recs]
    gts[1] = answers[0]
    rec = KernelRecord("cpu")
    policy = HFDLLMPolicy(dlm, table, L, "justgrpo", KernelCounter(rec))
    seen = {}
    reward = make_reward_fn(tok, texts, gts)

    def reward_fn(prompts, roll):
        seen.update(roll)
        out = reward(prompts, roll)
        seen["r"] = out
        return out

    before = copy.deepcopy(dlm)
    cfg = GRPOConfig(group_size=G, clip_eps=0.2, kl_coef=0.0, loss_norm="active_samples", grad_clip=1.0)
    module = GRPOModule(policy, reward_fn, cfg, lr=1e-3, seed=seed)
    trainer = make_trainer(TrainerConfig(enable_progress_bar=False, accelerator="cpu", precision="64-true"),
                           None, max_steps=1)
    trainer.fit(module, PromptLoader(torch.tensor([1]), 1, 1, seed=0))
    assert torch.equal(seen["tokens"], proll["tokens"]) and seen["tokens"].shape == (G, L)
    r = seen["r"]
    assert set(r.tolist()) == {-1.0, 1.0}
    assert r.tolist() == [1.0 if math_equal(a, gts[1]) else -1.0 for a in answers]
    adv = (r - r.mean()) / (r.std() + 1e-4)                                 # unbiased std (official)
    # the step moves the weights and raises the advantage-weighted AR log-likelihood of the rollout
    rows = table[1][None].expand(G, -1)
    with torch.no_grad():
        old = ar_logprobs(before, rows, seen["tokens"]).double().sum(1)
        new = ar_logprobs(dlm, rows, seen["tokens"]).double().sum(1)
    assert float((adv.double() * (new - old)).sum()) > 0
    assert any(not torch.equal(p, q) for p, q in zip(before.parameters(), dlm.parameters()))
    h = module.history[-1]
    assert h["reward_mean"] == pytest.approx(float(r.mean())) and h["active_frac"] == 1.0
    calls = rec.to_dict()["token_logprob"]["calls"]
    assert calls == L + 1                                                   # L decode steps + one scoring pass
    # the official evaluation path (T = 0, block 32 → clipped to L, 1 token/step) on the loaded records
    acc, items = greedy_accuracy(dlm, tok, table, texts, gts, L, 32)
    assert len(items) == 3 and set(items) <= {0, 1} and acc == sum(items) / 3


def test_full_profile_prepare_train_on_fixture(setup, tmp_path):
    """The `full` profile's real path through the stage runner: prepare reads GSM8K train/test jsonl, train runs
    JustGRPO from a local checkpoint folder (the tiny model saved with its tokenizer), evaluate computes pass@k
    under both decoding orders and greedy accuracy of the checkpoint and both arms' saved models, report judges
    them with the paper's claims."""
    import polars as pl
    import yaml

    from stages.common.paths import ROOT
    from stages.common.runner import run_stage

    d, tok, model = setup
    ckpt = tmp_path / "ckpt"
    model.save_pretrained(ckpt)
    tok.save_pretrained(ckpt)
    test = _write(tmp_path / "test.jsonl", RECORDS[::-1])
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    p = params["papers"]["justgrpo"]
    assert p["train"]["profiles"]["full"]["source"]["kind"] == "hf"          # full names the real checkpoint
    p["prepare"]["profiles"]["full"] = {"seeds": [3], "source": {"kind": "file", "dataset": str(d / "train.jsonl")},
                                        "eval_source": {"kind": "file", "dataset": test}}
    p["train"]["profiles"]["full"] = {
        "source": {"kind": "file", "model": str(ckpt), "dtype": "float64"},
        "dllm": {"mask_token_id": tok.mask_token_id, "bidirectional": "4d_mask", "trust_remote_code": False,
                 "gen_len": 4, "eval_block": 2},
        "rl": {"steps": 2, "prompts_per_step": 2, "grpo": {"group_size": 3}, "eval_every": 2, "eval_prompts": 2,
               "arms": ["justgrpo", "arbitrary"]},
        "trainer": {"accelerator": "cpu", "precision": "64-true"}}
    p["evaluate"]["profiles"]["full"] = {"n_samples": 3, "ks": [1, 3], "claim_k": 3, "passk_prompts": 2, "eval_prompts": 3,
                                         "tokens_per_step": [1, 4], "eval_block": 4, "sample_batch": 2}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    for stage in ("prepare", "train"):
        run_stage("justgrpo", stage, "full", root=tmp_path, params_path=tmp_path / "params.yaml")
    out = tmp_path / "data/justgrpo"
    table = pl.read_parquet(out / "prepare/gsm8k.parquet")
    assert table["split"].to_list() == ["train"] * 3 + ["test"] * 3
    assert table.filter(pl.col("split") == "test")["gt"].to_list() == ["5,000", "10", "72"]
    hist = pl.read_csv(out / "train/rl_history.csv")
    assert hist.filter(pl.col("step") == 2).height == 2 and set(hist["arm"]) == {"justgrpo", "arbitrary"}
    acc = hist.filter(pl.col("step") == 2)["acc_gsm8k"].to_list()
    assert all(a in (0.0, 0.5, 1.0) for a in acc)                          # 2 test questions, 0/1 each
    info = json.loads((out / "train/models.json").read_text())
    assert info["kind"] == "hf" and info["source"]["model"] == str(ckpt) and info["gen_len"] == 4
    assert (out / "train/justgrpo_s3/config.json").exists() and (out / "train/arbitrary_s3/config.json").exists()
    kern = json.loads((out / "train/kernels.json").read_text())
    assert kern["token_logprob"]["calls"] > 0
    run_stage("justgrpo", "evaluate", "full", root=tmp_path, params_path=tmp_path / "params.yaml")
    ev = json.loads((out / "evaluate/eval.json").read_text())
    assert ev["kind"] == "hf" and ev["seeds"] == [3] and ev["passk_prompts"] == 2 and ev["eval_prompts"] == 3
    for sampler in ("ar", "arbitrary"):
        p1, p3 = ev["passk"][sampler]["pass1"][0], ev["passk"][sampler]["pass3"][0]
        assert p3 in (0.0, 0.5, 1.0) and 0 <= p1 <= p3             # n = k = 3: pass@3 = any of 3 samples right
        assert abs(p1 * 6 - round(p1 * 6)) < 1e-9                               # pass@1 = mean of c/3 over 2 questions
        assert ev["fork"][sampler]["fork_entropy"] == [None]          # GSM8K has no labelled fork tokens
    assert set(ev["acc"]) == {"base", "justgrpo", "arbitrary"}
    for name, by_tps in ev["acc_items"].items():
        for tps, items in by_tps.items():
            assert len(items[0]) == 3 and ev["acc"][name][tps] == [sum(items[0]) / 3]
    acc_csv = pl.read_csv(out / "evaluate/accuracy.csv")
    assert acc_csv.height == 3 * 2 and set(acc_csv["tokens_per_step"]) == {1, 4}
    assert json.loads((out / "evaluate/kernels.json").read_text())["token_logprob"]["calls"] > 0
    run_stage("justgrpo", "report", "full", root=tmp_path, params_path=tmp_path / "params.yaml")
    md = (tmp_path / "reports/justgrpo/report.md").read_text()
    assert "on a real dLLM (GSM8K)" in md and f"checkpoint `{ckpt}`" in md
    names = [c["name"] for c in json.loads((tmp_path / "reports/justgrpo/claims.json").read_text())["claims"]]
    assert "justgrpo_beats_arbitrary_grpo" in names and "baseline_beats_chance" not in names
    fork = next(c for c in json.loads((tmp_path / "reports/justgrpo/claims.json").read_text())["claims"]
                if c["name"] == "fork_entropy_ar_higher")
    assert fork["verdict"] == "inconclusive"


def test_dllm_loader_bad_inputs(setup, tmp_path):
    from stages.common.sources import SourceConfig
    from stages.justgrpo.hf_source import DLLMConfig, load_dllm

    _, tok, model = setup
    with pytest.raises(SourceError, match=r"^fx.model: .*nope does not exist"):
        load_dllm(SourceConfig(kind="file", model=str(tmp_path / "nope")), DLLMConfig(), key="fx")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match=r"^fx.model: .*is not a loadable model"):
        load_dllm(SourceConfig(kind="file", model=str(tmp_path / "empty")), DLLMConfig(trust_remote_code=False),
                  key="fx")
    with pytest.raises(SourceError, match="mask_token_id: 126336 is outside the model's vocabulary"):
        DiffusionLM(model, 126336)
