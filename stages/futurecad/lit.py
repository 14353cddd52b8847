"""The Lightning modules of futurecad's two models: BRepGround-mini's BCE (GroundModule) and the program
model's SFT (SFTModule). Apart from ``model.py`` so the CAD sandbox workers, the evaluate and report stages and
the grounding CLI, which only run trained models, do not import Lightning (~4.5 CPU-s per process)."""
from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F

from stages.futurecad.model import TPAD, BRepGround, crop_trailing


class GroundModule(L.LightningModule):
    """BCE over the real primitives of each query's B-Rep."""

    def __init__(self, net: BRepGround, lr: float, weight_decay: float = 0.0):
        super().__init__()
        self.net, self.lr, self.weight_decay = net, lr, weight_decay
        self.history: list[dict] = []

    def training_step(self, batch, idx):
        rows = batch.get("rows")
        logits = self.net(batch["words"], batch["faces"], batch["edges"], batch["face_type"],
                          batch["edge_type"], batch["fmask"], batch["emask"], rows)
        mask = torch.cat([batch["fmask"], batch["emask"]], 1)
        mask = (mask if rows is None else mask[rows]).float()
        bce = F.binary_cross_entropy_with_logits(logits, batch["y"], reduction="none")  # ALGO: per-primitive BCE
        loss = (bce * mask).sum() / mask.sum()
        self.history.append({"step": int(self.global_step), "loss": float(loss.detach())})
        if self.logger is not None:       # the stage trains without a logger (history above); ~1 ms a step
            self.log("ground/loss", loss, on_step=True, prog_bar=False)
        return loss

    def configure_optimizers(self):
        # foreach: one update over the grounder's 51 tensors instead of torch's CPU default per-tensor loop; the
        # same arithmetic (bitwise-equal weights and moments, tests/futurecad/test_packed_encoder.py)
        return torch.optim.AdamW(self.net.parameters(), lr=self.lr, weight_decay=self.weight_decay, foreach=True)


def wsd_multiplier(step: int, stable: int, decay: int) -> float:
    """Warmup-stable-decay learning-rate multiplier (no warmup) of optimizer step ``step`` (0-based): 1 for the
    first ``stable`` steps, then a linear decay over ``decay`` steps towards 0 (``decay == 0``: constant).

    # ALGO: WSD  η_k = η for k < S;  η_k = η · (S + D − k) / (D + 1) for S ≤ k < S + D
    """
    if step < stable or decay == 0:
        return 1.0
    return max(0.0, (stable + decay - step) / (decay + 1))


class SFTModule(L.LightningModule):
    """Supervised fine-tuning: cross-entropy on the script tokens given the description prefix. The lr follows
    ``wsd_multiplier(k, stable, decay)`` (``stable=None``: constant)."""

    def __init__(self, model, prompt_len: int, lr: float, stable: int | None = None, decay: int = 0):
        super().__init__()
        self.model, self.prompt_len, self.lr = model, prompt_len, lr
        self.stable, self.decay = stable, decay
        self.history: list[dict] = []

    def training_step(self, batch, idx):
        x = crop_trailing(batch, self.prompt_len)                              # (B, Lp + Ls'), Ls' ≤ Ls
        logits = self.model(x[:, :-1])[:, self.prompt_len - 1:]                # predicts x[:, Lp:]
        tgt = x[:, self.prompt_len:]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=TPAD)
        self.history.append({"step": int(self.global_step), "loss": float(loss.detach()),
                             "lr": self._lr_now()})
        self.log("sft/loss", loss, on_step=True)
        return loss

    def _lr_now(self) -> float:
        """The lr of this step (the schedule's; ``lr`` when called outside a trainer)."""
        t = self._trainer
        return float(t.optimizers[0].param_groups[0]["lr"]) if t is not None and t.optimizers else float(self.lr)

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.model.parameters(), lr=self.lr)
        if self.stable is None:
            return opt
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: wsd_multiplier(k, self.stable, self.decay))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
