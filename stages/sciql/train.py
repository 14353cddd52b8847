"""train@sciql: BC, CBC, task-only IQL and SCIQL (+GAWR) as LightningModules, per env / style / seed.

    python -m stages train sciql [--profile smoke]

For every environment and style criterion (labelling function) one ``SCIQLSuite`` LightningModule
trains the per-style IQL, the task IQL and five actors on the same batches: SCIQL (style only),
SCIQL+GAWR, CBC, BC and task-only IQL (sharing GAWR's task critics). The seeds are vectorised:
each network is an ensemble with one independently initialised member per seed, each member
drawing its own batches. Batches come from the hindsight-relabelling sampler (current /
future-geometric / random label with ``value_relabel`` / ``actor_relabel``; the official main run is
100% random). ``ablation_relabel`` (optional) trains a second suite on ``ablation_style`` with those
probabilities. Fitted by ``make_trainer`` for ``<env>.steps`` Adam steps; every actor and value loss
of every step goes through kernels/gawr_loss.py (its hot loop: recorded in ``kernels.json``);
weights, loss curves and actor snapshots (learning curves) go to ``<out>/<env>/suite_<style>.pt``.
"""
from __future__ import annotations

import time
from typing import Literal

import torch
from lightning.pytorch.callbacks import TQDMProgressBar
from pydantic import Field, field_validator, model_validator

from kernels.gawr_loss import expectile_loss, gawr_actor_loss
from kernels.record import KernelRecord
from stages.common.config import Probability, Seeds, StageConfig, unique_items
from stages.common.device import DeviceName, pick_device
from stages.common.paths import read_json, write_json
from stages.common.trainer import TrainerConfig, make_trainer
from stages.sciql import algos
from stages.sciql import data as D


class EnvTrain(StageConfig):
    steps: int = Field(..., ge=1, le=2_000_000)  # gradient steps per module


class Config(StageConfig):
    seeds: Seeds                           # one ensemble member per seed (≥ 3 at default for the claims)
    device: DeviceName = "auto"            # picks the Lightning accelerator and the kernel path
    circle2d: EnvTrain
    halfcheetah: EnvTrain | None = None
    hidden: int = Field(64, ge=4, le=1024)        # width of every 2-layer MLP
    batch_size: int = Field(256, ge=2, le=8192)
    inner_steps: int = Field(10, ge=1, le=1000)   # Adam steps per Lightning training_step (less loop overhead)
    curve_points: int = Field(6, ge=0, le=100)    # learning-curve snapshots per module (0: none)
    lr: float = Field(1e-3, gt=0, le=1.0)
    expectile: float = Field(0.7, gt=0.0, lt=1.0)   # τ of the expectile value regression
    discount: float = Field(0.99, gt=0.0, le=1.0)   # γ
    polyak: float = Field(0.005, gt=0.0, le=1.0)    # ρ of the target critics
    beta: float = Field(3.0, ge=0.0, le=100.0)      # AWR temperature β in exp(β A)
    clip: float = Field(100.0, gt=0.0, le=1e6)      # weight clip
    geom_lambda: float = Field(0.99, gt=0.0, lt=1.0)  # λ of the future-index geometric
    value_relabel: list[Probability] = [0.0, 0.0, 1.0]   # P(current, future, random) label for the values
    actor_relabel: list[Probability] = [0.0, 0.0, 1.0]   # ... and for the actor (official: 100% random)
    ablation_relabel: list[Probability] | None = None    # relabelling ablation (values and actor), or none
    ablation_style: Literal["speed", "turn", "direction", "position"] = "position"                    # the Circle2D criterion the ablation trains on
    normalize_task_reward: bool = True   # official sampler: r / ((max − min episode return) / horizon)
    trainer: TrainerConfig = TrainerConfig(log_every_n_steps=50)

    @field_validator("seeds")
    @classmethod
    def _distinct(cls, v):
        return unique_items(v, "seeds")

    @model_validator(mode="after")
    def _check(self):
        for name in ("value_relabel", "actor_relabel", "ablation_relabel"):
            p = getattr(self, name)
            if p is None:
                continue
            if len(p) != 3 or abs(sum(p) - 1.0) > 1e-6:
                raise ValueError(f"{name}: expected 3 probabilities (current, future, random) summing to 1 (got {p})")
        if self.trainer.max_steps != -1:
            raise ValueError("trainer.max_steps: leave at -1; the step budget is <env>.steps (e.g. circle2d.steps)")
        return self


class StepBar(TQDMProgressBar):
    """Progress in Adam steps (each Lightning batch runs ``inner`` of them)."""

    def __init__(self, inner: int, steps: int):
        super().__init__(refresh_rate=1)
        self.inner, self.steps = inner, steps

    def on_train_epoch_start(self, trainer, pl_module):
        super().on_train_epoch_start(trainer, pl_module)
        self.train_progress_bar.reset(total=self.steps)
        self.train_progress_bar.set_description("train (Adam steps)")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.train_progress_bar.n = min(trainer.global_step, self.steps)
        self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))
        self.train_progress_bar.refresh()


def fit_module(kind: str, style: str | None, seeds: list[int], data: dict, meta: dict, cfg: Config, steps: int,
               ctx=None, relabel=None, backend: str = "auto", device=None):
    """Fit one module for all seeds at once (an ensemble member per seed, each with its own batches)."""
    torch.manual_seed(seeds[0])
    num_labels = meta["labels"][style]["num_labels"] if style is not None else 0
    every = max(1, steps // cfg.curve_points) if cfg.curve_points else 0
    module = algos.MODULES[kind](
        obs_dim=meta["obs_dim"], act_dim=meta["act_dim"], num_labels=num_labels,
        obs_mean=torch.tensor(meta["obs_mean"]), obs_std=torch.tensor(meta["obs_std"]), n_seeds=len(seeds),
        hidden=cfg.hidden, lr=cfg.lr, expectile=cfg.expectile, discount=cfg.discount, polyak=cfg.polyak,
        beta=cfg.beta, clip=cfg.clip, max_steps=steps, curve_every=every)
    module.kernel_backend = backend
    gen = torch.Generator().manual_seed(1000 * seeds[0] + 17)
    value_p, actor_p = relabel if relabel is not None else (cfg.value_relabel, cfg.actor_relabel)
    scale = D.return_scale(data, meta["max_steps"]) if cfg.normalize_task_reward else 1.0
    sampler = D.HindsightSampler(data, style, value_p, actor_p, cfg.geom_lambda, gen, reward_scale=scale)
    stream = D.BatchStream(sampler, cfg.batch_size, len(seeds), min(cfg.inner_steps, steps))
    loader = torch.utils.data.DataLoader(stream, batch_size=None)
    bar = [StepBar(stream.inner, steps)] if cfg.trainer.enable_progress_bar else []
    tcfg = cfg.trainer
    if device is not None:  # the stage's device decides the accelerator
        tcfg = tcfg.model_copy(update={"accelerator": "gpu" if device.type == "cuda" else "cpu", "devices": 1})
    trainer = make_trainer(tcfg, getattr(ctx, "tracker", None), callbacks=bar, max_steps=steps)
    trainer.fit(module, loader)
    logged = {k: float(v) for k, v in trainer.callback_metrics.items()}
    return module, logged, {"reward_scale": scale, "value_relabel": list(value_p), "actor_relabel": list(actor_p),
                            "geom_lambda": cfg.geom_lambda}


def save_suite(path, module, style, seeds, meta, extra):
    torch.save({"kind": "suite", "style": style, "seeds": seeds, "hparams": dict(module.hparams),
                "obs_mean": meta["obs_mean"], "obs_std": meta["obs_std"], "state_dict": module.state_dict(),
                "curve": module.curve, "snapshots": module.snapshots, **extra}, path)


def kernel_parity(rec: KernelRecord, module, data: dict, env_name: str, style: str, cfg: Config) -> None:
    """Triton vs torch on a slice of real training inputs: 64 dataset rows, seed member 0's actor."""
    idx = torch.arange(64)
    device = next(module.parameters()).device
    E = module.hparams.n_seeds
    rep = lambda x: x.to(device).unsqueeze(0).expand(E, *x.shape)     # (E, 64, ...): every seed member
    with torch.no_grad():
        obs, act, z = rep(module.norm(data["obs"][idx].to(device))), rep(data["action"][idx]), rep(data[f"label_{style}"][idx])
        a_z = module.style.advantage(obs, act, z)[0]
        a_r = module.task.advantage(obs, act)[0]
        mu, log_std = module.policies(obs, {n: z for n, (c, _) in module.actors.items() if c})["gawr"]
        q = module.style.target(obs, act, z).min(0).values[0]
        v = module.style.value(obs, z)[0]
    where = f"64 training rows of {env_name}/{style}, seed {cfg.seeds[0]}'s trained GAWR actor and critics"
    rec.parity("gawr_actor_loss", gawr_actor_loss, mu[0], log_std[0], act[0], a_z, a_r, cfg.beta, cfg.clip, True,
               slice=where)
    rec.parity("expectile_loss", expectile_loss, q, v, cfg.expectile, slice=where)


def run(cfg: Config, ctx) -> None:
    torch.set_num_threads(1)
    device = pick_device(cfg.device)
    rec = KernelRecord(device)
    prep = ctx.input("prepare")
    summary, parity_done = {}, False
    for env_name in ("circle2d", "halfcheetah"):
        env_cfg = getattr(cfg, env_name)
        if env_cfg is None or not (prep / env_name / "meta.json").exists():
            continue
        meta = read_json(prep / env_name / "meta.json")
        data = D.load_dataset(prep / env_name, meta["styles"])
        (ctx.out / env_name).mkdir(parents=True)
        jobs = [(style, None, f"suite_{style}.pt") for style in meta["styles"]]
        if env_name == "circle2d" and cfg.ablation_relabel is not None and cfg.ablation_style in meta["styles"]:
            jobs.append((cfg.ablation_style, (cfg.ablation_relabel, cfg.ablation_relabel),
                         f"ablation_{cfg.ablation_style}.pt"))
        for style, relabel, fname in jobs:
            print(f"train@sciql: {env_name} {fname[:-3]}: SCIQL + GAWR + BC + CBC + task-IQL actors, "
                  f"seeds {cfg.seeds} vectorised, {env_cfg.steps} steps")
            module, logged, extra = fit_module("suite", style, cfg.seeds, data, meta, cfg, env_cfg.steps, ctx,
                                               relabel=relabel, backend=rec.backend, device=device)
            for name, n in module.kernel_calls.items():
                rec.count(name, n)
            if not parity_done:
                kernel_parity(rec, module, data, env_name, style, cfg)
                parity_done = True
            save_suite(ctx.out / env_name / fname, module, style, cfg.seeds, meta, extra)
            summary[f"{env_name}/{fname[:-3]}"] = {**logged, **extra}
    rec.save(ctx.out)
    write_json(ctx.out / "train_summary.json", {"config": cfg.model_dump(mode="json"), "runs": summary})
    write_json(ctx.out / "cpu_time.json", {"cpu_s": time.process_time()})
