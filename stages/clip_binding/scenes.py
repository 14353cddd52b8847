"""The synthetic concept world: k concepts × v values, objects = concept tuples, scenes = 1..N objects.

Tokenisation (official scenes.py): a scene is [SOO, c1, ..., ck, EOO] per object, then EOS, padded
with PAD to N·(k+2)+1 tokens. Concept value j of concept c is token c·v + j. Probe queries:
a concept query is [value, EOS]; an object query is [SOO, c1, ..., ck, EOO, EOS].

Queries are pooled per batch (official scenes.py:259-408): every concept value (k·v ≤ 64) and every
unique in-batch object plus one swap negative per multi-object scene (its first object with one
concept copied from its second object). Labels are multi-hot: does the scene contain the query.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class World:
    k: int          # concepts per object
    v: int          # values per concept
    n_max: int      # objects per scene: 1..n_max

    @property
    def n_objects(self) -> int:
        return self.v ** self.k

    @property
    def n_concept_tokens(self) -> int:
        return self.k * self.v

    @property
    def SOO(self) -> int:
        return self.k * self.v

    @property
    def EOO(self) -> int:
        return self.k * self.v + 1

    @property
    def EOS(self) -> int:
        return self.k * self.v + 2

    @property
    def PAD(self) -> int:
        return self.k * self.v + 3

    @property
    def vocab(self) -> int:
        return self.k * self.v + 4

    @property
    def scene_len(self) -> int:
        return self.n_max * (self.k + 2) + 1

    def concepts(self, obj: torch.Tensor) -> torch.Tensor:
        """object ids (...) -> concept values (..., k); object id = Σ_c val_c · v^(k-1-c)."""
        powers = self.v ** torch.arange(self.k - 1, -1, -1, device=obj.device)
        return (obj[..., None] // powers) % self.v

    def object_id(self, vals: torch.Tensor) -> torch.Tensor:
        powers = self.v ** torch.arange(self.k - 1, -1, -1, device=vals.device)
        return (vals * powers).sum(-1)

    def concept_tokens(self, vals: torch.Tensor) -> torch.Tensor:
        """concept values (..., k) -> token ids c·v + val."""
        return vals + self.v * torch.arange(self.k, device=vals.device)

    def tokenize_scenes(self, objs: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """objs (B, n_max) object ids, n (B,) objects used -> tokens (B, L), eos index (B,)."""
        B = objs.shape[0]
        dev = objs.device
        toks = self.concept_tokens(self.concepts(objs))                                   # (B, N, k)
        soo = torch.full((B, self.n_max, 1), self.SOO, device=dev, dtype=torch.long)
        eoo = torch.full((B, self.n_max, 1), self.EOO, device=dev, dtype=torch.long)
        body = torch.cat([soo, toks, eoo], -1).reshape(B, -1)                             # (B, N(k+2))
        used = (torch.arange(self.n_max, device=dev)[None, :] < n[:, None])
        body = torch.where(used.repeat_interleave(self.k + 2, 1), body, torch.full_like(body, self.PAD))
        tokens = torch.cat([body, torch.full((B, 1), self.PAD, device=dev, dtype=torch.long)], 1)
        eos = n * (self.k + 2)
        tokens[torch.arange(B, device=dev), eos] = self.EOS
        return tokens, eos

    def concept_queries(self, device) -> torch.Tensor:
        """(k·v, 2): [value, EOS] for every concept value."""
        vals = torch.arange(self.n_concept_tokens, device=device)
        return torch.stack([vals, torch.full_like(vals, self.EOS)], 1)

    def object_queries(self, obj: torch.Tensor) -> torch.Tensor:
        """object ids (M,) -> (M, k+3): [SOO, c1..ck, EOO, EOS]."""
        toks = self.concept_tokens(self.concepts(obj))
        M = obj.shape[0]
        col = lambda t: torch.full((M, 1), t, device=obj.device, dtype=torch.long)  # noqa: E731
        return torch.cat([col(self.SOO), toks, col(self.EOO), col(self.EOS)], 1)


def sample_scenes(world: World, allowed: torch.Tensor, batch: int, gen: torch.Generator,
                  n_fixed: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Scenes of 1..n_max objects drawn with replacement from `allowed` -> objs (B, n_max), n (B,)."""
    dev = allowed.device
    idx = torch.randint(0, allowed.numel(), (batch, world.n_max), generator=gen, device=dev)
    objs = allowed[idx]
    if n_fixed is None:
        n = torch.randint(1, world.n_max + 1, (batch,), generator=gen, device=dev)
    else:
        n = torch.full((batch,), n_fixed, device=dev, dtype=torch.long)
    return objs, n


def pooled_queries(world: World, objs: torch.Tensor, n: torch.Tensor, gen: torch.Generator,
                   negative_pool: torch.Tensor | None = None) -> dict:
    """ALGO: pooled per-batch queries + swap negatives, multi-hot labels (official scenes.py)."""
    B = objs.shape[0]
    dev = objs.device
    used = torch.arange(world.n_max, device=dev)[None, :] < n[:, None]                  # (B, N)
    # concept labels: scene contains concept value token
    ctoks = world.concept_tokens(world.concepts(objs))                                   # (B, N, k)
    onehot = torch.nn.functional.one_hot(ctoks, world.n_concept_tokens) * used[..., None, None]
    concept_labels = (onehot.sum((1, 2)) > 0).float()                                    # (B, k·v)
    # swap negatives: object 0 with one concept copied from object 1 (scenes with >= 2 objects)
    multi = n >= 2
    c = torch.randint(0, world.k, (B,), generator=gen, device=dev)
    v0, v1 = world.concepts(objs[:, 0]), world.concepts(objs[:, 1]) if world.n_max > 1 else None
    if v1 is not None:
        swapped = v0.clone()
        rows = torch.arange(B, device=dev)
        swapped[rows, c] = v1[rows, c]
        neg = world.object_id(swapped)[multi]
        if negative_pool is not None:                  # keep only swap negatives from this pool
            neg = neg[torch.isin(neg, negative_pool)]
    else:
        neg = objs.new_zeros(0)
    query_objs = torch.unique(torch.cat([objs[used], neg]))                              # (M,) sorted
    object_labels = ((objs[:, :, None] == query_objs[None, None, :]) & used[..., None]).any(1).float()
    return {"concept_labels": concept_labels, "query_objs": query_objs, "object_labels": object_labels,
            "n_swap_negatives": int(multi.sum())}


def split_objects(world: World, fraction: float, gen: torch.Generator, max_tries: int = 1000) -> torch.Tensor:
    """A boolean (n_objects,) train mask with round(fraction·n) objects whose train set covers every
    concept value (redrawn until it does), and at least one held-out object."""
    n = world.n_objects
    n_train = int(round(fraction * n))
    if not 1 <= n_train < n:
        raise ValueError(f"train_object_fraction={fraction} leaves {n_train} of {n} objects for training "
                         "(need at least 1 train and 1 held-out object)")
    all_objs = torch.arange(n)
    for _ in range(max_tries):
        perm = torch.randperm(n, generator=gen)
        mask = torch.zeros(n, dtype=torch.bool)
        mask[perm[:n_train]] = True
        vals = world.concepts(all_objs[mask])
        if all(vals[:, c].unique().numel() == world.v for c in range(world.k)):
            return mask
    return mask  # coverage impossible at this fraction (n_train < v): keep the last draw
