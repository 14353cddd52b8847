"""plantain's SFT as a Lightning module (next-token NLL on the trace tokens through the log-prob kernel, with
the warmup-stable-decay schedule). Apart from ``model.py`` so the evaluate stage and its pool workers, which only
run trained models, do not import Lightning (~4.5 CPU-s per process)."""
from __future__ import annotations

from functools import partial

import lightning as L
import torch

from kernels.record import KernelCounter as Counter  # token_logprob calls
from stages.common.tiny_transformer import TinyTransformer
from stages.plantain.model import seq_logprobs, wsd_factor
from stages.plantain.task import PROMPT_LEN


class SFTModule(L.LightningModule):
    """Next-token cross-entropy on the trace tokens (prompt excluded), via the log-prob kernel;
    the NLL on hidden (thinking) and visible (<ans>) tokens is logged separately."""

    def __init__(self, model: TinyTransformer, lr: float, weight_decay: float, counter: Counter,
                 steps: int = 0, decay_frac: float = 0.0):
        super().__init__()
        self.model, self.lr, self.weight_decay, self.counter = model, lr, weight_decay, counter
        self.steps, self.decay_frac = steps, decay_frac
        self.history: list[dict] = []

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.model.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        if not self.decay_frac:
            return opt
        sched = torch.optim.lr_scheduler.LambdaLR(opt, partial(wsd_factor, steps=self.steps,
                                                               decay_frac=self.decay_frac))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def training_step(self, batch, _):
        n_tok = int(batch[:, 1].sum(1).max())                                # trim the batch's padding
        batch = batch[:, :, :PROMPT_LEN + n_tok]
        seqs, mask, vis = batch[:, 0], batch[:, 1, PROMPT_LEN:], batch[:, 2, PROMPT_LEN:]
        logp = seq_logprobs(self.model, seqs, mask, self.counter)           # (B, Lg)
        n = mask.sum().clamp_min(1)
        loss = -(logp * mask).sum() / n                                      # ALGO: SFT token-level NLL
        vm, hm = mask * vis, mask * (1 - vis)
        logp = logp.detach()
        row = {"step": int(self.global_step), "loss": float(loss.detach()),
               "nll_visible": float(-(logp * vm).sum() / vm.sum().clamp_min(1)),
               "nll_hidden": float(-(logp * hm).sum() / hm.sum().clamp_min(1))}
        self.history.append(row)
        self.log("sft/loss", loss, on_step=True, prog_bar=False)
        return loss
