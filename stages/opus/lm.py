"""The LightningModule that trains the shared tiny GPT on K selected sequences out of each N-buffer.

Each training batch is a buffer of N candidate sequences; ``training_step`` scores it with the arm's
selector (random / high-loss / OPUS), keeps K, and returns the loss on those K only, so every arm
trains on the same number of update tokens. Scoring time and the remaining step time (forward,
backward, optimizer step on K) are measured separately on every step.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import lightning as L
import torch
import torch.nn.functional as F

from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig
from stages.opus.precondition import preconditioner_from_optimizer
from stages.opus.selection import OpusScorer, select_high_loss, select_opus, select_random


@dataclass(frozen=True)
class ArmSpec:
    name: str
    selector: str          # random | high_loss | opus
    optimizer: str         # adamw | sgd
    preconditioner: str    # optimizer | identity
    sampling: str          # boltzmann | greedy
    redundancy: bool = True  # False: ablation without the η²⟨φ,Φ⟩ penalty


@dataclass(frozen=True)
class SelectionSpec:
    k: int
    sketch_size: int
    tau: float
    eta_scale: float
    proxy_batch: int
    backend: str


@dataclass(frozen=True)
class OptimSpec:
    lr: float
    sgd_lr: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float


class SelectionLM(L.LightningModule):
    def __init__(self, model_cfg: TinyTransformerConfig, arm: ArmSpec, sel: SelectionSpec, optim: OptimSpec,
                 proxy: torch.Tensor, seed: int):
        super().__init__()
        self.model = TinyTransformer(model_cfg)
        self.arm, self.sel, self.optim = arm, sel, optim
        self.tag = f"{arm.name}/s{seed}"  # metric prefix: one W&B run holds every arm and seed
        self.register_buffer("proxy", proxy, persistent=False)
        self.gen = torch.Generator().manual_seed(10_000 + seed)
        self.scorer = OpusScorer(self.model, sel.sketch_size, seed, sel.backend) if arm.selector == "opus" else None
        self.val_curve: list[tuple[int, float]] = []
        self.score_s: list[float] = []
        self.update_s: list[float] = []
        self.selected_kinds: list[int] = []
        self.precond_kinds: dict[str, int] = {}
        self._t_selected = 0.0

    def configure_optimizers(self):
        o = self.optim
        if self.arm.optimizer == "sgd":
            return torch.optim.SGD(self.model.parameters(), lr=o.sgd_lr)
        return torch.optim.AdamW(self.model.parameters(), lr=o.lr, betas=o.betas, eps=o.eps,
                                 weight_decay=o.weight_decay)

    def lm_loss(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = self.model(tokens[:, :-1])  # (B, T-1, V)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))

    def choose(self, tokens: torch.Tensor) -> torch.Tensor:
        k, arm = self.sel.k, self.arm
        if arm.selector == "random":
            return select_random(tokens.shape[0], k, self.gen)
        if arm.selector == "high_loss":
            return select_high_loss(self.model, tokens, k)
        optimizer = self.trainer.optimizers[0]
        precond = preconditioner_from_optimizer(optimizer, self.scorer.weights(self.model), arm.preconditioner)
        self.precond_kinds[precond.kind] = self.precond_kinds.get(precond.kind, 0) + 1
        pidx = torch.randperm(self.proxy.shape[0], generator=self.gen)[: self.sel.proxy_batch]
        scored = self.scorer.score(self.model, tokens, self.proxy[pidx], precond)
        picks, _ = select_opus(scored, k, self.sel.tau, arm.sampling == "greedy", self.gen, self.sel.eta_scale,
                               arm.redundancy)
        return picks

    def training_step(self, batch, batch_idx):
        tokens, kinds = batch  # (N, T), (N,)
        t0 = time.perf_counter()
        picks = self.choose(tokens)
        self._t_selected = time.perf_counter()
        self.score_s.append(self._t_selected - t0)
        self.selected_kinds.extend(kinds[picks].tolist())
        loss = self.lm_loss(tokens[picks])
        self.log(f"{self.tag}/train_loss", loss, prog_bar=True)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.update_s.append(time.perf_counter() - self._t_selected)  # forward + backward + optimizer step

    def on_train_start(self):
        self.val_curve.append((0, self._val_loss()))

    @torch.no_grad()
    def _val_loss(self) -> float:
        was = self.model.training
        self.model.eval()
        loss = float(self.lm_loss(self.trainer.val_dataloaders.dataset.tensors[0]))
        self.model.train(was)
        return loss

    def validation_step(self, batch, batch_idx):
        loss = self.lm_loss(batch[0])
        self.log(f"{self.tag}/val_loss", loss)
        return loss

    def on_validation_epoch_end(self):
        self.val_curve.append((int(self.global_step), float(self.trainer.callback_metrics[f"{self.tag}/val_loss"])))
