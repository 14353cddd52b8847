"""prepare@clip_binding: the concept world, object-level train/test splits and fixed held-out test scenes.

    python -m stages prepare clip_binding [--profile smoke]

Writes meta.json (world + sweep), splits.pt with
  coverage_masks    (F, S, n_objects) bool   train objects per coverage fraction F and seed S
  test_objs/test_n  (F, S, T, n_max) / (F, S, T)  held-out test scenes: ONLY held-out objects (official :165-209)
  complexity_masks  (C, S, n_objects) bool   seen objects of the complexity analysis per split fraction C
"""
from __future__ import annotations

import torch
from pydantic import Field, field_validator, model_validator

from stages.common.config import Fraction, Seed, Seeds, StageConfig, unique_items
from stages.common.paths import write_json
from stages.common.runner import StageContext
from stages.clip_binding.scenes import World, sample_scenes, split_objects


def frac_key(f: float) -> str:
    """0.25 -> 'f25' (metric names must not contain dots)."""
    return f"f{round(100 * f)}"


class Config(StageConfig):
    seed: Seed = 0
    k: int = Field(2, ge=1, le=4, description="concepts per object")
    v: int = Field(8, ge=2, le=20, description="values per concept")
    n_max: int = Field(2, ge=1, le=8, description="objects per scene: 1..n_max (with replacement)")
    train_object_fractions: list[Fraction] = Field(default_factory=lambda: [0.25, 0.5, 0.75], min_length=1, max_length=9)
    seeds: Seeds = Field(default_factory=lambda: [0, 1, 2], max_length=10)
    test_scenes: int = Field(2048, ge=16, le=100_000, description="held-out test scenes per split")
    complexity_fractions: list[Fraction] = Field(default_factory=lambda: [0.25, 0.5, 0.75], min_length=1, max_length=9)

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v):
        return unique_items(v, "seeds")

    @field_validator("train_object_fractions", "complexity_fractions")
    @classmethod
    def _fracs(cls, v, info):
        unique_items(v, info.field_name)
        keys = [frac_key(f) for f in v]
        if len(set(keys)) != len(keys):
            raise ValueError(f"fractions {v} round to the same percentage")
        return sorted(v)

    @model_validator(mode="after")
    def _world(self):
        n_obj = self.v ** self.k
        if n_obj > 4096:
            raise ValueError(f"k, v: v**k = {n_obj} objects exceeds 4096")
        if self.n_max > n_obj:
            raise ValueError(f"n_max: {self.n_max} objects per scene but only v**k = {n_obj} distinct objects")
        if self.k * self.v > 256:
            raise ValueError(f"k, v: k*v = {self.k * self.v} concept queries exceeds 256")
        for key in ("train_object_fractions", "complexity_fractions"):
            for f in getattr(self, key):
                if not 1 <= round(f * n_obj) < n_obj:
                    raise ValueError(f"{key}: {f} of {n_obj} objects leaves no seen or no held-out object")
        return self


def run(cfg: Config, ctx: StageContext) -> None:
    world = World(cfg.k, cfg.v, cfg.n_max)
    F, S, T = len(cfg.train_object_fractions), len(cfg.seeds), cfg.test_scenes
    masks = torch.zeros(F, S, world.n_objects, dtype=torch.bool)
    test_objs = torch.zeros(F, S, T, world.n_max, dtype=torch.long)
    test_n = torch.zeros(F, S, T, dtype=torch.long)
    for i, f in enumerate(cfg.train_object_fractions):
        for j, seed in enumerate(cfg.seeds):
            g = torch.Generator().manual_seed(10_000 * seed + i + cfg.seed)
            masks[i, j] = split_objects(world, f, g)
            heldout = torch.arange(world.n_objects)[~masks[i, j]]
            test_objs[i, j], test_n[i, j] = sample_scenes(world, heldout, T, g)
    cmask = torch.zeros(len(cfg.complexity_fractions), S, world.n_objects, dtype=torch.bool)
    for i, f in enumerate(cfg.complexity_fractions):
        for j, seed in enumerate(cfg.seeds):
            cmask[i, j] = split_objects(world, f, torch.Generator().manual_seed(20_000 * seed + i + cfg.seed))
    torch.save({"coverage_masks": masks, "test_objs": test_objs, "test_n": test_n, "complexity_masks": cmask},
               ctx.out / "splits.pt")
    write_json(ctx.out / "meta.json", {
        "k": cfg.k, "v": cfg.v, "n_max": cfg.n_max, "n_objects": world.n_objects, "vocab": world.vocab,
        "train_object_fractions": cfg.train_object_fractions, "seeds": cfg.seeds,
        "complexity_fractions": cfg.complexity_fractions, "test_scenes": T,
        "n_train_objects": {frac_key(f): int(masks[i, 0].sum()) for i, f in enumerate(cfg.train_object_fractions)},
    })
