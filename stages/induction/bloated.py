"""Synthesizer (B): the "bloated" fitter -- a depth-unbounded decision tree over a feature bank,
read off as a DNF formula.

    res = fit_bloated(instance, seed=0)  # SolveResult; valid on the training worlds when the types separate

ALGO (decision tree over enumerated features, as the card's "bloated" baseline): fix a vocabulary
of unary features F = (f_1..f_m) -- the atoms (P x) (Q x) (R x x) (S x x), ∃y G(x,y) for every
literal guard G, and ∃y (G(x,y) ∧ L(y)) for the four relation guards and L ∈ {P, Q, ¬P, ¬Q}.
Each training object is the row (f_1(a), ..., f_m(a)); a CART tree (sklearn, Gini, no depth
limit, seeded tie-breaking) is grown until every leaf is pure, and the formula is the disjunction,
over positive leaves, of the conjunction of the split literals on the path to the leaf:
    φ(x) = ∨_{positive leaves ℓ} ∧_{(f, side) on the path to ℓ} (±f(x)).
Unlike a disjunction of full characteristic types (which memorizes: held-out objects almost never
repeat a training type, so it predicts "false" everywhere), the tree generalizes to unseen
feature combinations, so it is a non-degenerate baseline. If two training objects of opposite
labels share every feature, the vocabulary is extended with enumerated formulas that split them
(growing size) until they separate. CI: fitted on the YES worlds; a NO world that φ happens to label
exactly gets the full characteristic conjunction of one of its label-0 objects of a fresh type added.
EC: fitted on one completion of every world (unknown atoms read as false), which witnesses validity.
"""
from __future__ import annotations

import time

import numpy as np

from sklearn.tree import DecisionTreeClassifier

from stages.induction.bitset import LITERAL_GUARDS, BitContext, unpack
from stages.induction.enumerate import SolveResult, feature_bank
from stages.induction.formula import And, Atom, Formula, Not, Or, Quant, size
from stages.induction.instances import Instance, World, empty_atoms


def base_features() -> list[Formula]:
    feats: list[Formula] = [Atom("P", ("x",)), Atom("Q", ("x",)), Atom("R", ("x", "x")), Atom("S", ("x", "x"))]
    feats += [Quant("exists", "y", g.literal("x", "y")) for g in LITERAL_GUARDS]
    for g in LITERAL_GUARDS:
        if g.negated:
            continue
        for p in ("P", "Q"):
            for neg in (False, True):
                lit = Atom(p, ("y",))
                feats.append(Quant("exists", "y", And((g.literal("x", "y"), Not(lit) if neg else lit))))
    return feats


def _object_features(ctx: BitContext, sigs: np.ndarray, worlds: list[int]) -> np.ndarray:
    """(n_objects, m) bool feature matrix for the given worlds (plane 0), objects in order."""
    rows = []
    for w in worlds:
        D = ctx.worlds[w].domain
        rows.append(unpack(sigs[:, w], D).T)            # (D, m)
    return np.concatenate(rows) if rows else np.zeros((0, sigs.shape[0]), bool)


def _dnf(features: list[Formula], types: list[np.ndarray]) -> Formula:
    terms = []
    for t in types:
        lits = tuple(f if bit else Not(f) for f, bit in zip(features, t))
        terms.append(And(lits))
    if not terms:                                       # no positive type: the empty disjunction
        return And((Atom("P", ("x",)), Not(Atom("P", ("x",)))))
    return terms[0] if len(terms) == 1 else Or(tuple(terms))


def _closed_world(world: World) -> World:
    return World(world.domain, {k: v.copy() for k, v in world.facts.items()}, empty_atoms(world.domain),
                 world.labels, world.kind)


def _tree_formula(tree: DecisionTreeClassifier, features: list[Formula]) -> tuple[Formula, int]:
    """Disjunction over positive leaves of the conjunction of the path literals; (formula, #leaves)."""
    t = tree.tree_
    pos_class = list(tree.classes_).index(True) if True in tree.classes_ else None
    terms: list[Formula] = []

    def walk(node: int, path: tuple[Formula, ...]):
        if t.children_left[node] == -1:                     # leaf
            if pos_class is not None and t.value[node][0].argmax() == pos_class:
                terms.append(path[0] if len(path) == 1 else And(path) if path else Or((Atom("P", ("x",)),
                                                                                       Not(Atom("P", ("x",))))))
            return
        f = features[t.feature[node]]                       # split "f <= 0.5": left = f false
        walk(t.children_left[node], path + (Not(f),))
        walk(t.children_right[node], path + (f,))

    walk(0, ())
    if not terms:                                           # no positive leaf: the empty disjunction
        return And((Atom("P", ("x",)), Not(Atom("P", ("x",))))), 0
    return (terms[0] if len(terms) == 1 else Or(tuple(terms))), len(terms)


def fit_bloated(inst: Instance, max_feature_size: int = 12, backend: str = "auto", seed: int = 0) -> SolveResult:
    t0 = time.perf_counter()
    worlds = [_closed_world(w) for w in inst.worlds] if inst.regime == "ec" else inst.worlds
    ctx = BitContext(worlds, backend=backend)
    train = [k for k, w in enumerate(worlds) if w.kind == "yes"]
    labels = np.concatenate([worlds[k].labels for k in train])
    features = base_features()
    sigs = ctx.compile_many(features)                                 # (m, Wtot) through the kernel
    extra_size = 6
    while True:
        X = _object_features(ctx, sigs, train)
        pos = {t.tobytes() for t in X[labels]}
        neg = {t.tobytes() for t in X[~labels]}
        if not (pos & neg):
            break
        extra_size += 2                       # extend the vocabulary: only features that split a clash
        if extra_size > max_feature_size:
            return SolveResult(None, None, time.perf_counter() - t0, "inseparable", len(features), 0)
        bank = feature_bank(ctx, extra_size)
        bank_sigs = bank._cat()[0]
        for i in range(bank.count):
            col = _object_features(ctx, bank_sigs[i: i + 1], train)[:, 0]
            keys = [t.tobytes() for t in X]
            clash = pos & neg
            groups: dict[bytes, set] = {}
            for k, v in zip(keys, col):
                if k in clash:
                    groups.setdefault(k, set()).add(bool(v))
            if any(len(vals) == 2 for vals in groups.values()):
                features.append(bank.formula(i))
                sigs = np.concatenate([sigs, bank_sigs[i: i + 1]])
                X = np.concatenate([X, col[:, None]], axis=1)
                pos = {t.tobytes() for t in X[labels]}
                neg = {t.tobytes() for t in X[~labels]}
                if not (pos & neg):
                    break
    # ALGO: CART grown to purity (no depth limit), read off as a DNF over positive leaves
    tree = DecisionTreeClassifier(criterion="gini", random_state=seed).fit(X, labels)
    f, n_terms = _tree_formula(tree, features)
    if inst.regime == "ci":                   # every NO world must be mismatched somewhere
        seen = pos | neg
        extra: list[Formula] = []
        for k, w in enumerate(worlds):
            if w.kind != "no":
                continue
            Xn = _object_features(ctx, sigs, [k])
            pred = tree.predict(Xn).astype(bool)
            if np.array_equal(pred, w.labels):
                fresh = [i for i in range(w.domain) if not w.labels[i] and Xn[i].tobytes() not in seen]
                if fresh:
                    extra.append(_dnf(features, [Xn[fresh[0]]]))
        if extra:
            f = Or(((f.children if isinstance(f, Or) else (f,))) + tuple(extra))
            n_terms += len(extra)
    return SolveResult(f, size(f), time.perf_counter() - t0, "found", len(features), n_terms)
