"""opus on the real-model path (issue 41): a 200-document parquet fixture in the FineWeb schema, a jsonl
benchmark-style target set (the proxy), a tokenizer trained here and a tiny random HF `LlamaForCausalLM`;
OPUS's per-sample gradient sketches (ghost capture on the HF forward + the fused CountSketch kernel) are
checked against autograd per-document gradients, then selection and the online loop run end to end, and the
`full` profile's train config runs `run_full` on local files. Nothing downloads."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from kernels.ghost_countsketch import countsketch
from kernels.record import KernelRecord
from stages.common.hf import TinyLMConfig, tiny_causal_lm, train_tokenizer
from stages.common.sources import SourceError
from stages.opus.ghost import linear_layers
from stages.opus.hf_source import (FINEWEB_COLUMNS, batch_loss, capture_hf_linear_grads, hf_per_sample_loss, load_web_corpus,
                                   score_hf, tokenize_docs, train_selected)
from stages.opus.precondition import preconditioner_from_optimizer
from stages.opus.selection import OpusScorer, select_opus
from stages.opus.train import ArmConfig

pytestmark = pytest.mark.real_source

SCIENCE = ["The cell membrane controls what enters the cell .", "Photosynthesis turns light into sugar in leaves .",
           "Water boils at a lower temperature on a high mountain .", "The moon orbits the earth every month .",
           "Atoms bond to form molecules such as water ."]
SPORTS = ["The striker scored twice in the second half .", "Fans cheered as the team lifted the cup .",
          "The coach changed tactics after the break .", "A late goal won the derby for the home side ."]
SPAM = ["Buy cheap watches now click here best price !!!", "Win a free phone today limited offer click !!!"]


def _docs(n: int) -> list[str]:
    kinds = [SCIENCE, SPORTS, SPAM]
    out = []
    for i in range(n):
        src = kinds[i % 3]
        k = 1 + i % 3
        out.append(" ".join(src[(i + j) % len(src)] for j in range(k)))
    return out


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    d = tmp_path_factory.mktemp("fineweb")
    texts = _docs(200)
    table = pa.table({"text": texts, "id": [f"<urn:uuid:{i:08d}>" for i in range(200)],
                      "dump": ["CC-MAIN-2024-10"] * 200, "url": [f"https://example.org/{i}" for i in range(200)],
                      "date": ["2024-02-21T08:00:00Z"] * 200, "file_path": ["s3://commoncrawl/x.warc.gz"] * 200,
                      "language": ["en"] * 200, "language_score": [0.95] * 200,
                      "token_count": [len(t.split()) for t in texts]})
    pq.write_table(table, d / "000_00000.parquet")
    with open(d / "target.jsonl", "w") as f:                       # benchmark-style target set: a text column
        for i in range(24):
            f.write(json.dumps({"text": f"Question : {SCIENCE[i % 5]} Answer : {SCIENCE[(i + 2) % 5]}"}) + "\n")
    tok = train_tokenizer(SCIENCE + SPORTS + SPAM, d / "tokenizer.json", vocab_size=300)
    model = tiny_causal_lm(TinyLMConfig(arch="llama", d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=48,
                                        max_positions=64), len(tok), seed=3, pad_token_id=tok.pad_token_id,
                           bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    return d, tok, model


def test_opus_on_hf_llama_fineweb_fixture(fixture):
    d, tok, model = fixture
    ds = load_web_corpus(str(d / "000_00000.parquet"), key="fixture.dataset")
    assert len(ds) == 200 and set(FINEWEB_COLUMNS) <= set(ds.column_names)
    ids, mask = tokenize_docs(ds["text"], tok, 40)
    assert ids.shape[0] == 200 and ids.shape[1] <= 40
    lens = mask.sum(1)
    assert int(lens.min()) < int(lens.max())                                # padding really occurs
    assert bool((ids[mask == 0] == tok.pad_token_id).all()) and bool((mask[:, 0] == 1).all())
    assert all(int(ids[i, lens[i] - 1]) == tok.eos_token_id for i in range(200) if lens[i] < 40)
    tgt = load_web_corpus(str(d / "target.jsonl"), key="fixture.proxy")
    pids, pmask = tokenize_docs(tgt["text"], tok, 40)

    # a non-trivial AdamW state: two steps on other docs (the preconditioner then reads v̂)
    model = model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0)
    for s in range(2):
        opt.zero_grad()
        hf_per_sample_loss(model, ids[s * 8:(s + 1) * 8], mask[s * 8:(s + 1) * 8]).mean().backward()
        opt.step()
    opt.zero_grad(set_to_none=True)
    scorer = OpusScorer(model, 64, seed=5)
    precond = preconditioner_from_optimizer(opt, scorer.weights(model))
    assert precond.kind == "adamw" and precond.eta == 1.0
    names = list(linear_layers(model))
    assert {"lm_head"} <= set(names) and any(n.endswith("q_proj") for n in names)

    rec = KernelRecord("cpu")
    sketch = lambda *x: rec.call("ghost_countsketch", __import__("kernels.ghost_countsketch", fromlist=["x"])
                                 .ghost_countsketch, *x)
    scored = score_hf(scorer, model, (ids, mask), (pids[:8], pmask[:8]), precond, sketch_fn=sketch)
    assert scored.phi.shape == (200, 64 * len(names)) and scored.psi.shape == (64 * len(names),)
    assert rec.to_dict()["ghost_countsketch"]["calls"] == len(names)
    assert rec.to_dict()["ghost_countsketch"]["backend"] == "torch-reference"

    # chunked capture (the real path's memory bound) gives the same φ, ψ and losses
    chunked = score_hf(scorer, model, (ids, mask), (pids[:8], pmask[:8]), precond, chunk=37, backend="torch")
    torch.testing.assert_close(chunked.phi, scored.phi, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(chunked.psi, scored.psi, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(chunked.losses, scored.losses)
    # micro-batched training loss: same value and gradient as the whole batch (token-weighted mean)
    w_head = model.get_output_embeddings().weight
    model.zero_grad(set_to_none=True)
    whole = batch_loss(model, ids[:12], mask[:12])
    g_whole = torch.autograd.grad(whole, w_head)[0]
    model.zero_grad(set_to_none=True)
    parts = batch_loss(model, ids[:12], mask[:12], micro_batch=5, backward=True)
    torch.testing.assert_close(parts, whole.detach(), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(w_head.grad, g_whole, atol=1e-7, rtol=1e-5)
    model.zero_grad(set_to_none=True)

    # independent reference: each document ALONE (no padding), autograd weight gradient, P ⊙ G, CountSketch
    weights = scorer.weights(model)
    for i in (0, 1, 7, 150):
        n = int(lens[i])
        model.eval()
        loss = hf_per_sample_loss(model, ids[i:i + 1, :n], mask[i:i + 1, :n])[0]
        assert abs(float(loss.detach()) - float(scored.losses[i])) < 1e-5          # padding does not change the loss
        grads = torch.autograd.grad(loss, [weights[k] for k in names])
        ref = torch.cat([countsketch(precond.diag[k] * g, *scorer.sketches[k], 64) for k, g in zip(names, grads)])
        torch.testing.assert_close(scored.phi[i], ref, atol=1e-6, rtol=1e-4)
    model.eval()
    mean_loss = hf_per_sample_loss(model, pids[:8], pmask[:8]).mean()
    grads = torch.autograd.grad(mean_loss, [weights[k] for k in names])
    psi_ref = torch.cat([countsketch(g, *scorer.sketches[k], 64) for k, g in zip(names, grads)])
    torch.testing.assert_close(scored.psi, psi_ref, atol=1e-6, rtol=1e-4)

    # selection: K = ρN picks, unique; greedy's first pick is the best aligned document
    gen = torch.Generator().manual_seed(0)
    picks, utils = select_opus(scored, 100, 0.9, False, gen)
    assert picks.shape == (100,) and len(set(picks.tolist())) == 100 and int(picks.max()) < 200
    g_picks, g_utils = select_opus(scored, 5, 0.9, True, None)
    assert int(g_picks[0]) == int(torch.argmax(scored.alignment()))
    eta = scored.eta / 5                                  # the per-sample step η/K of select_opus
    for r, j in enumerate(g_picks.tolist()):               # U_j = η⟨φ_j,ψ⟩ − η² Σ_{earlier picks p} ⟨φ_j,φ_p⟩
        hand = eta * float(scored.phi[j] @ scored.psi) - eta ** 2 * sum(float(scored.phi[j] @ scored.phi[p])
                                                                        for p in g_picks[:r].tolist())
        assert abs(float(g_utils[r]) - hand) <= 1e-6 * max(1.0, abs(hand))

    # the online loop: 3 steps, N=40 candidates, K=20 kept, AdamW preconditioner from the 2nd step on
    fresh = tiny_causal_lm(TinyLMConfig(arch="llama", d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=48,
                                        max_positions=64), len(tok), seed=4, pad_token_id=tok.pad_token_id)
    opt2 = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    rec2 = KernelRecord("cpu")
    run = train_selected(fresh, ArmConfig(name="opus_adamw", selector="opus"), (ids, mask), (pids[8:], pmask[8:]),
                         (pids[:8], pmask[:8]), steps=3, n=40, k=20, seed=1, sketch_size=32, tau=0.9, eta_scale=1.0,
                         proxy_batch=6, optimizer=opt2, eval_every=1, rec=rec2)
    assert run["precond_kinds"] == {"adamw-warmup-identity": 1, "adamw": 2}
    assert [s for s, _ in run["val_curve"]] == [0, 1, 2, 3] and run["val_curve"][-1][1] < run["val_curve"][0][1]
    assert all(len(p) == 20 and len(set(p)) == 20 for p in run["picked"])
    assert rec2.to_dict()["ghost_countsketch"]["calls"] == 3 * len(names)
    assert run["update_tokens"] == sum(int(mask[p].sum()) for p in run["picked"])


def test_full_profile_train_on_fixture(fixture, tmp_path):
    """The full profile's train config with file sources (a save_pretrained checkpoint, the parquet corpus, the
    jsonl target set) validates and runs run_full: random and OPUS arms from the same checkpoint."""
    from stages.common.paths import ROOT
    from stages.common.runner import load_config
    from stages.opus.hf_source import run_full

    d, tok, model = fixture
    ckpt = tmp_path / "ckpt"
    model.save_pretrained(ckpt)
    tok.save_pretrained(ckpt)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["papers"]["opus"]["train"]["profiles"]["full"] = {
        "source": {"kind": "file", "model": str(ckpt), "dataset": str(d / "000_00000.parquet")},
        "proxy_source": {"kind": "file", "dataset": str(d / "target.jsonl")},
        "hf": {"seq_len": 24, "val_docs": 8, "arms": ["random", "opus_adamw"], "micro_batch": 7, "steps": 2}, "seeds": [0], "buffer_size": 20,
        "select_k": 10, "sketch_size": 16, "proxy_batch": 4, "eval_every": 1, "device": "cpu",
        "trainer": {"max_steps": 5}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    _, cfg, prof = load_config("opus", "train", "full", tmp_path / "params.yaml")
    assert prof == "full" and cfg.source.kind == "file"
    out = tmp_path / "out"
    out.mkdir()
    run_full(cfg, SimpleNamespace(out=out))
    res = json.loads((out / "hf" / "runs.json").read_text())
    assert res["corpus_docs"] == 200 and res["target_docs"] == 24 and res["k"] == 10
    assert [r["arm"] for r in res["runs"]] == ["random", "opus_adamw"]
    assert all(len(r["val_curve"]) == 3 for r in res["runs"])
    assert res["runs"][0]["val_curve"][0] == res["runs"][1]["val_curve"][0]      # same checkpoint, same start
    kern = json.loads((out / "hf" / "kernels.json").read_text())
    assert kern["ghost_countsketch"]["calls"] == 2 * 3 * len(linear_layers(model))   # 2 steps x ceil(20/7) chunks
    # config load refuses an hf arm the real path cannot run, and a missing target set
    full = params["papers"]["opus"]["train"]["profiles"]["full"]
    for change, msg in (({"hf": {"arms": ["opus_window"]}}, "hf.arms: opus_window uses window"),
                        ({"hf": {"arms": ["nope"]}}, r"hf.arms: \['nope'\] are not in arms"),
                        ({"proxy_source": {"kind": "toy"}}, "proxy_source.dataset: the benchmark target set")):
        params["papers"]["opus"]["train"]["profiles"]["full"] = {**full, **change}
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
        with pytest.raises(Exception, match=msg):
            load_config("opus", "train", "full", tmp_path / "params.yaml")
    params["papers"]["opus"]["train"]["profiles"]["full"] = full
    # a real source is refused outside the full profile
    params["papers"]["opus"]["train"]["profiles"]["smoke"].update(source=full["source"], proxy_source=full["proxy_source"],
                                                                  hf=full["hf"])
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(Exception, match="only at the full profile"):
        load_config("opus", "train", "full", tmp_path / "params.yaml")


def test_web_corpus_bad_inputs(tmp_path):
    with pytest.raises(SourceError, match=r"^k\.dataset: .*does not exist") as e:
        load_web_corpus(str(tmp_path / "missing.parquet"), key="k.dataset")
    assert "\n" not in str(e.value)
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 this is not a parquet file")
    with pytest.raises(SourceError, match=r"^k\.dataset: .*could not be read"):
        load_web_corpus(str(bad), key="k.dataset")
    badj = tmp_path / "bad.jsonl"
    badj.write_text('{"text": "ok"}\n{"text": \n')
    with pytest.raises(SourceError, match=r"^k\.dataset: .*could not be read"):
        load_web_corpus(str(badj), key="k.dataset")
    pq.write_table(pa.table({"content": ["a b c"], "id": ["1"]}), tmp_path / "nocol.parquet")
    with pytest.raises(SourceError, match=r"lacks column 'text' \(columns: content, id\)"):
        load_web_corpus(str(tmp_path / "nocol.parquet"), key="k.dataset")
    pq.write_table(pa.table({"text": ["a b c"], "id": [7]}), tmp_path / "intid.parquet")
    with pytest.raises(SourceError, match="column 'id' is int64, expected string"):
        load_web_corpus(str(tmp_path / "intid.parquet"), key="k.dataset")
    pq.write_table(pa.table({"text": ["  ", "\n"]}), tmp_path / "blank.parquet")
    with pytest.raises(SourceError, match="no non-blank document"):
        load_web_corpus(str(tmp_path / "blank.parquet"), key="k.dataset")
    pq.write_table(pa.table({"text": ["  ", "one doc", None]}), tmp_path / "some.parquet")
    assert load_web_corpus(str(tmp_path / "some.parquet"))["text"] == ["one doc"]


def test_committed_full_profile_refuses_hub_names_offline(tmp_path):
    """The committed full profile names hub models; offline (tests) the real path stops with one line naming
    the key before reading anything (nothing is downloaded)."""
    from stages.common.runner import load_config
    from stages.opus.hf_source import run_full

    _, cfg, _ = load_config("opus", "train", "full")
    with pytest.raises(SourceError, match=r"^papers\.opus\.train\.source\.model: 'Qwen/Qwen2\.5-0\.5B' .*HF_HUB_OFFLINE") as e:
        run_full(cfg, SimpleNamespace(out=tmp_path))
    assert "\n" not in str(e.value) and not any(tmp_path.iterdir())
