"""The shared Trainer factory's distributed settings and the runner's rank-0-only outputs."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from stages.common.trainer import TrainerConfig, global_rank, make_trainer

RANK_VARS = ("RANK", "SLURM_PROCID", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK")


@pytest.fixture
def clean_rank_env(monkeypatch):
    for var in RANK_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_ddp_on_cpu_uses_gloo_and_params_devices():
    from lightning.pytorch.strategies import DDPStrategy

    trainer = make_trainer(TrainerConfig(strategy="ddp", devices=2, num_nodes=1), None)
    assert isinstance(trainer.strategy, DDPStrategy)
    assert trainer.strategy._process_group_backend == "gloo"
    assert trainer.num_devices == 2 and trainer.num_nodes == 1


@pytest.mark.parametrize("kwargs, message", [
    ({"num_nodes": 2}, "num_nodes=2 needs strategy ddp"),
    ({"num_nodes": 2, "strategy": "ddp_spawn"}, "ddp_spawn cannot span nodes"),
    ({"precision": "16-mixed"}, "precision '16-mixed' is not available on accelerator 'cpu'"),
    ({"strategy": "horovod"}, "strategy"),
])
def test_bad_distributed_settings_fail_at_load(kwargs, message):
    with pytest.raises(ValidationError, match=message):
        TrainerConfig(**kwargs)


@pytest.mark.parametrize("env, rank", [
    ({}, 0), ({"LOCAL_RANK": "0", "NODE_RANK": "0"}, 0), ({"LOCAL_RANK": "1"}, 2), ({"NODE_RANK": "1"}, 2),
    ({"RANK": "3", "LOCAL_RANK": "1"}, 3), ({"SLURM_PROCID": "0"}, 0), ({"SLURM_PROCID": "5"}, 5),
])
def test_global_rank_from_launcher_env(clean_rank_env, env, rank):
    for key, value in env.items():
        clean_rank_env.setenv(key, value)
    assert (global_rank() == 0) == (rank == 0)
    if "RANK" in env or "SLURM_PROCID" in env:
        assert global_rank() == rank


def test_non_zero_rank_writes_no_outputs(clean_rank_env, tmp_path):
    from stages.common.runner import run_stage

    clean_rank_env.setenv("LOCAL_RANK", "1")
    clean_rank_env.setenv("WANDB_MODE", "disabled")
    out = run_stage("reversal_curse", "prepare", profile="smoke", root=tmp_path)
    assert not out.exists() and not list(tmp_path.rglob("*"))  # rank 1 ran the stage into scratch only
    clean_rank_env.setenv("LOCAL_RANK", "0")
    out = run_stage("reversal_curse", "prepare", profile="smoke", root=tmp_path)
    assert (out / "_stage.json").exists()
