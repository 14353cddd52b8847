"""The one Lightning ``Trainer`` factory every gradient-trained paper uses.

A paper's train Config embeds ``trainer: TrainerConfig`` so that ``params.yaml`` sets
accelerator/devices/strategy/num_nodes/precision/max_steps per paper, e.g. for a GPU run::

    dvc exp run -S 'papers.reversal_curse.train.trainer.accelerator=gpu' \
                -S 'papers.reversal_curse.train.trainer.devices=4' \
                -S 'papers.reversal_curse.train.trainer.strategy=ddp'

DDP on CPU uses the gloo backend. Multi-node: set ``num_nodes`` and launch each node with
torchrun or under SLURM (Lightning reads MASTER_ADDR/NODE_RANK or SLURM_* from the environment).
"""
from __future__ import annotations

from typing import Any, Literal, Sequence

from pydantic import Field

from stages.common.config import StageConfig


class TrainerConfig(StageConfig):
    accelerator: Literal["cpu", "gpu", "cuda", "mps", "auto"] = "cpu"
    devices: int | Literal["auto"] = 1
    strategy: Literal["auto", "ddp", "ddp_spawn", "fsdp", "deepspeed"] = "auto"
    num_nodes: int = Field(1, ge=1)
    precision: Literal["32-true", "64-true", "16-mixed", "bf16-mixed", "bf16-true"] = "32-true"
    max_steps: int = Field(-1, ge=-1)
    max_epochs: int | None = Field(None, ge=1)
    log_every_n_steps: int = Field(10, ge=1)
    gradient_clip_val: float | None = Field(None, gt=0)
    enable_progress_bar: bool = True
    deterministic: bool = False


def _strategy(cfg: TrainerConfig):
    if cfg.strategy in ("ddp", "ddp_spawn") and cfg.accelerator == "cpu":
        from lightning.pytorch.strategies import DDPStrategy

        start = "spawn" if cfg.strategy == "ddp_spawn" else "popen"
        return DDPStrategy(process_group_backend="gloo", start_method=start)
    return cfg.strategy


def make_trainer(cfg: TrainerConfig, tracker: Any = None, callbacks: Sequence[Any] = (),
                 **overrides: Any):
    """Build a ``lightning.Trainer`` from a TrainerConfig (CPU, no checkpoints, progress bar)."""
    import lightning as L

    logger = tracker.lightning_logger() if tracker is not None else False
    kwargs: dict[str, Any] = dict(
        accelerator=cfg.accelerator, devices=cfg.devices, strategy=_strategy(cfg),
        num_nodes=cfg.num_nodes, precision=cfg.precision, max_steps=cfg.max_steps,
        max_epochs=cfg.max_epochs, log_every_n_steps=cfg.log_every_n_steps,
        gradient_clip_val=cfg.gradient_clip_val, enable_progress_bar=cfg.enable_progress_bar,
        deterministic=cfg.deterministic, logger=logger, callbacks=list(callbacks),
        enable_checkpointing=False, enable_model_summary=False, default_root_dir=None,
        num_sanity_val_steps=0,
    )
    kwargs.update(overrides)
    return L.Trainer(**kwargs)
