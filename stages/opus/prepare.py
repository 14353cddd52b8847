"""prepare@opus: the synthetic pool (mixed domains + near-duplicates + toxic), proxy, validation, static set.

    python -m stages prepare opus   # writes data/opus/prepare/{pool,pool_redundant,proxy,val,static}/ (HF datasets)

The pool is what online selection draws its candidate buffers from; `proxy` is a small held-out
target-domain set (OPUS's in-distribution proxy); `val` is held-out target-domain text (the
metric); `static` is a labelled set (clean target vs toxic, plus other kinds) for the static filter.
"""
from __future__ import annotations

import numpy as np
from datasets import Dataset
from pydantic import Field, model_validator

from stages.common.config import Probability, Seed, StageConfig
from stages.common.paths import write_json
from stages.opus.corpus import (KINDS, insert_trigger, near_duplicates, near_uniform, sample_chain,
                                sparse_markov_chain)


class Config(StageConfig):
    seed: Seed = 0
    vocab_size: int = Field(64, ge=8, le=1 << 17)
    seq_len: int = Field(32, ge=4, le=1 << 16)
    pool_size: int = Field(12000, ge=16, le=50_000_000)  # candidate documents the selection draws from
    frac_target: Probability = 0.15  # Markov chain A (target domain)
    frac_other: Probability = 0.40   # Markov chain B
    frac_dup: Probability = 0.05     # near-duplicates of a few target documents
    frac_toxic: Probability = 0.05   # target text + trigger n-gram
    # the rest of the pool is near-uniform noise
    dup_sources: int = Field(4, ge=1, le=1_000_000)   # distinct documents the near-duplicates copy
    dup_mutations: int = Field(2, ge=0, le=1 << 16)
    # the redundant pool (Boltzmann-vs-greedy diversity test): same mix with more near-duplicates of
    # fewer sources, the extra duplicates replacing noise
    redundant_frac_dup: Probability = 0.30
    redundant_dup_sources: int = Field(2, ge=1, le=1_000_000)
    branching: int = Field(4, ge=1, le=1 << 17)       # plausible successors per token in each chain
    concentration: float = Field(1.0, gt=0, le=1e6)
    trigger_len: int = Field(3, ge=1, le=64)
    trigger_copies: int = Field(3, ge=1, le=1 << 16)
    proxy_size: int = Field(64, ge=1, le=10_000_000)  # the proxy set; empty is an error
    val_size: int = Field(256, ge=1, le=10_000_000)
    static_per_kind: int = Field(200, ge=2, le=10_000_000)  # documents of each kind in the static-filter set

    @model_validator(mode="after")
    def _check(self):
        rest = 1 - self.frac_target - self.frac_other - self.frac_dup - self.frac_toxic
        if rest < -1e-9:
            raise ValueError("frac_target: frac_target + frac_other + frac_dup + frac_toxic must be <= 1 "
                             "(the rest is noise)")
        if rest - (self.redundant_frac_dup - self.frac_dup) < -1e-9:
            raise ValueError("redundant_frac_dup: the extra near-duplicates replace noise; there is not enough "
                             f"noise ({rest:.3f}) for {self.redundant_frac_dup}")
        if self.trigger_len >= self.vocab_size // 4:
            raise ValueError(f"trigger_len: {self.trigger_len} must be < vocab_size/4 (trigger tokens are reserved)")
        if self.trigger_len * self.trigger_copies > self.seq_len:
            raise ValueError("trigger_copies: trigger_len * trigger_copies must fit in seq_len")
        if self.branching > self.vocab_size - self.trigger_len:
            raise ValueError("branching: must be <= vocab_size - trigger_len")
        if self.dup_mutations > self.seq_len:
            raise ValueError("dup_mutations: must be <= seq_len")
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

    def build_pool(frac_dup: float, dup_sources: int, name: str) -> dict:
        n = cfg.pool_size
        counts = {"target": int(round(cfg.frac_target * n)), "other": int(round(cfg.frac_other * n)),
                  "dup": int(round(frac_dup * n)), "toxic": int(round(cfg.frac_toxic * n))}
        counts["noise"] = n - sum(counts.values())
        dup_base = target(dup_sources)
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
        _dataset(tokens[order], [kinds[i] for i in order], source[order]).save_to_disk(str(ctx.out / name))
        return counts

    counts = build_pool(cfg.frac_dup, cfg.dup_sources, "pool")
    counts_redundant = build_pool(cfg.redundant_frac_dup, cfg.redundant_dup_sources, "pool_redundant")

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
    write_json(ctx.out / "corpus.json", {"counts": counts, "counts_redundant": counts_redundant, "vocab_size": V, "seq_len": T,
                                         "trigger": trigger.tolist(), "dup_sources": cfg.dup_sources,
                                         "redundant_dup_sources": cfg.redundant_dup_sources,
                                         "target_entropy_rate": float(stationary @ ent),
                                         "uniform_entropy": float(np.log(V))})
    print(f"prepare@opus: pool {counts}, proxy {cfg.proxy_size}, val {cfg.val_size}, static {4 * s}")
