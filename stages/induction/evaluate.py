"""evaluate: validity per regime, size vs gold, budgeted validity (in formula counts), held-out
accuracy against the bloated fitter and a constant majority classifier, inside vs outside the old
grammar fragment, and difficulty by depth.

Validity is decided exactly by stages.induction.check (numpy evaluation; EC with z3). Held-out
accuracy -- the hot loop -- evaluates every predicted formula on its instance's fresh, fully
observed held-out worlds through the bit-packed evaluator whose quantifiers run in the batched
kernel (kernels.quantifier_eval, backend from KernelRecord); each result is cross-checked against
the numpy evaluator and disagreements are counted (expected 0). The enumerator's predictions with
status "fallback" (no compact formula within budget) are counted apart, never as solved.
Outputs: results.csv (one row per instance x solver), kernels.json and metrics.json -- no
wall-clock values, so the same params give the same metrics.
"""
from __future__ import annotations

import json
import math

import numpy as np
import polars as pl
import torch
from pydantic import Field, field_validator
from tqdm import tqdm

from kernels.quantifier_eval import guarded_quantify
from kernels.record import KernelRecord
from stages.common.config import Seed, StageConfig, unique_items
from stages.common.device import DeviceName, pick_device
from stages.common.paths import write_json
from stages.common.runner import StageContext
from stages.induction.bitset import LITERAL_GUARDS, BitContext, NotGuarded, unpack
from stages.induction.check import check_formula
from stages.induction.formula import FormulaError, binary_size, parse
from stages.induction.instances import load_instances, parse_instance
from stages.induction.semantics import evaluate as np_evaluate

SOLVERS = ("enum", "bloated")


class Config(StageConfig):
    budgets_generated: list[int] = Field(default_factory=lambda: [100, 1_000, 10_000, 100_000, 200_000],
                                         min_length=1, max_length=32,
                                         description="formula-count budgets for the budgeted-validity curve")
    seed: Seed = 0
    device: DeviceName = "auto"
    upstream_budgets_generated: list[int] = Field(
        default_factory=lambda: [10_000, 100_000, 1_000_000, 3_000_000, 10_000_000, 20_000_000], min_length=1,
        max_length=32, description="upstream tasks: formula-count budgets of the recorded learning curve")
    brute_check: int = Field(12, ge=0, le=10_000, description="upstream: solved formulas re-checked by textbook "
                                                                  "evaluation on their held-out worlds")

    @field_validator("budgets_generated")
    @classmethod
    def _budgets(cls, v: list[int]) -> list[int]:
        unique_items(v, "budgets_generated")
        if any(b < 1 or b > 10**9 for b in v) or sorted(v) != v:
            raise ValueError(f"expected an increasing list of counts in 1..1e9 (got {v})")
        return v


def heldout_scores(formula_text: str, worlds, rec: KernelRecord, device) -> tuple[float, float, int, bool]:
    """(object accuracy, exact-world rate, evaluator disagreements, used kernel path)."""
    f = parse(formula_text)
    ctx = BitContext(worlds, backend=rec.backend, device=device)
    try:
        sig = ctx.compile_many([f])[0]                              # (W,) via the quantifier kernel
        preds = [unpack(sig[k: k + 1], w.domain)[0] for k, w in enumerate(worlds)]
        kernel = True
    except NotGuarded:
        preds = [np_evaluate(f, w) for w in worlds]
        kernel = False
    rec.count("quantifier_eval", ctx.calls)
    mismatches = sum(int((p != np_evaluate(f, w)).sum()) for p, w in zip(preds, worlds)) if kernel else 0
    correct = sum(int((p == w.labels).sum()) for p, w in zip(preds, worlds))
    total = sum(w.domain for w in worlds)
    exact = sum(bool(np.array_equal(p, w.labels)) for p, w in zip(preds, worlds))
    return correct / total, exact / len(worlds), mismatches, kernel


def _rate(xs) -> float:
    xs = [x for x in list(xs) if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return float(np.mean(xs)) if xs else float("nan")


def _median(s: pl.Series) -> float:
    s = s.drop_nulls()
    return float(s.median()) if len(s) else float("nan")


def _load_preds(path) -> dict[str, dict]:
    return {d["id"]: d for d in map(json.loads, path.read_text().splitlines())}


def run(cfg: Config, ctx: StageContext) -> None:
    torch.set_num_threads(1)
    device = pick_device(cfg.device)
    rec = KernelRecord(device)
    prep, train = ctx.input("prepare"), ctx.input("train")
    insts = load_instances(prep / "instances.jsonl")
    metas = {m["id"]: m for m in map(json.loads, (prep / "heldout.jsonl").read_text().splitlines())}
    logs = {x["id"]: x for x in map(json.loads, (train / "search_log.jsonl").read_text().splitlines())}
    preds = {s: _load_preds(train / f"predictions_{s}.jsonl") for s in SOLVERS}
    rows, mismatches, fallbacks = [], 0, 0
    parity_done = False
    for inst in tqdm(insts, desc="evaluate@induction"):
        meta = metas[inst.id]
        held = [parse_instance({"id": inst.id, "regime": "fullobs", "worlds": [w]}).worlds[0]
                for w in meta["heldout"]]
        if not parity_done:                  # Triton path vs reference on this stage's real inputs
            hctx = BitContext(held, device=device)
            phi = torch.from_numpy(np.stack([hctx.atoms["P"], hctx.atoms["Q"], hctx.neg(hctx.atoms["P"])])).to(device)
            rec.parity("quantifier_eval", guarded_quantify, hctx.rel(list(LITERAL_GUARDS), "exists"), phi,
                       hctx._dom_t, "forall",
                       slice=f"the 9 literal guards x 3 unary formulas on the held-out worlds of {inst.id} (forall)")
            parity_done = True
        train_labels = np.concatenate([w.labels for w in inst.worlds if w.kind == "yes"])
        majority = bool(train_labels.mean() >= 0.5)          # reference: a constant classifier
        majority_acc = float(np.mean(np.concatenate([w.labels for w in held]) == majority))
        log = logs[inst.id]
        for solver in SOLVERS:
            pred = preds[solver][inst.id]
            res = check_formula(inst, pred["formula"])
            acc = exact = float("nan")
            if pred["formula"] is not None and res["size"] is not None:
                acc, exact, mm, kernel = heldout_scores(pred["formula"], held, rec, device)
                mismatches += mm
                fallbacks += int(not kernel)
            status = pred.get("status", "solved" if pred["formula"] is not None else "none")
            rows.append({"id": inst.id, "seed": meta.get("seed", 0), "regime": inst.regime,
                         "template": meta["template"], "fragment": meta.get("fragment", "inside"),
                         "depth": meta["depth"], "solver": solver, "status": status,
                         "valid": bool(res["valid"]), "solved": bool(res["valid"]) and status == "solved",
                         "size": res["size"], "gold_size": meta["gold_size"],
                         "generated": int(log["enum_generated"]) if solver == "enum" else None,
                         "safety_net": bool(log.get("safety_net_fired", False)) if solver == "enum" else None,
                         "heldout_acc": acc, "heldout_exact": exact, "majority_acc": majority_acc,
                         "error": res["error"]})
    df = pl.DataFrame(rows, infer_schema_length=None)
    df.write_csv(ctx.out / "results.csv")
    metrics = summarize(df, cfg, mismatches, fallbacks)
    if (train / "guided_log.jsonl").exists():
        metrics["guided"] = guided_metrics(insts, train, logs, ctx)
    if (train / "bench_log.jsonl").exists() and (train / "bench_log.jsonl").read_text().strip():
        metrics["bench"] = bench_metrics(prep, train, ctx, rec, device)
    if (train / "upstream_log.jsonl").exists() and (train / "upstream_log.jsonl").read_text().strip():
        metrics["upstream"] = upstream_metrics(prep, train, ctx, rec, device, cfg)
    write_json(ctx.out / "metrics.json", metrics)
    rec.save(ctx.out)
    if ctx.tracker:
        ctx.tracker.summary({"enum_solved": metrics["enum"]["all"]["valid_rate"],
                             "bloated_valid": metrics["bloated"]["all"]["valid_rate"]})


def bench_metrics(prep, train, ctx, rec: KernelRecord, device) -> dict:
    """Benchmark families: solve rate, size / gold and fresh-world accuracy per family, lift vs guarded.

    Validity by stages.induction.check; fresh-world (held-out) accuracy of the output formula on the
    family's held-out worlds (lift formulas are outside the kernel-compiled fragment: numpy evaluator)."""
    insts = load_instances(prep / "bench_instances.jsonl")
    metas = {m["id"]: m for m in map(json.loads, (prep / "bench_heldout.jsonl").read_text().splitlines())}
    logs = {x["id"]: x for x in map(json.loads, (train / "bench_log.jsonl").read_text().splitlines())}
    preds = {arm: _load_preds(train / f"bench_predictions_{arm}.jsonl") for arm in ("lift", "guarded")}
    rows = []
    for inst in tqdm(insts, desc="evaluate@induction (benchmark families)"):
        meta = metas[inst.id]
        held = [parse_instance({"id": inst.id, "regime": "fullobs", "worlds": [w]}).worlds[0]
                for w in meta["heldout"]]
        for arm in ("lift", "guarded"):
            pred = preds[arm][inst.id]
            res = check_formula(inst, pred["formula"])
            acc = exact = float("nan")
            if pred["formula"] is not None and res["size"] is not None:
                acc, exact, _, _ = heldout_scores(pred["formula"], held, rec, device)
            status = pred.get("status", "none")
            solved = bool(res["valid"]) and status == "solved"
            rows.append({"id": inst.id, "seed": meta["seed"], "family": meta["family"], "depth": meta["depth"],
                         "arm": arm, "status": status, "valid": bool(res["valid"]), "solved": solved,
                         "size": res["size"], "gold_size": meta["gold_size"],
                         "generated": int(logs[inst.id][f"{arm}_generated"]),
                         "heldout_acc": acc, "heldout_exact": exact,
                         "heldout_all_exact": bool(solved and exact == 1.0)})
    df = pl.DataFrame(rows, infer_schema_length=None)
    df.write_csv(ctx.out / "bench_results.csv")
    out: dict = {"n_instances": df.height // 2, "seeds": sorted(df["seed"].unique().to_list()),
                 "budget_generated": int(next(iter(logs.values()))["budget_generated"])}
    fam: dict = {}
    for family in sorted(df["family"].unique().to_list()):
        entry = {}
        for arm in ("lift", "guarded"):
            r = df.filter((pl.col("family") == family) & (pl.col("arm") == arm))
            ok = r.filter(pl.col("solved"))
            entry[arm] = {"n": r.height, "solve_rate": ok.height / r.height,
                          "fallback_rate": _rate((r["status"] == "fallback").to_list()),
                          "median_size_over_gold": _median(ok["size"] / ok["gold_size"]) if ok.height else float("nan"),
                          "median_output_size": _median(r["size"]),
                          "heldout_acc_solved": _rate(ok["heldout_acc"].to_list()),
                          "heldout_acc_output": _rate(r["heldout_acc"].to_list()),
                          "heldout_all_worlds_exact": _rate(r["heldout_all_exact"].to_list()),
                          "median_generated": float(r["generated"].median())}
        entry["depth"] = int(df.filter(pl.col("family") == family)["depth"][0])
        entry["gold_size"] = float(df.filter(pl.col("family") == family)["gold_size"].median())
        fam[family] = entry
    out["per_family"] = fam
    per_seed: dict[str, list] = {"seed": [], "lift_solve_rate": [], "guarded_solve_rate": [],
                                 "lift_heldout_acc_solved": [], "lift_all_exact": [], "guarded_all_exact": [],
                                 "lift_solve_rate_qd3": []}
    for seed in out["seeds"]:
        s = df.filter(pl.col("seed") == seed)
        lift, guard = s.filter(pl.col("arm") == "lift"), s.filter(pl.col("arm") == "guarded")
        per_seed["seed"].append(int(seed))
        per_seed["lift_solve_rate"].append(_rate(lift["solved"].to_list()))
        per_seed["guarded_solve_rate"].append(_rate(guard["solved"].to_list()))
        per_seed["lift_heldout_acc_solved"].append(_rate(lift.filter(pl.col("solved"))["heldout_acc"].to_list()))
        per_seed["lift_all_exact"].append(_rate(lift["heldout_all_exact"].to_list()))
        per_seed["guarded_all_exact"].append(_rate(guard["heldout_all_exact"].to_list()))
        per_seed["lift_solve_rate_qd3"].append(_rate(lift.filter(pl.col("depth") >= 3)["solved"].to_list()))
    out["per_seed"] = per_seed
    abl = []        # pruning ablation: formulas generated until success, plain vs canonical lift vs guarded
    for iid, lg in logs.items():
        if lg.get("ablation_plain"):
            lr = df.filter((pl.col("id") == iid) & (pl.col("arm") == "lift")).row(0, named=True)
            gr = df.filter((pl.col("id") == iid) & (pl.col("arm") == "guarded")).row(0, named=True)
            abl.append({"id": iid, "family": lr["family"],
                        "plain_solved": lg["ablation_plain"]["status"] == "found",
                        "plain_generated": int(lg["ablation_plain"]["generated"]),
                        "canonical_solved": bool(lr["solved"]), "canonical_generated": int(lr["generated"]),
                        "guarded_solved": bool(gr["solved"]), "guarded_generated": int(gr["generated"])})
    out["ablation"] = abl
    for arm in ("lift", "guarded"):
        r = df.filter(pl.col("arm") == arm)
        ok = r.filter(pl.col("solved"))
        out[arm] = {"solve_rate": _rate(r["solved"].to_list()), "n_solved": ok.height,
                    "fallback_rate": _rate((r["status"] == "fallback").to_list()),
                    "median_size_over_gold": _median(ok["size"] / ok["gold_size"]) if ok.height else float("nan"),
                    "median_output_size": _median(r["size"]),
                    "heldout_acc_solved": _rate(ok["heldout_acc"].to_list()),
                    "heldout_all_worlds_exact": _rate(r["heldout_all_exact"].to_list()),
                    "median_generated": float(r["generated"].median()),
                    "solve_rate_by_depth": {f"qd{d}": _rate(r.filter(pl.col("depth") == d)["solved"].to_list())
                                            for d in sorted(r["depth"].unique().to_list())}}
    return out


def _world_scores(formula_text: str, worlds) -> tuple[list[float], list[int]]:
    """Per-world object accuracy and exactness (numpy evaluator: upstream formulas are outside the kernel's
    compiled fragment)."""
    f = parse(formula_text)
    preds = [np_evaluate(f, w) for w in worlds]
    return ([float((p == w.labels).mean()) for p, w in zip(preds, worlds)],
            [int(np.array_equal(p, w.labels)) for p, w in zip(preds, worlds)])


def _tarski(f, env: dict, facts: dict, D: int) -> bool:
    """Textbook satisfaction, one assignment at a time -- independent of the vectorized evaluators."""
    from stages.induction.formula import And, Atom, Not, Or

    if isinstance(f, Atom):
        vals = tuple(env[v] for v in f.args)
        return vals[0] == vals[1] if f.pred == "=" else bool(facts[f.pred][vals])
    if isinstance(f, Not):
        return not _tarski(f.child, env, facts, D)
    if isinstance(f, And):
        return all(_tarski(c, env, facts, D) for c in f.children)
    if isinstance(f, Or):
        return any(_tarski(c, env, facts, D) for c in f.children)
    res = (_tarski(f.body, {**env, f.var: d}, facts, D) for d in range(D))
    return any(res) if f.kind == "exists" else all(res)


def _bsize(text: str | None) -> int | None:
    try:
        return binary_size(parse(text)) if text else None
    except FormulaError:
        return None


def llm_recheck(published: dict) -> dict:
    """Re-evaluate every published LLM formula on the vendored holdout worlds of its task, and its AST size
    in the upstream convention: both must agree with what the upstream report publishes."""
    holdout = {tid: [parse_instance({"id": tid, "regime": "fullobs", "worlds": [w]}).worlds[0] for w in ws]
               for tid, ws in published["holdout"].items()}
    checked, mism, ast_n, ast_mism, unparsed = 0, [], 0, [], []
    for model, tasks in published["reports"].items():
        for tid, t in tasks.items():
            if t["formula"] is None:
                continue
            try:
                parse(t["formula"])
            except FormulaError:
                unparsed.append(f"{model}:{tid}")
                continue
            if t["correct"] and t["correct_ast"] is not None:
                ast_n += 1
                if _bsize(t["formula"]) != t["correct_ast"]:
                    ast_mism.append(f"{model}:{tid}")
            worlds = holdout.get(tid) or []
            if t["holdout_available"] and t["holdout_correct"] is not None and worlds:
                checked += 1
                exact_all = all(_world_scores(t["formula"], worlds)[1])
                if exact_all != t["holdout_correct"]:
                    mism.append(f"{model}:{tid}")
    return {"n_checked": checked, "mismatches": len(mism), "mismatched": mism, "n_ast": ast_n,
            "ast_mismatches": len(ast_mism), "ast_mismatched": ast_mism, "unparsed": unparsed}


def _reference(meta: dict) -> tuple[int | None, str]:
    """Size to compare against: the gold's (released records), else the smallest published LLM formula that is
    correct on every released holdout world of the task (else train-correct), upstream AST convention."""
    if meta["gold_ast"] is not None:
        return meta["gold_ast"], "gold"
    for key, label in (("holdout_correct", "llm_holdout_correct"), ("correct", "llm_train_correct")):
        sizes = [_bsize(t["formula"]) for t in meta["llm"].values() if t.get(key) and t["formula"]]
        sizes = [x for x in sizes if x is not None]
        if sizes:
            return min(sizes), label
    return None, "none"


def upstream_metrics(prep, train, ctx, rec: KernelRecord, device, cfg: "Config") -> dict:
    """Upstream released tasks: solve rate, size vs gold/reference and held-out exactness per family, the
    bloated fit and a majority classifier on the same held-out worlds, the published LLM results for the same
    task ids, and a re-check of those published results on the vendored worlds."""
    insts = load_instances(prep / "upstream_instances.jsonl")
    metas = {m["id"]: m for m in map(json.loads, (prep / "upstream_tasks.jsonl").read_text().splitlines())}
    published = json.loads((prep / "upstream_published.json").read_text())
    logs = {x["id"]: x for x in map(json.loads, (train / "upstream_log.jsonl").read_text().splitlines())}
    preds = {arm: _load_preds(train / f"upstream_predictions_{arm}.jsonl") for arm in SOLVERS}
    rows = []
    for inst in tqdm(insts, desc="evaluate@induction (upstream released tasks)"):
        meta = metas[inst.id]
        held = [parse_instance({"id": inst.id, "regime": "fullobs", "worlds": [w]}).worlds[0] for w in meta["heldout"]]
        train_labels = np.concatenate([w.labels for w in inst.worlds if w.kind == "yes"])
        majority = bool(train_labels.mean() >= 0.5)
        ref, ref_kind = _reference(meta)
        for arm in SOLVERS:
            pred = preds[arm][inst.id]
            res = check_formula(inst, pred["formula"])
            accs, exacts = ([], [])
            if pred["formula"] is not None and res["size"] is not None and held:
                accs, exacts = _world_scores(pred["formula"], held)
            solved = bool(res["valid"]) and pred.get("status") == "solved"
            bs = _bsize(pred["formula"])
            rows.append({"id": inst.id, "task_id": meta["task_id"], "family": meta["family"], "fold": meta["fold"],
                         "mode": meta["mode"], "regime": inst.regime, "arm": arm,
                         "grammar": pred.get("grammar", "none"), "status": pred.get("status", "none"),
                         "valid": bool(res["valid"]), "solved": solved, "size": bs, "ref_size": ref,
                         "ref_kind": ref_kind, "size_over_ref": bs / ref if bs is not None and ref else None,
                         "generated": int(logs[inst.id]["generated"]) if arm == "enum" else None,
                         "n_heldout": len(held), "heldout_acc": _rate(accs), "heldout_exact": _rate(exacts),
                         "heldout_all_exact": bool(held) and bool(accs) and all(exacts),
                         "heldout_accs": json.dumps(accs), "heldout_index": json.dumps(meta["heldout_index"]),
                         "majority_accs": json.dumps([float((w.labels == majority).mean()) for w in held])})
    df = pl.DataFrame(rows, infer_schema_length=None).with_columns(   # all-null when no reference size exists
        pl.col("size_over_ref").cast(pl.Float64), pl.col("ref_size").cast(pl.Float64), pl.col("size").cast(pl.Int64))
    df.write_csv(ctx.out / "upstream_results.csv")
    # independent check: the first `brute_check` solved formulas re-labelled on their held-out worlds by textbook
    # (Tarskian) evaluation, one assignment at a time
    brute_n = brute_mism = 0
    for r in df.filter((pl.col("arm") == "enum") & pl.col("solved")).head(cfg.brute_check).iter_rows(named=True):
        f, meta = parse(preds["enum"][r["id"]]["formula"]), metas[r["id"]]
        for w in meta["heldout"]:
            world = parse_instance({"id": r["id"], "regime": "fullobs", "worlds": [w]}).worlds[0]
            labels = [_tarski(f, {"x": a}, world.facts, world.domain) for a in range(world.domain)]
            brute_n += 1
            brute_mism += int(not np.array_equal(np.array(labels, dtype=bool), np_evaluate(f, world)))
    brute = {"n_worlds": brute_n, "mismatches": brute_mism}
    enum, bloat = df.filter(pl.col("arm") == "enum"), df.filter(pl.col("arm") == "bloated")
    out: dict = {"mode": enum["mode"][0], "n_instances": enum.height, "n_tasks": enum["task_id"].n_unique(),
                 "budget_generated": int(next(iter(logs.values()))["budget_generated"]),
                 "grammars": {g: int((enum["grammar"] == g).sum()) for g in sorted(enum["grammar"].unique().to_list())},
                 "safety_net_fired": sum(bool(x["safety_net_fired"]) for x in logs.values())}
    ok = enum.filter(pl.col("solved"))
    out["enum"] = {"solve_rate": _rate(enum["solved"].to_list()), "n_solved": ok.height,
                   "median_size_over_ref": _median(ok["size_over_ref"]),
                   "frac_size_le_ref": _rate((ok.drop_nulls("size_over_ref")["size_over_ref"] <= 1).to_list()),
                   "heldout_exact_solved": _rate(ok["heldout_exact"].to_list()),
                   "heldout_acc_solved": _rate(ok["heldout_acc"].to_list()),
                   "median_generated": float(enum["generated"].median())}
    out["bloated"] = {"valid_rate": _rate(bloat["valid"].to_list()), "median_size": _median(bloat["size"]),
                      "heldout_exact_valid": _rate(bloat.filter(pl.col("valid"))["heldout_exact"].to_list()),
                      "heldout_acc_valid": _rate(bloat.filter(pl.col("valid"))["heldout_acc"].to_list())}
    # per held-out world index ("fold" j: trained without world j, tested on it; as released: test world j):
    # per-item lists over tasks, the same task order in every list of a fold (paired)
    wide = (enum.select("id", "task_id", "fold", "solved", pl.col("heldout_accs").alias("ea"), "majority_accs",
                        "heldout_index", pl.col("size").alias("es"))
            .join(bloat.select("id", pl.col("valid").alias("bv"), pl.col("heldout_accs").alias("ba"),
                               pl.col("size").alias("bs")), on="id").sort("task_id", "fold"))
    per: dict[int, dict[str, list]] = {}
    for r in wide.iter_rows(named=True):
        ea, ba, ma = json.loads(r["ea"]), json.loads(r["ba"]), json.loads(r["majority_accs"])
        for k, j in enumerate(json.loads(r["heldout_index"])):
            if j < 0:
                continue
            d = per.setdefault(j, {"solved": [], "compact_acc": [], "bloated_acc": [], "majority_acc": [],
                                   "compact_size": [], "bloated_size": []})
            d["solved"].append(float(r["solved"]))
            if r["solved"] and r["bv"] and ea and ba:
                d["compact_acc"].append(ea[k])
                d["bloated_acc"].append(ba[k])
                d["majority_acc"].append(ma[k])
                d["compact_size"].append(r["es"])
                d["bloated_size"].append(r["bs"])
    folds = sorted(per)
    out["per_fold"] = {"fold": folds, **{key: [per[j][key] for j in folds] for key in
                                         ("solved", "compact_acc", "bloated_acc", "majority_acc")},
                       "n_pairs": [len(per[j]["compact_acc"]) for j in folds]}
    pairs = [(a, b, m) for j in folds for a, b, m in zip(per[j]["compact_acc"], per[j]["bloated_acc"],
                                                         per[j]["majority_acc"])]
    out["paired"] = {"n": len(pairs), "compact_acc": _rate([p[0] for p in pairs]),
                     "bloated_acc": _rate([p[1] for p in pairs]), "majority_acc": _rate([p[2] for p in pairs]),
                     "compact_median_size": float(np.median([s for j in folds for s in per[j]["compact_size"]]))
                     if pairs else float("nan"),
                     "bloated_median_size": float(np.median([s for j in folds for s in per[j]["bloated_size"]]))
                     if pairs else float("nan")}
    out["brute_check"] = brute
    # learning curve of the count budget: solved within b generated formulas (b up to the run's budget)
    out["budgeted"] = {f"g{b}": _rate((enum["solved"] & (enum["generated"] <= b)).to_list())
                       for b in cfg.upstream_budgets_generated if b <= out["budget_generated"]}
    out["llm_recheck"] = llm_recheck(published)
    out["published_files"] = published["report_files"]
    out["per_task_reports"] = len(published["reports"])
    # published per-model aggregates over all benchmarked36 tasks (registry): context, not a same-task comparison
    out["registry"] = published.get("registry", [])
    out["registry_files"] = published.get("registry_files", "")
    tasks = enum.group_by("task_id").agg(pl.col("solved").all().alias("all"), pl.col("solved").mean().alias("rate"))
    out["tasks"] = {"n": tasks.height, "solved_every_fold": int(tasks["all"].sum()),
                    "mean_fold_solve_rate": float(tasks["rate"].mean()),
                    "solved_sizes": sorted(int(v) for v in ok["size"].drop_nulls().to_list())}
    # per family: this run's solver next to the published LLM results on the SAME task ids (only where both exist)
    fam: dict = {}
    for family in sorted(enum["family"].unique().to_list()):
        r = enum.filter(pl.col("family") == family)
        solved = r.filter(pl.col("solved"))
        tids = sorted(r["task_id"].unique().to_list())
        per_task = r.group_by("task_id").agg(pl.col("solved").all().alias("all"), pl.col("solved").any().alias("any"))
        entry = {"n_tasks": len(tids), "n_units": r.height, "solve_rate": _rate(r["solved"].to_list()),
                 "tasks_solved_every_fold": int(per_task["all"].sum()),
                 "heldout_exact_solved": _rate(solved["heldout_exact"].to_list()),
                 "median_size": _median(solved["size"]), "median_ref_size": _median(r["ref_size"]),
                 "ref_kind": ",".join(sorted(set(r["ref_kind"].to_list()))),
                 "median_size_over_ref": _median(solved["size_over_ref"]),
                 "median_generated": float(r["generated"].median()), "llm": {}}
        for model, tasks in published["reports"].items():
            same = [tasks[t] for t in tids if t in tasks]
            if not same:
                continue
            avail = [t for t in same if t["holdout_available"] and t["holdout_correct"] is not None]
            sizes = [_bsize(t["formula"]) for t in same if t["correct"]]
            entry["llm"][model] = {"n": len(same), "train_correct": sum(t["correct"] for t in same),
                                   "holdout_available": len(avail),
                                   "holdout_correct": sum(bool(t["holdout_correct"]) for t in avail),
                                   "median_correct_ast": float(np.median([x for x in sizes if x is not None]))
                                   if any(x is not None for x in sizes) else float("nan")}
        fam[family] = entry
    out["per_family"] = fam
    return out


def guided_metrics(insts, train, logs, ctx) -> dict:
    """(C) ranker-guided vs plain enumeration on the ranker's held-out split (same count budgets)."""
    glog = [json.loads(x) for x in (train / "guided_log.jsonl").read_text().splitlines()]
    by_id = {i.id: i for i in insts}
    preds = _load_preds(train / "predictions_guided.jsonl")
    plain = _load_preds(train / "predictions_enum.jsonl")
    rows = []
    for g in glog:
        inst = by_id[g["id"]]
        p = plain[g["id"]]
        plain_ok = p.get("status") == "solved" and bool(check_formula(inst, p["formula"])["valid"])
        rows.append({"id": g["id"], "regime": inst.regime,
                     "guided_valid": bool(check_formula(inst, preds[g["id"]]["formula"])["valid"]),
                     "plain_valid": plain_ok,
                     "guided_generated": g["generated"], "plain_generated": logs[g["id"]]["enum_generated"],
                     "guided_size": preds[g["id"]]["size"], "plain_size": p["size"] if plain_ok else None})
    df = pl.DataFrame(rows, infer_schema_length=None)
    df.write_csv(ctx.out / "guided.csv")
    both = df.filter(pl.col("guided_valid") & pl.col("plain_valid"))
    ratio = np.log10(df["guided_generated"].to_numpy() + 1) - np.log10(df["plain_generated"].to_numpy() + 1)
    return {"n": df.height, "guided_valid_rate": _rate(df["guided_valid"]), "plain_valid_rate": _rate(df["plain_valid"]),
            "guided_median_generated": float(df["guided_generated"].median()),
            "plain_median_generated": float(df["plain_generated"].median()),
            "mean_log10_effort_ratio": float(ratio.mean()), "frac_less_effort": _rate(ratio < 0),
            "guided_median_size": _median(both["guided_size"]) if both.height else float("nan"),
            "plain_median_size": _median(both["plain_size"]) if both.height else float("nan")}


def _block(r: pl.DataFrame, enum: bool) -> dict:
    ok = r.filter(pl.col("solved") if enum else pl.col("valid"))
    return {"n": r.height, "valid_rate": ok.height / r.height if r.height else float("nan"),
            "fallback_rate": _rate((r["status"] == "fallback").to_list()) if enum else 0.0,
            "fallback_valid_rate": _rate(((r["status"] == "fallback") & r["valid"]).to_list()) if enum else 0.0,
            "median_size": _median(ok["size"]) if ok.height else float("nan"),
            "median_size_over_gold": _median(ok["size"] / ok["gold_size"]) if ok.height else float("nan"),
            "heldout_acc_valid": _rate(ok["heldout_acc"].to_list())}


def summarize(df: pl.DataFrame, cfg: Config, mismatches: int, fallbacks: int) -> dict:
    e = df.filter(pl.col("solver") == "enum")
    out: dict = {"n_instances": e.height, "seeds": sorted(e["seed"].unique().to_list()),
                 "safety_net_fired": int(e["safety_net"].sum())}
    for solver in SOLVERS:
        d = df.filter(pl.col("solver") == solver)
        out[solver] = {reg: _block(d if reg == "all" else d.filter(pl.col("regime") == reg), solver == "enum")
                       for reg in ["fullobs", "ci", "ec", "all"]
                       if reg == "all" or d.filter(pl.col("regime") == reg).height}
    # budgeted validity of the enumerator: solved with at most b formulas generated (a count)
    out["budgeted"] = {}
    for regime in ["fullobs", "ci", "ec"]:
        r = e.filter(pl.col("regime") == regime)
        if r.height:
            out["budgeted"][regime] = {f"g{b}": _rate((r["solved"] & (r["generated"] <= b)).to_list())
                                       for b in cfg.budgets_generated}
    # compact vs bloated vs majority on instances where BOTH formulas are training-valid (paired)
    wide = (e.select("id", "seed", pl.col("solved").alias("ev"), pl.col("heldout_acc").alias("ea"),
                     pl.col("heldout_exact").alias("ex"), pl.col("size").alias("es"), pl.col("majority_acc").alias("ma"))
            .join(df.filter(pl.col("solver") == "bloated").select("id", pl.col("valid").alias("bv"),
                  pl.col("heldout_acc").alias("ba"), pl.col("heldout_exact").alias("bx"), pl.col("size").alias("bs")),
                  on="id"))
    both = wide.filter(pl.col("ev") & pl.col("bv"))
    per_seed: dict[str, list] = {"seed": [], "n": [], "compact_acc": [], "bloated_acc": [], "majority_acc": [],
                                 "best_baseline_acc": []}
    items: dict[str, list] = {"compact_acc": [], "bloated_acc": [], "majority_acc": []}  # seeds x instances (paired)
    for seed in out["seeds"]:
        s = both.filter(pl.col("seed") == seed).sort("id")
        items["compact_acc"].append([float(v) for v in s["ea"]])
        items["bloated_acc"].append([float(v) for v in s["ba"]])
        items["majority_acc"].append([float(v) for v in s["ma"]])
        ca, ba, ma = _rate(s["ea"]), _rate(s["ba"]), _rate(s["ma"])
        per_seed["seed"].append(int(seed))
        per_seed["n"].append(s.height)
        per_seed["compact_acc"].append(ca)
        per_seed["bloated_acc"].append(ba)
        per_seed["majority_acc"].append(ma)
        per_seed["best_baseline_acc"].append(max(ba, ma) if s.height else float("nan"))
    out["heldout"] = {"n_pairs": both.height, "compact_acc": _rate(both["ea"]), "bloated_acc": _rate(both["ba"]),
                      "compact_exact": _rate(both["ex"]), "bloated_exact": _rate(both["bx"]),
                      "compact_median_size": _median(both["es"]) if both.height else float("nan"),
                      "bloated_median_size": _median(both["bs"]) if both.height else float("nan"),
                      "majority_acc": _rate(both["ma"]), "acc_gap": _rate(both["ea"]) - _rate(both["ba"]),
                      "bloated_minus_majority": _rate(both["ba"]) - _rate(both["ma"]),
                      "per_seed": per_seed, "items": items}
    # per seed, per instance: solved (0/1) by the enumeration within budget, per regime
    out["per_seed_solved"] = {reg: [[float(v) for v in e.filter((pl.col("seed") == sd) & (pl.col("regime") == reg))
                                     .sort("id")["solved"]] for sd in out["seeds"]]
                              for reg in ["fullobs", "ci", "ec"] if e.filter(pl.col("regime") == reg).height}
    # inside vs outside the original one-literal-guard fragment
    out["fragment"] = {}
    for frag in ("inside", "outside"):
        r = e.filter(pl.col("fragment") == frag)
        if r.height:
            ok = r.filter(pl.col("solved"))
            out["fragment"][frag] = {"n": r.height, "solve_rate": ok.height / r.height,
                                     "fallback_rate": _rate((r["status"] == "fallback").to_list()),
                                     "median_size_over_gold": _median(ok["size"] / ok["gold_size"]) if ok.height else float("nan"),
                                     "heldout_acc_solved": _rate(ok["heldout_acc"].to_list())}
    # difficulty by template depth (enumeration): solve rate within the budget and search effort
    diff = {}
    depths = sorted(e["depth"].unique().to_list())
    for depth in depths:
        r = e.filter(pl.col("depth") == depth)
        diff[f"depth_{depth}"] = {"n": r.height, "solve_rate": _rate(r["solved"].to_list()),
                                  "median_generated": float(r["generated"].median())}
    lo, hi = diff[f"depth_{depths[0]}"], diff[f"depth_{depths[-1]}"]
    diff["shallowest"], diff["deepest"] = depths[0], depths[-1]
    diff["solve_rate_shallow"], diff["solve_rate_deep"] = lo["solve_rate"], hi["solve_rate"]
    diff["effort_ratio"] = hi["median_generated"] / max(1.0, lo["median_generated"])
    diff["log10_effort_ratio"] = math.log10(max(diff["effort_ratio"], 1e-12))
    out["difficulty"] = diff
    out["kernel"] = {"evaluator_mismatches": mismatches, "numpy_fallbacks": fallbacks}
    return out
