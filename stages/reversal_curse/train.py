"""train: the one-layer theoretical model per arm (full-batch GD, small init) and a real
one-layer transformer per arm, both in Lightning.

Arms differ only in which identity-bridge facts [e, r_id] -> e are in the training set
(none / A / B / A∪B); two ablations of the A∪B arm test the mechanism: a large init (no longer
biased to low nuclear norm) and an unfactorized W (no implicit low-rank bias at all).
"""
from __future__ import annotations

import numpy as np
import polars as pl
import torch
from datasets import load_from_disk
from pydantic import Field, field_validator

from stages.common.config import StageConfig
from stages.common.paths import read_json, write_json
from stages.common.runner import StageContext
from stages.common.tiny_transformer import TinyTransformerConfig
from stages.common.trainer import TrainerConfig, make_trainer
from stages.reversal_curse.facts import ARMS, arm_mask, mean_onehot
from stages.reversal_curse.models import TheoryArms, TransformerArms, full_batch_loader


class ArmSpec(StageConfig):
    name: str
    bridge: str = Field(description="identity facts on: none | A | B | AB")
    init_scale: float = Field(1e-3, gt=0)
    factorized: bool = True

    @field_validator("bridge")
    @classmethod
    def _bridge(cls, v: str) -> str:
        if v not in ARMS:
            raise ValueError(f"must be one of {', '.join(ARMS)}")
        return v


class TheoryConfig(StageConfig):
    d: int = Field(64, ge=1, description="hidden width of W_V / W_O (the theory wants d >= n)")
    lr: float = Field(1.0, gt=0)
    steps: int = Field(4000, ge=1)
    eval_every: int = Field(100, ge=1)
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1)
    arms: list[ArmSpec] = Field(min_length=1)


class TransformerConfig(StageConfig):
    d_model: int = Field(64, ge=8)
    n_heads: int = Field(4, ge=1)
    mlp: str = "gelu"
    lr: float = Field(3e-3, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    steps: int = Field(1500, ge=1)
    eval_every: int = Field(50, ge=1)
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    arms: list[str] = Field(default_factory=lambda: ["none", "AB"], min_length=1)

    @field_validator("arms")
    @classmethod
    def _arms(cls, v: list[str]) -> list[str]:
        bad = [a for a in v if a not in ARMS]
        if bad:
            raise ValueError(f"unknown arm {bad[0]!r} (arms: {', '.join(ARMS)})")
        return v


class Config(StageConfig):
    seed: int = 0
    torch_threads: int = Field(1, ge=1, description="intra-op threads; the models are tiny, so 1 is fastest")
    theory: TheoryConfig
    transformer: TransformerConfig = TransformerConfig()
    trainer: TrainerConfig = TrainerConfig()


def load_facts(ctx: StageContext) -> tuple[dict[str, np.ndarray], dict]:
    prep = ctx.input("prepare")
    facts = load_from_disk(str(prep / "facts")).with_format("numpy")
    cols = {k: np.asarray(facts[k]) for k in facts.column_names}
    return cols, read_json(prep / "meta.json")


def test_rows(cols: dict[str, np.ndarray]) -> np.ndarray:
    return (cols["split"] == "test") & (cols["kind"] == "reverse")


def run(cfg: Config, ctx: StageContext) -> None:
    torch.set_num_threads(cfg.torch_threads)
    cols, meta = load_facts(ctx)
    V = meta["vocab_size"]
    entity, relation = torch.as_tensor(cols["entity"]), torch.as_tensor(cols["relation"])
    target = torch.as_tensor(cols["target"])
    test = torch.as_tensor(test_rows(cols))

    # --- 1. the theoretical one-layer model, every (arm, seed) in one full-batch GD loop
    th = cfg.theory
    specs = [(arm, seed) for seed in th.seeds for arm in th.arms]
    masks = torch.stack([torch.as_tensor(arm_mask(cols["kind"], cols["split"], a.bridge)) for a, _ in specs])
    xbar = mean_onehot(entity, relation, V)
    theory = TheoryArms(
        arm_names=[f"{a.name}@{s}" for a, s in specs], arm_masks=masks, vocab_size=V, d=th.d,
        init_scales=[a.init_scale for a, _ in specs], factorized=[a.factorized for a, _ in specs],
        seeds=[s for _, s in specs], lr=th.lr, eval_every=th.eval_every,
        test={"xbar": xbar[test], "target": target[test]})
    trainer = make_trainer(cfg.trainer, ctx.tracker, max_steps=th.steps)
    trainer.fit(theory, full_batch_loader({"xbar": xbar, "target": target}, th.steps))
    torch.save(theory.state_dict(), ctx.out / "theory.pt")

    # --- 2. a real one-layer causal transformer per arm on the same facts
    tr = cfg.transformer
    tokens = torch.stack([entity, relation], dim=1)  # (N, 2)
    model_cfg = TinyTransformerConfig(vocab_size=V, d_model=tr.d_model, n_layers=1, n_heads=tr.n_heads,
                                      max_seq_len=2, mlp=tr.mlp, tie_embeddings=False)
    tspecs = [(arm, seed) for seed in tr.seeds for arm in tr.arms]
    tmasks = torch.stack([torch.as_tensor(arm_mask(cols["kind"], cols["split"], a)) for a, _ in tspecs])
    transformer = TransformerArms(
        arm_names=[f"{a}@{s}" for a, s in tspecs], arm_masks=tmasks, model_cfg=model_cfg, lr=tr.lr,
        weight_decay=tr.weight_decay, seeds=[s for _, s in tspecs], eval_every=tr.eval_every,
        test={"tokens": tokens[test], "target": target[test]})
    trainer = make_trainer(cfg.trainer, ctx.tracker, max_steps=tr.steps)
    trainer.fit(transformer, full_batch_loader({"tokens": tokens, "target": target}, tr.steps))
    torch.save(transformer.state_dict(), ctx.out / "transformer.pt")

    history = [dict(r, model="theory") for r in theory.history] + \
              [dict(r, model="transformer", nuclear_norm=None) for r in transformer.history]
    frame = pl.DataFrame(history).with_columns(
        pl.col("arm").str.split("@").list.get(1).cast(pl.Int64).alias("seed"),
        pl.col("arm").str.split("@").list.get(0).alias("arm"))
    frame.write_csv(ctx.out / "history.csv")
    write_json(ctx.out / "models.json", {
        "vocab_size": V,
        "theory": {"d": th.d, "arms": [{"label": f"{a.name}@{s}", "name": a.name, "seed": s,
                                        "bridge": a.bridge, "init_scale": a.init_scale,
                                        "factorized": a.factorized} for a, s in specs]},
        "transformer": {"config": model_cfg.__dict__,
                        "arms": [{"label": f"{a}@{s}", "name": a, "seed": s, "bridge": a} for a, s in tspecs]},
    })
