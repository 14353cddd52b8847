"""train@clip_binding: scene + probe encoders from scratch, one per (coverage fraction, seed), in Lightning.

    python -m stages train clip_binding [--profile smoke]

Each model sees scenes built ONLY from its split's training objects (coverage sweep over
train_object_fraction); the loss is the fused cosine × soft cross-entropy (kernels/cosine_soft_ce.py)
over the batch's pooled concept and object queries with swap negatives. The (fraction, seed) models are
independent runs (each seeds its own init and batch generator from its seed): ``workers`` of them train at once
in single-threaded processes (stages/common/jobs.py); each saves its own weights, and the parent counts kernel
calls, logs (W&B) and writes the histories in (fraction, seed) order.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

import polars as pl
import torch
from pydantic import Field, model_validator

from kernels.cosine_soft_ce import cosine_soft_ce
from kernels.record import KernelRecord
from stages.common.config import Fraction, Seed, StageConfig
from stages.common.device import DeviceName, pick_device
from stages.common.jobs import payload, run_jobs
from stages.common.paths import read_json, write_json
from stages.common.runner import StageContext
from stages.common.trainer import TrainerConfig, make_trainer
from stages.clip_binding.models import BindingModel, steps_loader
from stages.clip_binding.prepare import frac_key
from stages.clip_binding.scenes import World, pooled_queries, sample_scenes


class Config(StageConfig):
    seed: Seed = 0
    device: DeviceName = "auto"
    torch_threads: int = Field(1, ge=1, le=64)
    d_model: int = Field(64, ge=8, le=1024)
    n_heads: int = Field(4, ge=1, le=32)
    n_layers: int = Field(2, ge=1, le=12)
    d_ff: int = Field(128, ge=8, le=4096)
    d_out: int = Field(32, ge=2, le=256)
    batch_size: int = Field(64, ge=2, le=4096)
    lr: float = Field(3e-3, gt=0, le=1.0)
    weight_decay: float = Field(0.1, ge=0, le=10.0)
    warmup: Fraction = 0.1
    steps: int = Field(1500, ge=1, le=200_000)
    heldout_negatives: bool = Field(False, description="swap negatives may be held-out objects (official as read)")
    activation: Literal["gelu", "relu"] = Field("gelu", description="transformer FF activation (official: GELU)")
    xavier_init: bool = Field(True, description="xavier_uniform_ on every weight with dim > 1 (official)")
    curve_every: int = Field(100, ge=0, le=100_000, description="learning curve: seen-object binding accuracy "
                             "every this many steps (0: off)")
    curve_scenes: int = Field(256, ge=8, le=8192, description="fixed 2-object scenes of training objects per curve point")
    trainer: TrainerConfig = TrainerConfig(enable_progress_bar=False)
    workers: int = Field(1, ge=1, le=64, description=(
        "(fraction, seed) models trained at once, each in its own single-threaded process (stages/common/jobs.py; "
        "1: one after another in this process, same results)"))

    @model_validator(mode="after")
    def _heads(self):
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model: {self.d_model} is not divisible by n_heads={self.n_heads}")
        return self


def model_kwargs(cfg: Config, world: World) -> dict:
    return dict(d_model=cfg.d_model, n_heads=cfg.n_heads, n_layers=cfg.n_layers, d_ff=cfg.d_ff,
                d_out=cfg.d_out, batch_size=cfg.batch_size, lr=cfg.lr, weight_decay=cfg.weight_decay,
                warmup=cfg.warmup, steps=cfg.steps, heldout_negatives=cfg.heldout_negatives,
                curve_every=cfg.curve_every, curve_scenes=cfg.curve_scenes, activation=cfg.activation,
                xavier_init=cfg.xavier_init)


def build_model(world: World, train_objects: torch.Tensor, kwargs: dict, seed: int, backend: str) -> BindingModel:
    torch.manual_seed(seed)  # same init per seed across coverage fractions (paired comparison)
    return BindingModel(world, train_objects, seed=seed, backend=backend, **kwargs)


def train_run(job: tuple[int, int]) -> dict:
    """One (coverage fraction i, seed j) model (a job of ``jobs.run_jobs``: inputs from its payload). Saves
    ``models/<frac>_s<seed>.pt``; returns its history rows and kernel call count. It draws only from generators
    seeded by its seed (init: ``build_model``; batches: the module's own generator), so the result is the same in
    any process and order."""
    i, j = job
    p = payload()
    meta, kwargs, device = p["meta"], p["kwargs"], torch.device(p["device"])
    f, seed = meta["train_object_fractions"][i], meta["seeds"][j]
    world = World(meta["k"], meta["v"], meta["n_max"])
    train_objs = torch.arange(world.n_objects)[p["coverage_masks"][i, j]].to(device)
    model = build_model(world, train_objs, kwargs, seed, p["backend"])
    trainer = make_trainer(TrainerConfig.model_validate(p["trainer"]), None, max_steps=kwargs["steps"])
    trainer.fit(model, steps_loader(kwargs["steps"]))                 # W&B: the parent logs the history rows
    model = model.cpu().eval()
    torch.save(model.state_dict(), Path(p["out"]) / "models" / f"{frac_key(f)}_s{seed}.pt")
    return {"i": i, "j": j, "history": [dict(h, fraction=f, seed=seed) for h in model.history],
            "calls": model.kernel_calls}


def run(cfg: Config, ctx: StageContext) -> None:
    torch.set_num_threads(cfg.torch_threads)
    device = pick_device(cfg.device)
    prep = ctx.input("prepare")
    meta = read_json(prep / "meta.json")
    splits = torch.load(prep / "splits.pt")
    world = World(meta["k"], meta["v"], meta["n_max"])
    if cfg.d_out > 256:
        raise ValueError("d_out: the kernel holds one embedding row in registers (<= 256)")
    rec = KernelRecord(device)
    kwargs = model_kwargs(cfg, world)
    (ctx.out / "models").mkdir()
    F, S = len(meta["train_object_fractions"]), len(meta["seeds"])
    # independent runs; the larger coverage fractions first (their learning-curve points score more pairs)
    jobs = [(i, j) for i in reversed(range(F)) for j in range(S)]
    data = {"meta": meta, "kwargs": kwargs, "device": str(device), "backend": rec.backend,
            "trainer": cfg.trainer.model_dump(mode="json"), "coverage_masks": splits["coverage_masks"],
            "out": str(ctx.out)}
    done = {(r["i"], r["j"]): r for r in run_jobs(train_run, jobs, data, cfg.workers)}
    history = []
    for i, f in enumerate(meta["train_object_fractions"]):         # rows in (fraction, seed) order, as before
        for j, seed in enumerate(meta["seeds"]):
            r = done[(i, j)]
            rec.count("cosine_soft_ce", r["calls"])
            history += r["history"]
            for h in r["history"] if ctx.tracker is not None else ():   # W&B: one curve per model
                ctx.tracker.log({"train/step": h["step"], **{f"train/{frac_key(f)}_s{seed}/{k}": v
                                                              for k, v in h.items()
                                                              if k not in ("step", "fraction", "seed")}})
    f, seed = meta["train_object_fractions"][-1], meta["seeds"][-1]     # the last model, as before
    train_objs = torch.arange(world.n_objects)[splits["coverage_masks"][F - 1, S - 1]]
    model = build_model(world, train_objs, kwargs, seed, rec.backend)
    model.load_state_dict(torch.load(ctx.out / "models" / f"{frac_key(f)}_s{seed}.pt"))
    model = model.eval()
    # parity of the Triton path on a real training batch of the last model
    g = torch.Generator().manual_seed(cfg.seed)
    objs, n = sample_scenes(world, train_objs, min(cfg.batch_size, 48), g)
    pool = None if cfg.heldout_negatives else train_objs
    with torch.no_grad():
        pq = pooled_queries(world, objs, n, g, pool)
        x = model.embed_scenes(objs, n)
        _, qo = model.embed_queries(pq["query_objs"])
        rec.parity("cosine_soft_ce", cosine_soft_ce, x, qo, pq["object_labels"], model.scale(),
                   slice=f"a {objs.shape[0]}-scene training batch (object queries) of the {frac_key(f)} seed-{seed} model")
    rec.save(ctx.out)
    pl.DataFrame(history).write_csv(ctx.out / "history.csv")
    write_json(ctx.out / "models.json", {"kwargs": kwargs, "world": meta,
                                         "labels": [f"{frac_key(f)}_s{s}" for f in meta["train_object_fractions"]
                                                    for s in meta["seeds"]]})
