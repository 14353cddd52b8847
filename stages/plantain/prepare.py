"""prepare: the list-pipeline task (3–6 composed mod-5 operations (task.MOD)) with SFT traces in both formats —
think-then-answer and plan-first interleaved — carrying the SAME injected plan errors (probability
``plan_error_rate``: adjacent swap, dropped operation or wrong operand; the steps execute the faulty
plan), plus held-out RL and test prompts. Stored as parquet (polars) + meta.json.

    python -m stages prepare plantain [--profile smoke]
"""
from __future__ import annotations

import numpy as np
import polars as pl
from pydantic import Field, field_validator, model_validator

from stages.common.config import Probability, Seed, Seeds, StageConfig, unique_items
from stages.common.paths import write_json
from stages.common.runner import StageContext
from stages.common.sources import SourceConfig
from stages.plantain.task import (ERROR_KINDS, MAX_OPS, PROMPT_LEN, VOCAB, VOCAB_SIZE, Problem, corrupt_plan,
                                  decode_text, make_trace, sample_problem)

MAX_TRACE = 11 * MAX_OPS + 13         # longest trace (6 ops, a full draft: 1 + 4·6 more tokens): 79 tokens


class Config(StageConfig):
    n_sft: int = Field(6000, ge=8, le=200_000, description="SFT problems (one trace per format each)")
    n_rl: int = Field(2000, ge=8, le=200_000, description="RL prompts")
    n_test: int = Field(300, ge=4, le=20_000, description="held-out test problems")
    n_judge: int = Field(2400, ge=8, le=200_000, description=(
        "labelled (problem, plan) pairs for the learned plan judge (problems disjoint from the test problems; half "
        "the plans right, half with one injected error)"))
    judge_test: int = Field(800, ge=4, le=100_000, description="of n_judge, the last this many: the judge's held-out pairs")
    min_ops: int = Field(3, ge=1, le=MAX_OPS)
    max_ops: int = Field(5, ge=1, le=MAX_OPS)
    plan_error_rate: Probability = Field(0.8, description=(
        "plan-error rate of an SFT trace with no draft; a draft of j of n steps lowers it to rate·(n − j)/n "
        "(with j uniform on 0..n the share of SFT traces with an error is rate/2)"))
    drafts: bool = Field(True, description=(
        "SFT traces carry a pre-plan draft of a uniform number of steps (issue 47: TTFR the model decides); "
        "false: none (the one-token pre-plan thought of the earlier design)"))
    error_kinds: list[str] = Field(default_factory=lambda: list(ERROR_KINDS), min_length=1, max_length=3)
    data_seed: Seed = 0
    seeds: Seeds = Field(default_factory=lambda: [0, 1, 2], max_length=10,
                         description="run seeds: each trains both formats and runs every evaluation")
    source: SourceConfig = SourceConfig()          # full: SFT records with plan-first traces (hf_source)
    eval_source: SourceConfig = SourceConfig()     # full: held-out test records (problem, answer)
    limit: int | None = Field(None, ge=1, le=10_000_000, description="real path: read at most this many records")

    @field_validator("seeds", "error_kinds")
    @classmethod
    def _distinct(cls, v, info):
        return unique_items(v, info.field_name)

    @field_validator("error_kinds")
    @classmethod
    def _kinds(cls, v):
        bad = [k for k in v if k not in ERROR_KINDS]
        if bad:
            raise ValueError(f"error_kinds: {bad[0]!r} is not one of {ERROR_KINDS}")
        return v

    @model_validator(mode="after")
    def _ops(self):
        if self.judge_test >= self.n_judge:
            raise ValueError(f"judge_test: {self.judge_test} leaves no training pairs of n_judge {self.n_judge}")
        if self.min_ops > self.max_ops:
            raise ValueError(f"min_ops: {self.min_ops} exceeds max_ops {self.max_ops}")
        if "drop" in self.error_kinds and self.min_ops < 2:
            raise ValueError("min_ops: 'drop' errors need at least 2 operations")
        if (self.source.kind == "toy") != (self.eval_source.kind == "toy"):
            raise ValueError("eval_source: the real path needs SFT records (source) and test records (eval_source)")
        if self.source.kind == "toy" and self.limit is not None:
            raise ValueError("limit: only read on the real path (source.kind hf or file)")
        return self


def problems_frame(probs: list[Problem], split: str, rng: np.random.Generator, err_rate: float,
                   kinds: list[str], drafts: bool = True) -> pl.DataFrame:
    """One row per problem; SFT rows carry both formats' traces with the same draft length and plan error:
    draft j uniform on 0..n (``drafts``; else 0), then one plan error with probability err_rate·(n − j)/n among
    the operations the draft did not reach (none when it reached them all)."""
    rows = []
    for p in probs:
        n = len(p.ops)
        j = int(rng.integers(n + 1)) if split == "sft" and drafts else 0
        err = split == "sft" and j < n and rng.random() < err_rate * (n - j) / n
        kind = str(rng.choice(kinds)) if err else ""
        plan = corrupt_plan(p.plan, kind, rng, keep=j) if err else p.plan
        rows.append({"split": split, "x": p.x, "ops": [t for od in p.ops for t in od], "n_ops": n,
                     "answer": p.answer, "prompt": p.prompt(), "plan_error": kind, "draft": j,
                     "trace_tta": make_trace(p, "tta", plan, j), "trace_pf": make_trace(p, "pf", plan, j)})
    return pl.DataFrame(rows)


def run(cfg: Config, ctx: StageContext) -> None:
    if cfg.source.kind != "toy":                   # full profile: real records (issue 41)
        from stages.plantain.hf_source import prepare_real
        return prepare_real(cfg, ctx)
    rng = np.random.default_rng(cfg.data_seed)
    seen, splits = set(), {}
    for split, n in (("test", cfg.n_test), ("rl", cfg.n_rl), ("sft", cfg.n_sft)):
        out = []
        while len(out) < n:           # test problems never appear in RL or SFT data
            p = sample_problem(rng, cfg.min_ops, cfg.max_ops)
            key = (p.x, p.ops)
            if split == "test" and key in seen:
                continue
            if split != "test" and key in splits.get("_test", set()):
                continue
            seen.add(key)
            out.append(p)
        splits[split] = out
        if split == "test":
            splits["_test"] = {(p.x, p.ops) for p in out}
    frame = pl.concat([problems_frame(splits[s], s, rng, cfg.plan_error_rate, cfg.error_kinds, cfg.drafts)
                       for s in ("sft", "rl", "test")])
    frame.write_parquet(ctx.out / "problems.parquet")
    judge_frame(cfg, splits["_test"]).write_parquet(ctx.out / "judge.parquet")
    ex = frame.filter(pl.col("split") == "sft").head(4)
    write_json(ctx.out / "meta.json", {
        "seeds": list(cfg.seeds), "vocab": VOCAB, "vocab_size": VOCAB_SIZE, "prompt_len": PROMPT_LEN,
        "max_trace": MAX_TRACE, "min_ops": cfg.min_ops, "max_ops": cfg.max_ops,
        "plan_error_rate": cfg.plan_error_rate, "error_kinds": list(cfg.error_kinds), "drafts": cfg.drafts,
        "sft_draft_mean": float(frame.filter(pl.col("split") == "sft")["draft"].mean()),
        "n": {s: int((frame["split"] == s).sum()) for s in ("sft", "rl", "test")},
        "n_judge": {"train": cfg.n_judge - cfg.judge_test, "test": cfg.judge_test},
        "sft_error_share": float((frame.filter(pl.col("split") == "sft")["plan_error"] != "").mean()),
        "examples": [{"prompt": decode_text([t for t in r["prompt"] if t != VOCAB.index("<pad>")]),
                      "tta": decode_text(r["trace_tta"]), "pf": decode_text(r["trace_pf"]),
                      "plan_error": r["plan_error"]} for r in ex.iter_rows(named=True)]})


def judge_frame(cfg: Config, test_keys: set) -> pl.DataFrame:
    """Labelled (problem, plan) pairs for the learned plan judge, from their own random stream (the other splits
    are unchanged by it): operation sequences never in the test split (the judge reads no start value), each
    (operations, plan) pair once (so held-out pairs are unseen in training); plans alternately right (label 1) and carrying one
    injected error (label 0); the last ``judge_test`` pairs are the judge's held-out set."""
    rng = np.random.default_rng([cfg.data_seed, 1])
    test_ops = {ops for _, ops in test_keys}   # the judge reads no x: a test problem's operations are excluded
    rows, seen = [], set()
    for _ in range(100 * cfg.n_judge):
        if len(rows) == cfg.n_judge:
            break
        p = sample_problem(rng, cfg.min_ops, cfg.max_ops)
        if p.ops in test_ops:
            continue
        ok = len(rows) % 2 == 0                # right and wrong plans alternate: any prefix is balanced
        plan = p.plan if ok else corrupt_plan(p.plan, str(rng.choice(cfg.error_kinds)), rng)
        if (p.ops, tuple(plan)) in seen:       # each (operations, plan) pair once: held-out pairs are unseen
            continue
        seen.add((p.ops, tuple(plan)))
        rows.append({"x": p.x, "ops": [t for od in p.ops for t in od], "plan": [t for od in plan for t in od],
                     "label": int(ok), "part": "train" if len(rows) < cfg.n_judge - cfg.judge_test else "test"})
    if len(rows) < cfg.n_judge:
        raise ValueError(f"n_judge: only {len(rows)} distinct (operations, plan) pairs outside the test problems' "
                         f"operations in {100 * cfg.n_judge} draws; lower n_judge or widen min_ops..max_ops")
    return pl.DataFrame(rows)


def load_judge_pairs(prepare_dir, part: str) -> tuple[list[Problem], list[list[tuple[int, int]]], list[int]]:
    """(problems, plans, labels) of the judge split's ``part`` ("train" | "test")."""
    f = pl.read_parquet(prepare_dir / "judge.parquet").filter(pl.col("part") == part)
    plans = [[(q[i], q[i + 1]) for i in range(0, len(q), 2)] for q in f["plan"].to_list()]
    return to_problems(f), plans, f["label"].to_list()


def load_split(prepare_dir, split: str) -> pl.DataFrame:
    return pl.read_parquet(prepare_dir / "problems.parquet").filter(pl.col("split") == split)


def to_problems(frame: pl.DataFrame) -> list[Problem]:
    return [Problem(int(x), tuple((ops[i], ops[i + 1]) for i in range(0, len(ops), 2)))
            for x, ops in zip(frame["x"].to_list(), frame["ops"].to_list())]
