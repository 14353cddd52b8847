"""prepare: every prompt of the two-digit addition task (10⁴), split (seeded) into training prompts
(pretraining and RL), a dev slice (pretraining's stop rule and the RL learning curves) and held-out test
prompts (every claim), stored as a polars parquet table plus meta.json (with the best constant
guesser's pass@1 on the test split).

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
from stages.justgrpo.task import ANSWER_LEN, PROMPT_LEN, VOCAB, VOCAB_SIZE, all_prompts, guess_rate, prompt_batch, value


class Config(StageConfig):
    gen_len: int = Field(20, ge=1, le=32, description="generation length L (≥ the longest solution's 20 tokens)")
    test_frac: Fraction = Field(0.2, description="share of the 10⁴ prompts held out for evaluation (claims)")
    dev_frac: Fraction = Field(0.05, description="share held out as a dev slice (stop rule, learning curves)")
    split_seed: Seed = 0
    seeds: Seeds = Field(default_factory=lambda: [0, 1, 2], max_length=10,
                         description="run seeds: RL sampling of both arms and evaluation sampling (one shared base dLLM)")
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
            raise ValueError(f"gen_len: {self.gen_len} is shorter than the longest solution "
                             f"('9+9=18;9+9+1=19;#198' needs {ANSWER_LEN} tokens)")
        if self.test_frac + self.dev_frac >= 0.9:
            raise ValueError(f"dev_frac: test_frac + dev_frac = {self.test_frac + self.dev_frac} leaves under 10% "
                             "of the prompts for training")
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
    n_dev = int(round(cfg.dev_frac * len(rows)))
    order = rng.permutation(len(rows))
    split = np.full(len(rows), "train", dtype=object)
    split[order[:n_test]] = "test"
    split[order[n_test:n_test + n_dev]] = "dev"
    answer = np.array([value(*map(int, r)) for r in rows])
    frame = pl.DataFrame({"a": rows[:, 0], "b": rows[:, 1], "c": rows[:, 2], "d": rows[:, 3],
                          "answer": answer, "split": split.astype(str)})
    # rows in the split's random order: every slice downstream (test[:n], the dev slices of the stop rule and the
    # RL curves) is then a random sample of its split, not the lexicographically first operands (review, issue 46)
    frame.select(pl.all().gather(order)).write_parquet(ctx.out / "prompts.parquet")
    counts = {k: int((split == k).sum()) for k in ("train", "dev", "test")}
    write_json(ctx.out / "meta.json", {"gen_len": cfg.gen_len, "prompt_len": PROMPT_LEN, "vocab": VOCAB,
                                       "vocab_size": VOCAB_SIZE, "answer_len": ANSWER_LEN,
                                       "seeds": list(cfg.seeds), **{f"n_{k}": v for k, v in counts.items()},
                                       "n_answers": int(len(np.unique(answer))),
                                       "guess_rate": guess_rate(answer[split == "test"])})


def load_prompts(prepare_dir, split: str):
    """(N, PROMPT_LEN) prompt tokens of one split, in the table's (seeded random) order."""
    import torch

    f = pl.read_parquet(prepare_dir / "prompts.parquet").filter(pl.col("split") == split)
    return prompt_batch(torch.as_tensor(f.select(["a", "b", "c", "d"]).to_numpy().astype(np.int64)))
