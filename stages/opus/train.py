"""train@opus: every arm x seed, trained on K selected of each N-candidate buffer at equal update tokens.

    python -m stages train opus              # writes data/opus/train/{runs.json, ckpt/<arm>-s<seed>.pt}

Arms (params.yaml `arms`): random, high_loss, greedy_opus (no Boltzmann), raw_grad_opus (P = I on an
AdamW-trained model: raw-gradient scoring), opus_adamw (AdamW-preconditioned, Boltzmann),
opus_no_redundancy, official_raw_tau (the official sampler on raw U), sgd_random / sgd_opus (an
SGD-trained model, SGD preconditioner P = I), the cost variants opus_window / opus_every4 / opus_cheap,
and redundant_* (random / greedy / Boltzmann on the near-duplicate-heavy pool). All use the same
model, optimizer hyper-parameters, candidate stream (per seed and pool), number of steps and K.
"""
from __future__ import annotations

from typing import Literal

import torch
from datasets import load_from_disk
from pydantic import Field, model_validator
from torch.utils.data import DataLoader, TensorDataset

from pydantic import field_validator

from stages.common.config import ConfigError, Seed, Seeds, StageConfig, unique_items
from stages.common.device import DeviceName, pick_device
from stages.common.paths import read_json, write_json
from stages.common.seeding import seed_everything
from stages.common.sources import SourceConfig
from stages.common.tiny_transformer import TinyTransformerConfig
from stages.common.trainer import TrainerConfig, make_trainer
from stages.opus.hf_source import HFOptions
from stages.opus.lm import ArmSpec, OptimSpec, SelectionLM, SelectionSpec


class ArmConfig(StageConfig):
    name: str = Field(min_length=1, max_length=64)
    selector: Literal["random", "high_loss", "opus"]
    optimizer: Literal["adamw", "sgd"] = "adamw"
    preconditioner: Literal["optimizer", "identity"] = "optimizer"
    sampling: Literal["boltzmann", "greedy"] = "boltzmann"
    redundancy: bool = True        # False: drop the η²⟨φ,Φ⟩ redundancy penalty (ablation)
    standardized: bool = True      # False: the official sampler p ∝ exp(raw U / τ)
    window: int | None = Field(None, ge=2, le=4096)  # score a W-token window of each sequence
    score_every: int = Field(1, ge=1, le=64)         # score once per k steps (k buffers at once)
    combined: bool = False         # one forward/backward for candidates + proxy
    vectorized: bool = False       # selection rounds on the device (Gumbel-max, no host syncs)
    pool: Literal["main", "redundant"] = "main"      # redundant: the near-duplicate-heavy pool
    stream: int = Field(0, ge=0, le=7)               # selection RNG stream (control: another random draw)


DEFAULT_ARMS = [
    ArmConfig(name="random", selector="random"),
    ArmConfig(name="random_stream2", selector="random", stream=1),   # control: random on another RNG stream
    ArmConfig(name="high_loss", selector="high_loss"),
    ArmConfig(name="greedy_opus", selector="opus", sampling="greedy"),
    ArmConfig(name="raw_grad_opus", selector="opus", preconditioner="identity"),
    ArmConfig(name="opus_adamw", selector="opus"),
    ArmConfig(name="opus_no_redundancy", selector="opus", redundancy=False),
    ArmConfig(name="official_raw_tau", selector="opus", standardized=False),
    ArmConfig(name="sgd_random", selector="random", optimizer="sgd"),
    ArmConfig(name="sgd_opus", selector="opus", optimizer="sgd"),
    ArmConfig(name="opus_window", selector="opus", window=16),
    ArmConfig(name="opus_every4", selector="opus", score_every=4),
    ArmConfig(name="opus_cheap", selector="opus", window=16, score_every=4, combined=True, vectorized=True),
    ArmConfig(name="redundant_random", selector="random", pool="redundant"),
    ArmConfig(name="redundant_greedy", selector="opus", sampling="greedy", pool="redundant"),
    ArmConfig(name="redundant_boltzmann", selector="opus", pool="redundant"),
]


class Config(StageConfig):
    seed: Seed = 0
    seeds: Seeds = Field(default_factory=lambda: [0, 1, 2], max_length=32)
    arms: list[ArmConfig] = Field(default_factory=lambda: list(DEFAULT_ARMS), min_length=1, max_length=64)
    buffer_size: int = Field(64, ge=1, le=65536)       # N candidates scored per step
    select_ratio: float = Field(0.5, gt=0, le=1)       # ρ, K = round(ρN)
    select_k: int | None = Field(None, ge=1, le=65536)  # explicit K (overrides ρ)
    sketch_size: int = Field(256, ge=1, le=1 << 20)    # m buckets per linear layer
    tau: float = Field(0.9, gt=0, le=1e6)              # Boltzmann temperature
    eta_scale: float = Field(1.0, gt=0, le=1e6)        # multiplies the optimizer-derived η
    proxy_batch: int = Field(16, ge=1, le=65536)       # proxy sequences per scoring step
    lr: float = Field(3e-3, gt=0, le=10)
    sgd_lr: float = Field(0.3, gt=0, le=100)
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.99, ge=0, lt=1)
    eps: float = Field(1e-8, gt=0, le=1)
    weight_decay: float = Field(0.0, ge=0, le=10)
    d_model: int = Field(32, ge=4, le=8192)
    n_layers: int = Field(1, ge=1, le=96)
    n_heads: int = Field(2, ge=1, le=128)
    eval_every: int = Field(10, ge=1, le=1_000_000)
    diag_every: int = Field(10, ge=1, le=1_000_000)    # redundancy diagnostics every this many steps
    device: DeviceName = "auto"
    trainer: TrainerConfig = TrainerConfig(max_steps=150, log_every_n_steps=10)
    # real path (full profile only): an HF model + web corpus (source) and the benchmark target set (proxy_source)
    source: SourceConfig = SourceConfig()
    proxy_source: SourceConfig = SourceConfig()
    hf: HFOptions = HFOptions()

    @field_validator("seeds")
    @classmethod
    def _unique_seeds(cls, v):
        return unique_items(v, "seeds")

    @property
    def k(self) -> int:
        return self.select_k if self.select_k is not None else max(1, round(self.select_ratio * self.buffer_size))

    @model_validator(mode="after")
    def _check(self):
        if self.select_k is not None and self.select_k > self.buffer_size:
            raise ValueError(f"select_k: K={self.select_k} must not exceed buffer_size N={self.buffer_size}")
        if self.trainer.max_steps < 1:
            raise ValueError("trainer.max_steps: the number of training steps per arm must be >= 1")
        if self.trainer.max_steps > 1_000_000:
            raise ValueError("trainer.max_steps: at most 1000000 steps per arm")
        names = [a.name for a in self.arms]
        if len(set(names)) != len(names):
            raise ValueError(f"arms: names must be unique (got {names})")
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError("d_model: must be divisible by n_heads with an even head dimension (RoPE)")
        if self.source.kind != "toy":
            from stages.opus.hf_source import check_real_config
            check_real_config(self)
        return self


def load_tokens(path, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    ds = load_from_disk(str(path), keep_in_memory=True)  # never write cache files into prepare's output
    if len(ds) == 0:
        raise ConfigError(f"{path}: the {what} set is empty")
    ds = ds.with_format("numpy")
    return torch.as_tensor(ds[:]["tokens"]).long(), torch.as_tensor(ds[:]["kind_id"]).long()


def run_one(cfg: Config, arm: ArmConfig, seed: int, data: dict, corpus: dict, tracker, device, rec
            ) -> tuple[dict, dict]:
    seed_everything(seed)
    model_cfg = TinyTransformerConfig(vocab_size=corpus["vocab_size"], d_model=cfg.d_model,
                                      n_layers=cfg.n_layers, n_heads=cfg.n_heads, max_seq_len=corpus["seq_len"])
    steps = cfg.trainer.max_steps
    pool = data["pool"] if arm.pool == "main" else data["pool_redundant"]
    # the same candidate stream for every arm of a seed (and pool): equal data, equal update tokens
    perm = torch.randperm(len(pool[0]), generator=torch.Generator().manual_seed(seed))
    reps = -(-steps * cfg.buffer_size // len(perm))
    stream = torch.cat([perm] * reps)[: steps * cfg.buffer_size]
    module = SelectionLM(
        model_cfg, ArmSpec(arm.name, arm.selector, arm.optimizer, arm.preconditioner, arm.sampling, arm.redundancy,
                           arm.standardized, arm.window, arm.score_every, arm.combined, arm.vectorized,
                           arm.stream),
        SelectionSpec(cfg.k, cfg.buffer_size, cfg.sketch_size, cfg.tau, cfg.eta_scale, cfg.proxy_batch,
                      cfg.diag_every),
        OptimSpec(cfg.lr, cfg.sgd_lr, (cfg.beta1, cfg.beta2), cfg.eps, cfg.weight_decay),
        pool, stream, data["proxy"], data["val"], seed, rec)
    loader = DataLoader(TensorDataset(torch.arange(steps)), batch_size=1)
    val = DataLoader(TensorDataset(torch.zeros(1)), batch_size=1)
    trainer = make_trainer(cfg.trainer, tracker, val_check_interval=cfg.eval_every, check_val_every_n_epoch=None,
                           accelerator="gpu" if device.type == "cuda" else "cpu", devices=1)
    trainer.fit(module, loader, val)
    score_s, update_s = module.score_s[1:], module.update_s[1:]  # drop the warm-up step
    run = {"arm": arm.name, **arm.model_dump(exclude={"name"}), "seed": seed,
           "val_curve": module.val_curve, "final_val_loss": module.val_curve[-1][1],
           "update_tokens": int(trainer.global_step * cfg.k * (corpus["seq_len"] - 1)),
           "steps": int(trainer.global_step),
           "selected_kind_counts": module.kind_counts.cpu().tolist(),
           "score_s_total": float(sum(score_s)), "update_s_total": float(sum(update_s)),
           "diagnostics": module.diagnostics, "precond_kinds": module.precond_kinds}
    ckpt = {"model_cfg": model_cfg.__dict__, "model": module.model.state_dict(),
            "optimizer": trainer.optimizers[0].state_dict(), "arm": arm.model_dump(), "seed": seed}
    return run, ckpt


def run(cfg: Config, ctx) -> None:
    from kernels.record import KernelRecord

    if cfg.source.kind != "toy":                      # full profile: also the real model + corpus (hf/, hf_source.py)
        from stages.opus.hf_source import run_full
        run_full(cfg, ctx)
    torch.set_num_threads(1)
    device = pick_device(cfg.device)
    prep = ctx.input("prepare")
    corpus = read_json(prep / "corpus.json")
    data = {"pool": load_tokens(prep / "pool", "pool"), "pool_redundant": load_tokens(prep / "pool_redundant", "pool"),
            "proxy": load_tokens(prep / "proxy", "proxy")[0], "val": load_tokens(prep / "val", "validation")[0]}
    if cfg.proxy_batch > len(data["proxy"]):
        raise ConfigError(f"papers.opus.train.proxy_batch={cfg.proxy_batch} exceeds the proxy set "
                          f"({len(data['proxy'])} sequences in {prep / 'proxy'})")
    if len(data["pool"][0]) < cfg.buffer_size:
        raise ConfigError(f"papers.opus.train.buffer_size={cfg.buffer_size} exceeds the pool ({len(data['pool'][0])})")
    for arm in cfg.arms:
        if arm.window is not None and arm.window > corpus["seq_len"]:
            raise ConfigError(f"papers.opus.train.arms[{arm.name}].window={arm.window} exceeds seq_len "
                              f"{corpus['seq_len']}")
    rec = KernelRecord(device)
    (ctx.out / "ckpt").mkdir()
    runs = []
    for seed in cfg.seeds:
        for arm in cfg.arms:
            print(f"train@opus: arm={arm.name} seed={seed}")
            result, ckpt = run_one(cfg, arm, seed, data, corpus, ctx.tracker, device, rec)
            torch.save(ckpt, ctx.out / "ckpt" / f"{arm.name}-s{seed}.pt")
            runs.append(result)
            ctx.tracker.log({f"final_val_loss/{arm.name}/s{seed}": result["final_val_loss"]})
    rec.save(ctx.out)
    write_json(ctx.out / "runs.json", {"k": cfg.k, "buffer_size": cfg.buffer_size, "sketch_size": cfg.sketch_size,
                                       "tau": cfg.tau, "lr": cfg.lr, "sgd_lr": cfg.sgd_lr,
                                       "proxy_batch": cfg.proxy_batch, "eta_scale": cfg.eta_scale,
                                       "device": str(device), "runs": runs})
