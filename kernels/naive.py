"""Naive baselines for ``python -m kernels.bench``: each kernel's torch reference, one item at a time.

The CPU column of the bench table asks what the vectorized torch reference buys over the code one
writes first: a Python loop over the items (problems, rows, point-cloud pairs, sequences, columns)
calling the same math on one item at a time. For a benchmark case ``(label, make, kernel, reference,
bytes, flops)`` the naive baseline calls ``reference`` on each item's slice (``narrow(dim, i, 1)`` of
the per-item arguments; the shared ones whole) and concatenates the outputs along the item dim,
so it computes the same outputs with N calls instead of one (``tests/kernels/test_bench_naive.py``
checks that on every small case). For cases that run forward+backward of a loss averaged over the
items, the per-item losses' gradients accumulate to the same gradients up to one positive factor
(the number of items in the mean); the work is the same. A kernel whose items are coupled (InfoNCE:
every row needs every column) gets a hand-written loop instead.

Every kernel module with ``BENCHMARKS`` needs an entry here (a test checks it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch


def _cat(outs: list[Any], dim: int) -> Any:
    first = outs[0]
    if first is None:
        return None
    if isinstance(first, torch.Tensor):
        return torch.stack(outs) if first.dim() <= dim else torch.cat(outs, dim)
    if isinstance(first, dict):
        return {k: _cat([o[k] for o in outs], dim) for k in first}
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(_cat([o[i] for o in outs], dim) for i in range(len(first))))
    if isinstance(first, (tuple, list)):
        return type(first)(_cat([o[i] for o in outs], dim) for i in range(len(first)))
    return outs


@dataclass(frozen=True)
class PerItem:
    """Loop ``reference`` over items: ``args`` are the per-item positional arguments (None: every
    tensor argument), sliced along ``dim``; outputs are concatenated along ``out_dim`` (default dim)."""

    args: tuple[int, ...] | None = None
    dim: int = 0
    out_dim: int | None = None

    def items(self, inputs: tuple) -> list[int]:
        return [j for j, x in enumerate(inputs) if isinstance(x, torch.Tensor)] if self.args is None else list(self.args)

    def __call__(self, reference: Callable[..., Any]) -> Callable[..., Any]:
        def naive(*inputs: Any) -> Any:
            idx = self.items(inputs)
            n = inputs[idx[0]].shape[self.dim]
            outs = []
            for i in range(n):
                sliced = [x.narrow(self.dim, i, 1) if j in idx else x for j, x in enumerate(inputs)]
                outs.append(reference(*sliced))
            return _cat(outs, self.dim if self.out_dim is None else self.out_dim)
        return naive


def _infonce_loop(reference: Callable[..., Any]) -> Callable[..., Any]:
    """Symmetric InfoNCE, one row and one column at a time (rows are coupled through the columns)."""
    def naive(a: torch.Tensor, b: torch.Tensor, s: torch.Tensor) -> None:
        n = a.shape[0]
        row = [torch.logsumexp(s * (a[i] @ b.T), 0) - s * (a[i] @ b[i]) for i in range(n)]
        col = [torch.logsumexp(s * (a @ b[j]), 0) - s * (a[j] @ b[j]) for j in range(n)]
        (0.5 * (torch.stack(row).mean() + torch.stack(col).mean())).backward()
    return naive


# kernel module -> how to build its naive baseline from a case's reference
NAIVE: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "batched_lasso": PerItem((0, 1, 2)),            # one Lasso problem at a time
    "cauchy_apply": PerItem((5,), dim=1),           # C^T x for one column x of X at a time
    "chamfer": PerItem((0, 1)),                     # one point-cloud pair at a time
    "cosine_soft_ce": PerItem((0, 2)),              # one query row (and its targets) at a time
    "fair_round_step": PerItem(),                   # one bandit instance at a time
    "ftrl_dynamics": PerItem((0, 1, 2, 3, 4)),      # one game at a time
    "fused_infonce": _infonce_loop,                 # rows and columns in Python loops
    "fused_linear_ce": PerItem((0, 2)),             # one token row at a time
    "gawr_loss": PerItem(),                         # one transition at a time
    "ghost_countsketch": PerItem((0, 1)),           # one example's gradient sketch at a time
    "lowrank_attention": PerItem((0, 1, 3)),        # one decode sequence at a time
    "paged_decode_attention": PerItem((0, 3, 4)),   # one sequence's block table at a time
    "quantifier_eval": PerItem((1,), out_dim=1),    # one candidate formula at a time
    "rolled_patchify": PerItem(),                   # one field at a time
    "segmented_compare": PerItem((0, 1, 2)),        # one screenshot pair at a time
    "token_logprob": PerItem(),                     # one token row at a time
}


def naive_baseline(module: str, reference: Callable[..., Any]) -> Callable[..., Any] | None:
    build = NAIVE.get(module)
    return None if build is None else build(reference)
