"""report: claims (findings at the compression level fixed in params), tables, rank heatmaps, plots.

    python -m stages report star_kv
"""
from __future__ import annotations

import json
import math

import matplotlib
import numpy as np
import polars as pl
from pydantic import Field

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from stages.common.claims import Better, Bound, Claim  # noqa: E402
from stages.common.config import Fraction, ReportConfig  # noqa: E402
from stages.common.reporting import Report  # noqa: E402
from stages.common.runner import StageContext  # noqa: E402

ARM_ORDER = ("star_full", "star_gatefuse", "star_global", "star_jointk", "uniform_kd", "svd_uniform", "star_nokd")
KD_ARMS = ("star_full", "star_gatefuse", "star_global", "star_jointk", "uniform_kd")


class Config(ReportConfig):
    claim_target: Fraction = Field(0.6, description="the compression level C every finding is tested at (the "
                                                    "paper's own run uses C = 0.6), fixed before the run")


def ctag(c: float) -> str:
    return f"c{round(c * 100)}"


def mean(xs) -> float:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return sum(xs) / len(xs) if xs else float("nan")


def sd(xs) -> float:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if len(xs) < 2:
        return float("nan")
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def build(res: dict, runs: dict, claim_target: float) -> tuple[list, dict]:
    rows = res["rows"]
    by_run = {r["key"]: r for r in runs["runs"]}
    teacher_items = res["teacher_nll_items"]
    teacher_nll = mean(teacher_items)
    m: dict = {"teacher": {"ppl": math.exp(teacher_nll), "nll": teacher_nll,
                           "train_nll": runs["teacher_nll"]},
               "unigram_ppl": math.exp(res["unigram_nll"]), "dense_kv_bytes_fp16": res["dense_kv_bytes_fp16"],
               "full_rank_max_dlogit": res["full_rank_max_dlogit"], "arms": {}, "checks": {}}
    ct = ctag(claim_target)
    claim_arms = {"star_full", "star_gatefuse", "star_global", "uniform_kd"}
    kd_totals, decode_err, quant_dnll, quant_dlogit = [], [], [], []
    for c in res["targets"]:
        t = ctag(c)
        arms = {}
        for arm in ARM_ORDER:
            per = sorted((r for r in rows if r["arm"] == arm and r["target"] == c), key=lambda r: r["seed"])
            if not per:
                continue
            tr = [by_run[r["key"]] for r in per]
            a = {"seeds": [r["seed"] for r in per], "path": sorted({r["path"] for r in per}),
                 "nll": [mean(r["nll_items"]) for r in per], "nll_dense": [mean(r["nll_dense_items"]) for r in per],
                 "kv_bytes_fp16": [r["kv_bytes_fp16"] for r in per], "compression": [r["compression"] for r in per],
                 "kd_steps": [x["kd_steps_total"] for x in tr], "steps": [x["steps"] for x in tr]}
            a["ppl"] = [math.exp(x) for x in a["nll"]]
            a["ppl_dense"] = [math.exp(x) for x in a["nll_dense"]]
            for k in ("nll_before_fusion", "nll_after_fusion", "nll_after_phase3"):
                a[k] = [x.get(k) for x in tr]
            if arm in KD_ARMS:
                kd_totals += a["kd_steps"]
            decode_err += [r["decode_max_dlogit"] for r in per if "decode_max_dlogit" in r]
            if t == ct and arm in claim_arms:
                a["nll_items"] = [r["nll_items"] for r in per]
            if arm == "star_full":
                a["recovery_gap"] = [x["nll_after_phase3"] - x["nll_before_fusion"] for x in tr]
                a["alloc_moved_frac"] = [x["alloc_distance"]["moved_frac"] for x in tr]
                a["alloc_moved_k"] = [x["alloc_distance"]["moved_k"] for x in tr]
                a["alloc_moved_v"] = [x["alloc_distance"]["moved_v"] for x in tr]
                a["phase1_steps"] = [x["steps"][0] for x in tr]
                a["budget_met"] = [x.get("budget_met") for x in tr]
            if "nll_mixed_items" in per[0]:
                for tag in ("mixed", "int4", "int4_equal_bytes"):
                    a[f"nll_{tag}"] = [mean(r[f"nll_{tag}_items"]) for r in per]
                    a[f"ppl_{tag}"] = [math.exp(x) for x in a[f"nll_{tag}"]]
                    a[f"bytes_{tag}"] = [r[f"bytes_{tag}"] for r in per]
                    a[f"reduction_{tag}"] = [res["dense_kv_bytes_fp16"] / r[f"bytes_{tag}"] for r in per]
                    quant_dlogit += [r[f"decode_max_dlogit_{tag}"] for r in per]
                    quant_dnll += [abs(mean(r[f"nll_{tag}_items"]) - mean(r[f"nll_dense_{tag}_items"])) for r in per
                                   if f"nll_dense_{tag}_items" in r]
                a["reduction_mixed_min"] = min(a["reduction_mixed"])
                a["int4_eq_over_mixed_bytes_max"] = max(e / x for e, x in zip(a["bytes_int4_equal_bytes"],
                                                                              a["bytes_mixed"]))
                a["int4_eq_over_mixed_bytes_min"] = min(e / x for e, x in zip(a["bytes_int4_equal_bytes"],
                                                                              a["bytes_mixed"]))
                if t == ct:
                    a["nll_mixed_items"] = [r["nll_mixed_items"] for r in per]
                    a["nll_int4_equal_bytes_items"] = [r["nll_int4_equal_bytes_items"] for r in per]
                    a["nll_gap_mixed_items"] = [[x - y for x, y in zip(r["nll_mixed_items"], teacher_items)]
                                                for r in per]
                    a["ppl_ratio_mixed"] = [math.exp(x - teacher_nll) for x in a["nll_mixed"]]
                    a["nll_gap_int4"] = [x - teacher_nll for x in a["nll_int4"]]
            a["nll_gap"] = [x - teacher_nll for x in a["nll"]]
            a["nll_gap_min"] = min(a["nll_gap"])
            arms[arm] = a
        m["arms"][t] = arms
    m["checks"]["kd_steps_min"] = min(kd_totals) if kd_totals else float("nan")
    m["checks"]["kd_steps_max"] = max(kd_totals) if kd_totals else float("nan")
    m["checks"]["decode_vs_dense_max_dlogit"] = max(decode_err) if decode_err else float("nan")
    m["checks"]["quant_decode_vs_dense_max_dnll"] = max(quant_dnll) if quant_dnll else float("nan")
    m["checks"]["quant_decode_vs_dense_max_dlogit"] = max(quant_dlogit) if quant_dlogit else float("nan")
    A = m["arms"].get(ct, {})
    if {"star_full", "star_global", "uniform_kd"} <= set(A):
        f = A["star_full"]
        m["checks"]["control_bytes_gap_max"] = max(abs(x - y) for arm in ("star_global", "uniform_kd")
                                                   for x, y in zip(A[arm]["kv_bytes_fp16"], f["kv_bytes_fp16"]))
    claims = []
    if {"star_full", "star_global"} <= set(A):
        claims.append(Better(
            f"learned_ranks_beat_global_threshold_{ct}",
            f"At equal KV bytes (C = {claim_target}), STAR-KV's learned per-head/per-layer ranks give lower held-out "
            "NLL (through the decode path) than one global σ threshold per type with the same distillation, "
            "fusion and phase-3 steps", kind="finding",
            a=f"arms.{ct}.star_full.nll_items", b=f"arms.{ct}.star_global.nll_items", higher_is_better=False,
            refuted_by="the global-threshold control's NLL at or below star_full's (upper t-bound of the gain "
                       "below the minimum effect)"))
    if {"star_full", "uniform_kd"} <= set(A):
        claims.append(Better(
            f"learned_ranks_beat_uniform_{ct}",
            f"At equal KV bytes (C = {claim_target}), learned heterogeneous ranks exported as the paper's code does "
            "(V←V·(σ−α)₊, then phase 3) give lower held-out NLL (decode path) than uniform ranks with the same number "
            "of distillation steps", kind="finding",
            a=f"arms.{ct}.star_full.nll_items", b=f"arms.{ct}.uniform_kd.nll_items", higher_is_better=False,
            refuted_by="uniform_kd's NLL at or below star_full's"))
    if {"star_gatefuse", "uniform_kd"} <= set(A):
        claims.append(Better(
            f"gatefuse_ranks_beat_uniform_{ct}",
            f"Allocation alone: at equal KV bytes (C = {claim_target}), the same learned ranks fused with the gate "
            "value (star_gatefuse, no σ−α shrink to recover) give lower held-out NLL (decode path) than uniform "
            "ranks with the same distillation steps", kind="finding",
            a=f"arms.{ct}.star_gatefuse.nll_items", b=f"arms.{ct}.uniform_kd.nll_items", higher_is_better=False,
            refuted_by="uniform_kd's NLL at or below star_gatefuse's"))
    if "star_full" in A and "nll_mixed_items" in A["star_full"]:
        claims.append(Better(
            f"mixed_beats_int4_equal_bytes_{ct}",
            f"On STAR-KV students (C = {claim_target}), low-rank-aware mixed precision (top ranks int8, rest int4) "
            "gives lower held-out NLL through the decode path than uniform int4 spending at most the same bytes "
            "(on finer scale groups)", kind="finding",
            a=f"arms.{ct}.star_full.nll_mixed_items", b=f"arms.{ct}.star_full.nll_int4_equal_bytes_items",
            higher_is_better=False, refuted_by="uniform int4 at equal bytes reaching the mixed cache's NLL"))
        claims.append(Bound(
            f"within_ppl_budget_{ct}",
            f"At C = {claim_target} with the mixed-precision latent cache (its size is the finding "
            f"reduction_at_least_4x_{ct}), held-out PPL through the decode path stays within the PPL budget fixed in "
            "params (NLL gap to the teacher below ln(budget))", kind="finding",
            value=f"arms.{ct}.star_full.nll_gap_mixed_items",
            refuted_by="the quantized student's NLL gap to the teacher above ln(budget)"))
        claims.append(Claim(
            f"reduction_at_least_4x_{ct}",
            f"Low rank × mixed precision reduces the KV cache ≥ 4× vs fp16 at C = {claim_target} on every seed "
            "(bytes per token include every fp16 scale; the format's arithmetic given the learned ranks)",
            f"arms.{ct}.star_full.reduction_mixed_min >= param.target", kind="finding",
            refuted_by="the mixed-precision latent cache larger than 1/target of the fp16 KV cache on some seed"))
        claims.append(Claim(
            f"int4_control_within_mixed_bytes_{ct}",
            "The equal-bytes int4 control never stores more bytes than the mixed-precision cache, and spends at "
            "least the fraction of them in params (a control at full strength, K and V budgets pooled)",
            f"arms.{ct}.star_full.int4_eq_over_mixed_bytes_max <= 1 and "
            f"arms.{ct}.star_full.int4_eq_over_mixed_bytes_min >= param.floor", kind="check",
            refuted_by="the int4 control using more bytes than the mixed cache, or leaving more than 1 − floor of "
                       "them unspent"))
    if "star_nokd" in A and "star_full" in A and "nll_mixed_items" in A["star_full"]:
        claims.append(Claim(
            f"ppl_budget_binds_{ct}",
            f"The PPL budget can fail: the student without distillation at the same C (star_nokd, fp latents) is "
            "outside it on every seed", f"arms.{ct}.star_nokd.nll_gap_min > param.below", kind="check",
            refuted_by="star_nokd within the budget (a budget no student could miss)"))
    if "star_full" in A:
        claims.append(Bound(
            f"phase3_recovers_{ct}",
            "Phase 3 is long enough: after it, star_full's held-out NLL is within a small tolerance of its NLL "
            "before the σ−α fusion (the fusion's shrink is undone)", kind="check",
            value=f"arms.{ct}.star_full.recovery_gap",
            refuted_by="star_full still above its pre-fusion NLL by more than the tolerance after phase 3"))
    if "control_bytes_gap_max" in m["checks"]:
        claims.append(Claim(
            f"controls_at_equal_bytes_{ct}", "star_global and uniform_kd hold exactly star_full's KV bytes per "
            "token on every seed", "checks.control_bytes_gap_max == 0", kind="check",
            refuted_by="a control with a different cache size"))
    claims += [
        Claim("equal_kd_steps", "Every distilled arm takes the same number of KD steps (phases 1-3)",
              "checks.kd_steps_min == checks.kd_steps_max", kind="check",
              refuted_by="two KD arms with different step counts"),
        Claim("full_rank_decode_matches_model", "At full rank, the compressed decode path (per-head K SVD, joint V "
              "SVD, attention over the latent cache: the fused kernel's torch reference on CPU, its Triton path "
              "checked in Kernel paths) reproduces the model's own attention logits",
              "full_rank_max_dlogit <= param.tol", kind="check",
              refuted_by="a logit difference above tol between the full-rank latent decode and the HF forward"),
        Claim("decode_matches_dense_forward", "The decode path (kernel over the fp latent caches) matches the dense "
              "forward of the same student", "checks.decode_vs_dense_max_dlogit <= param.tol",
              kind="check", refuted_by="a logit difference above tol"),
        Claim("quant_decode_matches_dense_nll", "The quantized decode path (kernel dequantizing int4/int8 latents) "
              "gives the same mean window NLL as the dense forward with the same quantizer, within a tolerance well "
              "below the findings' minimum effect (max |Δlogit| is not the test: a 1e-6 difference in a latent can "
              "flip one int4 code; it is reported beside)", "checks.quant_decode_vs_dense_max_dnll <= param.tol",
              kind="check", refuted_by="a per-row mean-NLL difference above tol between the two quantized paths"),
        Claim("teacher_beats_unigram", "The teacher learned the corpus (held-out PPL below the unigram PPL)",
              "teacher.ppl < unigram_ppl", kind="check", refuted_by="a teacher no better than unigram statistics"),
    ]
    return claims, m


def run(cfg: Config, ctx: StageContext) -> None:
    res = json.loads((ctx.input("evaluate") / "results.json").read_text())
    runs = json.loads((ctx.input("train") / "runs.json").read_text())
    corpus = json.loads((ctx.input("prepare") / "meta.json").read_text()).get("corpus", "live stdlib")
    source_text = (f"Python stdlib sources (read from the {corpus})" if corpus.startswith(("snapshot", "live"))
                   else f"the KD corpus ({corpus})")
    claims, metrics = build(res, runs, cfg.claim_target)
    ct = ctag(cfg.claim_target)
    rep = Report(ctx, "STAR-KV: adaptive low-rank KV-cache compression (miniature, GQA Llama)",
                 "Learned heterogeneous (per-head/per-layer) ranks beat uniform ranks at equal KV bytes; low-rank-aware "
                 "mixed precision beats uniform int4; ≥ 4× KV reduction within a small PPL loss; fused latent decode "
                 "kernel up to 6.9× faster attention (3.1× end-to-end) on GPU.")
    bb, A = res["backbone"], metrics["arms"]
    rep.section("Setup", f"""Teacher: a Llama-style decoder built by `stages/common/hf.py` (`LlamaForCausalLM`, d={bb['d_model']},
{bb['n_layers']} layers, {bb['n_heads']} query heads, **{bb['n_kv_heads']} KV heads (GQA)**, head_dim {bb['head_dim']}, RoPE,
SwiGLU, RMSNorm, byte-level) trained on {source_text}; held-out PPL {metrics['teacher']['ppl']:.3f} (unigram
{metrics['unigram_ppl']:.2f}) on {res['n_windows']} disjoint windows of {res['seq_len']} tokens from held-out files
(`{res['eval_set']}`). Students per seed × target C {res['targets']}: per-KV-head SVD of k_proj with head thresholds
α_h, joint SVD of v_proj with a block threshold, soft threshold (custom autograd), KL distillation + λΣe^(−α), phase 1
until each type meets its budget (K removes C+0.09, V C−0.11 of its cache) then global per-type freeze, phase 2 KD,
Σ fusion, phase 3 KD. **Every distilled arm takes the same KD steps** ({runs['kd_steps']} before fusion +
{runs['phase3_steps']} after). Claim numbers are NLL/PPL **through the decode path**: a KV cache of latents only,
each position's attention computed by `kernels.lowrank_attention.decode` (fp) or `decode_quant` (quantized) over
the cache of tokens 0..t; the dense forward is the cross-check. Findings are tested at C = {cfg.claim_target} (fixed
in params before the run; the paper's own run uses C = 0.6). Mixed precision: top {res['hi_ranks_k']} K ranks per
KV head and {res['hi_ranks_v']} V ranks per layer at {res['hi_bits']} bits (the paper's 16/128 and 256/1024
proportions), rest int4, one fp16 scale per token and part; bytes count every scale.""")

    # ---- results per level and arm
    tab = []
    for t, arms in A.items():
        for arm, a in arms.items():
            tab.append({"C": float(t[1:]) / 100, "arm": arm, "seeds": len(a["seeds"]), "path": "/".join(a["path"]),
                        "ppl": mean(a["ppl"]), "ppl_sd": sd(a["ppl"]), "ppl_dense": mean(a["ppl_dense"]),
                        "kv_bytes_fp16": mean(a["kv_bytes_fp16"]), "compression": mean(a["compression"]),
                        "kd_steps": mean(a["kd_steps"])})
    frame = pl.DataFrame(tab, infer_schema_length=None)
    rep.table("Held-out PPL per arm", frame, note=f"Mean (sd) over seeds. `path`: decode = through the fused decode "
              f"kernel over the latent cache; dense = dense forward (arms outside the claims, beyond the first seed). "
              f"kv_bytes_fp16: latent cache bytes per token at fp16 (dense KV cache: "
              f"{res['dense_kv_bytes_fp16']} bytes); compression = 1 − latent/dense bytes. Teacher PPL "
              f"{metrics['teacher']['ppl']:.4g}.")
    rep.plot("ppl_vs_compression", frame.select("compression", "arm", "ppl"), x="compression", y="ppl",
             series="arm", title="held-out PPL (decode path) vs realised compression (1 − latent/dense bytes)")

    # ---- fusion: before / after / phase 3, every arm
    fus = []
    for t, arms in A.items():
        for arm, a in arms.items():
            fus.append({"C": float(t[1:]) / 100, "arm": arm,
                        "ppl_before_fusion": _mexp(a["nll_before_fusion"]), "ppl_after_fusion": _mexp(a["nll_after_fusion"]),
                        "ppl_after_phase3": _mexp(a["nll_after_phase3"]), "kd_steps": mean(a["kd_steps"]),
                        "steps_p1_p2_p3": str(a["steps"][0])})
    rep.table("PPL before fusion, after fusion, after phase 3", pl.DataFrame(fus, infer_schema_length=None), note=f"""Dense
forward on the same held-out windows, mean over seeds. star_full / star_global / star_jointk / star_nokd use the official
export V←V·(σ−α)₊ (what the paper's code does, model.py:313 of the official repository); star_gatefuse fuses the gate
value f(σ) (≈σ above α) instead. uniform_kd and svd_uniform are fused from the start (plain SVD truncation), so their
"before" and "after" coincide. Untrained arms (svd_uniform, star_nokd) take 0 KD steps; every other arm takes
{runs['kd_steps'] + runs['phase3_steps']}. steps_p1_p2_p3: phase-1 / phase-2 / phase-3 steps of the first seed.""")
    curve = _curves(runs, cfg.claim_target)
    if curve.height:
        rep.plot("phase3_curve", curve, x="steps_after_fusion", y="ppl", series="arm",
                 title=f"held-out PPL after fusion (C = {cfg.claim_target}, mean over seeds; curve windows)")

    # ---- rank allocation
    f = A.get(ct, {}).get("star_full")
    if f:
        alloc = pl.DataFrame({"seed": f["seeds"], "phase1_steps": f["phase1_steps"], "budget_met": f["budget_met"],
                              "moved_k": f["alloc_moved_k"], "moved_v": f["alloc_moved_v"],
                              "moved_frac": f["alloc_moved_frac"]})
        rep.table(f"Learned allocation vs one global threshold (C = {cfg.claim_target})", alloc, note="""moved_k /
moved_v: rank units star_full's learned thresholds moved away from the allocation a single global σ̂ threshold per type
would give the same model at the same totals (half the L1 distance over KV heads / layers); moved_frac: their sum over
the total rank. 0 means the learned ranks ARE the global-threshold ranks (then the first finding cannot hold by
construction).""")
    rep.figure("rank_heatmap", _heatmap(runs, res), "Key rank per layer × KV head and value rank per layer: star_full's "
               "learned allocation vs the single-global-threshold allocation at the same totals (first seed)")

    # ---- quantization
    if f and "bytes_mixed" in f:
        q = [{"cache": tag, "bytes_per_token": mean(f[f"bytes_{tag}"]), "reduction_vs_fp16": mean(f[f"reduction_{tag}"]),
              "ppl": mean(f[f"ppl_{tag}"])} for tag in ("mixed", "int4", "int4_equal_bytes")]
        q.insert(0, {"cache": "fp16 latents", "bytes_per_token": mean(f["kv_bytes_fp16"]),
                     "reduction_vs_fp16": mean([metrics["dense_kv_bytes_fp16"] / x for x in f["kv_bytes_fp16"]]),
                     "ppl": mean(f["ppl"])})
        rep.table(f"Quantized latent caches of star_full (C = {cfg.claim_target}, decode path)", pl.DataFrame(q),
                  note="""Bytes per token (all layers, each head at its own rank) count codes and every fp16 scale
(symmetric quantization: no zero-points). mixed: top ranks int8 + one scale, rest int4 + one scale per token and head
(K) / layer (V). int4: every rank int4, one scale (fewer bytes). int4_equal_bytes: every rank int4 with the smallest
scale-group size whose bytes do not exceed the mixed cache's (the bytes mixed spends on int8 go to finer scales).""")
    rep.section("Speed: what was measured where", f"""The paper reports up to **6.9×** attention-module speedup
(its Triton kernels vs SDPA on the full K, V cache; Llama-3.1-8B, batch 16, 32k context) and 3.1× end-to-end
throughput, on GPU. This pipeline measures **no speed**: it runs on CPU, where the kernel path is the torch reference
(`kernels/lowrank_attention.decode_ref`) and the Triton kernel only runs under the interpreter for the parity slice
(see Kernel paths). `python -m benchmarks.decode_speed` (part of `make bench`) times one decode step at the paper's
shapes (Hq 32, Hkv 8, head_dim 128, T 32768, ranks of its C = 0.6 run: K 40 per head, V 522): on CPU the torch
paths (the fused algorithm in torch vs materialize-K/V + SDPA vs SDPA on a dense cache; batch 1, fp32) and, where
CUDA exists, the Triton kernel vs SDPA on a dense fp16 cache at batch 16 with the fraction of the memory roofline.
On the 2-core development machine the torch fused algorithm took ~0.45 s per step, materialise + SDPA ~1.0 s and
dense SDPA ~0.14 s: on a CPU the latent path is ~2× faster than materialising but ~3× slower than a dense cache
(its value latent is read once per KV head, more bytes than the dense cache at these ranks). These are benchmark
numbers, not outputs of this run, and say nothing about the GPU kernel. On 2026-12-04 one H200 was lent to a session
for 15 minutes (torch 2.11, Triton 3.6; the README's *Kernels on a GPU*, `reports/bench/cuda-h200.json`). At the
paper's shape with fp16 caches our Triton kernel matched materialise + SDPA (max error 1.3e-3 of the output's scale)
and took 21.3 ms per decode step, against 9.5 ms for materialise + SDPA and 0.49 ms for SDPA on the dense fp16 cache
(4.4 TB/s, at the memory roofline): 44× slower than the paper's baseline, where the paper reports 6.9× faster; with
tf32 dots 7.9 ms, still 16× slower. Besides exact fp32 dots that use no tensor cores, the kernel reads the shared value
latent once per KV head (8× the value-latent bytes at Hkv = 8). So this repository's kernel does not reproduce the
speedup; whether the paper's kernels do on this hardware is not tested here (they are not in this repository).""")
    rep.section("Deviations", """| what | paper / official code | here | why |
|---|---|---|---|
| model, data | Llama-3.1-8B-Instruct, fineweb-edu, 4000 × 8192-token blocks; PPL on WikiText-2 / C4 | tiny GQA Llama (HF `LlamaForCausalLM`) trained here on byte-level stdlib sources, 64-token windows; the `full` profile names the real model and data (`source:` blocks) | CPU minutes |
| budget unit | factor parameters min((in+out)·r, in·out) | cache entries (ranks) per token | the claim is about KV bytes; with GQA the two differ |
| s scale | s = 50 on raw σ | σ divided by the median top singular value per type, s = 50 | tiny model's σ scale |
| layers | skips layers 0, 1, 31 | every layer compressed | 3-layer model |
| optimizer | AdamW lr 2e-5 (bf16), α lr 1e-2, 3000 α samples, 200 phase-3 blocks | AdamW lr 1e-3 (fp32) for every arm and phase, α lr 1e-2, phase-1 cap and KD steps in params, phase 3 sized from the recorded curve | budget; the same for every arm |
| phase 2 length | until step alpha_samples | fills phases 1+2 up to kd_steps, so every arm has equal KD steps | equal-steps comparison |
| no-KD arm | — | α under pressure only ≡ one common threshold per type (computed directly) | same dynamics under Adam |
| global-threshold control | — | star_global: one σ̂ threshold per type at star_full's totals (re-set at fusion for exact equality), same KD/fusion/phase 3 | the control the rank-learning finding must beat |
| Triton export | cuts all K heads of a layer to the layer's MIN rank | heads zero-padded to the layer's MAX rank (the PPL model is the latency model) | kernel = claim path |
| equal-bytes int4 | not specified | int4 with finer scale groups at ≤ the mixed cache's bytes, on the same STAR-KV student | the card's claim (2) |
| PPL windows | disjoint 1024/2048 windows | disjoint 64-token windows, decode path | model context |""")
    rep.section("Threats to validity", THREATS)
    rep.finish(claims, metrics)


THREATS = """- **One teacher.** Seeds vary the distillation data order only (the student is a deterministic SVD of one teacher),
  so the seed spread measures optimisation noise, not teacher-to-teacher variation; the test windows are shared by
  every seed and arm (the verdict adds their item variance and pairs the arms per window).
- **Miniature scale.** 3 layers × 2 KV heads of head_dim 16 leave few groups to allocate ranks among, and per-token
  fp16 scales are a large share of a rank-4 latent row (they cost more here than at head_dim 128), which is why the
  4× reduction is close at C = 0.6.
- **Other levels.** Findings are tested only at the claim level; the other levels run fewer seeds/arms (see the
  tables) and are descriptive.
- **Hyper-parameters.** lr, α lr, λ and s follow the official code where it states them and are shared by every arm;
  the step counts were lengthened from recorded curves (see (b)); a different lr or a much longer budget could change
  the ordering of arms whose PPLs are within the minimum effect.
- **Red-team passes (what they found).** (a) Phase 1 ends at its step cap (`alpha_steps`) before star_full meets its
  budget on most seeds, and where both types froze early the budget is lost again because Σ keeps training
  (`budget_met` is read when phase 1 ends; allocation table): the realised compression is below the target C (see
  `compression`; the PPL plot's x axis is the realised compression), most at C = 0.75, where the label overstates the
  compression; every control is held at star_full's realised bytes, so the comparisons stay at equal bytes, and
  `reduction_at_least_4x_c60` misses 4× by ~1% for this reason (K ends one rank over its budget).
  (b) The official σ−α export roughly doubles star_full's PPL. Phase 3 was lengthened over two development runs
  (60 + 120 → 100 + 200 → 100 + 300 KD steps, the same for every arm) because the recorded phase-3 curve was still
  falling; in those runs the curve read the first 16 **test** windows (now: 16 held-out windows after the test
  windows). There was no stopping rule fixed in advance, and star_full and star_global were still falling at 300.
  The rank verdicts moved with the budget (gap star_full − control in nats, negative = control better):
  vs uniform_kd −0.015 (fails) → −0.0035 (fails) → +0.0001 (fails); vs star_global −0.0017 (fails) → +0.0014 (fails)
  → +0.0027 (inconclusive); `mixed_beats_int4_equal_bytes_c60` inconclusive → holds → inconclusive. So
  `learned_ranks_beat_uniform_c60` measures the export's cost as much as the allocation: `gatefuse_ranks_beat_uniform_c60`
  (the same ranks, fused with the gate value, no shrink to recover) is the allocation-only finding. Thresholds were
  never changed. (c) The learned allocation moves only ~10% of the rank away from one global σ̂ threshold per type
  and is nearly the same on every seed, so five seeds test one allocation under data-order noise, and the
  learned-vs-global gap is bounded by construction to a small effect at this scale (its smallest detectable gap is
  about twice the minimum effect). (d) The equal-bytes int4 control first chose its group size per cache type and
  left ~7% of the mixed cache's bytes unspent; it now pools the K and V budgets (`int4_control_within_mixed_bytes_c60`
  requires it to spend ≥ the fraction in params). (e) The 5% PPL budget binds only weakly: the untrained SVD arm at
  fp16 and plain int4 latents (6.3×, see the quantized table) are also inside it; `ppl_budget_binds_c60` shows only
  that a student without distillation misses it. (f) The quantized decode path is compared with the dense forward on
  the window NLL (`quant_decode_matches_dense_nll`), because max |Δlogit| between two quantized paths is
  discontinuous (a 1e-6 latent difference flips an int4 code; max |Δlogit| up to ~0.1 is in the metrics as
  `checks.quant_decode_vs_dense_max_dlogit`); this check was split from the fp check after the first default run
  showed that, with the tolerance fixed from the findings' minimum effect, not from the measured value.
  (g) An independent float64 decoder written from `models.pt` alone (ragged per-head latent caches, explicit RoPE,
  RMSNorm, SwiGLU, GQA, its own quantizer) reproduced the committed per-seed NLLs to < 1e-6 (fp) and the mixed-cache
  bytes by hand.
- **Budget.** Most of the default run is the train stage's KD steps (Runtime table). A seed's students train in a
  lockstep cohort (one teacher forward per batch for every member); the seeds run as jobs of the shared process
  pool (`stages/common/jobs.py`, two single-threaded processes), not as the shared vectorized ensemble
  (`stages/common/ensemble.py`): after fusion every seed's students have their own learned ranks, so their shapes
  differ. Pool and in-process runs agree bit for bit (`tests/star_kv/test_jobs.py`).
- **Speed.** No speed claim is tested (CPU only); the kernel reads the value latent once per KV head, which at the
  paper's shapes is more bytes than the dense fp16 cache unless L2 keeps it — the GPU bench row reports the bytes
  it assumes."""


def _mexp(xs) -> float:
    return math.exp(mean(xs))


def _curves(runs: dict, target: float) -> pl.DataFrame:
    """Held-out PPL (curve windows) after fusion per KD arm at the claim level, mean over seeds, x = steps after
    fusion (0 = right after it); plus each arm's pre-fusion value as its own series."""
    k = runs["kd_steps"]
    acc: dict[tuple[str, int], list[float]] = {}
    for r in runs["runs"]:
        if r["target"] != target or r["arm"] not in KD_ARMS:
            continue
        for step, p in r["curve"]:
            if step >= k:
                acc.setdefault((r["arm"], step - k), []).append(p)
        if r["arm"] == "star_full" and "curve_before_fusion" in r:
            for s in range(0, runs["phase3_steps"] + 1, runs["curve_every"]):
                acc.setdefault(("star_full before fusion", s), []).append(r["curve_before_fusion"])
    rows = [{"arm": a, "steps_after_fusion": s, "ppl": mean(v)} for (a, s), v in sorted(acc.items())]
    return pl.DataFrame(rows, schema={"arm": pl.Utf8, "steps_after_fusion": pl.Int64, "ppl": pl.Float64})


def _heatmap(runs: dict, res: dict):
    seed = res["seeds"][0]
    full = sorted((r for r in runs["runs"] if r["arm"] == "star_full" and r["seed"] == seed), key=lambda r: r["target"])
    bb = res["backbone"]
    fig, axes = plt.subplots(2, max(len(full), 1), figsize=(3.4 * max(len(full), 1), 5.6), squeeze=False)
    im = None
    for j, r in enumerate(full):
        for i, (title, ks, vs) in enumerate((("learned", r["ranks_k"], r["ranks_v"]),
                                             ("global threshold", r["global_alloc"]["k"], r["global_alloc"]["v"]))):
            ax = axes[i][j]
            mat = np.array(ks)
            im = ax.imshow(mat, cmap="viridis", vmin=0, vmax=bb["head_dim"])
            ax.set(title=f"C={r['target']} {title}\nV ranks {vs}", xlabel="KV head", ylabel="layer",
                   xticks=range(mat.shape[1]), yticks=range(mat.shape[0]))
            for (a, b), v in np.ndenumerate(mat):
                ax.text(b, a, str(v), ha="center", va="center", color="w", fontsize=9)
    if im is not None:
        fig.colorbar(im, ax=axes.ravel().tolist(), label="key rank")
    return fig
