"""The one Lightning ``Trainer`` factory every gradient-trained paper uses.

A paper's train Config embeds ``trainer: TrainerConfig`` so that ``params.yaml`` sets
accelerator/devices/strategy/num_nodes/precision/max_steps per paper, e.g. for a GPU run::

    dvc exp run -S 'papers.reversal_curse.train.trainer.accelerator=gpu' \
                -S 'papers.reversal_curse.train.trainer.devices=4' \
                -S 'papers.reversal_curse.train.trainer.strategy=ddp'

DDP on CPU uses the gloo backend. With ``strategy: ddp`` Lightning re-runs the stage command
(``python -m stages train <slug>``) once per extra device with LOCAL_RANK/NODE_RANK set, so every
rank runs the whole stage; the runner keeps only global rank 0's outputs and tracking runs on rank 0
only. ``ddp_spawn`` instead forks inside ``fit`` (objects must pickle; state changed in the children,
e.g. histories, is lost). Multi-node: set ``num_nodes`` and ``devices`` (per node) and start the
same command on every node, either

    torchrun --nnodes=2 --nproc-per-node=4 --node-rank=$NODE --master-addr=$HOST --master-port=29500 \
        -m stages train <slug>          # Lightning sees torchrun's env and does not relaunch

or under SLURM (``srun python -m stages train <slug>`` with ``--ntasks-per-node`` = devices;
Lightning reads SLURM_* ). MASTER_ADDR/MASTER_PORT/NODE_RANK/WORLD_SIZE come from the launcher.
"""
from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Literal, Sequence

from pydantic import Field, model_validator

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

    @model_validator(mode="after")
    def _distributed(self) -> "TrainerConfig":
        if self.num_nodes > 1 and self.strategy not in ("ddp", "fsdp", "deepspeed"):
            raise ValueError(f"num_nodes={self.num_nodes} needs strategy ddp, fsdp or deepspeed "
                             f"(got {self.strategy!r}; ddp_spawn cannot span nodes)")
        if self.accelerator == "cpu" and self.precision == "16-mixed":
            raise ValueError(f"precision {self.precision!r} is not available on accelerator 'cpu'")
        return self


def global_rank() -> int:
    """This process's global rank in a distributed run (0 when not distributed).

    torchrun / SLURM / MPI set RANK / SLURM_PROCID / OMPI_COMM_WORLD_RANK; Lightning's "ddp"
    launcher re-runs the stage command with LOCAL_RANK and NODE_RANK set for each extra process.
    """
    for var in ("RANK", "SLURM_PROCID", "PMI_RANK", "OMPI_COMM_WORLD_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    local = int(os.environ.get("LOCAL_RANK", "0") or 0)
    node = int(os.environ.get("NODE_RANK", os.environ.get("GROUP_RANK", "0")) or 0)
    return 0 if local == 0 and node == 0 else 1 + local + node  # only "is it zero" matters here


@contextmanager
def scratch_dir(stage: str) -> Iterator[Path]:
    """Output dir for a non-zero rank: same code path, nothing kept."""
    with tempfile.TemporaryDirectory(prefix=f"{stage}-rank{global_rank()}-") as tmp:
        yield Path(tmp)


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
