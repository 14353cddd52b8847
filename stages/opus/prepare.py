"""prepare@opus: the synthetic pool (mixed domains + near-duplicates + toxic), proxy, validation, static set.

    python -m stages prepare opus            # writes data/opus/prepare/{pool,proxy,val,static}/ (HF datasets)

The pool is what online selection draws its candidate buffers from; `proxy` is a small held-out
target-domain set (OPUS's in-distribution proxy); `val` is held-out target-domain text (the
metric); `static` is a labelled set (clean target vs toxic, plus other kinds) for the static filter.
"""
from __future__ import annotations

import numpy as np
from datasets import Dataset
from pydantic import Field, model_validator

from stages.common.config import StageConfig
from stages.common.paths import write_json
from stages.opus.corpus import (KINDS, insert_trigger, near_duplicates, near_uniform, sample_chain,
                                sparse_markov_chain)


class Config(StageConfig):
    seed: int = 0
    vocab_size: int = Field(64, ge=8)
    seq_len: int = Field(32, ge=4)
    pool_size: int = Field(12000, ge=16)          # candidate documents the selection draws from
    frac_target: float = Field(0.15, ge=0, le=1)  # Markov chain A (target domain)
    frac_other: float = Field(0.40, ge=0, le=1)   # Markov chain B
    frac_dup: float = Field(0.05, ge=0, le=1)     # near-duplicates of a few target documents
    frac_toxic: float = Field(0.05, ge=0, le=1)   # target text + trigger n-gram
    # the rest of the pool is near-uniform noise
    dup_sources: int = Field(4, ge=1)             # distinct documents the near-duplicates copy
    dup_mutations: int = Field(2, ge=0)
    branching: int = Field(4, ge=1)               # plausible successors per token in each chain
    concentration: float = Field(1.0, gt=0)
    trigger_len: int = Field(3, ge=1)
    trigger_copies: int = Field(3, ge=1)
    proxy_size: int = Field(64, ge=1)             # the proxy set; empty is an error
    val_size: int = Field(256, ge=1)
    static_per_kind: int = Field(200, ge=2)       # documents of each kind in the static-filter set

    @model_validator(mode="after")
    def _check(self):
        rest = 1 - self.frac_target - self.frac_other - self.frac_dup - self.frac_toxic
        if rest < -1e-9:
            raise ValueError("frac_target + frac_other + frac_dup + frac_toxic must be <= 1 (the rest is noise)")
        if self.trigger_len >= self.vocab_size // 4:
            raise ValueError(f"trigger_len ({self.trigger_len}) must be < vocab_size/4 (trigger tokens are reserved)")
        if self.trigger_len * self.trigger_copies > self.seq_len:
            raise ValueError("trigger_len * trigger_copies must fit in seq_len")
        if self.branching > self.vocab_size - self.trigger_len:
            raise ValueError("branching must be <= vocab_size - trigger_len")
        if self.dup_mutations > self.seq_len:
            raise ValueError("dup_mutations must be <= seq_len")
        return self


def _dataset(tokens: np.ndarray, kinds: list[str], source: np.ndarray | None = None) -> Dataset:
    return Dataset.from_dict({"tokens": tokens.tolist(), "kind": kinds,
                              "kind_id": [KINDS.index(k) for k in kinds],
                              "dup_source": (source if source is not None else np.full(len(kinds), -1)).tolist()})


def run(cfg: Config, ctx) -> None:
    rng = np.random.default_rng(cfg.seed)
    V, T = cfg.vocab_size, cfg.seq_len
    trigger = np.arange(V - cfg.trigger_len, V)          # reserved tokens: only the trigger uses them
    normal = np.arange(V - cfg.trigger_len)
    chain_a = sparse_markov_chain(V, cfg.branching, cfg.concentration, rng, exclude=trigger)
    chain_b = sparse_markov_chain(V, cfg.branching, cfg.concentration, rng, exclude=trigger)

    def target(n):
        return sample_chain(chain_a, n, T, rng, normal)

    n = cfg.pool_size
    counts = {"target": int(round(cfg.frac_target * n)), "other": int(round(cfg.frac_other * n)),
              "dup": int(round(cfg.frac_dup * n)), "toxic": int(round(cfg.frac_toxic * n))}
    counts["noise"] = n - sum(counts.values())
    dup_base = target(cfg.dup_sources)
    dups, dup_src = near_duplicates(dup_base, counts["dup"], cfg.dup_mutations, rng, normal)
    parts = {"target": target(counts["target"]),
             "other": sample_chain(chain_b, counts["other"], T, rng, normal),
             "noise": near_uniform(counts["noise"], T, V, rng, normal),
             "dup": dups,
             "toxic": insert_trigger(target(counts["toxic"]), trigger, cfg.trigger_copies, rng)}
    tokens = np.concatenate([parts[k] for k in KINDS])
    kinds = [k for k in KINDS for _ in range(counts[k])]
    source = np.concatenate([dup_src if k == "dup" else np.full(counts[k], -1) for k in KINDS])
    order = rng.permutation(n)
    pool = _dataset(tokens[order], [kinds[i] for i in order], source[order])
    pool.save_to_disk(str(ctx.out / "pool"))

    _dataset(target(cfg.proxy_size), ["target"] * cfg.proxy_size).save_to_disk(str(ctx.out / "proxy"))
    _dataset(target(cfg.val_size), ["target"] * cfg.val_size).save_to_disk(str(ctx.out / "val"))
    s = cfg.static_per_kind
    static_tokens = np.concatenate([target(s), insert_trigger(target(s), trigger, cfg.trigger_copies, rng),
                                    sample_chain(chain_b, s, T, rng, normal), near_uniform(s, T, V, rng, normal)])
    static_kinds = ["target"] * s + ["toxic"] * s + ["other"] * s + ["noise"] * s
    _dataset(static_tokens, static_kinds).save_to_disk(str(ctx.out / "static"))

    # entropy rate of chain A: the best achievable target validation loss (nats/token)
    stationary = np.linalg.matrix_power(chain_a, 200)[0]
    ent = -(chain_a * np.log(np.where(chain_a > 0, chain_a, 1))).sum(1)
    write_json(ctx.out / "corpus.json", {"counts": counts, "vocab_size": V, "seq_len": T,
                                         "trigger": trigger.tolist(), "dup_sources": cfg.dup_sources,
                                         "target_entropy_rate": float(stationary @ ent),
                                         "uniform_entropy": float(np.log(V))})
    print(f"prepare@opus: pool {counts}, proxy {cfg.proxy_size}, val {cfg.val_size}, static {4 * s}")
