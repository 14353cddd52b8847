"""train: three designs inside this one stage, every run a ``GridRun`` fitted by the shared Trainer.

- equal tokens: batch size × weight decay × lr × final LR × model width, every run ``tokens`` tokens. The
  main block (the first final LR and the first width) runs every seed of ``seeds`` and feeds the findings
  on the hyperparameter effects; the other cells run ``extra_seeds`` and only feed the correlation /
  incremental-R² analyses (the final LR and the width then enter their hyperparameter controls).
- equal steps (``equal_steps.steps``): the main block's cells with every batch size taking the same
  number of optimizer steps (tokens then differ by the batch-size ratio).
- saturation probe (``saturation``): a small model trained for many steps on a small slice of the
  training bytes (repeated data), where the in-domain val loss can rise late; its learning curves
  are recorded like every run's.

Runs with the same hyperparameters, steps and data in two designs are one run (trained once). Each run is a ``GridRun`` LightningModule fitted by the shared Trainer
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
from stages.unembed_rank.lm import KERNEL, GridEnsemble, GridRun, SeedWindowBatches, WindowBatches, eval_windows

BatchSize = Annotated[int, Field(gt=0, le=4096)]
WeightDecay = Annotated[float, Field(ge=0.0, le=10.0)]
LearningRate = Annotated[float, Field(gt=0.0, le=1.0)]
FinalLR = Annotated[float, Field(ge=0.0, le=1.0)]
Width = Annotated[int, Field(ge=2, le=4096)]


class EqualSteps(StageConfig):
    steps: int = Field(0, ge=0, le=10_000_000, description="optimizer steps of every batch size (0: design off)")
    weight_decays: list[WeightDecay] | None = Field(None, min_length=1, max_length=8,
                                                    description="weight decays of this design (None: the grid's)")


class SaturationProbe(StageConfig):
    steps: int = Field(0, ge=0, le=10_000_000, description="optimizer steps per probe run (0: probe off)")
    train_bytes: int = Field(16_000, ge=2, le=2_000_000_000, description="first bytes of the train split it repeats")
    d_model: int = Field(16, ge=2, le=4096)
    batch_sizes: list[BatchSize] = Field(default_factory=lambda: [8], min_length=1, max_length=8)
    weight_decays: list[WeightDecay] = Field(default_factory=lambda: [0.0, 1.0], min_length=1, max_length=8)
    seeds: Seeds = Field(default_factory=lambda: [0], max_length=10)


class ModelConfig(TransformerShape):
    seq_len: int = Field(64, ge=2, le=4096)


class Config(StageConfig):
    seeds: Seeds = Field(default_factory=lambda: [0, 1, 2], max_length=10)
    batch_sizes: list[BatchSize] = Field(default_factory=lambda: [8, 32, 128], min_length=1, max_length=8)
    weight_decays: list[WeightDecay] = Field(default_factory=lambda: [0.0, 0.1, 1.0], min_length=1, max_length=8)
    lrs: list[LearningRate] = Field(default_factory=lambda: [3e-3], min_length=1, max_length=4)
    tokens: int = Field(196_608, gt=0, le=2_000_000_000, description="training tokens per run (every run)")
    warmup_frac: Fraction = 0.1
    final_lr_fracs: list[FinalLR] = Field(default_factory=lambda: [0.1], min_length=1, max_length=4,
                                          description="final LR as a fraction of the peak (first: main block)")
    d_models: list[Width] = Field(default_factory=list, max_length=4,
                                  description="model widths (first: main block); empty = model.d_model only")
    extra_seeds: Seeds = Field(default_factory=lambda: [0], max_length=10,
                               description="seeds of the equal-token cells outside the main block")
    equal_steps: EqualSteps = EqualSteps()
    saturation: SaturationProbe = SaturationProbe()
    n_evals: int = Field(10, ge=2, le=200, description="token-aligned evaluation points per run")
    dense_steps: int = Field(0, ge=0, le=100_000,
                             description="every optimizer step up to this one is also logged (ID val loss + erank "
                                         "only) in the main-block and equal-steps runs: the matched-loss crossings")
    eval_windows: int = Field(64, ge=1, le=100_000, description="fixed val / OOD windows per evaluation")
    model: ModelConfig = ModelConfig()
    torch_threads: int = Field(1, ge=1, le=64)
    vectorize_seeds: bool = Field(True, description=(
        "train the seeds of a grid cell as one SeedEnsemble (vmap; member k = the solo run of its seed); "
        "false: seed after seed"))
    vectorize_max_batch: int = Field(32, ge=1, le=1_000_000, description=(
        "cells with a larger batch train seed after seed: their stacked (seed × batch) tensors fall out of cache "
        "(d 32, 3 seeds, CPU time solo / ensemble: 1.23 at batch 8, 1.05 at 32, 0.91 at 128)"))
    trainer: TrainerConfig = TrainerConfig(enable_progress_bar=False)
    # real path (full profile only): the same grid on a real corpus with a tiny HF Llama (stages/unembed_rank/hf_source.py)
    source: SourceConfig = SourceConfig()
    ood_source: SourceConfig = SourceConfig()
    hf: HFSweepOptions = HFSweepOptions()

    @field_validator("seeds", "batch_sizes", "weight_decays", "lrs", "final_lr_fracs", "d_models", "extra_seeds")
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
        for what, steps in (("equal_steps", self.equal_steps.steps), ("saturation", self.saturation.steps)):
            if 0 < steps < self.n_evals:
                raise ValueError(f"{what}.steps: {steps} must be ≥ n_evals = {self.n_evals} (or 0 to switch it off)")
        for d in self.widths:
            if d % self.model.n_heads or (d // self.model.n_heads) % 2:
                raise ValueError(f"d_models: width {d} must split into {self.model.n_heads} heads of even size (RoPE)")
        if self.source.kind != "toy":
            from stages.unembed_rank.hf_source import check_train_sources
            check_train_sources(self)
        return self


    @property
    def widths(self) -> list[int]:
        return list(self.d_models) or [self.model.d_model]


def run_name(bs: int, wd: float, lr: float, seed: int, final: float | None = None, d: int | None = None,
             steps: int | None = None, probe: bool = False) -> str:
    tail = "" if final is None else f"_f{final:g}_d{d}_n{steps}"
    return f"{'sat_' if probe else ''}bs{bs}_wd{wd:g}_lr{lr:g}{tail}_s{seed}"


def grid(cfg: Config) -> list[dict]:
    """The main block's cells × seeds (the real-corpus sweep of the full profile runs these)."""
    return [{"batch_size": bs, "weight_decay": wd, "lr": lr, "seed": s}
            for s in cfg.seeds for lr in cfg.lrs for bs in cfg.batch_sizes for wd in cfg.weight_decays]


DESIGNS = ("main", "tokens", "steps", "sat")


def seed_groups(specs: list[dict], vectorize: bool = True, max_batch: int | None = None) -> list[list[dict]]:
    """The runs grouped into cells that differ only in their seed (in first-appearance order), each trained as
    one ensemble; every run alone when not ``vectorize`` and in cells whose batch exceeds ``max_batch``."""
    cells: dict[tuple, list[dict]] = {}
    for s in specs:
        alone = not vectorize or (max_batch is not None and s["batch_size"] > max_batch)
        key = (s["name"],) if alone else tuple((k, v) for k, v in s.items() if k not in ("name", "seed"))
        cells.setdefault(key, []).append(s)
    return list(cells.values())


def run_specs(cfg: Config) -> list[dict]:
    """Every distinct run of the three designs, with the designs it belongs to (flags ``in_<design>``;
    ``main`` = the equal-token main block). A run shared by two designs is listed once."""
    T, f0, d0 = cfg.model.seq_len, cfg.final_lr_fracs[0], cfg.widths[0]
    specs: dict[str, dict] = {}

    def add(design: str, *, bs, wd, lr, final, d, seed, steps, probe=False):
        name = run_name(bs, wd, lr, seed, final, d, steps, probe)
        spec = specs.setdefault(name, {"name": name, "batch_size": bs, "weight_decay": wd, "lr": lr,
                                       "final_lr_frac": final, "d_model": d, "seed": seed, "steps": steps,
                                       "tokens": steps * bs * T, "probe": probe,
                                       **{f"in_{k}": False for k in DESIGNS}})
        spec[f"in_{design}"] = True

    for final in cfg.final_lr_fracs:
        for d in cfg.widths:
            main = final == f0 and d == d0
            for seed in (cfg.seeds if main else cfg.extra_seeds):
                for lr in cfg.lrs:
                    for bs in cfg.batch_sizes:
                        for wd in cfg.weight_decays:
                            kw = dict(bs=bs, wd=wd, lr=lr, final=final, d=d, seed=seed, steps=cfg.tokens // (bs * T))
                            add("tokens", **kw)
                            if main:
                                add("main", **kw)
    if cfg.equal_steps.steps:
        for seed in cfg.seeds:
            for lr in cfg.lrs:
                for bs in cfg.batch_sizes:
                    for wd in (cfg.equal_steps.weight_decays or cfg.weight_decays):
                        add("steps", bs=bs, wd=wd, lr=lr, final=f0, d=d0, seed=seed, steps=cfg.equal_steps.steps)
    sp = cfg.saturation
    if sp.steps:
        for seed in sp.seeds:
            for bs in sp.batch_sizes:
                for wd in sp.weight_decays:
                    add("sat", bs=bs, wd=wd, lr=cfg.lrs[0], final=f0, d=sp.d_model, seed=seed, steps=sp.steps,
                        probe=True)
    return list(specs.values())


def model_config(cfg: Config, d_model: int | None = None) -> TinyTransformerConfig:
    m = cfg.model
    return TinyTransformerConfig(vocab_size=256, d_model=d_model or m.d_model, n_layers=m.n_layers,
                                 n_heads=m.n_heads, max_seq_len=m.seq_len, causal=True, positional="rope",
                                 norm="rmsnorm", mlp="swiglu", tie_embeddings=False)


def load_split(ctx: StageContext, name: str) -> torch.Tensor:
    return torch.from_numpy(np.load(ctx.input("prepare") / f"{name}.npy"))


def run(cfg: Config, ctx: StageContext) -> None:
    torch.set_num_threads(cfg.torch_threads)
    if cfg.source.kind != "toy":                      # full profile: also the real-corpus sweep (hf/, hf_source.py)
        from stages.unembed_rank.hf_source import run_full_train
        run_full_train(cfg, ctx)
    train = load_split(ctx, "train")
    T = cfg.model.seq_len
    specs = run_specs(cfg)
    probe_train = train[: cfg.saturation.train_bytes]
    for spec in specs:  # checked before any training
        corpus = probe_train if spec["probe"] else train
        windows = corpus.numel() // (T + 1)
        if spec["batch_size"] > windows:
            key, where = (("saturation.batch_sizes", "saturation.train_bytes") if spec["probe"]
                          else ("batch_sizes", "prepare.train_bytes"))
            raise ConfigError(f"papers.unembed_rank.train.{key}: batch size {spec['batch_size']} is larger than the "
                              f"dataset ({windows} training windows of {T + 1} bytes; raise {where})")
    val, ood = eval_windows(load_split(ctx, "val"), T, cfg.eval_windows), eval_windows(load_split(ctx, "ood"), T, cfg.eval_windows)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*treespec, LeafSpec.*")
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # one fit per run: no per-fit banners
    probe = make_trainer(cfg.trainer, None, max_steps=1)
    rec = KernelRecord(probe.strategy.root_device)
    models, done = {}, {}
    meta_keys = ("batch_size", "weight_decay", "lr", "final_lr_frac", "d_model", "seed")
    for cell in seed_groups(specs, cfg.vectorize_seeds, cfg.vectorize_max_batch):
        spec = cell[0]
        bs, steps = spec["batch_size"], spec["steps"]
        evals = sorted({max(1, round(steps * (i + 1) / cfg.n_evals)) for i in range(cfg.n_evals)})
        mcfg = models.setdefault(spec["d_model"], model_config(cfg, spec["d_model"]))
        # the same seed draws the same batches for every weight decay / final LR / width (paired within a batch size)
        corpus = probe_train if spec["probe"] else train
        common = dict(lr=spec["lr"], weight_decay=spec["weight_decay"], steps=steps, warmup_frac=cfg.warmup_frac,
                      final_lr_frac=spec["final_lr_frac"], eval_steps=evals, val=val, ood=ood, rec=rec,
                      tracker=ctx.tracker, tokens_per_step=bs * T,
                      dense_steps=cfg.dense_steps if (spec["in_main"] or spec["in_steps"]) else 0)
        trainer = make_trainer(cfg.trainer, None, max_steps=steps)  # per-run curves: ctx.tracker, keyed by run
        if len(cell) > 1:   # the cell's seeds as one vectorized ensemble; member k = the solo run of its seed
            seeds = [s["seed"] for s in cell]
            module = GridEnsemble(mcfg, seeds, names=[s["name"] for s in cell],
                                  metas=[{k: s[k] for k in meta_keys} for s in cell], **common)
            trainer.fit(module, DataLoader(SeedWindowBatches(corpus, bs, T, steps, [10_000 + s for s in seeds]),
                                           batch_size=None, shuffle=False))
            for k, s in enumerate(cell):
                done[s["name"]] = (module.logs[k], module.ensemble.member(k))
        else:
            torch.manual_seed(spec["seed"])  # same initialization for every grid cell of a seed and width (paired arms)
            module = GridRun(mcfg, name=spec["name"], meta={k: spec[k] for k in meta_keys}, **common)
            trainer.fit(module, DataLoader(WindowBatches(corpus, bs, T, steps, seed=10_000 + spec["seed"]),
                                           batch_size=None, shuffle=False))
            done[spec["name"]] = (module.log_, module.model)
    history, dense, runs, states = [], [], [], {}
    for spec in specs:      # in run_specs order, whichever way the runs were grouped
        log, model = done[spec["name"]]
        history.extend(log.history)
        dense.extend(log.dense)
        runs.append(spec)
        states[spec["name"]] = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    first = specs[0]   # Triton path vs torch reference on the first run's real hidden states and W_U
    model = done[first["name"]][1]
    last = WindowBatches(probe_train if first["probe"] else train, first["batch_size"], T, first["steps"],
                         seed=10_000 + first["seed"])[first["steps"] - 1][:2].to(model.unembed.device)
    with torch.no_grad():
        h = model.hidden(last[:, :-1])
        rec.parity(KERNEL, linear_cross_entropy, h.reshape(-1, h.shape[-1])[:96].contiguous(),
                   model.unembed.detach(), last[:, 1:].reshape(-1)[:96],
                   slice=f"96 positions of run {first['name']}'s last training batch (trained W_U)")
    torch.save(states, ctx.out / "models.pt")
    pl.DataFrame(history, infer_schema_length=None).write_csv(ctx.out / "history.csv")
    # the dense early points (every step ≤ dense_steps that is not a regular point): ID val loss + erank only
    pl.DataFrame(dense, schema={"run": pl.String, "step": pl.Int64, "tokens": pl.Int64, "frac": pl.Float64,
                                "val_loss": pl.Float64, "erank": pl.Float64}).write_csv(ctx.out / "history_dense.csv")
    write_json(ctx.out / "runs.json", {"models": {str(d): m.__dict__ for d, m in models.items()},
                                       "model": model_config(cfg, cfg.widths[0]).__dict__, "seq_len": T,
                                       "tokens": cfg.tokens, "seeds": list(cfg.seeds),
                                       "extra_seeds": list(cfg.extra_seeds), "batch_sizes": list(cfg.batch_sizes),
                                       "weight_decays": list(cfg.weight_decays), "lrs": list(cfg.lrs),
                                       "final_lr_fracs": list(cfg.final_lr_fracs), "d_models": cfg.widths,
                                       "equal_steps": cfg.equal_steps.steps,
                                       "equal_steps_weight_decays": list(cfg.equal_steps.weight_decays
                                                                         or cfg.weight_decays),
                                       "dense_steps": cfg.dense_steps,
                                       "vectorize_max_batch": cfg.vectorize_max_batch if cfg.vectorize_seeds else 0,
                                       "saturation": cfg.saturation.model_dump(), "n_evals": cfg.n_evals,
                                       "runs": runs})
    rec.save(ctx.out)
