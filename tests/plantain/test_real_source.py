"""plantain on the real-model path (issue 41): MATH-500-style jsonl records with plan-first traces in the author's
tag format read through stages.plantain.hf_source.load_plantain_records; the trace formats, the reward
r_format × (1 + r_correct + r_helpful) and TTFR on hand-made completions; SFT on the traces (prompt masked), one
GRPO step with stages.common.hf.HFCausalPolicy and the PLANTAIN reward, and plan- vs answer-level
Rewind-and-Repeat on a tiny random `LlamaForCausalLM` with a tokenizer trained here. Nothing downloads."""
from __future__ import annotations

import copy
import json

import pytest
import torch

from kernels.record import KernelRecord
from stages.common.grpo import GRPOConfig, GRPOModule, PromptLoader
from stages.common.hf import HFCausalPolicy, TinyLMConfig, encode_pairs, left_pad, tiny_causal_lm, train_tokenizer
from stages.common.sources import SourceError
from stages.common.trainer import TrainerConfig, make_trainer
from stages.plantain.hf_source import (TraceError, chat_prompt, load_plantain_records, make_reward_fn,
                                       parse_segments, plantain_reward, rewind_and_repeat, rule_plan_judge,
                                       to_format, ttfr_whitespace)

pytestmark = pytest.mark.real_source

PF = ("<think>Two steps.</think><answer>1. add 3 and 4\n2. double it</answer>"
      "<think>3+4=7, 7*2=14</think><answer>\\boxed{14}</answer>")
RECORDS = [  # MATH-500 columns (problem, solution, answer, subject, level, unique_id) + the plan-first trace
    {"problem": "What is twice the sum of 3 and 4?", "solution": "$2(3+4)=14$", "answer": "14",
     "subject": "Prealgebra", "level": 1, "unique_id": "test/prealgebra/1.json", "trace": PF},
    {"problem": "What is 5 minus 2, squared?", "solution": "$(5-2)^2=9$", "answer": "9", "subject": "Algebra",
     "level": 1, "unique_id": "test/algebra/2.json",
     "trace": "<think>Subtract then square.</think><answer>1. subtract 2 from 5\n2. square it</answer>"
              "<think>5-2=3, 3*3=9</think><answer>\\boxed{9}</answer>"},
    {"problem": "What is 6 times 7?", "solution": "$42$", "answer": "42", "subject": "Prealgebra", "level": 1,
     "unique_id": "test/prealgebra/3.json",
     "trace": "<think>One step.</think><answer>1. multiply 6 by 7</answer><think>6*7=42</think>"
              "<answer>\\boxed{42}</answer>"},
    # an injected plan error (as the paper's synthetic traces have): same problem, a plan the judge rejects
    # (numbering skips 2), and the answer that follows the faulty plan
    dict(problem="What is twice the sum of 3 and 4?", answer="14", solution="$2(3+4)=14$",
         subject="Prealgebra", level=1, unique_id="test/prealgebra/1.json",
         trace=PF.replace("add 3 and 4\n2.", "add 3 and 5\n3.").replace("3+4=7, 7*2=14", "3+5=8, 8*2=16")
         .replace("{14}", "{16}")),
]


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("plantain")
    _write(d / "sft.jsonl", RECORDS)
    tok = train_tokenizer([r["problem"] + "\n" + r["trace"] for r in RECORDS] * 3, d / "tokenizer.json",
                          vocab_size=300)
    model = tiny_causal_lm(TinyLMConfig(arch="llama", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64,
                                        max_positions=160), len(tok), seed=1, pad_token_id=tok.pad_token_id,
                           bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    return d, tok, model


def test_records_formats_rewards_ttfr(setup, tmp_path):
    d, _, _ = setup
    recs = load_plantain_records(str(d / "sft.jsonl"), need_trace=True, key="fx")
    assert [r["answer"] for r in recs] == ["14", "9", "42", "14"] and recs[0]["trace"] == PF
    # the two formats carry the same content; tta hides the plan inside the thought
    tta = to_format(PF, "tta")
    assert tta == ("<think>Two steps.\n1. add 3 and 4\n2. double it\n3+4=7, 7*2=14</think>"
                   "<answer>\\boxed{14}</answer>")
    assert [s.kind for s in parse_segments(to_format(PF, "pf"))] == ["think", "answer", "think", "answer"]
    p = RECORDS[0]["problem"]
    # r = r_format × (1 + r_correct + r_helpful), hand-worked
    assert plantain_reward(p, "14", PF, "pf")["r"] == 3.0
    assert plantain_reward(p, "14", tta, "tta") == {"r": 2.0, "r_format": 1.0, "r_correct": 1.0, "r_helpful": 0.0}
    assert plantain_reward(p, "15", PF, "pf")["r"] == 2.0                   # wrong answer, good plan
    bad_plan = PF.replace("2. double", "3. double")                          # numbering broken
    assert plantain_reward(p, "14", bad_plan, "pf")["r"] == 2.0
    assert plantain_reward(p, "14", PF, "tta")["r"] == 0.0                   # pf trace is not tta format
    assert plantain_reward(p, "14", PF[:-9], "pf")["r"] == 0.0               # unclosed final answer
    assert plantain_reward(p, "14.0000", "<think>x</think><answer>1. a</answer><think>y</think><answer>14</answer>",
                           "pf")["r"] == 3.0
    with pytest.raises(TraceError, match="char 0: text outside"):
        parse_segments("hello <think>x</think>")
    with pytest.raises(TraceError, match="<answer> opened inside <think>"):
        parse_segments("<think>a<answer>b</answer></think>")
    assert rule_plan_judge(p, "1. a\n2. b") and not rule_plan_judge(p, "1. a\n3. b")
    assert not rule_plan_judge(p, "\n".join(f"{k}. x" for k in range(1, 10)))   # > 8 items
    # TTFR (whitespace tokens before the first <answer> content): pf shows the plan after the first thought
    assert ttfr_whitespace(PF) == 5                                           # <think> Two steps. </think> <answer>
    assert ttfr_whitespace(tta) == 15 and ttfr_whitespace("no tags at all") == 4
    assert ttfr_whitespace(PF) < ttfr_whitespace(tta)


def test_records_bad_inputs(tmp_path):
    with pytest.raises(SourceError, match=r"^fx: .*nope.jsonl does not exist"):
        load_plantain_records(str(tmp_path / "nope.jsonl"), key="fx")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "p", "answer": "1"}\n{"problem": [\n')
    with pytest.raises(SourceError, match=r"^fx: .*could not be read"):
        load_plantain_records(str(bad), key="fx")
    with pytest.raises(SourceError, match=r"^fx: .*lacks column 'answer'"):
        load_plantain_records(_write(tmp_path / "a.jsonl", [{"problem": "p", "solution": "1"}]), key="fx")
    with pytest.raises(SourceError, match=r"^fx: .*lacks column 'trace'"):
        load_plantain_records(_write(tmp_path / "b.jsonl", [{"problem": "p", "answer": "1"}]), key="fx",
                              need_trace=True)
    bad_trace = [{"problem": "p", "answer": "1", "trace": "<think>x</think><answer>1</answer>"}]
    with pytest.raises(SourceError, match=r"^fx: .*record 0 trace is not a plan-first trace"):
        load_plantain_records(_write(tmp_path / "c.jsonl", bad_trace), key="fx")
    assert load_plantain_records(_write(tmp_path / "d.jsonl", [{"problem": "p", "answer": "1"}]))[0]["trace"] is None


def test_plantain_sft_grpo_rr_on_tiny_hf_model(setup):
    d, tok, model = setup
    recs = load_plantain_records(str(d / "sft.jsonl"), need_trace=True, key="fx")
    probs, golds = [r["problem"] for r in recs], [r["answer"] for r in recs]
    prompts = [chat_prompt(tok, p) for p in probs]
    # SFT on the plan-first traces: the prompt is masked out of the loss (encode_pairs)
    batch = encode_pairs(tok, prompts, [r["trace"] for r in recs])
    n_prompt = [len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    for i, n in enumerate(n_prompt):
        assert (batch["labels"][i, :n - 1] == -100).all() and batch["labels"][i, n - 1] != -100
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    model.train()
    for _ in range(100):
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["labels"].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    model.eval()
    assert losses[-1] < 0.5 * losses[0]
    # one GRPO step with the PLANTAIN reward on HFCausalPolicy rollouts
    ids, am = left_pad(tok, prompts)
    rec = KernelRecord("cpu")
    policy = HFCausalPolicy(model, ids, am, max_new_tokens=72, eos_token_id=tok.eos_token_id,
                            pad_token_id=tok.pad_token_id, temperature=1.3, backend="torch",
                            on_score=lambda: rec.count("token_logprob"))
    reward = make_reward_fn(tok, probs, golds, "pf")
    seen = {}

    def reward_fn(prompts_, roll):
        seen.update(roll)
        seen["r"] = reward(prompts_, roll)
        return seen["r"]

    before = copy.deepcopy(model)
    G = 8
    module = GRPOModule(policy, reward_fn, GRPOConfig(group_size=G, loss_norm="tokens", grad_clip=1.0), lr=1e-3,
                        seed=2)
    make_trainer(TrainerConfig(enable_progress_bar=False, accelerator="cpu"), None, max_steps=1).fit(
        module, PromptLoader(torch.tensor([0]), 2, 1, seed=0))           # problem 0 has two SFT traces
    r = seen["r"]
    texts = tok.batch_decode(torch.where(seen["mask"] > 0, seen["tokens"], tok.pad_token_id).tolist(),
                             skip_special_tokens=True)
    idx = seen["prompt"].tolist()
    assert r.tolist() == [plantain_reward(probs[i], golds[i], t, "pf")["r"] for i, t in zip(idx, texts)]
    assert len(set(r.tolist())) > 1 and 3.0 in r.tolist()                  # mixed rewards: a non-zero advantage
    assert rec.to_dict()["token_logprob"]["calls"] == 1
    assert any(not torch.equal(p, q) for p, q in zip(before.parameters(), model.parameters()))
    # Rewind-and-Repeat: attempt 0 shared by both levels; plan-level tokens ≤ answer-level at each R when the
    # judges agree on the plan; tokens never decrease with more retries
    out = rewind_and_repeat(model, tok, probs, golds, max_new=72, max_retries=2, t_plan=1.2, top_p=0.9,
                            t_rest=0.5, seed=0)
    assert out["plan"]["acc"][0] == out["answer"]["acc"][0] and out["plan"]["tokens"][0] == out["answer"]["tokens"][0]
    for lvl in ("plan", "answer"):
        assert all(b >= a for a, b in zip(out[lvl]["tokens"], out[lvl]["tokens"][1:]))
    for i, atts in enumerate(out["attempts"]):
        assert len(atts) == 3 and all(a["plan_tok"] <= a["full_tok"] for a in atts)
        for a in atts:                                                       # the recorded flags match the text
            assert a["correct"] == (plantain_reward(probs[i], golds[i], a["text"], "pf")["r_correct"] == 1.0)
            assert a["full_ok"] == (plantain_reward(probs[i], golds[i], a["text"], "pf")["r_helpful"] == 1.0)
    # hand recomputation of the plan-level tokens at R = 2 from the raw attempts
    tot = 0.0
    for atts in out["attempts"]:
        kept = next((k for k in range(3) if atts[k]["plan_ok"]), 2)
        tot += sum(a["plan_tok"] for a in atts[:kept + 1]) + atts[kept]["full_tok"] - atts[kept]["plan_tok"]
    assert out["plan"]["tokens"][2] == pytest.approx(tot / len(probs))


def test_full_profile_stages_on_fixture(setup, tmp_path):
    """The `full` profile's real path through the stage runner on the fixture: prepare reads the SFT and test
    records, train runs SFT + GRPO per format from a local checkpoint folder, evaluate writes pass@1 / TTFR /
    Rewind-and-Repeat per run; report judges the claims the real path measures."""
    import yaml

    from stages.common.paths import ROOT
    from stages.common.runner import run_stage

    d, tok, model = setup
    ckpt = tmp_path / "ckpt"
    model.save_pretrained(ckpt)
    tok.save_pretrained(ckpt)
    test = _write(tmp_path / "test.jsonl", [{k: r[k] for k in ("problem", "answer")} for r in RECORDS[:2]])
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    p = params["papers"]["plantain"]
    assert p["train"]["profiles"]["full"]["source"]["kind"] == "hf"
    p["prepare"]["profiles"]["full"] = {"seeds": [1], "source": {"kind": "file", "dataset": str(d / "sft.jsonl")},
                                        "eval_source": {"kind": "file", "dataset": test}}
    p["train"]["profiles"]["full"] = {"source": {"kind": "file", "model": str(ckpt)}, "real_max_new": 8,
                                      "sft": {"steps": 2, "batch": 2, "lr": 1e-3, "decay_frac": 0.0},
                                      "rl": {"steps": 1, "prompts_per_step": 1, "grpo": {"group_size": 2}},
                                      "trainer": {"accelerator": "cpu"}}
    p["evaluate"]["profiles"]["full"] = {"eval_prompts": 2, "wall_prompts": 1, "rr": {"max_retries": 1, "prompts": 1}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    for stage in ("prepare", "train", "evaluate"):
        run_stage("plantain", stage, "full", root=tmp_path, params_path=tmp_path / "params.yaml")
    out = tmp_path / "data/plantain"
    meta = json.loads((out / "prepare/meta.json").read_text())
    assert meta["kind"] == "plantain_records" and meta["n_sft"] == 4 and meta["n_test"] == 2
    info = json.loads((out / "train/models.json").read_text())
    assert info["kind"] == "hf" and info["formats"] == ["tta", "pf"] and info["max_new"] == 8
    assert all((out / f"train/{f}_grpo_s1/config.json").exists() for f in ("tta", "pf"))
    m = json.loads((out / "evaluate/metrics.json").read_text())
    assert [(r["seed"], r["fmt"]) for r in m["runs"]] == [(1, "tta"), (1, "pf")]
    for r in m["runs"]:
        assert len(r["correct"]) == 2 and set(r["correct"]) <= {0.0, 1.0}
        assert len(r["ttfr_whitespace"]) == 2 and all(t >= 0 for t in r["ttfr_whitespace"])
    pf = m["runs"][1]
    assert len(pf["rr"]["plan"]["acc"]) == 2 and pf["rr"]["plan"]["tokens"][0] == pf["rr"]["answer"]["tokens"][0]
    rr = pf["rr"]
    assert rr["prompts"] == 1 and min(rr["plan"]["acc"][0], 1) <= rr["target"] <= 1
    for level in ("plan", "answer"):                      # tokens_to_target: a point on the curve, or inf (never)
        t = rr[level]["tokens_to_target"]
        assert t is None or min(rr[level]["tokens"]) <= t <= max(rr[level]["tokens"])
    run_stage("plantain", "report", "full", root=tmp_path, params_path=tmp_path / "params.yaml")
    claims = {c["name"]: c for c in json.loads((tmp_path / "reports/plantain/claims.json").read_text())["claims"]}
    assert set(claims) == {"ttfr_drop_60", "pass1_no_drop", "plan_rewind_fewer_tokens_after_rl",
                           "rewind_fixes_plans_after_rl"}
    tt = {r["fmt"]: sum(r["ttfr_whitespace"]) / 2 for r in m["runs"]}
    red = claims["ttfr_drop_60"]["values"]["derived.ttfr_reduction"]
    assert red == ([pytest.approx(1 - tt["pf"] / tt["tta"])] if tt["tta"] else [None])
    assert "on a real model" in (tmp_path / "reports/plantain/report.md").read_text()


def test_real_metrics_by_hand():
    """report.real_metrics on made-up runs: TTFR reduction 1 − pf/tta, pass@1 delta pf − tta, RR per seed."""
    from stages.plantain.report import real_metrics

    rr = {"plan": {"acc": [0.25, 0.75], "tokens": [10.0, 18.0], "tokens_to_target": 14.0},
          "answer": {"acc": [0.25, 0.5], "tokens": [10.0, 30.0], "tokens_to_target": 30.0}, "prompts": 4}
    m = {"seeds": [0, 1], "formats": ["tta", "pf"], "runs": [
        {"seed": s, "fmt": f, "correct": c, "ttfr_whitespace": t, **({"rr": rr} if f == "pf" else {})}
        for s in (0, 1) for f, c, t in (("tta", [1.0, 0.0], [10.0, 10.0]), ("pf", [1.0, 1.0], [2.0, 4.0 + 2 * s]))]}
    ev = real_metrics(m)
    assert ev["derived"]["ttfr_reduction"] == [pytest.approx(1 - 3 / 10), pytest.approx(1 - 4 / 10)]
    assert ev["derived"]["pass1_delta"] == [0.5, 0.5]
    assert ev["rr"]["grpo"]["plan"]["tokens_to_target"] == [14.0, 14.0]
    assert ev["rr"]["grpo"]["answer"]["acc_max"] == [0.5, 0.5] and ev["rr_prompts"] == 4
