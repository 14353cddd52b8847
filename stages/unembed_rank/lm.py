"""One grid run: the shared tiny transformer (OLMo-style: pre-norm RMSNorm, no biases, SwiGLU, RoPE,
untied unembedding) trained as a byte-level LM, as a LightningModule.

The loss goes through ``kernels/fused_linear_ce`` (hidden states and W_U, logits never
materialized). Every ``eval_steps`` step (token-aligned fractions of the budget, so runs with
different batch sizes are compared at equal tokens) it logs erank(W_U), the other geometry metrics
and the in-domain / OOD validation loss.
"""
from __future__ import annotations

import math
from typing import Any

import lightning as L
import torch
from torch.utils.data import Dataset

from kernels.fused_linear_ce import linear_cross_entropy, linear_cross_entropy_stats
from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig
from stages.unembed_rank.geometry import erank_pct, geometry

KERNEL = "fused_linear_ce"


class WindowBatches(Dataset):
    """Step i -> a (B, T+1) batch of byte windows at pre-drawn random offsets (seeded per run)."""

    def __init__(self, corpus: torch.Tensor, batch: int, seq_len: int, steps: int, seed: int):
        gen = torch.Generator().manual_seed(seed)
        self.corpus, self.seq_len = corpus, seq_len
        self.offsets = torch.randint(0, corpus.numel() - seq_len - 1, (steps, batch), generator=gen)

    def __len__(self) -> int:
        return self.offsets.shape[0]

    def __getitem__(self, i: int) -> torch.Tensor:
        idx = self.offsets[i][:, None] + torch.arange(self.seq_len + 1)  # (B, T+1)
        return self.corpus[idx].long()


def eval_windows(corpus: torch.Tensor, seq_len: int, n: int) -> torch.Tensor:
    """The first n non-overlapping (T+1)-windows: a fixed evaluation set. (n, T+1)"""
    n = min(n, corpus.numel() // (seq_len + 1))
    return corpus[: n * (seq_len + 1)].view(n, seq_len + 1).long()


@torch.no_grad()
def eval_loss(model: TinyTransformer, windows: torch.Tensor, rec: Any, chunk: int = 64) -> tuple[float, torch.Tensor]:
    """Mean next-byte loss over the windows through the fused kernel; also the last-token reps H."""
    total, count, last = 0.0, 0, []
    for i in range(0, windows.shape[0], chunk):
        w = windows[i:i + chunk]
        h = model.hidden(w[:, :-1])  # (B, T, C)
        loss, _ = rec.call(KERNEL, linear_cross_entropy_stats, h.reshape(-1, h.shape[-1]).contiguous(),
                           model.unembed, w[:, 1:].reshape(-1))
        total += float(loss.sum())
        count += loss.numel()
        last.append(h[:, -1])
    return total / count, torch.cat(last)


def lr_lambda(step: int, steps: int, warmup: int, final_frac: float) -> float:
    """OLMo-style schedule: linear warm-up, then cosine decay to final_frac of the peak."""
    if step < warmup:
        return (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return final_frac + (1 - final_frac) * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))


class GridRun(L.LightningModule):
    def __init__(self, model_cfg: TinyTransformerConfig, *, name: str, lr: float, weight_decay: float,
                 steps: int, warmup_frac: float, final_lr_frac: float, eval_steps: list[int],
                 val: torch.Tensor, ood: torch.Tensor, rec: Any, tracker: Any = None,
                 meta: dict[str, Any] | None = None, tokens_per_step: int = 0, dense_steps: int = 0):
        super().__init__()
        self.model = TinyTransformer(model_cfg)
        self.name, self.lr, self.wd, self.steps = name, lr, weight_decay, steps
        self.warmup = max(1, round(warmup_frac * steps))
        self.final_lr_frac = final_lr_frac
        self.eval_steps = set(eval_steps)
        self.val_windows, self.ood_windows = val, ood
        self.rec, self.tracker, self.meta = rec, tracker, meta or {}
        self.tokens_per_step = tokens_per_step
        self.history: list[dict[str, Any]] = []
        self.dense_steps = dense_steps
        self.dense: list[dict[str, Any]] = []   # light points (ID val loss + erank) at every step ≤ dense_steps
        self._train_sum, self._train_n = 0.0, 0

    def loss(self, batch: torch.Tensor) -> torch.Tensor:
        x, y = batch[:, :-1], batch[:, 1:]                      # (B, T)
        h = self.model.hidden(x)                                 # (B, T, C)
        self.rec.count(KERNEL)
        return linear_cross_entropy(h.reshape(-1, h.shape[-1]), self.model.unembed, y.reshape(-1),
                                    backend=self.rec.backend)    # mean next-byte CE, fused with W_U

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = self.loss(batch)
        self._train_sum += float(loss.detach())
        self._train_n += 1
        return loss

    def on_train_start(self) -> None:
        self.evaluate_now(0)

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        step = self.global_step  # optimizer steps done
        if step in self.eval_steps:
            self.evaluate_now(step)
        elif step <= self.dense_steps:
            self.evaluate_light(step)

    @torch.no_grad()
    def evaluate_light(self, step: int) -> None:
        """A dense point for the matched-loss crossing: the same val windows, W_U's erank; nothing else."""
        was = self.model.training
        self.model.eval()
        val, _ = eval_loss(self.model, self.val_windows.to(self.model.unembed.device), self.rec)
        self.dense.append({"run": self.name, "step": step, "tokens": step * self.tokens_per_step,
                           "frac": step / self.steps, "val_loss": val, "erank": erank_pct(self.model.unembed)})
        self.model.train(was)

    @torch.no_grad()
    def evaluate_now(self, step: int) -> None:
        was = self.model.training
        self.model.eval()
        dev = self.model.unembed.device
        val, h = eval_loss(self.model, self.val_windows.to(dev), self.rec)
        ood, _ = eval_loss(self.model, self.ood_windows.to(dev), self.rec)
        row = {"run": self.name, **self.meta, "step": step, "tokens": step * self.tokens_per_step,
               "frac": step / self.steps,
               "train_loss": self._train_sum / self._train_n if self._train_n else None,
               "val_loss": val, "ood_loss": ood, **geometry(self.model.unembed, h)}
        self._train_sum, self._train_n = 0.0, 0
        self.history.append(row)
        if self.tracker is not None:
            self.tracker.log({f"{self.name}/{k}": v for k, v in row.items()
                              if isinstance(v, float) and k not in ("frac", *self.meta)})
        self.model.train(was)

    def configure_optimizers(self):
        # OLMo-style AdamW: weight decay on the 2-D weight matrices (incl. W_U), not on norms or the
        # input embedding.
        decay, no_decay = [], []
        for name, p in self.model.named_parameters():
            (decay if p.ndim >= 2 and not name.startswith("embed.") else no_decay).append(p)
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": self.wd},
                                 {"params": no_decay, "weight_decay": 0.0}],
                                lr=self.lr, betas=(0.9, 0.95), eps=1e-8)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: lr_lambda(s, self.steps, self.warmup, self.final_lr_frac))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
