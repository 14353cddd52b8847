"""train: run the symbolic synthesizers over every generated instance.

(A) bottom-up enumeration by AST size with observational-equivalence pruning, budgeted by a
    count of generated formulas (max_generated per instance) and AST size (max_size, which must be
    >= the largest gold size: checked before any work); a wall-clock safety net
    (safety_timeout_s) is reported per instance when it fires -- stages.induction.enumerate;
(B) the bloated fitter: a depth-unbounded decision tree over a feature bank, as a DNF --
    stages.induction.bloated.
(C) optional: a neural production ranker (LightningModule, stages.induction.ranker) trained on
    the productions used by (A)'s solutions on a seeded training split of the instances, then
    used to guide enumeration (size + learned penalties) on the held-out split.
Writes predictions_enum.jsonl / predictions_bloated.jsonl in the `solve` output format (plus
"status": "solved" | "fallback" | "none" -- an unsolved enumeration line carries the bloated
formula marked "fallback"),
search_log.jsonl (status, seconds, formulas kept/generated, z3 calls) for the evaluation, and
for (C) ranker.pt, predictions_guided.jsonl and guided_log.jsonl (held-out split only).
Benchmark families (prepare's bench_instances.jsonl): (A') the two-bank lift enumerator
(stages.induction.lift; its own count budget bench_max_generated and size cap bench_max_size) against
(A) the guarded grammar with the main budget (+ the bloated fallback, marked), written to
bench_predictions_lift.jsonl, bench_predictions_guarded.jsonl and bench_log.jsonl.
Upstream released tasks (prepare's upstream_instances.jsonl, when vendored): the grammar that reaches the
task's regime (solve.grammar_for: lift for FullObs/CI, guarded for EC) with its own count budget
(upstream_max_generated, upstream_max_size, upstream_max_bank), and the bloated fitter on the same task:
upstream_predictions_enum.jsonl, upstream_predictions_bloated.jsonl, upstream_log.jsonl.
"""
from __future__ import annotations

import json
import time

import numpy as np
import torch
from pydantic import Field
from torch.utils.data import DataLoader, TensorDataset
from tqdm import tqdm

from kernels.record import KernelRecord
from stages.common.config import ConfigError, PositiveInt, Seed, StageConfig
from stages.common.device import DeviceName, pick_device
from stages.common.paths import write_json
from stages.common.runner import StageContext
from stages.common.trainer import TrainerConfig, make_trainer
from stages.induction.bloated import fit_bloated
from stages.induction.enumerate import synthesize
from stages.induction.formula import flatten, parse, size
from stages.induction.lift import synthesize_lift
from stages.induction.instances import load_instances
from stages.induction.solve import grammar_for, prediction_line


class Config(StageConfig):
    seed: Seed = 0
    max_generated: PositiveInt = Field(200_000, ge=100, le=50_000_000,
                                       description="enumeration budget per instance: formulas generated (a count)")
    safety_timeout_s: float = Field(120.0, gt=0, le=3600, description="wall-clock safety net per instance (s)")
    max_size: int = Field(22, ge=2, le=60, description="enumeration AST-size budget (inclusive)")
    completions: int = Field(8, ge=1, le=256, description="EC: sampled completions per world")
    max_bank: int = Field(400_000, ge=100, le=20_000_000, description="cap on formulas kept by the enumerator")
    bloat_max_feature_size: int = Field(12, ge=6, le=20, description="largest extra feature for the bloated fitter")
    ranker: bool = Field(True, description="train the optional neural production ranker (C)")
    ranker_train_frac: float = Field(0.5, gt=0, lt=1, description="instances whose solutions train the ranker")
    ranker_max_penalty: int = Field(3, ge=0, le=10)
    ranker_batch_size: int = Field(16, ge=1, le=4096)
    ranker_lr: float = Field(1e-2, gt=0, le=1.0)
    bench_max_generated: PositiveInt = Field(2_500_000, ge=100, le=200_000_000,
                                             description="lift enumeration budget per benchmark-family instance (a count)")
    bench_max_size: int = Field(24, ge=2, le=60, description="lift enumeration AST-size budget (inclusive)")
    bench_max_bank: int = Field(3_000_000, ge=100, le=20_000_000, description="cap on formulas kept per bank (lift)")
    bench_small_operand: int = Field(4, ge=2, le=20, description="lift and/or: one operand at most this size")
    bench_guarded_fallback: bool = Field(True, description="guarded arm: the bloated fallback when unsolved")
    bench_ablation: bool = Field(True, description="also run the lift grammar without canonical forms "
                                                   "(first seed, depth-2 families) to measure the pruning")
    upstream_max_generated: PositiveInt = Field(20_000_000, ge=100, le=200_000_000,
                                                description="enumeration budget per upstream task (a count)")
    upstream_max_size: int = Field(24, ge=2, le=60, description="enumeration AST-size cap for upstream tasks")
    upstream_max_bank: int = Field(8_000_000, ge=100, le=20_000_000, description="cap on kept formulas per bank")
    device: DeviceName = "auto"
    trainer: TrainerConfig = TrainerConfig(max_epochs=60, log_every_n_steps=5)


def run(cfg: Config, ctx: StageContext) -> None:
    torch.set_num_threads(1)
    device = pick_device(cfg.device)
    rec = KernelRecord(device)
    insts = load_instances(ctx.input("prepare") / "instances.jsonl")
    largest = max(size(parse(i.gold)) for i in insts if i.gold)
    if cfg.max_size < largest:
        raise ConfigError(f"papers.induction.train.max_size: {cfg.max_size} is below the largest gold formula size "
                          f"{largest}; raise it to >= {largest} so the size cap never decides a result")
    cpu0 = time.process_time()
    enum_lines, bloat_lines, log = [], [], []
    for inst in tqdm(insts, desc="train@induction (synthesize)"):
        e = synthesize(inst, max_generated=cfg.max_generated, max_size=cfg.max_size, completions=cfg.completions,
                       max_bank=cfg.max_bank, seed=cfg.seed, safety_timeout_s=cfg.safety_timeout_s,
                       backend=rec.backend, device=device)
        b = fit_bloated(inst, max_feature_size=cfg.bloat_max_feature_size, seed=cfg.seed, backend=rec.backend)
        rec.count("quantifier_eval", e.kernel_calls)
        if e.formula is not None:
            enum_lines.append(prediction_line(inst, e, "solved"))
        else:                                 # no compact formula within budget: the fallback, marked
            fb = prediction_line(inst, b, "fallback" if b.formula is not None else "none")
            fb["seconds"] = round(e.seconds + b.seconds, 4)
            enum_lines.append(fb)
        bloat_lines.append(prediction_line(inst, b, "solved" if b.formula is not None else "none"))
        log.append({"id": inst.id, "enum_productions": list(e.productions), "enum_status": e.status,
                    "enum_seconds": e.seconds, "enum_bank": e.bank, "enum_generated": e.generated,
                    "enum_z3_calls": e.z3_calls, "safety_net_fired": e.status == "safety_timeout",
                    "bloated_status": b.status, "bloated_seconds": b.seconds, "bloated_features": b.bank,
                    "bloated_terms": b.generated})
        if ctx.tracker:
            ctx.tracker.log({"enum_found": int(e.formula is not None), "enum_generated": e.generated})
    for name, lines in (("predictions_enum.jsonl", enum_lines), ("predictions_bloated.jsonl", bloat_lines),
                        ("search_log.jsonl", log)):
        (ctx.out / name).write_text("".join(json.dumps(x) + "\n" for x in lines))
    summary = {"n_instances": len(insts), "enum_solved": sum(x["status"] == "solved" for x in enum_lines),
               "enum_fallback": sum(x["status"] == "fallback" for x in enum_lines),
               "bloated_found": sum(x["formula"] is not None for x in bloat_lines),
               "safety_net_fired": sum(x["safety_net_fired"] for x in log)}
    cpu = {"synthetic_suite": time.process_time() - cpu0}      # CPU seconds per part (wall-clock-like: varies)
    if cfg.ranker:
        summary["ranker"] = train_ranker_and_guide(cfg, ctx, insts, log, rec, device)
        cpu["ranker"] = time.process_time() - cpu0 - sum(cpu.values())
    summary["bench"] = run_bench(cfg, ctx, rec, device)
    cpu["synthetic_families"] = time.process_time() - cpu0 - sum(cpu.values())
    summary["upstream"] = run_upstream(cfg, ctx, rec, device)
    cpu["upstream"] = time.process_time() - cpu0 - sum(cpu.values())
    write_json(ctx.out / "summary.json", summary)
    write_json(ctx.out / "cpu_seconds.json", {k: round(v, 2) for k, v in cpu.items()})
    rec.save(ctx.out)


def _depth(inst) -> int:
    from stages.induction.formula import quantifier_depth
    return quantifier_depth(parse(inst.gold)) if inst.gold else 0


def run_bench(cfg: Config, ctx: StageContext, rec: KernelRecord, device) -> dict:
    """Benchmark families: lift enumeration (A') vs the guarded grammar (A) (+ bloated fallback)."""
    path = ctx.input("prepare") / "bench_instances.jsonl"
    lift_lines, guard_lines, log = [], [], []
    insts = load_instances(path) if path.exists() and path.read_text().strip() else []
    if insts:
        largest = max(size(parse(i.gold)) for i in insts if i.gold)
        if cfg.bench_max_size < largest:
            raise ConfigError(f"papers.induction.train.bench_max_size: {cfg.bench_max_size} is below the largest "
                              f"benchmark-family gold size {largest}; raise it to >= {largest}")
    for inst in tqdm(insts, desc="train@induction (benchmark families)"):
        a = synthesize_lift(inst, max_generated=cfg.bench_max_generated, max_size=cfg.bench_max_size,
                            max_bank=cfg.bench_max_bank, small_operand=cfg.bench_small_operand, backend=rec.backend,
                            device=device, safety_timeout_s=cfg.safety_timeout_s)
        rec.count("quantifier_eval", a.kernel_calls)
        if a.formula is not None:                    # report sizes of the flattened formula (n-ary and/or)
            a.formula = flatten(a.formula)
            a.size = size(a.formula)
        lift_lines.append(prediction_line(inst, a, "solved" if a.formula is not None else "none"))
        g = synthesize(inst, max_generated=cfg.max_generated, max_size=cfg.bench_max_size, completions=cfg.completions,
                       max_bank=cfg.max_bank, seed=cfg.seed, safety_timeout_s=cfg.safety_timeout_s,
                       backend=rec.backend, device=device)
        rec.count("quantifier_eval", g.kernel_calls)
        if g.formula is not None:
            guard_lines.append(prediction_line(inst, g, "solved"))
        elif cfg.bench_guarded_fallback:
            b = fit_bloated(inst, max_feature_size=cfg.bloat_max_feature_size, seed=cfg.seed, backend=rec.backend)
            guard_lines.append(prediction_line(inst, b, "fallback" if b.formula is not None else "none"))
        else:
            guard_lines.append(prediction_line(inst, g, "none"))
        abl = None
        if cfg.bench_ablation and inst.id.split("-")[0] == insts[0].id.split("-")[0] and _depth(inst) <= 2:
            p = synthesize_lift(inst, max_generated=cfg.bench_max_generated, max_size=cfg.bench_max_size,
                                max_bank=cfg.bench_max_bank, small_operand=7, backend=rec.backend, device=device,
                                safety_timeout_s=cfg.safety_timeout_s, canonical=False)
            rec.count("quantifier_eval", p.kernel_calls)
            abl = {"status": p.status, "generated": p.generated, "size": p.size}
        log.append({"id": inst.id, "budget_generated": cfg.bench_max_generated, "ablation_plain": abl, "lift_status": a.status, "lift_generated": a.generated, "lift_bank": a.bank,
                    "lift_seconds": a.seconds, "guarded_status": g.status, "guarded_generated": g.generated,
                    "guarded_seconds": g.seconds, "safety_net_fired": "safety_timeout" in (a.status, g.status)})
    for name, lines in (("bench_predictions_lift.jsonl", lift_lines), ("bench_predictions_guarded.jsonl", guard_lines),
                        ("bench_log.jsonl", log)):
        (ctx.out / name).write_text("".join(json.dumps(x) + "\n" for x in lines))
    return {"n": len(insts), "lift_solved": sum(x["status"] == "solved" for x in lift_lines),
            "guarded_solved": sum(x["status"] == "solved" for x in guard_lines)}


def run_upstream(cfg: Config, ctx: StageContext, rec: KernelRecord, device) -> dict:
    """Upstream released tasks: enumeration in the grammar that reaches the regime, and the bloated fitter."""
    path = ctx.input("prepare") / "upstream_instances.jsonl"
    insts = load_instances(path) if path.exists() and path.read_text().strip() else []
    enum_lines, bloat_lines, log = [], [], []
    for inst in tqdm(insts, desc="train@induction (upstream released tasks)"):
        grammar = grammar_for(inst, "auto")
        if grammar == "lift":
            e = synthesize_lift(inst, max_generated=cfg.upstream_max_generated, max_size=cfg.upstream_max_size,
                                max_bank=cfg.upstream_max_bank, small_operand=cfg.bench_small_operand,
                                backend=rec.backend, device=device, safety_timeout_s=cfg.safety_timeout_s)
            if e.formula is not None:
                e.formula = flatten(e.formula)
                e.size = size(e.formula)
        else:
            e = synthesize(inst, max_generated=cfg.upstream_max_generated, max_size=cfg.upstream_max_size,
                           completions=cfg.completions, max_bank=cfg.upstream_max_bank, seed=cfg.seed,
                           safety_timeout_s=cfg.safety_timeout_s, backend=rec.backend, device=device)
        rec.count("quantifier_eval", e.kernel_calls)
        b = fit_bloated(inst, max_feature_size=cfg.bloat_max_feature_size, seed=cfg.seed, backend=rec.backend)
        enum_lines.append(prediction_line(inst, e, "solved" if e.formula is not None else "none", grammar))
        bloat_lines.append(prediction_line(inst, b, "solved" if b.formula is not None else "none", "none"))
        log.append({"id": inst.id, "grammar": grammar, "status": e.status, "generated": e.generated, "bank": e.bank,
                    "seconds": e.seconds, "budget_generated": cfg.upstream_max_generated,
                    "safety_net_fired": e.status == "safety_timeout", "bloated_status": b.status})
    for name, lines in (("upstream_predictions_enum.jsonl", enum_lines),
                        ("upstream_predictions_bloated.jsonl", bloat_lines), ("upstream_log.jsonl", log)):
        (ctx.out / name).write_text("".join(json.dumps(x) + "\n" for x in lines))
    return {"n": len(insts), "solved": sum(x["status"] == "solved" for x in enum_lines)}


def train_ranker_and_guide(cfg: Config, ctx: StageContext, insts, log, rec: KernelRecord, device) -> dict:
    """(C): fit the production ranker on the training split's solutions; guide the other split."""
    from stages.induction.ranker import ProductionRanker, penalties, production_features, usage_vector

    order = np.random.default_rng(cfg.seed).permutation(len(insts))
    n_train = int(round(cfg.ranker_train_frac * len(insts)))
    train_idx, test_idx = sorted(order[:n_train].tolist()), sorted(order[n_train:].tolist())
    feats = np.stack([production_features(inst, cfg.seed) for inst in insts])        # (N, V, F)
    solved = [i for i in train_idx if log[i]["enum_status"] == "found"]
    if len(solved) < 2 or not test_idx:
        return {"trained": False, "reason": f"{len(solved)} solved training instances"}
    data = TensorDataset(torch.from_numpy(feats[solved]),
                         torch.from_numpy(np.stack([usage_vector(tuple(log[i]["enum_productions"])) for i in solved])))
    import lightning as L

    L.seed_everything(cfg.seed, workers=True, verbose=False)     # same params -> same ranker, same guidance
    model = ProductionRanker(lr=cfg.ranker_lr)
    trainer = make_trainer(cfg.trainer, ctx.tracker)
    gen = torch.Generator().manual_seed(cfg.seed)
    trainer.fit(model, DataLoader(data, batch_size=cfg.ranker_batch_size, shuffle=True, generator=gen))
    torch.save(model.state_dict(), ctx.out / "ranker.pt")
    lines, glog = [], []
    for i in tqdm(test_idx, desc="train@induction (ranker-guided enumeration)"):
        inst = insts[i]
        pen = penalties(model.probabilities(feats[i]), cfg.ranker_max_penalty)
        g = synthesize(inst, max_generated=cfg.max_generated, max_size=cfg.max_size, completions=cfg.completions,
                       max_bank=cfg.max_bank, seed=cfg.seed, penalty=pen, safety_timeout_s=cfg.safety_timeout_s,
                       backend=rec.backend, device=device)
        rec.count("quantifier_eval", g.kernel_calls)
        lines.append(prediction_line(inst, g, "solved" if g.formula is not None else "none"))
        glog.append({"id": inst.id, "status": g.status, "seconds": g.seconds, "generated": g.generated,
                     "penalty": pen.tolist()})
    (ctx.out / "predictions_guided.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (ctx.out / "guided_log.jsonl").write_text("".join(json.dumps(x) + "\n" for x in glog))
    return {"trained": True, "n_train": len(solved), "n_guided": len(test_idx)}
