"""evaluate: per seed, on held-out parts read back from STEP (ids in CadQuery's enumeration order):

1. grounding — the paper's metrics (Recall@{3,5,10}, mAP over the primitives of the target's kind) beside
   exact-set accuracy and F1 at σ > ½, per query family: ``seen`` / ``heldout`` templates, ``freetext``
   (hand-written, ``freetext.FREE_TEXT``) and the ``external`` STEP parts, and per template; superlative
   (size-word) queries; abstention on queries whose answer is "no such feature" (absent spec, foreign
   feature, nonsense) and false abstention on present ones. Baselines: the keyword rule at full strength
   (``synonym_rule``: the training synonym table, size words), the canonical-word rule, type-only, empty.
2. the ground CLI (``python -m stages.futurecad.ground``) on held-out parts, compared with this stage's
   batch-scored answer for the same part and query (non-empty selections; plus abstaining queries);
3. topology change: operands recorded by index on the design before its last feature vs the query grounded
   on the edited design, scored apart for (a) the same target edges (renumbered or not) and (b) a changed
   target set; the geometry of both fillets against the oracle's (normalised CD, kernels/chamfer);
4. program generation on held-out descriptions: the SFT checkpoint, SFT-only at the compute of RL, and
   SFT+RL (GSPO): executability, normalised Chamfer distance, exact volume IoU, reward (per item).

    python -m stages evaluate futurecad [--profile smoke]
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import polars as pl
import torch
from pydantic import Field

from kernels.chamfer import chamfer_distance
from kernels.record import KernelRecord
from stages.common.config import StageConfig
from stages.common.device import DeviceName, pick_device
from stages.common.paths import read_json, write_json
from stages.common.runner import StageContext
from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig
from stages.futurecad import cad, cputime, fidelity, ground
from stages.futurecad.model import (decode_script, encode_prompt, keyword_rule, known_words, pad_parts, predict,
                                    ranking_metrics, sample_scripts, set_metrics, synonym_rule, type_only)
from stages.futurecad.sandbox import CadSandbox, exit_fast_when_interrupted
from stages.futurecad.infer import ModelGrounder, ProgramScorer, decide, load_ground, load_parts, query_tensors

PRESENT = ("seen", "heldout", "freetext", "external")
RANK_KEYS = ("recall@3", "recall@5", "recall@10", "ap")
BASELINES = {"synonym_rule": synonym_rule, "keyword_rule": keyword_rule, "type_only": type_only}


class Config(StageConfig):
    device: DeviceName = "auto"
    cli_parts: int = Field(3, ge=0, le=1000, description="held-out parts also grounded through the ground CLI")
    sandbox_workers: int = Field(2, ge=1, le=32, description="CAD worker processes")


def _mean(v) -> float:
    return float(np.mean(v)) if len(v) else float("nan")


def _truth(r) -> set:
    return {(r["prim"], i) for i in json.loads(r["target"])}


def _brep(t: torch.Tensor) -> bytes:
    return t.numpy().tobytes()


def answer_rows(scores: np.ndarray, rows: list[dict], gmeta: dict, vocab: dict) -> list[dict]:
    """The grounder's decision per row from batch scores (Q, max_f + max_e), padding at −1."""
    g = gmeta["ground"]
    out = []
    for i, r in enumerate(rows):
        fs, es = scores[i, : g["max_faces"]], scores[i, g["max_faces"]:]
        fs, es = fs[fs >= 0], es[es >= 0]
        d = decide(fs, es, known_words(r["query"], vocab), g.get("threshold", 0.5), g.get("abstain_threshold", 0.5))
        out.append(dict(d, face_scores=fs, edge_scores=es))
    return out


def item_scores(ans: dict, r: dict) -> dict[str, float]:
    """Per-query scores: exact/F1 (abstaining counts as the empty selection) and ranking metrics for a
    present target; abstained for an empty one."""
    truth = set(json.loads(r["target"]))
    if not truth:
        return {"abstained": float(ans["abstained"])}
    pred = {("faces", i) for i in ans["faces"]} | {("edges", i) for i in ans["edges"]}
    exact, f1 = set_metrics(pred, _truth(r))
    rank = ranking_metrics(ans["face_scores"] if r["prim"] == "faces" else ans["edge_scores"], truth)
    return {"exact": exact, "f1": f1, "abstained": float(ans["abstained"]), **rank}


def rule_scores(fn, prims: cad.Primitives, r: dict) -> dict[str, float]:
    prim, ids = fn(r["query"], prims)
    truth = set(json.loads(r["target"]))
    if not truth:
        return {"abstained": float(not ids)}
    exact, f1 = set_metrics({(prim, i) for i in ids}, _truth(r))
    return {"exact": exact, "f1": f1, "abstained": float(not ids)}


def _family(rows, key) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        out.setdefault(r[key], []).append(i)
    return out


def run(cfg: Config, ctx: StageContext) -> None:
    device = pick_device(cfg.device)
    prep, tr = ctx.input("prepare"), ctx.input("train")
    meta = read_json(prep / "meta.json")
    models = read_json(tr / "models.json")
    with CadSandbox(meta["n_points"], cfg.sandbox_workers) as sb:   # workers import CadQuery meanwhile
        try:
            _run(cfg, ctx, prep, tr, meta, models, device, sb)
        except BaseException as err:
            exit_fast_when_interrupted(err)
            raise
    cputime.record(ctx, {"sandbox_wait_wall": sb.wall_s, "scripts_requested": sb.requested,
                         "scripts_executed": sb.executed})


def _run(cfg, ctx, prep, tr, meta, models, device, sandbox) -> None:
    seeds = meta["seeds"]
    g = models["ground"]
    rec = KernelRecord(device)
    # ---- CAD work first: the topology fillets (3.) and every program arm's greedy scripts (4.) go to the sandbox
    #      as one background batch, which its workers execute while this process scores the grounders, the
    #      baselines and the CLI; 3. and 4. then read the sandbox's cache (the same results, in the same order)
    topo = pl.read_parquet(prep / "topology.parquet").to_dicts()
    topo_scripts = topology_scripts(topo)
    pc = models["program"]
    progs = pl.read_parquet(prep / "programs.parquet").to_dicts()
    tg = torch.load(prep / "program_targets.pt", weights_only=True)
    test_idx = [i for i, p in enumerate(progs) if p["role"] == "test"]
    arms = ["sft"] + (["sft_more", "rl"] if pc["rl_steps"] else [])
    generated = _generate_scripts(tr, models, arms, progs, test_idx, device) if pc["rl_steps"] else {}
    target_breps = [_brep(b) for b in tg["brep"]]                       # program scripts score IoU against these
    sandbox.set_grounder(("model", str(tr / models["env_grounder"])))    # the first seed's grounder
    topo_texts = [t for v in topo_scripts.values() for t in v]
    pending = sandbox.prefetch(topo_texts + [t for v in generated.values() for t in v],
                               [None] * len(topo_texts) + [target_breps[i] for i in test_idx] * len(generated))

    parts = load_parts(prep)
    rows = pl.read_parquet(prep / "queries.parquet").filter(pl.col("split") == "test").to_dicts()
    ext = pl.read_parquet(prep / "external.parquet").to_dicts()
    ext_parts = torch.load(prep / "external_primitives.pt", weights_only=True)
    for r in ext:
        r["size_matters"] = False
    test_pids = sorted({r["part"] for r in rows})
    step_of = {p: prep / "steps" / f"part_{p:04d}.step" for p in test_pids}
    prims = {p: cad.export_primitives(cad.load_step(step_of[p])) for p in test_pids}   # as the CLI reads them
    step_dir = Path(meta["external"]["step_dir"])
    ext_prims = {}
    from stages.futurecad.prepare import REPO

    for r in cad.load_step_dir(step_dir if step_dir.is_absolute() else REPO / step_dir):
        ext_prims.setdefault(meta["external"]["parts"].index(r["step"]), r["prims"])
    all_rows = rows + ext
    fam = _family(all_rows, "templates")
    results: dict = {"seeds": seeds, "grounding": {}, "topology": {}, "program": {}}

    # ---- 1. baselines (deterministic: the same per-item list for every seed, so tests are paired)
    base: dict = {}
    for name, fn in BASELINES.items():
        sc = [rule_scores(fn, prims[r["part"]] if "ext_part" not in r else ext_prims[r["ext_part"]], r)
              for r in all_rows]
        base[name] = _summaries([sc] * len(seeds), all_rows, fam)
    base["empty"] = _summaries([[{"exact": 0.0, "f1": 0.0, "abstained": 1.0} if json.loads(r["target"])
                                 else {"abstained": 1.0} for r in all_rows]] * len(seeds), all_rows, fam)

    # ---- 1. BRepGround-mini per seed (batch scoring)
    padded = pad_parts(parts + ext_parts, g["max_faces"], g["max_edges"])       # each part once
    part_rows = torch.tensor([r["part"] for r in rows] + [len(parts) + r["ext_part"] for r in ext],
                             dtype=torch.long, device=device)
    per_seed, grounders, answers0 = [], {}, None
    for seed in seeds:
        net, gmeta = load_ground(tr / f"ground_s{seed}.pt", device)
        grounders[seed] = ModelGrounder(net, gmeta)
        vocab = grounders[seed].vocab
        words = query_tensors(all_rows, vocab, g["max_words"]).to(device)
        scores, _ = predict(net, words, {k: v.to(device) for k, v in padded.items()}, rows=part_rows)
        ans = answer_rows(scores.cpu().numpy(), all_rows, gmeta, vocab)
        per_seed.append([item_scores(a, r) for a, r in zip(ans, all_rows)])
        if seed == seeds[0]:
            answers0 = ans
    model = _summaries(per_seed, all_rows, fam)
    results["grounding"] = {"model": model, "baselines": base,
                            "n_queries": {k: len(v) for k, v in sorted(fam.items())},
                            "per_template": _per_template(per_seed, all_rows),
                            "per_target": _per_target(per_seed, all_rows)}

    # the report's figure: four held-out parts, their surface and edges, and what the first seed's grounder selects
    write_json(ctx.out / "figure_cases.json", figure_cases(rows, prims, step_of, grounders[seeds[0]]))

    # ---- 2. the CLI against the batch answer of the same part and query
    results["cli"] = _cli(cfg, tr, models, rows, answers0, step_of, test_pids)

    # ---- 3. topology change
    pending.wait()
    results["topology"] = _topology(topo, topo_scripts, seeds, grounders, sandbox, rec, device)

    # ---- 4. program generation: SFT checkpoint, SFT-only at equal compute, SFT+RL
    prog = {a: {k: [] for k in ("exec", "ncd", "iou", "reward")} for a in arms}
    fid = {a: {k: [] for k in fidelity.KEYS} for a in arms}          # per seed, per held-out description
    samples = []
    if pc["rl_steps"]:
        scorer = ProgramScorer(sandbox, tg["points"], [p["diag"] for p in progs], rec, device, target_breps)
        pseeds = models["program_seeds"]
        for seed in pseeds:
            for arm in arms:
                texts = generated[seed, arm]
                s = scorer.score(texts, test_idx, iou=True)
                for k in prog[arm]:
                    prog[arm][k].append([round(float(v), 6) for v in s[k]])
                per_item = [fidelity.script_fidelity(t, progs[i]["script"]) for t, i in zip(texts, test_idx)]
                for k in fid[arm]:
                    fid[arm][k].append([round(f[k], 6) for f in per_item])
                if seed == pseeds[0]:
                    samples += [{"arm": arm, "part": progs[i]["part"], "ok": not err, "error": err, "script": t,
                                 "target": progs[i]["script"]} for i, t, err in zip(test_idx, texts, s["errors"])]
        # ---- the description-blind baseline: one script for every description, chosen on validation
        const, const_val, n_cands = constant_script(progs, scorer)
        s = scorer.score([const] * len(test_idx), test_idx, iou=True)
        prog["constant"] = {k: [[round(float(v), 6) for v in s[k]]] * len(pseeds) for k in prog["rl"]}
        per_item = [fidelity.script_fidelity(const, progs[i]["script"]) for i in test_idx]
        fid["constant"] = {k: [[round(f[k], 6) for f in per_item]] * len(pseeds) for k in fidelity.KEYS}
        distinct = {a: [round(len({" ".join(t.split()) for t in generated[sd, a]}) / len(test_idx), 6) for sd in pseeds]
                    for a in arms}
        x = tg["points"][test_idx[:3]].to(device)
        rec.parity("chamfer", chamfer_distance, x[:, :61], x.roll(1, 0)[:, :37],
                   slice="surface points of 3 held-out target solids (61 vs 37 points)")
    results["program"] = {"arms": prog, "fidelity": fid, "n_test": len(test_idx), "seeds": models["program_seeds"],
                          **({"constant": {"script": const, "val_reward": round(const_val, 6), "candidates": n_cands},
                              "distinct": distinct} if pc["rl_steps"] else {}),
                          "equal_compute_sft_steps": models["equal_compute_sft_steps"],
                          "selected_checkpoints": models["selected_checkpoints"],
                          "config": models["program"]}              # the design a study's report compares with
    results["sandbox"] = {"executed": sandbox.executed, "crashes": sandbox.crashes}
    rec.save(ctx.out)
    pl.DataFrame(samples, schema={"arm": pl.Utf8, "part": pl.Int64, "ok": pl.Boolean, "error": pl.Utf8,
                                  "script": pl.Utf8, "target": pl.Utf8}).write_csv(ctx.out / "program_samples.csv")
    write_json(ctx.out / "eval.json", results)


def constant_script(progs: list[dict], scorer: ProgramScorer) -> tuple[str, float, int]:
    """The description-blind baseline: of the SFT programs' scripts, the one whose mean reward over the validation
    descriptions' targets is highest (chosen on validation, the first on ties); returns (script, its validation
    reward, number of candidates). Every program arm should beat it on the held-out descriptions."""
    cands = list(dict.fromkeys(" ".join(p["script"].split()) for p in progs if p["role"] == "sft"))
    val = [i for i, p in enumerate(progs) if p["role"] == "val"]
    r = scorer.score([c for c in cands for _ in val], val * len(cands))["reward"].view(len(cands), len(val)).mean(1)
    k = int(torch.argmax(r))
    return cands[k], float(r[k]), len(cands)


def _summaries(per_seed: list[list[dict]], rows: list[dict], fam: dict[str, list[int]]) -> dict:
    """Per family: per-seed per-item lists of each metric (seeds × items, same item order for every arm)."""
    out: dict = {}
    for name, idx in sorted(fam.items()):
        keys = ("exact", "f1", *RANK_KEYS) if name in PRESENT else ("abstained",)
        out[name] = {k: [[round(s[i][k], 6) for i in idx] for s in per_seed] for k in keys if k in per_seed[0][idx[0]]}
        if name in PRESENT:
            out[name]["false_abstain"] = [[s[i]["abstained"] for i in idx] for s in per_seed]
    size = [i for i, r in enumerate(rows) if r.get("size_matters") and r["templates"] in PRESENT]
    out["size_words"] = {"exact": [[s[i]["exact"] for i in size] for s in per_seed]}
    nons = fam.get("nonsense", [])
    for name, pick in (("nonsense_oov", lambda r: not _in_train_words(r["query"])),
                       ("nonsense_words", lambda r: _in_train_words(r["query"]))):
        idx = [i for i in nons if pick(rows[i])]
        out[name] = {"abstained": [[s[i]["abstained"] for i in idx] for s in per_seed]}
    return out


def _in_train_words(query: str) -> bool:
    """A nonsense query made of template frame words (vs random letter strings / hand-written gibberish)."""
    from stages.futurecad.prepare import FRAME_WORDS

    toks = [t for t in cad.tokenize_query(query) if t.isalpha()]
    return bool(toks) and all(t in FRAME_WORDS for t in toks)


def _per_template(per_seed, rows) -> list[dict]:
    out = []
    for fam_name in ("seen", "heldout"):
        for t in sorted({r["template"] for r in rows if r["templates"] == fam_name}):
            idx = [i for i, r in enumerate(rows) if r["templates"] == fam_name and r["template"] == t]
            tpl = (cad.SEEN_TEMPLATES if fam_name == "seen" else cad.HELDOUT_TEMPLATES)[t]
            out.append({"family": fam_name, "template": tpl, "n": len(idx),
                        **{k: _mean([_mean([s[i][k] for i in idx]) for s in per_seed]) for k in ("exact", "ap")}})
    return out


def _per_target(per_seed, rows) -> list[dict]:
    out = []
    for fam_name in ("seen", "heldout", "freetext"):
        for spec in sorted({r["spec"] for r in rows if r["templates"] == fam_name}):
            idx = [i for i, r in enumerate(rows) if r["templates"] == fam_name and r["spec"] == spec]
            out.append({"family": fam_name, "target": cad.spec_name(cad.SPECS[spec]), "n": len(idx),
                        "exact": _mean([_mean([s[i]["exact"] for i in idx]) for s in per_seed]),
                        "ap": _mean([_mean([s[i]["ap"] for i in idx]) for s in per_seed])})
    return out


def _generate_scripts(tr, models, arms, progs, test_idx, device) -> dict[tuple[int, str], list[str]]:
    """Greedy scripts of every (program seed, arm) model for the held-out descriptions."""
    pc = models["program"]
    pvocab_list = models["program_vocab"]
    pvocab = {t: i for i, t in enumerate(pvocab_list)}
    prompts = torch.tensor([encode_prompt(progs[i]["description"], pvocab, pc["prompt_len"]) for i in test_idx],
                           dtype=torch.long, device=device)
    mcfg = TinyTransformerConfig(**models["model"])
    out = {}
    for seed in models["program_seeds"]:
        for arm in arms:
            lm = TinyTransformer(mcfg).to(device)
            lm.load_state_dict(torch.load(tr / f"{arm}_s{seed}.pt", map_location=device, weights_only=True))
            lm.eval()
            with torch.no_grad():
                comp = sample_scripts(lm, prompts, pc["script_len"], 0.0, None)
            out[seed, arm] = [decode_script(r, pvocab_list) for r in comp.tolist()]
    return out


def figure_cases(rows: list[dict], prims: dict, step_of: dict, grounder: ModelGrounder, n: int = 4) -> list[dict]:
    """The first held-out-template edge query of each of the first ``n`` test parts that have one: the query,
    its target and the grounder's answer (as the CLI gives it), 600 surface points and every edge's samples."""
    cases, parts = [], set()
    for r in rows:
        if r["templates"] != "heldout" or r["prim"] != "edges" or r["part"] in parts:
            continue
        parts.add(r["part"])
        pr = prims[r["part"]]
        a = grounder.answer(pr, r["query"])
        cases.append({"part": r["part"], "query": r["query"], "target": sorted(json.loads(r["target"])),
                      "selected": sorted(a["edges"]), "abstained": bool(a["abstained"]),
                      "points": np.round(cad.surface_points(cad.load_step(step_of[r["part"]]), 600), 5).tolist(),
                      "edges": np.round(pr.edge_points(), 5).tolist()})
        if len(cases) == n:
            break
    return cases


def topology_scripts(topo: list[dict]) -> dict[str, list[str]]:
    """Per case, the fillet on the edited design with the oracle's edges, the edges recorded by index before the
    edit, and the query (grounded in the sandbox by the environment grounder)."""
    scripts: dict[str, list[str]] = {"oracle": [], "index": [], "query": []}
    for c in topo:
        base = c["edited_script"]
        scripts["oracle"].append(f"{base}.edges({cad.index_selector(json.loads(c['ids_edited']))}).fillet(0.5)")
        scripts["index"].append(f"{base}.edges({cad.index_selector(json.loads(c['ids_original']))}).fillet(0.5)")
        scripts["query"].append(f'{base}.edges(Query("{c["query"]}")).fillet(0.5)')
    return scripts


def _cli(cfg, tr, models, rows, answers0, step_of, test_pids) -> dict:
    """Per held-out part: one present query whose batch answer selects something, and one query the batch
    answer abstains on; the CLI must give the same answer."""
    cases = []
    ck = tr / models["cli_checkpoint"]
    with tempfile.TemporaryDirectory() as tmp:
        for p in test_pids[: cfg.cli_parts]:
            picks = []
            for want_abstain in (False, True):
                hit = next((i for i, r in enumerate(rows) if r["part"] == p and answers0[i]["abstained"] == want_abstain
                            and (want_abstain or answers0[i]["faces"] or answers0[i]["edges"])
                            and r["templates"] in (("nonsense", "absent", "foreign") if want_abstain
                                                   else ("heldout", "seen"))), None)
                if hit is not None:
                    picks.append(hit)
            for i in picks:
                r, a = rows[i], answers0[i]
                out = Path(tmp) / f"r{p}_{i}.json"
                rc = ground.main(["--step", str(step_of[p]), "--query", r["query"], "--out", str(out),
                                  "--checkpoint", str(ck)])
                res = json.loads(out.read_text()) if rc == 0 else {}
                sel = res.get("selected", {})
                cases.append({"part": p, "query": r["query"], "rc": rc, "abstained": bool(res.get("abstained")),
                              "batch_abstained": bool(a["abstained"]),
                              "n_selected": len(sel.get("faces", [])) + len(sel.get("edges", [])),
                              "matches_batch": rc == 0 and bool(res.get("abstained")) == bool(a["abstained"])
                              and sorted(sel.get("faces", [])) == a["faces"] and sorted(sel.get("edges", [])) == a["edges"]})
    sel_cases = [c for c in cases if not c["batch_abstained"]]
    return {"runs": len(cases), "selecting_runs": len(sel_cases),
            "selecting_nonempty": float(all(c["n_selected"] > 0 for c in sel_cases)) if sel_cases else 0.0,
            "match_frac": _mean([float(c["matches_batch"]) for c in cases]) if cases else 0.0,
            "abstaining_runs": len(cases) - len(sel_cases), "cases": cases}


def _topology(topo, scripts, seeds, grounders, sandbox, rec, device) -> dict:
    items: dict = {"index": [], "rule": [], "query": {s: [] for s in seeds}}
    edited: dict[str, cad.Primitives] = {}
    for c in topo:
        if c["edited_script"] not in edited:
            edited[c["edited_script"]] = cad.export_primitives(cad.run_script(c["edited_script"]).solid)
    names = list(edited)
    if topo:                                        # every seed's grounder on every case, in one batch per seed
        from stages.futurecad.prepare import prim_tensors

        g0 = grounders[seeds[0]].meta["ground"]
        padded = pad_parts([prim_tensors(edited[n]) for n in names], g0["max_faces"], g0["max_edges"])
        part_rows = torch.tensor([names.index(c["edited_script"]) for c in topo], dtype=torch.long)
        for s in seeds:
            gr = grounders[s]
            dev = next(gr.net.parameters()).device
            words = query_tensors(topo, gr.vocab, g0["max_words"]).to(dev)
            scores, _ = predict(gr.net, words, {k: v.to(dev) for k, v in padded.items()}, rows=part_rows.to(dev))
            for c, a in zip(topo, answer_rows(scores.cpu().numpy(), topo, gr.meta, gr.vocab)):
                items["query"][s].append(float(a["edges"] == json.loads(c["ids_edited"])))
    for c in topo:
        ed = edited[c["edited_script"]]
        truth = json.loads(c["ids_edited"])
        items["index"].append(float(json.loads(c["ids_original"]) == truth))
        items["rule"].append(float(synonym_rule(c["query"], ed)[1] == truth))
    out: dict = {"n_cases": len(topo), "inserted": {k: sum(c["inserted"] == k for c in topo)
                                                     for k in ("hole", "slot", "step", "boss")}}
    for name, pick in (("same_set", lambda c: c["same_set"]), ("changed_set", lambda c: not c["same_set"])):
        idx = [k for k, c in enumerate(topo) if pick(c)]
        out[name] = {"n": len(idx), "n_renumbered": sum(topo[k]["renumbered"] for k in idx),
                     "index": [[items["index"][k] for k in idx]] * len(seeds),
                     "rule": [[items["rule"][k] for k in idx]] * len(seeds),
                     "query": [[items["query"][s][k] for k in idx] for s in seeds]}
    # geometry (environment grounder = first seed's): normalised CD of each fillet to the oracle's
    if topo:
        res = {k: sandbox.run_many(v) for k, v in scripts.items()}
        ncd = {"index": [], "query": []}
        for k in range(len(topo)):
            o = res["oracle"][k]
            for arm in ncd:
                r = res[arm][k]
                if not (o["ok"] and r["ok"]):
                    ncd[arm].append(1.0)
                    continue
                cd = rec.call("chamfer", chamfer_distance, torch.from_numpy(r["points"][None]).to(device),
                              torch.from_numpy(o["points"][None]).to(device))
                diag = float(np.ptp(o["points"], axis=0).__pow__(2).sum() ** 0.5)
                ncd[arm].append(min(1.0, float(cd[0]) / diag))
        out["geometry_ncd"] = {arm: _mean(v) for arm, v in ncd.items()}
        out["geometry_failed"] = {arm: int(sum(not r["ok"] for r in res[arm])) for arm in ("index", "query")}
    return out
