"""Synthesizer (C, optional in the card): a small neural ranker of productions guiding enumeration.

    feats = production_features(inst)            # (N_RANKED, F): per production, how well its
                                                 # depth-1 formulas already agree with the labels
    model = ProductionRanker(); fit with make_trainer(...)   # LightningModule, BCE on usage labels
    penalty = penalties(model.probabilities(feats))          # integer extra cost per production
    synthesize(inst, penalty=penalty)            # enumeration by AST size + penalties

ALGO (learned weighted bottom-up enumeration, in the spirit of probabilistic-grammar-guided
enumerators): the ranked vocabulary is the 4 atoms and the 9 guards under ∃ and under ∀. For an
instance, production p gets features from the signatures of its depth-1 formulas (computed with
the quantifier kernel): best and mean label agreement |acc - 1/2|, positive rate, plus the regime.
A shared MLP with a production embedding scores P(p is used by the solution); it is trained on
the productions used by the enumerator's solutions of the training split. The enumeration cost of
p becomes size(p) + floor(-log2(P(p) / max_q P(q))) (capped), so likely productions are tried
earlier; every production stays available, so the search remains complete.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

import lightning as L

from stages.induction.bitset import ENUM_GUARDS, BitContext, unpack
from stages.induction.enumerate import ATOMS, N_RANKED, make_context
from stages.induction.instances import REGIMES, Instance

N_FEATURES = 4 + len(REGIMES)


def _agreement(ctx: BitContext, sigs: np.ndarray, inst: Instance, plane: int) -> tuple[np.ndarray, np.ndarray]:
    """(acc, positive rate) of each signature row against the labels of the labelled worlds."""
    W = ctx.W
    acc = np.zeros(len(sigs))
    pos = np.zeros(len(sigs))
    total = 0
    for k, w in enumerate(inst.worlds):
        if w.kind != "yes":
            continue
        bits = unpack(sigs[:, plane * W + k], w.domain)                  # (N, D)
        acc += (bits == w.labels[None]).sum(1)
        pos += bits.sum(1)
        total += w.domain
    return acc / total, pos / total


def production_features(inst: Instance, seed: int = 0) -> np.ndarray:
    """(N_RANKED, N_FEATURES) float32 features of every ranked production for this instance."""
    ctx = make_context(inst, completions=1, seed=seed)
    plane = 2 if ctx.three_valued else 0            # EC: a sampled completion is a concrete world
    regime = np.eye(len(REGIMES))[REGIMES.index(inst.regime)]
    rows = []
    atom_sigs = np.stack([ctx.atoms[name] for name, _ in ATOMS])
    acc, pos = _agreement(ctx, atom_sigs, inst, plane)
    for a, p in zip(acc, pos):
        sep = abs(a - 0.5) * 2
        rows.append([sep, sep, a, p])
    fillers = np.stack([ctx.atoms["P"], ctx.atoms["Q"], ctx.neg(ctx.atoms["P"]), ctx.neg(ctx.atoms["Q"]), ctx.dom])
    for mode in ("exists", "forall"):
        out = ctx.quantify(list(ENUM_GUARDS), fillers, mode)             # (9, 5, Wtot), one kernel call
        for gi in range(len(ENUM_GUARDS)):
            acc, pos = _agreement(ctx, out[gi], inst, plane)
            sep = np.abs(acc - 0.5) * 2
            best = int(np.argmax(sep))
            rows.append([sep[best], sep.mean(), acc[best], pos[best]])
    feats = np.concatenate([np.array(rows), np.tile(regime, (N_RANKED, 1))], axis=1)
    return feats.astype(np.float32)


def usage_vector(productions: tuple[int, ...]) -> np.ndarray:
    y = np.zeros(N_RANKED, dtype=np.float32)
    y[list(productions)] = 1.0
    return y


class ProductionRanker(L.LightningModule):
    """score(p | instance) = MLP([embedding(p), features(p)]) -> logit of 'p is used'."""

    def __init__(self, hidden: int = 32, embed: int = 8, lr: float = 1e-2, weight_decay: float = 1e-4):
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(N_RANKED, embed)
        self.mlp = nn.Sequential(nn.Linear(embed + N_FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, feats: torch.Tensor) -> torch.Tensor:           # (B, N_RANKED, F) -> (B, N_RANKED)
        e = self.embed.weight.unsqueeze(0).expand(feats.shape[0], -1, -1)
        return self.mlp(torch.cat([e, feats], dim=-1)).squeeze(-1)

    def training_step(self, batch, batch_idx):
        feats, used = batch
        loss = nn.functional.binary_cross_entropy_with_logits(self(feats), used)
        self.log("train/bce", loss, prog_bar=True, on_step=False, on_epoch=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)

    @torch.no_grad()
    def probabilities(self, feats: np.ndarray) -> np.ndarray:
        self.eval()
        return torch.sigmoid(self(torch.from_numpy(feats)[None]))[0].numpy()


def penalties(probs: np.ndarray, max_penalty: int = 3) -> np.ndarray:
    """Integer extra cost per production: floor(-log2(p / max p)), capped."""
    rel = np.clip(probs / max(probs.max(), 1e-12), 1e-12, 1.0)
    return np.minimum(np.floor(-np.log2(rel)), max_penalty).astype(np.int64)
