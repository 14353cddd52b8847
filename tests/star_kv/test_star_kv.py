"""star_kv: soft threshold gradcheck, smooth degradation with rank, the quantized cache, the core effect
(heterogeneous ranks beat uniform at equal total), thresholds/allocations by hand, the lockstep cohort (a member
trained with others == trained alone), the phase schedule (equal KD steps, equal bytes), bad input, the smoke
pipeline."""
from __future__ import annotations

import json

import pytest
import torch

from stages.common.config import ConfigError
from stages.common.hf import TinyLMConfig, tiny_causal_lm
from stages.common.runner import load_config
from stages.star_kv.model import QuantSpec, SoftThreshold, StarKVLM
from stages.star_kv.train import (Config, Member, Windows, allocation_distance, budgets, global_allocation,
                                  global_threshold, run_cohort, set_global_thresholds, uniform_ranks)


def teacher(seed=0, std=0.15, d=32, layers=2, heads=4, kv=2):
    m = tiny_causal_lm(TinyLMConfig(arch="llama", d_model=d, n_layers=layers, n_heads=heads, n_kv_heads=kv, d_ff=40,
                                    max_positions=32), 64, seed=seed)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    return m.eval()


def test_soft_threshold_gradcheck_float64():
    sig = torch.tensor([0.05, 0.3, 0.52, 0.9, 1.7], dtype=torch.float64, requires_grad=True)
    alpha = torch.tensor([0.5, 0.5, 0.5, 0.5, 0.5], dtype=torch.float64, requires_grad=True)
    for c in (0.0, 0.3):
        assert torch.autograd.gradcheck(lambda s, a: SoftThreshold.apply(s, a, 7.0, c), (sig, alpha))


def test_decode_degrades_smoothly_with_rank():
    t = teacher(1)
    idx = torch.randint(0, 64, (2, 13), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = t(idx).logits
    errs = []
    for r in (8, 6, 4, 2, 1):   # head_dim 8, kv dim 16
        s = StarKVLM(t, "head").eval()
        for a in s.attn:
            a.fuse(ranks_k=[r, r], rank_v=2 * r, use_alpha=False)
        errs.append(float((s.decode_logits(idx) - ref).abs().mean()))
    assert errs[0] < 1e-5 and all(x < y for x, y in zip(errs, errs[1:])), errs


def test_mixed_precision_closer_than_int4_at_same_ranks():
    t = teacher(2)
    s = StarKVLM(t, "head").eval()
    for a in s.attn:
        a.fuse(ranks_k=[6, 5], rank_v=11, use_alpha=False)
    idx = torch.randint(0, 64, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        base = s(idx)
        e_mixed = float((s.decode_logits(idx, quant=QuantSpec(2, 4, 8)) - base).abs().mean())
        e_int4 = float((s.decode_logits(idx, quant=QuantSpec(0, 0, 8)) - base).abs().mean())
        e_fp16 = float((s.decode_logits(idx, quant=QuantSpec(6, 11, 16)) - base).abs().mean())
    assert 0 < e_fp16 < e_mixed < e_int4


def test_core_effect_heterogeneous_ranks_beat_uniform_at_equal_total():
    """KV heads with different spectra: one common threshold (σ-ranked) keeps more key energy than uniform ranks
    with the same total - the premise of learned per-head ranks."""
    t = teacher(3)
    with torch.no_grad():  # make KV head 1 of every layer nearly low-rank
        for layer in t.model.layers:
            W = layer.self_attn.k_proj.weight
            U, S, Vh = torch.linalg.svd(W[8:16], full_matrices=False)
            W[8:16] = U @ torch.diag(S * torch.logspace(0, -2, 8)) @ Vh
    het = StarKVLM(t, "head")
    set_global_thresholds(het, 12, 20)
    rk = [a.ranks()[0] for a in het.attn]
    for a, r in zip(het.attn, rk):   # the allocation only (exact σ kept, no σ−α shrink)
        a.fuse(ranks_k=r, rank_v=10, use_alpha=False)
    assert sum(map(sum, rk)) == 12 and any(r[0] != r[1] for r in rk)
    uni = StarKVLM(t, "head")
    ranks = uniform_ranks(12, 4, 8)
    for i, a in enumerate(uni.attn):
        a.fuse(ranks_k=ranks[2 * i:2 * i + 2], rank_v=10, use_alpha=False)

    def key_err(mm):
        x = torch.randn(64, 32, generator=torch.Generator().manual_seed(5))
        err = 0.0
        for a, layer in zip(mm.attn, t.model.layers):
            lk = torch.einsum("tc,hrc->thr", x, a.vk) * a.mask_k
            k = torch.einsum("thr,hdr->thd", lk, a.uk).reshape(64, 16)
            err += float((layer.self_attn.k_proj(x) - k).pow(2).sum())
        return err
    assert key_err(het) < 0.8 * key_err(uni)


def test_global_threshold_allocation_and_distance_by_hand():
    t = teacher(4)
    s = StarKVLM(t, "head")
    sig = torch.cat([(a.sk / a.scale_k).detach().reshape(-1) for a in s.attn])
    srt = torch.sort(sig, descending=True).values
    for total in (0, 1, 7, 31, 32):
        thr = global_threshold(s, "k", total)
        assert int((sig > thr).sum()) == total
        assert thr == (float(srt[total]) if total < 32 else 0.0)
    set_global_thresholds(s, 9, 13)
    assert s.rank_totals() == (9, 13)
    gk, gv = global_allocation(s, 9, 13)
    assert [a.ranks()[0] for a in s.attn] == gk and [a.ranks()[1] for a in s.attn] == gv
    d = allocation_distance([[3, 1], [2, 3]], [5, 4], [[2, 2], [2, 3]], [4, 5])
    assert d == {"moved_k": 1.0, "moved_v": 1.0, "moved_frac": 2 / 18}
    assert uniform_ranks(10, 4, 8) == [3, 3, 2, 2] and uniform_ranks(40, 4, 8) == [8, 8, 8, 8]


def _cfg(**kw):
    base = dict(seeds=[0], targets=[0.6], model={"d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
                                                 "d_ff": 40, "seq_len": 12},
                student_batch=3, alpha_lr=0.3, alpha_steps=3, kd_steps=3, phase3_steps=2, curve_every=2,
                curve_windows=2, eval_windows=3)
    base.update(kw)
    return Config(**base)


def test_member_trained_in_a_cohort_equals_trained_alone():
    """Lockstep training (one teacher forward, the summed losses of independent members, one backward) gives each
    member exactly the weights it gets when trained alone."""
    t = teacher(5)
    t.requires_grad_(False)
    cfg = _cfg()
    corpus = torch.randint(0, 64, (400,), generator=torch.Generator().manual_seed(3))
    val = torch.randint(0, 64, (3, 13), generator=torch.Generator().manual_seed(4))
    data = Windows(corpus, 3, 12, 5, 7)
    from stages.star_kv.train import llama_backbone
    bb = llama_backbone(t)

    def members(with_other):
        out = [Member("star_full", 0.6, StarKVLM(t, "head"), 1, *budgets(bb, 0.6, cfg))]
        if with_other:
            out.append(Member("star_jointk", 0.6, StarKVLM(t, "joint"), 1, *budgets(bb, 0.6, cfg)))
        return out
    alone = run_cohort(t, members(False), cfg, data, val[:2], val, {}, 5, 0)
    together = run_cohort(t, members(True), cfg, data, val[:2], val, {}, 5, 0)
    a, b = alone[0], next(m for m in together if m.arm == "star_full")
    for (k, x), (_, y) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        torch.testing.assert_close(x, y, atol=0, rtol=0, msg=k)
    assert a.steps == b.steps and sum(a.steps) == 5 and a.steps[0] + a.steps[1] == 3 and a.steps[2] == 2
    assert a.info["nll_after_phase3"] == b.info["nll_after_phase3"]


def test_bad_config_rejected():
    with pytest.raises(ConfigError, match="targets"):
        _load_with("train", {"targets": [1.2]})
    with pytest.raises(ConfigError, match="hi_bits"):
        _load_with("evaluate", {"hi_bits": 5})
    with pytest.raises(ConfigError, match="lo_bits"):
        _load_with("evaluate", {"lo_bits": 8})
    with pytest.raises(ConfigError, match="main_targets"):
        _load_with("train", {"main_targets": [0.5]})
    with pytest.raises(ConfigError, match="alpha_steps"):
        _load_with("train", {"alpha_steps": 10, "kd_steps": 5})
    with pytest.raises(ConfigError, match="include star_full"):
        _load_with("train", {"arms": ["uniform_kd", "svd_uniform"]})
    with pytest.raises(ConfigError, match="n_kv_heads"):
        _load_with("train", {"model": {"n_kv_heads": 3}})
    with pytest.raises(ValueError, match="workers: 2 would copy the pretrained teacher"):
        _cfg(workers=2, source={"kind": "hf", "model": "org/name", "dataset": "x.jsonl"})
    assert _cfg(workers=1, source={"kind": "hf", "model": "org/name", "dataset": "x.jsonl"}).workers == 1
    with pytest.raises(ConfigError, match="source.kind: hf sources run only at the full profile"):
        _load_with("prepare", {"source": {"kind": "hf", "model": "org/name", "dataset": "x.jsonl"},
                               "eval_sources": {"w": {"kind": "file", "dataset": "y.jsonl"}}}, profile="default")


def _load_with(block, override, *, stage=None, profile="smoke"):
    import tempfile
    from pathlib import Path

    import yaml

    from stages.common.paths import ROOT
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["papers"]["star_kv"][block].update(override)
    if block == "train" and "model" in override:
        params["papers"]["star_kv"][block]["profiles"]["smoke"]["model"].update(override["model"])
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "params.yaml"
        p.write_text(yaml.safe_dump(params))
        return load_config("star_kv", stage or block, profile, params_path=p)


def test_rank_larger_than_head_dim_rejected_at_config_load():
    # head_dim is 64 / 4 = 16 and the kv dim 2 × 16 = 32 at the default profile: rank 17 / 33 are rejected when
    # ANY stage loads its config (here prepare, before train has built a model), naming the evaluate key.
    for stage in ("prepare", "evaluate"):
        with pytest.raises(ConfigError, match=r"evaluate\.hi_ranks_k: 17 is larger than head_dim 16"):
            _load_with("evaluate", {"hi_ranks_k": 17}, stage=stage)
    with pytest.raises(ConfigError, match=r"evaluate\.hi_ranks_v: 33 .*limit 32"):
        _load_with("evaluate", {"hi_ranks_v": 33})
    _load_with("evaluate", {"hi_ranks_k": 16, "hi_ranks_v": 32}, profile="default")  # exactly the limits: allowed


def test_smoke_pipeline(smoke_run):
    smoke_run("star_kv")
    root = smoke_run.root
    metrics = json.loads((root / "reports" / "star_kv" / "metrics.json").read_text())
    claims = {c["name"]: c for c in metrics["claims"]}
    assert {"learned_ranks_beat_global_threshold_c60", "learned_ranks_beat_uniform_c60",
            "mixed_beats_int4_equal_bytes_c60", "within_ppl_budget_c60", "reduction_at_least_4x_c60",
            "equal_kd_steps", "full_rank_decode_matches_model", "decode_matches_dense_forward"} <= set(claims)
    assert {c["kind"] for c in metrics["claims"]} == {"finding", "check"}
    for name in ("equal_kd_steps", "full_rank_decode_matches_model", "decode_matches_dense_forward",
                 "controls_at_equal_bytes_c60"):
        assert claims[name]["verdict"] == "holds", name
    # at smoke ranks one fp16 scale is ~6% of the cache, so only the upper half of this check is scale-free
    assert metrics["metrics"]["arms"]["c60"]["star_full"]["int4_eq_over_mixed_bytes_max"] <= 1
    assert metrics["kernels"]["lowrank_attention"]["calls"] > 0 and metrics["kernels"]["lowrank_attention_quant"]["calls"] > 0
    assert metrics["kernels"]["lowrank_attention"]["parity_max_abs_err"] < 1e-4
    runs = json.loads((root / "data" / "star_kv" / "train" / "runs.json").read_text())["runs"]
    kd = {r["arm"]: r for r in runs if r["arm"] in ("star_full", "star_gatefuse", "star_global", "uniform_kd",
                                                     "star_jointk")}
    assert len({r["kd_steps_total"] for r in kd.values()}) == 1 and len(kd) == 5
    full = kd["star_full"]
    tot = (sum(map(sum, full["ranks_k"])), sum(full["ranks_v"]))
    for arm in ("star_global", "uniform_kd"):
        assert (sum(map(sum, kd[arm]["ranks_k"])), sum(kd[arm]["ranks_v"])) == tot
    assert tot[0] <= full["budget_k"] and tot[1] <= full["budget_v"]
    for r in kd.values():
        assert {"nll_before_fusion", "nll_after_fusion", "nll_after_phase3"} <= set(r)
    assert (root / "reports" / "star_kv" / "figures" / "rank_heatmap.png").exists()
    specs = json.loads((root / "reports" / "star_kv" / "plots" / "_specs.json").read_text())
    assert {"ppl_vs_compression", "phase3_curve"} <= set(specs)


def test_snapshot_corpus_gives_the_committed_default_bytes(run_stage):
    """The pinned snapshot gives the default corpus of the committed runs (digests read on 2026-12-04 from that run's
    interpreter, pyenv CPython 3.11.7, with corpus: live) on any interpreter."""
    import json

    meta = json.loads((run_stage("star_kv", "prepare") / "meta.json").read_text())
    assert meta["corpus"].startswith("snapshot of CPython 3.11.7")
    assert meta["sha256_16"] == {"train": "c6b8b0a79fee980d", "stdlib_val": "f2913eca5e33c860"}


@pytest.mark.parametrize("cfg,match", [
    ({"train_tokens": 1_000_000}, r"prepare\.train_tokens: 1000000 bytes requested, \d+ available \(the pinned "
                                  r"snapshot holds the first 19 files; set papers\.star_kv\.prepare\.corpus: live"),
    ({"glob": "a*.py"}, r"prepare\.glob: the pinned snapshot holds only '\*\.py' files"),
])
def test_snapshot_limits_are_config_errors(run_stage, cfg, match):
    from stages.common.config import ConfigError

    with pytest.raises(ConfigError, match=match):
        run_stage("star_kv", "prepare", **cfg)
    assert not any((run_stage.root / "star_kv-prepare").iterdir())
