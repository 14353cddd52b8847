"""prepare: seeded INDUCTION instances for FULLOBS / CI / EC plus held-out worlds per instance.

Writes instances.jsonl (the card's instance format, gold included), heldout.jsonl (per instance:
template, depth, gold size and fully observed held-out worlds -- never shown to the solvers) and
meta.json. The written instance file is re-read through the validating loader.
"""
from __future__ import annotations

import json

from typing import Literal

from pydantic import Field, field_validator, model_validator

from stages.common.config import Seeds, StageConfig, unique_items
from stages.common.paths import write_json
from stages.common.runner import StageContext
from stages.induction.generator import FRAGMENT, TEMPLATES, GenSpec, generate
from stages.induction.instances import MAX_DOMAIN, load_instances, write_instances

RegimeName = Literal["fullobs", "ci", "ec"]
TemplateName = Literal[tuple(TEMPLATES)]  # type: ignore[valid-type]


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
    (ctx.out / "heldout.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metas))
    load_instances(ctx.out / "instances.jsonl")          # round trip through the validating loader
    counts = {r: sum(i.regime == r for i in insts) for r in cfg.regimes}
    write_json(ctx.out / "meta.json", {"n_instances": len(insts), "per_regime": counts, "seeds": list(cfg.seeds),
                                       "templates": {t: TEMPLATES[t] for t in cfg.templates},
                                       "fragment": {t: FRAGMENT[t] for t in cfg.templates}})
    if ctx.tracker:
        ctx.tracker.summary({"n_instances": len(insts)})
