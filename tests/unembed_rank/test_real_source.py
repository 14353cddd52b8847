"""unembed_rank on the real-model path (issue 41): HF checkpoints saved with save_pretrained at test time (an
untied Llama whose W_U is padded past the tokenizer, a tied Llama, a GPT-2), text corpora in the Pile-10K /
Paloma jsonl layouts and a tokenizer trained here. The effective rank of lm_head / the tied embedding is read
through the evaluate hook and checked against an SVD of the weights read straight from the safetensors file;
the ID / OOD losses against a plain HF forward; then the train hook's sweep on the fixture corpus. Nothing
downloads."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest
import torch
import yaml
from safetensors.torch import load_file

from kernels.record import KernelRecord
from stages.common.hf import TinyLMConfig, tiny_causal_lm, train_tokenizer
from stages.common.sources import SourceError
from stages.unembed_rank.geometry import geometry
from stages.unembed_rank.hf_source import geometry_large, load_text_tokens, unembedding

pytestmark = pytest.mark.real_source

CODE = ["def add(a, b):\n    return a + b\n", "for i in range(10):\n    print(i * i)\n",
        "class Point:\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n"]
PROSE = ["The river runs past the old mill and into the valley.", "Scholars disagree about the date of the charter.",
         "A light rain fell over the harbour all afternoon.", "The committee will publish its report in May."]


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    d = tmp_path_factory.mktemp("pile")
    with open(d / "pile10k.jsonl", "w") as f:                        # NeelNanda/pile-10k layout
        for i in range(120):
            f.write(json.dumps({"text": " ".join(PROSE[(i + j) % 4] for j in range(3)),
                                "meta": {"pile_set_name": "Pile-CC"}}) + "\n")
    with open(d / "paloma_code.jsonl", "w") as f:                     # Paloma layout (text, id, source, metadata)
        for i in range(60):
            f.write(json.dumps({"text": CODE[i % 3] + CODE[(i + 1) % 3], "id": f"doc{i}",
                                "source": "dolma-100-programing-languages", "metadata": {"lang": "python"}}) + "\n")
    tok = train_tokenizer(PROSE + CODE, d / "tokenizer.json", vocab_size=300)
    return d, tok


def _save(tok, path, cfg, vocab, seed):
    m = tiny_causal_lm(cfg, vocab, seed=seed, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                       eos_token_id=tok.eos_token_id)
    m.save_pretrained(path)
    tok.save_pretrained(path)
    return m


def test_unembedding_geometry_of_hf_checkpoints(fixture, tmp_path):
    from stages.common.paths import ROOT
    from stages.common.runner import load_config
    from stages.unembed_rank.hf_source import run_full_evaluate

    d, tok = fixture
    V = len(tok)
    cks = {"untied_padded": (TinyLMConfig(arch="llama", d_model=32, n_layers=1, n_heads=4, d_ff=64), V + 6, 0),
           "tied": (TinyLMConfig(arch="llama", d_model=24, n_layers=1, n_heads=2, d_ff=48, tie_embeddings=True), V, 1),
           "gpt2": (TinyLMConfig(arch="gpt2", d_model=16, n_layers=1, n_heads=2, max_positions=64, tie_embeddings=True),
                    V, 2)}
    models = {n: _save(tok, tmp_path / n, c, v, s) for n, (c, v, s) in cks.items()}
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["papers"]["unembed_rank"]["evaluate"]["profiles"]["full"] = {
        "checkpoints": {n: {"kind": "file", "model": str(tmp_path / n)} for n in cks},
        "eval_source": {"kind": "file", "dataset": str(d / "pile10k.jsonl")},
        "ood_source": {"kind": "file", "dataset": str(d / "paloma_code.jsonl")},
        "hf_seq_len": 16, "hf_eval_tokens": 400, "max_windows": 6}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    _, cfg, _ = load_config("unembed_rank", "evaluate", "full", tmp_path / "params.yaml")
    out = tmp_path / "out"
    out.mkdir()
    with torch.no_grad():
        run_full_evaluate(cfg, SimpleNamespace(out=out))
    res = json.loads((out / "hf" / "checkpoints.json").read_text())
    rows = {r["checkpoint"]: r for r in res["rows"]}
    assert {n: r["tied"] for n, r in rows.items()} == {"untied_padded": False, "tied": True, "gpt2": True}
    assert rows["untied_padded"]["padded_rows"] == 6 and rows["untied_padded"]["vocab_rows"] == V
    for name in cks:
        sd = load_file(str(tmp_path / name / "model.safetensors"))      # the weights as stored, no HF model class
        key = "lm_head.weight" if "lm_head.weight" in sd else next(k for k in sd if k.endswith(("embed_tokens.weight",
                                                                                                "wte.weight")))
        w = sd[key][:V].double().numpy()
        s = np.linalg.svd(w, compute_uv=False)
        p = s / s.sum()
        erank = 100 * np.exp(-(p * np.log(p)).sum()) / min(w.shape)
        assert abs(rows[name]["erank"] - erank) < 1e-6 and rows[name]["d_model"] == w.shape[1]
        q = s ** 2 / (s ** 2).sum()
        assert abs(rows[name]["erank_sq"] - 100 * np.exp(-(q * np.log(q)).sum()) / min(w.shape)) < 1e-6
    # ID loss through the fused kernel == a plain HF forward's cross-entropy on the same windows
    ids = load_text_tokens(str(d / "pile10k.jsonl"), tok, 400)
    win = torch.from_numpy(ids[:6 * 17]).view(6, 17)
    for name, m in models.items():
        with torch.no_grad():
            logits = m.eval()(win[:, :-1]).logits[..., :V] if name != "untied_padded" else m(win[:, :-1]).logits
            ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(), win[:, 1:].reshape(-1))
        assert abs(rows[name]["val_loss"] - float(ce)) < 1e-4, name
    assert set(res["spearman"]["val_loss"]) >= {"erank", "h_erank", "isotropy"}
    kern = json.loads((out / "hf" / "kernels.json").read_text())
    assert kern["fused_linear_ce"]["calls"] == 3 * 2 and kern["fused_linear_ce"]["backend"] == "torch-reference"


def test_sweep_on_fixture_corpus(fixture, tmp_path):
    from stages.common.paths import ROOT
    from stages.common.runner import load_config
    from stages.unembed_rank.hf_source import run_full_train

    d, tok = fixture
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["papers"]["unembed_rank"]["train"]["profiles"]["full"] = {
        "source": {"kind": "file", "tokenizer": str(d / "tokenizer.json"), "dataset": str(d / "pile10k.jsonl")},
        "ood_source": {"kind": "file", "dataset": str(d / "paloma_code.jsonl")},
        "hf": {"train_tokens": 1500, "eval_tokens": 200}, "seeds": [3], "batch_sizes": [2, 4],
        "weight_decays": [0.0, 1.0], "lrs": [0.01], "tokens": 512, "n_evals": 2, "eval_windows": 4,
        "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "seq_len": 16}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    _, cfg, _ = load_config("unembed_rank", "train", "full", tmp_path / "params.yaml")
    out = tmp_path / "out"
    out.mkdir()
    run_full_train(cfg, SimpleNamespace(out=out))
    info = json.loads((out / "hf" / "runs.json").read_text())
    assert [(r["batch_size"], r["weight_decay"], r["steps"], r["tokens"]) for r in info["runs"]] == \
        [(2, 0.0, 16, 512), (2, 1.0, 16, 512), (4, 0.0, 8, 512), (4, 1.0, 8, 512)]   # equal token budget
    h = pl.read_csv(out / "hf" / "history.csv")
    assert h.height == 4 * 3 and sorted(set(h["frac"].to_list())) == [0.0, 0.5, 1.0]
    init = h.filter(pl.col("step") == 0)
    assert init["erank"].n_unique() == 1 and init["val_loss"].n_unique() == 1       # same seed: same init
    last = h.filter(pl.col("frac") == 1.0)
    assert (last["val_loss"] < init["val_loss"]).all()
    assert ((last["erank"] > 0) & (last["erank"] <= 100)).all()
    kern = json.loads((out / "hf" / "kernels.json").read_text())
    assert kern["fused_linear_ce"]["calls"] == (16 + 16 + 8 + 8) + 4 * 3 * 2        # train steps + eval passes
    # config load refuses a real sweep without an OOD corpus, and real sources outside the full profile
    params["papers"]["unembed_rank"]["train"]["profiles"]["full"]["ood_source"] = {"kind": "toy"}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(Exception, match="ood_source.dataset: the real sweep's out-of-domain corpus is missing"):
        load_config("unembed_rank", "train", "full", tmp_path / "params.yaml")
    params["papers"]["unembed_rank"]["evaluate"]["profiles"]["smoke"]["checkpoints"] = {
        "x": {"kind": "file", "model": "/nonexistent"}}
    params["papers"]["unembed_rank"]["evaluate"]["profiles"]["smoke"]["eval_source"] = {"kind": "file", "dataset": "a.jsonl"}
    params["papers"]["unembed_rank"]["evaluate"]["profiles"]["smoke"]["ood_source"] = {"kind": "file", "dataset": "b.jsonl"}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(Exception, match="only at the full profile"):
        load_config("unembed_rank", "evaluate", "smoke", tmp_path / "params.yaml")


def test_text_corpus_bad_inputs(fixture, tmp_path):
    d, tok = fixture
    with pytest.raises(SourceError, match=r"^k: .*does not exist"):
        load_text_tokens(str(tmp_path / "none.jsonl"), tok, 10, key="k")
    (tmp_path / "bad.jsonl").write_text('{"text": "a b"}\n{"text": "c\n')
    with pytest.raises(SourceError, match=r"^k: .*could not be read"):
        load_text_tokens(str(tmp_path / "bad.jsonl"), tok, 10, key="k")
    (tmp_path / "nocol.jsonl").write_text('{"content": "a b"}\n')
    with pytest.raises(SourceError, match=r"^k: .* lacks column 'text' \(columns: content\)"):
        load_text_tokens(str(tmp_path / "nocol.jsonl"), tok, 10, key="k")
    with pytest.raises(SourceError, match="fewer than the 1000000 asked for"):
        load_text_tokens(str(d / "paloma_code.jsonl"), tok, 10**6, key="k")
    ids = load_text_tokens(str(d / "paloma_code.jsonl"), tok, 50, key="k")
    first = tok(CODE[0] + CODE[1], add_special_tokens=False)["input_ids"]
    assert ids.dtype == np.int64 and ids[:len(first)].tolist() == first and ids[len(first)] == tok.eos_token_id
    m = tiny_causal_lm(TinyLMConfig(arch="llama", d_model=16, n_layers=1, n_heads=2), len(tok), seed=0)
    with pytest.raises(SourceError, match="rows"):
        unembedding(m, len(tok) + 1)
    w, tied = unembedding(m, 10)
    assert w.shape == (10, 16) and not tied
    assert KernelRecord("cpu").backend == "torch"
    # the Gram-free mean cosine agrees with the toy's Gram-matrix geometry (zero rows included: padded vocab)
    g = torch.Generator().manual_seed(4)
    w = torch.randn(37, 9, generator=g) + 0.3
    w[5] = 0.0
    hh = torch.randn(11, 9, generator=g)
    a, b = geometry_large(w, hh), geometry(w, hh)
    assert a.keys() == b.keys() and all(abs(a[k] - b[k]) < 1e-9 for k in a)


def test_committed_full_profile_refuses_hub_names_offline(tmp_path):
    from stages.common.runner import load_config
    from stages.unembed_rank.hf_source import run_full_evaluate, run_full_train

    _, tcfg, _ = load_config("unembed_rank", "train", "full")
    with pytest.raises(SourceError, match=r"^papers\.unembed_rank\.train\.source\.model: 'EleutherAI/pythia-14m' "
                                          r".*HF_HUB_OFFLINE"):
        run_full_train(tcfg, SimpleNamespace(out=tmp_path))
    _, ecfg, _ = load_config("unembed_rank", "evaluate", "full")
    assert len(ecfg.checkpoints) == 5
    with pytest.raises(SourceError, match=r"^papers\.unembed_rank\.evaluate\.checkpoints\.pythia_14m\.model: "
                                          r"'EleutherAI/pythia-14m' .*HF_HUB_OFFLINE") as e:
        run_full_evaluate(ecfg, SimpleNamespace(out=tmp_path))
    assert "\n" not in str(e.value) and not any(tmp_path.iterdir())
