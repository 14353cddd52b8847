"""train@tgdt: TG-DT and its baselines (no-info DT, one-hot id, TG-DT without alignment, oracle).

    python -m stages train tgdt [--profile smoke]

For every prepared environment, every arm of ``arms`` and every seed of ``seeds``, one ``TGDT``
(stages/tgdt/model.py) is fitted by ``make_trainer`` for ``steps`` AdamW steps on the training tasks
only (held-out tasks' episodes are never read here). With ``vectorize_seeds`` the seeds of an arm train
as one ``SeedEnsemble`` (``EnsembleTGDT``: member k = the solo run of seed k, same init, sampler
generator and AdamW; tests/tgdt/test_speed.py); otherwise seed after seed. TG-DT's first seed is then
trained on to ``curve_steps`` (``continue_curve``) for the learning curve that fixes ``steps``; the
evaluated model is the one after ``steps``. TG-DT's InfoNCE goes through kernels/fused_infonce.py on
every step (counted in ``kernels.json``, with Triton parity on a slice of real embeddings).
Weights go to ``<out>/<env>/<arm>_s<seed>.pt``.
"""
from __future__ import annotations

import time

import numpy as np
import torch
from datasets import load_from_disk
from pydantic import Field, field_validator, model_validator

from kernels.fused_infonce import fused_infonce
from kernels.record import KernelRecord
from stages.common.config import Seeds, StageConfig, unique_items
from stages.common.ensemble import EnsembleModule
from stages.common.device import DeviceName, pick_device
from stages.common.paths import read_json, write_json
from stages.common.trainer import TrainerConfig, make_trainer
from stages.tgdt import envs as E
from stages.tgdt import model as M
from stages.tgdt.model import ARMS, TGDT

from typing import Literal

Arm = Literal["tgdt", "tgdt_noalign", "dt", "onehot", "oracle_id", "oracle", "tgdt_share"]


class Config(StageConfig):
    seeds: Seeds                                   # ≥ 3 at default for the seed-aware claims
    arms: list[Arm] = Field(default_factory=lambda: list(ARMS), min_length=1)
    device: DeviceName = "auto"
    steps: int = Field(..., ge=1, le=200_000)      # AdamW steps per (env, arm, seed)
    batch_size: int = Field(64, ge=2, le=4096)
    context: int = Field(10, le=1000)              # K, DT context in timesteps (must be > 0)
    seg_len: int = Field(10, ge=1, le=1000)        # trajectory-encoder segment length (alignment pairs)
    text_len: int = Field(8, ge=2, le=64)          # max words per description
    d_model: int = Field(64, ge=8, le=1024)
    n_layers: int = Field(2, ge=1, le=12)
    n_heads: int = Field(4, ge=1, le=16)
    proj_dim: int = Field(32, ge=2, le=256)
    lr: float = Field(1e-3, gt=0, le=1.0)
    weight_decay: float = Field(1e-4, ge=0, le=1.0)
    nce_weight: float = Field(1.0, ge=0, le=100.0)   # λ of L_TBC (official 1:1:1)
    itm_weight: float = Field(1.0, ge=0, le=100.0)   # λ of L_TBM
    share_steps: int = Field(50, ge=1, le=200_000)   # tgdt_share: fine-tuning steps from TG-DT with data sharing
    share_top_k: int = Field(3, ge=1, le=100)        # tgdt_share: training tasks shared per held-out description
    vectorize_seeds: bool = True     # train the seeds of an arm as one SeedEnsemble (vmap); False: seed after seed
    curve_steps: int = Field(0, ge=0, le=400_000)   # > steps: the first seed of tgdt trains on to this many steps
                                                    # (learning curve only; the evaluated model stops at `steps`)
    trainer: TrainerConfig = TrainerConfig(log_every_n_steps=50)

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v):
        return unique_items(v, "seeds")

    @field_validator("arms")
    @classmethod
    def _arms(cls, v):
        return unique_items(v, "arms")

    @field_validator("context")
    @classmethod
    def _context(cls, v):
        if v <= 0:
            raise ValueError(f"context length must be > 0 timesteps (got {v})")
        return v

    @model_validator(mode="after")
    def _check(self):
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model: {self.d_model} is not divisible by n_heads={self.n_heads}")
        if "tgdt_share" in self.arms and "tgdt" not in self.arms:
            raise ValueError("arms: tgdt_share fine-tunes the tgdt arm; list tgdt too")
        if self.trainer.max_steps != -1:
            raise ValueError("trainer.max_steps: leave at -1; the step budget is `steps`")
        return self


def load_env(path, text_len: int, context: int = 10) -> tuple[dict, dict]:
    """Episodes as tensors (obs normalised; R̂ in units of rtg_scale) + per-task text ids / vectors."""
    meta = read_json(path / "meta.json")
    ds = load_from_disk(str(path / "dataset")).with_format("numpy")
    mean, std = np.asarray(meta["obs_mean"], np.float32), np.asarray(meta["obs_std"], np.float32)
    obs = (np.stack(list(ds["obs"])).astype(np.float32) - mean) / std
    rew = np.stack(list(ds["reward"])).astype(np.float32)
    rtg = np.flip(np.cumsum(np.flip(rew, 1), 1), 1) / meta["rtg_scale"]           # R̂_t = Σ_{t'≥t} r / scale
    tasks = [E.Task(meta["env"], t["index"], t["direction"], t["speed"], tuple(t["vector"]), t["held_out"])
             for t in meta["tasks"]]
    vocab = E.Vocab(meta["vocab"])
    text = torch.tensor([[vocab.encode(t.describe(k), text_len) for k in range(len(E.TEMPLATES))] for t in tasks])
    task = torch.as_tensor(np.asarray(ds["task"]), dtype=torch.long)
    held = torch.as_tensor(np.asarray(ds["held_out"]))
    expert = torch.as_tensor(np.asarray(ds["quality"]) == "expert")
    train_tasks = torch.tensor([t.index for t in tasks if not t.held_out])
    # validation: the last expert episode of every training task is held back from training (all arms)
    few = [t for t in train_tasks.tolist() if int((expert & (task == t)).sum()) < 2]
    if few:
        raise ValueError(f"expert_episodes: training task(s) {few} have < 2 expert episodes (one is held back "
                         "for the validation curve)")
    val_eps = torch.stack([torch.nonzero(expert & (task == t)).squeeze(1)[-1] for t in train_tasks.tolist()])
    is_val = torch.zeros(len(task), dtype=torch.bool)
    is_val[val_eps] = True
    expert = expert & ~is_val
    data = {"obs": torch.from_numpy(obs), "act": torch.from_numpy(np.stack(list(ds["action"])).astype(np.float32)),
            "rtg": torch.from_numpy(np.ascontiguousarray(rtg)), "task": task, "held_out": held,
            "train_eps": torch.nonzero(~held & ~is_val).squeeze(1), "train_tasks": train_tasks,
            "all_eps": torch.nonzero(~is_val).squeeze(1), "val_eps": val_eps,
            "expert_eps": {int(t): torch.nonzero(expert & (task == t)).squeeze(1) for t in range(len(tasks))},
            "task_eps": {int(t): torch.nonzero((task == t) & ~is_val).squeeze(1) for t in range(len(tasks))},
            "text": text, "vector": torch.tensor([t.vector for t in tasks], dtype=torch.float32)}
    data["val"] = val_windows(data, val_eps, int(meta["max_steps"]), context)
    return data, meta


def val_windows(data: dict, eps: torch.Tensor, T: int, K: int) -> dict:
    """Fixed validation windows: per held-back episode, 5 windows ending at 1, T/4, T/2, 3T/4, T
    (left-padded near the start), description template cycling with the window."""
    ends = torch.tensor(sorted({1, max(1, T // 4), max(1, T // 2), max(1, 3 * T // 4), T}))
    ep = eps.repeat_interleave(len(ends))
    end = ends.repeat(len(eps))
    idx = end[:, None] - K + torch.arange(K)[None]
    pad = idx < 0
    idx = idx.clamp_min(0)
    task = data["task"][ep]
    tmpl = torch.arange(len(ep)) % data["text"].shape[1]
    return {"obs": data["obs"][ep[:, None], idx], "act": data["act"][ep[:, None], idx],
            "rtg": data["rtg"][ep[:, None], idx], "tsteps": idx, "pad": pad,
            "cond": {"task": task, "vector": data["vector"][task], "text": data["text"][task, tmpl]}}


def build(arm: str, seed: int, meta: dict, cfg: Config) -> TGDT:
    torch.manual_seed(seed)
    return TGDT(arm=arm, obs_dim=meta["obs_dim"], act_dim=meta["act_dim"], n_tasks=len(meta["tasks"]),
                task_dim=len(meta["tasks"][0]["vector"]), vocab_size=len(meta["vocab"]), text_len=cfg.text_len,
                context=cfg.context, seg_len=cfg.seg_len, max_steps=meta["max_steps"], d_model=cfg.d_model,
                n_layers=cfg.n_layers, n_heads=cfg.n_heads, proj_dim=cfg.proj_dim, lr=cfg.lr,
                weight_decay=cfg.weight_decay, batch_size=cfg.batch_size, nce_weight=cfg.nce_weight,
                itm_weight=cfg.itm_weight, seed=seed)


def _stack(items: list):
    """Per-seed pytrees (dicts/tuples of tensors) -> one pytree of (S, ...) tensors."""
    first = items[0]
    if torch.is_tensor(first):
        return torch.stack(items)
    if isinstance(first, dict):
        return {k: _stack([it[k] for it in items]) for k in first}
    return type(first)(_stack(list(col)) for col in zip(*items))


class EnsembleTGDT(EnsembleModule):
    """The seeds of one arm as one vectorized ensemble (stages/common/ensemble.py). Member k is the
    solo ``TGDT`` of seed k: same init (``build``), same per-seed generator (seed + 12345) drawing the
    same windows / alignment pairs / Gumbel noise in the same order, same AdamW; its step losses are
    ``TGDT.step_losses`` under vmap. ``history[k]`` is member k's learning curve (solo format)."""

    def __init__(self, arm: str, seeds: list[int], meta: dict, cfg: "Config", data: dict):
        super().__init__(lambda s: build(arm, s, meta, cfg), seeds,
                         optimizer=lambda p: torch.optim.AdamW(p, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                                               foreach=True))
        self.arm, self.batch_size, self.context, self.seg_len = arm, cfg.batch_size, cfg.context, cfg.seg_len
        self.data = data
        self.history: list[list[dict]] = [[] for _ in seeds]
        self.kernel_calls = 0

    @property
    def template(self) -> TGDT:
        return self.ensemble._bound[0].model

    def on_fit_start(self):
        self.data = M.prepare_data(self.data, self.device)
        self.gens = [torch.Generator(device=self.device).manual_seed(int(s) + 12345) for s in self.ensemble.seeds]

    def draw(self, gen) -> dict:
        rtg, obs, act, tsteps, pad, cond = M.sample_windows(self.data, self.context, self.batch_size, gen)
        step = {"rtg": rtg, "obs": obs, "act": act, "tsteps": tsteps, "pad": pad, "cond": cond}
        if self.arm in M.ALIGN_ARMS:
            step["align"] = M.draw_alignment(self.data, self.seg_len, gen)
        return step

    def training_step(self, batch, batch_idx):
        step = _stack([self.draw(g) for g in self.gens])
        out = self.ensemble.vmap(lambda m, st: m.step_losses(st), step)          # {name: (S,)}
        if "nce" in out:
            self.kernel_calls += len(self.ensemble)
        self.last_losses = out["loss"].detach()
        if M.is_curve_step(batch_idx, self.trainer.max_steps):
            logs = {k: v.detach() for k, v in out.items() if k != "loss"}
            self.log_dict({f"{k}_mean": v.mean() for k, v in logs.items()}, prog_bar=True)
            val = self.val_mse()
            for k in range(len(self.ensemble)):
                self.history[k].append({"step": int(batch_idx), **{n: float(v[k]) for n, v in logs.items()},
                                        "val_mse": val[k]})
        return out["loss"].sum()          # the sum: member k's gradient is its solo gradient

    @torch.no_grad()
    def val_mse(self) -> list[float]:
        v = self.data.get("val")
        if v is None:
            return [float("nan")] * len(self.ensemble)
        return self.ensemble.vmap(lambda m, w: m.val_mse_tensor(w), v, shared=True).tolist()


def member_optimizer_state(opt: torch.optim.Optimizer, k: int | None) -> dict:
    """The AdamW state of ensemble member k as a solo model's optimizer state dict (parameters in the
    model's own order); k None: a solo optimizer's state as is."""
    sd = opt.state_dict()
    if k is None:
        return sd
    state = {i: {n: (v.clone() if n == "step" else v[k].clone()) for n, v in st.items()} for i, st in sd["state"].items()}
    return {"state": state, "param_groups": sd["param_groups"]}


def continue_curve(arm: str, seed: int, meta: dict, cfg: "Config", data: dict, state: dict, opt_state: dict,
                   gen_state: torch.Tensor, tcfg, tracker, backend: str) -> list[dict]:
    """Learning curve only: the trained model of ``seed`` (weights, AdamW state, sampler generator)
    trained on from step ``steps`` to ``curve_steps``, as one uninterrupted solo run would
    (tests/tgdt/test_speed.py); returns the curve points after ``steps``. The model kept for
    evaluation is the one after ``steps``."""
    model = build(arm, seed, meta, cfg)
    model.kernel_backend = backend
    model.attach(data)
    model.load_state_dict(state)
    model.resume = {"optimizer": opt_state, "gen": gen_state}
    model.step_offset = cfg.steps
    extra = cfg.curve_steps - cfg.steps
    trainer = make_trainer(tcfg, tracker, max_steps=extra)
    trainer.fit(model, torch.utils.data.DataLoader(range(extra), batch_size=None))
    return model.history


def kernel_parity(rec: KernelRecord, model: TGDT, data: dict, env: str, seed: int) -> None:
    """Triton vs torch InfoNCE on the trained model's real embeddings: every training task's first
    expert segment against its first-template description."""
    Lg = model.hparams.seg_len
    dev = model.device
    ep = torch.stack([data["expert_eps"][int(t)][0] for t in data["train_tasks"]]).to(dev)
    with torch.no_grad():
        z = model.traj_embedding(data["obs"].to(dev)[ep, :Lg], data["act"].to(dev)[ep, :Lg])
        t = model.text_embedding(data["text"].to(dev)[data["train_tasks"].to(dev), 0])
        s = model.logit_scale.exp().clamp(max=100.0)
    rec.parity("fused_infonce", fused_infonce, t, z, s,
               slice=f"{env}: {len(ep)} training-task (description, expert segment) pairs, trained TG-DT seed {seed}")


def run(cfg: Config, ctx) -> None:
    torch.set_num_threads(1)
    device = pick_device(cfg.device)
    rec = KernelRecord(device)
    prep = ctx.input("prepare")
    summary, nce_pairs, curves = {}, {}, {}
    for env in read_json(prep / "summary.json")["envs"]:
        data, meta = load_env(prep / env, cfg.text_len, cfg.context)
        T = meta["max_steps"]
        if cfg.seg_len > T:
            raise ValueError(f"seg_len: {cfg.seg_len} exceeds the {env} episode length {T}")
        nce_pairs[env] = len(data["train_tasks"])       # InfoNCE pairs per step: one per training task
        (ctx.out / env).mkdir(parents=True)
        order = [a for a in cfg.arms if a != "tgdt_share"] + [a for a in cfg.arms if a == "tgdt_share"]
        tcfg = cfg.trainer.model_copy(update={"accelerator": "gpu" if device.type == "cuda" else "cpu",
                                               "devices": 1, "enable_progress_bar": False})
        for arm in order:
            # oracle_id: the one-hot DT trained on every task's episodes (held-out tasks included)
            arm_data = {**data, "train_eps": data["all_eps"]} if arm == "oracle_id" else data
            if arm == "tgdt_share":       # solo, from the trained TG-DT of each seed, then share data
                models = []
                for seed in cfg.seeds:
                    model = build(arm, seed, meta, cfg)
                    model.kernel_backend = rec.backend
                    model.attach(arm_data)
                    ck = torch.load(ctx.out / env / f"tgdt_s{seed}.pt", weights_only=False)
                    model.load_state_dict(ck["state_dict"])
                    model.share_with(cfg.share_top_k)
                    trainer = make_trainer(tcfg, ctx.tracker, max_steps=cfg.share_steps)
                    trainer.fit(model, torch.utils.data.DataLoader(range(cfg.share_steps), batch_size=None))
                    models.append((seed, model, model.history, model.kernel_calls))
                steps = cfg.share_steps
            elif cfg.vectorize_seeds:     # every seed of the arm as one vectorized ensemble
                ens = EnsembleTGDT(arm, list(cfg.seeds), meta, cfg, arm_data)
                ens.template.kernel_backend = rec.backend
                trainer = make_trainer(tcfg, ctx.tracker, max_steps=cfg.steps)
                trainer.fit(ens, torch.utils.data.DataLoader(range(cfg.steps), batch_size=None))
                models = [(seed, ens.ensemble.member(k), ens.history[k], ens.kernel_calls // len(cfg.seeds))
                          for k, seed in enumerate(cfg.seeds)]
                if arm == "tgdt" and cfg.curve_steps > cfg.steps:
                    curves[f"{env}/{arm}/s{cfg.seeds[0]}"] = ens.history[0] + continue_curve(
                        arm, cfg.seeds[0], meta, cfg, arm_data, ens.ensemble.member_state_dict(0),
                        member_optimizer_state(trainer.optimizers[0], 0), ens.gens[0].get_state(), tcfg,
                        ctx.tracker, rec.backend)
                steps = cfg.steps
            else:                         # seed after seed
                models = []
                for seed in cfg.seeds:
                    model = build(arm, seed, meta, cfg)
                    model.kernel_backend = rec.backend
                    model.attach(arm_data)
                    trainer = make_trainer(tcfg, ctx.tracker, max_steps=cfg.steps)
                    trainer.fit(model, torch.utils.data.DataLoader(range(cfg.steps), batch_size=None))
                    models.append((seed, model, model.history, model.kernel_calls))
                    if arm == "tgdt" and seed == cfg.seeds[0] and cfg.curve_steps > cfg.steps:
                        curves[f"{env}/{arm}/s{seed}"] = model.history + continue_curve(
                            arm, seed, meta, cfg, arm_data, model.state_dict(),
                            member_optimizer_state(trainer.optimizers[0], None), model.gen.get_state(), tcfg,
                            ctx.tracker, rec.backend)
                steps = cfg.steps
            for seed, model, history, calls in models:
                rec.count("fused_infonce", calls) if calls else None
                if arm == "tgdt" and seed == cfg.seeds[0]:
                    kernel_parity(rec, model, data, env, seed)
                last = history[-1] if history else {}
                print(f"train@tgdt: {env} {arm} seed {seed}: {steps} steps; {last}")
                torch.save({"arm": arm, "seed": seed, "hparams": dict(model.hparams),
                            "state_dict": model.state_dict(), "history": history},
                           ctx.out / env / f"{arm}_s{seed}.pt")
                summary[f"{env}/{arm}/s{seed}"] = {**last, "history": history}
    rec.save(ctx.out)
    write_json(ctx.out / "train_summary.json", {"config": cfg.model_dump(mode="json"), "runs": summary,
                                                "nce_pairs": nce_pairs, "long_curves": curves})
    print(f"train@tgdt: CPU time {time.process_time():.1f} s")

