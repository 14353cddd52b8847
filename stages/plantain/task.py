"""The PLANTAIN miniature task: list pipelines written as function compositions, with traces in two
formats, a segment parser, the rule-based plan validator (the stand-in for the paper's LLM judge)
and the reward r = r_format × (1 + w_c·r_correct + w_h·r_helpful).

Problem: ``o1 d1 o2 d2 … on dn ( x )`` means o1 d1 ∘ o2 d2 ∘ … ∘ on dn applied to x (the innermost,
LAST written operation first), arithmetic mod MOD = 5, o ∈ {+, −, ×}. 3–6 operations. The *plan* is the
operations in execution order (the written list reversed); the *steps* apply them one by one.

Two trace formats (token names, space separated):
    think-then-answer (TTA):   <think> n | PLAN | STEPS </think> <ans> y </ans> <eos>
    plan-first interleaved (PF): <think> n </think> <ans> PLAN </ans> <think> STEPS </think> <ans> y </ans> <eos>
PLAN = ``#k o d`` per operation (a numbered outline); STEPS = the start value x, then ``#k o d v`` per operation (v: value after it); ``n`` = number of
operations. Visible = inside <ans>…</ans>; everything else is hidden.

Pre-plan thought of variable length (issue 47: a TTFR the model decides): ``n`` followed by a DRAFT of the first
j steps worked out before anything is shown (``x #1 o d v … #j o d v``; nothing for j = 0), in both formats so that
the two carry the same content and differ only in what is visible when:
    TTA: <think> n DRAFT | PLAN | STEPS </think> …        PF: <think> n DRAFT </think> <ans> PLAN </ans> …
Injected plan errors (prepare): with probability p_err·(n − j)/n the plan has one error (adjacent swap, a dropped
operation, or a wrong operand) among the operations the draft did not reach (the drafted ones are copied from the
draft), and the steps EXECUTE the faulty plan, so the answer follows it — the model learns a planner that sometimes
plans wrongly, less often the longer it thought first (which Rewind-and-Repeat can also fix). How long to draft is
the model's choice at generation: the plan-first TTFR (4 + the draft's tokens) is measured, not fixed.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DIGITS = [str(d) for d in range(10)]
OPS = ["+", "-", "*"]
SPECIAL = ["(", ")", "|", "<think>", "</think>", "<ans>", "</ans>", "<eos>", "<pad>"]
MAX_OPS = 6
MARKERS = [f"#{k}" for k in range(1, MAX_OPS + 1)]  # numbered plan items / steps ("1.", "2.", … of an outline)
VOCAB = DIGITS + OPS + SPECIAL + MARKERS
TOK = {t: i for i, t in enumerate(VOCAB)}
VOCAB_SIZE = len(VOCAB)
PLUS, MINUS, TIMES = TOK["+"], TOK["-"], TOK["*"]
LPAR, RPAR, BAR = TOK["("], TOK[")"], TOK["|"]
THINK, ETHINK, ANS, EANS, EOS, PAD = (TOK[t] for t in ("<think>", "</think>", "<ans>", "</ans>", "<eos>", "<pad>"))
OPEN_TAGS = {THINK: "think", ANS: "ans"}
CLOSE_TAGS = {ETHINK: "think", EANS: "ans"}
MOD = 5                                            # arithmetic modulus (values and answers 0..MOD−1)
OPERANDS = {PLUS: [1, 2], MINUS: [1, 2], TIMES: [2, 3]}   # × by units mod 5 (a small table: the model is tiny)
MARK = [TOK[m] for m in MARKERS]
PROMPT_LEN = 2 * MAX_OPS + 3                       # left-padded with <pad> to a fixed length
FORMATS = ("tta", "pf")
ERROR_KINDS = ("swap", "drop", "operand")
CHANCE = 1.0 / MOD                                 # a guessed answer digit


class TraceError(ValueError):
    """A malformed trace; the message names the token position."""


def apply_op(op: int, d: int, x: int) -> int:
    if op == PLUS:
        return (x + d) % MOD
    if op == MINUS:
        return (x - d) % MOD
    return (x * d) % MOD


@dataclass(frozen=True)
class Problem:
    x: int
    ops: tuple[tuple[int, int], ...]               # as WRITTEN: outermost first

    @property
    def plan(self) -> list[tuple[int, int]]:
        """The correct plan: execution order = the written list reversed (innermost first)."""
        return list(reversed(self.ops))

    @property
    def answer(self) -> int:
        return execute(self.x, self.plan)[-1]

    def prompt(self) -> list[int]:
        toks = [t for o, d in self.ops for t in (o, d)] + [LPAR, self.x, RPAR]
        return [PAD] * (PROMPT_LEN - len(toks)) + toks


def execute(x: int, plan: list[tuple[int, int]]) -> list[int]:
    """Values after each step of a plan (the steps segment); [x] for an empty plan."""
    vals = [x]
    for o, d in plan:
        vals.append(apply_op(o, d, vals[-1]))
    return vals if plan else [x]


def sample_problem(rng: np.random.Generator, min_ops: int, max_ops: int) -> Problem:
    n = int(rng.integers(min_ops, max_ops + 1))
    ops = []
    for _ in range(n):
        o = [PLUS, MINUS, TIMES][int(rng.integers(3))]
        ops.append((o, int(rng.choice(OPERANDS[o]))))
    return Problem(int(rng.integers(MOD)), tuple(ops))


def corrupt_plan(plan: list[tuple[int, int]], kind: str, rng: np.random.Generator,
                 keep: int = 0) -> list[tuple[int, int]]:
    """One injected plan-level error that the validator must catch (the plan always changes), among the
    operations after the first ``keep`` (those a pre-plan draft already worked out stay as they are)."""
    if not 0 <= keep < len(plan):
        raise ValueError(f"keep: {keep} leaves no operation of a {len(plan)}-operation plan to corrupt")
    head, p = list(plan[:keep]), list(plan[keep:])
    return head + _corrupt(p, kind, rng)


def _corrupt(p: list[tuple[int, int]], kind: str, rng: np.random.Generator) -> list[tuple[int, int]]:
    if kind == "swap":
        idx = [i for i in range(len(p) - 1) if p[i] != p[i + 1]]
        if not idx:
            kind = "operand"
        else:
            i = int(rng.choice(idx))
            p[i], p[i + 1] = p[i + 1], p[i]
            return p
    if kind == "drop":
        del p[int(rng.integers(len(p)))]
        return p
    i = int(rng.integers(len(p)))
    o, d = p[i]
    p[i] = (o, int(rng.choice([e for e in OPERANDS[o] + ([0] if o != TIMES else [1]) if e != d])))
    return p


def draft_tokens(prob: Problem, j: int) -> list[int]:
    """The pre-plan draft: the first ``j`` steps of the correct plan, worked out (``x #1 o d v … #j o d v``);
    [] at j = 0."""
    if not 0 <= j <= len(prob.ops):
        raise ValueError(f"draft: {j} steps for a problem of {len(prob.ops)} operations")
    if j == 0:
        return []
    plan = prob.plan
    vals = execute(prob.x, plan[:j])
    return [prob.x] + [t for k, ((o, d), v) in enumerate(zip(plan[:j], vals[1:])) for t in (MARK[k], o, d, v)]


def make_trace(prob: Problem, fmt: str, plan: list[tuple[int, int]] | None = None, draft: int = 0) -> list[int]:
    """Token ids of a trace in format ``fmt`` that follows ``plan`` (default: the correct plan), with a pre-plan
    draft of the first ``draft`` steps (``draft_tokens``; the plan is not checked against it)."""
    plan = prob.plan if plan is None else plan
    vals = execute(prob.x, plan)
    plan_toks = [t for k, (o, d) in enumerate(plan) for t in (MARK[k], o, d)]
    steps = [prob.x] + [t for k, ((o, d), v) in enumerate(zip(plan, vals[1:])) for t in (MARK[k], o, d, v)]
    y = vals[-1]
    pre = [THINK, len(prob.ops), *draft_tokens(prob, draft)]
    if fmt == "tta":
        return [*pre, BAR, *plan_toks, BAR, *steps, ETHINK, ANS, y, EANS, EOS]
    if fmt == "pf":
        return [*pre, ETHINK, ANS, *plan_toks, EANS, THINK, *steps, ETHINK, ANS, y, EANS, EOS]
    raise ValueError(f"format: {fmt!r} is not one of {FORMATS}")


def draft_length(toks, fmt: str) -> int | None:
    """Steps drafted before the plan in a generated trace (the tokens after ``<think> n`` up to the plan, read as
    ``x`` then ``#k o d v`` items; values are not checked); None when the pre-plan thought is not one."""
    toks = [int(t) for t in toks]
    stop = ETHINK if fmt == "pf" else BAR
    if len(toks) < 3 or toks[0] != THINK or toks[1] >= 10 or stop not in toks[2:]:
        return None
    body = toks[2:2 + toks[2:].index(stop)]
    if not body:
        return 0
    if (len(body) - 1) % 4 or body[0] >= 10 or len(body) > 1 + 4 * MAX_OPS:
        return None
    items = [body[1 + 4 * k:5 + 4 * k] for k in range((len(body) - 1) // 4)]
    ok = all(m == MARK[k] and o in OPERANDS and d < 10 and v < 10 for k, (m, o, d, v) in enumerate(items))
    return len(items) if ok else None


def decode_text(toks) -> str:
    return " ".join(VOCAB[int(t)] for t in toks)


def encode_text(text: str) -> list[int]:
    out = []
    for i, w in enumerate(text.split()):
        if w not in TOK:
            raise TraceError(f"token {i}: unknown token {w!r}")
        out.append(TOK[w])
    return out


# ----------------------------------------------------------------------------------------------
# parsing
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Segment:
    kind: str            # "think" | "ans"
    start: int           # position of the first content token
    end: int             # position of the closing tag (content = toks[start:end])


def parse_segments(toks) -> list[Segment]:
    """Split a generated trace into <think>/<ans> segments up to <eos>. Raises TraceError naming the
    position on unbalanced or nested tags, text outside a segment, or a missing <eos>."""
    toks = [int(t) for t in toks]
    segs, open_kind, open_at = [], None, -1
    for i, t in enumerate(toks):
        if t == EOS:
            if open_kind is not None:
                raise TraceError(f"position {i}: <eos> inside an unclosed <{open_kind}> opened at position {open_at}")
            return segs
        if t in OPEN_TAGS:
            if open_kind is not None:
                raise TraceError(f"position {i}: <{OPEN_TAGS[t]}> opened inside <{open_kind}> "
                                 f"(opened at position {open_at})")
            open_kind, open_at = OPEN_TAGS[t], i
        elif t in CLOSE_TAGS:
            if open_kind != CLOSE_TAGS[t]:
                raise TraceError(f"position {i}: </{CLOSE_TAGS[t]}> closes "
                                 + (f"<{open_kind}> opened at position {open_at}" if open_kind else "nothing"))
            segs.append(Segment(open_kind, open_at + 1, i))
            open_kind = None
        elif open_kind is None:
            raise TraceError(f"position {i}: token {VOCAB[t]!r} outside any segment")
    if open_kind is not None:
        raise TraceError(f"position {len(toks)}: trace ends inside <{open_kind}> opened at position {open_at}")
    raise TraceError(f"position {len(toks)}: trace ends without <eos>")


def check_format(segs: list[Segment], fmt: str) -> None:
    kinds = [s.kind for s in segs]
    want = ["think", "ans"] if fmt == "tta" else ["think", "ans", "think", "ans"]
    if kinds != want:
        raise TraceError(f"segments {kinds} do not follow the {fmt} format {want}")


def parse_trace(toks, fmt: str) -> dict:
    """-> {"plan": [(o, d)] | None, "answer": int | None, "segments": [...]}; raises TraceError."""
    toks = [int(t) for t in toks]
    segs = parse_segments(toks)
    check_format(segs, fmt)
    last = toks[segs[-1].start:segs[-1].end]
    answer = last[0] if len(last) == 1 and last[0] < 10 else None
    if fmt == "pf":
        plan_toks = toks[segs[1].start:segs[1].end]
    else:
        parts = _split_bar(toks[segs[0].start:segs[0].end])
        plan_toks = parts[1] if len(parts) == 3 else None       # no "n | PLAN | STEPS" structure: no plan
    return {"plan": None if plan_toks is None else plan_pairs(plan_toks), "answer": answer, "segments": segs}


def _split_bar(body: list[int]) -> list[list[int]]:
    parts, cur = [], []
    for t in body:
        if t == BAR:
            parts.append(cur)
            cur = []
        else:
            cur.append(t)
    return parts + [cur]


def plan_pairs(plan_toks: list[int]) -> list[tuple[int, int]] | None:
    """Numbered plan ``#1 o d #2 o d …`` -> [(o, d), …]; None when it is not one."""
    if len(plan_toks) % 3 or len(plan_toks) > 3 * MAX_OPS:
        return None
    items = [plan_toks[i:i + 3] for i in range(0, len(plan_toks), 3)]
    ok = all(m == MARK[k] and o in OPERANDS and d < 10 for k, (m, o, d) in enumerate(items))
    return [(o, d) for _, o, d in items] if ok else None


def visible_mask(toks) -> list[bool]:
    """Per token: inside an <ans> segment (the user sees it while streaming)."""
    out, inside = [], False
    for t in toks:
        t = int(t)
        if t == EANS:
            inside = False
        out.append(inside)
        if t == ANS:
            inside = True
    return out


def ttfr_tokens(toks) -> int:
    """Tokens generated before the first visible content token (the paper's TTFR in tokens: for
    plan-first, everything before the first <answer> content; for think-then-answer, the thought
    through </think> and the <ans> tag). len(toks) when nothing visible is ever produced."""
    vis = visible_mask(toks)
    return vis.index(True) if True in vis else len(vis)


# ----------------------------------------------------------------------------------------------
# judge and reward
# ----------------------------------------------------------------------------------------------
def validate_plan(prob: Problem, plan: list[tuple[int, int]] | None) -> bool:
    """Rule-based plan judge (stand-in for the paper's LLM judge): the plan is helpful iff it lists
    exactly the problem's operations, each once, innermost first (the order that evaluates the
    composition). Uses the problem statement only, never the answer."""
    return plan is not None and list(plan) == prob.plan


def steps_follow_plan(prob: Problem, toks, fmt: str) -> bool:
    """The trace is well formed and executes ITS OWN plan: the steps segment is the start value x, then ``#k o d v``
    per plan item with the right arithmetic, and the answer is the last step's value. Checks the work, not the
    plan (no gold plan is read): a verifier that re-does the arithmetic, like a unit test."""
    try:
        tr = parse_trace(toks, fmt)
    except TraceError:
        return False
    plan = tr["plan"]
    if plan is None or tr["answer"] is None:
        return False
    toks = [int(t) for t in toks]
    seg = tr["segments"][2] if fmt == "pf" else tr["segments"][0]
    body = toks[seg.start:seg.end]
    if fmt == "tta":
        parts = _split_bar(body)
        if len(parts) != 3:
            return False
        body = parts[2]
    if len(body) != 1 + 4 * len(plan) or body[0] != prob.x:
        return False
    v = prob.x
    for k, (o, d) in enumerate(plan):
        v = apply_op(o, d, v)
        if body[1 + 4 * k:5 + 4 * k] != [MARK[k], o, d, v]:
            return False
    return tr["answer"] == v


def validate_trace(prob: Problem, toks, fmt: str, judge=None) -> bool:
    """Answer-level judge: the trace's plan passes the plan judge (``judge(prob, plan)``, default the rule-based
    ``validate_plan``) and the trace executes that plan correctly through to its answer (``steps_follow_plan``)."""
    judge = validate_plan if judge is None else judge
    try:
        plan = parse_trace(toks, fmt)["plan"]
    except TraceError:
        return False
    return plan is not None and bool(judge(prob, plan)) and steps_follow_plan(prob, toks, fmt)


def reward(prob: Problem, toks, fmt: str, w_correct: float = 1.0, w_helpful: float = 1.0,
           judge=None, tta_process_reward: bool = False) -> dict[str, float]:
    """ALGO: PLANTAIN reward r = r_format × (1 + w_c·r_correct + w_h·r_helpful)  (paper: weights 1).
    r_format = 1[the trace parses in its format]; r_correct = 1[final answer right];
    r_helpful = 1[the trace's plan is accepted by the judge] — ``judge(prob, plan) -> bool``, default the
    rule-based ``validate_plan``. For plan-first that plan is the first visible segment (the paper's
    r_helpful); a think-then-answer trace shows no intermediate answer, so the paper gives it no r_helpful:
    with ``tta_process_reward`` (issue 47) the same judge is applied to the plan inside its thinking, an
    equivalent process reward, so that the two formats differ only in the ordering."""
    judge = validate_plan if judge is None else judge
    try:
        tr = parse_trace(toks, fmt)
        r_format = 1.0
    except TraceError:
        return {"r": 0.0, "r_format": 0.0, "r_correct": 0.0, "r_helpful": 0.0}
    r_correct = float(tr["answer"] == prob.answer)
    judged = fmt == "pf" or tta_process_reward
    r_helpful = float(judged and tr["plan"] is not None and bool(judge(prob, tr["plan"])))
    r = r_format * (1.0 + w_correct * r_correct + w_helpful * r_helpful)    # ALGO: r_fmt × (1 + r_cor + r_help)
    return {"r": r, "r_format": r_format, "r_correct": r_correct, "r_helpful": r_helpful}


def problem_from_prompt(prompt) -> Problem:
    toks = [int(t) for t in prompt if int(t) != PAD]
    if len(toks) < 5 or toks[-3] != LPAR or toks[-1] != RPAR or (len(toks) - 3) % 2:
        raise TraceError(f"prompt {decode_text(prompt)!r} is not 'o d … ( x )'")
    ops = tuple((toks[i], toks[i + 1]) for i in range(0, len(toks) - 3, 2))
    return Problem(toks[-2], ops)
