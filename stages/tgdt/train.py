"""train@tgdt: TG-DT and its baselines (no-info DT, one-hot id, TG-DT without alignment, oracle).

    python -m stages train tgdt [--profile smoke]

For every prepared environment, every arm of ``arms`` and every seed of ``seeds``, one ``TGDT``
LightningModule (stages/tgdt/model.py) is fitted by ``make_trainer`` for ``steps`` AdamW steps on
the training tasks only (held-out tasks' episodes are never read here). TG-DT's InfoNCE goes
through kernels/fused_infonce.py on every step (counted in ``kernels.json``, with Triton parity on
a slice of real embeddings). Weights go to ``<out>/<env>/<arm>_s<seed>.pt``.
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
from stages.common.device import DeviceName, pick_device
from stages.common.paths import read_json, write_json
from stages.common.trainer import TrainerConfig, make_trainer
from stages.tgdt import envs as E
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
    summary, nce_pairs = {}, {}
    for env in read_json(prep / "summary.json")["envs"]:
        data, meta = load_env(prep / env, cfg.text_len, cfg.context)
        T = meta["max_steps"]
        if cfg.seg_len > T:
            raise ValueError(f"seg_len: {cfg.seg_len} exceeds the {env} episode length {T}")
        nce_pairs[env] = len(data["train_tasks"])       # InfoNCE pairs per step: one per training task
        (ctx.out / env).mkdir(parents=True)
        order = [a for a in cfg.arms if a != "tgdt_share"] + [a for a in cfg.arms if a == "tgdt_share"]
        for arm in order:
            for seed in cfg.seeds:
                model = build(arm, seed, meta, cfg)
                model.kernel_backend = rec.backend
                # oracle_id: the one-hot DT trained on every task's episodes (held-out tasks included)
                model.attach({**data, "train_eps": data["all_eps"]} if arm == "oracle_id" else data)
                steps = cfg.steps
                if arm == "tgdt_share":       # start from the trained TG-DT of this seed, then share data
                    ck = torch.load(ctx.out / env / f"tgdt_s{seed}.pt", weights_only=False)
                    model.load_state_dict(ck["state_dict"])
                    model.share_with(cfg.share_top_k)
                    steps = cfg.share_steps
                tcfg = cfg.trainer.model_copy(update={"accelerator": "gpu" if device.type == "cuda" else "cpu",
                                                       "devices": 1, "enable_progress_bar": False})
                trainer = make_trainer(tcfg, ctx.tracker, max_steps=steps)
                loader = torch.utils.data.DataLoader(range(steps), batch_size=None)
                trainer.fit(model, loader)
                rec.count("fused_infonce", model.kernel_calls) if model.kernel_calls else None
                if arm == "tgdt" and seed == cfg.seeds[0]:
                    kernel_parity(rec, model, data, env, seed)
                last = model.history[-1] if model.history else {}
                print(f"train@tgdt: {env} {arm} seed {seed}: {steps} steps; {last}")
                torch.save({"arm": arm, "seed": seed, "hparams": dict(model.hparams),
                            "state_dict": model.state_dict(), "history": model.history},
                           ctx.out / env / f"{arm}_s{seed}.pt")
                summary[f"{env}/{arm}/s{seed}"] = {**last, "history": model.history}
    rec.save(ctx.out)
    write_json(ctx.out / "train_summary.json", {"config": cfg.model_dump(mode="json"), "runs": summary,
                                                "nce_pairs": nce_pairs})
    print(f"train@tgdt: CPU time {time.process_time():.1f} s")

