"""train: the one-layer theoretical model per (arm, seed) on the main and the reference world
(full-batch GD, small init) and a real one-layer transformer per (arm, seed), all in Lightning.

Arms differ only in which identity-bridge facts [e, r_id] -> e are in the training set
(none / A / B / A∪B); two ablations of the A∪B arm test the mechanism: a large init (no longer
biased to low nuclear norm) and an unfactorized W (no implicit low-rank bias at all).
Seeds come from prepare (each seed has its own held-out pairs and initializations).
The factorized models' and the transformer's losses run through ``kernels/fused_linear_ce``; the
record of which path ran is ``kernels.json``.
"""
from __future__ import annotations

from typing import Literal

import numpy as np
import polars as pl
import torch
from datasets import load_from_disk
from pydantic import Field, field_validator, model_validator

from kernels.fused_linear_ce import linear_cross_entropy
from kernels.record import KernelRecord
from stages.common.config import PositiveInt, StageConfig, unique_items
from stages.common.paths import read_json, write_json
from stages.common.runner import StageContext
from stages.common.sources import SourceConfig
from stages.common.tiny_transformer import TinyTransformerConfig
from stages.common.trainer import TrainerConfig, make_trainer
from stages.reversal_curse.facts import arm_mask
from stages.reversal_curse.hf_source import HFTrainOptions
from stages.reversal_curse.models import KERNEL, TheoryArms, TransformerArms, full_batch_loader
from stages.reversal_curse.prepare import world_dir

Bridge = Literal["none", "A", "B", "AB"]


class ArmSpec(StageConfig):
    name: str = Field(min_length=1, max_length=40)
    bridge: Bridge = Field(description="identity facts on: none | A | B | AB")
    init_scale: float = Field(1e-3, gt=0, le=10.0)
    factorized: bool = True


class GDConfig(StageConfig):
    d: PositiveInt = Field(200, le=8192, description="hidden width of W_V / W_O (the theory wants d ≥ n)")
    lr: float = Field(20.0, gt=0, le=1000.0, description="GD step on the mean cross-entropy over the world's rows")
    steps: PositiveInt = Field(800, le=200_000)
    eval_every: PositiveInt = Field(100, le=200_000)

    @model_validator(mode="after")
    def _eval(self):
        if self.eval_every > self.steps:
            raise ValueError(f"eval_every: {self.eval_every} is more than steps ({self.steps})")
        return self


class TheoryConfig(GDConfig):
    arms: list[ArmSpec] = Field(min_length=1, max_length=12)
    ref: GDConfig = GDConfig(d=32, lr=5.0, steps=2000, eval_every=200)

    @field_validator("arms")
    @classmethod
    def _distinct(cls, v):
        return unique_items([a.name for a in v], "theory.arms (names)") and v


class TransformerConfig(StageConfig):
    d_model: int = Field(64, ge=8, le=4096)
    n_heads: int = Field(4, ge=1, le=64)
    mlp: Literal["gelu", "swiglu"] = "gelu"
    lr: float = Field(3e-3, gt=0, le=1.0)
    weight_decay: float = Field(0.0, ge=0, le=10.0)
    steps: PositiveInt = Field(400, le=200_000)
    eval_every: PositiveInt = Field(20, le=200_000)
    arms: list[Bridge] = Field(default_factory=lambda: ["none", "AB"], min_length=1, max_length=4)

    @field_validator("arms")
    @classmethod
    def _distinct(cls, v):
        return unique_items(v, "transformer.arms")

    @model_validator(mode="after")
    def _heads(self):
        if self.d_model % self.n_heads:
            raise ValueError(f"n_heads: {self.n_heads} does not divide d_model {self.d_model}")
        return self


class Config(StageConfig):
    torch_threads: int = Field(1, ge=1, le=64, description="intra-op threads; the models are tiny, so 1 is fastest")
    theory: TheoryConfig
    transformer: TransformerConfig = TransformerConfig()
    trainer: TrainerConfig = TrainerConfig()
    # real path (full profile only): the facts as text, fine-tuned into an HF decoder (stages/reversal_curse/hf_source.py)
    source: SourceConfig = SourceConfig()
    hf: HFTrainOptions = HFTrainOptions()


def load_world(ctx: StageContext, world: str, seed: int) -> dict[str, np.ndarray]:
    facts = load_from_disk(str(ctx.input("prepare") / world_dir(world, seed)),
                           keep_in_memory=True).with_format("numpy")  # nothing written into prepare's output
    return {k: np.asarray(facts[k]) for k in facts.column_names}


def test_rows(cols: dict[str, np.ndarray]) -> np.ndarray:
    """The held-out reversals [b_i, r-] -> a_i of this seed's world."""
    return (cols["split"] == "test") & (cols["kind"] == "reverse")


def world_tensors(cols: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.as_tensor(cols[k]) for k in ("entity", "relation", "target")}


def fit_theory(ctx, cfg: Config, gd: GDConfig, world: str, seeds: list[int], vocab: int, rec) -> TheoryArms:
    specs = [(arm, seed) for seed in seeds for arm in cfg.theory.arms]
    worlds = {s: load_world(ctx, world, s) for s in seeds}
    train = torch.stack([torch.as_tensor(arm_mask(worlds[s]["kind"], worlds[s]["split"], a.bridge)) for a, s in specs])
    test = torch.stack([torch.as_tensor(test_rows(worlds[s])) for _, s in specs])
    model = TheoryArms(
        arm_names=[f"{a.name}@{s}" for a, s in specs], train_masks=train, test_masks=test, vocab_size=vocab,
        d=gd.d, init_scales=[a.init_scale for a, _ in specs], factorized=[a.factorized for a, _ in specs],
        seeds=[s for _, s in specs], lr=gd.lr, eval_every=gd.eval_every, rec=rec, world=world)
    trainer = make_trainer(cfg.trainer, ctx.tracker, max_steps=gd.steps)
    # every seed's world has the same rows in the same order (only the split differs)
    trainer.fit(model, full_batch_loader(world_tensors(worlds[seeds[0]]), gd.steps))
    torch.save(model.state_dict(), ctx.out / f"theory_{world}.pt")
    return model


def run(cfg: Config, ctx: StageContext) -> None:
    if cfg.source.kind != "toy":                      # full profile: also a real decoder (hf/, hf_source.py)
        from stages.reversal_curse.hf_source import run_full
        run_full(cfg, ctx)
    torch.set_num_threads(cfg.torch_threads)
    meta = read_json(ctx.input("prepare") / "meta.json")
    seeds, worlds = meta["seeds"], meta["worlds"]
    main_v, ref_v = worlds["main"]["vocab_size"], worlds["ref"]["vocab_size"]
    probe = make_trainer(cfg.trainer, None, max_steps=1)
    rec = KernelRecord(probe.strategy.root_device)  # the device Lightning will train on

    # --- 1. the theoretical one-layer model, every (arm, seed) in one full-batch GD loop per world
    th = cfg.theory
    theory_main = fit_theory(ctx, cfg, th, "main", seeds, main_v, rec)
    theory_ref = fit_theory(ctx, cfg, th.ref, "ref", seeds, ref_v, rec)

    # --- 2. a real one-layer causal transformer per (arm, seed) on the main world
    tr = cfg.transformer
    cols = {s: load_world(ctx, "main", s) for s in seeds}
    base = world_tensors(cols[seeds[0]])
    tokens = torch.stack([base["entity"], base["relation"]], dim=1)  # (N, 2)
    model_cfg = TinyTransformerConfig(vocab_size=main_v, d_model=tr.d_model, n_layers=1, n_heads=tr.n_heads,
                                      max_seq_len=2, mlp=tr.mlp, tie_embeddings=False)
    tspecs = [(arm, seed) for seed in seeds for arm in tr.arms]
    transformer = TransformerArms(
        arm_names=[f"{a}@{s}" for a, s in tspecs],
        train_masks=torch.stack([torch.as_tensor(arm_mask(cols[s]["kind"], cols[s]["split"], a)) for a, s in tspecs]),
        test_masks=torch.stack([torch.as_tensor(test_rows(cols[s])) for _, s in tspecs]),
        model_cfg=model_cfg, lr=tr.lr, weight_decay=tr.weight_decay, seeds=[s for _, s in tspecs],
        eval_every=tr.eval_every, rec=rec)
    trainer = make_trainer(cfg.trainer, ctx.tracker, max_steps=tr.steps)
    trainer.fit(transformer, full_batch_loader({"tokens": tokens, "target": base["target"]}, tr.steps))
    torch.save(transformer.state_dict(), ctx.out / "transformer.pt")

    # Triton path vs torch reference on the real training inputs of the first factorized A∪B model
    with torch.no_grad():
        k = next(i for i, a in enumerate(th.arms) if a.factorized)
        m = theory_main.models[k]
        dev = m.w_o.device
        rows = theory_main.train_masks[k].to(dev)
        e, r, y = (base[c].to(dev)[rows][:64] for c in ("entity", "relation", "target"))
        h, unembed = m.hidden_and_unembed(e, r)
        rec.parity(KERNEL, linear_cross_entropy, h.contiguous(), unembed.detach(), y,
                   slice=f"first 64 training rows of theory arm {th.arms[k].name}, seed {seeds[0]} (trained W)")
    rec.save(ctx.out)

    history = [dict(r, model="theory") for r in theory_main.history + theory_ref.history] + \
              [dict(r, model="transformer", nuclear_norm=None, nuclear_at_margin=None) for r in transformer.history]
    frame = pl.DataFrame(history, infer_schema_length=None).with_columns(
        pl.col("arm").str.split("@").list.get(1).cast(pl.Int64).alias("seed"),
        pl.col("arm").str.split("@").list.get(0).alias("arm"))
    frame.write_csv(ctx.out / "history.csv")
    arms = [{"name": a.name, "bridge": a.bridge, "init_scale": a.init_scale, "factorized": a.factorized}
            for a in th.arms]
    write_json(ctx.out / "models.json", {
        "seeds": seeds,
        "theory": {"main": {"d": th.d, "lr": th.lr, "steps": th.steps}, "ref": th.ref.model_dump(), "arms": arms,
                   "specs": [{"name": a.name, "seed": s} for s in seeds for a in th.arms]},
        "transformer": {"config": model_cfg.__dict__, "lr": tr.lr, "steps": tr.steps,
                        "specs": [{"name": a, "seed": s} for s in seeds for a in tr.arms]},
    })
