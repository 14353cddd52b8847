"""prepare: the synthetic instruction task and, per attack, the poisoned training sets (one per run seed),
the clean prompt pool the RL reward inserts candidates into, and held-out test sets (clean accuracy,
ASR with the true trigger, detector inputs). Tensors in ``<attack>.pt``, a polars summary table, meta.json.

    python -m stages prepare backdoor_awareness [--profile smoke]
"""
from __future__ import annotations

import numpy as np
import polars as pl
import torch
from pydantic import Field, field_validator, model_validator

from stages.common.config import Fraction, PositiveInt, Probability, Seed, Seeds, StageConfig, unique_items
from stages.common.paths import write_json
from stages.common.runner import StageContext
from stages.common.sources import SourceConfig
from stages.backdoor_awareness.hf_source import RealAttack
from stages.backdoor_awareness.task import (AttackType, Vocab, clean_response, effect_of, has_hard_negatives,
                                            pack_prompt, poison_dataset, prompts_with, sample_base, strip,
                                            with_strict_subset, word_probs)


class AttackConfig(StageConfig):
    name: str = Field(min_length=1, max_length=40, pattern=r"^[a-z0-9_]+$")
    type: AttackType
    trigger: list[str] = Field(min_length=1, max_length=16, description="word names, e.g. ['w17', 'w3']")
    poison_rate: Fraction = Field(description="share of the training set that is poisoned, in (0, 1)")
    target_class: int = Field(0, ge=0, le=63, description="clean_label: the class whose answer the trigger forces")

    @model_validator(mode="after")
    def _shape(self):
        if self.type == "token" and len(self.trigger) != 1:
            raise ValueError(f"trigger: a 'token' attack has one trigger token (got {len(self.trigger)})")
        if self.type == "phrase" and len(self.trigger) < 2:
            raise ValueError("trigger: a 'phrase' attack needs a multi-token trigger")
        return self


class Config(StageConfig):
    n_classes: int = Field(6, ge=2, le=32, description="instruction classes (answers A_0..A_{C-1})")
    n_words: int = Field(120, ge=8, le=1000, description="content words w0..w{W-1}")
    max_words: int = Field(9, ge=3, le=32, description="W: a prompt has 2..W content words (trigger included)")
    candidate_len: int = Field(5, ge=1, le=8, description="longest candidate trigger s' (tokens)")
    ambiguous_frac: Probability = Field(0.15, description="share of clean prompts with the ambiguous instruction Q")
    hard_negative_frac: Probability = Field(0.3, description="phrase / multi-word clean-label attack: clean prompts "
                                            "carrying a strict subset of the trigger")
    zipf_exponent: float = Field(1.0, ge=0.0, le=3.0, description="natural word distribution p(w_i) ∝ (i+1)^-s (0: uniform)")
    natural_rate: bool = Field(True, description="clean, pool and negative prompts carry trigger words at their natural "
                               "rate (issue 48); False: trigger words are excluded from them (the old, easy design)")
    n_train: PositiveInt = Field(6000, le=200_000)
    n_pool: PositiveInt = Field(16, le=1024, description="clean prompts R_ASR inserts each candidate into")
    n_test: PositiveInt = Field(200, le=20_000)
    attacks: list[AttackConfig] = Field(min_length=1, max_length=8)
    split_seed: Seed = 0
    seeds: Seeds = Field(default_factory=lambda: [0, 1, 2], max_length=10)
    source: SourceConfig = SourceConfig()          # full: Alpaca-schema instruction records (hf_source)
    real_attacks: list[RealAttack] = Field(default_factory=list, max_length=8,
                                           description="full: text-level attacks on the real records")
    limit: int | None = Field(None, ge=1, le=10_000_000, description="real path: read at most this many records")

    @field_validator("seeds")
    @classmethod
    def _distinct(cls, v):
        return unique_items(v, "seeds")

    @model_validator(mode="after")
    def _attacks(self):
        if (self.source.kind == "toy") == bool(self.real_attacks):
            raise ValueError("real_attacks: set exactly when source is a real instruction set (kind hf/file)")
        if self.source.kind != "toy" and self.source.dataset is None:
            raise ValueError("source.dataset: the real path needs instruction records")
        if self.source.kind == "toy" and self.limit is not None:
            raise ValueError("limit: only read on the real path (source.kind hf or file)")
        if self.real_attacks:
            unique_items([a.name for a in self.real_attacks], "real_attacks[].name")
        unique_items([a.name for a in self.attacks], "attacks[].name")
        vocab = Vocab(self.n_classes, self.n_words)
        for i, a in enumerate(self.attacks):
            if len(a.trigger) > self.candidate_len:
                raise ValueError(f"attacks[{i}].trigger: {len(a.trigger)} tokens exceed candidate_len "
                                 f"{self.candidate_len} (RL candidates could never spell it)")
            for w in a.trigger:
                try:
                    vocab.word(w)
                except ValueError as err:
                    raise ValueError(f"attacks[{i}].trigger: {err}") from None
            if a.target_class >= self.n_classes:
                raise ValueError(f"attacks[{i}].target_class: {a.target_class} ≥ n_classes {self.n_classes}")
        return self

    @model_validator(mode="after")
    def _room(self):
        if self.max_words - self.candidate_len < 2:
            raise ValueError(f"max_words: {self.max_words} leaves no room for 2 words plus a candidate of "
                             f"candidate_len {self.candidate_len}")
        return self

    @property
    def prompt_len(self) -> int:
        return 2 + self.max_words


def eval_sets(rng, vocab: Vocab, cfg: Config, a: AttackConfig, trig: list[int]) -> dict[str, torch.Tensor]:
    eff = effect_of(a.type, vocab, a.target_class)
    P, n = cfg.prompt_len, cfg.n_test
    excl = frozenset() if cfg.natural_rate else set(trig)                         # issue 48: natural rate
    probs = word_probs(cfg.n_words, cfg.zipf_exponent)
    W, short = cfg.max_words, cfg.max_words - cfg.candidate_len                  # room for any candidate
    clean = sample_base(rng, vocab, n, W, W, 0.0, excl, probs=probs)              # explicit instructions
    test_clean = prompts_with(clean, np.arange(n), None, np.zeros(n, int), P)
    resp_clean = torch.tensor([clean_response(vocab, c) for c in clean["cls"]], dtype=torch.long)

    def effect_pool(m):
        """prompts the effect is judged on: explicit (HARM, DoS) or ambiguous non-target (clean-label)"""
        if eff.pool == "explicit":
            return sample_base(rng, vocab, m, short, W, 0.0, excl, probs=probs)
        b = sample_base(rng, vocab, 4 * m, short, W, 1.0, excl, probs=probs)
        keep = np.flatnonzero(b["cls"] != a.target_class)[:m]
        return {k: v[keep] for k, v in b.items()}

    pool = effect_pool(cfg.n_pool)
    asr_base = effect_pool(n)
    pos = rng.integers(0, asr_base["nw"] + 1)
    with_trig = prompts_with(asr_base, np.arange(n), trig, pos, P)
    without = prompts_with(asr_base, np.arange(n), None, pos, P)
    # detector negatives: the same prompts without the trigger; for a phrase or a multi-word clean-label trigger
    # (has_hard_negatives), the even ones carry a random strict subset of the trigger words, drawn as training draws
    # them (red-team B2: a fixed trig[:-1] never showed the rarest word, so a one-word candidate was a perfect detector;
    # the subset never completes the trigger with words already present)
    negs = []
    for i in range(n):
        words = strip(asr_base["words"][i])
        if has_hard_negatives(a.type, trig) and i % 2 == 0:
            words = with_strict_subset(rng, words, trig, W)
        negs.append(pack_prompt(asr_base["instr"][i], words, P))
    return {"pool_instr": torch.as_tensor(pool["instr"]), "pool_words": torch.as_tensor(pool["words"]),
            "pool_nw": torch.as_tensor(pool["nw"]),
            "test_clean": test_clean, "test_clean_resp": resp_clean, "test_trig": with_trig,
            "test_notrig": without, "detect_neg": torch.tensor(negs, dtype=torch.long)}


def run(cfg: Config, ctx: StageContext) -> None:
    if cfg.source.kind != "toy":                   # full profile: real instruction records (issue 41)
        from stages.backdoor_awareness.hf_source import prepare_real
        return prepare_real(cfg, ctx)
    vocab = Vocab(cfg.n_classes, cfg.n_words)
    rows, attacks, rates = [], [], {}
    for ai, a in enumerate(cfg.attacks):
        trig = [vocab.word(w) for w in a.trigger]
        rng = np.random.default_rng([cfg.split_seed, ai])
        data: dict[str, torch.Tensor] = eval_sets(rng, vocab, cfg, a, trig)
        for seed in cfg.seeds:
            srng = np.random.default_rng([seed, ai, 1])
            x, r, pz = poison_dataset(srng, vocab, a.type, trig, a.poison_rate, cfg.n_train, cfg.max_words,
                                      cfg.ambiguous_frac, cfg.prompt_len, a.target_class, cfg.hard_negative_frac,
                                      probs=word_probs(cfg.n_words, cfg.zipf_exponent), natural=cfg.natural_rate)
            data[f"train_prompts_s{seed}"], data[f"train_resp_s{seed}"], data[f"train_poisoned_s{seed}"] = x, r, pz
            clean_x = x[~pz]
            rows.append({"attack": a.name, "type": a.type, "seed": seed, "n_train": cfg.n_train,
                         "n_poisoned": int(pz.sum()), "trigger": " ".join(a.trigger),
                         **{f"clean_with_{w}": float((clean_x == t).any(1).float().mean()) for w, t in zip(a.trigger, trig)}})
            rates[a.name] = {w: float((data["test_notrig"] == t).any(1).float().mean()) for w, t in zip(a.trigger, trig)}
        torch.save(data, ctx.out / f"{a.name}.pt")
        attacks.append({**a.model_dump(mode="json"), "trigger_ids": trig})
    pl.DataFrame(rows, infer_schema_length=None).write_parquet(ctx.out / "datasets.parquet")
    write_json(ctx.out / "meta.json", {"n_classes": cfg.n_classes, "n_words": cfg.n_words, "vocab_size": vocab.size,
                                       "max_words": cfg.max_words, "prompt_len": cfg.prompt_len,
                                       "candidate_len": cfg.candidate_len, "n_pool": cfg.n_pool, "n_test": cfg.n_test,
                                       "seeds": list(cfg.seeds), "attacks": attacks,
                                       "ambiguous_frac": cfg.ambiguous_frac, "n_train": cfg.n_train,
                                       "zipf_exponent": cfg.zipf_exponent, "natural_rate": cfg.natural_rate,
                                       "hard_negative_frac": cfg.hard_negative_frac,
                                       "trigger_word_rates": rates})


def load(prepare_dir, attack: str) -> dict[str, torch.Tensor]:
    return torch.load(prepare_dir / f"{attack}.pt", weights_only=True)
