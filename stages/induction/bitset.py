"""Bit-packed evaluation contexts: unary formulas as int32 bitmasks per (plane, world).

A :class:`BitContext` holds a set of worlds as *planes*:
- fully observed (FULLOBS / CI / held-out): one plane, the truth;
- EC: plane 0 = "must" (Kleene lower bound), plane 1 = "may" (upper bound), planes 2.. = sampled
  completions of the unknown atoms (each a concrete world).
Column ``p * W + w`` of a signature is the bitmask over objects of world w in plane p.
Negation swaps the must/may planes (Kleene); and/or act plane-wise; guarded quantifiers
``∃y (G(x,y) ∧ U(y))`` and ``∀y (¬G(x,y) ∨ U(y))`` go through the batched Triton kernel
``kernels.quantifier_eval.guarded_quantify`` (the forall rows read the swapped plane of G).

Guards are a literal over (x, y) (the original fragment), a pair of literals (:class:`Conj`, e.g.
(R x y) ∧ (S y x), (S x y) ∧ ¬(= x y)) or a nested guard mentioning x again (:class:`Back`,
L(x,y) ∧ ∃z (A(y,z) ∧ B(z,x))); each is a relation matrix per world, so the same kernel evaluates it.
``compile_unary(f)`` evaluates any formula whose quantifier bodies mention the outer variable only
through such a guard (what the solvers emit and the generator's gold templates use) through the
kernel; other shapes raise :class:`NotGuarded`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from kernels.quantifier_eval import guarded_quantify
from stages.common.device import pick_device
from stages.induction.formula import And, Atom, Formula, Not, Or, Quant, free_vars
from stages.induction.instances import World


class NotGuarded(ValueError):
    """The formula is outside the guarded fragment the bitset evaluator compiles."""


@dataclass(frozen=True)
class Guard:
    """A literal over (outer var, bound var): R/S forward or backward, possibly negated; != ; =."""

    pred: str          # R, S or =
    backward: bool     # (R y x) instead of (R x y)
    negated: bool

    def literal(self, outer: str, inner: str, spare: str = "z") -> Formula:
        args = (inner, outer) if self.backward else (outer, inner)
        atom = Atom(self.pred, args)
        return Not(atom) if self.negated else atom

    def complement_literal(self, outer: str, inner: str, spare: str = "z") -> Formula:
        return Guard(self.pred, self.backward, not self.negated).literal(outer, inner)

    @property
    def size(self) -> int:
        return 3 + int(self.negated)

    @property
    def complement_size(self) -> int:
        return 4 - int(self.negated)


@dataclass(frozen=True)
class Conj:
    """A compound guard L1(x,y) ∧ L2(x,y) of two literal guards (outside the one-literal fragment):
    e.g. (R x y) ∧ (S y x) (mutual edge) or (S x y) ∧ ¬(= x y) (a successor other than x)."""

    parts: tuple[Guard, Guard]

    def literal(self, outer: str, inner: str, spare: str = "z") -> Formula:
        return And(tuple(p.literal(outer, inner) for p in self.parts))

    def complement_literal(self, outer: str, inner: str, spare: str = "z") -> Formula:
        return Or(tuple(p.complement_literal(outer, inner) for p in self.parts))

    @property
    def size(self) -> int:
        return 1 + sum(p.size for p in self.parts)

    @property
    def complement_size(self) -> int:
        return 1 + sum(p.complement_size for p in self.parts)


@dataclass(frozen=True)
class Back:
    """A nested guard that mentions x again: L(x,y) ∧ ∃z (A(y,z) ∧ B(z,x)) (a 3-cycle through x)."""

    lit: Guard
    a: str          # R or S: A(y, z)
    b: str          # R or S: B(z, x)

    def _path(self, outer: str, inner: str, spare: str) -> Formula:
        return Quant("exists", spare, And((Atom(self.a, (inner, spare)), Atom(self.b, (spare, outer)))))

    def literal(self, outer: str, inner: str, spare: str = "z") -> Formula:
        return And((self.lit.literal(outer, inner), self._path(outer, inner, spare)))

    def complement_literal(self, outer: str, inner: str, spare: str = "z") -> Formula:
        return Or((self.lit.complement_literal(outer, inner), Not(self._path(outer, inner, spare))))

    @property
    def size(self) -> int:
        return 1 + self.lit.size + 9

    @property
    def complement_size(self) -> int:
        return 1 + self.lit.complement_size + 10


LITERAL_GUARDS = tuple(Guard(p, b, n) for p in ("R", "S") for n in (False, True) for b in (False, True)) + (
    Guard("=", False, True),)
# compound guards: two literals over different atoms (R/S forward/backward, x != y)
CONJ_GUARDS = tuple(Conj((g1, g2)) for i, g1 in enumerate(LITERAL_GUARDS) for g2 in LITERAL_GUARDS[i + 1:]
                     if (g1.pred, g1.backward) != (g2.pred, g2.backward))
BACK_GUARDS = tuple(Back(Guard(p, bw, False), a, b) for p in ("R", "S") for bw in (False, True)
                    for a in ("R", "S") for b in ("R", "S"))
OLD_FRAGMENT = LITERAL_GUARDS                      # the one-literal guards of the original grammar
ENUM_GUARDS = LITERAL_GUARDS + CONJ_GUARDS + BACK_GUARDS
ALL_GUARDS = ENUM_GUARDS + (Guard("=", False, False),)
AnyGuard = Guard | Conj | Back


def pack(bits: np.ndarray) -> np.ndarray:
    """(..., D) bool -> (...) int32 bitmask (bit i = element i)."""
    D = bits.shape[-1]
    return (bits.astype(np.int64) << np.arange(D, dtype=np.int64)).sum(-1).astype(np.int32)


def unpack(masks: np.ndarray, D: int) -> np.ndarray:
    return ((masks[..., None].astype(np.int64) >> np.arange(D)) & 1).astype(bool)


class BitContext:
    def __init__(self, worlds: list[World], completions: int = 0, seed: int = 0, three_valued: bool = False,
                 backend: str = "auto", device: str | None = None):
        self.worlds = worlds
        # the kernel runs where the tensors live: CUDA when available (Triton), else CPU (reference,
        # or the Triton interpreter under TRITON_INTERPRET=1)
        self.device = torch.device(device) if device is not None else pick_device("auto")
        self.calls = 0                                # quantifier-kernel calls (for KernelRecord)
        self.W = len(worlds)
        self.three_valued = three_valued
        self.backend = backend
        self.Dmax = max(w.domain for w in worlds)
        rng = np.random.default_rng(seed)
        # planes: list of (per-world atom dicts); each atom dict holds bool arrays P, Q, R, S
        if three_valued:
            must = [w.facts for w in worlds]
            may = [{k: w.facts[k] | w.unknown[k] for k in w.facts} for w in worlds]
            comps = []
            for _ in range(completions):
                comps.append([{k: w.facts[k] | (w.unknown[k] & (rng.random(w.unknown[k].shape) < 0.5))
                               for k in w.facts} for w in worlds])
            planes = [must, may] + comps
        else:
            planes = [[w.facts for w in worlds]]
        self.P = len(planes)
        self.Wtot = self.P * self.W
        doms = np.array([(1 << w.domain) - 1 for w in worlds], dtype=np.int32)
        self.dom = np.tile(doms, self.P)                                        # (Wtot,)
        self.perm = np.arange(self.Wtot)                                        # negation plane map
        if three_valued:
            self.perm[: self.W], self.perm[self.W: 2 * self.W] = np.arange(self.W, 2 * self.W), np.arange(self.W)
        self.atoms = {}   # unary atom name -> (Wtot,) signature
        for name, pred, diag in (("P", "P", False), ("Q", "Q", False), ("Rxx", "R", True), ("Sxx", "S", True)):
            cols = []
            for plane in planes:
                for w, a in zip(worlds, plane):
                    arr = np.diagonal(a[pred]) if diag else a[pred]
                    cols.append(pack(arr))
            self.atoms[name] = np.array(cols, dtype=np.int32)
        # guard rows: (Wtot, Dmax) per guard, exists-mode; forall-mode reads the swapped plane
        self._planes = planes
        self.guard_rows: dict = {}
        self._dom_t = torch.from_numpy(self.dom).to(self.device)
        self.true_rows = np.zeros((self.Wtot, self.Dmax), dtype=np.int32)
        for j in range(self.Wtot):
            D = self.worlds[j % self.W].domain
            self.true_rows[j, :D] = self.dom[j]
        self._rel_cache: dict = {}
        self._compiled: dict = {}
        self._plans: dict = {}

    def rows_of(self, g) -> np.ndarray:
        """(Wtot, Dmax) int32 rows of the guard's relation matrix, per plane and world (cached)."""
        if g not in self.guard_rows:
            rows = np.zeros((self.Wtot, self.Dmax), dtype=np.int32)
            for p, plane in enumerate(self._planes):
                for k, (w, a) in enumerate(zip(self.worlds, plane)):
                    rows[p * self.W + k, : w.domain] = pack(self._guard_matrix(g, w, a, p, self._planes, k))
            self.guard_rows[g] = rows
        return self.guard_rows[g]

    def _guard_matrix(self, g, w: World, a: dict, p: int, planes, k: int) -> np.ndarray:
        D = w.domain
        if isinstance(g, Conj):
            m1, m2 = (self._guard_matrix(q, w, a, p, planes, k) for q in g.parts)
            return m1 & m2
        if isinstance(g, Back):                      # M[x, y] = L(x, y) ∧ (A @ B)[y, x]  (monotone in A, B)
            path = (a[g.a].astype(np.int32) @ a[g.b].astype(np.int32)) > 0
            return self._guard_matrix(g.lit, w, a, p, planes, k) & path.T
        if g.pred == "=":
            m = np.eye(D, dtype=bool)
            return ~m if g.negated else m
        if g.negated and self.three_valued and p < 2:
            base = planes[1 - p][k][g.pred]          # ¬G: must = ¬(G may), may = ¬(G must)
        else:
            base = a[g.pred]
        m = base.T if g.backward else base
        return ~m if g.negated else m

    # ------------------------------------------------------------ signatures
    def neg(self, sig: np.ndarray) -> np.ndarray:
        return ~sig[..., self.perm] & self.dom

    def rel(self, guards: list[Guard] | None, mode: str) -> torch.Tensor:
        """(G, Wtot, Dmax) rows for the kernel; guards=None is the always-true guard."""
        key = (tuple(guards) if guards is not None else None, mode)
        if key not in self._rel_cache:
            rows = np.stack([self.true_rows] if guards is None else [self.rows_of(g) for g in guards])
            if mode == "forall" and self.three_valued:
                rows = rows[:, self.perm]            # ∀y(G→U): must uses G's may rows and vice versa
            self._rel_cache[key] = torch.from_numpy(np.ascontiguousarray(rows)).to(self.device)
        return self._rel_cache[key]

    def quantify(self, guards: list[Guard] | None, phi: np.ndarray, mode: str) -> np.ndarray:
        """(G, C, Wtot): ∃y (G ∧ φ(y)) or ∀y (¬G ∨ φ(y)) for every guard and candidate."""
        phi_t = torch.from_numpy(np.ascontiguousarray(phi)).to(self.device)
        self.calls += 1
        out = guarded_quantify(self.rel(guards, mode), phi_t, self._dom_t, mode, backend=self.backend)
        return out.cpu().numpy()

    def guard_only(self, g: Guard, mode: str) -> np.ndarray:
        """(Wtot,): ∃y G(x,y) or ∀y G(x,y) (plane-wise; both monotone in G)."""
        rows = self.rows_of(g)
        if mode == "exists":
            bits = rows != 0
        else:
            bits = (rows == self.dom[:, None])
        return pack(bits) & self.dom

    # ------------------------------------------------------------ AST -> signature
    def compile_unary(self, f: Formula, var: str = "x") -> np.ndarray:
        """(Wtot,) signature of the unary formula f(var) (guarded fragment), via the kernel."""
        key = (id(f), var)
        if key not in self._compiled:                # shared sub-formulas are evaluated once
            self._compiled[key] = (f, self._compile(f, var))
        return self._compiled[key][1].copy()

    def _compile(self, f: Formula, var: str) -> np.ndarray:
        if isinstance(f, Atom):
            if f.args == (var,):
                return self.atoms[f.pred].copy()
            if f.args == (var, var):
                return self.dom.copy() if f.pred == "=" else self.atoms[f.pred + "xx"].copy()
            raise NotGuarded(f"atom {f.pred}{f.args} is not unary in {var}")
        if isinstance(f, Not):
            return self.neg(self.compile_unary(f.child, var))
        if isinstance(f, (And, Or)):
            sigs = [self.compile_unary(c, var) for c in f.children]
            out = sigs[0]
            for s in sigs[1:]:
                out = (out & s) if isinstance(f, And) else (out | s)
            return out
        kind, g, phi_f, y = self._plan(f, var)
        if kind == "guard_only":                     # ∃y G(x,y) / ∀y G(x,y)
            return self.guard_only(g, f.kind)
        phi = self.compile_unary(phi_f, y)
        return self.quantify(None if g is None else [g], phi[None], f.kind)[0, 0]

    def _plan(self, f: Quant, var: str):
        """How a quantifier node is computed: (kind, guard, body formula over y, y)."""
        key = (id(f), var)
        if key in self._plans:
            return self._plans[key][1]
        y = f.var
        if var not in free_vars(f.body):             # ∃y U(y) / ∀y U(y): always-true guard
            plan = ("unguarded", None, f.body, y)
        elif (g0 := as_guard(f.body, var, y)) is not None:
            plan = ("guard_only", g0, None, y)
        elif (g0 := match_guard(_flat(f.body, And), var, y, False)) is not None:
            plan = ("guard_only", g0, None, y)       # ∃y (L1 ∧ L2) etc.: compound guard only
        else:
            cls = And if f.kind == "exists" else Or
            parts = _flat(f.body, cls)
            mention = [c for c in parts if var in free_vars(c)]
            rest = [c for c in parts if var not in free_vars(c)]
            g = match_guard(mention, var, y, f.kind == "forall") if mention and rest else None
            if g is None:
                raise NotGuarded(f"quantifier over {y} is not guarded by a literal, a pair of literals or a "
                                 f"back path in {var}, {y}")
            rest_f = rest[0] if len(rest) == 1 else cls(tuple(rest))
            plan = ("guarded", g, rest_f, y)
        self._plans[key] = (f, plan)
        return plan

    def compile_many(self, formulas: list[Formula], var: str = "x") -> np.ndarray:
        """(N, Wtot) signatures; the quantifier nodes of all formulas are evaluated level by level,
        one kernel call per (nesting height, exists/forall)."""
        levels: dict[int, list] = {}

        def visit(f: Formula, v: str) -> int:
            if isinstance(f, Atom):
                return 0
            if isinstance(f, Not):
                return visit(f.child, v)
            if isinstance(f, (And, Or)):
                return max(visit(c, v) for c in f.children)
            kind, g, phi_f, y = self._plan(f, v)
            h = 1 if kind == "guard_only" else 1 + visit(phi_f, y)
            if kind != "guard_only" and (id(f), v) not in self._compiled:
                levels.setdefault(h, []).append((f, v, g, phi_f, y))
            return h

        for f in formulas:
            visit(f, var)
        for h in sorted(levels):
            for mode in ("exists", "forall"):
                todo = [e for e in levels[h] if e[0].kind == mode]
                todo = list({(id(e[0]), e[1]): e for e in todo}.values())
                if not todo:
                    continue
                guards = list(dict.fromkeys(e[2] for e in todo))
                phis = np.stack([self.compile_unary(e[3], e[4]) for e in todo])
                cols = []
                if any(g is None for g in guards):
                    cols.append((None, self.quantify(None, phis, mode)[0]))
                real = [g for g in guards if g is not None]
                if real:
                    out = self.quantify(real, phis, mode)                  # (G, C, Wtot) in one call
                    cols.append(("real", out))
                for i, (f, v, g, _, _) in enumerate(todo):
                    if g is None:
                        sig = cols[0][1][i]
                    else:
                        sig = cols[-1][1][real.index(g), i]
                    self._compiled[(id(f), v)] = (f, sig)
        return np.stack([self.compile_unary(f, var) for f in formulas]) if formulas else \
            np.zeros((0, self.Wtot), np.int32)


def as_guard(f: Formula, outer: str, inner: str) -> Guard | None:
    neg = isinstance(f, Not)
    atom = f.child if neg else f
    if not isinstance(atom, Atom) or atom.pred not in ("R", "S", "="):
        return None
    if atom.args == (outer, inner):
        return Guard(atom.pred, False, neg)
    if atom.args == (inner, outer):
        return Guard(atom.pred, atom.pred != "=", neg)
    return None


def _flat(f: Formula, cls) -> list[Formula]:
    """Children of nested cls (And/Or) nodes, flattened; [f] when f is not a cls node."""
    if not isinstance(f, cls):
        return [f]
    return [d for c in f.children for d in _flat(c, cls)]


def _as_path(f: Formula, outer: str, inner: str) -> tuple[str, str] | None:
    """∃z (A(inner, z) ∧ B(z, outer)) -> (A, B), else None."""
    if not (isinstance(f, Quant) and f.kind == "exists" and isinstance(f.body, And) and len(f.body.children) == 2):
        return None
    z = f.var
    a, b = f.body.children
    if (isinstance(a, Atom) and isinstance(b, Atom) and a.pred in ("R", "S") and b.pred in ("R", "S")
            and a.args == (inner, z) and b.args == (z, outer) and z not in (outer, inner)):
        return a.pred, b.pred
    return None


def match_guard(items: list[Formula], outer: str, inner: str, complemented: bool):
    """The guard whose conjuncts (exists) -- or whose complements' disjuncts (forall) -- are items."""
    lits, paths = [], []
    for c in items:
        path = _as_path(c.child if complemented and isinstance(c, Not) else (None if complemented else c),
                        outer, inner) if (not complemented or isinstance(c, Not)) else None
        if path is not None:
            paths.append(path)
            continue
        g = as_guard(c, outer, inner)
        if g is None:
            return None
        lits.append(Guard(g.pred, g.backward, not g.negated) if complemented else g)
    if not paths and len(lits) == 1:
        return lits[0]
    if not paths and len(lits) == 2 and (lits[0].pred, lits[0].backward) != (lits[1].pred, lits[1].backward):
        return Conj((lits[0], lits[1]))
    if len(paths) == 1 and len(lits) == 1:
        return Back(lits[0], *paths[0])
    return None
