"""Synthesizer (A'): two-bank "lift" enumeration -- formulas whose inner scopes mention x again.

    res = synthesize_lift(instance, max_generated=2_000_000, max_size=24)   # a SolveResult

The guarded grammar (stages.induction.enumerate) builds unary formulas φ(x) only; a quantifier
body there sees x through its guard alone. The benchmark's harder families (upstream
concept-synth "new36": cross-scope / dual-role / incoming lifts, nested containment and response,
quantifier depth 2-3) need bodies such as ∀z (¬S(z,y) ∨ R(z,x)) that are *binary* formulas
χ(x, y). ALGO (bottom-up enumeration by AST size over two banks, each with exact observational-
equivalence pruning):
  B bank -- binary formulas χ(x, v) (v = the innermost bound variable), signature = bitmask over v
      for every (world, x) row (Σ_w |D_w| int32 words, all training worlds):
      atoms  P(v) Q(v) P(x) Q(x) [2] · R(v,v) S(v,v) R(x,x) S(x,x) R(x,v) R(v,x) S(x,v) S(v,x) (= x v) [3]
      (not χ) · (and χ ψ) · (or χ ψ) · ∃z (G(v,z) ∧ χ(x,z)) · ∀z (¬G(v,z) ∨ χ(x,z)) ·
      ∃z G(v,z) · ∀z G(v,z),   G ∈ {R,S} × {(v,z), (z,v)}
      (the guarded quantifiers go through the batched kernel kernels.quantifier_eval with the
      (world, x) rows as its "worlds": bit v of out = OR_z (G[v,z] ∧ χ[(w,x), z]));
  U bank -- unary formulas φ(x), signature = bitmask over x per world:
      atoms P(x) Q(x) [2] · R(x,x) S(x,x) [3] · not · and · or · ∃y χ(x,y) · ∀y χ(x,y)  [2 + |χ|].
  Canonical forms: and/or operands ordered (|φ| <= |ψ|, distinct ids at equal size); in B negation
  only of atoms and quantified formulas (De Morgan gives the rest); atoms over x alone stay outside
  quantifier scopes (P(x) ∧ ∃y χ instead of ∃y (P(x) ∧ χ)); U_n is tested before B_n is grown; a new formula whose signature equals a kept one of the same bank is dropped (exact:
  the dedup key is the whole signature row). Bias (the "small-operand" rule): and/or combine two
  formulas only when one of them has size <= small_operand (a literal, or a conjunction of two),
  which bounds a level's and/or products by |bank_small| x |bank_big| instead of |bank|^2; the
  first valid formula is size-minimal within this restricted grammar.
canonical=False (the ablation) drops these canonical forms: x-only atoms inside scopes, negation of
anything, B_n grown before U_n.
The budget is a count of generated formulas (before pruning) plus the size cap and a bank cap, so
the same inputs give the same result on any machine; the wall-clock safety net is only reported.
Regimes: FULLOBS and CI (exact signatures). EC is not supported here (use the guarded grammar).
"""
from __future__ import annotations

import time

import numpy as np
import torch

from kernels.quantifier_eval import guarded_quantify
from stages.common.device import pick_device
from stages.induction.bitset import pack
from stages.induction.enumerate import Budget, SolveResult, bound_name
from stages.induction.formula import And, Atom, Formula, Not, Or, Quant, size
from stages.induction.instances import Instance

# production codes
U_ATOM, U_NOT, U_AND, U_OR, U_EX, U_FA = range(6)
B_ATOM, B_NOT, B_AND, B_OR, B_EXG, B_FAG, B_EXGO, B_FAGO = range(10, 18)
U_ATOMS = (("P", 2), ("Q", 2), ("Rxx", 3), ("Sxx", 3))
# binary atoms: (name, cost); v = current variable, x = the formula's free variable
B_ATOMS = (("Pv", 2), ("Qv", 2), ("Rvv", 3), ("Svv", 3), ("Rxv", 3), ("Rvx", 3), ("Sxv", 3), ("Svx", 3), ("Eq", 3))
B_ATOMS_X = (("Px", 2), ("Qx", 2), ("Rxx", 3), ("Sxx", 3))     # only without canonical forms (ablation)
# canonical form: atoms that mention only x (P(x), R(x,x), ...) are kept out of quantifier scopes --
# ∃y (P(x) ∧ χ) is built as P(x) ∧ ∃y χ in the unary bank -- so the binary bank has none of them
# guards G(v, z) for the new variable z: relation, z is the second argument?
LIFT_GUARDS = (("R", True), ("R", False), ("S", True), ("S", False))


class Store:
    """Kept formulas of one bank: signatures, productions, sizes; exact dedup on whole rows."""

    def __init__(self, width: int):
        self.sig = np.zeros((1024, width), np.int32)
        self.prod = np.zeros((1024, 3), np.int64)
        self.seen: set[bytes] = set()
        self.count = 0
        self.levels: dict[int, np.ndarray] = {}

    def add(self, sig: np.ndarray, prod: np.ndarray, limit: int) -> np.ndarray:
        """Keep rows whose signature is new (first occurrence in the batch); returns their positions."""
        sig = np.ascontiguousarray(sig, dtype=np.int32)
        keep = []
        seen = self.seen
        room = limit - self.count
        for i in range(len(sig)):
            if len(keep) >= room:
                break
            k = sig[i].tobytes()
            if k not in seen:
                seen.add(k)
                keep.append(i)
        keep = np.asarray(keep, dtype=np.int64)
        if keep.size:
            n0, n1 = self.count, self.count + keep.size
            while n1 > len(self.sig):
                self.sig = np.concatenate([self.sig, np.zeros_like(self.sig)])
                self.prod = np.concatenate([self.prod, np.zeros_like(self.prod)])
            self.sig[n0:n1] = sig[keep]
            self.prod[n0:n1] = prod[keep]
            self.count = n1
        return keep

    def level(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        ids = self.levels.get(n, np.zeros(0, np.int64))
        return ids, self.sig[ids]


def _prod(op: int, a, b=0) -> np.ndarray:
    a = np.asarray(a, dtype=np.int64).reshape(-1)
    b = np.broadcast_to(np.asarray(b, dtype=np.int64), a.shape)
    return np.stack([np.full(a.shape, op, dtype=np.int64), a, b], axis=1)


class LiftContext:
    """Signatures of atoms, guard rows and lifts over a list of fully observed worlds."""

    def __init__(self, worlds, backend: str = "auto", device=None):
        self.worlds = worlds
        self.W = len(worlds)
        self.device = torch.device(device) if device is not None else pick_device("auto")
        self.backend = backend
        self.calls = 0
        self.Dmax = max(w.domain for w in worlds)
        self.rw = np.concatenate([np.full(w.domain, k) for k, w in enumerate(worlds)])      # row -> world
        self.rx = np.concatenate([np.arange(w.domain) for w in worlds])                    # row -> x
        self.starts = np.concatenate([[0], np.cumsum([w.domain for w in worlds])[:-1]]).astype(np.int64)
        self.Wp = len(self.rw)
        doms = np.array([(1 << w.domain) - 1 for w in worlds], dtype=np.int32)
        self.dom_u = doms
        self.dom_p = doms[self.rw]
        self.u_atoms = {
            "P": np.array([pack(w.facts["P"]) for w in worlds], np.int32),
            "Q": np.array([pack(w.facts["Q"]) for w in worlds], np.int32),
            "Rxx": np.array([pack(np.diagonal(w.facts["R"])) for w in worlds], np.int32),
            "Sxx": np.array([pack(np.diagonal(w.facts["S"])) for w in worlds], np.int32)}
        rows = {name: [] for name, _ in B_ATOMS + B_ATOMS_X}
        for w in worlds:
            F = w.facts
            for x in range(w.domain):
                full = (1 << w.domain) - 1
                rows["Pv"].append(pack(F["P"]))
                rows["Qv"].append(pack(F["Q"]))
                rows["Rvv"].append(pack(np.diagonal(F["R"])))
                rows["Svv"].append(pack(np.diagonal(F["S"])))
                rows["Rxv"].append(pack(F["R"][x, :]))
                rows["Rvx"].append(pack(F["R"][:, x]))
                rows["Sxv"].append(pack(F["S"][x, :]))
                rows["Svx"].append(pack(F["S"][:, x]))
                rows["Eq"].append(1 << x)
                rows["Px"].append(full if F["P"][x] else 0)
                rows["Qx"].append(full if F["Q"][x] else 0)
                rows["Rxx"].append(full if F["R"][x, x] else 0)
                rows["Sxx"].append(full if F["S"][x, x] else 0)
        self.b_atoms = {k: np.array(v, dtype=np.int64).astype(np.int32) for k, v in rows.items()}
        # guard rows for the kernel: rel[g, (w,x), v] = bitmask over z of G(v, z) in world w
        rel = np.zeros((len(LIFT_GUARDS), self.Wp, self.Dmax), np.int32)
        for g, (r, z_second) in enumerate(LIFT_GUARDS):
            for k, w in enumerate(worlds):
                M = w.facts[r] if z_second else w.facts[r].T          # M[v, z] = G(v, z)
                rel[g, self.rw == k, : w.domain] = pack(M)[None, :]
        self.rel = rel
        self._rel_t = torch.from_numpy(rel).to(self.device)
        self._dom_t = torch.from_numpy(self.dom_p).to(self.device)

    def neg_b(self, sig):
        return ~sig & self.dom_p[None, :]

    def neg_u(self, sig):
        return ~sig & self.dom_u[None, :]

    def quantify(self, gis: list[int], phi: np.ndarray, mode: str) -> np.ndarray:
        """(G, C, Wp): bit v of out[g, c, (w,x)] = ∃z (G_g(v,z) ∧ χ_c(x,z)) (forall: ∀z (¬G ∨ χ))."""
        self.calls += 1
        rel = self._rel_t[gis]
        out = guarded_quantify(rel, torch.from_numpy(np.ascontiguousarray(phi)).to(self.device), self._dom_t,
                               mode, backend=self.backend)
        return out.cpu().numpy()

    def guard_only(self, g: int, mode: str) -> np.ndarray:
        """(Wp,): bit v = ∃z G(v,z) (exists) or ∀z G(v,z) (forall)."""
        rows = self.rel[g]                                          # (Wp, Dmax) masks over z
        bits = (rows != 0) if mode == "exists" else (rows == self.dom_p[:, None])
        D = self.Dmax
        return (bits[:, :D].astype(np.int64) << np.arange(D)).sum(1).astype(np.int32) & self.dom_p

    def lift(self, sig: np.ndarray, mode: str) -> np.ndarray:
        """(N, Wp) binary -> (N, W) unary: ∃y χ(x,y) / ∀y χ(x,y)."""
        bits = (sig != 0) if mode == "exists" else (sig == self.dom_p[None, :])
        vals = bits.astype(np.int64) << self.rx[None, :]
        return np.add.reduceat(vals, self.starts, axis=1).astype(np.int32)


class LiftSearch:
    def __init__(self, inst: Instance, max_bank: int, small_operand: int, backend: str = "auto", device=None,
                 chunk: int = 50_000, canonical: bool = True):
        self.inst = inst
        self.ctx = LiftContext(inst.worlds, backend, device)
        self.U = Store(self.ctx.W)
        self.B = Store(self.ctx.Wp)
        self.max_bank = max_bank
        self.small = small_operand
        self.canonical = canonical
        self.b_atoms = B_ATOMS if canonical else B_ATOMS + B_ATOMS_X
        self.chunk = chunk
        self.generated = 0
        self.target = np.array([pack(w.labels) for w in inst.worlds], np.int32)
        self.yes = np.array([w.kind == "yes" for w in inst.worlds])

    # ---------------------------------------------------------------- goal
    def valid(self, sig: np.ndarray) -> np.ndarray:
        eq = sig == self.target[None, :]
        if self.inst.regime == "ci":
            return eq[:, self.yes].all(1) & (~eq[:, ~self.yes]).all(1)
        return eq.all(1)

    # ---------------------------------------------------------------- growth
    def _emit(self, store: Store, sig, prod, out: list):
        self.generated += len(sig)
        base = store.count
        keep = store.add(sig, prod, self.max_bank)
        ids = np.arange(base, base + keep.size, dtype=np.int64)
        out.append(ids)
        return ids, sig[keep]

    def _pairs(self, store: Store, n: int, neg, budget: Budget, ops):
        """and/or at cost n under the small-operand rule; yields (sig, prod) batches."""
        for i in range(2, min(self.small, (n - 1) // 2) + 1):
            j = n - 1 - i
            ia, sa = store.level(i)
            ib, sb = store.level(j)
            if not ia.size or not ib.size:
                continue
            step = max(1, self.chunk // max(1, len(ia)))
            for r0 in range(0, len(ib), step):
                if budget.exhausted(self) or self.full():
                    return
                rb = np.arange(r0, min(len(ib), r0 + step))
                pa, pb = np.meshgrid(np.arange(len(ia)), rb, indexing="ij")
                pa, pb = pa.reshape(-1), pb.reshape(-1)
                if i == j:
                    m = pa < pb
                    pa, pb = pa[m], pb[m]
                for op_and, op_or in (ops,):
                    yield sa[pa] & sb[pb], _prod(op_and, ia[pa], ib[pb])
                    yield sa[pa] | sb[pb], _prod(op_or, ia[pa], ib[pb])

    def full(self) -> bool:
        return self.U.count >= self.max_bank or self.B.count >= self.max_bank

    def grow_b(self, n: int, budget: Budget):
        ctx, B, lvl = self.ctx, self.B, []
        for k, (name, c) in enumerate(self.b_atoms):
            if c == n:
                self._emit(B, ctx.b_atoms[name][None], _prod(B_ATOM, [k]), lvl)
        ids, sig = B.level(n - 1)
        if ids.size:      # canonical form: negation only of atoms and quantified formulas (no ¬ of and/or)
            ok = (np.isin(B.prod[ids, 0], (B_ATOM, B_EXG, B_FAG, B_EXGO, B_FAGO)) if self.canonical
                  else B.prod[ids, 0] != B_NOT)
            self._emit(B, ctx.neg_b(sig[ok]), _prod(B_NOT, ids[ok]), lvl)
        for s, p in self._pairs(B, n, ctx.neg_b, budget, (B_AND, B_OR)):
            self._emit(B, s, p, lvl)
        for mode, op, overhead in (("exists", B_EXG, 6), ("forall", B_FAG, 7)):
            iu, su = B.level(n - overhead)
            step = max(1, self.chunk // 4)
            for r0 in range(0, len(iu), step):
                if budget.exhausted(self) or self.full():
                    break
                out = ctx.quantify(list(range(len(LIFT_GUARDS))), su[r0: r0 + step], mode)   # (G, C, Wp)
                G, C, _ = out.shape
                self._emit(B, out.reshape(G * C, -1),
                           _prod(op, np.repeat(np.arange(G), C), np.tile(iu[r0: r0 + step], G)), lvl)
        if n == 5:
            for g in range(len(LIFT_GUARDS)):
                for mode, op in (("exists", B_EXGO), ("forall", B_FAGO)):
                    self._emit(B, ctx.guard_only(g, mode)[None], _prod(op, [g]), lvl)
        B.levels[n] = np.concatenate(lvl) if lvl else np.zeros(0, np.int64)

    def grow_u(self, n: int, budget: Budget):
        """Unary formulas of cost n; yields the (ids, sigs) of each kept batch for the goal test."""
        ctx, U, lvl = self.ctx, self.U, []
        for k, (name, c) in enumerate(U_ATOMS):
            if c == n:
                yield self._emit(U, ctx.u_atoms[name][None], _prod(U_ATOM, [k]), lvl)
        ids, sig = U.level(n - 1)
        if ids.size:
            ok = U.prod[ids, 0] != U_NOT
            yield self._emit(U, ctx.neg_u(sig[ok]), _prod(U_NOT, ids[ok]), lvl)
        for s, p in self._pairs(U, n, ctx.neg_u, budget, (U_AND, U_OR)):
            yield self._emit(U, s, p, lvl)
        ib, sb = self.B.level(n - 2)
        for r0 in range(0, len(ib), self.chunk):
            for mode, op in (("exists", U_EX), ("forall", U_FA)):
                yield self._emit(U, ctx.lift(sb[r0: r0 + self.chunk], mode), _prod(op, ib[r0: r0 + self.chunk]), lvl)
        U.levels[n] = np.concatenate(lvl) if lvl else np.zeros(0, np.int64)

    # ---------------------------------------------------------------- AST
    def ast_u(self, gid: int) -> Formula:
        op, a, b = (int(v) for v in self.U.prod[gid])
        if op == U_ATOM:
            name = U_ATOMS[a][0]
            return Atom(name, ("x",)) if len(name) == 1 else Atom(name[0], ("x", "x"))
        if op == U_NOT:
            return Not(self.ast_u(a))
        if op in (U_AND, U_OR):
            kids = (self.ast_u(a), self.ast_u(b))
            return And(kids) if op == U_AND else Or(kids)
        y = bound_name(0)
        return Quant("exists" if op == U_EX else "forall", y, self.ast_b(a, y, 0))

    def ast_b(self, gid: int, v: str, depth: int) -> Formula:
        op, a, b = (int(t) for t in self.B.prod[gid])
        if op == B_ATOM:
            name = self.b_atoms[a][0]
            if name == "Eq":
                return Atom("=", ("x", v))
            args = tuple("x" if ch == "x" else v for ch in name[1:])
            return Atom(name[0], args)
        if op == B_NOT:
            return Not(self.ast_b(a, v, depth))
        if op in (B_AND, B_OR):
            kids = (self.ast_b(a, v, depth), self.ast_b(b, v, depth))
            return And(kids) if op == B_AND else Or(kids)
        z = bound_name(depth + 1)
        rel, z_second = LIFT_GUARDS[a]
        guard = Atom(rel, (v, z) if z_second else (z, v))
        if op == B_EXG:
            return Quant("exists", z, And((guard, self.ast_b(b, z, depth + 1))))
        if op == B_FAG:
            return Quant("forall", z, Or((Not(guard), self.ast_b(b, z, depth + 1))))
        return Quant("exists" if op == B_EXGO else "forall", z, guard)


def synthesize_lift(inst: Instance, max_generated: int = 2_000_000, max_size: int = 24, max_bank: int = 2_000_000,
                    small_operand: int = 4, backend: str = "auto", device=None,
                    safety_timeout_s: float = 600.0, canonical: bool = True) -> SolveResult:
    """Two-bank enumeration by AST size until a valid formula, the count budget, the size cap or the bank cap."""
    if inst.regime == "ec":
        raise ValueError(f"{inst.id}: the lift grammar supports fullobs and ci instances (got ec)")
    t0 = time.perf_counter()
    budget = Budget(max_generated, t0 + safety_timeout_s)
    search = LiftSearch(inst, max_bank, small_operand, backend, device, canonical=canonical)
    status = "size_limit"
    for n in range(2, max_size + 1):
        if not canonical:                                  # ablation: the plain order (B_n before U_n)
            search.grow_b(n, budget)
        for ids, sig in search.grow_u(n, budget):          # U_n needs only B_{n-2}: test goals first
            hits = np.flatnonzero(search.valid(sig)) if len(ids) else ()
            if len(hits):
                f = search.ast_u(int(ids[hits[0]]))
                return SolveResult(f, size(f), time.perf_counter() - t0, "found", search.U.count + search.B.count,
                                   search.generated, 0, (), search.ctx.calls)
        if canonical and n + 2 <= max_size:                # B_n is only used by U_{n+2} and larger B
            search.grow_b(n, budget)
        if budget.exhausted(search):
            status = "safety_timeout" if budget.safety_fired else "budget"
            break
        if search.full():
            status = "bank_limit"
            break
    return SolveResult(None, None, time.perf_counter() - t0, status, search.U.count + search.B.count,
                       search.generated, 0, (), search.ctx.calls)
