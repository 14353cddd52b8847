"""train: the grid batch size × weight decay (× lr) × seed, every run at the same token budget,
inside this one stage. Each run is a ``GridRun`` LightningModule fitted by the shared Trainer
factory; its trajectory (erank(W_U), geometry, ID/OOD val loss at token-aligned points) goes to
history.csv and, per run, to the stage's W&B run under ``<run>/<metric>``.

    python -m stages train unembed_rank
"""
from __future__ import annotations

import logging
import warnings
from typing import Annotated

import numpy as np
import polars as pl
import torch
from pydantic import Field, field_validator, model_validator
from torch.utils.data import DataLoader

from kernels.fused_linear_ce import linear_cross_entropy
from kernels.record import KernelRecord
from stages.common.config import ConfigError, Fraction, Seeds, StageConfig, unique_items, TransformerShape
from stages.common.paths import write_json
from stages.common.runner import StageContext
from stages.common.sources import SourceConfig
from stages.common.tiny_transformer import TinyTransformerConfig
from stages.common.trainer import TrainerConfig, make_trainer
from stages.unembed_rank.hf_source import HFSweepOptions
from stages.unembed_rank.lm import KERNEL, GridRun, WindowBatches, eval_windows

BatchSize = Annotated[int, Field(gt=0, le=4096)]
WeightDecay = Annotated[float, Field(ge=0.0, le=10.0)]
LearningRate = Annotated[float, Field(gt=0.0, le=1.0)]


class ModelConfig(TransformerShape):
    seq_len: int = Field(64, ge=2, le=4096)


class Config(StageConfig):
    seeds: Seeds = Field(default_factory=lambda: [0, 1, 2], max_length=10)
    batch_sizes: list[BatchSize] = Field(default_factory=lambda: [8, 32, 128], min_length=1, max_length=8)
    weight_decays: list[WeightDecay] = Field(default_factory=lambda: [0.0, 0.1, 1.0], min_length=1, max_length=8)
    lrs: list[LearningRate] = Field(default_factory=lambda: [3e-3], min_length=1, max_length=4)
    tokens: int = Field(196_608, gt=0, le=2_000_000_000, description="training tokens per run (every run)")
    warmup_frac: Fraction = 0.1
    final_lr_frac: float = Field(0.1, ge=0.0, le=1.0, description="final LR as a fraction of the peak")
    n_evals: int = Field(10, ge=2, le=200, description="token-aligned evaluation points per run")
    eval_windows: int = Field(64, ge=1, le=100_000, description="fixed val / OOD windows per evaluation")
    model: ModelConfig = ModelConfig()
    torch_threads: int = Field(1, ge=1, le=64)
    trainer: TrainerConfig = TrainerConfig(enable_progress_bar=False)
    # real path (full profile only): the same grid on a real corpus with a tiny HF Llama (stages/unembed_rank/hf_source.py)
    source: SourceConfig = SourceConfig()
    ood_source: SourceConfig = SourceConfig()
    hf: HFSweepOptions = HFSweepOptions()

    @field_validator("seeds", "batch_sizes", "weight_decays", "lrs")
    @classmethod
    def _distinct(cls, v, info):
        return unique_items(v, info.field_name)

    @model_validator(mode="after")
    def _budget(self):
        for bs in self.batch_sizes:
            per_step = bs * self.model.seq_len
            if self.tokens % per_step or self.tokens // per_step < self.n_evals:
                raise ValueError(f"tokens: {self.tokens} must be a multiple of batch × seq_len = {per_step} "
                                 f"(batch {bs}) with ≥ n_evals = {self.n_evals} steps, for an equal token budget")
        if self.source.kind != "toy":
            from stages.unembed_rank.hf_source import check_train_sources
            check_train_sources(self)
        return self


def run_name(bs: int, wd: float, lr: float, seed: int) -> str:
    return f"bs{bs}_wd{wd:g}_lr{lr:g}_s{seed}"


def grid(cfg: Config) -> list[dict]:
    return [{"batch_size": bs, "weight_decay": wd, "lr": lr, "seed": s}
            for s in cfg.seeds for lr in cfg.lrs for bs in cfg.batch_sizes for wd in cfg.weight_decays]


def model_config(cfg: Config) -> TinyTransformerConfig:
    m = cfg.model
    return TinyTransformerConfig(vocab_size=256, d_model=m.d_model, n_layers=m.n_layers, n_heads=m.n_heads,
                                 max_seq_len=m.seq_len, causal=True, positional="rope", norm="rmsnorm",
                                 mlp="swiglu", tie_embeddings=False)


def load_split(ctx: StageContext, name: str) -> torch.Tensor:
    return torch.from_numpy(np.load(ctx.input("prepare") / f"{name}.npy"))


def run(cfg: Config, ctx: StageContext) -> None:
    torch.set_num_threads(cfg.torch_threads)
    if cfg.source.kind != "toy":                      # full profile: also the real-corpus sweep (hf/, hf_source.py)
        from stages.unembed_rank.hf_source import run_full_train
        run_full_train(cfg, ctx)
    train = load_split(ctx, "train")
    T = cfg.model.seq_len
    windows = train.numel() // (T + 1)
    for bs in cfg.batch_sizes:  # checked before any training
        if bs > windows:
            raise ConfigError(f"papers.unembed_rank.train.batch_sizes: batch size {bs} is larger than the dataset "
                              f"({windows} training windows of {T + 1} bytes; raise prepare.train_bytes)")
    val, ood = eval_windows(load_split(ctx, "val"), T, cfg.eval_windows), eval_windows(load_split(ctx, "ood"), T, cfg.eval_windows)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*treespec, LeafSpec.*")
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # one fit per run: no per-fit banners
    probe = make_trainer(cfg.trainer, None, max_steps=1)
    rec = KernelRecord(probe.strategy.root_device)
    mcfg = model_config(cfg)
    history, runs, states = [], [], {}
    for spec in grid(cfg):
        bs, seed = spec["batch_size"], spec["seed"]
        name = run_name(bs, spec["weight_decay"], spec["lr"], seed)
        steps = cfg.tokens // (bs * T)
        evals = sorted({max(1, round(steps * (i + 1) / cfg.n_evals)) for i in range(cfg.n_evals)})
        torch.manual_seed(seed)  # same initialization for every grid cell of a seed (paired arms)
        module = GridRun(mcfg, name=name, lr=spec["lr"], weight_decay=spec["weight_decay"], steps=steps,
                         warmup_frac=cfg.warmup_frac, final_lr_frac=cfg.final_lr_frac, eval_steps=evals,
                         val=val, ood=ood, rec=rec, tracker=ctx.tracker, meta=spec, tokens_per_step=bs * T)
        # the same seed draws the same batches for every weight decay (paired within a batch size)
        data = DataLoader(WindowBatches(train, bs, T, steps, seed=10_000 + seed), batch_size=None, shuffle=False)
        trainer = make_trainer(cfg.trainer, None, max_steps=steps)  # per-run curves: ctx.tracker, keyed by run
        trainer.fit(module, data)
        history.extend(module.history)
        runs.append({"name": name, **spec, "steps": steps, "tokens": steps * bs * T})
        states[name] = {k: v.detach().cpu() for k, v in module.model.state_dict().items()}
        if len(runs) == 1:  # Triton path vs torch reference on this run's real hidden states and W_U
            with torch.no_grad():
                batch = data.dataset[steps - 1][:2].to(module.model.unembed.device)
                h = module.model.hidden(batch[:, :-1])
                rec.parity(KERNEL, linear_cross_entropy, h.reshape(-1, h.shape[-1])[:96].contiguous(),
                           module.model.unembed.detach(), batch[:, 1:].reshape(-1)[:96],
                           slice=f"96 positions of run {name}'s last training batch (trained W_U)")
    torch.save(states, ctx.out / "models.pt")
    pl.DataFrame(history, infer_schema_length=None).write_csv(ctx.out / "history.csv")
    write_json(ctx.out / "runs.json", {"model": mcfg.__dict__, "seq_len": T, "tokens": cfg.tokens,
                                       "seeds": list(cfg.seeds), "batch_sizes": list(cfg.batch_sizes),
                                       "weight_decays": list(cfg.weight_decays), "lrs": list(cfg.lrs),
                                       "runs": runs})
    rec.save(ctx.out)
