"""L2G-Net and its baselines (full-GFT spectral net, ChebNet, GCN) as torch modules + a LightningModule.

Signals are batched as H of shape (n, B, h): n nodes, B graph signals, h channels.

L2G-Net layer (card):  # ALGO: L2G-Net layer
    H_loc  = U0^T H * r_loc(lambda0)            local spectral filter on each subgraph's eigenvalues
    H_glob = P C_K^T G_K^T ... C_1^T G_1^T H_loc   mix through the Cauchy chain (global spectrum)
    H_filt = U (r_glob(lambda) * H_glob)        global spectral filter, inverse transform
    H'     = H + sigmoid(gamma) * GELU(H_filt W + b)   gated residual
with r(.) = B(.) w: cubic B-splines over a log-warped eigenvalue axis, one coefficient vector per
channel. The full-GFT net is the same layer with a dense eigh basis and no local filter.
"""
from __future__ import annotations

import lightning as L
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from scipy.interpolate import BSpline

from kernels.cauchy_apply import cauchy_apply
from stages.l2g_net.gft import Factorization


# --------------------------------------------------------------------------------------------
# spectral basis functions
# --------------------------------------------------------------------------------------------
def bspline_design(lam: np.ndarray, num_basis: int, lam_max: float) -> np.ndarray:
    """Cubic B-spline basis (len(lam), num_basis) over u = log1p(lam / eps) / log1p(lam_max / eps)."""
    eps = 1e-3 * lam_max
    u = np.clip(np.log1p(np.maximum(lam, 0.0) / eps) / np.log1p(lam_max / eps), 0.0, 1.0)
    degree = 3
    inner = np.linspace(0.0, 1.0, num_basis - degree + 1)
    knots = np.concatenate([[0.0] * degree, inner, [1.0] * degree])
    return BSpline.design_matrix(u, knots, degree, extrapolate=True).toarray()


class SplineFilter(nn.Module):
    """Per-channel spectral response r(lambda) = B(lambda) w, B fixed (n, S), w learned (S, h)."""

    def __init__(self, design: np.ndarray, channels: int):
        super().__init__()
        self.register_buffer("design", torch.tensor(design, dtype=torch.float64))
        self.weight = nn.Parameter(torch.ones(design.shape[1], channels, dtype=torch.float64))

    def forward(self) -> torch.Tensor:
        return self.design @ self.weight  # (n, h)


# --------------------------------------------------------------------------------------------
# the factorized GFT in torch (applies the Cauchy chain through kernels.cauchy_apply)
# --------------------------------------------------------------------------------------------
class TorchGFT(nn.Module):
    """U^T and U of a Factorization, applied to (n, c) tensors; differentiable in the signal."""

    def __init__(self, fact: Factorization, backend: str = "torch"):
        super().__init__()
        self.n = fact.n
        self.backend = backend
        t = lambda a, dt=torch.float64: torch.as_tensor(np.asarray(a), dtype=dt)  # noqa: E731
        self.parts = [t(p, torch.long) for p in fact.parts]
        self.offsets = [int(o) for o in fact.offsets]
        self.bases = [t(Q) for Q in fact.local_bases]
        self.factors = []
        for f in fact.factors:
            self.factors.append({
                "rot": list(zip(f.rot_p.tolist(), f.rot_j.tolist(), f.rot_c.tolist(), f.rot_s.tolist())),
                "idx": t(f.idx, torch.long), "params": [t(v) for v in (f.z, f.d, f.org, f.tau, f.a)]})
        self.order = t(fact.order, torch.long)
        self.eigenvalues = fact.eigenvalues.copy()
        self.local_eigenvalues = fact.local_eigenvalues.copy()  # by position

    def local_t(self, X: torch.Tensor) -> torch.Tensor:
        return torch.cat([Q.T @ X[p] for p, Q in zip(self.parts, self.bases)], dim=0)

    def local_inv(self, Y: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(Y)
        for p, Q, off in zip(self.parts, self.bases, self.offsets):
            out = out.index_copy(0, p, Q @ Y[off:off + p.numel()])
        return out

    @staticmethod
    def _rotate(Y: torch.Tensor, p: int, j: int, c: float, s: float, inverse: bool) -> torch.Tensor:
        yp, yj = Y[p], Y[j]
        if inverse:
            new = torch.stack([c * yp + s * yj, -s * yp + c * yj])
        else:
            new = torch.stack([c * yp - s * yj, s * yp + c * yj])
        return Y.index_copy(0, torch.tensor([p, j]), new)

    def chain_t(self, Y: torch.Tensor) -> torch.Tensor:
        """Local coefficients (positions) -> global spectral coefficients (ascending eigenvalues)."""
        for f in self.factors:
            for p, j, c, s in f["rot"]:
                Y = self._rotate(Y, p, j, c, s, inverse=False)
            if f["idx"].numel():
                Y = Y.index_copy(0, f["idx"], cauchy_apply(*f["params"], Y[f["idx"]], transpose=True,
                                                           backend=self.backend))
        return Y[self.order]

    def chain_inv(self, Y: torch.Tensor) -> torch.Tensor:
        Z = torch.zeros_like(Y).index_copy(0, self.order, Y)
        for f in reversed(self.factors):
            if f["idx"].numel():
                Z = Z.index_copy(0, f["idx"], cauchy_apply(*f["params"], Z[f["idx"]], transpose=False,
                                                           backend=self.backend))
            for p, j, c, s in reversed(f["rot"]):
                Z = self._rotate(Z, p, j, c, s, inverse=True)
        return Z

    def transform(self, X: torch.Tensor) -> torch.Tensor:
        return self.chain_t(self.local_t(X))

    def inverse(self, Y: torch.Tensor) -> torch.Tensor:
        return self.local_inv(self.chain_inv(Y))


# --------------------------------------------------------------------------------------------
# layers and models
# --------------------------------------------------------------------------------------------
class GatedResidual(nn.Module):
    def __init__(self, h: int):
        super().__init__()
        self.mix = nn.Linear(h, h, dtype=torch.float64)
        self.gate = nn.Parameter(torch.zeros(h, dtype=torch.float64))

    def forward(self, H: torch.Tensor, filtered: torch.Tensor) -> torch.Tensor:
        return H + torch.sigmoid(self.gate) * F.gelu(self.mix(filtered))


class L2GLayer(nn.Module):
    def __init__(self, gft: TorchGFT, h: int, num_basis: int, lam_max: float):
        super().__init__()
        self.gft = gft
        self.local = SplineFilter(bspline_design(gft.local_eigenvalues, num_basis, lam_max), h)
        self.glob = SplineFilter(bspline_design(gft.eigenvalues, num_basis, lam_max), h)
        self.res = GatedResidual(h)

    def forward(self, H: torch.Tensor) -> torch.Tensor:  # H: (n, B, h)
        n, B, h = H.shape
        X = self.gft.local_t(H.reshape(n, B * h)).reshape(n, B, h)
        X = X * self.local()[:, None, :]                    # local spectral filter (per subgraph)
        X = self.gft.chain_t(X.reshape(n, B * h)).reshape(n, B, h)   # Cauchy chain -> global spectrum
        X = X * self.glob()[:, None, :]                     # global spectral filter
        X = self.gft.inverse(X.reshape(n, B * h)).reshape(n, B, h)   # back to the nodes
        return self.res(H, X)


class FullGFTLayer(nn.Module):
    """Spectral layer on the dense eigh basis: U (r(lambda) * U^T H)."""

    def __init__(self, U: np.ndarray, lam: np.ndarray, h: int, num_basis: int, lam_max: float):
        super().__init__()
        self.register_buffer("U", torch.tensor(U, dtype=torch.float64))
        self.glob = SplineFilter(bspline_design(lam, num_basis, lam_max), h)
        self.res = GatedResidual(h)

    def forward(self, H: torch.Tensor) -> torch.Tensor:
        X = torch.einsum("ji,jbh->ibh", self.U, H) * self.glob()[:, None, :]
        return self.res(H, torch.einsum("ij,jbh->ibh", self.U, X))


def _sparse(M) -> torch.Tensor:
    coo = M.tocoo()
    idx = torch.tensor(np.vstack([coo.row, coo.col]), dtype=torch.long)
    return torch.sparse_coo_tensor(idx, torch.tensor(coo.data, dtype=torch.float64), coo.shape,
                                   check_invariants=False).coalesce()


def _prop(S: torch.Tensor, H: torch.Tensor) -> torch.Tensor:
    n, B, h = H.shape
    return torch.sparse.mm(S, H.reshape(n, B * h)).reshape(n, B, h)


class ChebLayer(nn.Module):
    """ChebConv: sum_k T_k(L~) H W_k, L~ = 2 L / lambda_max - I (K-1 hops)."""

    def __init__(self, L_scaled: torch.Tensor, h_in: int, h_out: int, K: int):
        super().__init__()
        self.L = L_scaled
        self.lin = nn.ModuleList(nn.Linear(h_in, h_out, bias=(k == 0), dtype=torch.float64) for k in range(K))

    def forward(self, H):
        T_prev, T = H, _prop(self.L, H)
        out = self.lin[0](T_prev)
        if len(self.lin) > 1:
            out = out + self.lin[1](T)
        for k in range(2, len(self.lin)):
            T_prev, T = T, 2 * _prop(self.L, T) - T_prev
            out = out + self.lin[k](T)
        return out


class GCNLayer(nn.Module):
    """GCN: A^ H W with A^ = D~^-1/2 (A + I) D~^-1/2 (one hop)."""

    def __init__(self, A_hat: torch.Tensor, h_in: int, h_out: int):
        super().__init__()
        self.A = A_hat
        self.lin = nn.Linear(h_in, h_out, dtype=torch.float64)

    def forward(self, H):
        return self.lin(_prop(self.A, H))


class NodeRegressor(nn.Module):
    """lift -> layers -> readout, for signals X (n, B, in)."""

    def __init__(self, kind: str, hidden: int, layers: list[nn.Module], in_features: int = 1):
        super().__init__()
        self.kind = kind
        self.lift = nn.Linear(in_features, hidden, dtype=torch.float64)
        self.layers = nn.ModuleList(layers)
        self.readout = nn.Linear(hidden, 1, dtype=torch.float64)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        H = self.lift(X)
        for k, layer in enumerate(self.layers):
            out = layer(H)
            if self.kind in ("chebnet", "gcn"):
                H = F.relu(out) if k < len(self.layers) - 1 else out
            else:
                H = out
        return self.readout(H).squeeze(-1)


def build_model(kind: str, *, fact: Factorization | None, U: np.ndarray | None, lam: np.ndarray | None,
                L, hidden: int, num_layers: int, num_basis: int, cheb_k: int, backend: str = "torch") -> NodeRegressor:
    import scipy.sparse as sp

    lam_max = float(np.max(lam)) if lam is not None else float(fact.eigenvalues.max())
    if kind == "l2g":
        gft = TorchGFT(fact, backend=backend)
        layers = [L2GLayer(gft, hidden, num_basis, lam_max) for _ in range(num_layers)]
    elif kind == "full_gft":
        layers = [FullGFTLayer(U, lam, hidden, num_basis, lam_max) for _ in range(num_layers)]
    elif kind == "chebnet":
        n = L.shape[0]
        Ls = _sparse(2.0 * L / lam_max - sp.eye(n))
        layers = [ChebLayer(Ls, hidden, hidden, cheb_k) for _ in range(num_layers)]
    elif kind == "gcn":
        A = -(L - sp.diags(L.diagonal()))
        A = A + sp.eye(L.shape[0])
        dinv = 1.0 / np.sqrt(np.asarray(A.sum(axis=1)).ravel())
        layers = [GCNLayer(_sparse(sp.diags(dinv) @ A @ sp.diags(dinv)), hidden, hidden) for _ in range(num_layers)]
    else:
        raise ValueError(f"model kind: expected l2g, full_gft, chebnet or gcn (got {kind!r})")
    return NodeRegressor(kind, hidden, layers)


def count_parameters(model: nn.Module) -> int:
    return int(sum(p.numel() for p in model.parameters() if p.requires_grad))


class SignalRegression(L.LightningModule):
    """MSE regression of node targets from node signals; batches of whole-graph signals."""

    def __init__(self, model: NodeRegressor, lr: float, weight_decay: float):
        super().__init__()
        self.model = model
        self.lr = lr
        self.weight_decay = weight_decay
        self.history: list[dict] = []

    def forward(self, S: torch.Tensor) -> torch.Tensor:  # S: (B, n) -> (B, n)
        return self.model(S.T.unsqueeze(-1)).T

    def training_step(self, batch, _):
        S, Y = batch
        loss = F.mse_loss(self(S), Y)
        self.log("train_mse", loss, prog_bar=True, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch, _):
        S, Y = batch
        loss = F.mse_loss(self(S), Y)
        self.log("val_mse", loss, prog_bar=True, on_step=False, on_epoch=True)

    def on_validation_epoch_end(self):
        val = self.trainer.callback_metrics.get("val_mse")
        if val is not None:
            self.history.append({"epoch": int(self.current_epoch), "val_mse": float(val)})

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        steps = max(1, self.trainer.estimated_stepping_batches)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=self.lr, total_steps=int(steps))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def r2_score(pred: torch.Tensor, target: torch.Tensor) -> float:
    return float(1.0 - ((pred - target) ** 2).mean() / ((target - target.mean()) ** 2).mean())

