"""The synthetic reasoning task: two-digit addition ``ab+cd`` solved column by column with explicit
steps, a carry, one branch point (fork) and an answer space of 0..198.

Prompt ``a b + c d`` (5 tokens, 10⁴ prompts). Solution, e.g. for ``47+38``:  ``7+8=15;4+3+1=8;#85``
(ones column, tens column with the carry ``+1`` written out when there is one, then the answer) and EOS
padding to the generation length. Addition commutes, so each column may be written either way round:
when ``b ≠ d`` the first generated token is a **fork** (``b`` or ``d``), and the pretraining traces use
either order with equal probability. The answer is the number after ``#``; reward +1 if it equals the
true sum, −1 otherwise (the paper's ±1 reward).

Two correctness levels:
- **answer-level**: the number after ``#`` is right (what the reward and the paper's accuracy read);
- **trace-level**: every step is valid — the generation is exactly ``p+q=r;s+t[+1]=u;#y`` followed by EOS
  only, with {p, q} = {b, d}, r = p + q, {s, t} = {a, c}, ``+1`` present iff r ≥ 10, u = s + t + carry,
  y = 10·u + (r mod 10) = the true sum, every number without leading zeros.

Guessing is rare: the most frequent answer (99) is held by 1 % of prompts (``guess_rate``), where the
earlier mod-5 task let a guessed digit score 20 % and saturate pass@64.
"""
from __future__ import annotations

import re

import numpy as np
import torch

N_DIGIT = 10          # prompt digits 0..9: operands 0..99
MAX_ANSWER = 198
DIGITS = [str(d) for d in range(10)]
SYMBOLS = ["+", "*", "=", ";", "#"]
PLUS, TIMES, EQ, SEMI, HASH = 10, 11, 12, 13, 14   # TIMES is unused by this task (kept: stable token ids)
EOS, MASK = 15, 16
VOCAB = DIGITS + SYMBOLS + ["<eos>", "<mask>"]
VOCAB_SIZE = len(VOCAB)
PROMPT_LEN = 5
ANSWER_LEN = 20  # longest solution: "9+9=18;9+9+1=19;#198"
ORDERS = ("left", "right")  # left: each column written in prompt order (b+d, a+c); right: swapped


def digits(n: int) -> list[int]:
    return [int(ch) for ch in str(int(n))]


def value(a: int, b: int, c: int, d: int) -> int:
    return 10 * a + b + 10 * c + d


def prompt_tokens(a: int, b: int, c: int, d: int) -> list[int]:
    return [a, b, PLUS, c, d]


def solution(a: int, b: int, c: int, d: int, order: str, gen_len: int, drop_carry: bool = False) -> list[int]:
    """The canonical trace for one order, EOS-padded to ``gen_len``. ``drop_carry``: the imperfect teacher's slip
    (pretraining data only) — the tens column written without the carry, so the tens sum and the answer are one
    ten short (an invalid trace with a wrong answer; no change where there is no carry)."""
    ones = b + d
    carry = 0 if drop_carry else ones // 10
    tens = a + c + carry
    p, q, s, t = (b, d, a, c) if order == "left" else (d, b, c, a)
    toks = ([p, PLUS, q, EQ] + digits(ones) + [SEMI]
            + [s, PLUS, t] + ([PLUS, 1] if carry else []) + [EQ] + digits(tens) + [SEMI]
            + [HASH] + digits(10 * tens + ones % 10))
    if len(toks) > gen_len:
        raise ValueError(f"gen_len {gen_len} is shorter than the {len(toks)}-token solution")
    return toks + [EOS] * (gen_len - len(toks))


def all_prompts() -> np.ndarray:
    """Every prompt (10⁴ rows): columns a, b, c, d."""
    g = np.arange(N_DIGIT)
    return np.stack(np.meshgrid(g, g, g, g, indexing="ij"), -1).reshape(-1, 4).astype(np.int64)


def prompt_batch(rows: torch.Tensor) -> torch.Tensor:
    """(N, 4) digit rows a, b, c, d -> (N, PROMPT_LEN) prompt tokens ``a b + c d``."""
    p = torch.full((rows.shape[0], 1), PLUS, dtype=rows.dtype, device=rows.device)
    return torch.cat([rows[:, :2], p, rows[:, 2:]], 1)


def operands(prompts: torch.Tensor) -> torch.Tensor:
    """(N, PROMPT_LEN) prompt tokens -> (N, 4) digits a, b, c, d."""
    return prompts[:, [0, 1, 3, 4]]


def is_fork(prompts: torch.Tensor) -> torch.Tensor:
    """(N, 5) -> (N,) bool: the ones column's two orders start with different tokens (b ≠ d): position 0 forks."""
    return prompts[:, 1] != prompts[:, 4]


def answers(prompts: torch.Tensor) -> torch.Tensor:
    o = operands(prompts)
    return 10 * o[:, 0] + o[:, 1] + 10 * o[:, 2] + o[:, 3]


def render(tokens) -> str:
    return "".join(VOCAB[int(t)] if int(t) < EOS else "" for t in tokens)


def _text(row: list[int]) -> str | None:
    """Tokens up to the first EOS as text; None when a non-EOS token follows an EOS or a MASK remains."""
    n = row.index(EOS) if EOS in row else len(row)
    if any(t != EOS for t in row[n:]) or any(t >= EOS for t in row[:n]):
        return None
    return "".join(VOCAB[t] for t in row[:n])


_NUM = r"(0|[1-9]\d*)"
_TRACE = re.compile(rf"^(\d)\+(\d)={_NUM};(\d)\+(\d)(\+1)?={_NUM};#{_NUM}$")


def extract_answer(gen: torch.Tensor) -> torch.Tensor:
    """(B, L) generations -> (B,) the number right after the first '#' (up to 3 digits, no leading
    zero), −1 when absent or malformed."""
    out = []
    for row in gen.tolist():
        if HASH not in row:
            out.append(-1)
            continue
        i = row.index(HASH) + 1
        ds = []
        while i < len(row) and row[i] < 10 and len(ds) <= 3:
            ds.append(row[i])
            i += 1
        ok = 1 <= len(ds) <= 3 and not (len(ds) > 1 and ds[0] == 0)
        out.append(int("".join(map(str, ds))) if ok else -1)
    return torch.tensor(out, dtype=torch.long, device=gen.device)


def trace_valid(gen: torch.Tensor, prompts: torch.Tensor) -> torch.Tensor:
    """(B, L), (B, 5) -> (B,) bool: every step of the generation is valid (module docstring)."""
    ok = []
    for row, ops in zip(gen.tolist(), operands(prompts).tolist()):
        text = _text(row)
        m = _TRACE.match(text) if text is not None else None
        if m is None:
            ok.append(False)
            continue
        p, q, r, s, t, plus1, u, y = m.groups()
        p, q, r, s, t, u, y = map(int, (p, q, r, s, t, u, y))
        a, b, c, d = ops
        carry = int(plus1 is not None)
        ok.append(sorted((p, q)) == sorted((b, d)) and r == p + q and sorted((s, t)) == sorted((a, c))
                  and carry == (r >= 10) and u == s + t + carry and y == 10 * u + r % 10)
    return torch.tensor(ok, dtype=torch.bool, device=gen.device)


def correct(gen: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Answer-level correctness."""
    return extract_answer(gen) == truth


def guess_rate(answers_: np.ndarray) -> float:
    """pass@1 of the best constant guesser: the share of prompts holding the most frequent answer."""
    return float(np.bincount(np.asarray(answers_, dtype=np.int64)).max() / len(answers_))
