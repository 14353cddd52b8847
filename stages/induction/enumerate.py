"""Synthesizer (A): bottom-up enumeration by AST size with observational-equivalence pruning.

    res = synthesize(instance, max_generated=200_000, max_size=22)   # SolveResult(formula, size, status, ...)

ALGO (bottom-up enumerative synthesis with observational equivalence, as in the card):
  bank[n] = every unary formula φ(x) of AST size n built from smaller banks by
      atoms (P x) (Q x) (R x x) (S x x) · (not φ) · (and φ ψ) · (or φ ψ) ·
      (exists y (and G(x,y) U(y))) · (forall y (or ¬G(x,y) U(y))) · (exists/forall y G(x,y)) ·
      (exists/forall y U(y)),   G a guard: a literal L ∈ {R,S} × {x→y, y→x} × {+,¬} ∪ {x≠y} (the
      original one-literal fragment), a pair L1 ∧ L2 over different atoms (e.g. (R x y) ∧ (S y x),
      (S x y) ∧ ¬(= x y)), or a nested guard mentioning x again, L ∧ ∃z (A(y,z) ∧ B(z,x));
  each φ is represented by its signature: bitmasks of φ over ALL training objects (every world,
  every plane); a new φ whose signature was already seen is dropped (observational equivalence:
  any formula built from it would behave exactly like one built from the earlier, smaller one).
  The quantifier productions of a whole bank level are evaluated in one batched kernel call
  (kernels.quantifier_eval). Search stops at the first valid signature, at the formula-count
  budget (max_generated formulas generated, counted before pruning -- a count, so the same inputs
  give the same result on any machine), at the size budget (max_size, inclusive) or at the bank
  cap. A wall-clock safety net (safety_timeout_s) exists only against runaway inputs; when it
  fires the status says so ("safety_timeout") and callers report it per instance.
  The cost of every production equals the AST size of the formula it builds (formulas are
  returned exactly as built, binary and/or, not flattened), so the first valid formula found has
  the minimum AST size within this grammar (FULLOBS/CI; EC see below).
Regimes: FULLOBS — signature == labels; CI — YES worlds equal, every NO world differs; EC — the
Kleene bounds (must/may planes) must admit the labels; a candidate is accepted at once when, in
every world, one of the sampled completions matches (a concrete witness), otherwise z3 decides
exactly (stages.induction.semantics.world_explainable). In EC, equivalence is judged on the
bounds plus the sampled completions: returned formulas are always exactly valid, but this pruning
can drop a formula that differs only on unsampled completions (completeness, not soundness).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from stages.induction.bitset import ENUM_GUARDS, BitContext, pack
from stages.induction.formula import And, Atom, Formula, Not, Or, Quant, size
from stages.induction.instances import Instance
from stages.induction.semantics import world_explainable

ATOM, NOT, AND, OR, EX_G, FA_G, EX_U, FA_U, EX_GO, FA_GO = range(10)
ATOMS = (("P", 2), ("Q", 2), ("Rxx", 3), ("Sxx", 3))
BOUND_NAMES = "yzwvutsrqp"
_FNV = np.uint64(0x100000001B3)


def bound_name(depth: int) -> str:
    return BOUND_NAMES[depth] if depth < len(BOUND_NAMES) else f"v{depth}"


_HASH_WEIGHTS: dict[int, np.ndarray] = {}


def row_hash(sig: np.ndarray) -> np.ndarray:
    """64-bit hash of every signature row (N, Wtot) -> (N,) uint64: the row read as 64-bit words, a
    random-odd-weighted sum (wrapping) of the words, then a xorshift-multiply finalizer. One vectorized pass;
    the banks verify equal rows exactly, so the hash only has to spread rows, not be collision-free."""
    s = np.ascontiguousarray(sig, dtype=np.int32)
    if s.shape[1] % 2:
        s = np.concatenate([s, np.zeros((s.shape[0], 1), np.int32)], axis=1)
    words = s.view(np.uint64)                                           # (N, ceil(Wtot / 2))
    k = words.shape[1]
    w = _HASH_WEIGHTS.get(k)
    if w is None:
        w = np.random.default_rng(0x5EED + k).integers(1, 2**63, size=k, dtype=np.uint64) | np.uint64(1)
        _HASH_WEIGHTS[k] = w
    with np.errstate(over="ignore"):
        h = (words * w[None, :]).sum(axis=1, dtype=np.uint64)
        h ^= h >> np.uint64(31)
        h *= _FNV
        h ^= h >> np.uint64(29)
    return h


@dataclass
class SolveResult:
    formula: Formula | None
    size: int | None
    seconds: float
    status: str            # found | budget | size_limit | bank_limit | safety_timeout
    bank: int              # formulas kept after pruning
    generated: int         # formulas generated before pruning
    z3_calls: int = 0
    productions: tuple[int, ...] = ()   # ranked productions used by the found formula
    kernel_calls: int = 0                # quantifier-kernel calls made by this search


class Bank:
    """All kept formulas by size: signatures, productions, and AST reconstruction.

    Deduplication is exact: a 64-bit hash of each signature row finds candidates, and a new row is
    dropped only when its full signature equals a kept one (hash collisions keep both)."""

    def __init__(self, ctx: BitContext, max_bank: int = 400_000):
        self.ctx = ctx
        self.max_bank = max_bank
        self.levels: dict[int, np.ndarray] = {}      # size -> global ids
        self._sig = np.zeros((1024, ctx.Wtot), np.int32)
        self._prod = np.zeros((1024, 3), np.int64)
        self.by_hash: dict[int, int | list[int]] = {}   # hash -> first global id (list on collision)
        self.count = 0
        self.generated = 0
        self.collisions = 0

    # ----------------------------------------------------------------- storage
    def _known(self, h: int, row: np.ndarray) -> bool:
        hit = self.by_hash.get(h)
        ids = [hit] if isinstance(hit, int) else hit
        return any(np.array_equal(self._sig[i], row) for i in ids)

    def add(self, sig: np.ndarray, prod: np.ndarray) -> np.ndarray:
        """Keep rows whose signature is new; returns the kept rows' positions in the batch."""
        self.generated += len(sig)
        if len(sig) == 0 or self.full():
            return np.zeros(0, dtype=np.int64)
        h = row_hash(sig)
        _, first = np.unique(h, return_index=True)
        first.sort()
        # rows sharing a hash with an earlier row of the batch: keep those whose signature differs
        dup = np.setdiff1d(np.arange(len(sig)), first, assume_unique=True)
        keep: list[int] = []
        batch_first: dict[int, list[int]] = {}
        for i in first.tolist():
            batch_first[int(h[i])] = [i]
        for i in dup.tolist():
            group = batch_first[int(h[i])]
            if all(not np.array_equal(sig[i], sig[j]) for j in group):
                group.append(i)
                self.collisions += 1
        cand = sorted(i for g in batch_first.values() for i in g)
        for i in cand:
            hv = int(h[i])
            if hv in self.by_hash and self._known(hv, sig[i]):
                continue
            if hv in self.by_hash:
                self.collisions += 1
            keep.append(i)
        keep = np.array(keep[: max(0, self.max_bank - self.count)], dtype=np.int64)
        if keep.size:
            n0, n1 = self.count, self.count + keep.size
            while n1 > len(self._sig):
                self._sig = np.concatenate([self._sig, np.zeros_like(self._sig)])
                self._prod = np.concatenate([self._prod, np.zeros_like(self._prod)])
            self._sig[n0:n1] = sig[keep]
            self._prod[n0:n1] = prod[keep]
            for gid, i in zip(range(n0, n1), keep.tolist()):
                hv = int(h[i])
                old = self.by_hash.get(hv)
                self.by_hash[hv] = gid if old is None else ([old] if isinstance(old, int) else old) + [gid]
            self.count = n1
        return keep

    def full(self) -> bool:
        return self.count >= self.max_bank

    def _cat(self):
        return self._sig[: self.count], self._prod[: self.count]

    def level_sigs(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        ids = self.levels.get(n, np.zeros(0, dtype=np.int64))
        return ids, self._sig[ids]

    # ----------------------------------------------------------------- AST
    def ast(self, gid: int, var: str = "x", depth: int = 0) -> Formula:
        _, prods = self._cat()
        op, a, b = (int(v) for v in prods[gid])
        if op == ATOM:
            name = ATOMS[a][0]
            return Atom(name, (var,)) if len(name) == 1 else Atom(name[0], (var, var))
        if op == NOT:
            return Not(self.ast(a, var, depth))
        if op in (AND, OR):
            kids = (self.ast(a, var, depth), self.ast(b, var, depth))
            return And(kids) if op == AND else Or(kids)
        y, spare = bound_name(depth), bound_name(depth + 1)
        kind = "exists" if op in (EX_G, EX_U, EX_GO) else "forall"
        if op in (EX_G, FA_G):
            g = ENUM_GUARDS[a]
            body_u = self.ast(b, y, depth + 1)
            if op == EX_G:
                return Quant(kind, y, And((g.literal(var, y, spare), body_u)))
            return Quant(kind, y, Or((g.complement_literal(var, y, spare), body_u)))
        if op in (EX_U, FA_U):
            return Quant(kind, y, self.ast(a, y, depth + 1))
        return Quant(kind, y, ENUM_GUARDS[a].literal(var, y, spare))

    def formula(self, gid: int) -> Formula:
        """The formula exactly as enumerated (binary and/or): its AST size is its enumeration cost."""
        return self.ast(gid)

    def usage(self, gid: int) -> tuple[int, ...]:
        """Sorted ranked-production indices used by the formula gid (for training a ranker)."""
        _, prods = self._cat()
        used, stack = set(), [gid]
        while stack:
            op, a, b = (int(v) for v in prods[stack.pop()])
            idx = production_index(op, a)
            if idx is not None:
                used.add(idx)
            if op in (NOT, EX_U, FA_U):
                stack.append(a)
            elif op in (AND, OR):
                stack += [a, b]
            elif op in (EX_G, FA_G):
                stack.append(b)
        return tuple(sorted(used))


def _prod(op: int, a, b) -> np.ndarray:
    a = np.asarray(a, dtype=np.int64).reshape(-1)
    b = np.broadcast_to(np.asarray(b, dtype=np.int64), a.shape)
    return np.stack([np.full(a.shape, op, dtype=np.int64), a, b], axis=1)


N_RANKED = len(ATOMS) + 2 * len(ENUM_GUARDS)   # productions a ranker may re-weight


def production_index(op: int, a: int) -> int | None:
    """Index of a production in the ranked vocabulary: atoms, then ∃-guard, then ∀-guard."""
    if op == ATOM:
        return a
    if op in (EX_G, EX_GO):
        return len(ATOMS) + a
    if op in (FA_G, FA_GO):
        return len(ATOMS) + len(ENUM_GUARDS) + a
    return None


@dataclass
class Budget:
    """The search budget: a count of generated formulas; the wall-clock deadline is a safety net."""

    max_generated: int = 200_000
    deadline: float = math.inf
    safety_fired: bool = False

    def exhausted(self, bank: "Bank") -> bool:
        if bank.generated >= self.max_generated:
            return True
        if time.perf_counter() > self.deadline:
            self.safety_fired = True
            return True
        return False


def grow(bank: Bank, n: int, budget: Budget, chunk: int = 100_000, penalty: np.ndarray | None = None,
         cells: int = 4_000_000):
    """Generate cost-n formulas into the bank; yields (kept global ids, their signatures) per batch.

    The cost of a formula is its AST size (exactly: every production's cost is the AST size of what
    it builds) plus, with a learned ranker, an integer penalty per use of
    each ranked production (penalty[production_index]); without penalties, cost == AST size.
    """
    ctx = bank.ctx
    pen = np.zeros(N_RANKED, dtype=np.int64) if penalty is None else np.asarray(penalty, dtype=np.int64)
    ex_pen = pen[len(ATOMS): len(ATOMS) + len(ENUM_GUARDS)]
    fa_pen = pen[len(ATOMS) + len(ENUM_GUARDS):]
    start_ids = bank.count
    level_ids: list[np.ndarray] = []

    def emit(sig: np.ndarray, prod: np.ndarray):
        base = bank.count
        keep = bank.add(sig, prod)
        ids = np.arange(base, base + keep.size, dtype=np.int64)
        level_ids.append(ids)
        return ids, sig[keep]

    # atoms
    for k, (name, s) in enumerate(ATOMS):
        if s + pen[k] == n:
            yield emit(ctx.atoms[name][None], _prod(ATOM, [k], 0))
    # (not φ), skipping double negation
    ids, sig = bank.level_sigs(n - 1)
    if ids.size:
        _, prods = bank._cat()
        ok = prods[ids, 0] != NOT
        yield emit(ctx.neg(sig[ok]), _prod(NOT, ids[ok], 0))
    # (and φ ψ), (or φ ψ) with |φ| <= |ψ|, |φ| + |ψ| = n - 1
    for i in range(2, n - 1):
        j = n - 1 - i
        if i > j:
            break
        ia, sa = bank.level_sigs(i)
        ib, sb = bank.level_sigs(j)
        if not ia.size or not ib.size:
            continue
        step = max(1, chunk // max(1, len(ib)))
        for r0 in range(0, len(ia), step):
            if budget.exhausted(bank) or bank.full():
                return
            ra = np.arange(r0, min(len(ia), r0 + step))
            pa, pb = np.meshgrid(ra, np.arange(len(ib)), indexing="ij")
            pa, pb = pa.reshape(-1), pb.reshape(-1)
            if i == j:
                m = pa < pb
                pa, pb = pa[m], pb[m]
            for op in (AND, OR):
                s = (sa[pa] & sb[pb]) if op == AND else (sa[pa] | sb[pb])
                yield emit(s, _prod(op, ia[pa], ib[pb]))
    # guarded quantifiers through the batched kernel
    for mode, op in (("exists", EX_G), ("forall", FA_G)):
        by_body: dict[int, list[int]] = {}
        for gi, g in enumerate(ENUM_GUARDS):
            overhead = 3 + (g.size + ex_pen[gi] if mode == "exists" else g.complement_size + fa_pen[gi])
            by_body.setdefault(n - overhead, []).append(gi)
        for body_size, gis in by_body.items():
            iu, su = bank.level_sigs(body_size)
            if not iu.size:
                continue
            step = max(1, min(chunk, cells // (len(gis) * ctx.Wtot)))     # bounded (G, C, Wtot) output
            for r0 in range(0, len(iu), step):
                if budget.exhausted(bank) or bank.full():
                    return
                out = ctx.quantify([ENUM_GUARDS[g] for g in gis], su[r0: r0 + step], mode)   # (G, C, Wtot)
                G, C, _ = out.shape
                gg = np.repeat(np.array(gis), C)
                uu = np.tile(iu[r0: r0 + step], G)
                yield emit(out.reshape(G * C, -1), _prod(op, gg, uu))
    # unguarded quantifiers ∃y U(y), ∀y U(y)
    iu, su = bank.level_sigs(n - 2)
    if iu.size:
        for mode, op in (("exists", EX_U), ("forall", FA_U)):
            out = ctx.quantify(None, su, mode)[0]
            yield emit(out, _prod(op, iu, 0))
    # guard-only quantifiers ∃y G(x,y), ∀y G(x,y)
    for gi, g in enumerate(ENUM_GUARDS):
        for mode, op, extra in (("exists", EX_GO, ex_pen[gi]), ("forall", FA_GO, fa_pen[gi])):
            if 2 + g.size + extra == n:
                yield emit(ctx.guard_only(g, mode)[None], _prod(op, [gi], 0))
    bank.levels[n] = np.concatenate(level_ids) if level_ids else np.arange(start_ids, start_ids)


class Goal:
    """Vectorized validity test of signatures for one instance's regime."""

    def __init__(self, inst: Instance, ctx: BitContext):
        self.inst = inst
        self.ctx = ctx
        W = ctx.W
        self.target = np.array([pack(w.labels) for w in inst.worlds], dtype=np.int32)   # (W,)
        self.yes = np.array([w.kind == "yes" for w in inst.worlds])
        self.z3_calls = 0
        self.W = W

    def candidates(self, sig: np.ndarray) -> np.ndarray:
        """Boolean (N,): signature is valid (fullobs/ci) or admissible (ec)."""
        W, t = self.W, self.target
        if self.inst.regime == "fullobs":
            return (sig[:, :W] == t).all(1)
        if self.inst.regime == "ci":
            eq = sig[:, :W] == t
            return eq[:, self.yes].all(1) & (~eq[:, ~self.yes]).all(1)
        must, may = sig[:, :W], sig[:, W: 2 * W]
        return ((must & ~t) == 0).all(1) & ((t & ~may) == 0).all(1)

    def confirm(self, bank: Bank, gid: int, sig_row: np.ndarray, budget: Budget) -> Formula | None:
        f = bank.formula(gid)
        if self.inst.regime != "ec":
            return f
        W = self.W
        comps = sig_row[2 * W:].reshape(-1, W)                    # (K, W) sampled completions
        witnessed = (comps == self.target).any(0)
        for k, w in enumerate(self.inst.worlds):
            if witnessed[k]:
                continue
            self.z3_calls += 1
            if not world_explainable(f, w):
                return None
        return f


def make_context(inst: Instance, completions: int = 8, seed: int = 0, backend: str = "auto",
                 device=None) -> BitContext:
    return BitContext(inst.worlds, completions=completions if inst.regime == "ec" else 0, seed=seed,
                      three_valued=inst.regime == "ec", backend=backend, device=device)


def synthesize(inst: Instance, max_generated: int = 200_000, max_size: int = 22, completions: int = 8,
               max_bank: int = 400_000, seed: int = 0, backend: str = "auto",
               penalty: np.ndarray | None = None, safety_timeout_s: float = 600.0, device=None) -> SolveResult:
    """Enumerate by AST size (or by size + ranker penalties, up to max_size + 3 x the largest
    penalty) until a valid formula is found or a budget runs out. max_size is inclusive."""
    t0 = time.perf_counter()
    budget = Budget(max_generated, t0 + safety_timeout_s)
    ctx = make_context(inst, completions, seed, backend, device)
    bank = Bank(ctx, max_bank)
    goal = Goal(inst, ctx)
    status = "size_limit"
    max_cost = max_size + (int(np.max(penalty)) * 3 if penalty is not None else 0)
    for n in range(2, max_cost + 1):
        for ids, sig in grow(bank, n, budget, penalty=penalty):
            if not len(ids):
                continue
            for pos in np.flatnonzero(goal.candidates(sig)):
                f = goal.confirm(bank, int(ids[pos]), sig[pos], budget)
                if f is not None:
                    return SolveResult(f, size(f), time.perf_counter() - t0, "found", bank.count,
                                       bank.generated, goal.z3_calls, bank.usage(int(ids[pos])), ctx.calls)
        if budget.exhausted(bank):
            status = "safety_timeout" if budget.safety_fired else "budget"
            break
        if bank.full():
            status = "bank_limit"
            break
    return SolveResult(None, None, time.perf_counter() - t0, status, bank.count, bank.generated, goal.z3_calls,
                       (), ctx.calls)


def feature_bank(ctx: BitContext, max_size: int, max_generated: int = 10**9) -> Bank:
    """All observationally distinct unary formulas up to max_size (the bloated fitter's vocabulary)."""
    bank = Bank(ctx)
    budget = Budget(max_generated)
    for n in range(2, max_size + 1):
        for _ in grow(bank, n, budget):
            pass
    return bank
