"""train: the teacher LM, then per seed × compression level the STAR-KV students and their baselines.

Arms: star_full (per-head K thresholds, three-phase schedule), star_jointk (K factorized jointly per
layer), star_nokd (thresholds under the e^{−α} pressure alone, no distillation or fine-tuning),
uniform_kd (uniform ranks matched to star_full's totals, same distillation steps), svd_uniform (the
same uniform ranks, plain SVD truncation).

    python -m stages train star_kv
"""
from __future__ import annotations

import copy
import logging
import math
import warnings
from typing import Literal

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, field_validator, model_validator
from torch.utils.data import DataLoader, Dataset

from stages.common.config import Fraction, Seed, Seeds, StageConfig, unique_items, TransformerShape
from stages.common.paths import write_json
from stages.common.runner import StageContext
from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig
from stages.common.trainer import TrainerConfig, make_trainer
from stages.star_kv.model import StarKVLM

Arm = Literal["star_full", "star_gatefuse", "star_jointk", "star_nokd", "uniform_kd", "svd_uniform"]


class ModelConfig(TransformerShape):
    seq_len: int = Field(64, ge=4, le=4096)


class Config(StageConfig):
    seeds: Seeds = Field(default_factory=lambda: [0, 1, 2], max_length=10)
    teacher_seed: Seed = 0
    targets: list[Fraction] = Field(default_factory=lambda: [0.4, 0.6, 0.75], min_length=1, max_length=6,
                                    description="KV compression targets C in (0, 1)")
    delta_k: float = Field(0.09, ge=0.0, le=0.5, description="K removes C + delta_k of its cache")
    delta_v: float = Field(0.11, ge=0.0, le=0.5, description="V removes C - delta_v of its cache")
    arms: list[Arm] = Field(default_factory=lambda: ["star_full", "star_gatefuse", "star_jointk", "star_nokd",
                                                     "uniform_kd", "svd_uniform"], min_length=1)
    model: ModelConfig = ModelConfig()
    teacher_steps: int = Field(600, ge=1, le=200_000)
    teacher_lr: float = Field(3e-3, gt=0, le=1)
    batch_size: int = Field(32, ge=1, le=4096)
    student_batch: int = Field(16, ge=1, le=4096)
    lr: float = Field(3e-4, gt=0, le=1, description="student weights (AdamW, wd 0.01)")
    alpha_lr: float = Field(2e-2, gt=0, le=10)
    pressure: float = Field(0.1, ge=0, le=100, description="λ in λ Σ e^{−α}")
    sharpness: float = Field(50.0, gt=0, le=1e4, description="s of the soft threshold (σ in model units)")
    alpha_steps: int = Field(150, ge=1, le=100_000, description="phase-1 cap")
    phase2_steps: int = Field(60, ge=0, le=100_000)
    phase3_steps: int = Field(30, ge=0, le=100_000)
    torch_threads: int = Field(1, ge=1, le=64)
    trainer: TrainerConfig = TrainerConfig(enable_progress_bar=False)

    @field_validator("seeds", "targets", "arms")
    @classmethod
    def _distinct(cls, v, info):
        return unique_items(v, info.field_name)

    @model_validator(mode="after")
    def _budgets(self):
        for c in self.targets:
            if not 0 < c + self.delta_k < 1 or not 0 < c - self.delta_v < 1:
                raise ValueError(f"targets: {c} with delta_k={self.delta_k}, delta_v={self.delta_v} puts a group "
                                 "budget outside (0, 1)")
        if {"uniform_kd", "svd_uniform", "star_gatefuse"} & set(self.arms) and "star_full" not in self.arms:
            raise ValueError("arms: uniform arms match star_full's ranks and star_gatefuse branches from it; "
                             "include star_full")
        return self


def model_config(m: ModelConfig) -> TinyTransformerConfig:
    return TinyTransformerConfig(vocab_size=256, d_model=m.d_model, n_layers=m.n_layers, n_heads=m.n_heads,
                                 max_seq_len=m.seq_len, causal=True, positional="rope", norm="rmsnorm",
                                 mlp="swiglu", tie_embeddings=False)


class Windows(Dataset):
    def __init__(self, corpus: torch.Tensor, batch: int, T: int, steps: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.corpus, self.T = corpus, T
        self.off = torch.randint(0, corpus.numel() - T - 1, (steps, batch), generator=g)

    def __len__(self):
        return self.off.shape[0]

    def __getitem__(self, i):
        return self.corpus[self.off[i][:, None] + torch.arange(self.T + 1)].long()


class TeacherLM(L.LightningModule):
    def __init__(self, cfg: TinyTransformerConfig, lr: float, steps: int):
        super().__init__()
        self.model, self.lr, self.steps = TinyTransformer(cfg), lr, steps

    def training_step(self, batch, _):
        logits = self.model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        self.log("teacher/loss", loss)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.model.parameters(), lr=self.lr, weight_decay=0.1)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, self.lr, total_steps=self.steps, pct_start=0.1)
        return [opt], [{"scheduler": sched, "interval": "step"}]


def kd_loss(student_logits, teacher_logits):
    """ALGO: KL(teacher ‖ student), batchmean over tokens, T = 1."""
    V = student_logits.shape[-1]
    return F.kl_div(F.log_softmax(student_logits.reshape(-1, V), -1), F.log_softmax(teacher_logits.reshape(-1, V), -1),
                    log_target=True, reduction="batchmean")


class StudentKD(L.LightningModule):
    """One phase of the schedule. phase 1: KD + λΣe^{−α}, α frozen per group (K, V) once its rank budget is
    met; phase 2: KD only (fresh AdamW); phase 3: after Σ fusion, KD at constant lr."""

    def __init__(self, student: StarKVLM, teacher: TinyTransformer, phase: int, lr: float, alpha_lr: float,
                 pressure: float, budget_k: int, budget_v: int, use_kd: bool = True):
        super().__init__()
        self.student, self.teacher = student, teacher
        self.teacher.requires_grad_(False)
        self.phase, self.lr, self.alpha_lr, self.pressure = phase, lr, alpha_lr, pressure
        self.budget_k, self.budget_v, self.use_kd = budget_k, budget_v, use_kd
        self.steps_done = 0

    def frozen(self, kind: str) -> bool:
        return not self.student.alphas(kind)[0].requires_grad

    def training_step(self, batch, _):
        x = batch[:, :-1]
        loss = torch.zeros((), device=x.device)
        if self.use_kd:
            with torch.no_grad():
                t = self.teacher(x)
            loss = kd_loss(self.student(x), t)
            self.log(f"phase{self.phase}/kd", loss)
        if self.phase == 1:
            for kind in ("k", "v"):
                if not self.frozen(kind):  # ALGO: pressure toward higher thresholds, λ Σ e^{−α}
                    loss = loss + self.pressure * sum(torch.exp(-a).sum() for a in self.student.alphas(kind))
        return loss

    def on_train_batch_end(self, *_):
        self.steps_done += 1
        if self.phase != 1:
            return
        rk, rv = self.student.rank_totals()
        for kind, r, b in (("k", rk, self.budget_k), ("v", rv, self.budget_v)):
            if r <= b and not self.frozen(kind):  # ALGO: global per-type freeze once the budget is met
                for a in self.student.alphas(kind):
                    a.requires_grad_(False)
        if self.frozen("k") and self.frozen("v"):
            self.trainer.should_stop = True

    def configure_optimizers(self):
        alphas = {id(a) for kind in ("k", "v") for a in self.student.alphas(kind)}
        weights = [p for p in self.student.parameters() if id(p) not in alphas and p.requires_grad]
        groups = [{"params": weights, "lr": self.lr, "weight_decay": 0.01}] if self.use_kd else []
        if self.phase == 1:
            groups.append({"params": [a for kind in ("k", "v") for a in self.student.alphas(kind)],
                           "lr": self.alpha_lr, "weight_decay": 0.0})
        return torch.optim.AdamW(groups)


def budgets(model: StarKVLM, c: float, cfg: Config) -> tuple[int, int]:
    """Rank budgets (cache entries per token, all layers) for K and V at target C."""
    m = cfg.model
    full_k = m.n_layers * m.d_model  # per-head: H heads × D ranks; joint: C ranks (same count)
    full_v = m.n_layers * m.d_model
    return math.floor((1 - (c + cfg.delta_k)) * full_k), math.floor((1 - (c - cfg.delta_v)) * full_v)


def fit(module, cfg: Config, data, steps: int, device):
    if steps <= 0:
        return 0
    trainer = make_trainer(cfg.trainer, None, max_steps=steps)
    trainer.fit(module, DataLoader(data, batch_size=None, shuffle=False))
    return module.steps_done


def uniform_ranks(total: int, n: int, cap: int) -> list[int]:
    """`total` ranks spread as evenly as possible over n groups (the first ones get the remainder)."""
    base, rem = divmod(min(total, n * cap), n)
    return [min(cap, base + (i < rem)) for i in range(n)]


def nokd_thresholds(model: StarKVLM, bk: int, bv: int) -> None:
    """Pressure alone moves every α of a type identically (same init, same e^{−α} gradient, Adam): the
    result is one common threshold per type, raised until the budget is met."""
    for kind, budget in (("k", bk), ("v", bv)):
        sig = torch.cat([(a.sk / a.scale_k if kind == "k" else a.sv / a.scale_v).detach().reshape(-1)
                         for a in model.attn])
        s = torch.sort(sig, descending=True).values
        thr = float(s[budget]) if budget < s.numel() else 0.0  # keep exactly the `budget` largest
        for a in model.alphas(kind):
            a.data.fill_(thr)


def run(cfg: Config, ctx: StageContext) -> None:
    torch.set_num_threads(cfg.torch_threads)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    train = torch.from_numpy(np.load(ctx.input("prepare") / "train.npy"))
    mcfg = model_config(cfg.model)
    T = cfg.model.seq_len
    torch.manual_seed(cfg.teacher_seed)
    tmod = TeacherLM(mcfg, cfg.teacher_lr, cfg.teacher_steps)
    tmod.steps_done = 0
    make_trainer(cfg.trainer, ctx.tracker, max_steps=cfg.teacher_steps).fit(
        tmod, DataLoader(Windows(train, cfg.batch_size, T, cfg.teacher_steps, cfg.teacher_seed), batch_size=None))
    teacher = tmod.model.eval()
    out = {"teacher": teacher.state_dict(), "students": {}}
    runs = []
    for seed in cfg.seeds:
        for c in cfg.targets:
            key = f"s{seed}_c{round(c * 100)}"
            data = Windows(train, cfg.student_batch, T, cfg.alpha_steps + cfg.phase2_steps + cfg.phase3_steps,
                           10_000 + seed)
            done: dict[str, StarKVLM] = {}
            info: dict[str, dict] = {}
            for arm in [a for a in ("star_full", "star_jointk", "star_nokd") if a in cfg.arms]:
                torch.manual_seed(seed)
                student = StarKVLM(teacher, "joint" if arm == "star_jointk" else "head")
                for a in student.attn:
                    a.s = cfg.sharpness
                bk, bv = budgets(student, c, cfg)
                steps = [0, 0, 0]
                if arm == "star_nokd":
                    nokd_thresholds(student, bk, bv)
                else:
                    p1 = StudentKD(student, teacher, 1, cfg.lr, cfg.alpha_lr, cfg.pressure, bk, bv)
                    steps[0] = fit(p1, cfg, data, cfg.alpha_steps, None)
                    for kind in ("k", "v"):  # phase 2 starts with every α frozen (met or capped)
                        for al in student.alphas(kind):
                            al.requires_grad_(False)
                    steps[1] = fit(StudentKD(student, teacher, 2, cfg.lr, 0, 0, bk, bv), cfg, data,
                                   cfg.phase2_steps, None)
                if arm == "star_full" and "star_gatefuse" in cfg.arms:  # same phases 1-2, other fusion
                    branch = copy.deepcopy(student)
                    for a in branch.attn:
                        a.fuse(gate=True)
                    s3 = fit(StudentKD(branch, teacher, 3, cfg.lr, 0, 0, bk, bv), cfg, data, cfg.phase3_steps, None)
                    done["star_gatefuse"] = branch
                    info["star_gatefuse"] = {"budget_k": bk, "budget_v": bv, "steps": [steps[0], steps[1], s3]}
                for a in student.attn:
                    a.fuse()  # ALGO: Σ fusion, export to per-head ranks (count of σ > α)
                if arm != "star_nokd":
                    steps[2] = fit(StudentKD(student, teacher, 3, cfg.lr, 0, 0, bk, bv), cfg, data,
                                   cfg.phase3_steps, None)
                done[arm] = student
                info[arm] = {"budget_k": bk, "budget_v": bv, "steps": steps}
            if "star_full" in done:
                ref = done["star_full"]
                H, D, Lyr = cfg.model.n_heads, cfg.model.d_model // cfg.model.n_heads, cfg.model.n_layers
                rk_tot, rv_tot = ref.rank_totals()
                rk_heads = uniform_ranks(rk_tot, Lyr * H, D)
                rv_layers = uniform_ranks(rv_tot, Lyr, cfg.model.d_model)
                for arm in [a for a in ("uniform_kd", "svd_uniform") if a in cfg.arms]:
                    torch.manual_seed(seed)
                    student = StarKVLM(teacher, "head")
                    for i, a in enumerate(student.attn):  # plain SVD truncation at uniform ranks
                        a.fuse(ranks_k=rk_heads[i * H:(i + 1) * H], rank_v=rv_layers[i], use_alpha=False)
                    steps = [0, 0, 0]
                    if arm == "uniform_kd":  # the same number of distillation steps star_full took
                        n = sum(info["star_full"]["steps"])
                        steps[2] = fit(StudentKD(student, teacher, 3, cfg.lr, 0, 0, 0, 0), cfg, data, n, None)
                    done[arm] = student
                    info[arm] = {"budget_k": rk_tot, "budget_v": rv_tot, "steps": steps}
            for arm, student in done.items():
                ranks = [a.ranks() for a in student.attn]
                out["students"][f"{key}_{arm}"] = {k: v.detach().cpu() for k, v in student.state_dict().items()}
                runs.append({"key": key, "seed": seed, "target": c, "arm": arm, "k_mode": student.k_mode,
                             "ranks_k": [r[0] for r in ranks], "ranks_v": [r[1] for r in ranks], **info[arm]})
                if ctx.tracker is not None:
                    ctx.tracker.log({f"{key}/{arm}/rank_total": sum(student.rank_totals())})
    torch.save(out, ctx.out / "models.pt")
    write_json(ctx.out / "runs.json", {"model": mcfg.__dict__, "runs": runs, "seeds": list(cfg.seeds),
                                       "targets": list(cfg.targets)})
