"""report@clip_binding: coverage sweep, complexity sweep, additivity; claims with seed-aware verdicts.

    python -m stages report clip_binding [--profile smoke]
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import polars as pl

from stages.common.claims import Better, Bound
from stages.common.config import ReportConfig
from stages.common.paths import read_json
from stages.common.reporting import Report
from stages.common.runner import StageContext
from stages.clip_binding.complexity import FAMILIES
from stages.clip_binding.prepare import frac_key


class Config(ReportConfig):
    """Thresholds live in params.yaml papers.clip_binding.report.claims (min effects, bounds)."""


def _th(cfg: Config, name: str, key: str) -> str:
    """A claim's threshold from params, for the statement text only (the claim itself binds it)."""
    v = cfg.claims.get(name, {}).get(key)
    return "the params threshold" if v is None else f"{v:g}"


LEARNED = "seen_binding_learned_*"     # the params key (glob) of the per-coverage seen-binding checks


def claims(cfg: Config, lo: str, hi: str, clo: str, chi: str, fracs: list[str]) -> list:
    learned = _th(cfg, LEARNED, "above")
    gate = [Bound(f"seen_binding_learned_{f}",
                  f"Seen binding learned ({f}), the strict recombination test: for pairs of TRAINING objects that "
                  f"differ in every concept and whose recombinations are training objects too, every 2-object scene "
                  f"of the same bag of concept values ranks its own two objects' probes above the other "
                  f"recombinations' (impossible for a bag-of-concepts scene code) on more than {learned} of the "
                  f"pairs; gates the reading of the coverage finding",
                  value=f"coverage.{f}.train_recomb_acc", n_items=f"coverage.{f}.n_train_recomb_items",
                  refuted_by=f"recombination accuracy on seen objects at or below {learned}: coverage would be tested "
                             "on encoders that do not bind even seen objects", kind="check") for f in fracs]
    sharp = _th(cfg, "coverage_sharpens_binding", "min_effect")
    sharp_d = _th(cfg, "coverage_sharpens_binding_distinct", "min_effect")
    gen = _th(cfg, "mult_generalizes_trained", "above")
    gen_w = _th(cfg, "mult_within_generalizes_trained", "above")
    fail = _th(cfg, "nothing_generalizes_control", "below")
    add = _th(cfg, "scene_embeddings_additive", "above")

    def coverage_claim(name: str, suffix: str, effect: str, what: str, metric: str) -> Better:
        """f_hi vs f_lo on coverage.<f>.binding_acc<suffix> (unpaired test scenes, binomial item noise)."""
        return Better(name, f"{what}: the {hi} models beat the {lo} models by more than {effect}",
                      a=f"coverage.{hi}.binding_acc{suffix}", b=f"coverage.{lo}.binding_acc{suffix}",
                      n_items=f"coverage.{hi}.n_binding{suffix}_items", paired_items=False, items_shared=False,
                      refuted_by=f"{hi} {metric} not above {lo} + {effect} on a majority of seeds (or the gap within "
                                 "the one-sided t-bound)", kind="finding")

    return [
        coverage_claim("coverage_sharpens_binding", "", sharp,
                       "Held-out-object binding accuracy (2-object scenes of unseen objects) rises sharply with "
                       "coverage", "binding accuracy"),
        coverage_claim("coverage_sharpens_binding_distinct", "_distinct", sharp_d,
                       "... on the 2-object scenes of unseen objects that differ in EVERY concept (a scene sharing a "
                       "concept value is passed by the bag-of-concepts oracle, so there the official score reads "
                       "concept recognition, not binding)", "accuracy on every-concept-differing scenes"),
        Bound("mult_generalizes_trained",
              f"For the trained encoder the multiplicative slot model generalizes to unseen objects from "
              f"a low split fraction ({clo}): R² above {gen}",
              value=f"complexity.trained.mult.{clo}.r2",
              refuted_by=f"mult R² at {clo} at or below {gen}", kind="finding"),
        Bound("mult_within_generalizes_trained",
              f"For the trained encoder the within-object multiplicative slot model (product of each object's "
              f"concept slots, official --mult_within_obj) generalizes to unseen objects from a low split "
              f"fraction ({clo}): R² above {gen_w}",
              value=f"complexity.trained.mult_within.{clo}.r2",
              refuted_by=f"mult_within R² at {clo} at or below {gen_w}", kind="finding"),
        Bound("nothing_generalizes_control",
              f"Control sanity: for the high-complexity control (scene = Σ g(obj), g a random table) no regressor "
              f"family generalizes even at the highest split fraction ({chi}): best R² below {fail}",
              value=f"complexity.control.best_r2.{chi}",
              refuted_by=f"some family reaching R² >= {fail} on the control's unseen objects", kind="check"),
        Better("trained_lower_complexity_than_control",
               f"Control comparison: the trained encoder's binding function is lower-complexity than the control's: the best "
               f"regressor family reaches a higher R² on unseen objects ({clo} split)",
               a=f"complexity.trained.best_r2.{clo}", b=f"complexity.control.best_r2.{clo}",
               refuted_by="control best R² >= trained best R² on most seeds", kind="check"),
        Better("trained_beats_control_probe",
               f"Control comparison: embeddings of unseen objects predicted by the best regressor family (highest final R², per seed; "
               f"{clo} split) are recognised by the encoder's own frozen object probes more often for the trained "
               "encoder than for the control",
               a=f"complexity.trained.best_probe_acc.{clo}", b=f"complexity.control.best_probe_acc.{clo}",
               refuted_by="control probe accuracy >= trained on most seeds", kind="check"),
        Bound("scene_embeddings_additive",
              f"Trained scene embeddings are additive over objects: y(a,b) ≈ μ + A1[a] + A2[b] with held-out "
              f"R² above {add}",
              value="additivity.trained",
              refuted_by=f"additive-fit R² at or below {add}", kind="finding"),
    ] + gate


def _mean_se(xs) -> tuple[float, float]:
    """Mean and s.e. over the seeds with a finite value (a seed whose test had no items is null in eval.json)."""
    x = np.asarray(xs, dtype=float)
    x = x[np.isfinite(x)]
    if not len(x):
        return float("nan"), float("nan")
    return float(x.mean()), float(x.std(ddof=1) / np.sqrt(len(x))) if len(x) > 1 else 0.0


def run(cfg: Config, ctx: StageContext) -> None:
    ev = read_json(ctx.input("evaluate") / "eval.json")
    meta = read_json(ctx.input("prepare") / "meta.json")
    hist = pl.read_csv(ctx.input("train") / "history.csv")
    cov, cx = ev["coverage"], ev["complexity"]
    fracs = meta["train_object_fractions"]
    cfracs = meta["complexity_fractions"]
    lo, hi = frac_key(fracs[0]), frac_key(fracs[-1])
    clo, chi = frac_key(cfracs[0]), frac_key(cfracs[-1])
    kinds = [k for k in ("trained", "control", "clip") if k in cx]     # clip: only with a real CLIP (full)
    metrics = {"coverage": cov, "complexity": {k: cx[k] for k in kinds},
               "additivity": cx["additivity"], "seeds": ev["seeds"], "world": {k: meta[k] for k in ("k", "v", "n_max", "n_objects")}}
    rep = Report(ctx, "How embedding models bind concepts (clip_binding)",
                 "Scene embeddings decompose additively into object representations, but whether a binding "
                 "function generalizes to unseen concept combinations depends on its complexity: CLIP's is "
                 "high-complexity and does not; transformers trained from scratch with enough coverage learn "
                 "low-complexity (multiplicative) binding that does.")
    rep.section("Setup", f"""
World: k = {meta['k']} concepts × v = {meta['v']} values ({meta['n_objects']} objects); scenes of 1..{meta['n_max']}
objects drawn with replacement, tokenised [SOO, c1, c2, EOO]… EOS. Scene and probe encoders (pre-LN bidirectional
transformers, EOS → linear) are trained from scratch per coverage fraction {fracs} and seed {ev['seeds']} with
logits min(exp τ, 10)·cos and a soft cross-entropy over pooled concept and object queries with swap negatives
(one per 2-object scene), on scenes of training objects only; test scenes use only held-out objects
({meta['test_scenes']} per model). **Binding accuracy** = share of 2-object test scenes (distinct objects) whose
lowest positive object logit beats every negative (incl. swap negatives) in the pooled batch.
`bag_binding_acc` is the oracle bag-of-concepts scorer's accuracy on the same queries (no binding).
Complexity: the 2-object scene embeddings of the {frac_key(cx['encoder_fraction'])} encoders and of a
high-complexity control (y = g(a) + g(b), g a random Gaussian table; stands in for CLIP) are regressed from
concept ids (4 slot tables) with concat-MLP / multiplicative / sum+mult models trained on scenes of seen
objects (split fractions {cfracs}), tested on scenes of two unseen objects (R², SST about the mean of all
scenes; frozen-probe accuracy = predicted embedding scored against the encoder's own object probes).
Additivity: least-squares fit y(a,b) ≈ μ + A1[a] + A2[b], R² on 20% held-out scenes.
""")
    rows = []
    for f in fracs:
        c = cov[frac_key(f)]
        row = {"train_object_fraction": f}
        for k in ("binding_acc", "binding_acc_distinct", "bag_binding_acc_distinct", "object_acc", "concept_acc",
                  "bag_binding_acc", "train_binding_acc",
                  "train_bag_binding_acc", "train_binding_acc_any_neg", "recomb_acc", "recomb_acc_lenient",
                  "train_recomb_acc", "train_recomb_acc_lenient", "probe_additive_r2"):
            m, s = _mean_se(c[k])
            row[k] = m
            row[k + "_se"] = s
        rows.append(row)
    cov_frame = pl.DataFrame(rows)
    rep.table("Results: coverage sweep (held-out objects, mean over seeds)",
              cov_frame.select("train_object_fraction", "binding_acc", "binding_acc_se", "binding_acc_distinct",
                               "binding_acc_distinct_se", "bag_binding_acc_distinct", "object_acc",
                               "concept_acc", "bag_binding_acc", "train_binding_acc", "train_binding_acc_se",
                               "train_bag_binding_acc", "train_binding_acc_any_neg", "recomb_acc",
                               "recomb_acc_lenient", "train_recomb_acc", "train_recomb_acc_se",
                               "train_recomb_acc_lenient", "probe_additive_r2"),
              "binding_acc / object_acc / concept_acc on scenes of unseen objects (bag_binding_acc: the oracle on the "
              "same queries); *_distinct: the same scores on the 2-object scenes whose objects differ in every "
              "concept (the others are passed by the oracle without binding). train_binding_acc on 2-object scenes of SEEN objects with swap negatives drawn as in "
              "training (training objects only), train_bag_binding_acc the oracle there; train_binding_acc_any_neg the "
              "same scenes with swap negatives from ALL objects (held-out objects' probes were never trained as "
              "negatives, so this mixes seen binding with held-out probes). recomb_acc / train_recomb_acc: the "
              "strict recombination test on distinct pairs of unseen / seen objects (every 2-object scene of the "
              "pair's bag of concept values ranks its own objects above the other recombinations; 0 for a "
              "bag-of-concepts scene code); *_lenient: only the given scene (random scores 1/6; passable without "
              "binding when probe norms differ); "
              "probe_additive_r2: R² of the probe's object embeddings fitted as a sum of per-concept vectors.")
    rep.plot("coverage", cov_frame.select("train_object_fraction", "binding_acc", "bag_binding_acc", "train_binding_acc"),
             x="train_object_fraction", y=["binding_acc", "bag_binding_acc", "train_binding_acc"],
             title="clip_binding: binding accuracy vs coverage")
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for k, lab in (("binding_acc", "held-out binding acc"),
                   ("binding_acc_distinct", "held-out, every concept differs"),
                   ("train_binding_acc", "seen-object binding acc"),
                   ("bag_binding_acc", "bag-of-concepts oracle")):
        ax.errorbar(fracs, cov_frame[k].to_list(), yerr=(2 * cov_frame[k + "_se"]).to_list(), marker="o", label=lab, capsize=3)
    ax.set_xlabel("train object fraction (coverage)")
    ax.set_ylabel("accuracy (2-object scenes)")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=8)
    rep.figure("accuracy_vs_coverage", fig, "Binding accuracy vs coverage (mean ± 2 s.e. over seeds)")

    # learning curve recorded by the train stage: seen-object binding accuracy and loss vs step
    lc = hist.filter(pl.col("seen_binding_acc").is_not_null()) if "seen_binding_acc" in hist.columns else None
    bound = cfg.claims.get(LEARNED, {}).get("above")
    if lc is not None and lc.height:
        has_rc = "seen_recomb_acc" in lc.columns
        curve = (lc.group_by(["fraction", "step"]).agg(pl.col("seen_binding_acc").mean(), pl.col("loss").mean(),
                                                       *([pl.col("seen_recomb_acc").mean()] if has_rc else []))
                 .sort(["fraction", "step"]).with_columns(pl.format("f={}", pl.col("fraction")).alias("coverage")))
        rep.plot("learning_curve", curve.select("step", "seen_binding_acc", "coverage"), x="step",
                 y="seen_binding_acc", series="coverage",
                 title="clip_binding: seen-object binding accuracy vs step (mean over seeds)")
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.5))
        for (f, sd), sub in lc.group_by(["fraction", "seed"], maintain_order=True):
            lab = f"f={f}" if sd == ev["seeds"][0] else None
            col = f"C{fracs.index(f)}"
            a1.plot(sub["step"], sub["seen_binding_acc"], lw=0.9, color=col, label=lab)
            if has_rc:
                a1.plot(sub["step"], sub["seen_recomb_acc"], lw=0.9, color=col, ls=":",
                        label=f"{lab}, strict recombination test" if lab else None)
            a2.plot(sub["step"], sub["loss"], lw=0.9, color=col, label=lab)
        if bound is not None:
            a1.axhline(bound, color="k", ls="--", lw=0.7, label="'learned' bound (params)")
        a1.set_xlabel("step"); a1.set_ylabel("seen-object binding acc"); a1.set_ylim(-0.02, 1.02)
        a1.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3)
        a2.set_xlabel("step"); a2.set_ylabel("training loss (concept + object)"); a2.legend(fontsize=7)
        rep.figure("learning_curve", fig, "Learning curve recorded by the train stage: binding accuracy on a fixed "
                   "set of 2-object scenes of training objects (solid: the official pooled score; dotted: the "
                   "strict recombination test, nan where no pair qualifies) and training loss (right), per coverage "
                   "and seed")
    bound_txt = "the params bound" if bound is None else f"{bound:g}"
    mean_of = lambda f, k: _mean_se(cov[frac_key(f)][k])[0]              # noqa: E731
    seen_by_f = {f: mean_of(f, "train_recomb_acc") for f in fracs}
    pairs_by_f = {f: cov[frac_key(f)]["n_train_recomb_pairs"] for f in fracs}
    # every seed of every level above the bound (a seed without a qualifying pair does not count as binding)
    binds = all(bound is not None and all(v is not None and v == v and v > bound
                                          for v in cov[frac_key(f)]["train_recomb_acc"]) for f in fracs)
    per_f = "; ".join(f"{f:g}: pooled {mean_of(f, 'train_binding_acc'):.3f} (bag-of-concepts oracle "
                      f"{mean_of(f, 'train_bag_binding_acc'):.2f}), strict recombination test {mean_of(f, 'train_recomb_acc'):.3f} "
                      f"on {pairs_by_f[f]} pairs per seed (lenient {mean_of(f, 'train_recomb_acc_lenient'):.3f}), "
                      f"probe additive R² {mean_of(f, 'probe_additive_r2'):.3f}" for f in fracs)
    rep.section("Were the encoders trained to bind seen objects?", f"""
The coverage finding only tests the paper when the encoders bind the objects they were trained on. The official
accuracy (the lowest positive logit beats every negative in the batch's pooled queries, `train_binding_acc`) does
not show that on its own: it is decided by which negatives happen to be in the pool. A red-team probe found the
probe encoder's object embeddings close to additive in the concepts (column `probe_additive_r2`); with an additive
code of equal norms the two positives' logits sum to the two recombinations' (objects (a1, b2) and (a2, b1) for a
scene of (a1, b1) and (a2, b2)), so a scene can only be scored right when not both recombinations are in the pool,
and at low coverage few recombinations are training objects. The checks `seen_binding_learned_*` therefore read
the **strict recombination test** (`train_recomb_acc`): for each distinct pair of training objects that differ in
every concept and whose recombinations are training objects too, BOTH 2-object scenes of that bag of concept values
((a1, b1) + (a2, b2) and (a1, b2) + (a2, b1)) must rank their own two objects' probes above the other two — a
scene encoder that sees only the bag of concepts gives both scenes one embedding and cannot, whatever the probe
code. (The lenient version, only the given scene, can be passed without binding when probe norms differ; it is in
the table.) At f25 few training pairs qualify (their recombinations are mostly held-out objects), so that check
has few items or none (non-finite: inconclusive by rule). The bound is {bound_txt} (params: the paper's from-scratch
encoders fit their training scenes). Per coverage (mean over seeds): {per_f}. **Coverage was tested on encoders that {'bind' if binds else 'do NOT all bind'} seen objects**
(strict recombination test above the bound on every seed at every coverage level: {'yes' if binds else 'no'}){'' if binds else '; the coverage finding is then a statement about this budget, not about the paper'}.
""")

    lines = []
    for f in fracs:
        c = cov[frac_key(f)]
        held, bag, seen, sbag = (float(np.mean(c[k])) for k in ("binding_acc", "bag_binding_acc", "train_binding_acc",
                                                                 "train_bag_binding_acc"))
        strict = _mean_se(c["recomb_acc"])[0]
        lines.append(f"- coverage {f:g}: held-out pooled binding accuracy {held:.3f} is "
                     f"{'above' if held > bag else 'at or below'} the bag-of-concepts oracle ({bag:.3f}); on seen "
                     f"objects the same score is {seen:.3f} ({'above' if seen > sbag else 'at or below'} the oracle's "
                     f"{sbag:.3f} there); the strict recombination test on held-out pairs reads {strict:.3f}.")
    rep.section("Reading the coverage sweep", "The bag-of-concepts oracle rejects every negative one of whose concept "
                "values is missing from the scene and accepts every recombination, so a model that binds beats it; "
                "beating it does not show binding, though: a probe code close to additive (this run's) beats it "
                "wherever the pool lacks a scene's recombinations (see the section above). The strict recombination "
                "test is the binding reading.\n\n" + "\n".join(lines))

    crow = []
    for kind in kinds:
        for fam in FAMILIES:
            for c in cfracs:
                d = cx[kind][fam][frac_key(c)]
                crow.append({"encoder": kind, "family": fam, "split_fraction": c,
                             "r2": _mean_se(d["r2"])[0], "r2_se": _mean_se(d["r2"])[1],
                             "r2_restart_min": float(np.min(d["r2_restarts"])),
                             "r2_restart_max": float(np.max(d["r2_restarts"])),
                             "r2_restart_sd": float(np.mean([np.std(x, ddof=1) if len(x) > 1 else 0.0
                                                             for x in d["r2_restarts"]])),
                             "probe_acc": _mean_se(d["probe_acc"])[0],
                             "best_eval_r2": _mean_se(d["best_eval_r2"])[0],
                             "true_probe_acc": _mean_se(cx[kind]["true_probe_acc"][frac_key(c)])[0]})
    cx_frame = pl.DataFrame(crow)
    rep.table("Results: binding-function complexity (unseen objects)", cx_frame,
              "r2 = mean over seeds of each seed's median R² over the regression restarts; r2_restart_min/max = the "
              "extremes over all seeds × restarts, r2_restart_sd = the mean within-seed sd over restarts. "
              "true_probe_acc = the frozen probes applied to the encoder's actual embeddings (ceiling). "
              "best_eval_r2 = the best test R² over 8 evaluations during the fit, the number the official code "
              "reports (selected on the test scenes, so optimistic; the claims use the final r2).")
    wide = cx_frame.with_columns((pl.col("encoder") + "_" + pl.col("family")).alias("arm")).pivot(
        on="arm", index="split_fraction", values="r2")
    rep.plot("r2_vs_fraction", wide, x="split_fraction", y=[c for c in wide.columns if c != "split_fraction"],
             title="clip_binding: R² on unseen objects vs split fraction")
    fig, axes = plt.subplots(1, len(kinds), figsize=(4.5 * len(kinds), 3.5), sharey=True)
    for ax, kind in zip(axes, kinds):
        for fam in FAMILIES:
            sub = cx_frame.filter((pl.col("encoder") == kind) & (pl.col("family") == fam))
            ax.errorbar(sub["split_fraction"].to_list(), sub["r2"].to_list(), yerr=(2 * sub["r2_se"]).to_list(),
                        marker="o", label=fam, capsize=3)
        ax.axhline(0, color="gray", lw=0.5)
        ax.set_ylim(-1.5, 1.05)   # the multiplicative fits reach R² << -1: clipped, exact values in the table
        ax.set_title({"trained": "trained encoder", "control": "high-complexity control",
                      "clip": "CLIP text tower (captions)"}[kind])
        ax.set_xlabel("object split fraction (seen objects)")
    axes[0].set_ylabel("R² on scenes of unseen objects")
    axes[0].legend(fontsize=8)
    rep.figure("r2_vs_fraction", fig, "R² vs train fraction per regressor family (mean ± 2 s.e.; axis clipped at −1.5, exact values in the table)")
    add = cx["additivity"]
    rep.table("Results: additivity", pl.DataFrame({
        "encoder": kinds,
        "additive_r2": [_mean_se(add[k])[0] for k in kinds],
        "per_seed": [str([round(x, 4) for x in add[k]]) for k in kinds]}),
        "The control is additive by construction (y = g(a) + g(b)); it is a sanity check of the fit, not evidence.")
    fig, ax = plt.subplots(figsize=(5, 3))
    for (f, s), sub in hist.group_by(["fraction", "seed"], maintain_order=True):
        ax.plot(sub["step"], sub["object_loss"], lw=0.8, label=f"f={f} s={s}" if s == ev["seeds"][0] else None)
    ax.set_xlabel("step")
    ax.set_ylabel("object-query soft CE")
    ax.legend(fontsize=7)
    rep.figure("training_curves", fig, "Training loss (object queries) per coverage fraction and seed")
    kw = read_json(ctx.input("train") / "models.json")["kwargs"]
    here = (f"k={meta['k']}, v={meta['v']}, d={kw['d_model']}, {kw['n_layers']} layers, FF {kw['d_ff']}, "
            f"{kw['steps']} steps, bs {kw['batch_size']}, lr {kw['lr']:g}")
    rep.section("Deviations", f"""
| what | paper / official code | here | why |
| --- | --- | --- | --- |
| scale | k=2, v=20, d=256, 6 layers, FF 2048, 50k steps, bs 512, lr 3e-5 | {here} | 2-CPU budget; the full profile restores the official sizes. Steps fixed from the learning curve of this train stage (figure above; first read on a pilot of the same code, f25 and f75, seed 0, before this run): seen-object binding reaches ~0.98 by step 750 at f25 and flattens at ~0.7 at f75 from step ~1500 to 3000 (d = 32: 0.70 at 1500, 0.75 at 3000; d = 64: 0.72 at 2500; v = 6: 0.75 at 3000; d_out 64: 0.69 at 1250; 3 layers: 0.67 at 750), so steps beyond {kw['steps']} buy little here at ~9 × 0.027 s CPU per step |
| seeds | one process per run | the 3 seeds of a coverage level trained one after the other (solo), not as the shared `SeedEnsemble` | measured: the vmapped ensemble was not faster (3 seeds × 40 steps, d = 64: 4.07 s CPU vs 3.75 s solo; d = 32: 3.19 vs 3.27 s), because `nn.MultiheadAttention`'s SDPA has no vmap batching rule on CPU and runs per member; its gradients matched the solo run's to 3e-8 |
| seen-object binding | train accuracy on training batches | the checks read the recombination test (`train_recomb_acc`: both objects above every recombination, 2-object scenes of training objects differing in every concept); `train_binding_acc`: the official pooled score on 2-object scenes of training objects, swap negatives from training objects (as trained); `train_binding_acc_any_neg` also lets held-out objects be negatives | the pooled score passes an additive (bag-of-concepts) probe code wherever the pool lacks a scene's recombinations (Threats);  held-out objects are never negatives in training (row below), so their probes are untrained as negatives: the any-negative score mixes seen binding with untrained probes |
| swap negatives | may be held-out objects in training (train_probe_all_objects=True, as read) | only training objects (`heldout_negatives: false`) | with held-out objects as negatives only, their probes are pushed away from every scene and held-out accuracy collapses (measured ~0 in a pilot); configurable |
| split | random object split | redrawn until every concept value is in the training objects | failure must be about binding, not about unseen tokens |
| checkpoint | best test checkpoint used downstream | final checkpoint | no test-set selection |
| complexity fit | all seen pairs, 4000 full-batch Adam steps, best R² over evals, one init | ≤ `max_train_scenes` seen pairs, `reg_steps` steps, final R², median over `reg_restarts` inits | budget; no selection on the test set; single fits are unstable across inits (spread reported) |
| within-object multiplicative probe | `--mult_within_obj` flag | family `mult_within`: [E1(a1)⊙E2(a2) ; E3(b1)⊙E4(b2)] → linear, as read from the flag's name and the card | exact official layer not transcribed |
| CLIP | real CLIP (ViT) image embeddings of rendered scenes | default: random-table control y = Σ g(obj); `full`: also a real CLIP **text** tower (`transformers.CLIPModel`, `evaluate.source`) on scene captions "a red cube and a blue sphere" | no weights can be downloaded here and no renderer; the CLIP path is tested on a tiny random CLIPModel in the real checkpoint layout (tests/clip_binding/test_real_source.py) |
| additivity | AdamW on slot tables, 99/1 split | closed-form ridge least squares, 80/20 split | exact optimum of the same model |
""")
    rep.section("Threats to validity", f"""
Red-team passes by the author and by a second reviewer who did not write the code (issue 52):

- **The official pooled score does not show binding (second reviewer).** The probe encoder's object code is almost
  additive in the concepts (a ridge fit q(o) ≈ μ + A1[c1] + A2[c2]: R² 0.998 on the f75 training objects in its
  probe; 0.91–0.97 over all objects here, column `probe_additive_r2`).
  With an additive code a scene can only be scored right by the pooled score when not both of its recombinations are
  in the pool; on the committed splits that ceiling is 0.97–1.00 at f25, 0.84–0.85 at f50 and 0.55–0.59 at f75 —
  where the earlier encoders' pooled seen scores sat (0.98 / 0.88 / 0.66). So the f25 encoders' high pooled
  score was not evidence of binding. The seen-binding checks now read the recombination test (above); the pooled
  score stays in the table. The reviewer also found no faithful change to the loss that lifts f75: the official
  swap negatives from all objects, GELU + xavier (adopted here, official), the official FF width 2048, a positive
  cap, other temperatures, an object-only loss and a 4x larger probe encoder all plateau at 0.56–0.65 pooled;
  only a free per-object probe table (not the paper's model: it cannot embed unseen objects) binds f75 (0.98).
  The official code's query pool is ~224 objects per batch (batch 512, v = 20), more competitors than here, not
  fewer (correcting `reports/studies/clip_binding_f75_probe.md`).
- **The recombination test itself (a third reviewer).** The first version (the given scene only, now the
  `*_lenient` columns) could be passed without binding: under cosine an additive probe code with unequal norms
  scores the positives above the recombinations (a hand-worked k = v = 2 case passes; with a free scene vector
  600 of 600 scenes are passable), and probes of recombinations never trained as negatives are easy to beat — on
  pairs whose recombinations are both training objects the lenient score was near chance (0.15–0.26 at f50/f75).
  Hence the strict test on pairs whose whole bag is training objects, each pair once (the first version drew
  scenes with replacement, overstating its item count). The reviewer recomputed the first version's
  `train_recomb_acc` for all 9 encoders in float64 numpy and matched eval.json exactly. The 0.9 bound was set
  for the pooled score; a v = 4 probe (study file) reached 0.84 on the lenient test, so the bound may be out of
  reach at this budget. The coverage finding moved from *fails* (previous run) to *inconclusive* with the GELU +
  xavier retrain, not with the change of gate (no finding reads the gate).

- **Budget and capacity decide the coverage finding.** {kw['steps']} steps of d = {kw['d_model']} encoders against the
  official 50k steps of d = 256, 6 layers: the learning curve and the `seen_binding_learned_*` checks show whether
  the encoders bind even SEEN objects; where a check fails, `coverage_sharpens_binding` (whatever its verdict) tests
  this budget, not the paper's effect. The curve flattens at high coverage well below the bound in 3000-step pilots,
  so a few times more steps would not obviously fix it; the official scale (`full` profile) is not run here.
- **What the coverage verdict can and cannot say (this run).** Read with the `seen_binding_learned_*` verdicts: where
  no coverage level passes the recombination test, `coverage_sharpens_binding` compares encoders that have not
  learned to bind even their training objects; whatever its verdict, it is then decided by the budget and
  capacity, not evidence for or against the paper. Held-out binding at or below the bag-of-concepts oracle at low
  coverage is consistent with the paper's low-coverage failure, a single observation that no claim tests.
- **Where seen binding is learned: the v = 6 study.** The binding search (`reports/studies/clip_binding_binding_search.md`)
  found one miniature that binds its training objects: v = 6, d = 64, 4 layers, d_ff 256, batch 128, 3000 steps
  (~150–200 CPU-s per encoder, 9 encoders: ~5x this default's budget). That configuration runs THIS pipeline
  (same code, claims and thresholds) as a committed study outside the DVC graph,
  [`reports/studies/clip_binding_v6_binding/report.md`](../studies/clip_binding_v6_binding/report.md)
  (its `study.json` names the overrides and the command that regenerates it); read its `seen_binding_learned_*`
  gate before its coverage verdict. It is not re-run by `dvc repro`.
- **Red team of that study (a reviewer who did not write it; its own numpy recount of the held-out pools and one
  re-trained encoder matched the study's numbers exactly).** (1) The official pooled score mixes concept
  recognition with binding: 2-object scenes whose objects share a concept value (23–37% of the items) are passed
  by the bag-of-concepts oracle, and the f25 encoders fail many of them because they misread the concept values
  of unseen objects; on the scenes that need binding the reviewer put the binding part of the coverage gap near
  0.03–0.12. Hence `coverage_sharpens_binding_distinct` (the same 0.2 minimum effect, every-concept-differing
  scenes only), beside the paper's pooled score. (2) The held-out recombination tests sit near chance at every
  coverage (lenient: 1/6 by chance; at f75 the strict test equals the lenient one because the partner scene is made
  of training objects). (3) The seen-binding gate's item noise p(1 − p)/m is 0 when every pair passes, so a level
  with 16–20 pairs per seed reads a zero-width bound (an exact per-seed 95% lower bound for 16 of 16 is 0.83);
  the number of qualifying pairs also grows with coverage (about 2 / 17 / 136 at v = 6), so the f25 gate can
  barely be tested. (4) The configuration is an existence result of a search (35 probes, seed 0, training
  curves only): binding there is fragile (the same model with 1,200 steps or at v = 8 does not bind).
- **Complexity analysis on the highest-coverage encoders.** The regressors read the f75 encoders (the paper's
  well-covered setting); where those do not bind seen objects, the mult / mult_within verdicts describe encoders
  without learned binding.
- **Independent check (author, outside the pipeline, ReLU encoders of the previous run).** Seen-object pooled
  binding accuracy of the 9 encoders was recomputed in float64 numpy (no kernel) on 1024 new 2-object scenes per
  model: f25 0.988 / 1.000 / 0.974, f50 0.869 / 0.887 / 0.888, f75 0.651 / 0.639 / 0.662 (seeds 0 / 1 / 2), within
  item noise of that run's table; the recombination test is checked against a per-scene loop in the tests.
- **Seen-binding bound.** 0.9 was fixed in params from the paper's notion of "learned" (encoders fit their training
  scenes) after the pilot curves had been seen (f25 ~0.98, f75 ~0.7); it was not moved to pass or fail a level,
  nor when the checks moved from the pooled score to the recombination test (a change of what is measured, made
  before this run's numbers existed).
- **Seen binding measured with training-distribution negatives.** Held-out objects are never swap negatives in
  training (Deviations); with them as negatives (`train_binding_acc_any_neg`) seen-object accuracy is lower, because
  held-out probes were never pushed away from scenes. Earlier versions of this report (500 steps) read seen binding
  that way (0.39–0.50); the two columns are both in the coverage table.
- **Low complexity without binding.** The regressors test whether scene embeddings of unseen objects are
  predictable from concept ids. An encoder that encodes a bag of concepts (no binding) is also predictable, so
  `mult_generalizes_trained` / `mult_within_generalizes_trained` holding is evidence of a low-complexity embedding,
  not of a binding that generalizes; read them with the coverage table.
- **Controls by construction.** The random-table control is unpredictable from concepts by construction, so the
  three control claims are checks of the machinery (kind check), not findings; CLIP itself is only in `full`
  (text tower on captions, not the paper's image tower on renders).
- **Fit instability.** Single regressor fits vary across initialisations (the official code also reports the best
  test R² over evaluations); here a seed's R² is the median of {len(next(iter(cx['trained']['mlp'].values()))['r2_restarts'][0])}
  restarts (the spread is in the table). The median rule was chosen because an earlier review saw a diverged
  fit dominate a mean, before this run; thresholds were not changed.
- **Item noise.** The coverage claim adds binomial item noise from the number of 2-object test scenes per model
  (`n_binding_items`, unpaired: each fraction and seed has its own held-out objects and scenes). The complexity
  and additivity bounds use all unseen pairs of a split and are noise-free given the seed.
- **Three seeds.** Every finding runs 3 seeds (the minimum of the verdict rule); more seeds cost training time
  the default budget does not have.
""")
    top = cov[hi]
    held, bag, seen, sbag = (float(np.mean(top[k])) for k in ("binding_acc", "bag_binding_acc", "train_binding_acc",
                                                              "train_bag_binding_acc"))
    r2 = {f: float(np.mean(cx["trained"][f][clo]["r2"])) for f in FAMILIES}
    rep.section("Discussion", f"""
The paper measures CLIP-family models on CLEVR-like scenes and trains 6-layer encoders for 50k steps on
k=2, v=20 worlds; it finds additive scene embeddings everywhere, a high-complexity (non-generalizing) binding
function in CLIP and low-complexity, multiplicative binding in well-covered from-scratch transformers.
This miniature trains the from-scratch side at {meta['n_objects']} objects for {kw['steps']} steps and replaces CLIP
by a random-table control whose object embeddings are by construction unpredictable from concepts: it shows what
a high-complexity binding function looks like to the regressors, not that CLIP has one.
At the highest coverage ({hi}) the encoders' binding accuracy is {seen:.3f} on scenes of SEEN objects (oracle
{sbag:.3f}) and {held:.3f} on unseen ones (oracle {bag:.3f}; the bag-of-concepts oracle cannot bind): binding
{'beyond' if seen > sbag else 'not beyond'} the oracle on seen objects, {'beyond' if held > bag else 'not beyond'} it
on unseen ones at this budget. On the trained encoder's embeddings at split {clo}, the mean R² on unseen objects is
{', '.join(f'{f} {v:.3f}' for f, v in r2.items())}: the across-objects product (one product of all four slot
embeddings, the official default) must spend units on constant slots to express a sum over objects, the
within-object product does not.
""")
    rep.finish(claims(cfg, lo, hi, clo, chi, [frac_key(f) for f in fracs]), metrics)
