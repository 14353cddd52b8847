"""prepare: validate the SCM files, compile their exact worlds, draw every instance's contexts.

Writes, per SCM <name>: <name>.scm.json (the validated SCM, defaults filled in), and contexts.pt =
{name: (n_tau·S, T) int16}; meta.json (horizon, seeds, thresholds per SCM, exact effects, truly fair
arms, comparator arms, which contexts the rejection loop keeps).
"""
from __future__ import annotations

import numpy as np
import torch
from pydantic import Field, field_validator, model_validator

from stages.common.config import Seeds, StageConfig, unique_items
from stages.common.paths import ROOT, atomic_write_text, write_json
from stages.common.runner import StageContext
from stages.fair_bandits.scm import EFFECTS, SCMError, World, load_scm, scm_to_json
from stages.fair_bandits.simulate import allowed_cells, draw_contexts


class Config(StageConfig):
    scms: list[str] = Field(default=["stages/fair_bandits/examples/official.json",
                                     "stages/fair_bandits/examples/binding.json"], min_length=1, max_length=8,
                            description="SCM files (repo-relative), format in stages/fair_bandits/scm.py")
    horizon: int = Field(10001, ge=16, le=200_000, description="rounds T (official run: 10001)")
    seeds: Seeds = Field(default=[0, 1, 2, 3, 4], max_length=64)
    tau_zero: bool = Field(True, description="also run every SCM at τ = 0 (no arm can be fair)")

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v):
        return unique_items(v, "seeds")

    @model_validator(mode="after")
    def _files(self):
        names = set()
        for i, path in enumerate(self.scms):
            try:
                scm = load_scm(ROOT / path)
            except SCMError as err:
                raise ValueError(f"scms[{i}]: {err}") from None
            if scm.name in names:
                raise ValueError(f"scms[{i}]: duplicate SCM name {scm.name!r}")
            names.add(scm.name)
        return self


def taus_for(scm, tau_zero: bool) -> list[float]:
    return [scm.tau, 0.0] if tau_zero and scm.tau > 0 else [scm.tau]


def run(cfg: Config, ctx: StageContext) -> None:
    meta = {"horizon": cfg.horizon, "seeds": cfg.seeds, "scms": {}}
    contexts = {}
    for path in cfg.scms:
        scm = load_scm(ROOT / path)
        world = World(scm)
        taus = taus_for(scm, cfg.tau_zero)
        atomic_write_text(ctx.out / f"{scm.name}.scm.json", scm_to_json(scm))
        contexts[scm.name] = torch.from_numpy(np.stack(
            [draw_contexts(world, t, s, i, cfg.horizon) for i, t in enumerate(taus) for s in cfg.seeds])
            .astype(np.int16))
        tt = torch.tensor(taus, dtype=torch.float64)
        comp, has = world.comparator(tt)
        meta["scms"][scm.name] = {
            "file": path, "taus": taus, "K": world.K, "arms": scm.arms,
            "effects": {e: world.effects[:, j].tolist() for j, e in enumerate(EFFECTS)},
            "mu": world.mu.tolist(), "fair_arms": world.feasible(tt).tolist(),
            "comparator": comp.tolist(), "context_has_fair_arm": has.tolist(),
            "kept_contexts": [allowed_cells(world, t).tolist() for t in taus],
            "unconstrained_best": world.mu.argmax(-1).tolist(),
            "counterfactual_feature": scm.counterfactual_feature}
    torch.save(contexts, ctx.out / "contexts.pt")
    write_json(ctx.out / "meta.json", meta)
