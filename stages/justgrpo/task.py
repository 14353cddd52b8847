"""The synthetic reasoning task: two-step modular arithmetic with explicit intermediate steps and
branch points (forks).

Prompt ``a o1 b o2 c`` (digits 0..MOD−1, o ∈ {+, *}, arithmetic mod MOD = 5, * before +: 500 prompts,
small enough for a tiny dLLM to learn the tables within the CPU budget). Solution, one
digit per number, e.g. for ``3+4*2``:   ``4*2=3;3+3=1;#1`` then EOS padding to the generation length.
When both operators are the same either pair may be reduced first (associativity), so the first
generated token is a **fork**: ``a`` (reduce a∘b first) or ``b`` (reduce b∘c first). With mixed
operators precedence fixes the order. The answer is the digit after ``#``; reward +1 if it equals
the true value, −1 otherwise (the paper's ±1 reward).
"""
from __future__ import annotations

import numpy as np
import torch

MOD = 5      # modulus of the arithmetic (answers are digits 0..MOD-1; chance = 1/MOD)
DIGITS = [str(d) for d in range(10)]
SYMBOLS = ["+", "*", "=", ";", "#"]
PLUS, TIMES, EQ, SEMI, HASH = 10, 11, 12, 13, 14
EOS, MASK = 15, 16
VOCAB = DIGITS + SYMBOLS + ["<eos>", "<mask>"]
VOCAB_SIZE = len(VOCAB)
PROMPT_LEN = 5
ANSWER_LEN = 14  # "x o y = z ; x o y = z ; # Y": the shortest generation that holds the answer format


def apply(op: int, x: int, y: int) -> int:
    return (x + y) % MOD if op == PLUS else (x * y) % MOD


def value(a: int, o1: int, b: int, o2: int, c: int) -> int:
    if o1 == TIMES or o2 == PLUS:          # left pair first is always correct then
        return apply(o2, apply(o1, a, b), c)
    return apply(o1, a, apply(o2, b, c))   # a + b*c


def valid_orders(o1: int, o2: int) -> list[str]:
    """'left' = reduce a∘b first, 'right' = reduce b∘c first."""
    if o1 == o2:
        return ["left", "right"]
    return ["left"] if o1 == TIMES else ["right"]


def solution(a: int, o1: int, b: int, o2: int, c: int, order: str, gen_len: int) -> list[int]:
    if order == "left":
        x = apply(o1, a, b)
        y = apply(o2, x, c)
        toks = [a, o1, b, EQ, x, SEMI, x, o2, c, EQ, y, SEMI, HASH, y]
    else:
        x = apply(o2, b, c)
        y = apply(o1, a, x)
        toks = [b, o2, c, EQ, x, SEMI, a, o1, x, EQ, y, SEMI, HASH, y]
    return toks + [EOS] * (gen_len - len(toks))


def all_prompts() -> np.ndarray:
    """Every prompt (2·MOD³ ·2 = 500 rows): columns a, o1, b, o2, c."""
    rows = [(a, o1, b, o2, c) for a in range(MOD) for o1 in (PLUS, TIMES) for b in range(MOD)
            for o2 in (PLUS, TIMES) for c in range(MOD)]
    return np.array(rows, dtype=np.int64)


def is_fork(prompts: torch.Tensor) -> torch.Tensor:
    """(N, 5) -> (N,) bool: two valid orders whose first tokens differ (a ≠ b), i.e. position 0 forks."""
    return (prompts[:, 1] == prompts[:, 3]) & (prompts[:, 0] != prompts[:, 2])


def answers(prompts: torch.Tensor) -> torch.Tensor:
    return torch.tensor([value(*map(int, p)) for p in prompts.tolist()], dtype=torch.long,
                        device=prompts.device)


def extract_answer(gen: torch.Tensor) -> torch.Tensor:
    """(B, L) generations -> (B,) answer digit after the first '#' (−1 when absent or not a digit)."""
    B, L = gen.shape
    is_hash = gen[:, :-1] == HASH
    has = is_hash.any(1)
    first = torch.where(has, is_hash.float().argmax(1), torch.zeros_like(has, dtype=torch.long))
    nxt = gen.gather(1, (first + 1).clamp(max=L - 1)[:, None]).squeeze(1)
    ok = has & (nxt < 10)
    return torch.where(ok, nxt, torch.full_like(nxt, -1))


def correct(gen: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    return extract_answer(gen) == truth


def render(tokens) -> str:
    return "".join(VOCAB[int(t)] if int(t) < EOS else "" for t in tokens)
