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

The suites are independent runs (each seeds itself from ``seeds``: its init and its batch generator, never a
stream shared with another suite), fitted by ``suite_run`` in a pool of ``workers`` single-threaded processes
(``stages.common.jobs``); the parent logs, checks and saves them in the serial order (``workers: 1``: the same
runs in this process, the same results).
"""
from __future__ import annotations

import os
from typing import Literal

import torch
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.loggers import Logger
from pydantic import Field, field_validator, model_validator

from kernels.gawr_loss import expectile_loss, gawr_actor_loss
from kernels.record import KernelRecord
from stages.common.config import Probability, Seeds, StageConfig, unique_items
from stages.common.device import DeviceName, pick_device
from stages.common.jobs import payload, run_jobs
from stages.common.paths import read_json, write_json
from stages.common.trainer import TrainerConfig, make_trainer
from stages.sciql import algos
from stages.sciql import data as D


class EnvTrain(StageConfig):
    steps: int = Field(..., ge=1, le=2_000_000)  # gradient steps per module


class Config(StageConfig):
    seeds: Seeds                           # one ensemble member per seed (≥ 3 at default for the claims)
    workers: int = Field(1, ge=1, le=64, description=(
        "processes for the independent suites (env × style, + the ablation), one intra-op thread each "
        "(1: in this process, same results)"))
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


class RowLogger(Logger):
    """Lightning logger that keeps what a fit logs (hyperparameters, metric rows) for the parent process to
    replay into its W&B logger (``replay``): a pooled run cannot hold the stage's tracker."""

    def __init__(self):
        super().__init__()
        self.events: list[tuple] = []

    @property
    def name(self) -> str:
        return "sciql"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        self.events.append(("hparams", dict(params)))

    def log_metrics(self, metrics, step=None) -> None:
        self.events.append(("metrics", dict(metrics), step))


def replay(events: list[tuple], logger) -> None:
    """Send a ``RowLogger``'s events to a Lightning logger, in their order (what the fit would have sent it)."""
    for event in events:
        if event[0] == "hparams":
            logger.log_hyperparams(event[1])
        else:
            logger.log_metrics(event[1], step=event[2])
    logger.save()
    logger.finalize("success")


def fit_module(kind: str, style: str | None, seeds: list[int], data: dict, meta: dict, cfg: Config, steps: int,
               ctx=None, relabel=None, backend: str = "auto", device=None, logger=None):
    """Fit one module for all seeds at once (an ensemble member per seed, each with its own batches).
    ``logger``: a Lightning logger to use instead of ``ctx``'s tracker (``RowLogger`` in a pooled run)."""
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
    extra_kw = {} if logger is None else {"logger": logger}
    trainer = make_trainer(tcfg, getattr(ctx, "tracker", None), callbacks=bar, max_steps=steps, **extra_kw)
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


def stage_cpu_s() -> float:
    """CPU seconds of this process and of its finished children (the pool's workers)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def suite_run(job: tuple) -> dict:
    """One suite (a job of ``jobs.run_jobs``: env, style, relabelling, file name; inputs from its payload):
    its weights, curves and snapshots on the CPU, its Lightning metrics and, when the parent tracks, the
    logger events to replay."""
    env_name, style, relabel, fname = job
    p = payload()
    cfg = Config.model_validate(p["cfg"])
    steps = getattr(cfg, env_name).steps
    print(f"train@sciql: {env_name} {fname[:-3]}: SCIQL + GAWR + BC + CBC + task-IQL actors, "
          f"seeds {cfg.seeds} vectorised, {steps} steps", flush=True)
    rows = RowLogger() if p["track"] else None
    module, logged, extra = fit_module("suite", style, cfg.seeds, p["data"][env_name], p["meta"][env_name], cfg,
                                       steps, relabel=relabel, backend=p["backend"], device=torch.device(p["device"]),
                                       logger=rows)
    cpu = lambda sd: {k: v.detach().cpu() for k, v in sd.items()}
    return {"hparams": dict(module.hparams), "state_dict": cpu(module.state_dict()), "curve": module.curve,
            "snapshots": {step: cpu(w) for step, w in module.snapshots.items()},
            "kernel_calls": dict(module.kernel_calls), "logged": logged, "extra": extra,
            "events": rows.events if rows is not None else []}


def rebuild_suite(result: dict, meta: dict, device):
    """The trained suite of a ``suite_run`` result, on ``device``."""
    module = algos.MODULES["suite"](obs_mean=torch.tensor(meta["obs_mean"]), obs_std=torch.tensor(meta["obs_std"]),
                                    **result["hparams"])
    module.load_state_dict(result["state_dict"])
    module.curve, module.snapshots = result["curve"], result["snapshots"]
    module.kernel_calls = dict(result["kernel_calls"])
    return module.to(device)


def suite_jobs(cfg: Config, env_name: str, styles: list[str]) -> list[tuple]:
    """An env's suites: one per style, then (Circle2D) the relabelling ablation."""
    jobs = [(env_name, style, None, f"suite_{style}.pt") for style in styles]
    if env_name == "circle2d" and cfg.ablation_relabel is not None and cfg.ablation_style in styles:
        jobs.append((env_name, cfg.ablation_style, (cfg.ablation_relabel, cfg.ablation_relabel),
                     f"ablation_{cfg.ablation_style}.pt"))
    return jobs


def run(cfg: Config, ctx) -> None:
    torch.set_num_threads(1)
    device = pick_device(cfg.device)
    rec = KernelRecord(device)
    prep = ctx.input("prepare")
    metas, datas, jobs = {}, {}, []
    for env_name in ("circle2d", "halfcheetah"):
        env_cfg = getattr(cfg, env_name)
        if env_cfg is None or not (prep / env_name / "meta.json").exists():
            continue
        metas[env_name] = read_json(prep / env_name / "meta.json")
        datas[env_name] = D.load_dataset(prep / env_name, metas[env_name]["styles"])
        (ctx.out / env_name).mkdir(parents=True)
        jobs += suite_jobs(cfg, env_name, metas[env_name]["styles"])
    # independent suites in a pool, the longest first: the most Adam steps (at equal steps a suite costs about the
    # same in either env, measured; ties keep the serial order)
    order = sorted(range(len(jobs)), key=lambda i: -getattr(cfg, jobs[i][0]).steps)
    tracker = getattr(ctx, "tracker", None)
    data = {"cfg": cfg.model_dump(mode="json"), "data": datas, "meta": metas, "backend": rec.backend,
            "device": str(device), "track": bool(tracker is not None and tracker.enabled)}
    done = run_jobs(suite_run, [jobs[i] for i in order], data, cfg.workers)
    results = [None] * len(jobs)
    for i, r in zip(order, done):
        results[i] = r
    summary, parity_done = {}, False
    for (env_name, style, _, fname), r in zip(jobs, results):       # the serial order: logs, parity, files
        meta = metas[env_name]
        if data["track"]:
            replay(r["events"], tracker.lightning_logger())
        module = rebuild_suite(r, meta, device)
        for name, n in module.kernel_calls.items():
            rec.count(name, n)
        if not parity_done:
            kernel_parity(rec, module, datas[env_name], env_name, style, cfg)
            parity_done = True
        save_suite(ctx.out / env_name / fname, module, style, cfg.seeds, meta, r["extra"])
        summary[f"{env_name}/{fname[:-3]}"] = {**r["logged"], **r["extra"]}
    rec.save(ctx.out)
    write_json(ctx.out / "train_summary.json", {"config": cfg.model_dump(mode="json"), "runs": summary})
    write_json(ctx.out / "cpu_time.json", {"cpu_s": stage_cpu_s()})
