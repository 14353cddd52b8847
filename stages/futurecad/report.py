"""report: verdicts on FutureCAD's claims at miniature scale — select-by-query survives topology changes
that break select-by-index; GRPO raises the program model's geometry score / executability over SFT;
BRepGround-mini generalises to held-out query templates and beats the keyword-rule and type-only
selectors — with rendered parts (sampled surface points) whose grounded edges are highlighted.

    python -m stages report futurecad [--profile smoke]
"""
from __future__ import annotations

import json

import matplotlib.pyplot as plt
import numpy as np
import polars as pl

from stages.common.claims import Better, Bound, Claim, Within
from stages.common.config import ReportConfig
from stages.common.paths import read_json
from stages.common.reporting import Report
from stages.common.runner import StageContext
from stages.futurecad import cad
from stages.futurecad.train import ModelGrounder, load_ground

CLAIMS = [
    Better("query_survives_topology_change",
           "Writing a fillet's operands as a query grounded on the current B-Rep stays correct after an earlier "
           "feature renumbers the edges, where operands recorded by index break (exact-set accuracy on the edited "
           "design)",
           a="topology.query_exact", b="topology.index_exact",
           refuted_by="BRepGround-mini's exact-set accuracy on the edited designs not above the index replay's beyond "
                      "2 s.e. on a majority of seeds", kind="finding"),
    Better("rl_raises_geometry_score",
           "RL (GRPO, reward = executes × (1 − normalised Chamfer distance)) raises the program model's mean reward "
           "on held-out descriptions over SFT alone",
           a="program.arms.rl.reward", b="program.arms.sft.reward",
           refuted_by="SFT+RL mean reward not above SFT's beyond 2 s.e. on a majority of seeds", kind="finding"),
    Better("rl_raises_executability",
           "RL raises the executability rate of generated scripts over SFT alone",
           a="program.arms.rl.exec", b="program.arms.sft.exec",
           refuted_by="SFT+RL executability not above SFT's beyond 2 s.e. on a majority of seeds", kind="finding"),
    Within("heldout_templates_generalize",
           "Grounding generalises to held-out query templates: exact-set accuracy on held-out templates is within "
           "0.10 of that on seen templates (same held-out parts)",
           a="grounding.model.heldout.exact", b="grounding.model.seen.exact", 
           refuted_by="|held-out − seen| exact-set accuracy ≥ 0.10 beyond 2 s.e.", kind="finding"),
    Better("ground_beats_keyword_rule",
           "BRepGround-mini beats the keyword/rule selector on held-out templates (paraphrased queries)",
           a="grounding.model.heldout.exact", b="grounding.baselines.keyword_rule.heldout.exact",
           refuted_by="model exact-set accuracy not above the rule's beyond 2 s.e. on a majority of seeds", kind="finding"),
    Better("ground_beats_type_only",
           "BRepGround-mini beats selecting every primitive of the named type (held-out templates, F1)",
           a="grounding.model.heldout.f1", b="grounding.baselines.type_only.heldout.f1",
           refuted_by="model F1 not above the type-only selector's beyond 2 s.e.", kind="finding"),
    Bound("ground_above_chance",
          "Sanity: BRepGround-mini's held-out exact-set accuracy is well above the empty/trivial selector (> 0.2)",
          value="grounding.model.heldout.exact", 
          refuted_by="held-out exact-set accuracy not above 0.2 beyond 2 s.e.", kind="finding"),
    Claim("cli_matches_stage",
          "The fixed CLI (STEP in, ids in CadQuery order out) selects exactly what the evaluate stage scored",
          "cli.match_frac == 1 and cli.runs >= 1",
          refuted_by="any CLI run whose selection differs from the batch scoring of the same part and query", kind="finding"),
]


class Config(ReportConfig):
    pass


def ms(v) -> str:
    a = np.asarray(v, float)
    return f"{a.mean():.3f} ± {a.std(ddof=1) if len(a) > 1 else 0:.3f}"


def render_figure(prep, tr, ev, models):
    """Four held-out parts: surface points (grey) and the edges BRepGround-mini selects for one query."""
    rows = pl.read_parquet(prep / "queries.parquet").filter(
        (pl.col("split") == "test") & (pl.col("templates") == "heldout") & (pl.col("prim") == "edges")).to_dicts()
    net, meta = load_ground(tr / models["cli_checkpoint"])
    grounder = ModelGrounder(net, meta)
    chosen, seen_parts = [], set()
    for r in rows:
        if r["part"] not in seen_parts:
            chosen.append(r)
            seen_parts.add(r["part"])
        if len(chosen) == 4:
            break
    fig = plt.figure(figsize=(12, 3.6 * max(1, (len(chosen) + 1) // 2)))
    for k, r in enumerate(chosen):
        solid = cad.load_step(prep / "steps" / f"part_{r['part']:04d}.step")
        prims = cad.export_primitives(solid)
        _, es = grounder.scores(prims, r["query"])
        sel = set(np.flatnonzero(es > 0.5).tolist())
        truth = set(json.loads(r["target"]))
        center, scale = cad.frame_of(solid)
        pts = cad.surface_points(solid, 600)
        ax = fig.add_subplot((len(chosen) + 1) // 2, 2, k + 1, projection="3d")
        ax.scatter(pts[:, 0], pts[:, 1], pts[:, 2], s=1, c="0.75", alpha=0.5)
        for i, c in enumerate(prims.edges):
            p = c[:, :3] * scale + center
            color = "tab:green" if (i in sel and i in truth) else "tab:red" if i in sel else \
                "tab:orange" if i in truth else "0.35"
            ax.plot(p[:, 0], p[:, 1], p[:, 2], color=color, lw=2.5 if (i in sel or i in truth) else 0.6)
        ax.set_title(f"\"{r['query']}\"\n{'exact' if sel == truth else 'wrong'} "
                     f"({len(sel & truth)}/{len(truth)} found, {len(sel - truth)} extra)", fontsize=8)
        ax.set_axis_off()
    fig.suptitle("Held-out parts (STEP) — green: selected & correct, red: selected & wrong, orange: missed")
    fig.tight_layout()
    return fig


def accuracy_figure(ev):
    gr = ev["grounding"]
    names = ["BRepGround-mini", "keyword rule", "type only", "empty"]
    vals = {"seen": [], "heldout": []}
    errs = {"seen": [], "heldout": []}
    for t in vals:
        m = np.asarray(gr["model"][t]["exact"])
        vals[t].append(m.mean())
        errs[t].append(m.std(ddof=1) if len(m) > 1 else 0)
        for b in ("keyword_rule", "type_only", "empty"):
            vals[t].append(gr["baselines"][b][t]["exact"])
            errs[t].append(0)
    fig, ax = plt.subplots(figsize=(7, 3.8))
    x = np.arange(len(names))
    ax.bar(x - 0.2, vals["seen"], 0.4, yerr=errs["seen"], label="seen templates")
    ax.bar(x + 0.2, vals["heldout"], 0.4, yerr=errs["heldout"], label="held-out templates")
    ax.set_xticks(x, names)
    ax.set_ylabel("exact-set accuracy (held-out parts)")
    ax.set_ylim(0, 1.05)
    ax.legend()
    ax.set_title("Grounding: BRepGround-mini (mean ± sd over seeds) vs baselines")
    return fig


def run(cfg: Config, ctx: StageContext) -> None:
    prep, tr, evd = ctx.input("prepare"), ctx.input("train"), ctx.input("evaluate")
    ev = read_json(evd / "eval.json")
    meta = read_json(prep / "meta.json")
    models = read_json(tr / "models.json")
    cli = ev["cli"]
    ev["cli"] = {"runs": cli["runs"], "match_frac": float(np.mean([c["matches_batch"] for c in cli["cases"]]))
                 if cli["cases"] else 0.0, "cases": cli["cases"]}
    seeds = ev["seeds"]
    g, pc = models["ground"], models["program"]
    rep = Report(ctx, "FutureCAD — text-to-CAD with B-Rep grounding (miniature, real CadQuery geometry)",
                 "An LLM writes CadQuery scripts whose fillet/chamfer operands are natural-language queries; "
                 "BRepGround grounds each query to faces/edges of the current B-Rep. Query grounding stays correct "
                 "where index selection breaks, RL (SFT then GRPO-style RL with a Chamfer reward) improves "
                 "generation, and grounding generalises to unseen query phrasings.")
    nq = meta["n_queries"]
    n_test_parts = pl.read_parquet(prep / "parts.parquet").filter(pl.col("split") == "test").height
    rep.section("Setup", f"""
**Geometry.** {meta['n_parts']} procedural parts ({', '.join(f'{k} {v}' for k, v in meta['families'].items())})
built by running CadQuery scripts (box / circle+extrude; holes, steps, slots, bosses) through a sandboxed
interpreter that parses the script with Python's `ast` and replays only whitelisted calls (`cad.WHITELIST`;
nothing is `exec`-ed). Each face is exported as a {cad.UV}×{cad.UV} UV grid (points, normals, trim mask), each
edge as {cad.CURVE} curve samples (points, tangents), in CadQuery's enumeration order; held-out parts go
through a STEP round trip and are read back exactly as the CLI reads them.

**Queries.** Ground-truth operand sets come from geometric predicates (type, orientation, z-level, size) on
the exported B-Rep; queries are rendered from {len(meta['seen_templates'])} seen templates (training) and
{len(meta['heldout_templates'])} held-out templates, with every attribute word drawn from a small set of
paraphrases ("top"/"upper side"/"uppermost level", "circular"/"round"/"curved", ...).
Training queries: {nq['train/seen']}; test: {nq['test/seen']} seen-template and {nq['test/heldout']}
held-out-template queries on {n_test_parts} held-out parts.

**BRepGround-mini** (Lightning): scratch word embeddings + {g['text_layers']}-layer transformer text encoder,
UV-Net-style 2D-conv face encoder, 1D-conv edge encoder, {g['fusion_layers']}-layer fusion transformer
(d={g['d_model']}), one logit per face/edge, BCE; {g['steps']} steps × batch {g['batch']}, AdamW lr {g['lr']}.
Selection: σ(score) > ½. Baselines: keyword/rule selector (canonical template words → geometric predicate;
no paraphrases, no size words), type-only selector (every primitive of the named type), empty selection.

**Program model** (Lightning): the shared tiny transformer as a prefix LM (description → script tokens,
d={pc['d_model']}, {pc['n_layers']} layers), SFT {pc['sft_steps']} steps on {models['n_train_programs']}
programs, then GRPO through `stages/common/grpo.py` for {pc['rl_steps']} steps × {pc['prompts_per_step']}
prompts × group {pc['grpo']['group_size']} (lr {pc['rl_lr']}), reward = executes × (1 − min(1, CD / diag)) with
CD the two-way Chamfer distance ({meta['n_points']} surface points, `kernels/chamfer.py`) and the script's
`Query(...)` operands grounded by the same seed's BRepGround-mini. Evaluation: greedy decoding on
{ev['program']['n_test']} held-out descriptions; volume IoU from exact B-Rep booleans.

**Topology change.** {ev['topology']['n_cases']} held-out parts: a fillet's operands recorded by index on the
design *before* its last feature ({', '.join(f'{k} {v}' for k, v in ev['topology']['inserted'].items() if v)}) are
replayed after it (select-by-index) vs the query grounded on the edited B-Rep (select-by-query).
Seeds {seeds}: each trains its own BRepGround-mini and program model.
""")
    gr = ev["grounding"]
    rows = [{"selector": "BRepGround-mini", **{f"{t} {k}": ms(gr["model"][t][k]) for t in ("seen", "heldout")
                                                for k in ("exact", "f1")}}]
    for b in ("keyword_rule", "type_only", "empty"):
        rows.append({"selector": b, **{f"{t} {k}": f"{gr['baselines'][b][t][k]:.3f}" for t in ("seen", "heldout")
                                       for k in ("exact", "f1")}})
    rep.table("Results: grounding on held-out parts (exact-set accuracy, F1; model mean ± sd over seeds)",
              pl.DataFrame(rows), note=f"{gr['n_queries']['seen']} seen-template and {gr['n_queries']['heldout']} "
                                       "held-out-template queries. The empty selection is the trivial predictor.")
    bt = pl.read_csv(evd / "grounding_by_target.csv").pivot(on="templates", index="target", values="exact")
    rep.table("Results: BRepGround-mini exact-set accuracy per target kind (mean over seeds)", bt)
    tp = ev["topology"]
    rep.table("Results: topology change (operands after an earlier feature renumbers the B-Rep)", pl.DataFrame([
        {"selection": "by index (recorded before the edit)", "exact-set accuracy": f"{tp['index_exact']:.3f}",
         "fillet IoU vs oracle": f"{tp['index_iou']:.4f}", "normalised CD vs oracle": f"{tp['index_ncd']:.4f}"},
        {"selection": "by query, keyword rule", "exact-set accuracy": f"{tp['rule_exact']:.3f}",
         "fillet IoU vs oracle": "—", "normalised CD vs oracle": "—"},
        {"selection": "by query, BRepGround-mini", "exact-set accuracy": ms(tp["query_exact"]),
         "fillet IoU vs oracle": f"{tp['query_iou_seed0']:.4f} (seed {seeds[0]})",
         "normalised CD vs oracle": f"{tp['query_ncd_seed0']:.4f} (seed {seeds[0]})"}]),
        note="A failed fillet counts as IoU 0 and normalised CD 1. A 0.5 mm fillet changes the volume little, so the "
             "geometric scores separate failed from executed fillets more than right from wrong operands; "
             "exact-set accuracy is the measure.")
    pr = ev["program"]["arms"]
    rep.table("Results: program generation on held-out descriptions (greedy; mean ± sd over seeds)", pl.DataFrame([
        {"model": {"sft": "SFT", "rl": "SFT + GRPO"}[a], "executability": ms(v["exec"]),
         "normalised CD (fail = 1)": ms(v["ncd"]), "volume IoU (fail = 0)": ms(v["iou"]), "reward": ms(v["reward"])}
        for a, v in pr.items()]))
    samples = pl.read_csv(evd / "program_samples.csv")
    errs = samples.filter(~pl.col("ok")).group_by("arm", "error").len().sort("len", descending=True).head(8)
    if errs.height:
        rep.table(f"Failures of generated scripts (seed {seeds[0]}; recorded with reward 0)", errs)
    rep.figure("grounded_parts", render_figure(prep, tr, ev, models),
               "Held-out parts rendered from sampled surface points; edges coloured by BRepGround-mini's "
               "selection for a held-out-template query")
    rep.figure("grounding_accuracy", accuracy_figure(ev), "Exact-set accuracy, seen vs held-out templates")
    try:
        hist = pl.read_csv(tr / "rl_history.csv")
        curve = hist.group_by("step").agg(pl.col("reward_mean").mean()).sort("step")
        rep.plot("rl_reward", curve, x="step", y="reward_mean", title="GRPO mean reward per step (mean over seeds)")
    except FileNotFoundError:
        pass
    gh = pl.read_csv(tr / "ground_history.csv").group_by("step").agg(pl.col("loss").mean()).sort("step")
    rep.plot("ground_loss", gh, x="step", y="loss", title="BRepGround-mini BCE per step (mean over seeds)")
    rep.table("Deviations", pl.DataFrame({
        "what": ["data", "queries", "grounding model", "primitive features", "LLM", "RL", "operations",
                 "topology test", "metrics", "budget (disclosure)", "sandbox"],
        "paper / official code (README only; details from third-party readers)": [
            "~140K real CAD models (FutureCAD set) and 56.7K grounding rows from ABC-like STEP files",
            "Claude-written free-text paraphrases per operand set",
            "BERT text encoder, UV-Net encoders (some readers: + GNN), cross-attention transformer, ~0.5B",
            "UV grids of faces, 1D grids of edges (UV-Net)",
            "FutureCAD-7B (Qwen2.5-7B size) writing full CadQuery",
            "SFT then GSPO-style RL with a Chamfer-distance reward (formula not recovered)",
            "fillet/chamfer → edges, shell → faces",
            "not in the paper's text as far as recovered",
            "Recall@k, mAP, thresholded F1; CD, invalidity ratio, per-command metrics",
            "—", "—"],
        "here": [
            f"{meta['n_parts']} procedural CadQuery parts (5 families), real OCC B-Reps",
            "templates (seen / held-out) with per-word paraphrases; ground truth from geometric predicates",
            f"scratch word embeddings, conv UV/curve encoders, self-attention fusion (d={g['d_model']}), BCE",
            "same; points normalised per axis to the part's bounding box (so 'top' is z = +1)",
            "tiny prefix-LM over a CadQuery-like token script (chain of whitelisted calls)",
            "GRPO (shared trainer, ratio ≡ 1 with one update per rollout) with reward executes × (1 − CD/diag)",
            "fillet/chamfer executed; face queries (select/shell) are grounded but not executed",
            "added here (index replay vs query after an inserted feature), as the card asks",
            "exact-set accuracy and F1 at σ > ½; executability, normalised CD, exact volume IoU",
            "a first default run used 120/40 parts, 400 grounding / 300 SFT steps, 15 GRPO steps × 4 × 8 (more "
            "than the 5-minute target); there RL raised reward (0.77 vs 0.66) and executability (0.89 vs 0.76) on all "
            "3 seeds and the grounder beat the keyword rule on held-out templates (0.38 vs 0.28). The budget was then "
            "cut for run time only (100/30 parts, 300 / 250 steps, group 6), giving the verdicts above; nothing was "
            "changed to make a claim pass",
            "scripts run in a spawned worker process; a native CAD-kernel crash (seen once in a GRPO rollout) kills "
            "only the worker and is recorded as a failed script with reward 0"]}))
    rep.section("Discussion", f"""
Measured here: BRepGround-mini reaches {np.mean(gr['model']['seen']['exact']):.3f} / {np.mean(gr['model']['heldout']['exact']):.3f}
exact-set accuracy on seen / held-out templates (keyword rule {gr['baselines']['keyword_rule']['heldout']['exact']:.3f},
type-only {gr['baselines']['type_only']['heldout']['exact']:.3f} on held-out). Under a topology change, replaying recorded
indices is right on {tp['index_exact']:.3f} of the edited designs, grounding the query on the current B-Rep on
{np.mean(tp['query_exact']):.3f}. Program generation: executability {np.mean(pr['sft']['exec']):.3f} after SFT
{f"and {np.mean(pr['rl']['exec']):.3f} after GRPO" if 'rl' in pr else ''}.

The keyword rule is written from the canonical template words; on this template world it is a strong
baseline wherever the canonical word appears, and it fails on paraphrases and size words — the gap to the
learned grounder measures exactly that, not free-text understanding at the paper's level. The program half is
small: {models['n_train_programs']} training programs, {pc['sft_steps']} SFT steps and {pc['rl_steps']} GRPO
steps; its RL claims are decided by that budget. Failed scripts (a call outside the whitelist, a kernel
refusal, an empty grounded selection, unparsable text) are recorded with reward 0 and listed above.

The paper trains a ~0.5B BRepGround on 56.7K LLM-paraphrased queries over real ABC-like models and a 7B
LLM with SFT + RL on ~140K real CAD programs, evaluating Recall@k/mAP for grounding and CD/invalidity on the
FutureCAD and Fusion360 test sets. None of that scale is reproduced: the parts are procedural, the queries
templated, the models tiny, and the verdicts above are about this miniature only; a claim that fails here is
reported as failing, not tuned.
""")
    rep.finish(CLAIMS, ev)
