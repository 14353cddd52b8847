"""prepare: every prompt of the two-step modular-arithmetic task, split into RL/pretraining prompts
and held-out test prompts (seeded), stored as a polars parquet table plus meta.json.

    python -m stages prepare justgrpo [--profile smoke]
"""
from __future__ import annotations

import numpy as np
import polars as pl
from pydantic import Field, field_validator, model_validator

from stages.common.config import Fraction, Seed, Seeds, StageConfig, unique_items
from stages.common.paths import write_json
from stages.common.runner import StageContext
from stages.common.sources import SourceConfig
from stages.justgrpo.task import ANSWER_LEN, PROMPT_LEN, VOCAB, VOCAB_SIZE, all_prompts, value


class Config(StageConfig):
    gen_len: int = Field(14, ge=1, le=32, description="generation length L (≥ the answer format's 14 tokens)")
    test_frac: Fraction = Field(0.2, description="share of the 500 prompts held out for evaluation")
    split_seed: Seed = 0
    seeds: Seeds = Field(default_factory=lambda: [0, 1, 2], max_length=10,
                         description="run seeds: each pretrains its own dLLM and runs both RL arms")
    source: SourceConfig = SourceConfig()          # full: GSM8K train records (hf_source.load_gsm8k)
    eval_source: SourceConfig = SourceConfig()     # full: GSM8K test records
    limit: int | None = Field(None, ge=1, le=10_000_000, description="real path: read at most this many records")

    @field_validator("seeds")
    @classmethod
    def _distinct(cls, v):
        return unique_items(v, "seeds")

    @model_validator(mode="after")
    def _fits(self):
        if self.gen_len < ANSWER_LEN:
            raise ValueError(f"gen_len: {self.gen_len} is shorter than the answer format "
                             f"('x o y = z ; x o y = z ; # Y' needs {ANSWER_LEN} tokens)")
        if (self.source.kind == "toy") != (self.eval_source.kind == "toy"):
            raise ValueError("eval_source: the real path needs both GSM8K train (source) and test (eval_source)")
        if self.source.kind == "toy" and self.limit is not None:
            raise ValueError("limit: only read on the real path (source.kind hf or file)")
        return self


def run(cfg: Config, ctx: StageContext) -> None:
    if cfg.source.kind != "toy":                   # full profile: the real GSM8K path (issue 41)
        from stages.justgrpo.hf_source import prepare_real
        return prepare_real(cfg, ctx)
    rows = all_prompts()
    rng = np.random.default_rng(cfg.split_seed)
    n_test = int(round(cfg.test_frac * len(rows)))
    is_test = np.zeros(len(rows), dtype=bool)
    is_test[rng.permutation(len(rows))[:n_test]] = True
    frame = pl.DataFrame({"a": rows[:, 0], "o1": rows[:, 1], "b": rows[:, 2], "o2": rows[:, 3], "c": rows[:, 4],
                          "answer": [value(*map(int, r)) for r in rows],
                          "split": np.where(is_test, "test", "train")})
    frame.write_parquet(ctx.out / "prompts.parquet")
    write_json(ctx.out / "meta.json", {"gen_len": cfg.gen_len, "prompt_len": PROMPT_LEN, "vocab": VOCAB,
                                       "vocab_size": VOCAB_SIZE, "answer_len": ANSWER_LEN,
                                       "seeds": list(cfg.seeds), "n_train": int((~is_test).sum()),
                                       "n_test": int(is_test.sum())})


def load_prompts(prepare_dir, split: str):
    import torch

    f = pl.read_parquet(prepare_dir / "prompts.parquet").filter(pl.col("split") == split)
    return torch.as_tensor(f.select(["a", "o1", "b", "o2", "c"]).to_numpy().astype(np.int64))
