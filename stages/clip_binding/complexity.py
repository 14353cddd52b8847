"""Binding-function complexity (official approximate_complexity_scenes.py) and additivity (run_probe_suite.py).

Scene embeddings of every ordered 2-object scene (a, b) are regressed from concept ids through four
slot tables E_s (slots: a.c1, a.c2, b.c1, b.c2), trained on scenes whose two objects are both seen and
tested on scenes whose two objects are both unseen:
    mlp      ŷ = W2 ReLU(W1 [E_1(a1); E_2(a2); E_3(b1); E_4(b2)])     (concat-MLP)
    mult     ŷ = W (E_1(a1) ⊙ E_2(a2) ⊙ E_3(b1) ⊙ E_4(b2))            (multiplicative)
    sum_mult ŷ = W [Π_s E_s ; Σ_s E_s]                                  (sum + multiplicative)
    mult_within ŷ = W [E_1(a1) ⊙ E_2(a2) ; E_3(b1) ⊙ E_4(b2)]          (product within each object,
                                                                     official --mult_within_obj as read)
R² = 1 − SSE / SST with SST about the mean of ALL scenes (as the official code). Every regressor of
every encoder is one slice of a batched parameter bank trained full-batch with Adam in one
LightningModule (losses are independent, so the sum trains each exactly as alone).

Additivity: y(a, b) ≈ μ + A_1[a] + A_2[b] (slot-specific object tables), a linear least-squares fit.
"""
from __future__ import annotations

import lightning as L
import numpy as np
import torch
from sklearn.linear_model import Ridge
from torch import nn

FAMILIES = ("mlp", "mult", "sum_mult", "mult_within")


class RegressorBank(L.LightningModule):
    """E encoders × 4 families of slot-table regressors, trained full-batch on (E, n, 4) concept ids."""

    def __init__(self, n_enc: int, v: int, d_out: int, hidden: int, mlp_hidden: int, lr: float,
                 ids: torch.Tensor, y: torch.Tensor, seed: int, test: tuple | None = None, eval_every: int = 50):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        E, S = n_enc, ids.shape[-1]
        rn = lambda *shape, scale=1.0: nn.Parameter(scale * torch.randn(*shape, generator=g))  # noqa: E731
        self.tables = nn.ParameterDict({f: rn(E, S, v, hidden) for f in FAMILIES})
        self.w1 = rn(E, S * hidden, mlp_hidden, scale=(S * hidden) ** -0.5)
        self.b1 = nn.Parameter(torch.zeros(E, 1, mlp_hidden))
        fan = {"mlp": mlp_hidden, "mult": hidden, "sum_mult": 2 * hidden, "mult_within": 2 * hidden}
        self.out_w = nn.ParameterDict({f: rn(E, fan[f], d_out, scale=fan[f] ** -0.5) for f in FAMILIES})
        self.out_b = nn.ParameterDict({f: nn.Parameter(torch.zeros(E, 1, d_out)) for f in FAMILIES})
        self.register_buffer("ids", ids)
        self.register_buffer("y", y)
        self.lr = lr
        self.losses: list[float] = []
        self.test_data, self.eval_every = test, eval_every     # (ids, y, mean_all) for the best-over-evals R²
        self.best_r2 = {f: torch.full((E,), -float("inf")) for f in FAMILIES}

    def slots(self, family: str, ids: torch.Tensor) -> torch.Tensor:
        """(E, n, S) ids -> (E, n, S, h) slot embeddings E_s(id_s)."""
        tab = self.tables[family]                                              # (E, S, v, h)
        E, n, S = ids.shape
        e_idx = torch.arange(E, device=ids.device)[:, None, None]
        s_idx = torch.arange(S, device=ids.device)[None, None, :]
        return tab[e_idx, s_idx, ids]

    def predict(self, family: str, ids: torch.Tensor) -> torch.Tensor:
        z = self.slots(family, ids)                                            # (E, n, S, h)
        if family == "mlp":    # ALGO: concat -> ReLU hidden -> linear
            hid = torch.relu(torch.bmm(z.flatten(2), self.w1) + self.b1)
        elif family == "mult":  # ALGO: product of all slots (across objects) -> linear
            hid = z.prod(2)
        elif family == "sum_mult":  # ALGO: [product, sum] -> linear
            hid = torch.cat([z.prod(2), z.sum(2)], -1)
        else:                   # ALGO: [product of object a's slots ; product of object b's slots] -> linear
            k = z.shape[2] // 2
            hid = torch.cat([z[:, :, :k].prod(2), z[:, :, k:].prod(2)], -1)
        return torch.bmm(hid, self.out_w[family]) + self.out_b[family]

    def training_step(self, batch, batch_idx):
        loss = sum(((self.predict(f, self.ids) - self.y) ** 2).mean((1, 2)).sum() for f in FAMILIES)
        if batch_idx % 50 == 0:
            self.losses.append(float(loss.detach()))
        if self.test_data is not None and (batch_idx + 1) % self.eval_every == 0:
            with torch.no_grad():   # official reports the best test R² over evals (kept only as a side number)
                ids, y, mean_all = self.test_data
                for f in FAMILIES:
                    r2 = r2_score(y, self.predict(f, ids), mean_all).cpu()
                    self.best_r2[f] = torch.maximum(self.best_r2[f], r2)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)


def r2_score(y: torch.Tensor, pred: torch.Tensor, mean_all: torch.Tensor) -> torch.Tensor:
    """Per encoder: 1 − Σ(y−ŷ)² / Σ(y−ȳ_all)²; y, pred (E, n, d), mean_all (E, 1, d)."""
    return 1 - ((y - pred) ** 2).sum((1, 2)) / ((y - mean_all) ** 2).sum((1, 2)).clamp_min(1e-12)


def pair_ids(world, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Object pairs -> (n, 2k) concept ids, slot order a.c1..a.ck, b.c1..b.ck."""
    return torch.cat([world.concepts(a), world.concepts(b)], -1)


def additivity_r2(y: np.ndarray, a: np.ndarray, b: np.ndarray, n_objects: int, test_mask: np.ndarray,
                  alpha: float) -> float:
    """ALGO: y(a,b) ≈ μ + A_1[a] + A_2[b]; R² on held-out scenes (SST about the mean of all scenes)."""
    X = np.zeros((len(a), 2 * n_objects))
    X[np.arange(len(a)), a] = 1.0
    X[np.arange(len(a)), n_objects + b] = 1.0
    fit = Ridge(alpha=alpha).fit(X[~test_mask], y[~test_mask])
    pred = fit.predict(X[test_mask]).reshape(y[test_mask].shape)   # sklearn returns (n,) for a (n, 1) target
    sst = ((y[test_mask] - y.mean(0)) ** 2).sum()
    return float(1 - ((y[test_mask] - pred) ** 2).sum() / max(sst, 1e-12))


def additive_code_r2(y: np.ndarray, vals: np.ndarray, v: int, alpha: float) -> float:
    """ALGO (diagnostic): R² of an additive code y(o) ≈ μ + Σ_c A_c[value_c(o)], fitted by ridge on every row
    (in-sample: it describes the code, it does not test generalisation). y (n, d), vals (n, k) ints in [0, v)."""
    n, k = vals.shape
    X = np.zeros((n, k * v))
    for c in range(k):
        X[np.arange(n), c * v + vals[:, c]] = 1.0
    pred = Ridge(alpha=alpha).fit(X, y).predict(X).reshape(y.shape)
    sst = ((y - y.mean(0)) ** 2).sum()
    return float(1 - ((y - pred) ** 2).sum() / max(sst, 1e-12))

