"""prepare: seeded INDUCTION instances for FULLOBS / CI / EC plus held-out worlds per instance.

Writes instances.jsonl (the card's instance format, gold included), heldout.jsonl (per instance:
template, depth, gold size and fully observed held-out worlds -- never shown to the solvers) and
meta.json. The written instance file is re-read through the validating loader.
"""
from __future__ import annotations

import json

from pydantic import Field, model_validator

from stages.common.config import StageConfig
from stages.common.paths import write_json
from stages.common.runner import StageContext
from stages.induction.generator import TEMPLATES, GenSpec, generate
from stages.induction.instances import MAX_DOMAIN, REGIMES, load_instances, write_instances


class Config(StageConfig):
    seed: int = 0
    per_template: int = Field(3, ge=1, le=1000, description="instances per (regime, template)")
    regimes: list[str] = Field(default_factory=lambda: list(REGIMES))
    templates: list[str] = Field(default_factory=lambda: list(TEMPLATES))
    min_domain: int = Field(5, ge=1, le=MAX_DOMAIN)
    max_domain: int = Field(8, ge=1, le=MAX_DOMAIN)
    p_unary: float = Field(0.4, gt=0, lt=1)
    p_edge: float = Field(0.25, gt=0, lt=1)
    fullobs_worlds: int = Field(4, ge=1)
    ci_yes: int = Field(6, ge=1)
    ci_no: int = Field(2, ge=0)
    ec_worlds: int = Field(4, ge=1)
    unknown_rate: float = Field(0.35, ge=0, lt=1)
    heldout_worlds: int = Field(4, ge=1)
    min_minority: float = Field(0.15, ge=0, lt=0.5)

    @model_validator(mode="after")
    def _check(self):
        if self.min_domain > self.max_domain:
            raise ValueError(f"min_domain ({self.min_domain}) must be <= max_domain ({self.max_domain})")
        bad = [r for r in self.regimes if r not in REGIMES]
        if bad or not self.regimes:
            raise ValueError(f"regimes: expected a non-empty subset of {list(REGIMES)} (got {self.regimes})")
        bad = [t for t in self.templates if t not in TEMPLATES]
        if bad or not self.templates:
            raise ValueError(f"templates: unknown template {bad[0] if bad else None!r} (known: {', '.join(TEMPLATES)})")
        return self


def run(cfg: Config, ctx: StageContext) -> None:
    spec = GenSpec(per_template=cfg.per_template, regimes=tuple(cfg.regimes), templates=tuple(cfg.templates),
                   min_domain=cfg.min_domain, max_domain=cfg.max_domain, p_unary=cfg.p_unary, p_edge=cfg.p_edge,
                   fullobs_worlds=cfg.fullobs_worlds, ci_yes=cfg.ci_yes, ci_no=cfg.ci_no, ec_worlds=cfg.ec_worlds,
                   unknown_rate=cfg.unknown_rate, heldout_worlds=cfg.heldout_worlds,
                   min_minority=cfg.min_minority, seed=cfg.seed)
    insts, metas = generate(spec)
    write_instances(ctx.out / "instances.jsonl", insts)
    (ctx.out / "heldout.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metas))
    load_instances(ctx.out / "instances.jsonl")          # round trip through the validating loader
    counts = {r: sum(i.regime == r for i in insts) for r in cfg.regimes}
    write_json(ctx.out / "meta.json", {"n_instances": len(insts), "per_regime": counts,
                                       "templates": {t: TEMPLATES[t] for t in cfg.templates}})
    if ctx.tracker:
        ctx.tracker.summary({"n_instances": len(insts)})
