"""train: the teacher LM, then per seed every STAR-KV student and baseline, trained in lockstep.

Arms (per seed × compression target C; every KD arm takes the SAME number of KD steps):
  star_full      per-KV-head K thresholds and a joint V threshold, learned (phase 1: KD + λΣe^{−α} until each
                 type meets its budget, then frozen), KD (phase 2 fills phases 1+2 up to kd_steps), official
                 export V←V·(σ−α)₊ (fusion), KD (phase 3, phase3_steps)
  star_gatefuse  star_full's phases 1-2, fused with the gate value f(σ) (≈σ above α) instead of σ−α, phase 3
  star_jointk    star_full with one joint SVD of k_proj per layer (a layer-level K threshold)
  star_global    the control: one global σ̂ threshold per type (nothing learned) at star_full's rank totals,
                 same KD steps, same fusion, same phase 3
  uniform_kd     uniform ranks at star_full's rank totals, plain SVD truncation, KD for the same total steps
  svd_uniform    the same uniform ranks, plain SVD truncation, no training
  star_nokd      thresholds under the pressure alone (= one global threshold per type at the budget, computed
                 directly), official export, no training

Pass A (per seed) trains star_full / star_gatefuse / star_jointk; pass B trains star_global / uniform_kd, which
need star_full's final rank totals. Both passes see the same batches (one generator per seed) and share one
teacher forward per step among their members. The pipeline records every KD arm's held-out PPL along the way
(curve), and before fusion, right after it and after phase 3.

    python -m stages train star_kv
"""
from __future__ import annotations

import copy
import logging
import math
import warnings
from dataclasses import dataclass, field
from typing import Literal

import lightning as L
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from pydantic import Field, field_validator, model_validator
from torch.utils.data import DataLoader, Dataset

from stages.common.config import ConfigError, Fraction, Seed, Seeds, StageConfig, unique_items
from stages.common.jobs import payload, run_jobs
from stages.common.paths import write_json
from stages.common.runner import StageContext
from stages.common.sources import SourceConfig
from stages.common.trainer import TrainerConfig, make_trainer
from stages.star_kv.model import StarKVLM, llama_backbone

Arm = Literal["star_full", "star_gatefuse", "star_jointk", "star_global", "star_nokd", "uniform_kd", "svd_uniform"]
PASS_A = ("star_full", "star_jointk")            # trained first (star_gatefuse branches from star_full)
PASS_B = ("star_global", "uniform_kd")           # need star_full's rank totals
KD_ARMS = ("star_full", "star_gatefuse", "star_jointk", "star_global", "uniform_kd")


class ModelConfig(StageConfig):
    """The toy teacher: a Llama-style decoder (RMSNorm, SwiGLU, RoPE, GQA) built by stages.common.hf."""
    d_model: int = Field(64, ge=8, le=4096)
    n_layers: int = Field(3, ge=1, le=64)
    n_heads: int = Field(4, ge=1, le=64)
    n_kv_heads: int = Field(2, ge=1, le=64)
    d_ff: int = Field(176, ge=4, le=65536)
    seq_len: int = Field(64, ge=4, le=8192)

    @model_validator(mode="after")
    def _heads(self):
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError(f"n_heads: {self.n_heads} must divide d_model {self.d_model} into even head dims")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_kv_heads: {self.n_kv_heads} does not divide n_heads {self.n_heads}")
        return self


class Config(StageConfig):
    source: SourceConfig = Field(default_factory=SourceConfig,
                                 description="toy: train the tiny teacher here; hf/file: a pretrained Llama-family "
                                             "teacher (full profile only)")
    seeds: Seeds = Field(default_factory=lambda: [0, 1, 2, 3, 4], max_length=10)
    teacher_seed: Seed = 0
    targets: list[Fraction] = Field(default_factory=lambda: [0.4, 0.6, 0.75], min_length=1, max_length=6,
                                    description="KV compression targets C in (0, 1)")
    delta_k: float = Field(0.09, ge=0.0, le=0.5, description="K removes C + delta_k of its cache")
    delta_v: float = Field(0.11, ge=0.0, le=0.5, description="V removes C - delta_v of its cache")
    arms: list[Arm] = Field(default_factory=lambda: list(Arm.__args__), min_length=1)
    main_targets: list[Fraction] | None = Field(None, description="targets where every arm and seed runs "
                                                                   "(default: all targets)")
    side_arms: list[Arm] = Field(default_factory=lambda: list(Arm.__args__),
                                 description="arms run at the other targets")
    side_seeds: Seeds | None = Field(None, description="seeds run at the other targets (default: all seeds)")
    model: ModelConfig = ModelConfig()
    teacher_steps: int = Field(600, ge=1, le=500_000)
    teacher_batch: int = Field(32, ge=1, le=4096)
    teacher_lr: float = Field(3e-3, gt=0, le=1)
    student_batch: int = Field(16, ge=1, le=4096)
    lr: float = Field(1e-3, gt=0, le=1, description="student weights (AdamW, wd 0.01), every phase and arm")
    alpha_lr: float = Field(1e-2, gt=0, le=10, description="thresholds α (official 1e-2)")
    pressure: float = Field(0.1, ge=0, le=100, description="λ in λ Σ e^{−α}")
    sharpness: float = Field(50.0, gt=0, le=1e4, description="s of the soft threshold (σ in model units)")
    alpha_steps: int = Field(100, ge=1, le=100_000, description="phase-1 cap (≤ kd_steps)")
    kd_steps: int = Field(100, ge=1, le=1_000_000, description="KD steps before fusion (phases 1+2), every arm")
    phase3_steps: int = Field(150, ge=0, le=1_000_000, description="KD steps after fusion, every arm")
    curve_every: int = Field(25, ge=1, le=100_000, description="held-out PPL every this many steps")
    curve_windows: int = Field(16, ge=1, le=10_000, description="held-out windows of the training curve")
    eval_windows: int = Field(128, ge=1, le=100_000, description="held-out windows of the before/after-fusion PPL "
                                                                 "(the evaluate stage uses the same windows)")
    torch_threads: int = Field(1, ge=1, le=64, description="intra-op threads of the teacher's training (the seeds' "
                                                            "pool processes run one each)")
    workers: int = Field(1, ge=1, le=64, description="processes for the seeds' runs (stages.common.jobs; 1 = this "
                                                     "process, with one intra-op thread)")
    trainer: TrainerConfig = TrainerConfig(enable_progress_bar=False)

    @field_validator("seeds", "targets", "arms")
    @classmethod
    def _distinct(cls, v, info):
        return unique_items(v, info.field_name)

    @model_validator(mode="after")
    def _rules(self):
        for c in self.targets:
            if not 0 < c + self.delta_k < 1 or not 0 < c - self.delta_v < 1:
                raise ValueError(f"targets: {c} with delta_k={self.delta_k}, delta_v={self.delta_v} puts a group "
                                 "budget outside (0, 1)")
        need_full = {"uniform_kd", "svd_uniform", "star_gatefuse", "star_global"} & set(self.arms)
        if need_full and "star_full" not in self.arms:
            raise ValueError(f"arms: {sorted(need_full)[0]} matches star_full's ranks (or branches from it); "
                             "include star_full")
        if self.main_targets is not None and not set(self.main_targets) <= set(self.targets):
            raise ValueError(f"main_targets: {self.main_targets} is not a subset of targets {self.targets}")
        if self.side_seeds is not None and not set(self.side_seeds) <= set(self.seeds):
            raise ValueError(f"side_seeds: {self.side_seeds} is not a subset of seeds {self.seeds}")
        if "star_full" not in self.side_arms and set(self.side_arms) & set(self.arms) - {"star_full"}:
            raise ValueError("side_arms: the other arms match star_full's ranks; include star_full")
        if self.alpha_steps > self.kd_steps:
            raise ValueError(f"alpha_steps: {self.alpha_steps} exceeds kd_steps {self.kd_steps} (phase 1 is part of "
                             "the KD steps before fusion)")
        if self.workers > 1 and self.source.kind != "toy":
            raise ValueError(f"workers: {self.workers} would copy the pretrained teacher ({self.source.kind} source) "
                             "into every pool process; use workers: 1")
        return self

    def runs_at(self, arm: str, c: float, seed: int | None = None) -> bool:
        """Whether `arm` runs at target c (for `seed`): everywhere at the main targets; elsewhere only the side
        arms and side seeds."""
        if arm not in self.arms:
            return False
        if self.main_targets is None or c in self.main_targets:
            return True
        return arm in self.side_arms and (seed is None or self.side_seeds is None or seed in self.side_seeds)


def tiny_config(m: ModelConfig):
    from stages.common.hf import TinyLMConfig

    return TinyLMConfig(arch="llama", d_model=m.d_model, n_layers=m.n_layers, n_heads=m.n_heads,
                        n_kv_heads=m.n_kv_heads, d_ff=m.d_ff, max_positions=max(m.seq_len, 8))


def eval_windows(val: torch.Tensor, T: int, n: int, key: str = "papers.star_kv") -> torch.Tensor:
    """The first n disjoint windows of T+1 held-out tokens (inputs and next-token targets): (n, T+1)."""
    have = (val.numel() - 1) // T
    if have < n:
        raise ConfigError(f"{key}.eval_windows: {n} windows of {T} tokens need {n * T + 1} held-out tokens; "
                          f"prepare wrote {val.numel()}")
    return torch.stack([val[i * T: i * T + T + 1] for i in range(n)]).long()


class Windows(Dataset):
    """`steps` batches of random training windows (T+1 tokens), fixed by `seed`."""

    def __init__(self, corpus: torch.Tensor, batch: int, T: int, steps: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.corpus, self.T = corpus, T
        self.off = torch.randint(0, corpus.numel() - T - 1, (steps, batch), generator=g)

    def __len__(self):
        return self.off.shape[0]

    def __getitem__(self, i):
        return self.corpus[self.off[i][:, None] + torch.arange(self.T + 1)].long()


def lm_logits(model, x):
    out = model(x)
    return out.logits if hasattr(out, "logits") else out


class TeacherLM(L.LightningModule):
    def __init__(self, model, lr: float, steps: int):
        super().__init__()
        self.model, self.lr, self.steps = model, lr, steps

    def training_step(self, batch, _):
        logits = lm_logits(self.model, batch[:, :-1])
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
    return F.kl_div(F.log_softmax(student_logits.reshape(-1, V).float(), -1),
                    F.log_softmax(teacher_logits.reshape(-1, V).float(), -1), log_target=True, reduction="batchmean")


@torch.no_grad()
def heldout_nll(model, windows: torch.Tensor, batch: int = 64) -> float:
    """Mean next-token NLL (nats) of `model` over `windows` (dense forward)."""
    tot, n = 0.0, 0
    for i in range(0, windows.shape[0], batch):
        w = windows[i:i + batch]
        logits = lm_logits(model, w[:, :-1])
        tot += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), w[:, 1:].reshape(-1),
                                     reduction="sum"))
        n += w[:, 1:].numel()
    return tot / n


# ----------------------------------------------------------------------------- thresholds and ranks
def budgets(bb, c: float, cfg: Config) -> tuple[int, int]:
    """Rank budgets (cache entries per token, all layers) for K and V at target C (K removes C + δ_k of its
    cache, V removes C − δ_v; per-head and joint K have the same number of entries)."""
    full = bb.n_layers * bb.kv_dim
    return math.floor((1 - (c + cfg.delta_k)) * full), math.floor((1 - (c - cfg.delta_v)) * full)


def sigma_hat(model: StarKVLM, kind: str) -> list[torch.Tensor]:
    """σ̂ = σ / scale per layer: (Hk', R) for K, (R,) for V."""
    return [(a.sk / a.scale_k if kind == "k" else a.sv / a.scale_v).detach() for a in model.attn]


def global_threshold(model: StarKVLM, kind: str, total: int) -> float:
    """The one σ̂ threshold over every layer (and head) of a type that keeps exactly the `total` largest σ̂
    (count σ̂ > thr): the (total+1)-th largest value, or 0 when all are kept."""
    s = torch.sort(torch.cat([x.reshape(-1) for x in sigma_hat(model, kind)]), descending=True).values
    if total >= s.numel():
        return 0.0
    return float(s[total])


def set_global_thresholds(model: StarKVLM, total_k: int, total_v: int) -> None:
    for kind, total in (("k", total_k), ("v", total_v)):
        thr = global_threshold(model, kind, total)
        for a in model.alphas(kind):
            a.data.fill_(thr)


def global_allocation(model: StarKVLM, total_k: int, total_v: int) -> tuple[list[list[int]], list[int]]:
    """Ranks a single global σ̂ threshold per type would give this model at the same totals."""
    tk, tv = global_threshold(model, "k", total_k), global_threshold(model, "v", total_v)
    return ([[int(r) for r in (x > tk).sum(-1)] for x in sigma_hat(model, "k")],
            [int((x > tv).sum()) for x in sigma_hat(model, "v")])


def allocation_distance(ranks_k, ranks_v, other_k, other_v) -> dict[str, float]:
    """Rank units moved between two allocations with equal totals (half the L1 distance), per type."""
    mk = sum(abs(a - b) for x, y in zip(ranks_k, other_k) for a, b in zip(x, y)) / 2
    mv = sum(abs(a - b) for a, b in zip(ranks_v, other_v)) / 2
    tk, tv = sum(map(sum, ranks_k)), sum(ranks_v)
    return {"moved_k": mk, "moved_v": mv, "moved_frac": (mk + mv) / max(tk + tv, 1)}


def uniform_ranks(total: int, n: int, cap: int) -> list[int]:
    """`total` ranks spread as evenly as possible over n groups (the first ones get the remainder)."""
    base, rem = divmod(min(total, n * cap), n)
    return [min(cap, base + (i < rem)) for i in range(n)]


def fuse_uniform(model: StarKVLM, total_k: int, total_v: int) -> None:
    bb = model.bb
    rk = uniform_ranks(total_k, bb.n_layers * bb.n_kv_heads, bb.head_dim)
    rv = uniform_ranks(total_v, bb.n_layers, bb.kv_dim)
    H = bb.n_kv_heads
    for i, a in enumerate(model.attn):  # plain SVD truncation at uniform ranks
        a.fuse(ranks_k=rk[i * H:(i + 1) * H], rank_v=rv[i], use_alpha=False)


# ----------------------------------------------------------------------------- one student's schedule
@dataclass
class Member:
    arm: str
    target: float
    model: StarKVLM
    phase: int                      # 1 learn α (+KD), 2 KD, 3 KD after fusion; 0 = not training
    budget_k: int = 0
    budget_v: int = 0
    steps: list[int] = field(default_factory=lambda: [0, 0, 0])
    curve: list[tuple[int, float]] = field(default_factory=list)
    info: dict = field(default_factory=dict)
    opt: torch.optim.Optimizer | None = None

    def frozen(self, kind: str) -> bool:
        return not self.model.alphas(kind)[0].requires_grad

    def new_optimizer(self, cfg: Config) -> None:
        alphas = {id(a) for kind in ("k", "v") for a in self.model.alphas(kind)}
        weights = [p for p in self.model.parameters() if id(p) not in alphas and p.requires_grad]
        groups = [{"params": weights, "lr": cfg.lr, "weight_decay": 0.01}]
        if self.phase == 1:
            groups.append({"params": [a for kind in ("k", "v") for a in self.model.alphas(kind)],
                           "lr": cfg.alpha_lr, "weight_decay": 0.0})
        self.opt = torch.optim.AdamW(groups)

    def loss(self, x, t_logits, cfg: Config):
        loss = kd_loss(self.model(x), t_logits)
        if self.phase == 1:
            for kind in ("k", "v"):
                if not self.frozen(kind):  # ALGO: pressure toward higher thresholds, λ Σ e^{−α}
                    loss = loss + cfg.pressure * sum(torch.exp(-a).sum() for a in self.model.alphas(kind))
        return loss

    def after_step(self, cfg: Config) -> None:
        self.steps[self.phase - 1] += 1
        if self.phase != 1:
            return
        rk, rv = self.model.rank_totals()
        for kind, r, b in (("k", rk, self.budget_k), ("v", rv, self.budget_v)):
            if r <= b and not self.frozen(kind):  # ALGO: global per-type freeze once the budget is met
                for a in self.model.alphas(kind):
                    a.requires_grad_(False)
                    a.grad = None
        if (self.frozen("k") and self.frozen("v")) or self.steps[0] >= cfg.alpha_steps:
            for kind in ("k", "v"):  # phase 2 starts with every α frozen (met or capped); fresh AdamW
                for a in self.model.alphas(kind):
                    a.requires_grad_(False)
                    a.grad = None
            self.info["budget_met"] = bool(rk <= self.budget_k and rv <= self.budget_v)
            self.phase = 2
            self.new_optimizer(cfg)


class Cohort(L.LightningModule):
    """Every member of one pass: one teacher forward per batch, each member's own loss and optimizer (manual
    optimization; the members share no parameters, so one backward of the summed losses gives each member
    exactly its own gradients). At step kd_steps the members are fused (see fuse_members)."""

    def __init__(self, teacher, members: list[Member], cfg: Config, curve: torch.Tensor, full_eval: torch.Tensor,
                 totals: dict[float, tuple[int, int]], seed: int):
        super().__init__()
        self.seed = seed
        self.automatic_optimization = False
        self.teacher = teacher
        self.nets = nn.ModuleList(m.model for m in members)
        self.members, self.cfg, self.totals = members, cfg, totals
        self.register_buffer("curve_w", curve, persistent=False)
        self.register_buffer("eval_w", full_eval, persistent=False)
        self.step_no = 0

    def configure_optimizers(self):
        return None

    def on_train_start(self):
        for m in self.members:
            if m.phase:
                m.new_optimizer(self.cfg)
            self.record(m)

    def record(self, m: Member) -> None:
        m.curve.append((self.step_no, math.exp(heldout_nll(m.model, self.curve_w))))

    def training_step(self, batch, _):
        x = batch[:, :-1]
        with torch.no_grad():
            t = lm_logits(self.teacher, x)
        live = [m for m in self.members if m.phase]
        losses = [m.loss(x, t, self.cfg) for m in live]
        for m in live:
            m.opt.zero_grad(set_to_none=True)
        self.manual_backward(torch.stack(losses).sum())
        for m in live:
            m.opt.step()
            m.after_step(self.cfg)
        self.step_no += 1
        if self.step_no == self.cfg.kd_steps:
            self.fuse_members()  # records the points just before (info) and just after fusion (curve)
        elif self.step_no % self.cfg.curve_every == 0:
            for m in self.members:
                if m.phase:
                    self.record(m)

    def on_train_end(self):
        for m in self.members:
            if m.phase and (not m.curve or m.curve[-1][0] != self.step_no):
                self.record(m)
            m.info["nll_after_phase3"] = heldout_nll(m.model, self.eval_w)
            m.opt = None

    def fuse_members(self) -> None:
        """ALGO: Σ fusion after phases 1-2 (kd_steps): PPL before and right after fusion on the held-out
        windows; star_gatefuse branches from star_full here; star_global is re-thresholded on its current σ̂ to
        star_full's final totals (equal bytes); then every member continues with a fresh AdamW (phase 3)."""
        added = []
        for m in list(self.members):
            if m.arm == "uniform_kd":  # fused from the start: only the phase-3 optimizer reset
                m.info["nll_before_fusion"] = m.info["nll_after_fusion"] = heldout_nll(m.model, self.eval_w)
                m.info["curve_before_fusion"] = math.exp(heldout_nll(m.model, self.curve_w))
                m.phase = 3
                m.new_optimizer(self.cfg)
                continue
            m.info["nll_before_fusion"] = heldout_nll(m.model, self.eval_w)
            m.info["curve_before_fusion"] = math.exp(heldout_nll(m.model, self.curve_w))
            if m.arm == "star_global":
                set_global_thresholds(m.model, *self.totals[m.target])
            rk, rv = zip(*(a.ranks() for a in m.model.attn))
            m.info["ranks_at_fusion"] = {"k": [list(r) for r in rk], "v": list(rv)}
            if m.arm == "star_full":
                gk, gv = global_allocation(m.model, sum(map(sum, rk)), sum(rv))
                m.info["global_alloc"] = {"k": gk, "v": gv}
                m.info["alloc_distance"] = allocation_distance(rk, rv, gk, gv)
                m.info["alphas"] = {"k": [[float(x) for x in a.alpha_k.reshape(-1)] for a in m.model.attn],
                                    "v": [float(a.alpha_v) for a in m.model.attn]}
                if self.cfg.runs_at("star_gatefuse", m.target, self.seed):
                    branch = copy.deepcopy(m.model)
                    for a in branch.attn:
                        a.fuse(gate=True)
                    g = Member("star_gatefuse", m.target, branch, 3, m.budget_k, m.budget_v, list(m.steps),
                               list(m.curve), {k: v for k, v in m.info.items()
                                               if k in ("budget_met", "nll_before_fusion", "curve_before_fusion",
                                                        "ranks_at_fusion")})
                    g.info["nll_after_fusion"] = heldout_nll(branch, self.eval_w)
                    g.new_optimizer(self.cfg)
                    added.append(g)
            for a in m.model.attn:
                a.fuse()  # ALGO: official export V ← V·(σ−α)₊, rank = count of σ̂ > α
            m.info["nll_after_fusion"] = heldout_nll(m.model, self.eval_w)
            m.phase = 3
            m.new_optimizer(self.cfg)
        for g in added:
            self.members.append(g)
            self.nets.append(g.model)
        for m in self.members:
            self.record(m)


def run_cohort(teacher, members: list[Member], cfg: Config, data: Windows, curve, full_eval, totals, steps: int,
               seed: int):
    cohort = Cohort(teacher, members, cfg, curve, full_eval, totals, seed)
    if steps > 0 and any(m.phase for m in members):
        # one epoch over exactly `steps` batches (manual optimization with the members' own optimizers does not
        # advance Lightning's global_step, so max_steps cannot end the fit)
        trainer = make_trainer(cfg.trainer, None, max_steps=-1, max_epochs=1)
        trainer.fit(cohort, DataLoader(data, batch_size=None, shuffle=False))
        if cohort.step_no != steps:
            raise RuntimeError(f"train@star_kv: the cohort ran {cohort.step_no} steps, expected {steps}")
    return cohort.members


# ----------------------------------------------------------------------------- the stage
def build_teacher(cfg: Config, train: torch.Tensor, vocab: int, tracker):
    """toy: a tiny random Llama (GQA) trained here on the byte corpus; hf/file: the pretrained model."""
    if cfg.source.kind != "toy":
        from stages.common.hf import pretrained_causal_lm

        model = pretrained_causal_lm(cfg.source, key="papers.star_kv.train.source").float()
        return model, {"kind": cfg.source.kind, "source": cfg.source.model_dump(mode="json")}
    from stages.common.hf import tiny_causal_lm

    tcfg = tiny_config(cfg.model)
    model = tiny_causal_lm(tcfg, vocab, seed=cfg.teacher_seed).train()
    tmod = TeacherLM(model, cfg.teacher_lr, cfg.teacher_steps)
    make_trainer(cfg.trainer, tracker, max_steps=cfg.teacher_steps).fit(
        tmod, DataLoader(Windows(train, cfg.teacher_batch, cfg.model.seq_len, cfg.teacher_steps, cfg.teacher_seed),
                         batch_size=None))
    return model.eval(), {"kind": "toy", "tiny": tcfg.model_dump(), "vocab_size": vocab}


def student(teacher, arm: str, cfg: Config) -> StarKVLM:
    s = StarKVLM(teacher, "joint" if arm == "star_jointk" else "head")
    for a in s.attn:
        a.s = cfg.sharpness
    return s


def quiet_lightning() -> None:
    """Drop Lightning's notices about the manual-optimization cohorts (no optimizer, one-batch loaders); called in
    the stage process and in every pool process, which does not inherit the filters."""
    warnings.filterwarnings("ignore", message=".*(does not have many workers|no optimizer|configure_optimizers).*")
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)


def seed_run(seed: int) -> dict:
    """Every student of one seed (a job of ``jobs.run_jobs``; inputs from its payload): pass A, then pass B at
    star_full's final rank totals. Its batches come from its own generator (10,000 + seed) and every student
    starts from the teacher, so the result does not depend on the order or the pool. Returns the students'
    weights, their run rows and the tracker's per-seed metrics."""
    quiet_lightning()
    p = payload()
    cfg, teacher = Config.model_validate(p["cfg"]), p["teacher"]
    train, curve, full_eval = p["train"], p["curve"], p["full_eval"]
    bb = llama_backbone(teacher)
    steps = cfg.kd_steps + cfg.phase3_steps
    data = Windows(train, cfg.student_batch, cfg.model.seq_len, steps, 10_000 + seed)
    done: list[Member] = []
    # pass A: the learned-threshold arms (star_gatefuse branches from star_full at fusion)
    members = []
    for c in cfg.targets:
        for arm in PASS_A:
            if cfg.runs_at(arm, c, seed):
                s = student(teacher, arm, cfg)
                members.append(Member(arm, c, s, 1, *budgets(bb, c, cfg)))
        if cfg.runs_at("star_nokd", c, seed):
            s = student(teacher, "star_nokd", cfg)
            bk, bv = budgets(bb, c, cfg)
            set_global_thresholds(s, bk, bv)  # pressure alone moves every α of a type identically
            m = Member("star_nokd", c, s, 0, bk, bv)
            m.info["nll_before_fusion"] = heldout_nll(s, full_eval)
            for a in s.attn:
                a.fuse()
            m.info["nll_after_fusion"] = m.info["nll_after_phase3"] = heldout_nll(s, full_eval)
            done.append(m)
    done += run_cohort(teacher, members, cfg, data, curve, full_eval, {}, steps, seed)
    totals = {m.target: m.model.rank_totals() for m in done if m.arm == "star_full"}
    # pass B: the controls at star_full's final rank totals (equal KV bytes)
    members = []
    for c in cfg.targets:
        if c not in totals:
            continue
        tk, tv = totals[c]
        if cfg.runs_at("star_global", c, seed):
            s = student(teacher, "star_global", cfg)
            set_global_thresholds(s, tk, tv)
            for a in s.attn:
                a.alpha_k.requires_grad_(False)
                a.alpha_v.requires_grad_(False)
            members.append(Member("star_global", c, s, 2, tk, tv))
        for arm in ("uniform_kd", "svd_uniform"):
            if cfg.runs_at(arm, c, seed):
                s = student(teacher, arm, cfg)
                fuse_uniform(s, tk, tv)
                m = Member(arm, c, s, 2 if arm == "uniform_kd" else 0, tk, tv)
                if arm == "svd_uniform":
                    m.info["nll_after_fusion"] = m.info["nll_after_phase3"] = heldout_nll(s, full_eval)
                    done.append(m)
                else:
                    members.append(m)
    done += run_cohort(teacher, members, cfg, data, curve, full_eval, totals, steps, seed)
    students, runs = {}, []
    for m in done:
        key = f"s{seed}_c{round(m.target * 100)}_{m.arm}"
        students[key] = {k: v.detach().cpu() for k, v in m.model.state_dict().items()}
        rk, rv = zip(*(a.ranks() for a in m.model.attn))
        runs.append({"key": key, "seed": seed, "target": m.target, "arm": m.arm, "k_mode": m.model.k_mode,
                     "ranks_k": [list(r) for r in rk], "ranks_v": list(rv), "budget_k": m.budget_k,
                     "budget_v": m.budget_v, "steps": list(m.steps), "kd_steps_total": sum(m.steps),
                     "curve": m.curve, **m.info})
    return {"students": students, "runs": runs,
            "log": {f"s{seed}/{m.arm}_c{round(m.target * 100)}/nll": m.info.get("nll_after_phase3") for m in done}}


def run(cfg: Config, ctx: StageContext) -> None:
    torch.set_num_threads(cfg.torch_threads)
    quiet_lightning()
    prep = ctx.input("prepare")
    meta = __import__("json").loads((prep / "meta.json").read_text())
    train = torch.from_numpy(np.load(prep / "train.npy").astype(np.int64))
    val = torch.from_numpy(np.load(prep / f"val_{meta['eval_sets'][0]}.npy").astype(np.int64))
    T = cfg.model.seq_len
    full_eval = eval_windows(val, T, cfg.eval_windows, "papers.star_kv.train")
    # the phase-3 curve (which sized phase 3) reads held-out windows AFTER the test windows, never the test windows
    curve = eval_windows(val, T, cfg.eval_windows + cfg.curve_windows, "papers.star_kv.train")[cfg.eval_windows:]
    torch.manual_seed(cfg.teacher_seed)
    teacher, teacher_info = build_teacher(cfg, train, meta["vocab_size"], ctx.tracker)
    teacher.requires_grad_(False)
    bb = llama_backbone(teacher)
    teacher_nll = heldout_nll(teacher, full_eval)
    out = {"teacher": teacher.state_dict() if cfg.source.kind == "toy" else None, "students": {}}
    # the seeds are independent runs (their own batches; every student starts from the teacher): one job each on
    # the shared process pool, the heaviest first (a seed at the side targets trains more members)
    order = sorted(cfg.seeds, key=lambda s: -sum(cfg.runs_at(a, c, s) for c in cfg.targets for a in cfg.arms))
    data = {"cfg": cfg.model_dump(mode="json"), "teacher": teacher, "train": train, "curve": curve,
            "full_eval": full_eval}
    done = dict(zip(order, run_jobs(seed_run, order, data, cfg.workers)))
    runs = []
    for seed in cfg.seeds:                                               # rows in seed order
        out["students"].update(done[seed]["students"])
        runs += done[seed]["runs"]
        if ctx.tracker is not None:
            ctx.tracker.log(done[seed]["log"])
    torch.save(out, ctx.out / "models.pt")
    write_json(ctx.out / "runs.json", {"teacher": teacher_info, "teacher_nll": teacher_nll, "runs": runs,
                                       "seeds": list(cfg.seeds), "targets": list(cfg.targets),
                                       "backbone": bb.__dict__, "seq_len": T, "eval_windows": cfg.eval_windows,
                                       "kd_steps": cfg.kd_steps, "phase3_steps": cfg.phase3_steps,
                                       "curve_every": cfg.curve_every, "eval_set": meta["eval_sets"][0]})
