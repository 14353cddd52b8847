"""First-order formulas of the INDUCTION benchmark: AST, S-expression parser/printer, AST size.

Syntax (fixed by the card): free variable ``x``; bound variables any other lowercase names;
``(P v)``, ``(Q v)``, ``(R u v)``, ``(S u v)``, ``(= u v)``, ``(not f)``, ``(and f ...)``,
``(or f ...)``, ``(exists v f)``, ``(forall v f)``. No implication.

    f = parse("(exists y (and (R x y) (P y)))")
    to_sexpr(f) == "(exists y (and (R x y) (P y)))";  size(f) == 8

Malformed text raises :class:`FormulaError` whose message gives the line and column.
"""
from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

UNARY = ("P", "Q")
BINARY = ("R", "S")
PREDICATES = {"P": 1, "Q": 1, "R": 2, "S": 2, "=": 2}
FREE_VAR = "x"
QUANTIFIERS = ("exists", "forall")
CONNECTIVES = ("not", "and", "or")
_VAR_RE = re.compile(r"[a-z][a-z0-9_]*\Z")
_TOKEN_RE = re.compile(r"\s*(?:(\()|(\))|([^\s()]+))")


class FormulaError(ValueError):
    """Malformed formula text; the message names line and column."""


# ---------------------------------------------------------------- AST (identity-hashed nodes)
@dataclass(frozen=True, eq=False)
class Atom:
    pred: str              # P, Q, R, S or "="
    args: tuple[str, ...]  # variable names


@dataclass(frozen=True, eq=False)
class Not:
    child: "Formula"


@dataclass(frozen=True, eq=False)
class And:
    children: tuple["Formula", ...]


@dataclass(frozen=True, eq=False)
class Or:
    children: tuple["Formula", ...]


@dataclass(frozen=True, eq=False)
class Quant:
    kind: str      # exists | forall
    var: str
    body: "Formula"


Formula = Atom | Not | And | Or | Quant


# ---------------------------------------------------------------- measures
def size(f: Formula) -> int:
    """AST size: atom = 1 + #args; not/and/or = 1 + children; quantifier = 2 + body."""
    if isinstance(f, Atom):
        return 1 + len(f.args)
    if isinstance(f, Not):
        return 1 + size(f.child)
    if isinstance(f, (And, Or)):
        return 1 + sum(size(c) for c in f.children)
    return 2 + size(f.body)


def binary_size(f: Formula) -> int:
    """AST size with n-ary and/or counted as nested binary nodes -- the upstream concept-synth convention
    (its generator and evaluator build (and a b c) as (and a (and b c))): size(f) + (k - 2) per k-ary node."""
    if isinstance(f, Atom):
        return 1 + len(f.args)
    if isinstance(f, Not):
        return 1 + binary_size(f.child)
    if isinstance(f, (And, Or)):
        return max(1, len(f.children) - 1) + sum(binary_size(c) for c in f.children)
    return 2 + binary_size(f.body)


def quantifier_depth(f: Formula) -> int:
    if isinstance(f, Atom):
        return 0
    if isinstance(f, Not):
        return quantifier_depth(f.child)
    if isinstance(f, (And, Or)):
        return max(quantifier_depth(c) for c in f.children)
    return 1 + quantifier_depth(f.body)


def free_vars(f: Formula) -> set[str]:
    if isinstance(f, Atom):
        return set(f.args)
    if isinstance(f, Not):
        return free_vars(f.child)
    if isinstance(f, (And, Or)):
        return set().union(*(free_vars(c) for c in f.children))
    return free_vars(f.body) - {f.var}


def structurally_equal(a: Formula, b: Formula) -> bool:
    return to_sexpr(a) == to_sexpr(b)


# ---------------------------------------------------------------- printer
def to_sexpr(f: Formula) -> str:
    if isinstance(f, Atom):
        return f"({f.pred} {' '.join(f.args)})"
    if isinstance(f, Not):
        return f"(not {to_sexpr(f.child)})"
    if isinstance(f, (And, Or)):
        op = "and" if isinstance(f, And) else "or"
        return f"({op} {' '.join(to_sexpr(c) for c in f.children)})"
    return f"({f.kind} {f.var} {to_sexpr(f.body)})"


def flatten(f: Formula) -> Formula:
    """Merge nested and/or chains: (and a (and b c)) -> (and a b c); drop double negation."""
    if isinstance(f, Atom):
        return f
    if isinstance(f, Not):
        child = flatten(f.child)
        return child.child if isinstance(child, Not) else Not(child)
    if isinstance(f, (And, Or)):
        cls = type(f)
        out: list[Formula] = []
        for c in f.children:
            c = flatten(c)
            out.extend(c.children if isinstance(c, cls) else (c,))
        return cls(tuple(out))
    return Quant(f.kind, f.var, flatten(f.body))


# ---------------------------------------------------------------- parser
def _tokens(text: str):
    """(kind, value, line, col) with kind in '(' ')' 'sym'; 1-based line and column."""
    line_starts = [0] + [i + 1 for i, ch in enumerate(text) if ch == "\n"]

    def where(pos: int) -> tuple[int, int]:
        line = bisect.bisect_right(line_starts, pos) - 1
        return line + 1, pos - line_starts[line] + 1

    out = []
    for m in _TOKEN_RE.finditer(text):
        if m.lastindex is None:
            break
        kind = "(" if m.group(1) else ")" if m.group(2) else "sym"
        out.append((kind, m.group(m.lastindex), *where(m.start(m.lastindex))))
    return out, where(len(text.rstrip()) if text.strip() else 0)


class _Parser:
    def __init__(self, text: str):
        self.toks, self.end = _tokens(text)
        self.i = 0
        self.interned: dict = {}     # hash-consing: identical sub-formulas become one shared node

    def node(self, cls, *fields):
        key = (cls,) + tuple(tuple(id(c) for c in f) if isinstance(f, tuple) and f and not isinstance(f[0], str)
                             else (id(f) if isinstance(f, (Atom, Not, And, Or, Quant)) else f) for f in fields)
        if key not in self.interned:
            self.interned[key] = cls(*fields)
        return self.interned[key]

    def fail(self, msg: str, tok=None) -> FormulaError:
        line, col = (tok[2], tok[3]) if tok is not None else self.end
        return FormulaError(f"line {line}, column {col}: {msg}")

    def peek(self):
        return self.toks[self.i] if self.i < len(self.toks) else None

    def next(self, what: str):
        tok = self.peek()
        if tok is None:
            raise self.fail(f"unexpected end of input, expected {what}")
        self.i += 1
        return tok

    def expect_close(self, opener):
        tok = self.next(f"')' to close the '(' at line {opener[2]}, column {opener[3]}")
        if tok[0] != ")":
            raise self.fail(f"expected ')' to close the '(' at line {opener[2]}, column {opener[3]}, "
                            f"got {tok[1]!r}", tok)

    def variable(self, bound: tuple[str, ...]):
        tok = self.next("a variable")
        if tok[0] != "sym":
            raise self.fail(f"expected a variable, got {tok[1]!r}", tok)
        name = tok[1]
        if not _VAR_RE.match(name):
            raise self.fail(f"{name!r} is not a variable (lowercase name)", tok)
        if name != FREE_VAR and name not in bound:
            raise self.fail(f"variable {name!r} is not bound (the only free variable is x)", tok)
        return name

    def formula(self, bound: tuple[str, ...]) -> Formula:
        opener = self.next("a formula")
        if opener[0] != "(":
            raise self.fail(f"expected '(' to start a formula, got {opener[1]!r}", opener)
        head = self.next("a predicate, connective or quantifier")
        if head[0] != "sym":
            raise self.fail(f"expected a predicate, connective or quantifier after '(', got {head[1]!r}", head)
        name = head[1]
        if name in PREDICATES:
            start = self.i
            while self.peek() is not None and self.peek()[0] == "sym":
                self.i += 1
            count = self.i - start
            if count != PREDICATES[name] and (self.peek() is None or self.peek()[0] == ")"):
                raise self.fail(f"predicate {name} takes {PREDICATES[name]} argument(s), got {count}", head)
            self.i = start
            args = [self.variable(bound) for _ in range(PREDICATES[name])]
            self.expect_close(opener)
            return self.node(Atom, name, tuple(args))
        if name == "not":
            child = self.formula(bound)
            self.expect_close(opener)
            return self.node(Not, child)
        if name in ("and", "or"):
            children = []
            while self.peek() is not None and self.peek()[0] != ")":
                children.append(self.formula(bound))
            if not children:
                raise self.fail(f"'{name}' needs at least one argument", head)
            self.expect_close(opener)
            return self.node(And if name == "and" else Or, tuple(children))
        if name in QUANTIFIERS:
            tok = self.next("a variable to bind")
            if tok[0] != "sym" or not _VAR_RE.match(tok[1]):
                raise self.fail(f"'{name}' expects a lowercase variable to bind, got {tok[1]!r}", tok)
            if tok[1] == FREE_VAR:
                raise self.fail("x is the free variable and cannot be bound", tok)
            body = self.formula(bound + (tok[1],))
            self.expect_close(opener)
            return self.node(Quant, name, tok[1], body)
        if name in ("implies", "=>", "->", "iff"):
            raise self.fail(f"'{name}': implication is not part of the syntax (use or/not)", head)
        raise self.fail(f"unknown predicate or operator {name!r} (predicates: P, Q, R, S, =)", head)


def parse(text: str) -> Formula:
    """Parse one formula; :class:`FormulaError` (with line and column) on malformed text."""
    if not isinstance(text, str):
        raise FormulaError(f"line 1, column 1: expected formula text, got {type(text).__name__}")
    p = _Parser(text)
    if not p.toks:
        raise FormulaError("line 1, column 1: empty formula")
    try:
        f = p.formula(())
    except RecursionError:
        tok = p.toks[min(p.i, len(p.toks) - 1)]
        raise FormulaError(f"line {tok[2]}, column {tok[3]}: formula nested too deeply to parse") from None
    extra = p.peek()
    if extra is not None:
        raise p.fail(f"unexpected {extra[1]!r} after the end of the formula", extra)
    return f
