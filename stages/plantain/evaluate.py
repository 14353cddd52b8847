"""evaluate: per seed, for the SFT and GRPO models of both formats — pass@1 (greedy) on held-out
problems, format validity, time to first visible token (TTFR) in tokens for every problem, and a
streaming (KV-cache, one prompt at a time) decode that also measures TTFR in wall time (reported,
never used in a verdict); the NLL of each model's own traces on hidden vs visible tokens through
``kernels/token_logprob``; and Rewind-and-Repeat at plan level vs answer level on the plan-first
GRPO model (accuracy vs tokens spent, up to ``max_retries`` retries).

    python -m stages evaluate plantain [--profile smoke]
"""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import polars as pl
import torch
from pydantic import Field, field_validator, model_validator

from kernels.record import KernelRecord
from kernels.token_logprob import token_logprob
from stages.common.config import Fraction, PositiveInt, Seed, StageConfig, unique_items
from stages.common.device import DeviceName, pick_device
from stages.common.jobs import payload, run_jobs
from stages.common.paths import read_json, write_json
from stages.common.runner import StageContext
from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig
from stages.plantain.model import (IGNORE, greedy_traces, rewind_and_repeat, stream_ttfr, tokens_to_target,
                                   trace_answer, trace_plan)
from stages.plantain.prepare import load_split, to_problems
from stages.plantain.task import (PAD, PROMPT_LEN, TraceError, draft_length, make_trace, parse_trace, ttfr_tokens,
                                  validate_plan, visible_mask)


class RRConfig(StageConfig):
    max_retries: int = Field(4, ge=0, le=16, description="rewinds after the first attempt (paper eval: 2)")
    t_plan: float = Field(1.2, gt=0, le=5.0, description="plan sampling temperature (paper: 1.2)")
    top_p: float = Field(0.9, gt=0, le=1.0, description="plan nucleus mass (paper: 0.9)")
    t_rest: float = Field(0.5, ge=0, le=5.0, description="temperature after the plan (0: greedy; > 0 lets an "
                                                         "answer-level retry fix an execution error)")
    prompts: PositiveInt = Field(300, le=20_000, description="test problems for Rewind-and-Repeat")
    target_frac: Fraction = Field(0.5, description="target accuracy: this share of the way from attempt-0 "
                                                   "accuracy to the lower of the two levels' best accuracy")
    token_budgets: list[PositiveInt] = Field(default_factory=lambda: [20, 30, 40, 60, 80, 120], min_length=1,
                                             max_length=32, description="mean tokens per problem (each ≥ 1)")
    seed: Seed = 0

    @field_validator("token_budgets")
    @classmethod
    def _distinct(cls, v):
        return unique_items(v, "rr.token_budgets")


class Config(StageConfig):
    device: DeviceName = "auto"
    torch_threads: int = Field(1, ge=1, le=64)
    workers: int = Field(1, ge=1, le=64, description=(
        "processes for the per-model evaluations (seed, format, SFT/GRPO), one intra-op thread each (1: in this "
        "process, same results; streaming wall-time TTFR, reported only, is timed under the pool's load)"))
    eval_prompts: PositiveInt = Field(300, le=20_000, description="test problems for pass@1 and TTFR")
    wall_prompts: PositiveInt = Field(16, le=1000, description="prompts streamed one at a time for wall-time TTFR")
    rr: RRConfig = RRConfig()

    @model_validator(mode="after")
    def _sizes(self):
        if self.wall_prompts > self.eval_prompts:
            raise ValueError(f"wall_prompts: {self.wall_prompts} exceeds eval_prompts {self.eval_prompts}")
        return self


def load_model(path, mcfg: dict, device) -> TinyTransformer:
    model = TinyTransformer(TinyTransformerConfig(**mcfg)).to(device)
    model.load_state_dict(torch.load(path, map_location=device, weights_only=True))
    return model.eval()


def own_trace_nll(model, prompts, traces, max_trace, rec) -> dict[str, float]:
    """Teacher-forced NLL of the model's own greedy traces, hidden vs visible tokens (kernel hot loop)."""
    B = len(traces)
    seqs = torch.full((B, PROMPT_LEN + max_trace), PAD, dtype=torch.long, device=prompts.device)
    seqs[:, :PROMPT_LEN] = prompts
    mask = torch.zeros(B, max_trace, device=prompts.device)
    vis = torch.zeros(B, max_trace, device=prompts.device)
    for i, t in enumerate(traces):
        seqs[i, PROMPT_LEN:PROMPT_LEN + len(t)] = torch.tensor(t, device=prompts.device)
        mask[i, :len(t)] = 1
        vis[i, :len(t)] = torch.tensor(visible_mask(t), dtype=torch.float, device=prompts.device)
    with torch.no_grad():
        logits = model(seqs[:, :-1])[:, PROMPT_LEN - 1:]
        tgt = torch.where(mask > 0, seqs[:, PROMPT_LEN:], torch.full_like(seqs[:, PROMPT_LEN:], IGNORE))
        logp = rec.call("token_logprob", token_logprob, logits, tgt, ignore_index=IGNORE)
    vm, hm = mask * vis, mask * (1 - vis)
    return {"nll_visible": float(-(logp * vm).sum() / vm.sum().clamp_min(1)),
            "nll_hidden": float(-(logp * hm).sum() / hm.sum().clamp_min(1))}, (logits, tgt)


def eval_run(job: tuple[int, str, str]) -> dict:
    """One trained model's evaluation (a job of ``jobs.run_jobs``: inputs from its payload): greedy pass@1,
    format and plan validity and TTFR per test problem, the NLL of its own traces, streaming wall-time TTFR and,
    for a plan-first model, Rewind-and-Repeat (its generators seeded by ``rr.seed + seed`` only). Returns the raw
    per-problem values; the caller aggregates them."""
    seed, fmt, stage = job
    p = payload()
    cfg, device, max_trace = Config.model_validate(p["cfg"]), torch.device(p["device"]), p["max_trace"]
    n_eval, n_rr, problems = p["n_eval"], p["n_rr"], p["problems"]
    prompts = p["prompts"].to(device)
    rec = KernelRecord(device)
    model = load_model(Path(p["train_dir"]) / f"{fmt}_{stage}_s{seed}.pt", p["model"], device)
    traces = greedy_traces(model, prompts[:n_eval], max_trace)
    ok, fmt_ok, plan_ok, ttfr, draft = [], [], [], [], []
    for q, t in zip(problems[:n_eval], traces):
        draft.append(draft_length(t, fmt))                                # steps drafted before the plan (None: no draft)
        ok.append(trace_answer(t, fmt) == q.answer)
        try:
            parse_trace(t, fmt)
            fmt_ok.append(True)
        except TraceError:
            fmt_ok.append(False)
        plan_ok.append(validate_plan(q, trace_plan(t, fmt)))
        ttfr.append(ttfr_tokens(t))
    nll, (lg, tg) = own_trace_nll(model, prompts[:n_eval], traces, max_trace, rec)
    # streaming decode, one prompt at a time (wall time: reported only)
    walls = [stream_ttfr(model, prompts[i], max_trace) for i in range(cfg.wall_prompts)]
    res = None
    if fmt == "pf":
        # Rewind-and-Repeat on both plan-first models (SFT: plans often faulty; GRPO: after RL). The w_helpful = 0
        # ablation only needs the sampled plans' validity: the oracle judge alone (the same sampling seed, so its
        # first attempts are drawn as the other models')
        res = rewind_and_repeat(model, prompts[:n_rr], problems[:n_rr], max_trace, cfg.rr.max_retries,
                                cfg.rr.t_plan, cfg.rr.top_p, cfg.rr.t_rest, cfg.rr.seed + seed,
                                {"oracle": validate_plan} if stage == "grpo_nohelp" else p["judges"])
    return {"ok": ok, "fmt_ok": fmt_ok, "plan_ok": plan_ok, "ttfr": ttfr, "draft": draft, "nll": nll,
            "parity": (lg[:8].contiguous().cpu(), tg[:8].cpu()), "walls": walls, "rr": res,
            "calls": rec.to_dict().get("token_logprob", {}).get("calls", 0)}


def run(cfg: Config, ctx: StageContext) -> None:
    torch.set_num_threads(cfg.torch_threads)
    device = pick_device(cfg.device)
    info = read_json(ctx.input("train") / "models.json")
    if info.get("kind") == "hf":                   # issue 41: the real model's evaluation
        from stages.plantain.hf_source import evaluate_real
        return evaluate_real(cfg, ctx)
    seeds, formats, mcfg, max_trace = info["seeds"], info["formats"], info["model"], info["max_trace"]
    test = load_split(ctx.input("prepare"), "test")
    problems = to_problems(test)
    prompts = torch.tensor(test["prompt"].to_list(), dtype=torch.long, device=device)
    n_eval, n_rr = min(cfg.eval_prompts, len(problems)), min(cfg.rr.prompts, len(problems))
    rec = KernelRecord(device)
    M: dict = {"seeds": seeds, "eval_prompts": n_eval, "rr_prompts": n_rr, "pass1": {}, "format_ok": {},
               "plan_valid_greedy": {}, "ttfr_tokens": {}, "draft_steps": {}, "draft_parsed": {}, "draft_full": {},
               "nll": {},
               "ttfr_wall": {}, "plan_valid_sampled": {},
               # TTFR of reference traces with no draft on the same problems: what the format alone gives
               "ttfr_reference": {f: float(np.mean([ttfr_tokens(make_trace(q, f)) for q in problems[:n_eval]]))
                                  for f in ("pf", "tta")},
               "rr": {"retries": list(range(cfg.rr.max_retries + 1))}, "rr_judges": {}}
    # the plan judges: the rule-based oracle and every learned one (train stage); the deployed one is the headline
    with open(ctx.input("train") / "judges.pkl", "rb") as f:
        learned = pickle.load(f)
    judges = {"oracle": validate_plan, **{f"learned_{n}": j for n, j in sorted(learned.items())}}
    deployed = info["judge"]["deployed_name"]
    M["judge"] = {"deployed": deployed, "heldout": info["judge"]["quality"]}
    ttfr_rows, rr_rows = [], []
    # one job per (seed, format, model): independent (greedy decoding; R&R with its own seeded generators), in a
    # pool of single-threaded processes; plan-first models first (R&R: the longest), the ablation's after them
    order = [(seed, fmt, stage) for seed in seeds for fmt in formats
             for stage in ("sft", "grpo") + (("grpo_nohelp",) if fmt == "pf" and info["rl"].get("helpful_ablation",
                                                                                                 False) else ())]
    jobs = sorted(order, key=lambda j: (j[1] != "pf", j[2] == "grpo_nohelp"))
    data = {"cfg": cfg.model_dump(mode="json"), "device": str(device), "model": mcfg, "max_trace": max_trace,
            "train_dir": str(ctx.input("train")), "prompts": prompts[:max(n_eval, n_rr)].cpu(),
            "problems": problems[:max(n_eval, n_rr)], "n_eval": n_eval, "n_rr": n_rr, "judges": judges}
    done = dict(zip(jobs, run_jobs(eval_run, jobs, data, cfg.workers)))
    parity_done = False
    for seed, fmt, stage in order:                                       # aggregated in the serial order
        got = done[(seed, fmt, stage)]
        rec.count("token_logprob", got["calls"])
        ok, fmt_ok, plan_ok, ttfr = got["ok"], got["fmt_ok"], got["plan_ok"], got["ttfr"]
        drafted = [d for d in got["draft"] if d is not None]
        for key, vals in (("pass1", ok), ("format_ok", fmt_ok), ("plan_valid_greedy", plan_ok),
                          ("ttfr_tokens", ttfr), ("draft_steps", drafted or [float("nan")]),
                          ("draft_parsed", [d is not None for d in got["draft"]]),
                          ("draft_full", [d == len(q.ops) for d, q in zip(got["draft"], problems[:n_eval])])):
            M[key].setdefault(fmt, {}).setdefault(stage, []).append(float(np.mean(vals)))
        ttfr_rows += [{"seed": seed, "format": fmt, "model": stage, "ttfr_tokens": v, "draft": d,
                       "n_ops": len(p.ops)} for v, d, p in zip(ttfr, got["draft"], problems[:n_eval])]
        for k, v in got["nll"].items():
            M["nll"].setdefault(fmt, {}).setdefault(stage, {}).setdefault(k, []).append(v)
        if not parity_done:
            lg, tg = got["parity"]
            rec.parity("token_logprob", lambda l, t, backend: token_logprob(l, t, ignore_index=IGNORE, backend=backend),
                       lg.to(device), tg.to(device),
                       slice=f"{fmt}.{stage} (seed {seed}) on its own greedy traces of 8 test problems")
            parity_done = True
        walls = got["walls"]
        w = M["ttfr_wall"].setdefault(fmt, {}).setdefault(stage, {"ttfr_ms": [], "ttfr_tokens_stream": []})
        w["ttfr_ms"].append(1e3 * float(np.mean([x["ttfr_wall_s"] for x in walls])))
        w["ttfr_tokens_stream"].append(float(np.mean([x["ttfr_tokens"] for x in walls])))
        if fmt == "pf":
            res = got["rr"]
            # sampled plans that are right (the rule-based oracle's acceptance rate)
            M["plan_valid_sampled"].setdefault(stage, []).append(res["oracle"]["plan_accept_rate"])
            for jname, rr in res.items():
                acc0 = rr["plan"]["acc"][0]
                best = min(max(rr["plan"]["acc"]), max(rr["answer"]["acc"]))
                target = acc0 + cfg.rr.target_frac * max(best - acc0, 0.0)       # reachable by both
                J = M["rr_judges"].setdefault(stage, {}).setdefault(jname, {"target": []})
                J["target"].append(target)
                for key, v in rr["judge_quality"].items():
                    J.setdefault(f"sampled_{key}", []).append(v)
                for level in ("plan", "answer"):
                    c = rr[level]
                    d = J.setdefault(level, {})
                    d.setdefault("acc0", []).append(c["acc"][0])
                    d.setdefault("acc_max", []).append(c["acc"][-1])
                    d.setdefault("tokens_max", []).append(c["tokens"][-1])
                    d.setdefault("tokens_to_target", []).append(
                        tokens_to_target(c["tokens"], c["acc"], target))
                if jname != deployed:
                    continue
                # the deployed judge: the headline Rewind-and-Repeat numbers
                D = M["rr"].setdefault(stage, {"target": []})
                D["target"].append(target)
                for level in ("plan", "answer"):
                    c = rr[level]
                    d = D.setdefault(level, {})
                    d.setdefault("acc0", []).append(c["acc"][0])
                    d.setdefault("acc_max", []).append(c["acc"][-1])
                    d.setdefault("tokens0", []).append(c["tokens"][0])
                    d.setdefault("tokens_max", []).append(c["tokens"][-1])
                    d.setdefault("tokens_to_target", []).append(tokens_to_target(c["tokens"], c["acc"], target))
                    for b in cfg.rr.token_budgets:        # best accuracy whose mean tokens fit the budget
                        fit = [a for a, t in zip(c["acc"], c["tokens"]) if t <= b]
                        d.setdefault(f"acc_at_budget_{b}", []).append(max(fit) if fit else 0.0)
                    for r, (a, t) in enumerate(zip(c["acc"], c["tokens"])):
                        rr_rows.append({"seed": seed, "model": stage, "level": level, "retries": r,
                                        "tokens": t, "acc": a})
    M["rr"]["token_budgets"] = list(cfg.rr.token_budgets)
    rec.save(ctx.out)
    pl.DataFrame(ttfr_rows).write_csv(ctx.out / "ttfr.csv")
    pl.DataFrame(rr_rows).write_csv(ctx.out / "rewind.csv")
    write_json(ctx.out / "eval.json", M)
