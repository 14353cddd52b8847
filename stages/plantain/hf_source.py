"""plantain on a real instruction LM and real math records (issue 41; the `full` profile's path).

Real setting: an instruction LLM (Qwen3-4B in the paper) SFT'd on plan-first interleaved traces, then GRPO with
r = r_format × (1 + r_correct + r_helpful), evaluated with pass@1, time-to-first-response (TTFR) and
Rewind-and-Repeat. No PLANTAIN dataset is public; the records follow MATH-500's documented columns
(HuggingFaceH4/MATH-500: ``problem``, ``answer`` strings; ``solution``/``subject``/``level`` optional and unused)
plus an optional ``trace`` column: the teacher's plan-first trace in the author's tag format
(github.com/aliang8/interleaved_reasoning data_gen: ``<think>…</think><answer>PLAN</answer><think>…</think>
<answer>FINAL</answer>``; PLAN a numbered outline, one item per line). Records without a trace serve as RL /
test prompts. This schema is our reading of the public sources, not a released file format.

* ``load_plantain_records(ref, need_trace=...)``: the records through ``stages.common.hf.load_records``; one-line
  ``SourceError`` for a missing file, bad JSON, a missing column, an empty problem, or a trace that does not
  parse as a plan-first trace.
* ``parse_segments`` / ``to_format``: the tag parser (unbalanced / nested tags and text outside a segment are
  errors naming the character position) and the two formats built from one trace's segments with the same
  content: ``pf`` (plan-first interleaved, as given) and ``tta`` (think-then-answer: every thought and the plan
  inside one ``<think>``, then the final ``<answer>``).
* ``plantain_reward``: r_format = 1[the completion parses in its format]; r_correct = 1[final answer equals the
  record's answer] (last ``\\boxed{}`` or the final answer segment, numbers compared to rel 1e-4, else
  normalised strings); r_helpful = 1[the first visible segment is a plan the judge accepts] (pf only).
  The judge is a callable; ``rule_plan_judge`` (numbered items 1..k, 1 ≤ k ≤ 8, none empty; the repo's judge
  asks for at most 8 items) stands in for the paper's LLM judge.
* ``ttfr_whitespace``: the repo's TTFR (helpers.py): whitespace tokens before the first ``<answer>`` content.
* ``sample_until`` / ``rewind_and_repeat``: KV-cached nucleus sampling from an HF causal LM with a seeded
  generator, stopping at a stop string; plan-level R&R (the plan = text through the first ``</answer>``
  sampled at T = t_plan, top-p; a rejected plan is re-sampled, at most ``max_retries`` times, the last kept;
  then the rest at T = t_rest) vs answer-level R&R (whole traces re-sampled when the answer-level judge rejects
  them); tokens count every attempt, as in the repo's vllm_rewind_and_repeat.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from stages.common.sources import SourceError, real_prepare_meta

TAGS = {"<think>": ("open", "think"), "</think>": ("close", "think"), "<answer>": ("open", "answer"),
        "</answer>": ("close", "answer")}
_TAG_RE = re.compile(r"</?(?:think|answer)>")
MAX_PLAN_ITEMS = 8


class TraceError(ValueError):
    """A malformed trace (one line naming the character position)."""


@dataclass(frozen=True)
class Seg:
    kind: str       # "think" | "answer"
    text: str       # content (stripped)
    start: int      # character offset of the content
    end: int        # character offset of the closing tag


def parse_segments(text: str) -> list[Seg]:
    """``<think>``/``<answer>`` segments in order; whitespace between segments is allowed, anything else is an
    error; so are nested or unbalanced tags and an unclosed segment at the end."""
    segs, open_kind, open_end, pos = [], None, -1, 0
    for m in _TAG_RE.finditer(text):
        what, kind = TAGS[m.group()]
        if open_kind is None and text[pos:m.start()].strip():
            raise TraceError(f"char {pos}: text outside any segment ({text[pos:m.start()].strip()[:30]!r})")
        if what == "open":
            if open_kind is not None:
                raise TraceError(f"char {m.start()}: <{kind}> opened inside <{open_kind}>")
            open_kind, open_end = kind, m.end()
        else:
            if open_kind != kind:
                closes = f"<{open_kind}>" if open_kind else "nothing"
                raise TraceError(f"char {m.start()}: </{kind}> closes {closes}")
            segs.append(Seg(kind, text[open_end:m.start()].strip(), open_end, m.start()))
            open_kind = None
        pos = m.end()
    if open_kind is not None:
        raise TraceError(f"char {len(text)}: the trace ends inside <{open_kind}>")
    if text[pos:].strip():
        raise TraceError(f"char {pos}: text outside any segment ({text[pos:].strip()[:30]!r})")
    if not segs:
        raise TraceError("char 0: no <think>/<answer> segment")
    return segs


def check_format(segs: Sequence[Seg], fmt: str) -> None:
    kinds = [s.kind for s in segs]
    if fmt == "tta":
        ok = kinds == ["think", "answer"]
    elif fmt == "pf":                     # think, plan, then (think, answer)+ : interleaved, plan first
        ok = len(kinds) >= 4 and kinds[:2] == ["think", "answer"] and \
            all(kinds[i:i + 2] == ["think", "answer"] for i in range(2, len(kinds), 2))
    else:
        raise ValueError(f"format: {fmt!r} is not tta or pf")
    if not ok:
        raise TraceError(f"segments {kinds} do not follow the {fmt} format")


def plan_items(plan: str) -> list[str] | None:
    """A numbered outline ('1. …' / '1) …' one per line, numbered 1..k in order) -> its items; else None."""
    lines = [ln.strip() for ln in plan.strip().splitlines() if ln.strip()]
    items = []
    for k, ln in enumerate(lines, 1):
        m = re.match(r"^(?:\*\*)?(\d+)[.)]\s*(.*)$", ln)
        if not m or int(m.group(1)) != k:
            return None
        items.append(m.group(2).strip())
    return items or None


def rule_plan_judge(problem: str, plan: str) -> bool:
    """Stand-in for the LLM judge: a numbered outline of 1..8 non-empty items (the repo asks ≤ 8 items)."""
    items = plan_items(plan)
    return items is not None and len(items) <= MAX_PLAN_ITEMS and all(items)


def to_format(trace: str, fmt: str) -> str:
    """A plan-first trace rewritten in ``fmt`` with the same content: pf as given (normalised), tta = one
    <think> holding every thought and the plan (in order), then the final <answer>."""
    segs = parse_segments(trace)
    check_format(segs, "pf")
    if fmt == "pf":
        return "".join(f"<{s.kind}>{s.text}</{s.kind}>" for s in segs)
    if fmt == "tta":
        body = "\n".join(s.text for s in segs[:-1])
        return f"<think>{body}</think><answer>{segs[-1].text}</answer>"
    raise ValueError(f"format: {fmt!r} is not tta or pf")


def final_answer(segs: Sequence[Seg]) -> str:
    """The last answer segment's last \\boxed{…} content, else the whole segment."""
    text = segs[-1].text
    i = text.rfind("\\boxed{")
    if i >= 0:
        depth, out = 0, []
        for ch in text[i + len("\\boxed"):]:
            depth += ch == "{"
            depth -= ch == "}"
            if depth == 0:
                break
            out.append(ch)
        return "".join(out)[1:].strip()
    return text.strip()


def _norm(s: str) -> str:
    return re.sub(r"\s+", "", s.replace("$", "").replace(",", "")).rstrip(".").lower()


def answers_equal(pred: str, gold: str, rel_tol: float = 1e-4) -> bool:
    p, g = _norm(pred), _norm(gold)
    try:
        return math.isclose(float(p), float(g), rel_tol=rel_tol)
    except ValueError:
        return p != "" and p == g


def plantain_reward(problem: str, gold: str, completion: str, fmt: str,
                    judge: Callable[[str, str], bool] = rule_plan_judge,
                    w_correct: float = 1.0, w_helpful: float = 1.0) -> dict[str, float]:
    """ALGO: r = r_format × (1 + w_c·r_correct + w_h·r_helpful) (paper: weights 1)."""
    try:
        segs = parse_segments(completion)
        check_format(segs, fmt)
    except TraceError:
        return {"r": 0.0, "r_format": 0.0, "r_correct": 0.0, "r_helpful": 0.0}
    r_correct = float(answers_equal(final_answer(segs), gold))
    r_helpful = float(fmt == "pf" and judge(problem, segs[1].text))
    return {"r": 1.0 + w_correct * r_correct + w_helpful * r_helpful, "r_format": 1.0, "r_correct": r_correct,
            "r_helpful": r_helpful}


def ttfr_whitespace(completion: str) -> int:
    """Whitespace tokens before the first <answer> content (repo helpers.py); all of them when none."""
    i = completion.find("<answer>")
    head = completion if i < 0 else completion[:i + len("<answer>")]
    return len(head.replace("<", " <").replace(">", "> ").split())


# ----------------------------------------------------------------------------------------------
# records
# ----------------------------------------------------------------------------------------------
def load_plantain_records(ref: str, *, key: str = "source.dataset", split: str = "train", need_trace: bool = False,
                          revision: str | None = None, limit: int | None = None) -> list[dict[str, str | None]]:
    """MATH-500-style records (+ optional plan-first ``trace``) -> [{"problem", "answer", "trace"}]."""
    from stages.common.hf import load_records

    cols = {"problem": "string", "answer": "string"} | ({"trace": "string"} if need_trace else {})
    ds = load_records(ref, columns=cols, key=key, split=split, revision=revision, limit=limit)
    has_trace = "trace" in ds.column_names
    out = []
    for i, row in enumerate(ds):
        if not isinstance(row["problem"], str) or not row["problem"].strip():
            raise SourceError(f"{key}: {ref} record {i} has an empty problem")
        if not isinstance(row["answer"], str) or not row["answer"].strip():
            raise SourceError(f"{key}: {ref} record {i} has an empty answer")
        trace = row["trace"] if has_trace else None
        if trace is not None:
            try:
                check_format(parse_segments(trace), "pf")
            except TraceError as err:
                raise SourceError(f"{key}: {ref} record {i} trace is not a plan-first trace ({err})") from None
        elif need_trace:
            raise SourceError(f"{key}: {ref} record {i} has no trace (SFT records need one)")
        out.append({"problem": row["problem"], "answer": row["answer"], "trace": trace})
    return out


def chat_prompt(tokenizer, problem: str) -> str:
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": problem}], tokenize=False,
                                             add_generation_prompt=True)
    return problem + "\n"


# ----------------------------------------------------------------------------------------------
# sampling and Rewind-and-Repeat on an HF causal LM
# ----------------------------------------------------------------------------------------------
def _nucleus(logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator | None) -> int:
    if temperature == 0:
        return int(logits.argmax())
    probs = torch.softmax(logits.double() / temperature, -1)
    if top_p < 1.0:
        sp, si = probs.sort(descending=True)
        keep = sp.cumsum(0) - sp < top_p
        probs = torch.zeros_like(probs).scatter_(0, si, torch.where(keep, sp, torch.zeros_like(sp)))
    return int(torch.multinomial(probs, 1, generator=gen))


@torch.no_grad()
def sample_until(model, tokenizer, prefix_ids: Sequence[int], max_new: int, temperature: float, top_p: float,
                 generator: torch.Generator | None, stop: str | None = None) -> list[int]:
    """New token ids after ``prefix_ids`` (KV cache, one row), until EOS (kept), the decoded new text contains
    ``stop``, or ``max_new`` tokens."""
    from stages.common.hf import cache_kwargs, output_cache

    dev = next(model.parameters()).device
    kw = cache_kwargs(model)
    ids = torch.tensor([list(prefix_ids)], dtype=torch.long, device=dev)
    out = model(input_ids=ids, use_cache=True)
    cache, logits = output_cache(out), out.logits[0, -1]
    new: list[int] = []
    for _ in range(max_new):
        y = _nucleus(logits, temperature, top_p, generator)
        new.append(y)
        if y == tokenizer.eos_token_id or (stop and stop in tokenizer.decode(new)):
            break
        out = model(input_ids=torch.tensor([[y]], device=dev), use_cache=True, **{kw: cache})
        cache, logits = output_cache(out), out.logits[0, -1]
    return new


def rewind_and_repeat(model, tokenizer, problems: Sequence[str], golds: Sequence[str], *, max_new: int,
                      max_retries: int, t_plan: float, top_p: float, t_rest: float, seed: int,
                      judge: Callable[[str, str], bool] = rule_plan_judge,
                      answer_judge: Callable[[str, str], bool] | None = None) -> dict:
    """Plan-level vs answer-level Rewind-and-Repeat on plan-first traces (see the module docstring). Attempt k
    of problem i uses generator seed (seed·1000 + k), so attempt 0 is shared by both levels. The answer-level
    judge (default: the trace parses as pf and its plan passes ``judge``; it never sees the gold answer)
    accepts or rejects whole traces. Returns per-R (R = 0..max_retries) accuracy and mean tokens per level,
    plus the raw attempts."""
    answer_judge = answer_judge or (lambda p, c: _pf_plan_ok(p, c, judge))
    K = max_retries + 1
    rows = []
    for i, (prob, gold) in enumerate(zip(problems, golds)):
        prompt = tokenizer(chat_prompt(tokenizer, prob), add_special_tokens=False)["input_ids"]
        atts = []
        for k in range(K):
            g = torch.Generator().manual_seed(seed * 1000 + k + 7919 * i)
            plan_ids = sample_until(model, tokenizer, prompt, max_new, t_plan, top_p, g, stop="</answer>")
            rest = [] if plan_ids and plan_ids[-1] == tokenizer.eos_token_id else \
                sample_until(model, tokenizer, prompt + plan_ids, max_new - len(plan_ids), t_rest, 1.0, g)
            text = tokenizer.decode(plan_ids + rest, skip_special_tokens=True)
            plan_text = tokenizer.decode(plan_ids, skip_special_tokens=True)
            atts.append({"plan_tok": len(plan_ids), "full_tok": len(plan_ids) + len(rest),
                         "plan_ok": _plan_prefix_ok(prob, plan_text, judge), "full_ok": bool(answer_judge(prob, text)),
                         "correct": plantain_reward(prob, gold, text, "pf", judge)["r_correct"] == 1.0, "text": text})
        rows.append(atts)
    out = {"plan": {"acc": [], "tokens": []}, "answer": {"acc": [], "tokens": []}, "attempts": rows}
    for R in range(K):
        for level, ok_key in (("plan", "plan_ok"), ("answer", "full_ok")):
            accs, toks = [], []
            for atts in rows:
                kept = next((k for k in range(R + 1) if atts[k][ok_key]), R)      # first accepted, else the last
                if level == "plan":
                    t = sum(a["plan_tok"] for a in atts[:kept + 1]) + atts[kept]["full_tok"] - atts[kept]["plan_tok"]
                else:
                    t = sum(a["full_tok"] for a in atts[:kept + 1])
                accs.append(float(atts[kept]["correct"]))
                toks.append(float(t))
            out[level]["acc"].append(sum(accs) / len(accs))
            out[level]["tokens"].append(sum(toks) / len(toks))
    return out


def _plan_prefix_ok(problem: str, plan_text: str, judge) -> bool:
    """The plan of a plan-first prefix '<think>…</think><answer>PLAN</answer>' accepted by the judge."""
    try:
        segs = parse_segments(plan_text)
    except TraceError:
        return False
    return [s.kind for s in segs] == ["think", "answer"] and bool(judge(problem, segs[1].text))


def _pf_plan_ok(problem: str, text: str, judge) -> bool:
    try:
        segs = parse_segments(text)
        check_format(segs, "pf")
    except TraceError:
        return False
    return bool(judge(problem, segs[1].text))


def make_reward_fn(tokenizer, problems: Sequence[str], golds: Sequence[str], fmt: str,
                   judge: Callable[[str, str], bool] = rule_plan_judge, w_correct: float = 1.0,
                   w_helpful: float = 1.0):
    """GRPO reward over stages.common.hf.HFCausalPolicy rollouts (rows index ``problems``)."""
    def reward_fn(prompts, roll):
        toks = torch.where(roll["mask"] > 0, roll["tokens"], torch.full_like(roll["tokens"], tokenizer.pad_token_id))
        texts = tokenizer.batch_decode(toks.tolist(), skip_special_tokens=True)
        idx = roll["prompt"].tolist()
        return torch.tensor([plantain_reward(problems[i], golds[i], t, fmt, judge, w_correct, w_helpful)["r"]
                             for i, t in zip(idx, texts)], device=roll["tokens"].device)
    return reward_fn


# ----------------------------------------------------------------------------------------------
# the stages' real path (selected when source.kind != "toy"; full profile only)
# ----------------------------------------------------------------------------------------------
RECORDS_TABLE = "records.parquet"


def prepare_real(cfg, ctx) -> None:
    """prepare (full): SFT records with plan-first traces (``source``) and held-out test records
    (``eval_source``) -> records.parquet (problem, answer, trace, split) + meta.json (kind "plantain_records");
    RL prompts are the SFT problems (the paper's RL set is not public)."""
    import polars as pl

    from stages.common.paths import write_json

    key = f"papers.{ctx.slug}.{ctx.stage}"
    if cfg.eval_source.kind == "toy" or cfg.eval_source.dataset is None or cfg.source.dataset is None:
        raise SourceError(f"{key}.eval_source.dataset: the real path needs SFT records (source) and test records "
                          "(eval_source), kind hf/file")
    sft = load_plantain_records(cfg.source.dataset, key=f"{key}.source.dataset", split=cfg.source.split,
                                need_trace=True, revision=cfg.source.revision, limit=cfg.limit)
    test = load_plantain_records(cfg.eval_source.dataset, key=f"{key}.eval_source.dataset",
                                 split=cfg.eval_source.split, revision=cfg.eval_source.revision, limit=cfg.limit)
    rows = [dict(r, split="sft") for r in sft] + [dict(r, trace=None, split="test") for r in test]
    pl.DataFrame(rows, schema={"problem": pl.String, "answer": pl.String, "trace": pl.String,
                               "split": pl.String}).write_parquet(ctx.out / RECORDS_TABLE)
    write_json(ctx.out / "meta.json", {"kind": "plantain_records", "seeds": list(cfg.seeds), "n_sft": len(sft),
                                       "n_test": len(test), "source": cfg.source.model_dump(mode="json"),
                                       "eval_source": cfg.eval_source.model_dump(mode="json")})


def train_real(cfg, ctx) -> None:
    """train (full): per seed and format (tta / pf, the same traces rewritten by ``to_format``): SFT of the
    pretrained instruction LM on the traces, then GRPO (stages.common.hf.HFCausalPolicy) with
    r_format × (1 + r_correct + r_helpful) on the SFT problems. Writes one save_pretrained folder per format and
    seed (``<fmt>_grpo_s<seed>``), sft_history.csv, rl_history.csv and models.json (kind "hf")."""
    import polars as pl

    from kernels.record import KernelRecord
    from stages.common.device import pick_device
    from stages.common.grpo import GRPOModule, PromptLoader
    from stages.common.hf import HFCausalPolicy, left_pad, pretrained_causal_lm, sft_steps, source_tokenizer
    from stages.common.paths import write_json
    from stages.common.trainer import make_trainer

    key = f"papers.{ctx.slug}.{ctx.stage}"
    meta = real_prepare_meta(ctx, "plantain_records", "a real model needs prepare's real records")
    torch.set_num_threads(cfg.torch_threads)
    device = pick_device(cfg.device)
    sft = pl.read_parquet(ctx.input("prepare") / RECORDS_TABLE).filter(pl.col("split") == "sft")
    tok = source_tokenizer(cfg.source, f"{key}.source")
    probs, golds, traces = sft["problem"].to_list(), sft["answer"].to_list(), sft["trace"].to_list()
    prompts = [chat_prompt(tok, p) for p in probs]
    ids, am = left_pad(tok, prompts)
    rec = KernelRecord(device)
    tcfg = cfg.trainer.model_copy(update={"accelerator": "gpu" if device.type == "cuda" else cfg.trainer.accelerator})
    sft_hist, rl_hist = [], []
    for seed in meta["seeds"]:
        for fmt in cfg.formats:
            model = pretrained_causal_lm(cfg.source, key=f"{key}.source", device=device)
            losses = sft_steps(model, tok, prompts, [to_format(t, fmt) for t in traces], steps=cfg.sft.steps,
                               batch=cfg.sft.batch, lr=cfg.sft.lr, weight_decay=cfg.sft.weight_decay, seed=seed)
            sft_hist += [{"step": i, "loss": v, "fmt": fmt, "seed": seed} for i, v in enumerate(losses)]
            policy = HFCausalPolicy(model, ids.to(device), am.to(device), max_new_tokens=cfg.real_max_new,
                                    eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                    temperature=cfg.rl.temperature, backend=rec.backend,
                                    on_score=lambda: rec.count("token_logprob"))
            grpo = GRPOModule(policy, make_reward_fn(tok, probs, golds, fmt, rule_plan_judge,
                                                     cfg.rl.reward.w_correct, cfg.rl.reward.w_helpful),
                              cfg.rl.grpo, lr=cfg.rl.lr, seed=seed)
            make_trainer(tcfg, ctx.tracker, max_steps=cfg.rl.steps).fit(
                grpo, PromptLoader(torch.arange(len(probs)), cfg.rl.prompts_per_step, cfg.rl.steps, seed=seed))
            model.save_pretrained(ctx.out / f"{fmt}_grpo_s{seed}")
            rl_hist += [dict(h, fmt=fmt, seed=seed) for h in grpo.history]
    tok.save_pretrained(ctx.out / "tokenizer")
    rec.save(ctx.out)
    pl.DataFrame(sft_hist).write_csv(ctx.out / "sft_history.csv")
    pl.DataFrame(rl_hist, infer_schema_length=None).write_csv(ctx.out / "rl_history.csv")
    write_json(ctx.out / "models.json", {"kind": "hf", "seeds": meta["seeds"], "formats": list(cfg.formats),
                                         "max_new": cfg.real_max_new, "source": cfg.source.model_dump(mode="json"),
                                         "sft": cfg.sft.model_dump(mode="json"), "rl": cfg.rl.model_dump(mode="json")})


def evaluate_real(cfg, ctx) -> None:
    """evaluate (full): per seed and format, greedy completions on the test records -> pass@1 (per item) and
    TTFR (whitespace tokens before the first <answer>); for pf, plan- vs answer-level Rewind-and-Repeat.
    Writes metrics.json (kind "hf"); the report judges the claims this path measures (report.run_real)."""
    import polars as pl

    from stages.common.device import pick_device
    from stages.common.hf import load_tokenizer, pretrained_causal_lm
    from stages.common.sources import SourceConfig
    from stages.common.paths import read_json, write_json
    from stages.plantain.model import tokens_to_target

    info = read_json(ctx.input("train") / "models.json")
    device = pick_device(cfg.device)
    test = pl.read_parquet(ctx.input("prepare") / RECORDS_TABLE).filter(pl.col("split") == "test")
    probs, golds = test["problem"].to_list()[:cfg.eval_prompts], test["answer"].to_list()[:cfg.eval_prompts]
    tok = load_tokenizer(ctx.input("train") / "tokenizer", key="train.tokenizer")
    out: dict = {"kind": "hf", "seeds": info["seeds"], "formats": info["formats"], "runs": []}
    for seed in info["seeds"]:
        for fmt in info["formats"]:
            model = pretrained_causal_lm(SourceConfig(kind="file", model=str(ctx.input("train") / f"{fmt}_grpo_s{seed}")),
                                         key=f"train output {fmt}_grpo_s{seed}", device=device).eval()
            texts = []
            for p in probs:
                prompt = tok(chat_prompt(tok, p), add_special_tokens=False)["input_ids"]
                texts.append(tok.decode(sample_until(model, tok, prompt, info["max_new"], 0.0, 1.0, None),
                                        skip_special_tokens=True))
            rs = [plantain_reward(p, g, t, fmt) for p, g, t in zip(probs, golds, texts)]
            row = {"seed": seed, "fmt": fmt, "correct": [r["r_correct"] for r in rs],
                   "format_ok": [r["r_format"] for r in rs], "ttfr_whitespace": [ttfr_whitespace(t) for t in texts]}
            if fmt == "pf":
                n = min(cfg.rr.prompts, len(probs))
                rr = rewind_and_repeat(model, tok, probs[:n], golds[:n], max_new=info["max_new"],
                                       max_retries=cfg.rr.max_retries, t_plan=cfg.rr.t_plan, top_p=cfg.rr.top_p,
                                       t_rest=cfg.rr.t_rest, seed=cfg.rr.seed + seed)
                row["rr"] = {k: rr[k] for k in ("plan", "answer")}
                acc0 = rr["plan"]["acc"][0]                   # the toy's target: reachable by both levels
                best = min(max(rr["plan"]["acc"]), max(rr["answer"]["acc"]))
                row["rr"]["target"] = acc0 + cfg.rr.target_frac * max(best - acc0, 0.0)
                row["rr"]["prompts"] = n
                for level in ("plan", "answer"):
                    c = row["rr"][level]
                    c["tokens_to_target"] = tokens_to_target(c["tokens"], c["acc"], row["rr"]["target"])
            out["runs"].append(row)
    write_json(ctx.out / "metrics.json", out)
