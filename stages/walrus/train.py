"""train: Walrus arms (jitter off/on and ablations) on the pretraining scenarios, then transfer.

Arms (``ARMS``): jitter_off (no shift, no token roll), jitter_on (official periodic fixed jitter:
whole-domain shift + per-block token roll; constant pad + wall/open flags on non-periodic axes),
jitter_patch (the paper's description, the official non-fixed PatchJittererBoundaryPad: pad, then a
patch-scale roll U{-(p/2-1)..p/2-1} of the padded grid), jitter_no_roll (domain shift without the
per-block token roll), fixed_tok (jitter_on with a fixed patch instead of compute-adaptive
tokenization). Every arm trains its seeds together as ONE vectorized ensemble
(stages/common/ensemble.py): member k is, up to float rounding, the solo run of seed k
(tests/walrus/test_ensemble.py). One (scenario, resolution) group per step, drawn uniformly from a
schedule shared by every seed and arm (so members can be stacked); each seed draws its own windows
and its own jitter stream; the windows of seed k are the same in every arm (paired arms).

The learning curve: every ``curve_every`` steps the arms in ``curve_arms`` roll out the validation
trajectories (``curve_horizon`` steps, jitter on as at evaluation) and record one-step and
long-horizon VRMSE per member; report.py plots it, and ``steps`` / the evaluation horizon in
params.yaml were fixed from it.

Transfer: from each seed's jitter_on model, fine-tune on a few trajectories of the held-out scenario
(``finetune``) vs the same steps from scratch (``scratch``), both as 2 ensembles.

    python -m stages train walrus
"""
from __future__ import annotations

import math
from functools import partial
from typing import Literal

import lightning as L
import numpy as np
import torch
from pydantic import Field, field_validator, model_validator

from stages.common.config import Seed, Seeds, StageConfig, unique_items
from stages.common.device import DeviceName, pick_device
from stages.common.ensemble import EnsembleModule
from stages.common.paths import read_json, write_json
from stages.common.runner import StageContext
from stages.common.trainer import TrainerConfig, make_trainer
from stages.walrus.common import torch_threads
from stages.walrus.jitter import as_bcs
from stages.walrus.model import Walrus, normalized_l1, rollout_step
from stages.walrus.prepare import load_bcs, load_groups

ArmName = Literal["jitter_off", "jitter_on", "jitter_patch", "jitter_no_roll", "fixed_tok"]
ARMS = {  # name -> (jitter, token_roll, tokenization)
    "jitter_off": ("none", False, "adaptive"),
    "jitter_on": ("domain", True, "adaptive"),
    "jitter_patch": ("patch", True, "adaptive"),
    "jitter_no_roll": ("domain", False, "adaptive"),
    "fixed_tok": ("domain", True, "fixed"),
}
JITTER_STREAM = 7919      # the jitter draws of seed s come from default_rng([s, JITTER_STREAM])


class Config(StageConfig):
    seeds: Seeds = Field(default_factory=lambda: [0, 1, 2, 3, 4])
    arms: list[ArmName] = Field(default_factory=lambda: list(ARMS), min_length=1)
    arm_seeds: dict[ArmName, int] = Field(default_factory=dict, description="train only the first k seeds of "
                                          "these arms (budget); the others use every seed")
    held_out: Literal["kolmogorov", "burgers", "advdiff", "wave", "channel", "none"] = "wave"
    schedule_seed: Seed = Field(0, description="the group order, shared by every seed and arm")
    d: int = Field(32, ge=8, le=2048)
    depth: int = Field(2, ge=1, le=64)
    heads: int = Field(2, ge=1, le=32)
    mlp_ratio: int = Field(4, ge=1, le=8)
    batch_size: int = Field(4, ge=1, le=1024)
    steps: int = Field(500, ge=1, le=200_000)
    lr: float = Field(2e-3, gt=0, le=1.0)
    weight_decay: float = Field(1e-4, ge=0, le=1.0)
    warmup: int = Field(20, ge=1, le=10_000)
    curve_every: int = Field(0, ge=0, le=200_000, description="learning-curve checkpoint interval (0: off)")
    curve_arms: list[ArmName] = Field(default_factory=lambda: ["jitter_off", "jitter_on"])
    curve_horizon: int = Field(40, ge=1, le=1000, description="rollout steps of the learning-curve evaluation")
    curve_long_window: int = Field(10, ge=1, le=1000)
    curve_n_val: int = Field(1, ge=1, le=512, description="validation trajectories per group on the curve")
    ft_steps: int = Field(100, ge=0, le=100_000, description="fine-tune / scratch steps on the held-out scenario")
    ft_lr: float = Field(1e-3, gt=0, le=1.0)
    ft_traj: int = Field(3, ge=1, le=512, description="held-out training trajectories used for transfer")
    num_threads: int = Field(1, ge=1, le=64)
    device: DeviceName = "auto"
    trainer: TrainerConfig = TrainerConfig(log_every_n_steps=10, enable_progress_bar=False,
                                           gradient_clip_val=10.0)

    @field_validator("arms", "curve_arms")
    @classmethod
    def _arms(cls, v, info):
        return unique_items(v, info.field_name)

    @model_validator(mode="after")
    def _check(self):
        if self.d % (4 * self.heads):
            raise ValueError(f"d: {self.d} must be a multiple of 4 * heads ({4 * self.heads}) for axial RoPE")
        if self.held_out != "none" and self.ft_steps > 0 and "jitter_on" not in self.arms:
            raise ValueError("arms: transfer (ft_steps > 0) fine-tunes the jitter_on arm; include it or set ft_steps: 0")
        for arm, k in self.arm_seeds.items():
            if arm not in self.arms:
                raise ValueError(f"arm_seeds: {arm!r} is not in arms")
            if not 1 <= k <= len(self.seeds):
                raise ValueError(f"arm_seeds: {arm}: {k} outside 1..{len(self.seeds)} (the number of seeds)")
        missing = [a for a in self.curve_arms if a not in self.arms]
        if self.curve_every and missing:
            raise ValueError(f"curve_arms: {missing[0]!r} is not in arms")
        if self.curve_long_window > self.curve_horizon:
            raise ValueError(f"curve_long_window: {self.curve_long_window} exceeds curve_horizon {self.curve_horizon}")
        return self

    def seeds_of(self, arm: str) -> list[int]:
        return list(self.seeds[: self.arm_seeds.get(arm, len(self.seeds))])


def lr_lambda(warmup: int):
    """Linear warmup, then inverse square root (the official schedule's shape)."""
    return lambda s: min((s + 1) / warmup, math.sqrt(warmup / max(s + 1, warmup)))


class WindowStream(torch.utils.data.IterableDataset):
    """Endless per-seed batches: {"window": (S, B, context+1, C, N, N), "shift": (S, 2), "rolls": (S, depth, 2),
    "key", "bcs"}. The group of each step comes from ``schedule_seed`` (shared); seed s draws its windows from
    default_rng(s) and its jitter from default_rng([s, JITTER_STREAM]) with the arm's template model."""

    def __init__(self, groups: dict[str, torch.Tensor], bcs: dict, batch: int, context: int, steps: int,
                 seeds: list[int], schedule_seed: int, template: Walrus):
        self.groups, self.keys, self.bcs = groups, sorted(groups), bcs
        self.batch, self.context, self.steps, self.seeds = batch, context, steps, list(seeds)
        self.schedule_seed, self.template = schedule_seed, template

    def __len__(self):
        return self.steps

    def __iter__(self):
        sched = np.random.default_rng(self.schedule_seed)
        data_rngs = [np.random.default_rng(s) for s in self.seeds]
        jit_rngs = [np.random.default_rng([s, JITTER_STREAM]) for s in self.seeds]
        for _ in range(self.steps):
            key = self.keys[sched.integers(len(self.keys))]
            data = self.groups[key]                                                  # (n, T, C, N, N)
            bcs = self.bcs[key]
            wins, shifts, rolls = [], [], []
            for rng, jr in zip(data_rngs, jit_rngs):
                traj = rng.integers(data.shape[0], size=self.batch)
                start = rng.integers(data.shape[1] - self.context, size=self.batch)
                wins.append(torch.stack([data[i, s:s + self.context + 1] for i, s in zip(traj, start)]))
                sh, ro = self.template.draw(jr, tuple(data.shape[-2:]), bcs)
                shifts.append(sh)
                rolls.append(ro)
            yield {"window": torch.stack(wins), "shift": torch.stack(shifts), "rolls": torch.stack(rolls),
                   "key": key, "bcs": bcs}


class EnsembleWalrus(EnsembleModule):
    """Every seed of one arm as one vectorized ensemble; optional learning-curve checkpoints."""

    def __init__(self, make_model, seeds, context: int, lr: float, weight_decay: float, warmup: int,
                 curve: dict | None = None):
        super().__init__(make_model, seeds, optimizer=partial(torch.optim.AdamW, lr=lr, weight_decay=weight_decay))
        self.context, self.warmup = context, warmup
        self.curve_spec = curve
        self.curve: list[dict] = []
        self.losses: list[list[float]] = []                # (steps, S)
        self._bcs = None

    def member_loss(self, model, batch):
        return normalized_l1(model, batch["window"], self.context, self._bcs, batch["shift"], batch["rolls"])

    def training_step(self, batch, batch_idx):
        self._bcs = as_bcs(batch["bcs"])
        losses = self.ensemble_losses({k: batch[k] for k in ("window", "shift", "rolls")})
        self.last_losses = losses.detach()
        self.losses.append(self.last_losses.tolist())
        self.log("train/loss_mean", self.last_losses.mean(), prog_bar=False)
        return losses.sum()

    def configure_optimizers(self):
        opt = super().configure_optimizers()
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(self.warmup))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def on_train_batch_end(self, outputs, batch, batch_idx):
        spec = self.curve_spec
        step = batch_idx + 1
        if spec and (step % spec["every"] == 0 or step == spec["steps"]):
            self.curve.append({"step": step, **curve_point(self.ensemble, spec)})


class SoloWalrus(L.LightningModule):
    """One seed as a plain LightningModule (what member k of EnsembleWalrus must equal)."""

    def __init__(self, model: Walrus, context: int, lr: float, weight_decay: float, warmup: int):
        super().__init__()
        self.model, self.context, self.lr, self.wd, self.warmup = model, context, lr, weight_decay, warmup
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        loss = normalized_l1(self.model, batch["window"][0], self.context, as_bcs(batch["bcs"]),
                             batch["shift"][0], batch["rolls"][0])
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.model.parameters(), lr=self.lr, weight_decay=self.wd)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(self.warmup))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


# -------------------------------------------------------------------------------------------------
# learning-curve evaluation: vectorized rollouts of every member on the validation trajectories
# -------------------------------------------------------------------------------------------------
def vrmse(pred: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """ALGO: VRMSE per (…, T, C) = sqrt(mean err² / (unbiased spatial var(y) + 1e-7)) -> mean over C: (…, T)."""
    err = (pred - truth).pow(2).mean(dim=(-2, -1))
    var = truth.flatten(-2).var(dim=-1, unbiased=True)
    return torch.sqrt(err / (var + 1e-7)).mean(-1)


@torch.no_grad()
def ensemble_rollout(ensemble, init: torch.Tensor, steps: int, bcs, rngs: list[np.random.Generator],
                     template: Walrus) -> torch.Tensor:
    """init (B, context, C, N, N) shared -> (S, B, steps, C, N, N): every member's own rollout, one vmap
    per step; member k draws its jitter from rngs[k]."""
    S = len(ensemble)
    win = init[None].expand(S, *init.shape).contiguous()
    out = []
    for _ in range(steps):
        draws = [template.draw(r, tuple(init.shape[-2:]), bcs) for r in rngs]
        shift = torch.stack([d[0] for d in draws]).to(init.device)
        rolls = torch.stack([d[1] for d in draws]).to(init.device)
        nxt = ensemble.vmap(lambda m, w, s, r: rollout_step(m, w, bcs, s, r), win, shift, rolls)
        out.append(nxt)
        win = torch.cat([win[:, :, 1:], nxt], 2)
    return torch.cat(out, 2)


def curve_point(ensemble, spec: dict) -> dict:
    """Per member: one-step and long-window validation VRMSE (mean over groups and trajectories)."""
    was = ensemble.training
    ensemble.eval()
    C, H, Wl = spec["context"], spec["horizon"], spec["long_window"]
    rngs = [np.random.default_rng([s, spec["eval_seed"]]) for s in ensemble.seeds]
    curves, per_group = [], {}
    for key, data in spec["val"].items():
        pred = ensemble_rollout(ensemble, data[:, :C], H, spec["bcs"][key], rngs, spec["template"])
        cg = vrmse(pred, data[None, :, C:C + H]).mean(1).nan_to_num(nan=1e3, posinf=1e3).clamp(max=1e3)   # (S, H)
        curves.append(cg)
        per_group[key] = cg[:, H - Wl:].mean(1).tolist()
    c = torch.stack(curves).mean(0)                                                    # (S, H)
    ensemble.train(was)
    return {"one_step": c[:, 0].tolist(), "long": c[:, H - Wl:].mean(1).tolist(), "curve": c.tolist(),
            "groups": per_group}


# -------------------------------------------------------------------------------------------------
def build(cfg: Config, meta: dict, arm: str) -> Walrus:
    jitter, roll, tok = ARMS.get(arm, ARMS["jitter_on"])
    return Walrus(channels=2, d=cfg.d, depth=cfg.depth, heads=cfg.heads, mlp_ratio=cfg.mlp_ratio,
                  max_t=meta["context"], jitter=jitter, token_roll=roll, tokenization=tok,
                  tokens_per_axis=meta["tokens_per_axis"], patch_size=meta["patch_size"])


def fit_ensemble(cfg: Config, ctx: StageContext, arm: str, seeds: list[int], groups, bcs, meta, steps: int,
                 lr: float, device, init_states: list[dict] | None = None, curve: dict | None = None,
                 data_seeds: list[int] | None = None) -> EnsembleWalrus:
    lit = EnsembleWalrus(lambda s: build(cfg, meta, arm), seeds, meta["context"], lr, cfg.weight_decay,
                         cfg.warmup, curve)
    if init_states is not None:
        for k, state in enumerate(init_states):
            lit.ensemble.load_member_state_dict(k, state)
    stream = WindowStream(groups, bcs, cfg.batch_size, meta["context"], steps, data_seeds or seeds,
                          cfg.schedule_seed, build(cfg, meta, arm))
    loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=0)
    accel = "gpu" if device.type == "cuda" and cfg.trainer.accelerator == "cpu" else cfg.trainer.accelerator
    make_trainer(cfg.trainer, ctx.tracker, max_steps=steps, accelerator=accel).fit(lit, loader)
    return lit


def run(cfg: Config, ctx: StageContext) -> None:
    device = pick_device(cfg.device)
    prep = ctx.input("prepare")
    meta = read_json(prep / "meta.json")
    from stages.common.config import ConfigError
    if cfg.held_out != "none" and cfg.held_out not in meta["scenarios"]:
        raise ConfigError(f"papers.walrus.train.held_out: {cfg.held_out!r} is not a prepared scenario "
                          f"({', '.join(meta['scenarios'])})")
    if cfg.curve_every and cfg.curve_horizon > meta["n_frames"] - meta["context"]:
        raise ConfigError(f"papers.walrus.train.curve_horizon: {cfg.curve_horizon} is longer than the trajectories "
                          f"allow ({meta['n_frames']} frames - context {meta['context']})")
    if cfg.curve_every and cfg.curve_n_val > meta["n_val"]:
        raise ConfigError(f"papers.walrus.train.curve_n_val: {cfg.curve_n_val} exceeds the {meta['n_val']} "
                          "validation trajectories")
    bcs = load_bcs(meta)
    train = load_groups(prep, "train")
    is_held = lambda k: cfg.held_out != "none" and k.startswith(f"{cfg.held_out}_")   # noqa: E731
    pre = {k: v for k, v in train.items() if not is_held(k)}
    if not pre:
        raise ConfigError("papers.walrus.train.held_out: no pretraining scenario left")
    val = {k: v[: cfg.curve_n_val].to(device) for k, v in load_groups(prep, "val").items() if not is_held(k)}
    (ctx.out / "models").mkdir()
    record = {"arms": {}, "transfer": {}, "curves": {}, "pretrain_groups": sorted(pre), "held_out": cfg.held_out}
    with torch_threads(cfg.num_threads):
        for arm in cfg.arms:
            seeds = cfg.seeds_of(arm)
            curve = None
            if cfg.curve_every and arm in cfg.curve_arms:
                curve = {"every": cfg.curve_every, "steps": cfg.steps, "context": meta["context"],
                         "horizon": cfg.curve_horizon, "long_window": cfg.curve_long_window, "val": val,
                         "bcs": bcs, "template": build(cfg, meta, arm), "eval_seed": 104729}
            lit = fit_ensemble(cfg, ctx, arm, seeds, pre, bcs, meta, cfg.steps, cfg.lr, device, curve=curve)
            losses = np.array(lit.losses)                                               # (steps, S)
            for k, seed in enumerate(seeds):
                torch.save(lit.ensemble.member_state_dict(k), ctx.out / "models" / f"{arm}_s{seed}.pt")
                record["arms"].setdefault(arm, []).append({
                    "seed": seed, "first_loss": float(losses[0, k]),
                    "final_loss": float(losses[-10:, k].mean())})
            record.setdefault("loss_curves", {})[arm] = losses.mean(1).tolist()
            if lit.curve:
                record["curves"][arm] = lit.curve
        if cfg.held_out != "none" and cfg.ft_steps > 0:
            held = {k: v[: cfg.ft_traj] for k, v in train.items() if is_held(k)}
            seeds = cfg.seeds_of("jitter_on")
            for kind in ("finetune", "scratch"):
                init = None
                if kind == "finetune":       # ALGO: multi-scenario pretraining, then fine-tune on the held-out one
                    init = [torch.load(ctx.out / "models" / f"jitter_on_s{s}.pt") for s in seeds]
                init_seeds = [s + 7919 for s in seeds]            # scratch init differs from the pretrained one
                lit = fit_ensemble(cfg, ctx, "jitter_on", init_seeds, held, bcs, meta, cfg.ft_steps, cfg.ft_lr,
                                   device, init_states=init, data_seeds=[s + 17 for s in seeds])
                losses = np.array(lit.losses)
                for k, seed in enumerate(seeds):
                    torch.save(lit.ensemble.member_state_dict(k), ctx.out / "models" / f"{kind}_s{seed}.pt")
                    record["transfer"].setdefault(kind, []).append({"seed": seed,
                                                                    "final_loss": float(losses[-10:, k].mean())})
    record.update(steps=cfg.steps, batch_size=cfg.batch_size, ft_steps=cfg.ft_steps, ft_traj=cfg.ft_traj,
                  curve_every=cfg.curve_every, curve_horizon=cfg.curve_horizon,
                  curve_long_window=cfg.curve_long_window, seeds={a: cfg.seeds_of(a) for a in cfg.arms})
    write_json(ctx.out / "train.json", {**record, "config": {"d": cfg.d, "depth": cfg.depth, "heads": cfg.heads,
                                                             "mlp_ratio": cfg.mlp_ratio}})
