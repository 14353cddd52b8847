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

Seeds train as one vectorized ensemble (``NodeTaskEnsemble``, stages/common/ensemble.py) or one by one
(``NodeTask``): the same computation per seed, equal to float rounding over short runs (tests/l2g_net/test_ensemble.py);
over the stage's 300 steps the rounding differences grow in some kinds (ChebNet, GIN) as they grow between any two
builds (a 1e-7 nudge of a solo run's initialization drifts alike). Two things make the ensemble possible:
- the graph's operators (part bases, Cauchy chain, dense GFT basis, sparse propagation matrices) are
  ``GraphConstants``, not parameters or buffers: every member shares one copy, so under vmap a product
  ``chain @ h`` is one GEMM over the members' stacked columns, and a sparse product one CSR matmul;
- dropout masks are drawn outside the forward from a per-seed generator (``draw_dropout_masks``) and
  handed in (``dropout_masks``), so a seed's masks are the same in both modes (vmap refuses random ops).
"""
from __future__ import annotations

import copy
import math
import warnings
from functools import partial

import lightning as L
import numpy as np
import scipy.sparse as sp
import torch
import torch.nn as nn
import torch.nn.functional as F
from scipy.interpolate import BSpline
from sklearn.metrics import roc_auc_score

from stages.common.ensemble import EnsembleModule, solo_model

DTYPE = torch.float32


# --------------------------------------------------------------------------------------------
# graph constants and planned dropout (what lets the seeds of a model run as one ensemble)
# --------------------------------------------------------------------------------------------
class GraphConstants(nn.Module):
    """A module holding fixed tensors of the graph (not learned, not saved with the weights) outside its
    parameters and buffers: an ensemble of members shares them instead of stacking one copy per member.
    ``const(name, like)`` gives the tensor on ``like``'s device and (for floating tensors) dtype, converted once
    per (device, dtype); ``copy.deepcopy`` shares them (they are never written)."""

    def __init__(self):
        super().__init__()
        self._graph: dict[str, torch.Tensor] = {}
        self._graph_cache: dict[tuple, torch.Tensor] = {}

    def set_const(self, name: str, tensor: torch.Tensor) -> None:
        self._graph[name] = tensor
        self._graph_cache = {k: v for k, v in self._graph_cache.items() if k[0] != name}

    def const(self, name: str, like: torch.Tensor) -> torch.Tensor:
        t = self._graph[name]
        dtype = like.dtype if t.is_floating_point() else t.dtype
        if t.device == like.device and t.dtype == dtype:
            return t
        key = (name, like.device, dtype)
        if key not in self._graph_cache:
            with torch.inference_mode(False):     # a first call under inference_mode must not cache an inference
                self._graph_cache[key] = t.to(device=like.device, dtype=dtype)   # tensor that training then saves
        return self._graph_cache[key]

    def __deepcopy__(self, memo):
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        rest = {k: v for k, v in self.__dict__.items() if k not in ("_graph", "_graph_cache")}
        new.__dict__.update(copy.deepcopy(rest, memo))
        new.__dict__.update(_graph=dict(self._graph), _graph_cache={})
        return new


class PlannedDropout(nn.Module):
    """Inverted dropout on (n, width) activations whose keep-mask (0 or 1/(1-p)) is drawn before the forward by
    ``draw_dropout_masks`` and handed in by ``dropout_masks``; without a handed-in mask it is ``F.dropout`` (the
    global RNG). In eval mode, or with p = 0, it is the identity."""

    def __init__(self, p: float, width: int):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout: expected a probability in [0, 1) (got {p})")
        self.p, self.width = float(p), int(width)
        self.mask: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if self.mask is None:
            return F.dropout(x, self.p, True)
        return x * self.mask


def dropout_sites(model: nn.Module) -> list[tuple[str, PlannedDropout]]:
    """The model's dropout modules that draw (p > 0), in module order (the order of the draws)."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, PlannedDropout) and m.p > 0]


def draw_dropout_masks(sites: list[tuple[str, PlannedDropout]], n: int,
                       generator: np.random.Generator) -> dict[str, torch.Tensor]:
    """One forward's keep-masks: for each dropout site (``dropout_sites``, in module order), keep with probability
    1 - p (u < 1 - p, u uniform float32 from ``generator``), shape (n, width), kept entries 1/(1 - p) (inverted
    dropout). numpy's PCG64 draws them ~4x faster than torch's CPU bernoulli_ (~70 vs ~290 us for 576 x 32),
    which at these sizes costs as much as the layer itself."""
    masks = {}
    for name, m in sites:
        keep = 1.0 - m.p
        u = generator.random((n, m.width), dtype=np.float32)
        masks[name] = torch.from_numpy((u < keep).astype(np.float32) * np.float32(1.0 / keep))
    return masks


class dropout_masks:  # noqa: N801 (a context manager used like a function)
    """``with dropout_masks(model, masks): model(x)``: each named dropout site uses its mask for this forward."""

    def __init__(self, model: nn.Module, masks: dict[str, torch.Tensor]):
        sites = dict(dropout_sites(model))
        if set(masks) != set(sites):
            raise ValueError(f"dropout masks: expected one per site {sorted(sites)} (got {sorted(masks)})")
        self.pairs = [(sites[name], mask) for name, mask in masks.items()]

    def __enter__(self):
        for site, mask in self.pairs:
            site.mask = mask

    def __exit__(self, *exc):
        for site, _ in self.pairs:
            site.mask = None


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
        self.net = nn.Sequential(nn.Linear(dim * in_mult, dim * hidden_mult, dtype=DTYPE),
                                 PlannedDropout(dropout, dim * hidden_mult), nn.GELU(),
                                 nn.Linear(dim * hidden_mult, dim, dtype=DTYPE), PlannedDropout(dropout, dim))

    def forward(self, x):
        return self.net(x)


# --------------------------------------------------------------------------------------------
# modules
# --------------------------------------------------------------------------------------------
class L2GModule(GraphConstants):
    """One L2G-Net step over precomputed spectral tensors (local bases, Cauchy chain matrix)."""

    def __init__(self, spec: dict, dim: int, num_basis: int, dropout: float,
                 step_local: float = 0.9, step_global: float = 0.1):
        super().__init__()
        lam_max = float(spec["eigenvalues"].max())
        self.sizes = [int(len(p)) for p in spec["parts"]]
        for k, (p, Q) in enumerate(zip(spec["parts"], spec["local_bases"])):
            self.set_const(f"idx{k}", torch.as_tensor(np.asarray(p), dtype=torch.long))
            self.set_const(f"U{k}", torch.tensor(Q, dtype=DTYPE))
        self.set_const("chain", torch.tensor(spec["chain"], dtype=DTYPE))           # (n, n) basis_cauchy
        self.local = nn.ModuleList(
            SplineBank(bspline_design(lam, num_basis, max(float(np.max(lam)), 1e-12)), dim, "band_pass")
            for lam in spec["local_eigenvalues"])
        self.glob = SplineBank(bspline_design(spec["eigenvalues"], num_basis, lam_max), dim, "high_pass")
        self.local_gate = nn.Parameter(torch.full((len(self.sizes),), _logit(step_local), dtype=DTYPE))
        self.global_gate = nn.Parameter(torch.tensor(_logit(step_global), dtype=DTYPE))
        self.ff = FeedForward(dim, dropout)
        self.drop = PlannedDropout(dropout, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # x: (n, h)
        blocks = []
        for k in range(len(self.sizes)):
            idx, U = self.const(f"idx{k}", x), self.const(f"U{k}", x)
            hat = U.T @ x[idx]                                               # local GFT
            blocks.append(hat + torch.sigmoid(self.local_gate[k]) * self.local[k]() * hat)
        chain = self.const("chain", x)
        g = chain @ torch.cat(blocks, dim=0)                                 # Cauchy chain -> global spectrum
        g = self.glob() * g                                                  # global spline filter
        back = chain.T @ g
        xf = torch.empty_like(x)
        off = 0
        for k, m in enumerate(self.sizes):
            xf = xf.index_copy(0, self.const(f"idx{k}", x), self.const(f"U{k}", x) @ back[off:off + m])
            off += m
        xf = self.drop(xf)
        return self.ff(F.silu(xf) * torch.sigmoid(self.global_gate) + x)


class FullGFTModule(GraphConstants):
    """The same global filter bank on the dense eigh basis (no local stage)."""

    def __init__(self, spec: dict, dim: int, num_basis: int, dropout: float, step_global: float = 0.1):
        super().__init__()
        self.set_const("U", torch.tensor(spec["U"], dtype=DTYPE))
        self.glob = SplineBank(bspline_design(spec["lam"], num_basis, float(spec["lam"].max())), dim, "high_pass")
        self.global_gate = nn.Parameter(torch.tensor(_logit(step_global), dtype=DTYPE))
        self.ff = FeedForward(dim, dropout)
        self.drop = PlannedDropout(dropout, dim)

    def forward(self, x):
        U = self.const("U", x)
        xf = self.drop(U @ (self.glob() * (U.T @ x)))
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
    per-call transpose and coalesce of torch.sparse.mm's backward (~10x slower per call at n = 576). Under vmap
    (the seeds of an ensemble) the members' x (B, n, f) are one (n, B*f) operand: one CSR matmul for all."""

    @staticmethod
    def forward(S, ST, x):
        return S @ x

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.ST = inputs[1]

    @staticmethod
    def backward(ctx, g):
        return None, None, ctx.ST @ g

    @classmethod
    def apply(cls, S, ST, x):
        # torch's Function.apply binds the arguments through inspect.signature on every call of a Function with
        # setup_context (~40 us, as much as the product at n = 576; ChebNet-20 makes 76 calls a step); outside
        # vmap/grad transforms it then calls the C++ apply, which this calls directly (positional arguments, no
        # defaults to bind). Under a transform (the ensemble's vmap) torch's own path runs the vmap rule below.
        if torch._C._are_functorch_transforms_active():
            return super().apply(S, ST, x)
        return super(torch.autograd.Function, cls).apply(S, ST, x)

    @staticmethod
    def vmap(info, in_dims, S, ST, x):
        if in_dims[0] is not None or in_dims[1] is not None:
            raise ValueError("a sparse operator is a graph constant, shared by every member: it cannot be batched")
        x = x.movedim(in_dims[2], 1)                       # (n, B, ...)
        n, B = x.shape[0], x.shape[1]
        y = _SpMM.apply(S, ST, x.reshape(n, -1))           # (n, B*f): the members' columns side by side
        return y.reshape(n, B, *x.shape[2:]), 1


class SparseOperator(GraphConstants):
    """A fixed sparse (n, n) operator S (CSR) applied as S @ x; S and S^T are graph constants (rebuilt from the
    graph, not saved with the weights; shared by the members of an ensemble)."""

    def __init__(self, M):
        super().__init__()
        self.set_const("S", _csr(M))
        self.set_const("ST", _csr(sp.csr_matrix(M).T))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _SpMM.apply(self.const("S", x), self.const("ST", x), x)


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
        self.drop = PlannedDropout(dropout, dim)
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


def dropout_generator(seed: int) -> np.random.Generator:
    """The generator of a seed's dropout masks: a PCG64 stream of its own (SeedSequence([seed, DROPOUT_STREAM])),
    apart from the initialization's (torch's global RNG after ``manual_seed(seed)``)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, DROPOUT_STREAM])))


DROPOUT_STREAM = 0x64726F70    # "drop"


def node_loss(logits: torch.Tensor, y: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Mean BCE (one logit per node) or cross-entropy (several classes) over the train nodes, as a weighted mean
    with weight = the 0/1 train mask: no boolean indexing, so each member of an ensemble has its own split."""
    if logits.dim() == 1:
        per_node = F.binary_cross_entropy_with_logits(logits, y.to(logits.dtype), reduction="none")
    else:
        per_node = F.cross_entropy(logits, y, reduction="none")
    weight = weight.to(per_node.dtype)
    return (per_node * weight).sum() / weight.sum()


def _param_groups(named, lr: float, mult: float) -> list[dict]:
    """AdamW groups: the spline coefficients at lr * mult, every other parameter at lr."""
    named = list(named)
    spectral = [p for n, p in named if n.endswith("coeffs")]
    groups = [{"params": [p for n, p in named if not n.endswith("coeffs")], "lr": lr}]
    if spectral:
        groups.append({"params": spectral, "lr": lr * mult})
    return groups


def _adamw(groups, lr: float, weight_decay: float) -> torch.optim.AdamW:
    # foreach: one fused update over the ~60 small tensors (torch's CPU default loops over them in Python);
    # the same arithmetic (bitwise-equal parameters after 60 steps of an l2g model, checked)
    return torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay, foreach=True)


def _eval_step(task: L.LightningModule) -> int | None:
    """The step just taken when validation is due (every ``eval_every`` steps and at the last step), else None."""
    step = int(task.global_step)
    return step if step % task.eval_every == 0 or step == task.trainer.max_steps else None


class NodeTask(L.LightningModule):
    """One seed's full-graph training (BCE on the train nodes, or cross-entropy for several classes), dropout masks
    from ``dropout_generator(dropout_seed)``; keeps the state with the best validation score (ROC AUC, or accuracy
    for several classes, as Platonov et al.). ``dropout_seed=None``: the global RNG draws the masks."""

    def __init__(self, model: NodeClassifier, x, y, masks: dict, lr: float, weight_decay: float,
                 spectral_lr_mult: float, eval_every: int, dropout_seed: int | None = None):
        super().__init__()
        self.model = model
        self.register_buffer("x", x)
        self.register_buffer("y", y)
        for k, m in masks.items():
            self.register_buffer(f"mask_{k}", m)
        self.lr, self.wd, self.mult, self.eval_every = lr, weight_decay, spectral_lr_mult, eval_every
        self.sites = dropout_sites(model)
        self.generator = None if dropout_seed is None else dropout_generator(dropout_seed)
        self.best = {"val_auc": -1.0, "step": -1, "state": None}
        self.history: list[dict] = []

    def training_step(self, batch, _):
        if self.generator is None:
            logits = self.model(self.x)
        else:
            masks = {name: m.to(self.x) for name, m in draw_dropout_masks(self.sites, self.x.shape[0],
                                                                          self.generator).items()}
            with dropout_masks(self.model, masks):
                logits = self.model(self.x)
        loss = node_loss(logits, self.y, self.mask_train)
        if self.logger is not None:       # train runs without a logger (history below); self.log costs ~1 ms a step
            self.log("train_bce", loss, on_step=True, on_epoch=False, batch_size=1)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        step = _eval_step(self)
        if step is None:
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
        return _adamw(_param_groups(self.model.named_parameters(), self.lr, self.mult), self.lr, self.wd)


def _member_loss(model: NodeClassifier, x, y, weight, masks: dict) -> torch.Tensor:
    with dropout_masks(model, masks):
        logits = model(x)
    return node_loss(logits, y, weight)


class NodeTaskEnsemble(EnsembleModule):
    """The seeds of one (task, model) trained as ONE vectorized ensemble (``stages.common.ensemble``): member k is
    ``NodeTask``'s run of ``seeds[k]`` (its initialization after ``manual_seed``, its split ``masks[...][k]``, its
    dropout masks from ``dropout_generator(seeds[k])``, its AdamW update): the same computation, equal to float
    rounding (which long runs amplify, as between any two builds). The graph
    constants are shared, so each chain/basis product is one GEMM and each sparse product one CSR matmul over the
    members' columns. ``histories[k]`` and ``best[k]`` are member k's, as ``NodeTask``'s ``history`` and ``best``."""

    def __init__(self, make_model, seeds, x, y, masks: dict, lr: float, weight_decay: float, spectral_lr_mult: float,
                 eval_every: int):
        super().__init__(make_model, seeds, optimizer=partial(_adamw, lr=lr, weight_decay=weight_decay),
                         param_groups=partial(_param_groups, lr=lr, mult=spectral_lr_mult))
        S = len(self.ensemble)
        for k, m in masks.items():
            if tuple(m.shape) != (S, x.shape[0]):
                raise ValueError(f"masks[{k!r}]: expected one row per seed, shape ({S}, {x.shape[0]}); "
                                 f"got {tuple(m.shape)}")
            self.register_buffer(f"mask_{k}", m)
        self.register_buffer("x", x)
        self.register_buffer("y", y)
        self.eval_every = eval_every
        self.sites = dropout_sites(solo_model(make_model, self.ensemble.seeds[0]))
        self.generators = [dropout_generator(s) for s in self.ensemble.seeds]
        self.best = [{"val_auc": -1.0, "step": -1, "state": None} for _ in range(S)]
        self.histories: list[list[dict]] = [[] for _ in range(S)]

    def training_step(self, batch, _):
        n = self.x.shape[0]
        draws = [draw_dropout_masks(self.sites, n, g) for g in self.generators]
        masks = {name: torch.stack([d[name] for d in draws]).to(self.x) for name, _ in self.sites}
        losses = self.ensemble.vmap(_member_loss, self.x, self.y, self.mask_train, masks,
                                    shared=(True, True, False, False))
        self.last_losses = losses.detach()
        if self.logger is not None:
            self.log("train_bce_mean", self.last_losses.mean(), on_step=True, on_epoch=False, batch_size=1)
        return losses.sum()                # the sum: member k's gradient is its solo gradient

    def on_train_batch_end(self, outputs, batch, batch_idx):
        step = _eval_step(self)
        if step is None:
            return
        self.ensemble.eval()
        with torch.no_grad():
            logits = self.ensemble(self.x, shared=True)          # (S, n) or (S, n, classes)
        self.ensemble.train()
        for k in range(len(self.ensemble)):
            m = self.mask_val[k]
            val = score(logits[k][m], self.y[m])
            self.histories[k].append({"step": step, "train_bce": float(self.last_losses[k]), "val_auc": val})
            if val > self.best[k]["val_auc"]:
                state = {name: t[k].detach().clone() for name, t in self.ensemble.stacked.state_dict().items()}
                self.best[k] = {"val_auc": val, "step": step, "state": state}
