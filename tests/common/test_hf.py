"""stages/common/hf.py and the `source:` block (stages/common/sources.py): tiny HF causal LMs from config
(GQA Llama, Qwen2, GPT-2; seeded), a tokenizer trained at test time and loaded from its tokenizer.json,
left padding against per-row unpadded forwards, prompt masking by lengths and by offsets, jsonl/parquet/
save_to_disk records with their one-line errors, SourceConfig rules, the full-only rule at config load,
hub names refused offline (nothing downloads), a local checkpoint through from_pretrained, and LoRA."""
from __future__ import annotations

import json

import polars as pl
import pytest
import torch

from stages.common.config import ConfigError, StageConfig
from stages.common.hf import (HFCausalPolicy, TinyLMConfig, add_lora, causal_lm, completion_mask_from_offsets,
                              encode_pairs, left_pad, load_records, load_tokenizer, position_ids,
                              pretrained_causal_lm, tiny_causal_lm, train_tokenizer)
from stages.common.sources import SourceConfig, SourceError, check_source_profiles, resolve_ref

pytestmark = pytest.mark.real_source

SENTENCES = ["the cat sat on the mat", "a dog ran far away from the house", "birds sing in the early morning",
             "question: what is two plus two? answer: 4", "the quick brown fox jumps over the lazy dog",
             "seven times six is forty two", "rivers flow to the sea and the sea is salt"]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return train_tokenizer(SENTENCES * 3, tmp_path_factory.mktemp("tok") / "tokenizer.json", vocab_size=300)


def _ids(tok):
    return dict(pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)


# ----------------------------------------------------------------------------------------------
# models
# ----------------------------------------------------------------------------------------------
def test_tiny_llama_gqa_seeded_and_rng_untouched(tok):
    cfg = TinyLMConfig(arch="llama", d_model=48, n_layers=2, n_heads=6, n_kv_heads=2, d_ff=40, max_positions=64)
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    a = tiny_causal_lm(cfg, len(tok), seed=7, **_ids(tok))
    assert torch.equal(torch.rand(3), before)                           # global RNG left as it was
    b = tiny_causal_lm(cfg, len(tok), seed=7, **_ids(tok))
    c = tiny_causal_lm(cfg, len(tok), seed=8, **_ids(tok))
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["model.layers.0.self_attn.q_proj.weight"], sc["model.layers.0.self_attn.q_proj.weight"])
    attn = a.model.layers[0].self_attn
    assert type(a).__name__ == "LlamaForCausalLM" and a.config.num_key_value_heads == 2
    assert tuple(attn.q_proj.weight.shape) == (48, 48) and tuple(attn.k_proj.weight.shape) == (2 * 8, 48)
    assert tuple(a.model.layers[0].mlp.up_proj.weight.shape) == (40, 48)
    x = torch.tensor([tok("the cat sat")["input_ids"]])
    assert a(input_ids=x).logits.shape == (1, x.shape[1], len(tok))


@pytest.mark.parametrize("arch,cls", [("qwen2", "Qwen2ForCausalLM"), ("gpt2", "GPT2LMHeadModel")])
def test_other_archs_and_source_dispatch(tok, arch, cls):
    cfg = TinyLMConfig(arch=arch, d_model=32, n_layers=1, n_heads=4, max_positions=32, tie_embeddings=True)
    m = causal_lm(SourceConfig(), cfg, len(tok), seed=1, dtype=torch.float64, **_ids(tok))
    assert type(m).__name__ == cls and next(m.parameters()).dtype == torch.float64
    assert m.get_output_embeddings().weight.data_ptr() == m.get_input_embeddings().weight.data_ptr()
    assert m(input_ids=torch.tensor([[5, 6, 7]])).logits.shape == (1, 3, len(tok))


def test_tiny_config_errors():
    with pytest.raises(Exception, match="n_kv_heads: 3 does not divide n_heads 4"):
        TinyLMConfig(n_heads=4, n_kv_heads=3)
    with pytest.raises(Exception, match="n_heads: 5 does not divide d_model 64"):
        TinyLMConfig(n_heads=5)
    with pytest.raises(Exception, match="gpt2 has no grouped-query"):
        TinyLMConfig(arch="gpt2", n_heads=4, n_kv_heads=2)
    with pytest.raises(Exception, match="head dim 3 must be even"):
        TinyLMConfig(d_model=12, n_heads=4)


# ----------------------------------------------------------------------------------------------
# tokenizer, padding, masks
# ----------------------------------------------------------------------------------------------
def test_tokenizer_file_roundtrip(tok, tmp_path):
    assert [tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id] == [0, 1, 2, 3]
    unseen = "Zebras (17) quietly eat #grass!"                              # byte-level: no unknowns
    ids = tok(unseen, add_special_tokens=False)["input_ids"]
    assert tok.unk_token_id not in ids and tok.decode(ids) == unseen
    assert len(tok("the cat sat on the mat")["input_ids"]) < len("the cat sat on the mat")   # merges learned
    wp = train_tokenizer(SENTENCES, tmp_path / "wp" / "tokenizer.json", vocab_size=120, kind="wordpiece")
    assert wp.decode(wp("the cat sat", add_special_tokens=False)["input_ids"]) == "the cat sat"
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(SourceError, match=r"^src\.tok: .*bad\.json is not a tokenizer\.json file"):
        load_tokenizer(tmp_path / "bad.json", key="src.tok")


def test_left_padding_matches_unpadded_rows(tok):
    cfg = TinyLMConfig(arch="llama", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_positions=64)
    m = tiny_causal_lm(cfg, len(tok), seed=2, dtype=torch.float64, **_ids(tok))
    texts = ["birds sing", "a dog ran far away from the house", "the cat"]
    ids, am = left_pad(tok, texts)
    rows = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    assert am.sum(1).tolist() == [len(r) for r in rows] and bool((am[:, -1] == 1).all())
    assert bool((ids[am == 0] == tok.pad_token_id).all())
    assert position_ids(am)[0].tolist()[-len(rows[0]):] == list(range(len(rows[0])))
    logits = m(input_ids=ids, attention_mask=am, position_ids=position_ids(am)).logits
    for i, r in enumerate(rows):
        alone = m(input_ids=torch.tensor([r])).logits[0]
        assert torch.allclose(logits[i, -len(r):], alone, atol=1e-10, rtol=0)


def test_prompt_masks_by_length_and_by_offsets(tok):
    prompts = ["question: what is two plus two?", "the cat"]
    comps = [" answer: 4", " sat on the mat"]
    b = encode_pairs(tok, prompts, comps)
    for i, (p, c) in enumerate(zip(prompts, comps)):
        np_ = len(tok(p, add_special_tokens=False)["input_ids"])
        keep = b["labels"][i][b["labels"][i] != -100]
        assert tok.decode(keep[:-1]) == c and int(keep[-1]) == tok.eos_token_id      # completion + EOS only
        assert bool((b["labels"][i, : np_ - 1] == -100).all())                       # prompt never a target
        n = int(b["attention_mask"][i].sum())
        assert torch.equal(b["labels"][i, np_ - 1: n - 1], b["input_ids"][i, np_: n])
    joined = [p + c for p, c in zip(prompts, comps)]
    o = completion_mask_from_offsets(tok, joined, [len(p) for p in prompts])
    for i, (p, c) in enumerate(zip(prompts, comps)):
        ids = o["input_ids"][i][o["attention_mask"][i] > 0]
        cm = o["completion_mask"][i][o["attention_mask"][i] > 0] > 0
        assert tok.decode(ids[cm]) == c and tok.decode(ids[~cm]) == p


# ----------------------------------------------------------------------------------------------
# records (HF datasets)
# ----------------------------------------------------------------------------------------------
def test_load_records_jsonl_parquet_disk(tmp_path):
    rows = [{"question": f"q{i}", "answer": f"#### {i * 7}", "n": i} for i in range(5)]
    jl = tmp_path / "gsm.jsonl"
    jl.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    ds = load_records(jl, columns={"question": "string", "answer": "string", "n": "int"})
    assert ds.to_list() == rows
    pq = tmp_path / "corpus.parquet"
    pl.DataFrame({"text": ["doc a", "doc b", "doc c"], "score": [0.5, 1.5, -2.0]}).write_parquet(pq)
    ds2 = load_records(pq, columns={"text": "string", "score": "float"}, limit=2)
    assert ds2["text"] == ["doc a", "doc b"] and ds2["score"] == [0.5, 1.5]
    ds.save_to_disk(str(tmp_path / "saved"))
    before = sorted(p.name for p in (tmp_path / "saved").iterdir())
    assert load_records(tmp_path / "saved", columns=["question"])["n"] == [0, 1, 2, 3, 4]
    assert sorted(p.name for p in (tmp_path / "saved").iterdir()) == before        # nothing written into it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.parquet", "gsm.jsonl", "saved"]


def test_load_records_errors(tmp_path):
    with pytest.raises(SourceError, match=r"^src\.data: .*missing\.jsonl does not exist"):
        load_records(tmp_path / "missing.jsonl", key="src.data")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(SourceError, match=r"^src\.data: .*empty\.jsonl is empty \(no rows\)"):
        load_records(tmp_path / "empty.jsonl", key="src.data")
    (tmp_path / "a.jsonl").write_text('{"question": "q", "solution": "s"}\n')
    with pytest.raises(SourceError, match=r"lacks column 'answer' \(columns: question, solution\)"):
        load_records(tmp_path / "a.jsonl", columns=["question", "answer"], key="src.data")
    (tmp_path / "b.jsonl").write_text('{"question": "q", "answer": 4}\n')
    with pytest.raises(SourceError, match=r"column 'answer' is int64, expected string"):
        load_records(tmp_path / "b.jsonl", columns={"answer": "string"}, key="src.data")
    (tmp_path / "c.jsonl").write_text('{"question": "q"\n')
    with pytest.raises(SourceError, match=r"^src\.data: .*c\.jsonl could not be read"):
        load_records(tmp_path / "c.jsonl", key="src.data")
    (tmp_path / "d.txt").write_text("x")
    with pytest.raises(SourceError, match=r"suffix \.txt"):
        load_records(tmp_path / "d.txt", key="src.data")
    for err in (SourceError, ConfigError):                                   # the CLI prints it, exit 2
        assert issubclass(SourceError, err)


# ----------------------------------------------------------------------------------------------
# the source block, the full-only rule, no downloads
# ----------------------------------------------------------------------------------------------
def test_source_config_rules():
    assert SourceConfig().kind == "toy"
    assert SourceConfig(kind="hf", model="Qwen/Qwen2.5-0.5B", revision="abc123").model == "Qwen/Qwen2.5-0.5B"
    assert SourceConfig(kind="file", dataset="/data/well/shear_flow").dataset == "/data/well/shear_flow"
    bad = [({"model": "x/y"}, "model: only read when kind is hf or file"),
           ({"kind": "hf"}, "model: kind hf needs a model"),
           ({"kind": "hf", "dataset": "gsm8k"}, "model: kind hf needs a model"),
           ({"kind": "file"}, "dataset: kind file needs a dataset"),
           ({"kind": "file", "dataset": "/x", "revision": "main"}, "revision: kind file reads local files"),
           ({"kind": "hf", "model": ""}, "model"), ({"kind": "web"}, "kind"), ({"kind": "hf", "model": "a", "x": 1}, "x")]
    for kw, msg in bad:
        with pytest.raises(Exception, match=msg):
            SourceConfig(**kw)


class _Stage(StageConfig):
    seed: int = 0
    source: SourceConfig = SourceConfig()


def test_real_sources_only_at_full_profile():
    def params(block):
        return {"profile": "default", "papers": {"demo": {"train": block}}}
    ok = params({"profiles": {"full": {"source": {"kind": "hf", "model": "org/model"}}}})
    check_source_profiles(ok, "demo", "train", _Stage)                      # full may name a real source
    bad = params({"source": {"kind": "hf", "model": "org/model"}})
    with pytest.raises(ConfigError, match=r"^papers\.demo\.train\.source\.kind: hf sources run only at the full"):
        check_source_profiles(bad, "demo", "train", _Stage)
    smoke = params({"profiles": {"smoke": {"source": {"kind": "file", "dataset": "/x.npz"}}}})
    with pytest.raises(ConfigError, match=r"\(profile smoke\)\.source\.kind: file sources run only"):
        check_source_profiles(smoke, "demo", "train", _Stage)


def test_hub_names_refused_offline_and_local_checkpoint_loads(tok, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SourceError, match=r"^papers\.x\.train\.source\.model: 'some-org/some-model' is a hub "
                                          r"model name.*HF_HUB_OFFLINE is set"):
        pretrained_causal_lm(SourceConfig(kind="hf", model="some-org/some-model"), key="papers.x.train.source")
    with pytest.raises(SourceError, match=r"^k: \./nowhere/model does not exist"):
        resolve_ref("./nowhere/model", "k")
    with pytest.raises(SourceError, match="hub dataset name"):
        load_records("some-org/some-dataset", key="k")
    cfg = TinyLMConfig(arch="llama", d_model=32, n_layers=1, n_heads=4, n_kv_heads=1, max_positions=32)
    m = tiny_causal_lm(cfg, len(tok), seed=4, **_ids(tok))
    m.save_pretrained(tmp_path / "ckpt")
    tok.save_pretrained(tmp_path / "ckpt")
    src = SourceConfig(kind="hf", model=str(tmp_path / "ckpt"))
    m2 = pretrained_causal_lm(src)
    x = torch.tensor([tok("the quick brown fox")["input_ids"]])
    assert torch.equal(m(input_ids=x).logits, m2(input_ids=x).logits)
    t2 = load_tokenizer(tmp_path / "ckpt")
    assert t2("the quick brown fox")["input_ids"] == tok("the quick brown fox")["input_ids"]
    with pytest.raises(SourceError, match=r"^source\.model: .* is not a loadable causal LM"):
        pretrained_causal_lm(SourceConfig(kind="hf", model=str(tmp_path)))


def test_lora_starts_at_the_base_model_and_trains_only_adapters(tok):
    cfg = TinyLMConfig(arch="llama", d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, max_positions=32)
    base = tiny_causal_lm(cfg, len(tok), seed=5, **_ids(tok))
    x = torch.tensor([tok("birds sing in the early morning")["input_ids"]])
    ref = base(input_ids=x).logits.detach().clone()
    lora = add_lora(base, r=4, alpha=8.0)
    assert torch.equal(lora(input_ids=x).logits, ref)                      # B = 0 at init
    trainable = [n for n, p in lora.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert {n.split(".")[-4] for n in trainable} == {"q_proj", "k_proj", "v_proj", "o_proj"}
    # the GRPO adapter takes the LoRA-wrapped model unchanged
    ids, am = left_pad(tok, ["the cat", "a dog ran"])
    pol = HFCausalPolicy(lora, ids, am, max_new_tokens=3, eos_token_id=2, pad_token_id=0, backend="torch")
    roll = pol.rollout(torch.tensor([0, 1]), 2, torch.Generator().manual_seed(0))
    lp = pol.token_logprobs(roll)
    assert lp.shape == roll["tokens"].shape and bool(torch.isfinite(lp).all())
    lp.sum().backward()
    assert all(p.grad is not None for n, p in lora.named_parameters() if p.requires_grad and "lora_A" in n)
