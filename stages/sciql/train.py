"""train@sciql: BC, CBC, task-only IQL and SCIQL (+GAWR) as LightningModules, per env / style / seed.

    python -m stages train sciql [--profile smoke]

For every environment and style criterion (labelling function) one ``SCIQLSuite`` LightningModule
trains the per-style IQL, the task IQL and five actors on the same batches: SCIQL (style only),
SCIQL+GAWR, CBC, BC and task-only IQL (sharing GAWR's task critics). The seeds are vectorised:
each network is an ensemble with one independently initialised member per seed, each member
drawing its own batches. Batches come from the hindsight-relabelling sampler (current /
future-geometric / random label). Fitted by ``make_trainer`` for ``<env>.steps`` Adam steps;
weights go to ``<out>/<env>/suite_<style>.pt``.
"""
from __future__ import annotations

import time

import torch
from lightning.pytorch.callbacks import TQDMProgressBar
from pydantic import Field, model_validator

from stages.common.config import StageConfig
from stages.common.paths import read_json, write_json
from stages.common.trainer import TrainerConfig, make_trainer
from stages.sciql import algos
from stages.sciql import data as D


class EnvTrain(StageConfig):
    steps: int = Field(..., ge=1)          # gradient steps per module


class Config(StageConfig):
    seeds: list[int] = Field(..., min_length=1)
    circle2d: EnvTrain
    halfcheetah: EnvTrain | None = None
    hidden: int = Field(64, ge=4)          # width of every 2-layer MLP
    batch_size: int = Field(256, ge=2)
    inner_steps: int = Field(10, ge=1)     # Adam steps per Lightning training_step (less loop overhead)
    lr: float = Field(1e-3, gt=0)
    expectile: float = Field(0.7, gt=0.0, lt=1.0)   # τ of the expectile value regression
    discount: float = Field(0.99, gt=0.0, le=1.0)   # γ
    polyak: float = Field(0.005, gt=0.0, le=1.0)    # ρ of the target critics
    beta: float = Field(3.0, ge=0.0)                # AWR temperature β in exp(β A)
    clip: float = Field(100.0, gt=0.0)              # weight clip
    geom_lambda: float = Field(0.99, gt=0.0, lt=1.0)  # λ of the future-index geometric
    value_relabel: list[float] = [0.2, 0.5, 0.3]    # P(current, future, random) label for the values
    actor_relabel: list[float] = [0.2, 0.5, 0.3]    # ... and for the actor
    trainer: TrainerConfig = TrainerConfig(log_every_n_steps=50)

    @model_validator(mode="after")
    def _check(self):
        for name in ("value_relabel", "actor_relabel"):
            p = getattr(self, name)
            if len(p) != 3 or min(p) < 0 or abs(sum(p) - 1.0) > 1e-6:
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
               ctx=None):
    """Fit one module for all seeds at once (an ensemble member per seed, each with its own batches)."""
    torch.manual_seed(seeds[0])
    num_labels = meta["labels"][style]["num_labels"] if style is not None else 0
    module = algos.MODULES[kind](
        obs_dim=meta["obs_dim"], act_dim=meta["act_dim"], num_labels=num_labels,
        obs_mean=torch.tensor(meta["obs_mean"]), obs_std=torch.tensor(meta["obs_std"]), n_seeds=len(seeds),
        hidden=cfg.hidden, lr=cfg.lr, expectile=cfg.expectile, discount=cfg.discount, polyak=cfg.polyak,
        beta=cfg.beta, clip=cfg.clip, max_steps=steps)
    gen = torch.Generator().manual_seed(1000 * seeds[0] + 17)
    sampler = D.HindsightSampler(data, style, cfg.value_relabel, cfg.actor_relabel, cfg.geom_lambda, gen)
    stream = D.BatchStream(sampler, cfg.batch_size, len(seeds), min(cfg.inner_steps, steps))
    loader = torch.utils.data.DataLoader(stream, batch_size=None)
    bar = [StepBar(stream.inner, steps)] if cfg.trainer.enable_progress_bar else []
    trainer = make_trainer(cfg.trainer, getattr(ctx, "tracker", None), callbacks=bar, max_steps=steps)
    trainer.fit(module, loader)
    logged = {k: float(v) for k, v in trainer.callback_metrics.items()}
    return module, logged


def run(cfg: Config, ctx) -> None:
    torch.set_num_threads(1)
    prep = ctx.input("prepare")
    summary = {}
    for env_name in ("circle2d", "halfcheetah"):
        env_cfg = getattr(cfg, env_name)
        if env_cfg is None or not (prep / env_name / "meta.json").exists():
            continue
        meta = read_json(prep / env_name / "meta.json")
        data = D.load_dataset(prep / env_name, meta["styles"])
        (ctx.out / env_name).mkdir(parents=True)
        for style in meta["styles"]:
            print(f"train@sciql: {env_name} style={style}: SCIQL + GAWR + BC + CBC + task-IQL actors, "
                  f"seeds {cfg.seeds} vectorised, {env_cfg.steps} steps")
            module, logged = fit_module("suite", style, cfg.seeds, data, meta, cfg, env_cfg.steps, ctx)
            torch.save({"kind": "suite", "style": style, "seeds": cfg.seeds, "hparams": dict(module.hparams),
                        "obs_mean": meta["obs_mean"], "obs_std": meta["obs_std"],
                        "state_dict": module.state_dict()}, ctx.out / env_name / f"suite_{style}.pt")
            summary[f"{env_name}/{style}"] = logged
    write_json(ctx.out / "train_summary.json", {"config": cfg.model_dump(mode="json"), "runs": summary})
    write_json(ctx.out / "cpu_time.json", {"cpu_s": time.process_time()})
