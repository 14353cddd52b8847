"""prepare: the fact worlds, one per (world, seed), stored with HF datasets plus meta.json.

Two worlds with the same structure: ``main`` (n_pairs, where accuracies and symmetry are measured)
and ``ref`` (ref_pairs, small enough for the convex minimum-nuclear-norm reference). The held-out
pairs of each world are drawn from the run seed, so every seed sees a different held-out set.
"""
from __future__ import annotations

from datasets import Dataset
from pydantic import Field, field_validator, model_validator

from stages.common.config import Fraction, Seeds, StageConfig, unique_items
from stages.common.paths import write_json
from stages.common.runner import StageContext
from stages.reversal_curse.facts import Vocab, build_facts

WORLDS = ("main", "ref")


class Config(StageConfig):
    n_pairs: int = Field(200, ge=2, le=5000, description="(a_i, b_i) pairs of the main world")
    ref_pairs: int = Field(20, ge=2, le=60, description="pairs of the reference world (convex solver: keep ≤ 60)")
    holdout_frac: Fraction = Field(0.2, description="pairs whose reverse fact is held out")
    seeds: Seeds = Field(default_factory=lambda: [0, 1, 2], max_length=20,
                         description="run seeds: each draws its own held-out pairs and initializations")

    @field_validator("seeds")
    @classmethod
    def _distinct(cls, v):
        return unique_items(v, "seeds")

    @model_validator(mode="after")
    def _trainable(self):
        for key in ("n_pairs", "ref_pairs"):
            n = getattr(self, key)
            if round(self.holdout_frac * n) >= n:
                raise ValueError(f"{key}: holdout_frac {self.holdout_frac} holds out every pair of {n}")
        return self


def world_dir(name: str, seed: int) -> str:
    return f"{name}_s{seed}"


def run(cfg: Config, ctx: StageContext) -> None:
    meta = {"seeds": list(cfg.seeds), "holdout_frac": cfg.holdout_frac, "worlds": {}}
    for name, n in (("main", cfg.n_pairs), ("ref", cfg.ref_pairs)):
        voc = Vocab(n)
        for seed in cfg.seeds:
            cols = build_facts(n, cfg.holdout_frac, seed)
            Dataset.from_dict(cols).save_to_disk(str(ctx.out / world_dir(name, seed)))
        n_test = sum(1 for s in cols["split"] if s == "test")
        meta["worlds"][name] = {"n_pairs": n, "vocab_size": voc.size, "r_fwd": voc.r_fwd, "r_rev": voc.r_rev,
                                "r_id": voc.r_id, "n_heldout": n_test, "rows": len(cols["kind"])}
    write_json(ctx.out / "meta.json", meta)
