"""train@opus: every arm x seed, trained on K selected of each N-candidate buffer at equal update tokens.

    python -m stages train opus              # writes data/opus/train/{runs.json, ckpt/<arm>-s<seed>.pt}

Arms (params.yaml `arms`): random, high_loss, greedy_opus (no Boltzmann), opus_sgd (P = I),
opus_adamw (AdamW-preconditioned, Boltzmann), opus_no_redundancy (opus_adamw without the penalty).
All use the same model, optimizer hyper-parameters,
data order (per seed), number of steps and K, so they see the same number of update tokens.
"""
from __future__ import annotations

from typing import Literal

import torch
from datasets import load_from_disk
from pydantic import Field, model_validator
from torch.utils.data import DataLoader, TensorDataset

from stages.common.config import ConfigError, StageConfig
from stages.common.paths import read_json, write_json
from stages.common.seeding import seed_everything
from stages.common.tiny_transformer import TinyTransformerConfig
from stages.common.trainer import TrainerConfig, make_trainer
from stages.opus.lm import ArmSpec, OptimSpec, SelectionLM, SelectionSpec


class ArmConfig(StageConfig):
    name: str = Field(min_length=1)
    selector: Literal["random", "high_loss", "opus"]
    optimizer: Literal["adamw", "sgd"] = "adamw"
    preconditioner: Literal["optimizer", "identity"] = "optimizer"
    sampling: Literal["boltzmann", "greedy"] = "boltzmann"
    redundancy: bool = True  # False: drop the η²⟨φ,Φ⟩ redundancy penalty (ablation)


DEFAULT_ARMS = [
    ArmConfig(name="random", selector="random"),
    ArmConfig(name="high_loss", selector="high_loss"),
    ArmConfig(name="greedy_opus", selector="opus", sampling="greedy"),
    ArmConfig(name="opus_sgd", selector="opus", preconditioner="identity"),
    ArmConfig(name="opus_adamw", selector="opus"),
    ArmConfig(name="opus_no_redundancy", selector="opus", redundancy=False),
]


class Config(StageConfig):
    seed: int = 0
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1)
    arms: list[ArmConfig] = Field(default_factory=lambda: list(DEFAULT_ARMS), min_length=1)
    buffer_size: int = Field(64, ge=1)                 # N candidates scored per step
    select_ratio: float = Field(0.5, gt=0, le=1)       # ρ, K = round(ρN)
    select_k: int | None = Field(None, ge=1)           # explicit K (overrides ρ)
    sketch_size: int = Field(256, ge=1)                # m buckets per linear layer
    tau: float = Field(0.9, gt=0)                      # Boltzmann temperature
    eta_scale: float = Field(1.0, gt=0)                # multiplies the optimizer-derived η
    proxy_batch: int = Field(16, ge=1)                 # proxy sequences per scoring step
    lr: float = Field(3e-3, gt=0)
    sgd_lr: float = Field(0.3, gt=0)
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.99, ge=0, lt=1)
    eps: float = Field(1e-8, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    d_model: int = Field(32, ge=4)
    n_layers: int = Field(1, ge=1)
    n_heads: int = Field(2, ge=1)
    eval_every: int = Field(10, ge=1)
    kernel_backend: Literal["auto", "torch", "triton"] = "auto"
    trainer: TrainerConfig = TrainerConfig(max_steps=150, log_every_n_steps=10)

    @property
    def k(self) -> int:
        return self.select_k if self.select_k is not None else max(1, round(self.select_ratio * self.buffer_size))

    @model_validator(mode="after")
    def _check(self):
        if self.select_k is not None and self.select_k > self.buffer_size:
            raise ValueError(f"select_k: K={self.select_k} must not exceed buffer_size N={self.buffer_size}")
        if self.trainer.max_steps < 1:
            raise ValueError("trainer.max_steps: the number of training steps per arm must be >= 1")
        names = [a.name for a in self.arms]
        if len(set(names)) != len(names):
            raise ValueError(f"arms: names must be unique (got {names})")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds: must be unique (got {self.seeds})")
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError("d_model must be divisible by n_heads with an even head dimension (RoPE)")
        return self


def load_tokens(path, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    ds = load_from_disk(str(path))
    if len(ds) == 0:
        raise ConfigError(f"{path}: the {what} set is empty")
    ds = ds.with_format("numpy")
    return torch.as_tensor(ds[:]["tokens"]).long(), torch.as_tensor(ds[:]["kind_id"]).long()


def run_one(cfg: Config, arm: ArmConfig, seed: int, data: dict, corpus: dict, tracker) -> tuple[dict, dict]:
    seed_everything(seed)
    model_cfg = TinyTransformerConfig(vocab_size=corpus["vocab_size"], d_model=cfg.d_model,
                                      n_layers=cfg.n_layers, n_heads=cfg.n_heads, max_seq_len=corpus["seq_len"])
    module = SelectionLM(
        model_cfg, ArmSpec(arm.name, arm.selector, arm.optimizer, arm.preconditioner, arm.sampling, arm.redundancy),
        SelectionSpec(cfg.k, cfg.sketch_size, cfg.tau, cfg.eta_scale, cfg.proxy_batch, cfg.kernel_backend),
        OptimSpec(cfg.lr, cfg.sgd_lr, (cfg.beta1, cfg.beta2), cfg.eps, cfg.weight_decay),
        data["proxy"], seed)
    pool = TensorDataset(*data["pool"])
    # the same candidate stream for every arm of a seed: equal data, equal update tokens
    loader = DataLoader(pool, batch_size=cfg.buffer_size, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(seed))
    val = DataLoader(TensorDataset(data["val"]), batch_size=len(data["val"]))
    trainer = make_trainer(cfg.trainer, tracker, val_check_interval=cfg.eval_every, check_val_every_n_epoch=None)
    trainer.fit(module, loader, val)
    kinds = torch.tensor(module.selected_kinds)
    run = {"arm": arm.name, "seed": seed, "selector": arm.selector, "optimizer": arm.optimizer,
           "preconditioner": arm.preconditioner, "sampling": arm.sampling,
           "redundancy": arm.redundancy,
           "val_curve": module.val_curve, "final_val_loss": module.val_curve[-1][1],
           "update_tokens": int(trainer.global_step * cfg.k * (corpus["seq_len"] - 1)),
           "steps": int(trainer.global_step),
           "selected_kind_counts": torch.bincount(kinds, minlength=5).tolist(),
           "score_s": module.score_s[1:], "update_s": module.update_s[1:],  # drop the warm-up step
           "precond_kinds": module.precond_kinds}
    ckpt = {"model_cfg": model_cfg.__dict__, "model": module.model.state_dict(),
            "optimizer": trainer.optimizers[0].state_dict(), "arm": arm.model_dump(), "seed": seed}
    return run, ckpt


def run(cfg: Config, ctx) -> None:
    torch.set_num_threads(1)
    prep = ctx.input("prepare")
    corpus = read_json(prep / "corpus.json")
    data = {"pool": load_tokens(prep / "pool", "pool"), "proxy": load_tokens(prep / "proxy", "proxy")[0],
            "val": load_tokens(prep / "val", "validation")[0]}
    if cfg.proxy_batch > len(data["proxy"]):
        raise ConfigError(f"papers.opus.train.proxy_batch={cfg.proxy_batch} exceeds the proxy set "
                         f"({len(data['proxy'])} sequences in {prep / 'proxy'})")
    if len(data["pool"][0]) < cfg.buffer_size:
        raise ConfigError(f"papers.opus.train.buffer_size={cfg.buffer_size} exceeds the pool ({len(data['pool'][0])})")
    (ctx.out / "ckpt").mkdir()
    runs = []
    for seed in cfg.seeds:
        for arm in cfg.arms:
            print(f"train@opus: arm={arm.name} seed={seed}")
            result, ckpt = run_one(cfg, arm, seed, data, corpus, ctx.tracker)
            torch.save(ckpt, ctx.out / "ckpt" / f"{arm.name}-s{seed}.pt")
            runs.append(result)
            ctx.tracker.log({f"final_val_loss/{arm.name}/s{seed}": result["final_val_loss"]})
    write_json(ctx.out / "runs.json", {"k": cfg.k, "buffer_size": cfg.buffer_size, "sketch_size": cfg.sketch_size,
                                       "tau": cfg.tau, "lr": cfg.lr, "proxy_batch": cfg.proxy_batch,
                                       "runs": runs})
