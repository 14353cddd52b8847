"""The LightningModule that trains the shared tiny GPT on K selected sequences out of each N-buffer.

The candidate stream is a fixed permutation of the pool per seed (a buffer, identical for every arm
of a seed); step s sees candidates stream[sN:(s+1)N]. ``training_step`` scores them with the arm's
selector (random / high-loss / OPUS), keeps K, and returns the loss on those K only, so every arm
trains on the same number of update tokens. With ``score_every = k`` the selector runs once every k
steps on the k next buffers (kN candidates, kK picks handed out over the k steps: the optimizer
state used for scoring is up to k-1 steps stale, as in the official code's amortised scoring).
Scoring time and the remaining step time are measured separately (runtime fields only).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import lightning as L
import torch
import torch.nn.functional as F

from kernels.ghost_countsketch import ghost_countsketch
from stages.common.device import generator as device_generator
from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig
from stages.opus.corpus import KINDS
from stages.opus.precondition import preconditioner_from_optimizer
from stages.opus.selection import (OpusScorer, redundancy_diagnostics, select_high_loss, select_opus,
                                   select_random)


@dataclass(frozen=True)
class ArmSpec:
    name: str
    selector: str          # random | high_loss | opus
    optimizer: str         # adamw | sgd
    preconditioner: str    # optimizer | identity
    sampling: str          # boltzmann | greedy
    redundancy: bool = True      # False: ablation without the η²⟨φ,Φ⟩ penalty
    standardized: bool = True    # False: the official sampler, p ∝ exp(raw U / τ)
    window: int | None = None    # score a window of W tokens of each sequence (official: 512 of 2048)
    score_every: int = 1         # score once per k steps (k buffers at once)
    combined: bool = False       # one forward/backward for candidates + proxy
    vectorized: bool = False     # selection rounds on the device without host syncs
    stream: int = 0              # selection RNG stream (random_stream2: a second random draw, same init and data)


@dataclass(frozen=True)
class SelectionSpec:
    k: int
    n: int
    sketch_size: int
    tau: float
    eta_scale: float
    proxy_batch: int
    diag_every: int


@dataclass(frozen=True)
class OptimSpec:
    lr: float
    sgd_lr: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float


class SelectionLM(L.LightningModule):
    def __init__(self, model_cfg: TinyTransformerConfig, arm: ArmSpec, sel: SelectionSpec, optim: OptimSpec,
                 pool: tuple[torch.Tensor, torch.Tensor], stream: torch.Tensor, proxy: torch.Tensor,
                 val: torch.Tensor, seed: int, rec=None):
        super().__init__()
        self.model = TinyTransformer(model_cfg)
        self.arm, self.sel, self.optim = arm, sel, optim
        self.seed = seed
        self.rec = rec
        self.tag = f"{arm.name}/s{seed}"  # metric prefix: one W&B run holds every arm and seed
        for name, t in (("pool", pool[0]), ("pool_kinds", pool[1]), ("stream", stream), ("proxy", proxy),
                        ("val", val), ("kind_counts", torch.zeros(len(KINDS), dtype=torch.long))):
            self.register_buffer(name, t, persistent=False)
        self.scorer = OpusScorer(self.model, sel.sketch_size, seed) if arm.selector == "opus" else None
        self.gen: torch.Generator | None = None
        self.queue: list[torch.Tensor] = []
        self.val_curve: list[tuple[int, float]] = []
        self.score_s: list[float] = []
        self.update_s: list[float] = []
        self.diagnostics: list[dict] = []
        self.precond_kinds: dict[str, int] = {}
        self._t_selected = 0.0

    def configure_optimizers(self):
        o = self.optim
        if self.arm.optimizer == "sgd":
            return torch.optim.SGD(self.model.parameters(), lr=o.sgd_lr)
        return torch.optim.AdamW(self.model.parameters(), lr=o.lr, betas=o.betas, eps=o.eps,
                                 weight_decay=o.weight_decay)

    def on_fit_start(self):
        # on the model's device; stream 0 keeps every arm's historical seed, stream s > 0 is another draw
        self.gen = device_generator(self.device, 10_000 + self.seed + 1_000_003 * self.arm.stream)

    def lm_loss(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = self.model(tokens[:, :-1])  # (B, T-1, V)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))

    def _sketch(self, *args):
        if self.rec is None:
            return ghost_countsketch(*args)
        return self.rec.call("ghost_countsketch", ghost_countsketch, *args)

    def _select(self, tokens: torch.Tensor, k: int, step: int) -> torch.Tensor:
        arm = self.arm
        if arm.selector == "random":
            return select_random(tokens.shape[0], k, self.gen)
        if arm.selector == "high_loss":
            return select_high_loss(self.model, tokens, k)
        optimizer = self.trainer.optimizers[0]
        precond = preconditioner_from_optimizer(optimizer, self.scorer.weights(self.model), arm.preconditioner)
        self.precond_kinds[precond.kind] = self.precond_kinds.get(precond.kind, 0) + 1
        pidx = torch.randperm(self.proxy.shape[0], generator=self.gen, device=self.device)[: self.sel.proxy_batch]
        scored = self.scorer.score(self.model, tokens, self.proxy[pidx], precond, combined=arm.combined,
                                   window=arm.window, generator=self.gen, sketch_fn=self._sketch)
        picks, utils = select_opus(scored, k, self.sel.tau, arm.sampling == "greedy", self.gen, self.sel.eta_scale,
                                   arm.redundancy, arm.standardized, arm.vectorized)
        if step % self.sel.diag_every == 0:  # diagnostic, outside the timed part would need a re-run: cheap here
            d = redundancy_diagnostics(scored, picks, utils, k, self.sel.eta_scale)
            self.diagnostics.append({"step": step, **d, "raw_logit_sd": d["raw_utility_sd"] / self.sel.tau})
        return picks

    def choose(self, step: int) -> torch.Tensor:
        """Pool indices of the K sequences trained on at `step`."""
        n, k, every = self.sel.n, self.sel.k, self.arm.score_every
        if every == 1:
            idx = self.stream[step * n:(step + 1) * n]
            return idx[self._select(self.pool[idx], k, step)]
        if step % every == 0 or not self.queue:
            count = min(every, self.stream.shape[0] // n - step)
            idx = self.stream[step * n:(step + count) * n]
            picks = idx[self._select(self.pool[idx], k * count, step)]
            self.queue = [picks[j::count] for j in range(count)]  # interleaved: each step gets a mix
        return self.queue.pop(0)

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def training_step(self, batch, batch_idx):
        step = int(batch[0][0])
        self._sync()
        t0 = time.perf_counter()
        chosen = self.choose(step)
        self._sync()
        self._t_selected = time.perf_counter()
        self.score_s.append(self._t_selected - t0)
        self.kind_counts += torch.bincount(self.pool_kinds[chosen], minlength=len(KINDS))
        loss = self.lm_loss(self.pool[chosen])
        self.log(f"{self.tag}/train_loss", loss, prog_bar=True)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self._sync()
        self.update_s.append(time.perf_counter() - self._t_selected)  # forward + backward + optimizer step

    def on_train_start(self):
        self.val_curve.append((0, self._val_loss()))

    @torch.no_grad()
    def _val_loss(self) -> float:
        was = self.model.training
        self.model.eval()
        loss = float(self.lm_loss(self.val))
        self.model.train(was)
        return loss

    def validation_step(self, batch, batch_idx):
        loss = self.lm_loss(self.val)
        self.log(f"{self.tag}/val_loss", loss)
        return loss

    def on_validation_epoch_end(self):
        self.val_curve.append((int(self.global_step), float(self.trainer.callback_metrics[f"{self.tag}/val_loss"])))
