"""star_kv on the real-model path (issue 41): a tiny random HF `LlamaForCausalLM` with GQA (n_kv_heads < n_heads)
built by stages/common/hf.py, a tokenizer trained here and WikiText-style records (a `text` column, jsonl) read
through stages.common.hf.load_records - STAR-KV's per-KV-head K SVD, joint V SVD, learned ranks (phase 1 with KD)
and the fused decode kernel (torch reference and the Triton path under TRITON_INTERPRET=1); at full rank the
compressed decode reproduces the model's own attention to ≤ 1e-4. Then the `full` profile's stages end to end on
the same fixtures (source kind file: a local checkpoint folder, jsonl corpus and held-out set). Nothing downloads."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml

from kernels.record import KernelRecord
from stages.common.hf import TinyLMConfig, tiny_causal_lm, train_tokenizer
from stages.common.sources import SourceError
from stages.star_kv.model import StarKVLM, llama_backbone
from stages.star_kv.prepare import load_text_tokens
from stages.star_kv.train import Config, Member, Windows, budgets, eval_windows, run_cohort

pytestmark = pytest.mark.real_source

LINES = [  # the WikiText-2 raw layout: headings, paragraphs and blank lines, one record per line
    " = Valkyria Chronicles III = \n", "", " Senjō no Valkyria 3 : Unrecorded Chronicles is a tactical role @-@ "
    "playing video game developed by Sega and Media.Vision for the PlayStation Portable . \n", "",
    " = = Gameplay = = \n", " As with previous games , the player controls a squad of soldiers across maps "
    "divided into turns , moving units and attacking enemies in real time . \n",
    " The game 's battle system , the BliTZ system , is carried over directly from the first game . \n", "",
    " = = Plot = = \n", " The story runs parallel to the first game and follows the Nameless , a penal military "
    "unit serving the nation of Gallia during the Second Europan War . \n",
    " Tower Building of Little Rock , Arkansas , was the first building of the city to be listed . \n",
]


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    d = tmp_path_factory.mktemp("wikitext")
    for split, reps in (("train", 6), ("test", 3)):
        with open(d / f"{split}.jsonl", "w") as f:
            for i in range(reps):
                for line in LINES[i % 3:] + LINES[: i % 3]:
                    f.write(json.dumps({"text": line}) + "\n")
    tok = train_tokenizer([x for x in LINES if x], d / "tokenizer.json", vocab_size=300)
    model = tiny_causal_lm(TinyLMConfig(arch="llama", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48,
                                        max_positions=64), len(tok), seed=0, pad_token_id=tok.pad_token_id,
                           bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    return d, tok, model


def test_star_kv_on_gqa_llama_fixture(fixture):
    d, tok, model = fixture
    ids = load_text_tokens(str(d / "train.jsonl"), tok, 500, key="fixture.dataset")
    assert ids.dtype == np.uint16 and ids.size == 500 and tok.eos_token_id in ids.tolist()
    with pytest.raises(SourceError, match="fixture.dataset: .* fewer than"):
        load_text_tokens(str(d / "test.jsonl"), tok, 10**6, key="fixture.dataset")
    bb = llama_backbone(model)
    assert bb.n_kv_heads < bb.n_heads and bb.head_dim == 8
    x = torch.from_numpy(ids.astype(np.int64))[:40].view(2, 20)
    with torch.no_grad():
        ref = model(x).logits
    # full rank: the latent cache (per-KV-head K SVD, joint V SVD) through the fused kernel == the model's attention
    rec = KernelRecord("cpu")
    s = StarKVLM(model, "head").eval()
    for a in s.attn:
        a.fuse(use_alpha=False)
    assert s.rank_totals() == (bb.n_layers * bb.kv_dim, bb.n_layers * bb.kv_dim)
    for backend in ("torch", "triton"):
        out = s.decode_logits(x, backend=backend, rec=rec)
        assert float((out - ref).abs().max()) <= 1e-4, backend
    assert rec.to_dict()["lowrank_attention"]["calls"] == 2 * 2 * 20
    # learned ranks: phase 1 (KD + pressure) on the fixture tokens until the budgets are met, then fusion
    model.requires_grad_(False)
    cfg = Config(seeds=[0], targets=[0.6], model={"d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
                                                  "d_ff": 48, "seq_len": 16},
                 student_batch=4, alpha_lr=0.2, alpha_steps=8, kd_steps=8, phase3_steps=2, curve_every=4,
                 curve_windows=2, eval_windows=4)
    corpus = torch.from_numpy(ids.astype(np.int64))
    val = eval_windows(corpus[-80:], 16, 4)
    bk, bv = budgets(bb, 0.6, cfg)
    m = run_cohort(model, [Member("star_full", 0.6, StarKVLM(model, "head"), 1, bk, bv)], cfg,
                   Windows(corpus, 4, 16, 10, 1), val[:2], val, {}, 10, 0)[0]
    rk, rv = m.model.rank_totals()
    assert m.info["budget_met"] and rk <= bk < bb.n_layers * bb.kv_dim and rv <= bv
    alphas = [float(v) for a in m.model.attn for v in a.alpha_k.reshape(-1)]
    assert all(a.fused for a in m.model.attn) and alphas == [0.0] * len(alphas)   # fused: α folded into V
    ranks = [a.ranks()[0] for a in m.model.attn]
    assert all(0 < r <= bb.head_dim for layer in ranks for r in layer)
    st = m.model.eval()
    with torch.no_grad():
        dense = st(x)
        tri = st.decode_logits(x, backend="triton", rec=rec)
        torch.testing.assert_close(tri, st.decode_logits(x, backend="torch"), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(tri, dense, atol=1e-4, rtol=1e-4)


def test_full_profile_stages_on_fixture(fixture, tmp_path):
    """The `full` profile's real path end to end: prepare reads the corpus and held-out set through load_records
    with the checkpoint's tokenizer, train distils from the local checkpoint (no teacher training), evaluate runs
    the decode path on it."""
    from stages.common.paths import ROOT
    from stages.common.runner import run_stage

    d, tok, model = fixture
    ckpt = tmp_path / "ckpt"
    model.save_pretrained(ckpt)
    tok.save_pretrained(ckpt)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    p = params["papers"]["star_kv"]
    p["prepare"]["profiles"]["full"] = {
        "source": {"kind": "file", "model": str(ckpt), "dataset": str(d / "train.jsonl")},
        "eval_sources": {"wikitext2": {"kind": "file", "dataset": str(d / "test.jsonl")}},
        "train_tokens": 400, "val_tokens": 70}
    p["train"]["profiles"]["full"] = {
        "source": {"kind": "file", "model": str(ckpt)}, "workers": 1, "seeds": [0], "targets": [0.6],
        "main_targets": [0.6],
        "arms": ["star_full", "star_global", "uniform_kd", "svd_uniform"], "model": {"seq_len": 16},
        "student_batch": 2, "alpha_lr": 0.2, "alpha_steps": 3, "kd_steps": 3, "phase3_steps": 2, "curve_every": 2,
        "curve_windows": 2, "eval_windows": 2, "trainer": {"accelerator": "cpu", "precision": "32-true"}}
    p["evaluate"]["profiles"]["full"] = {"hi_ranks_k": 2, "hi_ranks_v": 4, "full_rank_windows": 2}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    for stage in ("prepare", "train", "evaluate"):
        run_stage("star_kv", stage, "full", root=tmp_path, params_path=tmp_path / "params.yaml")
    meta = json.loads((tmp_path / "data/star_kv/prepare/meta.json").read_text())
    assert meta["eval_sets"] == ["wikitext2"] and meta["vocab_size"] == len(tok) and meta["train_tokens"] == 400
    runs = json.loads((tmp_path / "data/star_kv/train/runs.json").read_text())
    assert runs["teacher"]["kind"] == "file" and {r["arm"] for r in runs["runs"]} == {"star_full", "star_global",
                                                                                      "uniform_kd", "svd_uniform"}
    res = json.loads((tmp_path / "data/star_kv/evaluate/results.json").read_text())
    assert res["full_rank_max_dlogit"] <= 1e-4
    assert all(r["path"] == "decode" and r["decode_max_dlogit"] <= 1e-4 for r in res["rows"])
