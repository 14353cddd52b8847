"""The two model families trained on the fact world, as LightningModules.

1. The paper's theoretical one-layer model (uniform attention over [entity, relation]):
       logits = W_O W_V x̄,  x̄ = (e_entity + e_relation)/2            # ALGO: one-layer model, W_OV = W_O W_V
   trained by full-batch gradient descent from a small init; and its unfactorized ablation
       logits = W x̄.
2. A real one-layer causal transformer (the shared TinyTransformer with n_layers=1) that reads
   the sequence [entity, relation] and predicts the target from the last position.

Several independent models ("arms") are held in one module and their losses summed: their
parameters are disjoint and the optimizers act per parameter, so this is exactly the same as
training each arm alone, in one Lightning loop.
"""
from __future__ import annotations

import lightning as L
import torch
import torch.nn as nn
from torch.utils.data import IterableDataset

from kernels.fused_linear_ce import linear_cross_entropy
from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig


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

    def hidden_and_unembed(self, xbar: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(h, U) with logits = h @ U.T, so the loss can run through the fused kernel."""
        if self.factorized:
            return xbar @ self.w_v.T, self.w_o  # (N, d), (V, d)
        return xbar, self.w  # (N, V), (V, V)

    def w_ov(self) -> torch.Tensor:
        """The effective (V, V) map from input token to output logit."""
        return self.w_o @ self.w_v if self.factorized else self.w


class TheoryArms(L.LightningModule):
    """Independent one-layer models trained by full-batch GD, one per (arm, seed)."""

    def __init__(self, arm_names: list[str], arm_masks: torch.Tensor, vocab_size: int, d: int,
                 init_scales: list[float], factorized: list[bool], seeds: list[int], lr: float,
                 eval_every: int, test: dict[str, torch.Tensor]):
        super().__init__()
        self.arm_names = arm_names
        # arms with the same seed share one initialization (a controlled comparison)
        self.models = nn.ModuleList(OneLayerModel(vocab_size, d, s, f, torch.Generator().manual_seed(seed))
                                    for s, f, seed in zip(init_scales, factorized, seeds))
        self.register_buffer("arm_masks", arm_masks)  # (arms, rows) which rows each arm trains on
        self.lr, self.eval_every, self.test = lr, eval_every, test
        self.history: list[dict] = []

    def training_step(self, batch, step):
        total = 0.0
        for k, model in enumerate(self.models):
            rows = self.arm_masks[k]
            h, unembed = model.hidden_and_unembed(batch["xbar"][rows])
            total = total + linear_cross_entropy(h, unembed, batch["target"][rows])  # mean CE per arm
        if self.global_step % self.eval_every == 0:
            self.record(total.item())
        return total

    def on_train_end(self):
        self.record(None)

    @torch.no_grad()
    def record(self, loss: float | None) -> None:
        for name, model in zip(self.arm_names, self.models):
            logits = model.w_ov() @ self.test["xbar"].T  # (V, N_test)
            acc = (logits.argmax(0) == self.test["target"]).float().mean().item()
            self.history.append({"step": int(self.global_step), "arm": name, "reverse_acc": acc,
                                 "nuclear_norm": torch.linalg.matrix_norm(model.w_ov(), ord="nuc").item()})

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)  # plain full-batch gradient descent


class TransformerArms(L.LightningModule):
    """One one-layer causal transformer per arm; loss = CE of the last position's prediction."""

    def __init__(self, arm_names: list[str], arm_masks: torch.Tensor, model_cfg: TinyTransformerConfig,
                 lr: float, weight_decay: float, seeds: list[int], eval_every: int,
                 test: dict[str, torch.Tensor]):
        super().__init__()
        self.arm_names = arm_names
        models = []
        for seed in seeds:  # arms with the same seed share one initialization
            torch.manual_seed(seed)
            models.append(TinyTransformer(model_cfg))
        self.models = nn.ModuleList(models)
        self.register_buffer("arm_masks", arm_masks)
        self.lr, self.weight_decay, self.eval_every, self.test = lr, weight_decay, eval_every, test
        self.history: list[dict] = []

    def training_step(self, batch, step):
        total = 0.0
        for k, model in enumerate(self.models):
            rows = self.arm_masks[k]
            h = model.hidden(batch["tokens"][rows])[:, -1]  # (N, C) last position
            total = total + linear_cross_entropy(h, model.unembed, batch["target"][rows])
        if self.global_step % self.eval_every == 0:
            self.record()
        return total

    def on_train_end(self):
        self.record()

    @torch.no_grad()
    def record(self) -> None:
        for name, model in zip(self.arm_names, self.models):
            pred = model(self.test["tokens"])[:, -1].argmax(-1)
            acc = (pred == self.test["target"]).float().mean().item()
            self.history.append({"step": int(self.global_step), "arm": name, "reverse_acc": acc})

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)


def load_arm_models(state_path, arms: list[dict], build) -> list[tuple[dict, nn.Module]]:
    """Rebuild each arm's module from a saved *Arms state dict (keys models.<k>.*)."""
    state = torch.load(state_path, map_location="cpu", weights_only=True)
    out = []
    for k, arm in enumerate(arms):
        model = build(arm)
        prefix = f"models.{k}."
        model.load_state_dict({key[len(prefix):]: v for key, v in state.items() if key.startswith(prefix)})
        out.append((arm, model.eval()))
    return out
