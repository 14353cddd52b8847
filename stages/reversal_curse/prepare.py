"""prepare: the fact world, stored with HF datasets (facts/) plus meta.json."""
from __future__ import annotations

from datasets import Dataset
from pydantic import Field

from stages.common.config import StageConfig
from stages.common.paths import write_json
from stages.common.runner import StageContext
from stages.reversal_curse.facts import Vocab, build_facts


class Config(StageConfig):
    n_pairs: int = Field(40, ge=2, description="number of (a_i, b_i) pairs")
    holdout_frac: float = Field(0.2, gt=0, lt=1, description="pairs whose reverse is held out")
    seed: int = 0


def run(cfg: Config, ctx: StageContext) -> None:
    cols = build_facts(cfg.n_pairs, cfg.holdout_frac, cfg.seed)
    Dataset.from_dict(cols).save_to_disk(str(ctx.out / "facts"))
    voc = Vocab(cfg.n_pairs)
    n_test = sum(1 for k, s in zip(cols["kind"], cols["split"]) if s == "test")
    write_json(ctx.out / "meta.json", {"n_pairs": cfg.n_pairs, "vocab_size": voc.size,
                                       "r_fwd": voc.r_fwd, "r_rev": voc.r_rev, "r_id": voc.r_id,
                                       "n_heldout": n_test, "rows": len(cols["kind"])})
