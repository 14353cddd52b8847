"""train: Walrus arms (jitter off/on and ablations) on the pretraining scenarios, then transfer.

Arms (``ARMS``): jitter_off (no shift, no token roll), jitter_on (official periodic fixed jitter:
domain-wide shift + per-block token roll), jitter_patch (patch-scale shift U{-(p/2-1)..p/2-1}),
jitter_no_roll (domain shift without the per-block token roll), fixed_tok (jitter_on with a fixed
patch instead of compute-adaptive tokenization). Every arm x seed trains on every scenario except
``held_out``, one (scenario, resolution) group per batch, uniformly (the official sampler).
Transfer: from each seed's jitter_on model, fine-tune on a few trajectories of the held-out scenario
(``finetune``) vs the same steps from scratch (``scratch``).

    python -m stages train walrus
"""
from __future__ import annotations

import math
from typing import Literal

import lightning as L
import numpy as np
import torch
from pydantic import Field, field_validator, model_validator

from stages.common.config import Seeds, StageConfig, unique_items
from stages.common.device import DeviceName, pick_device
from stages.common.paths import read_json, write_json
from stages.common.runner import StageContext
from stages.common.seeding import seed_everything
from stages.common.trainer import TrainerConfig, make_trainer
from stages.walrus.common import torch_threads
from stages.walrus.model import Walrus, normalized_l1
from stages.walrus.prepare import load_groups

ArmName = Literal["jitter_off", "jitter_on", "jitter_patch", "jitter_no_roll", "fixed_tok"]
ARMS = {  # name -> (jitter, token_roll, tokenization)
    "jitter_off": ("none", False, "adaptive"),
    "jitter_on": ("domain", True, "adaptive"),
    "jitter_patch": ("patch", True, "adaptive"),
    "jitter_no_roll": ("domain", False, "adaptive"),
    "fixed_tok": ("domain", True, "fixed"),
}


class Config(StageConfig):
    seeds: Seeds = Field(default_factory=lambda: [0, 1, 2])
    arms: list[ArmName] = Field(default_factory=lambda: list(ARMS), min_length=1)
    held_out: Literal["kolmogorov", "burgers", "advdiff", "wave", "none"] = "wave"
    d: int = Field(32, ge=8, le=2048)
    depth: int = Field(2, ge=1, le=64)
    heads: int = Field(2, ge=1, le=32)
    mlp_ratio: int = Field(4, ge=1, le=8)
    batch_size: int = Field(4, ge=1, le=1024)
    steps: int = Field(500, ge=1, le=200_000)
    lr: float = Field(2e-3, gt=0, le=1.0)
    weight_decay: float = Field(1e-4, ge=0, le=1.0)
    warmup: int = Field(20, ge=1, le=10_000)
    ft_steps: int = Field(100, ge=0, le=100_000, description="fine-tune / scratch steps on the held-out scenario")
    ft_lr: float = Field(1e-3, gt=0, le=1.0)
    ft_traj: int = Field(3, ge=1, le=512, description="held-out training trajectories used for transfer")
    num_threads: int = Field(1, ge=1, le=64)
    device: DeviceName = "auto"
    trainer: TrainerConfig = TrainerConfig(log_every_n_steps=10, enable_progress_bar=False,
                                           gradient_clip_val=10.0)

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v):
        return unique_items(v, "seeds")

    @field_validator("arms")
    @classmethod
    def _arms(cls, v):
        return unique_items(v, "arms")

    @model_validator(mode="after")
    def _check(self):
        if self.d % (4 * self.heads):
            raise ValueError(f"d: {self.d} must be a multiple of 4 * heads ({4 * self.heads}) for axial RoPE")
        if self.held_out != "none" and self.ft_steps > 0 and "jitter_on" not in self.arms:
            raise ValueError("arms: transfer (ft_steps > 0) fine-tunes the jitter_on arm; include it or set ft_steps: 0")
        return self


class WindowStream(torch.utils.data.IterableDataset):
    """Endless batches of (context+1)-frame windows; one (scenario, resolution) group per batch."""

    def __init__(self, groups: dict[str, torch.Tensor], batch: int, context: int, steps: int, seed: int):
        self.groups, self.keys = groups, sorted(groups)
        self.batch, self.context, self.steps, self.seed = batch, context, steps, seed

    def __iter__(self):
        rng = np.random.default_rng(self.seed)
        for _ in range(self.steps):
            data = self.groups[self.keys[rng.integers(len(self.keys))]]           # (n, T, C, N, N)
            traj = rng.integers(data.shape[0], size=self.batch)
            start = rng.integers(data.shape[1] - self.context, size=self.batch)
            yield torch.stack([data[i, s:s + self.context + 1] for i, s in zip(traj, start)])


class LitWalrus(L.LightningModule):
    def __init__(self, model: Walrus, context: int, lr: float, weight_decay: float, warmup: int):
        super().__init__()
        self.model, self.context = model, context
        self.lr, self.wd, self.warmup = lr, weight_decay, warmup
        self.losses: list[float] = []

    def training_step(self, batch, _):
        loss = normalized_l1(self.model, batch, self.context)
        self.losses.append(float(loss.detach()))
        self.log("train/loss", loss, prog_bar=False)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.model.parameters(), lr=self.lr, weight_decay=self.wd)
        w = self.warmup
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / w, math.sqrt(w / max(s + 1, w))))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def build(cfg: Config, meta: dict, arm: str, seed: int) -> Walrus:
    jitter, roll, tok = ARMS.get(arm, ARMS["jitter_on"])
    return Walrus(channels=2, d=cfg.d, depth=cfg.depth, heads=cfg.heads, mlp_ratio=cfg.mlp_ratio,
                  max_t=meta["context"], jitter=jitter, token_roll=roll, tokenization=tok,
                  tokens_per_axis=meta["tokens_per_axis"], patch_size=meta["patch_size"], seed=seed)


def fit(cfg: Config, ctx: StageContext, model: Walrus, groups, meta, seed: int, steps: int, lr: float,
        device) -> list[float]:
    lit = LitWalrus(model, meta["context"], lr, cfg.weight_decay, cfg.warmup)
    stream = WindowStream(groups, cfg.batch_size, meta["context"], steps, seed)
    loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=0)
    accel = "gpu" if device.type == "cuda" and cfg.trainer.accelerator == "cpu" else cfg.trainer.accelerator
    make_trainer(cfg.trainer, ctx.tracker, max_steps=steps, accelerator=accel).fit(lit, loader)
    return lit.losses


def run(cfg: Config, ctx: StageContext) -> None:
    device = pick_device(cfg.device)
    prep = ctx.input("prepare")
    meta = read_json(prep / "meta.json")
    if cfg.held_out != "none" and cfg.held_out not in meta["scenarios"]:
        from stages.common.config import ConfigError
        raise ConfigError(f"papers.walrus.train.held_out: {cfg.held_out!r} is not a prepared scenario "
                          f"({', '.join(meta['scenarios'])})")
    train = load_groups(prep, "train")
    pre = {k: v for k, v in train.items() if not k.startswith(f"{cfg.held_out}_")}
    if not pre:
        from stages.common.config import ConfigError
        raise ConfigError("papers.walrus.train.held_out: no pretraining scenario left")
    (ctx.out / "models").mkdir()
    record = {"arms": {}, "transfer": {}, "pretrain_groups": sorted(pre), "held_out": cfg.held_out}
    with torch_threads(cfg.num_threads):
        for arm in cfg.arms:
            for seed in cfg.seeds:
                seed_everything(seed)
                model = build(cfg, meta, arm, seed)
                losses = fit(cfg, ctx, model, pre, meta, seed, cfg.steps, cfg.lr, device)
                torch.save(model.state_dict(), ctx.out / "models" / f"{arm}_s{seed}.pt")
                record["arms"].setdefault(arm, []).append({"seed": seed, "final_loss": float(np.mean(losses[-10:])),
                                                           "first_loss": losses[0]})
        if cfg.held_out != "none" and cfg.ft_steps > 0:
            held = {k: v[: cfg.ft_traj] for k, v in train.items() if k.startswith(f"{cfg.held_out}_")}
            for seed in cfg.seeds:
                for kind in ("finetune", "scratch"):
                    seed_everything(seed)
                    model = build(cfg, meta, "jitter_on", seed + 7919)
                    if kind == "finetune":   # ALGO: multi-scenario pretraining, then fine-tune on the held-out one
                        model.load_state_dict(torch.load(ctx.out / "models" / f"jitter_on_s{seed}.pt"))
                    losses = fit(cfg, ctx, model, held, meta, seed + 17, cfg.ft_steps, cfg.ft_lr, device)
                    torch.save(model.state_dict(), ctx.out / "models" / f"{kind}_s{seed}.pt")
                    record["transfer"].setdefault(kind, []).append({"seed": seed,
                                                                    "final_loss": float(np.mean(losses[-10:]))})
    record.update(steps=cfg.steps, batch_size=cfg.batch_size, ft_steps=cfg.ft_steps, ft_traj=cfg.ft_traj)
    write_json(ctx.out / "train.json", {**record, "config": {"d": cfg.d, "depth": cfg.depth, "heads": cfg.heads,
                                                             "mlp_ratio": cfg.mlp_ratio}})
