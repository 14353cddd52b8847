"""reversal_curse on the real-model path (issue 41): the same synthetic facts as the toy (prepare's
``save_to_disk`` world folders) rendered as sentences ("X's husband is Y", "The name of X is X"), a tokenizer
trained here and a tiny random HF `LlamaForCausalLM`; fine-tuning through the fused linear+CE kernel, and the
measures (top-1 over the side's candidates, forward/reverse asymmetry of the score matrix) read from the model
and checked against plain HF-forward references. Nothing downloads."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml
from datasets import Dataset

from kernels.record import KernelRecord
from stages.common.hf import TinyLMConfig, tiny_causal_lm, train_tokenizer
from stages.common.sources import SourceError
from stages.reversal_curse.facts import build_facts
from stages.reversal_curse.hf_source import (HFTrainOptions, arm_texts, candidate_scores, completion_logprob,
                                             entity_name, load_facts, measures, render, train_arm)

pytestmark = pytest.mark.real_source
N = 6


def _tiny(tok, seed=0):
    return tiny_causal_lm(TinyLMConfig(arch="llama", d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=64,
                                       max_positions=64), len(tok), seed=seed, pad_token_id=tok.pad_token_id,
                          bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    d = tmp_path_factory.mktemp("facts")
    for seed in (0, 1):
        Dataset.from_dict(build_facts(N, 0.34, seed)).save_to_disk(str(d / f"main_s{seed}"))
    (d / "meta.json").write_text(json.dumps({"seeds": [1], "worlds": {"main": {"n_pairs": N}}}))
    texts = [" ".join(render(k, e, t, N)) for k, e, t in zip(*(build_facts(N, 0.34, 0)[c]
                                                                 for c in ("kind", "entity", "target")))]
    tok = train_tokenizer(texts, d / "tokenizer.json", vocab_size=300)
    return d, tok


def test_reversal_facts_on_hf_llama(fixture):
    d, tok = fixture
    facts = load_facts(str(d / "main_s0"), key="fixture.dataset")
    ref = build_facts(N, 0.34, 0)
    assert int(facts["n"]) == N and facts["target"].tolist() == ref["target"] and facts["split"].tolist() == ref["split"]
    names = [entity_name(e, N) for e in range(2 * N)]
    assert len(set(names)) == 2 * N and all(len(tok(f" {x}")["input_ids"]) >= 2 for x in names)  # multi-token
    assert render("reverse", N + 2, 2, N) == (f"{names[N + 2]}'s wife is", f" {names[2]}")
    assert render("identity_A", 1, 1, N) == (f"The name of {names[1]} is", f" {names[1]}")
    p, c = arm_texts(facts, "AB")
    n_held = int(((facts["split"] == "test") & (facts["kind"] == "reverse")).sum())
    assert len(p) == N + (N - n_held) + 2 * N and len(arm_texts(facts, "none")[0]) == N + N - n_held
    held = [entity_name(int(e), N) for e, k, s in zip(facts["entity"], facts["kind"], facts["split"])
            if k == "reverse" and s == "test"]
    assert not any(q.endswith("wife is") and q[:-len("'s wife is")] in held for q in p)   # held-out never trained

    model = _tiny(tok, seed=1)
    rec = KernelRecord("cpu")
    # Σ log p(completion | prompt) through the fused kernel == the HF forward's log-softmax on each joined sequence
    prompts, comps = ["Kalomi Varson's husband is", "The name of Lomi Hal is"], [" Loka Ford", " Lomi Hal"]
    got = completion_logprob(model, tok, prompts, comps, rec)
    for i, (q, a) in enumerate(zip(prompts, comps)):
        pi, ci = tok(q, add_special_tokens=False)["input_ids"], tok(a, add_special_tokens=False)["input_ids"]
        ids = torch.tensor([pi + ci])
        with torch.no_grad():
            lp = torch.log_softmax(model(ids).logits[0, :-1].double(), -1)
        want = sum(float(lp[len(pi) - 1 + j, t]) for j, t in enumerate(ci))
        assert abs(float(got[i]) - want) < 1e-4
    assert rec.to_dict()["fused_linear_ce"]["calls"] == 1 and rec.to_dict()["fused_linear_ce"]["backend"] == "torch-reference"

    # fine-tune the A∪B arm: the loss falls and the training facts are memorised
    opts = HFTrainOptions(arms=["AB"], lr=1e-2, steps=100, batch_size=16, eval_every=100, eval_batch=64)
    run = train_arm(model, tok, facts, "AB", opts, seed=0, rec=rec)
    assert np.mean(run["losses"][-10:]) < 0.5 * np.mean(run["losses"][:10])
    assert [c["step"] for c in run["curve"]] == [100]
    fin = run["final"]
    assert fin["forward_acc"] == 1.0 and fin["indist_reverse_acc"] == 1.0
    assert 0.0 <= fin["reverse_acc"] <= 1.0 and 0.0 <= fin["heldout_asymmetry"] <= 2 ** 0.5 + 1e-9

    # measures read from the model, recomputed by hand from the candidate scores
    model.eval()
    m = measures(model, tok, facts, rec, 64)
    assert m == {k: fin[k] for k in m}                                           # deterministic re-read
    rows = (facts["split"] == "test") & (facts["kind"] == "reverse")
    pairs = facts["pair"][rows]
    rev = candidate_scores(model, tok, facts, rows, rec).double()
    fwd = candidate_scores(model, tok, facts, facts["kind"] == "forward", rec).double()
    fwd_rows = {int(p): i for i, p in enumerate(facts["pair"][facts["kind"] == "forward"])}
    u = np.array([float(rev[i, p] - rev[i].mean()) for i, p in enumerate(pairs)])
    v = np.array([float(fwd[fwd_rows[int(p)], p] - fwd[fwd_rows[int(p)]].mean()) for p in pairs])
    assert abs(m["heldout_asymmetry"] - np.linalg.norm(u - v) / np.sqrt(u @ u + v @ v)) < 1e-9
    assert m["reverse_acc"] == float(np.mean([int(rev[i].argmax()) == int(p) for i, p in enumerate(pairs)]))
    assert rec.to_dict()["fused_linear_ce"]["calls"] > 100
    # eval_pairs: fewer in-distribution pairs scored; the held-out measures are unchanged
    sub = measures(model, tok, facts, rec, 64, eval_pairs=2)
    # (the held-out rows are scored in batches of another composition: equal up to float summation order)
    assert sub["reverse_acc"] == m["reverse_acc"] and sub["heldout_asymmetry"] == pytest.approx(m["heldout_asymmetry"],
                                                                                             rel=1e-6, abs=1e-9)
    assert sub["indist_reverse_acc"] == 1.0 == fin["indist_reverse_acc"]          # a subset of memorised facts


def test_full_profile_train_on_fixture(fixture, tmp_path):
    """The full profile's train config (a local save_pretrained checkpoint) validates and runs run_full on
    prepare-format worlds: every seed × arm fine-tuned from the same checkpoint."""
    from stages.common.paths import ROOT
    from stages.common.runner import load_config
    from stages.reversal_curse.hf_source import run_full

    d, tok = fixture
    ckpt = tmp_path / "ckpt"
    _tiny(tok, seed=2).save_pretrained(ckpt)
    tok.save_pretrained(ckpt)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["papers"]["reversal_curse"]["train"]["profiles"]["full"] = {
        "source": {"kind": "file", "model": str(ckpt)},
        "hf": {"arms": ["none", "AB"], "lr": 1e-2, "steps": 3, "batch_size": 8, "eval_every": 3, "eval_batch": 64}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    _, cfg, prof = load_config("reversal_curse", "train", "full", tmp_path / "params.yaml")
    assert prof == "full" and cfg.source.kind == "file"
    out = tmp_path / "out"
    out.mkdir()
    run_full(cfg, SimpleNamespace(out=out, input=lambda stage: d))
    res = json.loads((out / "hf" / "results.json").read_text())
    assert [(r["arm"], r["seed"]) for r in res["runs"]] == [("none", 1), ("AB", 1)]   # meta's seeds
    assert res["runs"][0]["before"] == res["runs"][1]["before"]          # same checkpoint before fine-tuning
    assert res["runs"][1]["train_facts"] == res["runs"][0]["train_facts"] + 2 * N
    assert json.loads((out / "hf" / "kernels.json").read_text())["fused_linear_ce"]["calls"] > 0
    # the report at `full` shows these runs beside the miniature's claims (Report.real_source_sections)
    import shutil

    from stages.common.reporting import Report
    shutil.copytree(out / "hf", tmp_path / "root/data/reversal_curse/train/hf")
    rep = Report(SimpleNamespace(slug="reversal_curse", root=tmp_path / "root", out=tmp_path / "rep", tracker=None),
                 "t", "c")
    rep.real_source_sections()
    assert len(rep.parts) == 1 and f"model = {ckpt}" in rep.parts[0]
    rows = [ln for ln in rep.parts[0].splitlines() if ln.startswith("| none |") or ln.startswith("| AB |")]
    assert len(rows) == 2, rep.parts[0]


def test_facts_bad_inputs(tmp_path, fixture):
    d, _ = fixture
    with pytest.raises(SourceError, match=r"^k: .*does not exist"):
        load_facts(str(tmp_path / "missing.jsonl"), key="k")
    (tmp_path / "bad.jsonl").write_text('{"pair": 0, "entity": 0\n')
    with pytest.raises(SourceError, match=r"^k: .*could not be read"):
        load_facts(str(tmp_path / "bad.jsonl"), key="k")
    cols = build_facts(4, 0.25, 0)

    def write(name, **change):
        rows = [dict(zip(cols, vals)) for vals in zip(*cols.values())]
        for r in rows:
            r.update({k: (v(r) if callable(v) else v) for k, v in change.items()})
        path = tmp_path / name
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return str(path)

    assert int(load_facts(write("ok.jsonl"), key="k")["n"]) == 4
    rows = [{k: v for k, v in zip(cols, vals) if k != "split"} for vals in zip(*cols.values())]
    (tmp_path / "nosplit.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SourceError, match=r"^k: .* lacks column 'split'"):
        load_facts(str(tmp_path / "nosplit.jsonl"), key="k")
    with pytest.raises(SourceError, match="column 'entity' is string, expected int"):
        load_facts(write("strent.jsonl", entity=lambda r: str(r["entity"])), key="k")
    with pytest.raises(SourceError, match="unknown fact kinds"):
        load_facts(write("kind.jsonl", kind=lambda r: "sideways" if r["kind"] == "identity_B" else r["kind"]), key="k")
    with pytest.raises(SourceError, match="ids outside"):
        load_facts(write("range.jsonl", target=lambda r: 99 if r["kind"] == "forward" else r["target"]), key="k")
    with pytest.raises(SourceError, match="holds out no reverse fact"):
        load_facts(write("nohold.jsonl", split="train"), key="k")
    with pytest.raises(SourceError, match="relation id"):
        load_facts(write("rel.jsonl", relation=0), key="k")


def test_committed_full_profile_refuses_hub_names_offline(tmp_path):
    from stages.common.runner import load_config
    from stages.reversal_curse.hf_source import run_full

    _, cfg, _ = load_config("reversal_curse", "train", "full")
    with pytest.raises(SourceError, match=r"^papers\.reversal_curse\.train\.source\.model: 'meta-llama/Llama-3\.2-1B' "
                                          r".*HF_HUB_OFFLINE") as e:
        run_full(cfg, SimpleNamespace(out=tmp_path, input=lambda stage: tmp_path))
    assert "\n" not in str(e.value) and not any(tmp_path.iterdir())
