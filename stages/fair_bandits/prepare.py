"""prepare: validate the SCM files, compile their exact worlds, draw every (world, seed)'s contexts.

Each world entry names an SCM file, its horizon sweep (increasing; the last is the longest run),
the methods run at the longest horizon, and the methods also run at every shorter horizon (the
sweep that the growth exponents are fitted on). Writes, per world <name>: <name>.scm.json (the
validated SCM, defaults filled in); contexts.pt = {name: (S, T_max) int16}; meta.json (horizons,
seeds, methods, τ (computed in boundary mode), exact effects, truly fair arms, comparator arms, the
contexts the rejection loop keeps, and the margin analysis of the feasibility test: each truly
unfair arm's margin max_j |c_j| − τ against the smallest radius ξ the official test can have at
each horizon, ξ_min(T) = (β_T / 4)·W·‖f‖_min with ‖f‖_min = 1/√(λ + T/4): see the report).
"""
from __future__ import annotations

import math
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from stages.common.config import Seeds, StageConfig, unique_items
from stages.common.paths import ROOT, atomic_write_text, write_json
from stages.common.runner import StageContext
from stages.fair_bandits.methods import OMDEstimator
from stages.fair_bandits.metrics import finite_json
from stages.fair_bandits.scm import EFFECTS, SCMError, World, load_scm, scm_to_json
from stages.fair_bandits.simulate import allowed_cells, draw_contexts, learner_key

Method = Literal["dologb", "dologb_scaled", "ucb", "primal_dual", "oracle"]


class WorldSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    scm: str = Field(description="SCM file (repo-relative), format in stages/fair_bandits/scm.py")
    horizons: list[int] = Field(min_length=1, max_length=8, description="horizon sweep T (increasing)")
    methods: list[Method] = Field(default=["dologb", "ucb", "oracle"], min_length=1,
                                  description="methods run at the longest horizon")
    sweep_methods: list[Method] = Field(default=["dologb", "ucb"], description="also run at every shorter horizon")
    tabular_horizon: int | None = Field(None, ge=16, le=200_000,
                                        description="run the tabular variant at this horizon (None: not run)")

    @field_validator("horizons")
    @classmethod
    def _h(cls, v):
        if any(h < 16 or h > 200_000 for h in v):
            raise ValueError("every horizon must be in [16, 200000]")
        if any(b <= a for a, b in zip(v, v[1:])):
            raise ValueError("horizons must be strictly increasing")
        return v

    @field_validator("methods", "sweep_methods")
    @classmethod
    def _m(cls, v, info):
        return unique_items(v, info.field_name)

    @model_validator(mode="after")
    def _sweep(self):
        extra = [m for m in self.sweep_methods if m not in self.methods]
        if extra:
            raise ValueError(f"sweep_methods: {extra[0]!r} is not in methods")
        return self


class Config(StageConfig):
    worlds: list[WorldSpec] = Field(min_length=1, max_length=8)
    seeds: Seeds = Field(default=[0, 1, 2, 3, 4], max_length=64)

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v):
        return unique_items(v, "seeds")

    @model_validator(mode="after")
    def _files(self):
        names = set()
        for i, spec in enumerate(self.worlds):
            try:
                scm = load_scm(ROOT / spec.scm)
            except SCMError as err:
                raise ValueError(f"worlds[{i}].scm: {err}") from None
            if scm.name in names:
                raise ValueError(f"worlds[{i}].scm: duplicate SCM name {scm.name!r}")
            names.add(scm.name)
            if spec.tabular_horizon is not None and scm.counterfactual_feature != "other":
                raise ValueError(f"worlds[{i}].tabular_horizon: the tabular variant needs counterfactual_feature "
                                 f"'other' ({scm.name} uses {scm.counterfactual_feature!r}); set it to null")
        return self


def xi_floor(T: int, p: int, S: float, weight: float) -> float:
    """The smallest ξ the official test can have at round T: H_T ⪯ (λ + T/4) I (σ' ≤ 1/4, ‖f‖ = 1), so
    every width ‖f‖_{H⁻¹} ≥ 1/√(λ + T/4) and ξ_k ≥ (β_T/4) · W_k / √(λ + T/4), W_k the sum of the
    probability weights of ξ_k (2 for every effect when all four cells are kept)."""
    est = OMDEstimator(1, p, S, delta=1.0 / math.sqrt(T), device="cpu")
    return float(est.beta(T)) / 4.0 * weight / math.sqrt(est.lam + T / 4.0)


def margin_analysis(world: World, horizons: list[int]) -> dict:
    """Per protected value: the truly unfair arms' margins and the ξ weights of the official test,
    against ξ_min at each horizon (an arm with margin below ξ_min(T) can only be excluded by T
    through an estimation error of at least ξ_min(T) − margin)."""
    cell = world.cell_mask
    out = {"protected": []}
    tau = torch.tensor([world.tau], dtype=torch.float64)
    fair = world.feasible(tau)[0]                                      # (2, K)
    kept = allowed_cells(world)
    for ia in (0, 1):
        if not kept[4 * ia:4 * ia + 4].any():     # contexts of this protected value are never played
            out["protected"].append({"weights": {}, "unfair_arms": [], "fair_arms": [], "kept": False})
            continue
        pz, pw = world.p_zw_fac[ia] * cell, world.p_w_fac[ia]
        pz_alt, pw_alt = world.p_zw_alt[ia] * cell, world.p_w_alt[ia]
        weights = [float((2 * pz * pw).sum()), float((pz * pw + pz * pw_alt).sum()),
                   float((pz * pw_alt + pz_alt * pw_alt).sum())]       # W_DE, W_IE, W_SE (ξ per unit width)
        arms = []
        for k in range(world.K):
            if bool(fair[ia, k]):
                continue
            m = (world.effects[ia, :, k].abs() - world.tau).tolist()
            j = int(np.argmax(m))
            arms.append({"arm": k, "margin": m[j], "effect": EFFECTS[j], "weight": weights[j],
                         "xi_min": [xi_floor(T, world.p, world.S, weights[j]) for T in horizons]})
        out["protected"].append({"weights": dict(zip(EFFECTS, weights)), "unfair_arms": arms,
                                 "fair_arms": [k for k in range(world.K) if bool(fair[ia, k])], "kept": True})
    out["min_margin"] = min((a["margin"] for p in out["protected"] for a in p["unfair_arms"]), default=None)
    return out


def run(cfg: Config, ctx: StageContext) -> None:
    meta = {"seeds": cfg.seeds, "worlds": {}}
    contexts = {}
    for spec in cfg.worlds:
        scm = load_scm(ROOT / spec.scm)
        world = World(scm)
        T = spec.horizons[-1]
        atomic_write_text(ctx.out / f"{scm.name}.scm.json", scm_to_json(scm))
        contexts[scm.name] = torch.from_numpy(np.stack([draw_contexts(world, s, T) for s in cfg.seeds]).astype(np.int16))
        tt = torch.tensor([world.tau], dtype=torch.float64)
        comp, has = world.comparator(tt)
        meta["worlds"][scm.name] = {
            "file": spec.scm, "horizons": spec.horizons, "methods": spec.methods, "sweep_methods": spec.sweep_methods,
            "tabular_horizon": spec.tabular_horizon, "tau": world.tau, "tau_mode": scm.tau_mode,
            "effect_cells": scm.effect_cells, "K": world.K, "arms": scm.arms, "learner_key": learner_key(world),
            "boundary_arm": getattr(world, "boundary_arm", None),
            "effects": {e: world.effects[:, j].tolist() for j, e in enumerate(EFFECTS)},
            "mu": world.mu.tolist(), "fair_arms": world.feasible(tt)[0].tolist(),
            "comparator": comp[0].tolist(), "context_has_fair_arm": has[0].tolist(),
            "kept_contexts": allowed_cells(world).tolist(), "unconstrained_best": world.mu.argmax(-1).tolist(),
            "counterfactual_feature": scm.counterfactual_feature, "context_sampling": scm.context_sampling,
            "margins": margin_analysis(world, spec.horizons)}
    torch.save(contexts, ctx.out / "contexts.pt")
    write_json(ctx.out / "meta.json", finite_json(meta))
