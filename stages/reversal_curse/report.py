"""report: seed-aware claims with verdicts, per-seed tables, accuracy / nuclear-norm-at-margin curves
and W_OV block heat-maps."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import polars as pl

from stages.common.claims import Better, Bound, Claim
from stages.common.config import ReportConfig
from stages.common.paths import read_json
from stages.common.reporting import Report
from stages.common.runner import StageContext

CLAIMS = [
    Better("bridge_reverses",
           "With identity facts on A∪B the one-layer model W_O W_V reverses held-out facts: its held-out "
           "reversal accuracy exceeds forward-only training's by more than 0.5 on every seed's held-out set",
           a="main.AB.reverse_acc", b="main.none.reverse_acc",
           refuted_by="A∪B accuracy not above forward-only's by 0.5 beyond 2 s.e. on a majority of seeds", kind="finding"),
    Bound("forward_only_fails",
          "Forward-only training (no bridge) leaves held-out reversal at ≈ 0 (the reversal curse)",
          value="main.none.reverse_acc",
          refuted_by="forward-only held-out reversal accuracy ≥ 0.05", kind="finding"),
    Bound("bridge_block_symmetric",
          "With the A∪B bridge the learned held-out pair entries are symmetric: off-diagonal asymmetry "
          "‖u−v‖/√(‖u‖²+‖v‖²) (u = W[a_i,b_i], v = W[b_i,a_i]) below 0.3",
          value="main.AB.offdiag_asym",
          refuted_by="A∪B off-diagonal asymmetry ≥ 0.3 (W[a,b] and W[b,a] of held-out pairs differ)", kind="finding"),
    Better("asymmetric_without_bridge",
           "Without the bridge the held-out block stays one-directional: asymmetry higher than A∪B's by > 0.5",
           a="main.none.offdiag_asym", b="main.AB.offdiag_asym",
           refuted_by="forward-only asymmetry not above A∪B's by 0.5", kind="finding"),
    Better("asymmetric_with_large_init",
           "With the same A∪B data but a large init (0.1) the held-out block is asymmetric too: asymmetry "
           "higher than small-init A∪B's by > 0.1",
           a="main.AB_large_init.offdiag_asym", b="main.AB.offdiag_asym",
           refuted_by="large-init asymmetry within 0.1 of small-init A∪B's (symmetry without the small-init bias)", kind="finding"),
    Bound("large_init_does_not_reverse",
          "The mechanism needs the small-init bias: A∪B with a large init (0.1) does not reverse",
          value="main.AB_large_init.reverse_acc",
          refuted_by="large-init A∪B held-out reversal ≥ 0.05", kind="finding"),
    Bound("unfactorized_does_not_reverse",
          "The mechanism needs the factorization W_O W_V: an unfactorized W on A∪B does not reverse",
          value="main.AB_unfactorized.reverse_acc",
          refuted_by="unfactorized A∪B held-out reversal ≥ 0.05", kind="finding"),
    Claim("min_nuclear_norm_completion_reverses",
          "The minimum-nuclear-norm solution (convex solver) of the A∪B problem reverses every held-out fact, "
          "that of the forward-only problem none (reference world, every seed)",
          "convex.AB.reverse_acc_min >= param.k0_99 and convex.none.reverse_acc_max <= param.k0_05",
          refuted_by="the convex A∪B solution missing a held-out reversal, or the forward-only one reversing some", kind="check"),
    Bound("gd_near_min_nuclear_norm",
          "Small-init GD on W_O W_V approaches the minimum-nuclear-norm solution: its nuclear norm at unit "
          "margin ‖W‖_*/γ_min is within 1.5× the convex optimum of the same A∪B problem (reference world)",
          value="ref.AB.nuc_ratio",
          refuted_by="‖W‖_*/γ_min of small-init A∪B GD ≥ 1.5× the convex minimum", kind="finding"),
    Better("factorization_lowers_nuclear_norm",
           "The implicit bias is a property of the factorization: the unfactorized W (GD's bias there is the "
           "minimum Frobenius norm) ends farther from the nuclear-norm optimum than W_O W_V",
           a="ref.AB_unfactorized.nuc_ratio", b="ref.AB.nuc_ratio",
           refuted_by="unfactorized ratio not above the factorized one beyond 2 s.e.", kind="finding"),
    Better("small_init_lowers_nuclear_norm",
           "A small init ends closer to the nuclear-norm optimum than a large one (same steps)",
           a="ref.AB_large_init.nuc_ratio", b="ref.AB.nuc_ratio",
           refuted_by="large-init ratio not above small-init's beyond 2 s.e.", kind="finding"),
    Better("factorization_lowers_nuclear_norm_main",
           "The same on the main world (n = 200), where the reversal is measured: the unfactorized W ends with a "
           "larger nuclear norm at unit margin ‖W‖_*/γ_min than W_O W_V from small init",
           a="main.AB_unfactorized.nuclear_at_margin", b="main.AB.nuclear_at_margin",
           refuted_by="unfactorized ‖W‖_*/γ_min not above small-init W_O W_V's on the main world", kind="finding"),
    Better("small_init_lowers_nuclear_norm_main",
           "On the main world (n = 200) the small init, which reverses, ends with a lower nuclear norm at unit "
           "margin than the large init (0.1), which does not (the low-nuclear-norm explanation of the bridge)",
           a="main.AB_large_init.nuclear_at_margin", b="main.AB.nuclear_at_margin",
           refuted_by="large-init ‖W‖_*/γ_min not above small-init's on the main world (then a lower nuclear norm "
                      "does not explain which arm reverses)", kind="finding"),
    Better("transformer_bridge_helps",
           "On a real one-layer causal transformer the A∪B bridge raises held-out reversal accuracy over "
           "forward-only data (the paper: ≈50% vs ≈0% for a fine-tuned 1B LM)",
           a="transformer.AB.reverse_acc", b="transformer.none.reverse_acc",
           refuted_by="A∪B transformer accuracy not above forward-only beyond 2 s.e.", kind="finding"),
]


class Config(ReportConfig):
    pass


def fmt_seeds(vals: list[float]) -> str:
    return ", ".join("n/a" if v is None else f"{v:.3g}" for v in vals)  # null: a non-finite value


def arm_table(metrics: dict, family: str, keys: list[str]) -> pl.DataFrame:
    rows = []
    for arm, m in metrics[family].items():
        row = {"arm": arm}
        for k in keys:
            if k in m:
                vals = np.array([np.nan if v is None else v for v in m[k]], dtype=float)
                vals = vals[np.isfinite(vals)]
                head = f"{vals.mean():.3g} ± {vals.std(ddof=1) if len(vals) > 1 else 0:.2g}" if len(vals) else "n/a"
                row[k] = f"{head} ({fmt_seeds(m[k])})"
        rows.append(row)
    return pl.DataFrame(rows)


ARM_ORDER = ["none", "A", "B", "AB", "AB_large_init", "AB_unfactorized"]  # one colour per arm in every panel


def _rank(arm: str) -> tuple[int, str]:
    return (ARM_ORDER.index(arm) if arm in ARM_ORDER else len(ARM_ORDER) + sum(map(ord, arm)) % 4, arm)


def curves_figure(history: pl.DataFrame, chance: float):
    fig, axes = plt.subplots(1, 4, figsize=(20, 4))
    panels = [(axes[0], "theory", "main", "reverse_acc", "one-layer W_O W_V (main world): held-out reversal"),
              (axes[1], "theory", "main", "nuclear_at_margin", "main world: ‖W_OV‖_* / γ_min"),
              (axes[2], "theory", "ref", "nuclear_at_margin", "reference world: ‖W_OV‖_* / γ_min"),
              (axes[3], "transformer", "main", "reverse_acc", "1-layer transformer: held-out reversal")]
    for ax, model, world, col, title in panels:
        sub = history.filter((pl.col("model") == model) & (pl.col("world") == world)).drop_nulls(col)
        mean = sub.group_by(["arm", "step"], maintain_order=True).agg(pl.col(col).mean()).sort("step")
        for arm in sorted(sub["arm"].unique(), key=_rank):
            a = mean.filter(pl.col("arm") == arm)
            ax.plot(a["step"], a[col], label=arm, color=f"C{_rank(arm)[0] % 10}")
        if col == "reverse_acc":
            ax.axhline(chance, color="grey", ls=":", label="chance 1/n")
            ax.set_ylim(-0.03, 1.03)
        else:
            ax.set_yscale("log")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def blocks_figure(blocks: dict):
    arms = [a for a in ("none", "AB", "AB_large_init") if a in blocks]
    fig, axes = plt.subplots(2, len(arms), figsize=(5 * len(arms), 9), squeeze=False)
    for j, arm in enumerate(arms):
        pb = np.array(blocks[arm]["pair_block"])
        lim = np.abs(pb).max() or 1.0
        ax = axes[0, j]
        im = ax.imshow(pb, cmap="RdBu_r", vmin=-lim, vmax=lim)
        for (r, c), v in np.ndenumerate(pb):
            ax.text(c, r, f"{v:.2f}", ha="center", va="center")
        ax.set_xticks([0, 1], ["in a_i", "in b_i"])
        ax.set_yticks([0, 1], ["out a_i", "out b_i"])
        ax.set_title(f"{arm}: mean held-out 2×2 block")
        fig.colorbar(im, ax=ax, fraction=0.046)
        eb = np.array(blocks[arm]["entity_block"])
        lim = np.abs(eb).max() or 1.0
        ax = axes[1, j]
        im = ax.imshow(eb, cmap="RdBu_r", vmin=-lim, vmax=lim)
        k = blocks[arm].get("entity_block_k", len(eb) // 2)
        ax.axhline(k - 0.5, color="k", lw=0.6)
        ax.axvline(k - 0.5, color="k", lw=0.6)
        ax.set_title(f"{arm}: W_OV on a_0..a_{k - 1} | b_0..b_{k - 1}")
        ax.set_xlabel("input token")
        ax.set_ylabel("output token")
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    return fig


def run(cfg: Config, ctx: StageContext) -> None:
    metrics = read_json(ctx.input("evaluate") / "metrics.json")
    blocks = read_json(ctx.input("evaluate") / "blocks.json")
    history = pl.read_csv(ctx.input("train") / "history.csv", infer_schema_length=None)
    models = read_json(ctx.input("train") / "models.json")
    mw, rw = metrics["main_world"], metrics["ref_world"]
    rep = Report(ctx, "Reversal curse: the Identity Bridge (one-layer models)",
                 "Training an autoregressive model on A→B facts does not teach B←A (the reversal curse). "
                 "Adding identity facts A→A (the Identity Bridge) lets even a one-layer transformer learn the "
                 "reversal: gradient descent on the factorized W_OV = W_O W_V from small init is biased toward "
                 "low nuclear norm, and with the identity facts the minimum-nuclear-norm completion is symmetric. "
                 "A 1B LM fine-tuned with the recipe reaches ≈50% reversal vs ≈0% without.")
    th = models["theory"]
    arm_inits = ", ".join(f"{a['name']}: {a['init_scale']:g}{'' if a['factorized'] else ' (unfactorized W)'}"
                          for a in th["arms"])
    rep.section("Setup", f"""
- Facts: pairs (a_i, b_i); vocabulary 2n + 3 (entities, r₊, r₋, r_id). Every pair's forward fact
  [a_i, r₊] → b_i is trained; 80% of pairs also train [b_i, r₋] → a_i; the other pairs' reverse facts are
  the test set (top-1 over the full vocabulary). Bridge arms add [e, r_id] → e for e in none / A / B / A∪B.
  **Each seed draws its own held-out pairs** (and its own initializations); seeds {metrics['seeds']}.
- Main world: n = {mw['n_pairs']} pairs, {mw['n_heldout']} held out per seed, chance 1/n = {mw['chance']:.4f};
  one-layer model logits = W_O W_V x̄ (x̄ the mean one-hot of the two input tokens: uniform attention),
  d = {th['main']['d']} ≥ n, full-batch GD (SGD, no momentum, no weight decay, lr {th['main']['lr']:g} on the mean
  cross-entropy, {th['main']['steps']} steps); init scales {arm_inits}. Arms with the same seed share one init.
- Reference world (for the convex solver): n = {rw['n_pairs']} pairs ({rw['n_heldout']} held out), d = {th['ref']['d']},
  lr {th['ref']['lr']:g}, {th['ref']['steps']} steps; the same arms. The minimum-nuclear-norm solution of each bridge's
  separable problem (min ‖W‖_* s.t. every training margin ≥ 1) is solved by cvxpy/SCS per seed, and GD's
  ‖W‖_*/γ_min (γ_min the smallest training margin) is reported as a ratio to that optimum.
- Real model: the shared TinyTransformer with one layer (causal attention, RoPE, RMSNorm, GELU MLP, untied
  unembedding) on the 2-token sequence, AdamW lr {models['transformer']['lr']:g}, {models['transformer']['steps']} steps,
  on the main world, every seed.
- Off-diagonal held-out asymmetry: u_i = W[a_i, b_i] (the reversal entry), v_i = W[b_i, a_i] (the forward entry)
  over held-out pairs, ‖u − v‖ / √(‖u‖² + ‖v‖²): 0 symmetric, 1 one-directional (diagonal entries, which the
  identity facts inflate, are excluded).
""")
    rep.table("One-layer model, main world (mean ± sd over seeds; per-seed values in brackets)",
              arm_table(metrics, "main", ["reverse_acc", "indist_reverse_acc", "forward_acc", "offdiag_asym",
                                          "nuclear_at_margin"]),
              "reverse_acc: held-out reversals; indist_reverse_acc: trained reversals; forward_acc: all forward facts.")
    rep.table("Reference world: GD vs the convex minimum-nuclear-norm solution",
              arm_table(metrics, "ref", ["reverse_acc", "offdiag_asym", "nuclear_at_margin", "nuc_ratio"]),
              "nuc_ratio = GD's ‖W‖_*/γ_min divided by the convex optimum of the same bridge's problem (1 = optimal).")
    rep.table("Convex minimum-nuclear-norm solutions (reference world)",
              arm_table(metrics, "convex", ["value", "reverse_acc", "offdiag_asym"]))
    rep.table("One-layer transformer, main world",
              arm_table(metrics, "transformer", ["reverse_acc", "indist_reverse_acc", "forward_acc"]))
    rep.figure("curves", curves_figure(history, mw["chance"]),
               "Held-out reversal accuracy and nuclear norm at unit margin ‖W_OV‖_*/γ_min vs step (mean over seeds)")
    rep.figure("w_ov_blocks", blocks_figure(blocks),
               "W_OV without the bridge, with the A∪B bridge, and with A∪B from a large init: mean 2×2 {a_i, b_i} "
               "block over held-out pairs, and W_OV on the first 20 a's and b's (first seed; forward entries W[b_i, a_i] "
               "bottom-left, reverse entries W[a_i, b_i] top-right)")
    for model, world, col in (("theory", "main", "reverse_acc"), ("transformer", "main", "reverse_acc"),
                              ("theory", "ref", "nuclear_at_margin")):
        wide = (history.filter((pl.col("model") == model) & (pl.col("world") == world))
                .group_by("arm", "step", maintain_order=True).agg(pl.col(col).mean()).sort("step")
                .pivot(on="arm", index="step", values=col))
        wide = wide.select("step", *sorted(c for c in wide.columns if c != "step"))  # group_by order is not stable
        label = f"{model}_{world}_{col}" if model == "theory" else f"{model}_{col}"
        rep.plot(label, wide, x="step", y=[c for c in wide.columns if c != "step"],
                 title=f"{model} ({world} world): {col.replace('_', ' ')} vs step, mean over seeds")
    rep.section("Deviations", """
| what | paper / official code | here | why |
| --- | --- | --- | --- |
| model | 1B pretrained LM fine-tuned with the recipe; the theory's one-layer model | the theory's one-layer model trained from scratch, and a from-scratch 1-layer transformer | the CPU budget; the one-layer model is what the theorem is about |
| data | natural-language facts about people | synthetic entity pairs with relation tokens r₊, r₋, r_id | no download; the structure of the task is kept |
| convex reference | stated in the theorem | solved numerically on a smaller reference world (cvxpy/SCS), GD rerun there | SCS on the main world's 403×403 nuclear norm takes minutes |
| unfactorized ablation | — | trained with plain cross-entropy on gathered logits (no hidden layer to fuse) | the fused kernel fuses a hidden→vocabulary product the unfactorized W does not have |
| GD step | — | lr on the mean loss over all facts of the world | full-batch GD; a step that is too large (50 at n = 200) breaks the reversal |
""")
    rep.section("Discussion", f"""
The paper fine-tunes a pretrained 1B-parameter LM on natural-language facts and reports ≈50% reversal
with the Identity Bridge vs ≈0% without; it proves the mechanism for a one-layer transformer whose
W_OV = W_O W_V is trained by GD from small init. This miniature trains the one-layer model and a
one-layer transformer from scratch on {mw['n_pairs']} synthetic pairs, so it tests the mechanism, not the
LM result: it does not reproduce pretraining, natural-language entity names, multi-token entities, or
the 1B model's partial (≈50%) success. The nuclear-norm claims are measured where the convex problem is
solvable on 2 CPU cores (n = {rw['n_pairs']}); GD converges to the max-margin direction only logarithmically
in the number of steps, so the ratio to the optimum stays above 1 at any finite budget. Which kernel path
ran (and its parity against the torch reference on real inputs) is stated below from the stages' records.
""")
    rep.section("Threats to validity", f"""
Red-team pass on this design (what could make a verdict wrong, and what remains):

- **Decided by construction?** The convex check (`min_nuclear_norm_completion_reverses`) is a property of the
  optimisation problem, not of training, so it is a check. The GD claims can fail: a step size too large, a
  large init or the unfactorized W all break the reversal (the ablation arms show it), and the thresholds
  (held-out reversal below 0.05, asymmetry bands, 1.5× the convex optimum, min effects) are fixed in params
  `papers.reversal_curse.report.claims` before the run.
- **Budget.** GD approaches the max-margin direction only logarithmically in steps, so `gd_near_min_nuclear_norm`
  depends on the step budget (the nuclear-norm-vs-step curve is recorded and plotted). The transformer arm
  trains {models['transformer']['steps']} steps; its verdict is about that budget.
- **Nuclear norm on which world.** The ratio to the convex optimum is only computable on the small reference world
  (n = {rw['n_pairs']}); the main world (n = {mw['n_pairs']}), where the reversal is measured, gets the raw
  ‖W‖_*/γ_min comparisons (`*_main` claims). An earlier review found the large-init arm, which does not reverse,
  *lower* there than small-init A∪B, and the 1.5× threshold of `gd_near_min_nuclear_norm` met by the
  non-reversing large-init arm too on the reference world: if the `*_main` claims fail, the low-nuclear-norm
  story does not explain which GD solution reverses, whatever the reference-world ratios say.
- **Held-out sets.** Each seed draws its own held-out pairs ({mw['n_heldout']} per seed); accuracy claims use seed
  variance only (no per-item lists), which includes the held-out draw.
- **Scale.** From-scratch one-layer models on synthetic pairs test the theorem's mechanism, not the 1B LM's
  ≈50% reversal (Discussion); a full-strength pretrained baseline is out of scope here.
""")
    rep.finish(CLAIMS, metrics)
