"""The two model families trained on the fact world, as LightningModules.

1. The paper's theoretical one-layer model (uniform attention over [entity, relation]):
       logits = W_O W_V x̄,  x̄ = (e_entity + e_relation)/2            # ALGO: one-layer model, W_OV = W_O W_V
   trained by full-batch gradient descent from a small init; and its unfactorized ablation
       logits = W x̄.
2. A real one-layer causal transformer (the shared TinyTransformer with n_layers=1) that reads
   the sequence [entity, relation] and predicts the target from the last position.

Several independent models ("arms", one per (arm, seed)) are held in one module and their losses
summed: their parameters are disjoint and the optimizers act per parameter, so this is exactly
the same as training each arm alone, in one Lightning loop. Each model has its own training rows
and held-out rows (the held-out pairs follow the seed).
"""
from __future__ import annotations

import math

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import IterableDataset

from kernels.fused_linear_ce import linear_cross_entropy
from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig
from stages.reversal_curse.measures import fact_logits, nuclear_at_margin

KERNEL = "fused_linear_ce"


class FullBatch(IterableDataset):
    """Yields the same full batch `steps` times: one epoch of full-batch gradient descent."""

    def __init__(self, batch: dict[str, torch.Tensor], steps: int):
        self.batch, self.steps = batch, steps

    def __iter__(self):
        for _ in range(self.steps):
            yield self.batch

    def __len__(self):
        return self.steps


def full_batch_loader(batch: dict[str, torch.Tensor], steps: int):
    return torch.utils.data.DataLoader(FullBatch(batch, steps), batch_size=None)


class OneLayerModel(nn.Module):
    """logits = W_O W_V x̄ (factorized) or W x̄ (unfactorized ablation)."""

    def __init__(self, vocab_size: int, d: int, init_scale: float, factorized: bool, generator: torch.Generator):
        super().__init__()
        self.factorized = factorized
        if factorized:
            self.w_v = nn.Parameter(torch.randn(d, vocab_size, generator=generator) * init_scale)  # (d, V)
            self.w_o = nn.Parameter(torch.randn(vocab_size, d, generator=generator) * init_scale)  # (V, d)
        else:
            self.w = nn.Parameter(torch.randn(vocab_size, vocab_size, generator=generator) * init_scale)

    def hidden_and_unembed(self, entity: torch.Tensor, relation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(h, U) with logits = h @ U.T (the fused kernel's inputs); h = W_V x̄ gathered, not a dense matmul."""
        if self.factorized:
            return 0.5 * (self.w_v[:, entity] + self.w_v[:, relation]).T, self.w_o  # (N, d), (V, d)
        raise ValueError("the unfactorized model has no hidden layer: use logits()")

    def logits(self, entity: torch.Tensor, relation: torch.Tensor) -> torch.Tensor:
        return fact_logits(self.w_ov(), entity, relation)  # (N, V)

    def w_ov(self) -> torch.Tensor:
        """The effective (V, V) map from input token to output logit."""
        return self.w_o @ self.w_v if self.factorized else self.w


class TheoryArms(L.LightningModule):
    """Independent one-layer models trained by full-batch GD, one per (arm, seed)."""

    def __init__(self, arm_names: list[str], train_masks: torch.Tensor, test_masks: torch.Tensor,
                 vocab_size: int, d: int, init_scales: list[float], factorized: list[bool], seeds: list[int],
                 lr: float, eval_every: int, rec, world: str = "main"):
        super().__init__()
        self.arm_names, self.world, self.rec = arm_names, world, rec
        # arms with the same seed share one initialization (a controlled comparison)
        self.models = nn.ModuleList(OneLayerModel(vocab_size, d, s, f, torch.Generator().manual_seed(seed))
                                    for s, f, seed in zip(init_scales, factorized, seeds))
        self.register_buffer("train_masks", train_masks)  # (models, rows)
        self.register_buffer("test_masks", test_masks)    # (models, rows) held-out reversals
        self.lr, self.eval_every = lr, eval_every
        self.history: list[dict] = []

    def model_loss(self, model: OneLayerModel, e, r, y) -> torch.Tensor:
        if model.factorized:
            h, unembed = model.hidden_and_unembed(e, r)
            return self.rec.call(KERNEL, linear_cross_entropy, h, unembed, y)  # mean CE through the kernel
        return F.cross_entropy(model.logits(e, r), y)  # unfactorized: no hidden layer to fuse

    def training_step(self, batch, step):
        if self.global_step % self.eval_every == 0:
            self.record(batch)
        total = 0.0
        for k, model in enumerate(self.models):
            rows = self.train_masks[k]
            total = total + self.model_loss(model, batch["entity"][rows], batch["relation"][rows],
                                            batch["target"][rows])
        return total

    def on_train_end(self):
        self.record(self.last_batch)

    def on_train_batch_start(self, batch, batch_idx):
        self.last_batch = batch

    @torch.no_grad()
    def record(self, batch) -> None:
        e, r, y = batch["entity"], batch["relation"], batch["target"]
        for k, (name, model) in enumerate(zip(self.arm_names, self.models)):
            w = model.w_ov()
            test, train = self.test_masks[k], self.train_masks[k]
            nam = nuclear_at_margin(w, e[train], r[train], y[train])
            acc = (fact_logits(w, e[test], r[test]).argmax(1) == y[test]).float().mean().item()
            self.history.append({
                "world": self.world, "step": int(self.global_step), "arm": name, "reverse_acc": acc,
                "nuclear_norm": torch.linalg.matrix_norm(w.double(), ord="nuc").item(),
                "nuclear_at_margin": nam if math.isfinite(nam) else None})  # None: a fact still misclassified

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)  # plain full-batch gradient descent


class TransformerArms(L.LightningModule):
    """One one-layer causal transformer per (arm, seed); loss = CE of the last position's prediction."""

    def __init__(self, arm_names: list[str], train_masks: torch.Tensor, test_masks: torch.Tensor,
                 model_cfg: TinyTransformerConfig, lr: float, weight_decay: float, seeds: list[int],
                 eval_every: int, rec):
        super().__init__()
        self.arm_names, self.rec = arm_names, rec
        models = []
        for seed in seeds:  # arms with the same seed share one initialization
            torch.manual_seed(seed)
            models.append(TinyTransformer(model_cfg))
        self.models = nn.ModuleList(models)
        self.register_buffer("train_masks", train_masks)
        self.register_buffer("test_masks", test_masks)
        self.lr, self.weight_decay, self.eval_every = lr, weight_decay, eval_every
        self.history: list[dict] = []

    def training_step(self, batch, step):
        if self.global_step % self.eval_every == 0:
            self.record(batch)
        total = 0.0
        for k, model in enumerate(self.models):
            rows = self.train_masks[k]
            h = model.hidden(batch["tokens"][rows])[:, -1]  # (N, C) last position
            total = total + self.rec.call(KERNEL, linear_cross_entropy, h, model.unembed, batch["target"][rows])
        return total

    def on_train_batch_start(self, batch, batch_idx):
        self.last_batch = batch

    def on_train_end(self):
        self.record(self.last_batch)

    @torch.no_grad()
    def record(self, batch) -> None:
        for k, (name, model) in enumerate(zip(self.arm_names, self.models)):
            test = self.test_masks[k]
            pred = model(batch["tokens"][test])[:, -1].argmax(-1)
            acc = (pred == batch["target"][test]).float().mean().item()
            self.history.append({"world": "main", "step": int(self.global_step), "arm": name,
                                 "reverse_acc": acc})

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)


def load_arm_models(state_path, arms: list[dict], build, device: torch.device) -> list[tuple[dict, nn.Module]]:
    """Rebuild each arm's module from a saved *Arms state dict (keys models.<k>.*)."""
    state = torch.load(state_path, map_location=device, weights_only=True)
    out = []
    for k, arm in enumerate(arms):
        model = build(arm)
        prefix = f"models.{k}."
        model.load_state_dict({key[len(prefix):]: v for key, v in state.items() if key.startswith(prefix)})
        out.append((arm, model.to(device).eval()))
    return out
