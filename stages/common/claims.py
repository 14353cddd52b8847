"""Claims as data: a name, the paper's statement, and a check expression over measured metrics.

    Claim("bridge_reverses", "With the A∪B bridge the model reverses held-out facts",
          "theory.bridge_ab.reverse_acc > 10 * theory.chance and theory.none.reverse_acc < 0.1")

The check is a small expression language (numbers, dotted metric names, + - * / **, comparisons,
and/or/not, abs/min/max) evaluated against the flattened metrics; no arbitrary Python runs.
A claim's verdict records every metric its check reads, so the report shows the numbers.

Comparisons of learned arms use the seed-aware shapes below instead of a bare expression. Each
reads per-seed lists from the metrics (same seeds, same order, paired) and gives one of three
verdicts: ``holds`` (the gap exceeds 2 standard errors of the per-seed differences AND the claim
wins on a strict majority of seeds), ``fails`` (the reverse is supported the same way) or
``inconclusive`` (neither; also whenever fewer than 3 seeds were run).

    Better("opus_beats_random", "OPUS reaches lower target loss than random",
           a="arms.opus.val_loss", b="arms.random.val_loss", higher_is_better=False)
    Within("matches_gft", "within 0.02 R² of the full GFT", a="r2.l2g", b="r2.gft", delta=0.02)
    Bound("sublinear", "regret exponent below 1", value="fit.regret_slope", below=1.0)
    Near("rate", "coverage near 95%", value="cov.single", ref=0.95, tol=0.03)

``a``/``b``/``value`` name per-seed lists; ``b``, ``bound`` and ``ref`` may also be a number or
the name of a scalar metric. ``refuted_by`` (every shape, and plain ``Claim``) says in words which
result would have refuted the claim; the report prints it.
"""
from __future__ import annotations

import ast
import math
import operator
from dataclasses import dataclass
from typing import Any, Mapping

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.Pow: operator.pow}
_CMPOPS = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
           ast.Eq: operator.eq, ast.NotEq: operator.ne}
_FUNCS = {"abs": abs, "min": min, "max": max}


class ClaimError(ValueError):
    """A claim's check is malformed or reads a metric that was not measured."""


@dataclass(frozen=True)
class Claim:
    name: str
    statement: str
    check: str
    refuted_by: str = ""

    def names(self) -> list[str]:
        return _dotted_names(_parse(self.check, self.name))

    def evaluate(self, env: Mapping[str, Any]) -> dict[str, Any]:
        tree = _parse(self.check, self.name)
        holds = bool(_eval(tree, env, self.name))
        values = {}
        for key in _dotted_names(tree):
            value = env[key]
            values[key] = float(value) if not isinstance(value, bool) else value
            if isinstance(values[key], float) and not math.isfinite(values[key]):
                holds = False
        return {"name": self.name, "statement": self.statement, "check": self.check,
                "holds": holds, "verdict": "holds" if holds else "fails", "values": values,
                "refuted_by": self.refuted_by}


MIN_SEEDS = 3


def _seed_values(env: Mapping[str, Any], key: str, claim: str) -> list[float]:
    if key not in env:
        raise ClaimError(f"claim {claim!r}: metric {key!r} was not measured")
    value = env[key]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [float(value)]
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        raise ClaimError(f"claim {claim!r}: metric {key!r} is not a per-seed list of numbers ({value!r})")
    return [float(v) for v in value]


def _operand(env: Mapping[str, Any], ref: float | str, n: int, claim: str) -> list[float]:
    """A per-seed list, or a number / scalar metric broadcast to n seeds."""
    if isinstance(ref, (int, float)) and not isinstance(ref, bool):
        return [float(ref)] * n
    vals = _seed_values(env, ref, claim)
    if len(vals) == 1:
        return vals * n
    if len(vals) != n:
        raise ClaimError(f"claim {claim!r}: {ref!r} has {len(vals)} seeds, expected {n} (paired)")
    return vals


def _named(values: dict[str, Any], ref: float | str, resolved: list[float]) -> dict[str, Any]:
    """values plus the reference operand when it is a metric (a constant is already in `check`)."""
    return {**values, ref: resolved} if isinstance(ref, str) else values


def seed_stats(diffs: list[float]) -> dict[str, float]:
    """Mean, standard error (sample sd / sqrt n) and win fraction of per-seed differences."""
    n = len(diffs)
    mean = sum(diffs) / n
    var = sum((d - mean) ** 2 for d in diffs) / (n - 1) if n > 1 else math.inf
    return {"n": n, "mean": mean, "se": math.sqrt(var / n) if n > 1 else math.inf,
            "wins": sum(d > 0 for d in diffs) / n, "losses": sum(d < 0 for d in diffs) / n}


def gap_verdict(diffs: list[float]) -> tuple[str, dict[str, float]]:
    """diffs > 0 support the claim. holds: mean - 2 se > 0 and wins on a strict majority of seeds;
    fails: mean + 2 se < 0 and loses on a strict majority; else inconclusive (and always with < 3
    seeds or a non-finite value)."""
    if not diffs or any(not math.isfinite(d) for d in diffs):
        return "inconclusive", {"n": len(diffs)}
    st = seed_stats(diffs)
    if st["n"] < MIN_SEEDS:
        return "inconclusive", st
    if st["mean"] - 2 * st["se"] > 0 and st["wins"] > 0.5:
        return "holds", st
    if st["mean"] + 2 * st["se"] < 0 and st["losses"] > 0.5:
        return "fails", st
    return "inconclusive", st


def _result(claim, verdict: str, values: dict[str, Any], stats: dict[str, float], check: str) -> dict[str, Any]:
    return {"name": claim.name, "statement": claim.statement, "check": check,
            "holds": verdict == "holds", "verdict": verdict, "values": values,
            "stats": {k: float(v) for k, v in stats.items()}, "refuted_by": claim.refuted_by}


@dataclass(frozen=True)
class Better:
    """A beats B per seed: a - b > margin (higher_is_better) or b - a > margin (lower is better)."""
    name: str
    statement: str
    a: str
    b: float | str
    higher_is_better: bool = True
    margin: float = 0.0
    refuted_by: str = ""

    def evaluate(self, env: Mapping[str, Any]) -> dict[str, Any]:
        a = _seed_values(env, self.a, self.name)
        b = _operand(env, self.b, len(a), self.name)
        sign = 1.0 if self.higher_is_better else -1.0
        diffs = [sign * (x - y) - self.margin for x, y in zip(a, b)]  # > 0 supports the claim
        verdict, st = gap_verdict(diffs)
        op = ">" if self.higher_is_better else "<"
        check = f"{self.a} {op} {self.b}" + (f" by > {self.margin:g}" if self.margin else "") + " (per seed)"
        return _result(self, verdict, _named({self.a: a}, self.b, b), st, check)


@dataclass(frozen=True)
class Within:
    """|a - b| < delta per seed: holds when the mean gap's 2-s.e. interval lies inside (-delta, delta)
    and most seeds are inside; fails when it lies wholly outside and most seeds are outside."""
    name: str
    statement: str
    a: str
    b: float | str
    delta: float
    refuted_by: str = ""

    def evaluate(self, env: Mapping[str, Any]) -> dict[str, Any]:
        a = _seed_values(env, self.a, self.name)
        b = _operand(env, self.b, len(a), self.name)
        gaps = [x - y for x, y in zip(a, b)]
        check = f"|{self.a} - {self.b}| < {self.delta:g} (per seed)"
        values = _named({self.a: a}, self.b, b)
        if len(gaps) < MIN_SEEDS or any(not math.isfinite(g) for g in gaps):
            return _result(self, "inconclusive", values, {"n": len(gaps)}, check)
        st = seed_stats(gaps)
        lo, hi = st["mean"] - 2 * st["se"], st["mean"] + 2 * st["se"]
        inside = sum(abs(g) < self.delta for g in gaps) / len(gaps)
        if -self.delta < lo and hi < self.delta and inside > 0.5:
            verdict = "holds"
        elif (lo >= self.delta or hi <= -self.delta) and inside < 0.5:
            verdict = "fails"
        else:
            verdict = "inconclusive"
        return _result(self, verdict, values, {**st, "inside": inside}, check)


@dataclass(frozen=True)
class Bound:
    """A per-seed quantity (slope, exponent, rate) is below or above a bound (give exactly one)."""
    name: str
    statement: str
    value: str
    below: float | str | None = None
    above: float | str | None = None
    refuted_by: str = ""

    def evaluate(self, env: Mapping[str, Any]) -> dict[str, Any]:
        if (self.below is None) == (self.above is None):
            raise ClaimError(f"claim {self.name!r}: Bound needs exactly one of below= / above=")
        v = _seed_values(env, self.value, self.name)
        ref = self.below if self.below is not None else self.above
        r = _operand(env, ref, len(v), self.name)
        diffs = [y - x for x, y in zip(v, r)] if self.below is not None else [x - y for x, y in zip(v, r)]
        verdict, st = gap_verdict(diffs)
        check = f"{self.value} {'<' if self.below is not None else '>'} {ref} (per seed)"
        return _result(self, verdict, _named({self.value: v}, ref, r), st, check)


@dataclass(frozen=True)
class Near:
    """A per-seed rate is within tol of a reference value (Within against a constant)."""
    name: str
    statement: str
    value: str
    ref: float | str
    tol: float
    refuted_by: str = ""

    def evaluate(self, env: Mapping[str, Any]) -> dict[str, Any]:
        out = Within(self.name, self.statement, self.value, self.ref, self.tol, self.refuted_by).evaluate(env)
        out["check"] = f"{self.value} within {self.tol:g} of {self.ref} (per seed)"
        return out


def flatten(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists are left as values."""
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        full = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, full + "."))
        else:
            out[full] = value
    return out


def _parse(expr: str, name: str) -> ast.Expression:
    try:
        return ast.parse(expr, mode="eval")
    except SyntaxError as err:
        raise ClaimError(f"claim {name!r}: check is not a valid expression ({err.msg})") from None


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _dotted_names(tree: ast.AST) -> list[str]:
    names: list[str] = []

    def visit(node: ast.AST) -> None:
        dotted = _dotted(node)
        if dotted is not None and dotted not in _FUNCS:
            if dotted not in names:
                names.append(dotted)
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return names


def _eval(node: ast.AST, env: Mapping[str, Any], name: str) -> Any:
    if isinstance(node, ast.Expression):
        return _eval(node.body, env, name)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, bool)):
        return node.value
    dotted = _dotted(node)
    if dotted is not None:
        if dotted not in env:
            raise ClaimError(f"claim {name!r}: metric {dotted!r} was not measured")
        value = env[dotted]
        if not isinstance(value, (int, float, bool)):
            raise ClaimError(f"claim {name!r}: metric {dotted!r} is not a number ({value!r})")
        return value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](_eval(node.left, env, name), _eval(node.right, env, name))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Not)):
        value = _eval(node.operand, env, name)
        return -value if isinstance(node.op, ast.USub) else not value
    if isinstance(node, ast.BoolOp):
        values = [bool(_eval(v, env, name)) for v in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env, name)
        for op, comp in zip(node.ops, node.comparators):
            if type(op) not in _CMPOPS:
                break
            right = _eval(comp, env, name)
            if not _CMPOPS[type(op)](left, right):
                return False
            left = right
        else:
            return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS:
        return _FUNCS[node.func.id](*[_eval(a, env, name) for a in node.args])
    raise ClaimError(f"claim {name!r}: unsupported expression {ast.unparse(node)!r}")


AnyClaim = Claim | Better | Within | Bound | Near


def evaluate_claims(claims: list[AnyClaim], metrics: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Verdicts in the metrics.json schema: name, statement, check, holds, verdict, values
    (per-seed lists for the seed-aware shapes, with their stats), refuted_by."""
    env = flatten(metrics)
    names = [c.name for c in claims]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ClaimError(f"claim {dup[0]!r}: declared twice")
    return [claim.evaluate(env) for claim in claims]
