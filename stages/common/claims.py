"""Claims as data: a name, the paper's statement, and a check expression over measured metrics.

    Claim("bridge_reverses", "With the A∪B bridge the model reverses held-out facts",
          "theory.bridge_ab.reverse_acc > 10 * theory.chance and theory.none.reverse_acc < 0.1")

The check is a small expression language (numbers, dotted metric names, + - * / **, comparisons,
and/or/not, abs/min/max) evaluated against the flattened metrics; no arbitrary Python runs.
A claim's verdict records every metric its check reads, so the report shows the numbers.
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

    def names(self) -> list[str]:
        return _dotted_names(_parse(self.check, self.name))


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


def evaluate_claims(claims: list[Claim], metrics: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Verdicts in the metrics.json schema: name, statement, check, holds, values."""
    env = flatten(metrics)
    results = []
    for claim in claims:
        tree = _parse(claim.check, claim.name)
        holds = bool(_eval(tree, env, claim.name))
        values = {}
        for key in _dotted_names(tree):
            value = env[key]
            values[key] = float(value) if not isinstance(value, bool) else value
            if isinstance(values[key], float) and not math.isfinite(values[key]):
                holds = False
        results.append({"name": claim.name, "statement": claim.statement, "check": claim.check,
                        "holds": holds, "values": values})
    return results
