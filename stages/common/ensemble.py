"""Train the seeds of one arm together: S copies of a model as ONE vectorized ensemble.

On a CPU the models of this project are tiny (d = 32–256), so S solo runs spend most of their time
in Python and per-op dispatch, S times over. ``SeedEnsemble`` stacks the S members' parameters along
a new leading seed dimension and runs the model's own ``forward`` once under
``torch.func.vmap(functional_call)``, so every op runs once on (S, ...) tensors. Member k is built,
fed and updated exactly as a solo run of seed k would be, so its trajectory equals that solo run's
up to float rounding (``tests/common/test_ensemble.py``: parameters and losses after AdamW steps).

Speed (``python -m benchmarks.ensemble``, S = 5, CPU, 1 thread): the gain is the per-op overhead
saved, so it shrinks as the ops grow: ~1.7x less CPU time at d = 32 (T = 16, B = 16), ~1.1x at
d = 64 (T = 32, B = 32), none at d = 128 (T = 64), where the matmuls dominate and the stacked
tensors fall out of cache. Vectorize where models are tiny or per-step Python work is large.

Vectorized seeds
----------------
A paper whose arm trains ``model = make_model(seed)`` on ``DataLoader(data, batch_size=B,
shuffle=True, generator=torch.Generator().manual_seed(seed))`` for each seed adopts it so::

    class Arm(EnsembleModule):                           # a LightningModule
        def member_loss(self, model, batch):             # ONE member, ONE batch, as in a solo run
            logits = model(batch["x"])                   # (B, V): the member's own forward
            return F.cross_entropy(logits, batch["y"])   # scalar
    arm = Arm(make_model, seeds, optimizer=partial(torch.optim.AdamW, lr=3e-3, weight_decay=0.1))
    make_trainer(cfg.trainer, ctx.tracker, max_steps=steps).fit(arm, seed_loader(data, B, seeds))
    models = [arm.ensemble.member(k) for k in range(len(seeds))]   # plain nn.Modules, one per seed

``member_loss`` runs under vmap: no ``self.log`` or ``.item()`` inside it (log from ``last_losses``).
A data order seeded apart from the init seed: ``seed_loader(data, B, [s + 1000 for s in seeds])``.

Building blocks (usable without ``EnsembleModule``):
    ens = SeedEnsemble(make_model, seeds)   # member k = make_model(seeds[k]) after torch.manual_seed(seeds[k])
    ens(x)                                  # x (S, B, ...) -> (S, B, ...): member k's forward on x[k]
    ens(x, shared=True)                     # x (B, ...): the same input for every member
    ens.vmap(lambda m, x: m.hidden(x), x)   # any function of (member module, member inputs)
    ens.member(k) / ens.member_state_dict(k) / ens.load_member_state_dict(k, state)   # export / import
    seed_loader(data, B, seeds)             # batches (S, B, ...): row k in seed k's DataLoader order
    clip_grad_norm_per_member(ens, max_norm)   # each member's own clip_grad_norm_

What keeps member k equal to its solo run (and what breaks it):
- Initialization: the ensemble calls ``make_model(seed)`` right after ``torch.manual_seed(seed)``
  (inside ``torch.random.fork_rng``: the global RNG is left as it was), exactly what ``solo_model``
  does. The factory must draw its randomness from torch's global RNG or from a generator it seeds
  from ``seed`` (not from numpy/python ``random``). Equal seeds give equal members (arms of a seed).
- Loss: the training loss is the SUM of the member losses (each member's gradient is then its own
  solo gradient); a mean would divide every gradient by S.
- Optimizers: only elementwise ones (``ELEMENTWISE_OPTIMIZERS``: SGD (+momentum/nesterov), Adam,
  AdamW, Adamax, NAdam, RAdam, RMSprop, Adagrad, Adadelta, Rprop) with one lr/schedule for all
  members, param groups by parameter name allowed. Not: LBFGS (global line search), LAMB/LARS
  (per-tensor trust ratio), Shampoo/Muon/SOAP (matrix ops over the whole stacked tensor).
- Gradient clipping: per member (``EnsembleModule`` turns the Trainer's ``gradient_clip_val`` into
  ``clip_grad_norm_per_member``); a global norm over the stacked gradients would couple the seeds.
- Randomness inside the forward (dropout > 0, sampling) raises under vmap: solo-equal random
  streams per member are not possible there; draw per-seed masks outside and pass them as inputs.
  BatchNorm with running statistics is refused (use LayerNorm/RMSNorm).
- Custom ``torch.autograd.Function`` kernels (a Triton path) inside the member function need a vmap
  rule; compute per-member tensors under vmap and call such a kernel outside it on (S·B, ...) rows.
- Numerics: vmap runs batched matmuls (bmm) where a solo run runs mm, so results agree to float
  rounding (float32: ~1e-6 relative per step), not bitwise.
- Data-parallel strategies (DDP) replicate the whole ensemble on every rank; the per-seed loader is
  not split across ranks (pass ``use_distributed_sampler=False`` to the Trainer).
"""
from __future__ import annotations

import math
import warnings
from functools import partial
from typing import Any, Callable, Iterator, Mapping, Sequence

import lightning as L
import torch
import torch.nn as nn
from torch.func import functional_call
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, Sampler, SequentialSampler

__all__ = ["SeedEnsemble", "EnsembleModule", "SeedBatchSampler", "seed_loader", "solo_model",
           "clip_grad_norm_per_member", "ELEMENTWISE_OPTIMIZERS"]

ELEMENTWISE_OPTIMIZERS: tuple[type[torch.optim.Optimizer], ...] = (
    torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adamax, torch.optim.NAdam,
    torch.optim.RAdam, torch.optim.RMSprop, torch.optim.Adagrad, torch.optim.Adadelta, torch.optim.Rprop)

_SEED_MIN, _SEED_MAX = -(2**63), 2**64 - 1  # what torch.manual_seed accepts


def _check_seeds(seeds: Sequence[int]) -> tuple[int, ...]:
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Sequence):
        raise TypeError(f"seeds: expected a list of ints (got {type(seeds).__name__})")
    if len(seeds) == 0:
        raise ValueError("seeds: expected at least one seed (got an empty list)")
    for i, s in enumerate(seeds):
        if isinstance(s, bool) or not isinstance(s, int):
            raise TypeError(f"seeds[{i}]: expected an int (got {s!r} of type {type(s).__name__})")
        if not _SEED_MIN <= s <= _SEED_MAX:
            raise ValueError(f"seeds[{i}]: {s} is outside torch.manual_seed's range")
    return tuple(int(s) for s in seeds)


def solo_model(make_model: Callable[[int], nn.Module], seed: int) -> nn.Module:
    """The model a solo run of ``seed`` starts from (what ensemble member ``seed`` starts from)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = make_model(seed)
    if not isinstance(model, nn.Module):
        raise TypeError(f"make_model({seed}) returned {type(model).__name__}, expected an nn.Module")
    return model


def _register(root: nn.Module, name: str, tensor: torch.Tensor, kind: str, persistent: bool = True) -> None:
    """Register ``tensor`` under the dotted ``name`` in a tree of empty modules below ``root``."""
    *path, leaf = name.split(".")
    node = root
    for part in path:
        child = node._modules.get(part)
        if child is None:
            child = nn.Module()
            node.add_module(part, child)
        node = child
    if kind == "param":
        node.register_parameter(leaf, tensor)
    else:
        node.register_buffer(leaf, tensor, persistent=persistent)


class _Bound(nn.Module):
    """Calls ``fn(model, *args)`` so that functional_call can rebind the model's tensors."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(self.model, *args, **kwargs)


def _tensor_leaves(obj: Any, path: str) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            yield from _tensor_leaves(v, f"{path}[{k!r}]")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _tensor_leaves(v, f"{path}[{i}]")


class SeedEnsemble(nn.Module):
    """S members ``make_model(seed)`` with their parameters stacked as (S, *shape) tensors.

    ``stacked`` mirrors the model's module tree, so ``ens.stacked.named_parameters()`` yields the
    model's own parameter names (``blocks.0.attn.qkv.weight``) with a leading seed dimension; the
    optimizer sees only these. The model's code runs on a parameter-free template (meta device).
    """

    def __init__(self, make_model: Callable[[int], nn.Module], seeds: Sequence[int]):
        super().__init__()
        if not callable(make_model):
            raise TypeError(f"make_model: expected a callable seed -> nn.Module (got {type(make_model).__name__})")
        self.seeds = _check_seeds(seeds)
        self.make_model = make_model
        members = [solo_model(make_model, s) for s in self.seeds]
        first = members[0]
        for m in first.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
                raise ValueError(f"{type(m).__name__} with running statistics cannot be vectorized over "
                                 "seeds (its in-place stat updates); use LayerNorm/RMSNorm or "
                                 "track_running_stats=False")
        p0 = dict(first.named_parameters())
        b0 = dict(first.named_buffers())
        non_persistent = {f"{mod_name}.{b}" if mod_name else b
                          for mod_name, mod in first.named_modules() for b in mod._non_persistent_buffers_set}
        for k, m in enumerate(members[1:], start=1):
            for kind, ref, got in (("parameter", p0, dict(m.named_parameters())),
                                   ("buffer", b0, dict(m.named_buffers()))):
                if ref.keys() != got.keys():
                    diff = sorted(set(ref) ^ set(got))
                    raise ValueError(f"member {k} (seed {self.seeds[k]}) has other {kind}s than member 0 "
                                     f"(seed {self.seeds[0]}): {diff[:5]}; make_model must build one architecture")
                for name, t in got.items():
                    r = ref[name]
                    if t.shape != r.shape or t.dtype != r.dtype or t.device != r.device:
                        raise ValueError(f"member {k} (seed {self.seeds[k]}): {kind} {name!r} is "
                                         f"{tuple(t.shape)} {t.dtype} on {t.device} but member 0 has "
                                         f"{tuple(r.shape)} {r.dtype} on {r.device}")
        self.stacked = nn.Module()
        for name, p in p0.items():
            data = torch.stack([dict(m.named_parameters())[name].detach() for m in members])
            _register(self.stacked, name, nn.Parameter(data, requires_grad=p.requires_grad), "param")
        for name in b0:
            data = torch.stack([dict(m.named_buffers())[name].detach() for m in members])
            _register(self.stacked, name, data, "buffer", persistent=name not in non_persistent)
        self.param_names = tuple(p0)
        self.buffer_names = tuple(b0)
        # the template holds no tensors of its own (meta); kept outside the module tree so that
        # .to(device) and state_dict() never see it
        self._bound = [_Bound(first.to("meta"))]

    # ------------------------------------------------------------------ shape of the ensemble
    def __len__(self) -> int:
        return len(self.seeds)

    @property
    def size(self) -> int:
        return len(self.seeds)

    def train(self, mode: bool = True) -> "SeedEnsemble":
        super().train(mode)
        self._bound[0].train(mode)
        return self

    def named_stacked_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """(model parameter name, (S, *shape) parameter): build optimizer param groups from these."""
        return self.stacked.named_parameters()

    # ------------------------------------------------------------------ running the members
    def _check_args(self, args: tuple, shared: Sequence[bool]) -> None:
        S = len(self.seeds)
        for i, (arg, sh) in enumerate(zip(args, shared)):
            if sh:
                continue
            for path, t in _tensor_leaves(arg, f"argument {i}"):
                if t.dim() == 0 or t.shape[0] != S:
                    got = "a scalar" if t.dim() == 0 else f"shape {tuple(t.shape)}"
                    raise ValueError(f"{path}: an ensemble of {S} seeds needs per-seed inputs stacked as "
                                     f"(S={S}, ...), got {got}; pass shared=True for an input every "
                                     "member sees whole")

    def vmap(self, fn: Callable[..., Any], *args: Any, shared: bool | Sequence[bool] = False,
             randomness: str = "error", chunk_size: int | None = None, **kwargs: Any) -> Any:
        """``fn(member_module, *member_args, **kwargs)`` for every member at once.

        Each positional argument (a tensor, or a dict/list/tuple of tensors) is stacked per seed,
        (S, ...), and member k sees its [k] slice, unless ``shared`` (one bool, or one per argument)
        says every member sees it whole. Keyword arguments are passed to every member unchanged.
        Returns fn's outputs with a leading seed dimension.
        """
        flags = [bool(shared)] * len(args) if isinstance(shared, bool) else [bool(s) for s in shared]
        if len(flags) != len(args):
            raise ValueError(f"shared: {len(flags)} flags for {len(args)} arguments")
        self._check_args(args, flags)
        bound = self._bound[0]
        params = {f"model.{n}": t for n, t in self.stacked.named_parameters()}
        buffers = {f"model.{n}": t for n, t in self.stacked.named_buffers()}

        def one(p: dict, b: dict, *member_args: Any) -> Any:
            return functional_call(bound, {**p, **b}, (fn, *member_args), kwargs)

        in_dims = (0, 0, *(None if f else 0 for f in flags))
        vmapped = torch.func.vmap(one, in_dims=in_dims, randomness=randomness, chunk_size=chunk_size)
        try:
            with warnings.catch_warnings():
                # ops without a batching rule (SDPA on CPU) fall back to a per-member loop: correct, just slower
                warnings.filterwarnings("ignore", message=".*performance drop because we have not yet implemented the batching rule.*")
                return vmapped(params, buffers, *args)
        except RuntimeError as err:
            if "randomness" in str(err) or "random operation" in str(err):
                raise RuntimeError("a random op (dropout > 0, sampling) ran inside the ensemble's forward: "
                                   "per-seed random streams equal to solo runs are not possible under vmap; "
                                   "set dropout to 0 or draw per-seed masks outside and pass them as inputs "
                                   f"(vmap said: {err})") from err
            raise

    def forward(self, *args: Any, shared: bool | Sequence[bool] = False, **kwargs: Any) -> Any:
        """Every member's own ``forward``: inputs (S, B, ...) (or shared (B, ...)) -> (S, ...)."""
        return self.vmap(_call_forward, *args, shared=shared, **kwargs)

    # ------------------------------------------------------------------ members as plain modules
    def _index(self, k: int) -> int:
        if isinstance(k, bool) or not isinstance(k, int) or not -len(self) <= k < len(self):
            raise IndexError(f"member {k!r}: the ensemble has members 0..{len(self) - 1} (seeds {list(self.seeds)})")
        return k % len(self)

    def member(self, k: int) -> nn.Module:
        """Member k as a normal module (make_model(seeds[k]) with member k's current tensors)."""
        k = self._index(k)
        model = solo_model(self.make_model, self.seeds[k])
        device = next(iter(self.stacked.parameters()), torch.empty(0)).device
        model = model.to(device)
        with torch.no_grad():
            for name, t in model.named_parameters():
                t.copy_(self.stacked.get_parameter(name)[k])
            for name, t in model.named_buffers():
                t.copy_(self.stacked.get_buffer(name)[k])
        model.train(self.training)
        return model

    def member_state_dict(self, k: int) -> dict[str, torch.Tensor]:
        """Member k's ``state_dict()``, as a solo model of its seed would save it."""
        return self.member(k).state_dict()

    def load_member_state_dict(self, k: int, state: Mapping[str, torch.Tensor]) -> None:
        """Overwrite member k with a solo model's state dict (e.g. seed k's pretrained checkpoint)."""
        k = self._index(k)
        model = solo_model(self.make_model, self.seeds[k])
        model.load_state_dict(state, strict=True)  # names and shapes checked by torch, clear message
        with torch.no_grad():
            for name, t in model.named_parameters():
                self.stacked.get_parameter(name)[k].copy_(t)
            for name, t in model.named_buffers():
                self.stacked.get_buffer(name)[k].copy_(t)


def _call_forward(model: nn.Module, *args: Any, **kwargs: Any) -> Any:
    return model(*args, **kwargs)


# ---------------------------------------------------------------------- per-member gradient clipping
def clip_grad_norm_per_member(ensemble: SeedEnsemble, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` applied to each member separately; returns the (S,) norms.

    Same rule as torch: coef_k = max_norm / (‖g_k‖ + 1e-6), clamped to 1, g_k *= coef_k.
    """
    if not max_norm > 0 or not math.isfinite(max_norm):
        raise ValueError(f"max_norm: expected a positive finite number (got {max_norm})")
    grads = [p.grad for p in ensemble.stacked.parameters() if p.grad is not None]
    S = len(ensemble)
    if not grads:
        return torch.zeros(S)
    per_tensor = torch.stack([torch.linalg.vector_norm(g.reshape(S, -1), norm_type, dim=1) for g in grads])  # (P, S)
    norms = torch.linalg.vector_norm(per_tensor, norm_type, dim=0)  # (S,)
    coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef.to(g.dtype).view(S, *([1] * (g.dim() - 1))))
    return norms


# ---------------------------------------------------------------------- per-seed data order
class SeedBatchSampler(Sampler):
    """Index batches (S, B): row k is the batch a solo run of ``seeds[k]`` would draw now.

    Row k is drawn by the very samplers of ``DataLoader(range(n), batch_size, shuffle=True,
    drop_last=drop_last, generator=torch.Generator().manual_seed(seeds[k]))``: one generator per
    seed, kept across epochs, driving torch's own ``RandomSampler`` + ``BatchSampler``; at the start
    of each epoch (``iter``) it also draws the int64 worker base seed such a DataLoader draws from its
    generator. All S samplers are advanced in lockstep, one ``next`` each per batch, so each one
    draws exactly when its solo DataLoader would (RandomSampler draws one extra permutation when it
    runs out, which a consumer that stops at ``len`` never triggers; Lightning stops at ``len``).
    ``shuffle=False``: every row in order 0..n-1.
    """

    def __init__(self, n: int, batch_size: int, seeds: Sequence[int], shuffle: bool = True, drop_last: bool = False):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n: expected a positive number of items (got {n!r})")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size: expected a positive int (got {batch_size!r})")
        if drop_last and batch_size > n:
            raise ValueError(f"batch_size {batch_size} > {n} items with drop_last: no batch at all")
        self.n, self.batch_size, self.shuffle, self.drop_last = n, batch_size, shuffle, drop_last
        self.seeds = _check_seeds(seeds)
        self.generators = [torch.Generator().manual_seed(s) for s in self.seeds]

    def __len__(self) -> int:
        return self.n // self.batch_size if self.drop_last else -(-self.n // self.batch_size)

    def __iter__(self) -> Iterator[torch.Tensor]:
        # not a generator function: like _BaseDataLoaderIter.__init__, draw the base seeds at iter()
        samplers = []
        for g in self.generators:
            if self.shuffle:
                torch.empty((), dtype=torch.int64).random_(generator=g)
                inner: Sampler = RandomSampler(range(self.n), generator=g)
            else:
                inner = SequentialSampler(range(self.n))
            samplers.append(iter(BatchSampler(inner, self.batch_size, self.drop_last)))
        return self._lockstep(samplers)

    @staticmethod
    def _lockstep(samplers: list[Iterator[list[int]]]) -> Iterator[torch.Tensor]:
        while True:
            rows = [next(it, None) for it in samplers]  # every sampler advances, none is left behind
            if rows[0] is None:
                return
            yield torch.tensor(rows)  # (S, B)


class _Gather(Dataset):
    def __init__(self, data: Any):
        self.data = data

    def __getitem__(self, idx: torch.Tensor) -> Any:
        return _take(self.data, idx)

    def __len__(self) -> int:
        return _length(self.data)


def _take(data: Any, idx: torch.Tensor) -> Any:
    if isinstance(data, torch.Tensor):
        return data[idx]
    if isinstance(data, Mapping):
        return {k: _take(v, idx) for k, v in data.items()}
    return type(data)(_take(v, idx) for v in data)


def _length(data: Any) -> int:
    lengths = {t.shape[0] if t.dim() else None for _, t in _tensor_leaves(data, "data")}
    if not lengths:
        raise TypeError("data: expected a tensor or a dict/list/tuple of tensors")
    if len(lengths) != 1 or None in lengths:
        raise ValueError(f"data: every tensor needs the same first dimension (the items); got {sorted(map(str, lengths))}")
    return lengths.pop()


def seed_loader(data: Any, batch_size: int, seeds: Sequence[int], shuffle: bool = True,
                drop_last: bool = False) -> DataLoader:
    """A DataLoader of per-seed batches: tensors (N, ...) -> (S, B, ...), row k in seed k's order.

    ``data`` is a tensor or a dict/list/tuple of tensors with N items along dim 0 (what a solo run's
    TensorDataset holds). Equal to S solo DataLoaders with ``shuffle=True`` and
    ``generator=torch.Generator().manual_seed(seed)`` (see ``SeedBatchSampler``).
    """
    n = _length(data)
    # own generator: the loader's per-epoch base-seed draw must not move the global RNG
    return DataLoader(_Gather(data), sampler=SeedBatchSampler(n, batch_size, seeds, shuffle, drop_last),
                      batch_size=None, generator=torch.Generator().manual_seed(0))


# ---------------------------------------------------------------------- the Lightning module
class EnsembleModule(L.LightningModule):
    """Trains every member of a ``SeedEnsemble`` with one optimizer over the stacked parameters.

    Subclass and define ``member_loss(model, batch)`` for ONE member and ONE (unstacked) batch, as a
    solo training_step would compute it. Batches come from ``seed_loader`` ((S, B, ...) per tensor),
    or set ``shared_batch = True`` when every member sees the same batch (full-batch GD).
    ``optimizer`` builds the optimizer from parameters (default AdamW, lr 1e-3); pass
    ``param_groups`` (a function of ``ensemble.named_stacked_parameters()``) for per-name groups.
    After each step ``last_losses`` holds the (S,) member losses; ``train/loss_mean`` is logged.
    """

    shared_batch: bool = False

    def __init__(self, make_model: Callable[[int], nn.Module], seeds: Sequence[int],
                 optimizer: Callable[..., torch.optim.Optimizer] = partial(torch.optim.AdamW, lr=1e-3),
                 param_groups: Callable[[Iterator[tuple[str, nn.Parameter]]], Any] | None = None):
        super().__init__()
        self.ensemble = SeedEnsemble(make_model, seeds)
        self.make_optimizer = optimizer
        self.param_groups = param_groups
        self.last_losses: torch.Tensor | None = None

    def member_loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        raise NotImplementedError("define member_loss(model, batch) -> scalar loss of one member")

    def ensemble_losses(self, batch: Any) -> torch.Tensor:
        """(S,) losses: member k's ``member_loss`` on its own batch (or the shared one)."""
        losses = self.ensemble.vmap(self.member_loss, batch, shared=self.shared_batch)
        if not isinstance(losses, torch.Tensor) or losses.shape != (len(self.ensemble),):
            shape = tuple(losses.shape[1:]) if isinstance(losses, torch.Tensor) else type(losses).__name__
            raise ValueError(f"member_loss must return a scalar tensor per member (got {shape})")
        return losses

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        losses = self.ensemble_losses(batch)
        self.last_losses = losses.detach()
        self.log("train/loss_mean", self.last_losses.mean(), prog_bar=True)
        return losses.sum()  # the sum: member k's gradient is exactly its solo gradient

    def configure_optimizers(self) -> torch.optim.Optimizer:
        named = self.ensemble.named_stacked_parameters()
        params = self.param_groups(named) if self.param_groups is not None else [p for _, p in named]
        opt = self.make_optimizer(params)
        if not isinstance(opt, ELEMENTWISE_OPTIMIZERS):
            raise ValueError(f"{type(opt).__name__} is not elementwise: over stacked parameters it would couple "
                             f"the seeds; use one of {[c.__name__ for c in ELEMENTWISE_OPTIMIZERS]}")
        return opt

    def configure_gradient_clipping(self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None,
                                    gradient_clip_algorithm: str | None = None) -> None:
        if gradient_clip_val is None or gradient_clip_val == 0:
            return
        if gradient_clip_algorithm == "value":  # elementwise: equal to each solo run's
            torch.nn.utils.clip_grad_value_(self.ensemble.parameters(), gradient_clip_val)
        else:
            clip_grad_norm_per_member(self.ensemble, float(gradient_clip_val))
