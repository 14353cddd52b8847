"""L2G-Net (the paper's model, as the official code builds it) and its baselines, + a LightningModule.

One graph, node classification (transductive): x (n, features) -> one logit per node.

Skeleton shared by every model (Platonov et al.'s heterophily benchmark code, which the official
L2G-Net training reuses):  x -> Linear -> dropout -> GELU -> [x + s * Module(LayerNorm(x))] x layers
-> LayerNorm -> Linear(1), with s a learnable residual step.

# ALGO: L2G-Net module (official SGWTModule; Eq. 10 of the paper for the global transform)
    x_hat_p  = U_p^T x[part p]                      local GFT of each part
    x_hat_p <- x_hat_p + sigmoid(a_p) * (B_p c_p) (.) x_hat_p     local spline filter bank, gated step
    g        = C (x_hat_1; ...; x_hat_P)            Cauchy chain C = P C_K^T G_K^T ... (basis_cauchy)
    g       <- (B c) (.) g                          global spline filter bank on the global spectrum
    x_f[part p] = U_p (C^T g)[part p]               inverse transform
    x       <- FF( SiLU(x_f) * sigmoid(b) + x )     sigmoid-gated residual step, feed-forward module
with B = cubic B-splines on lambda / lambda_max (uniform knots), c (S, 1) learned coefficients and a
per-channel combinator (1, h). Baselines swap the module: full-GFT (same filters on the dense eigh
basis, no local stage), ChebNet (K Chebyshev terms), GCN (sym-normalized A + I), GIN ((1+eps) x + A x),
each followed by the same feed-forward module.
"""
from __future__ import annotations

import copy
import math
import warnings

import lightning as L
import numpy as np
import scipy.sparse as sp
import torch
import torch.nn as nn
import torch.nn.functional as F
from scipy.interpolate import BSpline
from sklearn.metrics import roc_auc_score

DTYPE = torch.float32


# --------------------------------------------------------------------------------------------
# spectral filter banks
# --------------------------------------------------------------------------------------------
def bspline_design(lam: np.ndarray, num_basis: int, lam_max: float, degree: int = 3) -> np.ndarray:
    """B-spline basis (len(lam), num_basis) on u = lam / lam_max in [0, 1], uniform knots (official)."""
    u = np.clip(np.asarray(lam, float) / max(lam_max, 1e-12), 0.0, 1.0)
    inner = np.linspace(0.0, 1.0, num_basis - degree + 1)
    knots = np.concatenate([[0.0] * degree, inner, [1.0] * degree])
    return BSpline.design_matrix(u, knots, degree, extrapolate=True).toarray()


def _init_shape(num_basis: int, mode: str) -> torch.Tensor:
    x = torch.linspace(0, 1, num_basis)
    if mode == "high_pass":
        return x ** 2
    if mode == "low_pass":
        return (1 - x) ** 2
    return torch.exp(-((x - 0.5) ** 2) / 0.1)       # band_pass


class SplineBank(nn.Module):
    """Response r(lambda) = B(lambda) c w: B fixed (m, S), c (S, 1) shape, w (1, h) per channel."""

    def __init__(self, design: np.ndarray, dim: int, init: str):
        super().__init__()
        self.register_buffer("design", torch.tensor(design, dtype=DTYPE))
        self.coeffs = nn.Parameter(_init_shape(design.shape[1], init)[:, None].to(DTYPE))
        self.combinator = nn.Parameter(torch.ones(1, dim, dtype=DTYPE))

    def forward(self) -> torch.Tensor:
        return self.design @ self.coeffs @ self.combinator   # (m, h)


def _logit(p: float) -> float:
    return math.log(p / (1 - p))


class FeedForward(nn.Module):
    def __init__(self, dim: int, dropout: float, in_mult: int = 1, hidden_mult: int = 1):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim * in_mult, dim * hidden_mult, dtype=DTYPE), nn.Dropout(dropout),
                                 nn.GELU(), nn.Linear(dim * hidden_mult, dim, dtype=DTYPE), nn.Dropout(dropout))

    def forward(self, x):
        return self.net(x)


# --------------------------------------------------------------------------------------------
# modules
# --------------------------------------------------------------------------------------------
class L2GModule(nn.Module):
    """One L2G-Net step over precomputed spectral tensors (local bases, Cauchy chain matrix)."""

    def __init__(self, spec: dict, dim: int, num_basis: int, dropout: float,
                 step_local: float = 0.9, step_global: float = 0.1):
        super().__init__()
        lam_max = float(spec["eigenvalues"].max())
        self.sizes = [int(len(p)) for p in spec["parts"]]
        for k, (p, Q, lam) in enumerate(zip(spec["parts"], spec["local_bases"], spec["local_eigenvalues"])):
            self.register_buffer(f"idx{k}", torch.as_tensor(np.asarray(p), dtype=torch.long))
            self.register_buffer(f"U{k}", torch.tensor(Q, dtype=DTYPE))
        self.register_buffer("chain", torch.tensor(spec["chain"], dtype=DTYPE))     # (n, n) basis_cauchy
        self.local = nn.ModuleList(
            SplineBank(bspline_design(lam, num_basis, max(float(np.max(lam)), 1e-12)), dim, "band_pass")
            for lam in spec["local_eigenvalues"])
        self.glob = SplineBank(bspline_design(spec["eigenvalues"], num_basis, lam_max), dim, "high_pass")
        self.local_gate = nn.Parameter(torch.full((len(self.sizes),), _logit(step_local), dtype=DTYPE))
        self.global_gate = nn.Parameter(torch.tensor(_logit(step_global), dtype=DTYPE))
        self.ff = FeedForward(dim, dropout)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # x: (n, h)
        blocks = []
        for k in range(len(self.sizes)):
            idx, U = getattr(self, f"idx{k}"), getattr(self, f"U{k}")
            hat = U.T @ x[idx]                                               # local GFT
            blocks.append(hat + torch.sigmoid(self.local_gate[k]) * self.local[k]() * hat)
        g = self.chain @ torch.cat(blocks, dim=0)                            # Cauchy chain -> global spectrum
        g = self.glob() * g                                                  # global spline filter
        back = self.chain.T @ g
        xf = torch.empty_like(x)
        off = 0
        for k, m in enumerate(self.sizes):
            xf = xf.index_copy(0, getattr(self, f"idx{k}"), getattr(self, f"U{k}") @ back[off:off + m])
            off += m
        xf = self.drop(xf)
        return self.ff(F.silu(xf) * torch.sigmoid(self.global_gate) + x)


class FullGFTModule(nn.Module):
    """The same global filter bank on the dense eigh basis (no local stage)."""

    def __init__(self, spec: dict, dim: int, num_basis: int, dropout: float, step_global: float = 0.1):
        super().__init__()
        self.register_buffer("U", torch.tensor(spec["U"], dtype=DTYPE))
        self.glob = SplineBank(bspline_design(spec["lam"], num_basis, float(spec["lam"].max())), dim, "high_pass")
        self.global_gate = nn.Parameter(torch.tensor(_logit(step_global), dtype=DTYPE))
        self.ff = FeedForward(dim, dropout)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        xf = self.drop(self.U @ (self.glob() * (self.U.T @ x)))
        return self.ff(F.silu(xf) * torch.sigmoid(self.global_gate) + x)


warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")


def _csr(M) -> torch.Tensor:
    M = sp.csr_matrix(M, dtype=np.float64)
    M.sum_duplicates()
    M.sort_indices()
    return torch.sparse_csr_tensor(torch.as_tensor(M.indptr, dtype=torch.long),
                                   torch.as_tensor(M.indices, dtype=torch.long),
                                   torch.as_tensor(M.data, dtype=DTYPE), M.shape, check_invariants=True)


class _SpMM(torch.autograd.Function):
    """y = S x with S sparse (CSR) and constant; dL/dx = S^T dL/dy through the CSR of S^T built once, not the
    per-call transpose and coalesce of torch.sparse.mm's backward (~10x slower per call at n = 576)."""

    @staticmethod
    def forward(ctx, S, ST, x):
        ctx.ST = ST
        return S @ x

    @staticmethod
    def backward(ctx, g):
        return None, None, ctx.ST @ g


class SparseOperator(nn.Module):
    """A fixed sparse (n, n) operator S (CSR) applied as S @ x; S and S^T are kept as non-persistent buffers
    (rebuilt from the graph, not saved with the weights)."""

    def __init__(self, M):
        super().__init__()
        self.register_buffer("S", _csr(M), persistent=False)
        self.register_buffer("ST", _csr(sp.csr_matrix(M).T), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _SpMM.apply(self.S, self.ST, x)

    def __deepcopy__(self, memo):      # CSR tensors have no storage for copy.deepcopy to copy: clone them
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        state = {k: v for k, v in self.__dict__.items() if k != "_buffers"}
        new.__dict__.update(copy.deepcopy(state, memo))
        new._buffers = {k: v.clone() for k, v in self._buffers.items()}
        return new


class PropModule(nn.Module):
    """GCN: FF(A_hat x); GIN: FF((1 + eps) x + A x); ChebNet: FF([T_0(L~) x, ..., T_{K-1}(L~) x])."""

    def __init__(self, kind: str, A: sp.csr_matrix, lam_max: float, dim: int, dropout: float, cheb_k: int):
        super().__init__()
        self.kind = kind
        n = A.shape[0]
        deg = np.asarray(A.sum(axis=1)).ravel()
        if kind == "gcn":
            At = A + sp.eye(n)
            dinv = 1.0 / np.sqrt(np.asarray(At.sum(axis=1)).ravel())
            self.S = SparseOperator(sp.diags(dinv) @ At @ sp.diags(dinv))       # D^-1/2 (A + I) D^-1/2
        elif kind == "gin":
            self.S = SparseOperator(A)
            self.eps = nn.Parameter(torch.zeros((), dtype=DTYPE))
        elif kind == "chebnet":
            dinv = 1.0 / np.sqrt(np.maximum(deg, 1e-12))
            Ln = sp.eye(n) - sp.diags(dinv) @ A @ sp.diags(dinv)
            self.S = SparseOperator(2.0 * Ln / lam_max - sp.eye(n))             # L~ = 2 L / lambda_max - I
        else:
            raise ValueError(f"model kind: expected gcn, gin or chebnet (got {kind!r})")
        self.K = cheb_k if kind == "chebnet" else 1
        self.ff = FeedForward(dim, dropout, in_mult=self.K)

    def forward(self, x):
        if self.kind == "gcn":
            return self.ff(self.S(x))
        if self.kind == "gin":
            return self.ff((1 + self.eps) * x + self.S(x))
        terms = [x]
        if self.K > 1:
            terms.append(self.S(x))
        for _ in range(2, self.K):
            terms.append(2 * self.S(terms[-1]) - terms[-2])                   # Chebyshev recurrence
        return self.ff(torch.cat(terms, dim=1))


class Residual(nn.Module):
    def __init__(self, module: nn.Module, dim: int, step: float = 1.0):
        super().__init__()
        self.norm = nn.LayerNorm(dim, dtype=DTYPE)
        self.module = module
        self.step = nn.Parameter(torch.tensor(step, dtype=DTYPE))

    def forward(self, x):
        return x + self.step * self.module(self.norm(x))


class NodeClassifier(nn.Module):
    """x (n, features) -> one logit per node (binary) or (n, num_targets) logits (multi-class)."""

    def __init__(self, in_features: int, dim: int, modules: list[nn.Module], dropout: float, num_targets: int = 1):
        super().__init__()
        self.inp = nn.Linear(in_features, dim, dtype=DTYPE)
        self.drop = nn.Dropout(dropout)
        self.layers = nn.ModuleList(Residual(m, dim) for m in modules)
        self.out_norm = nn.LayerNorm(dim, dtype=DTYPE)
        self.out = nn.Linear(dim, num_targets, dtype=DTYPE)

    def forward(self, x):
        h = F.gelu(self.drop(self.inp(x)))
        for layer in self.layers:
            h = layer(h)
        out = self.out(self.out_norm(h))
        return out.squeeze(-1) if out.shape[-1] == 1 else out


KINDS = ("l2g", "l2g_exact", "full_gft", "chebnet", "chebnet_long", "gcn", "gin")


def build_model(kind: str, spec: dict, *, in_features: int, dim: int, num_layers: int, num_basis: int,
                dropout: float, cheb_k: int, cheb_k_long: int = 20, num_targets: int = 1) -> NodeClassifier:
    """spec: parts/local_bases/local_eigenvalues/eigenvalues/chain (l2g: the factorization of the cut-sparsified
    Laplacian, the paper's setting), spec["exact"] with the same keys (l2g_exact: every cut edge kept, the basis
    of the true L — the control arm), U/lam (full_gft), A (others). ``chebnet`` uses order ``cheb_k``,
    ``chebnet_long`` order ``cheb_k_long`` (the issue: K up to ~20)."""
    if kind == "l2g":
        mods = [L2GModule(spec, dim, num_basis, dropout) for _ in range(num_layers)]
    elif kind == "l2g_exact":
        mods = [L2GModule(spec["exact"], dim, num_basis, dropout) for _ in range(num_layers)]
    elif kind == "full_gft":
        mods = [FullGFTModule(spec, dim, num_basis, dropout) for _ in range(num_layers)]
    elif kind in ("chebnet", "gcn", "gin"):
        mods = [PropModule(kind, spec["A"], 2.0, dim, dropout, cheb_k) for _ in range(num_layers)]
    elif kind == "chebnet_long":
        mods = [PropModule("chebnet", spec["A"], 2.0, dim, dropout, cheb_k_long) for _ in range(num_layers)]
    else:
        raise ValueError(f"model kind: expected one of {', '.join(KINDS)} (got {kind!r})")
    return NodeClassifier(in_features, dim, mods, dropout, num_targets)


def count_parameters(model: nn.Module) -> int:
    return int(sum(p.numel() for p in model.parameters() if p.requires_grad))


def matched_dim(kind: str, target: int, count) -> int:
    """The hidden width whose parameter count is closest to ``target`` (count(kind, dim) -> params)."""
    lo, hi = 2, 512                        # the count grows with the width: bisect for the crossing
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if count(kind, mid) < target:
            lo = mid
        else:
            hi = mid
    return min((lo, hi), key=lambda d: (abs(count(kind, d) - target), d))


def roc_auc(logits: torch.Tensor, y: torch.Tensor) -> float:
    return float(roc_auc_score(y.detach().cpu().numpy(), logits.detach().float().cpu().numpy()))


def score(logits: torch.Tensor, y: torch.Tensor) -> float:
    """The benchmark's metric: ROC AUC for one logit per node (binary), accuracy for (n, classes) logits."""
    if logits.dim() == 1:
        return roc_auc(logits, y)
    return float((logits.argmax(-1) == y).float().mean())


class NodeTask(L.LightningModule):
    """Full-graph training step (BCE on the train nodes, or cross-entropy for several classes); keeps the
    state with the best validation score (ROC AUC, or accuracy for several classes, as Platonov et al.)."""

    def __init__(self, model: NodeClassifier, x, y, masks: dict, lr: float, weight_decay: float,
                 spectral_lr_mult: float, eval_every: int):
        super().__init__()
        self.model = model
        self.register_buffer("x", x)
        self.register_buffer("y", y)
        for k, m in masks.items():
            self.register_buffer(f"mask_{k}", m)
        self.lr, self.wd, self.mult, self.eval_every = lr, weight_decay, spectral_lr_mult, eval_every
        self.best = {"val_auc": -1.0, "step": -1, "state": None}
        self.history: list[dict] = []

    def training_step(self, batch, _):
        logits = self.model(self.x)
        m = self.mask_train
        if logits.dim() == 1:
            loss = F.binary_cross_entropy_with_logits(logits[m], self.y[m].to(logits.dtype))
        else:
            loss = F.cross_entropy(logits[m], self.y[m])
        if self.logger is not None:       # train runs without a logger (history below); self.log costs ~1 ms a step
            self.log("train_bce", loss, on_step=True, on_epoch=False, batch_size=1)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        step = int(self.global_step)
        if step % self.eval_every and step != self.trainer.max_steps:
            return
        self.model.eval()
        with torch.no_grad():
            logits = self.model(self.x)
        self.model.train()
        val = score(logits[self.mask_val], self.y[self.mask_val])   # ROC AUC (binary) / accuracy
        self.history.append({"step": step, "train_bce": float(outputs["loss"]), "val_auc": val})
        if val > self.best["val_auc"]:
            self.best = {"val_auc": val, "step": step, "state": copy.deepcopy(self.model.state_dict())}

    def configure_optimizers(self):
        spectral = [p for n, p in self.model.named_parameters() if n.endswith("coeffs")]
        other = [p for n, p in self.model.named_parameters() if not n.endswith("coeffs")]
        groups = [{"params": other, "lr": self.lr}]
        if spectral:
            groups.append({"params": spectral, "lr": self.lr * self.mult})
        # foreach: one fused update over the ~60 small tensors (torch's CPU default loops over them in Python);
        # the same arithmetic (bitwise-equal parameters after 60 steps of an l2g model, checked)
        return torch.optim.AdamW(groups, lr=self.lr, weight_decay=self.wd, foreach=True)
