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
from stages.common.ensemble import EnsembleModule, SeedEnsemble
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


def window_loss_sums(h: torch.Tensor, w: torch.Tensor, windows: torch.Tensor, rec: Any) -> tuple[float, int]:
    """Summed next-byte loss of (b, T, C) hidden states of ``windows`` (b, T+1) through the fused kernel, and
    the number of positions."""
    loss, _ = rec.call(KERNEL, linear_cross_entropy_stats, h.reshape(-1, h.shape[-1]).contiguous(), w,
                       windows[:, 1:].reshape(-1))
    return float(loss.sum()), loss.numel()


@torch.no_grad()
def eval_loss(model: TinyTransformer, windows: torch.Tensor, rec: Any, chunk: int = 64) -> tuple[float, torch.Tensor]:
    """Mean next-byte loss over the windows through the fused kernel; also the last-token reps H."""
    total, count, last = 0.0, 0, []
    for i in range(0, windows.shape[0], chunk):
        w = windows[i:i + chunk]
        h = model.hidden(w[:, :-1])  # (B, T, C)
        s, n = window_loss_sums(h, model.unembed, w, rec)
        total += s
        count += n
        last.append(h[:, -1])
    return total / count, torch.cat(last)


@torch.no_grad()
def eval_loss_members(ens: SeedEnsemble, unembed: torch.Tensor, windows: torch.Tensor, rec: Any,
                      chunk: int = 64) -> list[tuple[float, torch.Tensor]]:
    """``eval_loss`` of every member of ``ens`` (unembed: the stacked (S, V, C) W_U): the hidden states of all
    members in one vmapped pass per chunk, each member's loss through the kernel on its own rows."""
    S = len(ens)
    total, count, last = [0.0] * S, [0] * S, [[] for _ in range(S)]
    for i in range(0, windows.shape[0], chunk):
        w = windows[i:i + chunk]
        h = ens.vmap(_hidden, w[:, :-1], shared=True)  # (S, B, T, C)
        for k in range(S):
            s, n = window_loss_sums(h[k], unembed[k], w, rec)
            total[k] += s
            count[k] += n
            last[k].append(h[k][:, -1])
    return [(total[k] / count[k], torch.cat(last[k])) for k in range(S)]


def _hidden(model: TinyTransformer, x: torch.Tensor) -> torch.Tensor:
    return model.hidden(x)


def lr_lambda(step: int, steps: int, warmup: int, final_frac: float) -> float:
    """OLMo-style schedule: linear warm-up, then cosine decay to final_frac of the peak."""
    if step < warmup:
        return (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return final_frac + (1 - final_frac) * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))


class RunLog:
    """One run's records: its token-aligned evaluation points (``history``), its dense light points (``dense``)
    and the running mean of its training loss between points; each point also goes to the stage's W&B run."""

    def __init__(self, name: str, meta: dict[str, Any] | None, steps: int, tokens_per_step: int, tracker: Any):
        self.name, self.meta, self.steps, self.tokens_per_step, self.tracker = name, meta or {}, steps, tokens_per_step, tracker
        self.history: list[dict[str, Any]] = []
        self.dense: list[dict[str, Any]] = []   # light points (ID val loss + erank) at every step ≤ dense_steps
        self._train_sum, self._train_n = 0.0, 0

    def train_loss(self, loss: float) -> None:
        self._train_sum += loss
        self._train_n += 1

    def light(self, step: int, val: float, w: torch.Tensor) -> None:
        """A dense point for the matched-loss crossing: the same val windows, W_U's erank; nothing else."""
        self.dense.append({"run": self.name, "step": step, "tokens": step * self.tokens_per_step,
                           "frac": step / self.steps, "val_loss": val, "erank": erank_pct(w)})

    def point(self, step: int, val: float, ood: float, w: torch.Tensor, h: torch.Tensor) -> None:
        row = {"run": self.name, **self.meta, "step": step, "tokens": step * self.tokens_per_step,
               "frac": step / self.steps,
               "train_loss": self._train_sum / self._train_n if self._train_n else None,
               "val_loss": val, "ood_loss": ood, **geometry(w, h)}
        self._train_sum, self._train_n = 0.0, 0
        self.history.append(row)
        if self.tracker is not None:
            self.tracker.log({f"{self.name}/{k}": v for k, v in row.items()
                              if isinstance(v, float) and k not in ("frac", *self.meta)})


def decay_groups(named) -> list[dict[str, Any]]:
    """OLMo-style AdamW groups: weight decay on the 2-D weight matrices (incl. W_U), not on norms or the input
    embedding. ``named``: (name, parameter) pairs; ``lead`` leading dims (1: an ensemble's seed dim) are not
    the parameter's own. The weight decay itself is filled in by the caller."""
    decay, no_decay = [], []
    for name, p, lead in named:
        (decay if p.ndim - lead >= 2 and not name.startswith("embed.") else no_decay).append(p)
    return [{"params": decay, "decay": True}, {"params": no_decay, "decay": False}]


def adamw(groups: list[dict[str, Any]], lr: float, weight_decay: float) -> torch.optim.AdamW:
    return torch.optim.AdamW([{"params": g["params"], "weight_decay": weight_decay if g["decay"] else 0.0}
                              for g in groups], lr=lr, betas=(0.9, 0.95), eps=1e-8)


class EvalSchedule:
    """What both run modules share (mixed in before the LightningModule): a full evaluation point at step 0 and at
    every ``eval_steps`` step, a light one at every other step ≤ ``dense_steps``, and the OLMo LR schedule."""

    def on_train_start(self) -> None:
        self.evaluate_now(0)

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        step = self.global_step  # optimizer steps done
        if step in self.eval_steps:
            self.evaluate_now(step)
        elif step <= self.dense_steps:
            self.evaluate_light(step)

    def scheduled(self, opt: torch.optim.Optimizer) -> dict[str, Any]:
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: lr_lambda(s, self.steps, self.warmup, self.final_lr_frac))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class GridRun(EvalSchedule, L.LightningModule):
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
        self.rec = rec
        self.log_ = RunLog(name, meta, steps, tokens_per_step, tracker)
        self.dense_steps = dense_steps

    @property
    def history(self) -> list[dict[str, Any]]:
        return self.log_.history

    @property
    def dense(self) -> list[dict[str, Any]]:
        return self.log_.dense

    def loss(self, batch: torch.Tensor) -> torch.Tensor:
        x, y = batch[:, :-1], batch[:, 1:]                      # (B, T)
        h = self.model.hidden(x)                                 # (B, T, C)
        self.rec.count(KERNEL)
        return linear_cross_entropy(h.reshape(-1, h.shape[-1]), self.model.unembed, y.reshape(-1),
                                    backend=self.rec.backend)    # mean next-byte CE, fused with W_U

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = self.loss(batch)
        self.log_.train_loss(float(loss.detach()))
        return loss

    @torch.no_grad()
    def evaluate_light(self, step: int) -> None:
        was = self.model.training
        self.model.eval()
        val, _ = eval_loss(self.model, self.val_windows.to(self.model.unembed.device), self.rec)
        self.log_.light(step, val, self.model.unembed)
        self.model.train(was)

    @torch.no_grad()
    def evaluate_now(self, step: int) -> None:
        was = self.model.training
        self.model.eval()
        dev = self.model.unembed.device
        val, h = eval_loss(self.model, self.val_windows.to(dev), self.rec)
        ood, _ = eval_loss(self.model, self.ood_windows.to(dev), self.rec)
        self.log_.point(step, val, ood, self.model.unembed, h)
        self.model.train(was)

    def configure_optimizers(self):
        return self.scheduled(adamw(decay_groups((n, p, 0) for n, p in self.model.named_parameters()),
                                    self.lr, self.wd))


class SeedWindowBatches(Dataset):
    """Step i -> (S, B, T+1): row k is ``WindowBatches(corpus, batch, seq_len, steps, seeds[k])[i]``."""

    def __init__(self, corpus: torch.Tensor, batch: int, seq_len: int, steps: int, seeds: list[int]):
        self.members = [WindowBatches(corpus, batch, seq_len, steps, seed=s) for s in seeds]

    def __len__(self) -> int:
        return len(self.members[0])

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.stack([m[i] for m in self.members])


class GridEnsemble(EvalSchedule, EnsembleModule):
    """The seeds of one grid cell as ONE vectorized ensemble (stages/common/ensemble.py): member k is the
    ``GridRun`` of seeds[k] (its init is ``TinyTransformer`` built right after ``torch.manual_seed(seeds[k])``, as
    the stage builds a solo run; its batches are ``SeedWindowBatches`` row k; the same AdamW groups and schedule).
    The members' hidden states run under vmap; each member's loss goes through the fused kernel on its own rows
    and W_U outside the vmap (the Triton path has no vmap rule), so the kernel is called once per member and step,
    as in S solo runs. ``logs[k]`` holds member k's records (``RunLog``), the same rows a solo run writes."""

    def __init__(self, model_cfg: TinyTransformerConfig, seeds: list[int], *, names: list[str], lr: float,
                 weight_decay: float, steps: int, warmup_frac: float, final_lr_frac: float, eval_steps: list[int],
                 val: torch.Tensor, ood: torch.Tensor, rec: Any, tracker: Any = None,
                 metas: list[dict[str, Any]] | None = None, tokens_per_step: int = 0, dense_steps: int = 0):
        super().__init__(lambda seed: TinyTransformer(model_cfg), seeds,
                         optimizer=lambda groups: adamw(groups, lr, weight_decay),
                         param_groups=lambda named: decay_groups((n, p, 1) for n, p in named))
        self.unembed_name = "embed.weight" if model_cfg.tie_embeddings else "lm_head.weight"
        self.steps, self.warmup = steps, max(1, round(warmup_frac * steps))
        self.final_lr_frac = final_lr_frac
        self.eval_steps = set(eval_steps)
        self.val_windows, self.ood_windows = val, ood
        self.rec = rec
        metas = metas or [None] * len(seeds)
        self.logs = [RunLog(n, m, steps, tokens_per_step, tracker) for n, m in zip(names, metas)]
        self.dense_steps = dense_steps

    @property
    def unembed(self) -> torch.Tensor:
        """(S, V, C): every member's W_U."""
        return self.ensemble.stacked.get_parameter(self.unembed_name)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        x, y = batch[..., :-1], batch[..., 1:]                   # (S, B, T)
        h = self.ensemble.vmap(_hidden, x)                       # (S, B, T, C): every member at once
        w = self.unembed
        self.rec.count(KERNEL, len(self.logs))
        losses = torch.stack([linear_cross_entropy(h[k].reshape(-1, h.shape[-1]), w[k], y[k].reshape(-1),
                                                   backend=self.rec.backend)     # member k's mean next-byte CE
                              for k in range(len(self.logs))])
        self.last_losses = losses.detach()
        for log, v in zip(self.logs, self.last_losses.tolist()):
            log.train_loss(v)
        return losses.sum()  # the sum: member k's gradient is its solo gradient

    @torch.no_grad()
    def evaluate_light(self, step: int) -> None:
        was = self.ensemble.training
        self.ensemble.eval()
        w = self.unembed.detach()
        for k, (val, _) in enumerate(eval_loss_members(self.ensemble, w, self.val_windows.to(w.device), self.rec)):
            self.logs[k].light(step, val, w[k])
        self.ensemble.train(was)

    @torch.no_grad()
    def evaluate_now(self, step: int) -> None:
        was = self.ensemble.training
        self.ensemble.eval()
        w = self.unembed.detach()
        vals = eval_loss_members(self.ensemble, w, self.val_windows.to(w.device), self.rec)
        oods = eval_loss_members(self.ensemble, w, self.ood_windows.to(w.device), self.rec)
        for k, ((val, h), (ood, _)) in enumerate(zip(vals, oods)):
            self.logs[k].point(step, val, ood, w[k], h)
        self.ensemble.train(was)

    def configure_optimizers(self):
        return self.scheduled(super().configure_optimizers())   # elementwise AdamW over the stacked parameters
