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
    claim_arms = {"star_full", "star_global", "uniform_kd"}
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
                if t == ct:
                    a["nll_mixed_items"] = [r["nll_mixed_items"] for r in per]
                    a["nll_int4_equal_bytes_items"] = [r["nll_int4_equal_bytes_items"] for r in per]
                    a["nll_gap_mixed_items"] = [[x - y for x, y in zip(r["nll_mixed_items"], teacher_items)]
                                                for r in per]
                    a["ppl_ratio_mixed"] = [math.exp(x - teacher_nll) for x in a["nll_mixed"]]
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
            f"At equal KV bytes (C = {claim_target}), learned heterogeneous ranks give lower held-out NLL (decode "
            "path) than uniform ranks with the same number of distillation steps", kind="finding",
            a=f"arms.{ct}.star_full.nll_items", b=f"arms.{ct}.uniform_kd.nll_items", higher_is_better=False,
            refuted_by="uniform_kd's NLL at or below star_full's"))
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
            f"At C = {claim_target} with the mixed-precision latent cache (≥ 4× smaller than the fp16 KV cache, see "
            f"the check reduction_at_least_4x_{ct}), held-out PPL through the decode path stays within the PPL "
            "budget fixed in params (NLL gap to the teacher below ln(budget))", kind="finding",
            value=f"arms.{ct}.star_full.nll_gap_mixed_items",
            refuted_by="the quantized student's NLL gap to the teacher above ln(budget)"))
        claims.append(Claim(
            f"reduction_at_least_4x_{ct}",
            f"Low rank × mixed precision reduces the KV cache ≥ 4× vs fp16 at C = {claim_target} on every seed "
            "(bytes per token include every fp16 scale; the format's arithmetic given the learned ranks)",
            f"arms.{ct}.star_full.reduction_mixed_min >= param.target", kind="check",
            refuted_by="the mixed-precision latent cache larger than 1/target of the fp16 KV cache on some seed"))
        claims.append(Claim(
            f"int4_control_within_mixed_bytes_{ct}",
            "The equal-bytes int4 control never stores more bytes than the mixed-precision cache",
            f"arms.{ct}.star_full.int4_eq_over_mixed_bytes_max <= 1", kind="check",
            refuted_by="the int4 control using more bytes than the mixed cache"))
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
              "SVD, fused kernel over the latent cache) reproduces the model's own attention logits",
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
    claims, metrics = build(res, runs, cfg.claim_target)
    ct = ctag(cfg.claim_target)
    rep = Report(ctx, "STAR-KV: adaptive low-rank KV-cache compression (miniature, GQA Llama)",
                 "Learned heterogeneous (per-head/per-layer) ranks beat uniform ranks at equal KV bytes; low-rank-aware "
                 "mixed precision beats uniform int4; ≥ 4× KV reduction within a small PPL loss; fused latent decode "
                 "kernel up to 6.9× faster attention (3.1× end-to-end) on GPU.")
    bb, A = res["backbone"], metrics["arms"]
    rep.section("Setup", f"""Teacher: a Llama-style decoder built by `stages/common/hf.py` (`LlamaForCausalLM`, d={bb['d_model']},
{bb['n_layers']} layers, {bb['n_heads']} query heads, **{bb['n_kv_heads']} KV heads (GQA)**, head_dim {bb['head_dim']}, RoPE,
SwiGLU, RMSNorm, byte-level) trained on Python stdlib sources; held-out PPL {metrics['teacher']['ppl']:.3f} (unigram
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
    rep.plot("ppl_vs_compression", frame.select("C", "arm", "ppl"), x="C", y="ppl", series="arm",
             title="held-out PPL (decode path) vs compression target C")

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
(see Kernel paths). `make bench` (`python -m kernels.bench --only lowrank_attention`) times, at the paper's shapes
(Hq 32, Hkv 8, head_dim 128, T 32768, ranks of its C = 0.6 run: K 40 per head, V 522), the CPU torch paths here
(the fused algorithm in torch vs materialize-K/V + SDPA vs SDPA on a dense cache; batch 1) and, where CUDA exists,
the Triton kernel vs SDPA on a dense fp16 cache at batch 16 with the fraction of the memory roofline; on this
machine the GPU entry is skipped with its reason printed. No GPU number is claimed here, and the paper's 6.9× is
neither confirmed nor refuted.""")
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
- **Hyper-parameters.** lr, α lr, λ, s and the step counts were fixed before the committed run (phase 3 from the
  recorded curve of an earlier development run) and are shared by every arm; a different lr or a much longer
  budget could change the ordering of arms whose PPLs are within the minimum effect.
- **Red-team pass on the committed default run (what it found).** (a) Phase 1 hit its step cap (`alpha_steps`)
  before star_full met its budget on most seeds (`budget_met` False in the allocation table): the realised
  compression is below the target C (see `compression`), most at C = 0.75, where the label overstates the
  compression; every control is held at star_full's realised bytes, so the comparisons stay at equal bytes.
  (b) The official σ−α export costs far more than 120 phase-3 steps recover (`phase3_recovers_c60` fails), so the
  rank-allocation findings still measure the export as much as the allocation; star_gatefuse (same ranks, gate-value
  fusion) is the arm that isolates allocation, and it is reported, not claimed. (c) The learned allocation moves
  only ~10% of the rank away from one global σ̂ threshold per type, so the learned-vs-global gap is bounded by
  construction to a small effect at this scale. (d) The quantized decode path is compared with the dense forward on
  the window NLL (`quant_decode_matches_dense_nll`), because max |Δlogit| between two quantized paths is
  discontinuous (a 1e-6 latent difference flips an int4 code; max |Δlogit| up to ~0.1 is in the metrics as
  `checks.quant_decode_vs_dense_max_dlogit`); this check was split from the fp check after the first default run
  showed that, with the tolerance fixed from the findings' minimum effect, not from the measured value.
- **Budget.** The default profile takes more than the 300 s CPU target (process CPU: prepare ~15 s, train ~270 s,
  evaluate ~65 s, report ~17 s, measured on the shared 2-core machine); the seeds are trained in a lockstep cohort,
  not yet with the shared vectorized ensemble (`stages/common/ensemble.py`).
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
