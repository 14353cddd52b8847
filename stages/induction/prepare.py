"""prepare: seeded INDUCTION instances for FULLOBS / CI / EC plus held-out worlds per instance.

Writes instances.jsonl (the card's instance format, gold included), heldout.jsonl (per instance:
template, depth, gold size and fully observed held-out worlds -- never shown to the solvers) and
meta.json. The written instance file is re-read through the validating loader.
Synthetic families suite (stages.induction.families: the project's own generator for the upstream
new36 family NAMES -- not the upstream tasks; quantifier depth 2-3, domains 9-11, 4 training worlds,
FullObs): bench_instances.jsonl and bench_heldout.jsonl, one independent set per generator seed
(bench_per_family = 0 switches it off).
Upstream released benchmark (stages.induction.concept_synth; vendored under `upstream_dir` with its
licence and source commit): upstream_instances.jsonl (project format) and upstream_tasks.jsonl (per
task: upstream task id, family, fold, held-out worlds, gold or published reference formula, the
published LLM results for that task id). `upstream: auto` uses the folder when it is vendored and
says so in meta.json when it is not; `required` stops with one line when it is missing.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from stages.common.config import ConfigError, Seeds, StageConfig, unique_items
from stages.common.paths import ROOT, write_json
from stages.common.runner import StageContext
from stages.induction.concept_synth import UpstreamError, build_tasks, family_of, formula_stats, load_upstream_dir
from stages.induction.families import FAMILIES, FamilySpec, generate_families
from stages.induction.generator import FRAGMENT, TEMPLATES, GenSpec, generate
from stages.induction.instances import MAX_DOMAIN, load_instances, write_instances

RegimeName = Literal["fullobs", "ci", "ec"]
TemplateName = Literal[tuple(TEMPLATES)]  # type: ignore[valid-type]
FamilyName = Literal[tuple(FAMILIES)]  # type: ignore[valid-type]


class Config(StageConfig):
    seeds: Seeds = Field(default_factory=lambda: [0, 1, 2], max_length=32,
                         description="generator seeds: one independent instance set per seed (paired claims)")
    per_template: int = Field(1, ge=1, le=200, description="instances per (seed, regime, template)")
    regimes: list[RegimeName] = Field(default_factory=lambda: ["fullobs", "ci", "ec"], min_length=1)
    templates: list[TemplateName] = Field(default_factory=lambda: list(TEMPLATES), min_length=1)
    min_domain: int = Field(5, ge=2, le=MAX_DOMAIN)
    max_domain: int = Field(8, ge=2, le=MAX_DOMAIN)
    p_unary: float = Field(0.4, gt=0, lt=1)
    p_edge: float = Field(0.25, gt=0, lt=1)
    fullobs_worlds: int = Field(4, ge=1, le=64)
    ci_yes: int = Field(6, ge=1, le=64)
    ci_no: int = Field(2, ge=0, le=64)
    ec_worlds: int = Field(4, ge=1, le=64)
    unknown_rate: float = Field(0.35, ge=0, lt=1)
    heldout_worlds: int = Field(4, ge=1, le=64)
    min_minority: float = Field(0.15, ge=0, lt=0.5)
    bench_per_family: int = Field(1, ge=0, le=100, description="benchmark-family instances per (seed, family); 0 = off")
    bench_families: list[FamilyName] = Field(default_factory=lambda: list(FAMILIES), min_length=1)
    bench_min_domain: int = Field(9, ge=2, le=MAX_DOMAIN)
    bench_max_domain: int = Field(11, ge=2, le=MAX_DOMAIN)
    bench_train_worlds: int = Field(4, ge=1, le=64)
    bench_heldout_worlds: int = Field(4, ge=1, le=64)
    bench_out_degree: int = Field(2, ge=1, le=MAX_DOMAIN, description="fewest R (S) successors per object")
    bench_out_degree_max: int = Field(6, ge=1, le=MAX_DOMAIN, description="most R (S) successors per object")
    upstream: Literal["auto", "required", "off"] = Field(
        "auto", description="the vendored upstream benchmark: auto (use it when vendored), required, off")
    upstream_dir: str = Field("stages/induction/upstream", min_length=1,
                              description="folder of the vendored upstream files (relative to the repository root)")
    upstream_families: list[str] | None = Field(None, description="only these upstream families (None: all)")
    upstream_train_worlds: int = Field(4, ge=1, le=16, description="holdout-fold tasks: training worlds per fold")
    upstream_max_folds: int = Field(5, ge=1, le=16, description="holdout-fold tasks: folds (held-out world) per task")

    @field_validator("bench_families")
    @classmethod
    def _families(cls, v):
        return unique_items(v, "bench_families")

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v):
        return unique_items(v, "seeds")

    @field_validator("regimes")
    @classmethod
    def _regimes(cls, v):
        return unique_items(v, "regimes")

    @field_validator("templates")
    @classmethod
    def _templates(cls, v):
        return unique_items(v, "templates")

    @model_validator(mode="after")
    def _check(self):
        if self.min_domain > self.max_domain:
            raise ValueError(f"min_domain: {self.min_domain} must be <= max_domain ({self.max_domain})")
        if self.bench_min_domain > self.bench_max_domain:
            raise ValueError(f"bench_min_domain: {self.bench_min_domain} must be <= bench_max_domain "
                             f"({self.bench_max_domain})")
        if self.bench_out_degree > self.bench_out_degree_max or self.bench_out_degree_max > self.bench_min_domain:
            raise ValueError(f"bench_out_degree: need bench_out_degree ({self.bench_out_degree}) <= "
                             f"bench_out_degree_max ({self.bench_out_degree_max}) <= bench_min_domain "
                             f"({self.bench_min_domain})")
        return self


def run(cfg: Config, ctx: StageContext) -> None:
    insts, metas = [], []
    for seed in cfg.seeds:
        spec = GenSpec(per_template=cfg.per_template, regimes=tuple(cfg.regimes), templates=tuple(cfg.templates),
                       min_domain=cfg.min_domain, max_domain=cfg.max_domain, p_unary=cfg.p_unary,
                       p_edge=cfg.p_edge, fullobs_worlds=cfg.fullobs_worlds, ci_yes=cfg.ci_yes, ci_no=cfg.ci_no,
                       ec_worlds=cfg.ec_worlds, unknown_rate=cfg.unknown_rate, heldout_worlds=cfg.heldout_worlds,
                       min_minority=cfg.min_minority, seed=seed, id_prefix=f"s{seed}-")
        i, m = generate(spec)
        insts += i
        metas += m
    write_instances(ctx.out / "instances.jsonl", insts)
    b_insts, b_metas = [], []
    if cfg.bench_per_family:
        for seed in cfg.seeds:
            i, m = generate_families(FamilySpec(
                per_family=cfg.bench_per_family, families=tuple(cfg.bench_families), min_domain=cfg.bench_min_domain,
                max_domain=cfg.bench_max_domain, out_degree=cfg.bench_out_degree,
                out_degree_max=cfg.bench_out_degree_max, train_worlds=cfg.bench_train_worlds,
                heldout_worlds=cfg.bench_heldout_worlds, seed=seed, id_prefix=f"s{seed}-"))
            b_insts += i
            b_metas += m
    write_instances(ctx.out / "bench_instances.jsonl", b_insts)
    upstream_meta = prepare_upstream(cfg, ctx)
    (ctx.out / "bench_heldout.jsonl").write_text("".join(json.dumps(m) + "\n" for m in b_metas))
    (ctx.out / "heldout.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metas))
    load_instances(ctx.out / "instances.jsonl")          # round trip through the validating loader
    if b_insts:
        load_instances(ctx.out / "bench_instances.jsonl")
    counts = {r: sum(i.regime == r for i in insts) for r in cfg.regimes}
    write_json(ctx.out / "meta.json", {"n_instances": len(insts), "per_regime": counts, "seeds": list(cfg.seeds),
                                       "templates": {t: TEMPLATES[t] for t in cfg.templates},
                                       "fragment": {t: FRAGMENT[t] for t in cfg.templates},
                                       "bench_n_instances": len(b_insts),
                                       "bench_families": {f: FAMILIES[f] for f in cfg.bench_families},
                                       "upstream": upstream_meta})
    if ctx.tracker:
        ctx.tracker.summary({"n_instances": len(insts)})


def upstream_path(cfg: Config) -> Path:
    p = Path(cfg.upstream_dir)
    return p if p.is_absolute() else ROOT / p


def prepare_upstream(cfg: Config, ctx: StageContext) -> dict:
    """Tasks from the vendored upstream release (empty files and vendored=False when it is absent)."""
    for name in ("upstream_instances.jsonl", "upstream_tasks.jsonl"):
        (ctx.out / name).write_text("")
    if cfg.upstream == "off":
        return {"vendored": False, "reason": "switched off (papers.induction.prepare.upstream: off)"}
    path = upstream_path(cfg)
    try:
        up = load_upstream_dir(path, cfg.upstream_families)
    except UpstreamError as err:
        raise ConfigError(f"papers.induction.prepare.upstream_dir: {err}") from None
    if up is None:
        if cfg.upstream == "required":
            raise ConfigError(f"papers.induction.prepare.upstream_dir: no vendored upstream files under {path} "
                              "(upstream: required)")
        return {"vendored": False, "reason": f"no upstream files under {cfg.upstream_dir}"}
    tasks = build_tasks(up, cfg.upstream_train_worlds, cfg.upstream_max_folds)
    if not tasks:
        raise ConfigError(f"papers.induction.prepare.upstream_dir: {path} gives no task (no record and no task "
                          f"with >= {cfg.upstream_train_worlds + 1} holdout worlds)")
    llm = {rep.model: rep for rep in up.reports}
    lines = []
    for t in tasks:
        per_model = {}
        for model, rep in llm.items():
            lt = rep.tasks.get(t.task_id)
            if lt is not None:
                per_model[model] = {"correct": lt.correct, "evaluable": lt.evaluable, "correct_ast": lt.correct_ast,
                                    "formula": lt.formula, "holdout_available": lt.holdout_available,
                                    "holdout_correct": lt.holdout_correct}
        gold = formula_stats(t.gold)
        lines.append({"id": t.instance.id, "task_id": t.task_id, "family": t.family, "fold": t.fold, "mode": t.mode,
                      "regime": t.instance.regime, "gold": t.gold, "gold_ast": gold["ast"], "gold_qd": gold["qd"],
                      "heldout": [w.to_json("fullobs") for w in t.heldout], "heldout_index": t.heldout_index,
                      "llm": per_model})
    write_instances(ctx.out / "upstream_instances.jsonl", [t.instance for t in tasks])
    (ctx.out / "upstream_tasks.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    load_instances(ctx.out / "upstream_instances.jsonl")                  # round trip through the project loader
    prov = next((path / n for n in ("SOURCE.md", "PROVENANCE.md") if (path / n).exists()), None)
    source = prov.read_text() if prov else ""
    # every published LLM task result of the vendored families (the recheck and the comparison read these)
    fams, tids = {t.family for t in tasks}, {t.task_id for t in tasks}
    reports = {model: {tid: vars(lt) for tid, lt in rep.tasks.items() if tid in tids or family_of(tid) in fams}
               for model, rep in llm.items()}
    holdout = {tid: [w.to_json("fullobs") for w in h.worlds] for tid, h in up.holdout.items()}
    write_json(ctx.out / "upstream_published.json", {"reports": reports, "holdout": holdout,
                                                     "report_files": {m: Path(r.path).name for m, r in llm.items()},
                                                     "registry": [vars(m) for m in up.registry],
                                                     "registry_files": up.files.get("registry", "")})
    return {"vendored": True, "dir": cfg.upstream_dir, "files": up.files, "mode": tasks[0].mode,
            "n_tasks": len({t.task_id for t in tasks}), "n_instances": len(tasks),
            "n_records": len(up.records), "n_holdout_entries": len(up.holdout),
            "holdout_worlds_per_task": {tid: len(h.worlds) for tid, h in sorted(up.holdout.items())},
            "families": sorted(fams), "models": sorted(llm), "source": source,
            "provenance_file": prov.name if prov else None, "n_registry_models": len(up.registry),
            "min_worlds": cfg.upstream_train_worlds + 1 if not up.records else None,
            "licence": (path / "LICENSE").exists()}
