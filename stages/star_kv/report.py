"""report: claims, tables, rank heatmap, plots.

    python -m stages report star_kv
"""
from __future__ import annotations

import json

import matplotlib
import numpy as np
import polars as pl

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from stages.common.claims import Better, Bound, Claim, Param  # noqa: E402
from stages.common.config import ReportConfig  # noqa: E402
from stages.common.reporting import Report  # noqa: E402
from stages.common.runner import StageContext  # noqa: E402


class Config(ReportConfig):
    pass


def ctag(c: float) -> str:
    return f"c{round(c * 100)}"


def build(res: dict) -> tuple[list, dict]:
    rows = res["rows"]
    seeds, targets = res["seeds"], res["targets"]
    m: dict = {"teacher_ppl": res["teacher_ppl"], "unigram_ppl": res["unigram_ppl"], "arms": {}, "quant": {}}
    for c in targets:
        arms = {}
        for arm in sorted({r["arm"] for r in rows}):
            per = [next(r for r in rows if r["arm"] == arm and r["target"] == c and r["seed"] == s) for s in seeds]
            arms[arm] = {"ppl": [r["ppl"] for r in per], "compression": [r["compression"] for r in per]}
            if arm == "star_full":
                arms[arm].update(ppl_mixed=[r["ppl_mixed"] for r in per], ppl_int4=[r["ppl_int4"] for r in per],
                                 ppl_ratio_mixed=[r["ppl_mixed"] / res["teacher_ppl"] for r in per],
                                 reduction_mixed=[res["dense_kv_bytes_fp16"] / r["bytes_mixed"] for r in per],
                                 decode_max_dlogit=max(max(r["decode_max_dlogit_fp32"], r["decode_max_dlogit_mixed"])
                                                       for r in per))
        m["arms"][ctag(c)] = arms
    for e in res["quant_equal_bytes"]:
        m["quant"].setdefault(ctag(e["target"]), {})[e["variant"]] = e["ppl"]
    claims = []
    for c in targets:
        t = ctag(c)
        if "uniform_kd" in m["arms"][t] and "star_full" in m["arms"][t]:
            claims.append(Better(f"learned_ranks_beat_uniform_{t}",
                                 f"At equal KV bytes (C≈{c}), learned per-head ranks give lower held-out PPL than "
                                 "uniform ranks with the same distillation steps",
                                 a=f"arms.{t}.star_full.ppl", b=f"arms.{t}.uniform_kd.ppl", higher_is_better=False,
                                 refuted_by="uniform_kd's PPL below star_full's beyond 2 s.e. on a seed majority", kind="finding"))
    qt = [t for t in m["quant"] if {"mixed", "int4_equal_bytes"} <= set(m["quant"][t])]
    if qt:
        claims.append(Claim("mixed_beats_int4_equal_bytes",
                            "Low-rank-aware mixed precision (top ranks int8, rest int4) beats uniform int4 at equal "
                            "code bytes (int4 spends the bytes on extra ranks), at every compression level",
                            " and ".join(f"quant.{t}.mixed < quant.{t}.int4_equal_bytes" for t in qt),
                            refuted_by="int4 with the extra ranks reaching lower PPL at any level", kind="finding"))
    # claim 3 at the mildest target whose mixed-precision reduction reaches 4x on every seed
    ok = [c for c in targets if "star_full" in m["arms"][ctag(c)]
          and min(m["arms"][ctag(c)]["star_full"]["reduction_mixed"]) >= 4]
    c3 = ctag(min(ok)) if ok else ctag(max(targets))
    m["claim3_target"] = c3
    claims.append(Claim("total_reduction_at_least_4x", "Low rank × quantization reduces KV bytes ≥ 4× vs fp16",
                        f"arms.{c3}.star_full.reduction_min >= param.target",
                        refuted_by="the mixed-precision latent cache larger than a quarter of the fp16 KV cache", kind="finding",
                        thresholds={"target": Param(4, "report (the paper's 4x; the level is still picked post hoc)")}))
    m["arms"][c3]["star_full"]["reduction_min"] = min(m["arms"][c3]["star_full"]["reduction_mixed"])
    claims.append(Bound("reduction_within_ppl_budget",
                        f"…within a stated PPL budget (≤ {res['ppl_budget']}× the teacher's PPL)",
                        value=f"arms.{c3}.star_full.ppl_ratio_mixed", below=Param(res["ppl_budget"], "evaluate.ppl_budget"),
                        refuted_by="the compressed, quantized student's PPL ratio above the budget on a seed majority", kind="finding"))
    return claims, m


def run(cfg: Config, ctx: StageContext) -> None:
    res = json.loads((ctx.input("evaluate") / "results.json").read_text())
    claims, metrics = build(res)
    rep = Report(ctx, "STAR-KV: adaptive low-rank KV-cache compression (miniature)",
                 "Learned heterogeneous (per-head) ranks beat uniform ranks at equal KV bytes; low-rank-aware "
                 "mixed precision beats uniform int4; ≥ 4× KV reduction at small PPL loss.")
    mo = res["model"]
    rep.section("Setup", f"""Teacher: the shared tiny transformer (d={mo['d_model']}, {mo['n_layers']} layers,
{mo['n_heads']} heads, RoPE, byte-level, seq {mo['max_seq_len']}) trained on Python stdlib sources; teacher PPL
{res['teacher_ppl']:.3f} (unigram {res['unigram_ppl']:.2f}). Students per seed {res['seeds']} × target C
{res['targets']}: per-head SVD of k_proj with head thresholds, joint SVD of v_proj with a block threshold,
soft threshold (custom autograd), KL distillation + λΣe^(−α), phase 1 until each group's budget (K removes
C+0.09, V C−0.11 of its cache) then global per-type freeze, phase 2 KD, Σ fusion V←V(σ−α)₊, phase 3 KD.
Mixed precision: top {res['hi_ranks_k']} K ranks/head and {res['hi_ranks_v']} V ranks/layer at
{res['hi_bits']} bits, rest int4, per-token scales.""")
    tab = []
    for r in res["rows"]:
        tab.append({"seed": r["seed"], "C": r["target"], "arm": r["arm"], "ppl": r["ppl"],
                    "compression": r["compression"], "ppl_mixed": r.get("ppl_mixed"), "ppl_int4": r.get("ppl_int4")})
    frame = pl.DataFrame(tab, infer_schema_length=None)
    summ = frame.group_by(["C", "arm"], maintain_order=True).agg(pl.col("ppl").mean().alias("ppl_mean"), pl.col("ppl").std().alias("ppl_sd"),
                                           pl.col("compression").mean(), pl.col("ppl_mixed").mean(),
                                           pl.col("ppl_int4").mean()).sort(["C", "arm"])
    rep.table("Results", summ, note="Mean over seeds; compression = 1 − latent bytes / dense KV bytes (same precision).")
    rep.table("Quantization at equal code bytes (uniform SVD ranks)", pl.DataFrame(res["quant_equal_bytes"]))
    rep.plot("ppl_vs_compression", summ.filter(pl.col("arm") == "star_full").select("C", "ppl_mean"), x="C", y="ppl_mean")
    # heatmap of learned ranks (seed 0, each target)
    full = [r for r in res["rows"] if r["arm"] == "star_full" and r["seed"] == res["seeds"][0]]
    fig, axes = plt.subplots(1, len(full), figsize=(3.2 * len(full), 2.8), squeeze=False)
    for ax, r in zip(axes[0], full):
        mat = np.array(r["ranks_k"])
        im = ax.imshow(mat, cmap="viridis", vmin=0, vmax=mo["d_model"] // mo["n_heads"])
        ax.set(title=f"C={r['target']}  V ranks {r['ranks_v']}", xlabel="KV head", ylabel="layer")
        for (i, j), v in np.ndenumerate(mat):
            ax.text(j, i, str(v), ha="center", va="center", color="w", fontsize=8)
    fig.colorbar(im, ax=axes[0].tolist())
    rep.figure("rank_heatmap", fig, "Learned key rank per layer/head (star_full, first seed)")
    rep.section("Deviations", """| what | paper / official code | here | why |
|---|---|---|---|
| model, data | Llama-3.1-8B, fineweb-edu, 8192-token blocks | tiny byte-level LM, stdlib sources, 64 tokens | CPU minutes |
| budget unit | factor parameters | cache entries (ranks) per token | MHA toy: the quantity the claim is about |
| s scale | s=50 on raw σ | σ divided by the median top singular value per type | tiny model's σ scale |
| no-KD arm | — | α under pressure only ≡ one common threshold per type (computed directly) | same dynamics under Adam |
| equal-bytes int4 | not specified | measured on uniform SVD ranks where extra ranks exist | learned students have no spare ranks |
| steps | 3000 α samples, 4000 blocks | 150 / 60 / 30 steps | budget |
| star_gatefuse arm | — | star_full's phases 1-2, then Σ fused as the gate value f(σ) (≈σ) instead of σ−α | diagnostic: separates rank allocation from the σ−α shrink of the official export |
| equal bytes (claim 2) | — | equal *code* bytes; mixed carries a second per-token scale (see bytes_with_scales) | int4 packing of the kernel |""")
    means = summ.to_dicts()

    def mean_of(c, arm):
        return next((r["ppl_mean"] for r in means if r["C"] == c and r["arm"] == arm), float("nan"))
    lines = [f"- C={c}: teacher {res['teacher_ppl']:.3f}; star_full {mean_of(c, 'star_full'):.3f}, star_gatefuse "
             f"{mean_of(c, 'star_gatefuse'):.3f}, star_nokd {mean_of(c, 'star_nokd'):.3f}, uniform_kd "
             f"{mean_of(c, 'uniform_kd'):.3f}, svd_uniform {mean_of(c, 'svd_uniform'):.3f}" for c in res["targets"]]
    rep.section("What the arms show", "Mean held-out PPL per target (lower is better):\n\n" + "\n".join(lines) + """

star_nokd and star_full share the official export V←V·(σ−α)₊, which shrinks every kept singular value by α;
star_gatefuse differs from star_full only in that fusion. Comparing the three separates the effect of the
learned rank *allocation* from the effect of the shrink.""")
    rep.section("Discussion", """The paper compresses an 8B Llama's KV cache by up to 75% at small accuracy
loss and reports kernel speedups on long contexts (32k tokens, head_dim 128). This miniature reproduces the
method's mechanics (hybrid SVD, learned thresholds, freezing, fusion, mixed precision, fused latent decode
kernel) on a 3-layer byte model; its PPL differences are small-model effects and its CPU timings say nothing
about GPU speedups. The baseline uniform arms beat the unigram predictor (see Results vs unigram PPL).""")
    rep.finish(claims, metrics)
