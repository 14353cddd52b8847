"""Synthesizer (B): the "bloated" fitter -- a disjunction of per-object characteristic formulas.

    res = fit_bloated(instance)          # SolveResult; valid on the training worlds by construction

ALGO (characteristic-type DNF): fix a vocabulary of unary features F = (f_1..f_m) -- the atoms
(P x) (Q x) (R x x) (S x x), ∃y G(x,y) for every guard G, and ∃y (G(x,y) ∧ L(y)) for the four
relation guards and L ∈ {P, Q, ¬P, ¬Q}. The type of an object a is the sign vector
(f_1(a), ..., f_m(a)); the characteristic formula of a type t is  χ_t(x) = ∧_i (±f_i(x)), and
    φ(x) = ∨_{t ∈ types of positive training objects} χ_t(x).
φ is exactly right on every training object whose type is not shared by an object of the other
label; if some type is shared, the vocabulary is extended with every observationally distinct
enumerated formula of growing size until the types separate (then φ is valid on the training
worlds). CI: fitted on the YES worlds; a NO world that φ happens to label exactly gets one of its
label-0 objects of a fresh type added as a positive type. EC: fitted on one completion of every
world (unknown atoms read as false), which witnesses validity.
"""
from __future__ import annotations

import time

import numpy as np

from stages.induction.bitset import ENUM_GUARDS, BitContext, Guard, unpack
from stages.induction.enumerate import SolveResult, feature_bank
from stages.induction.formula import And, Atom, Formula, Not, Or, Quant, size
from stages.induction.instances import Instance, World, empty_atoms


def base_features() -> list[Formula]:
    feats: list[Formula] = [Atom("P", ("x",)), Atom("Q", ("x",)), Atom("R", ("x", "x")), Atom("S", ("x", "x"))]
    feats += [Quant("exists", "y", g.literal("x", "y")) for g in ENUM_GUARDS]
    for g in ENUM_GUARDS:
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


def fit_bloated(inst: Instance, max_feature_size: int = 12, backend: str = "auto") -> SolveResult:
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
        pos = {t.tobytes(): t for t in X[labels]}
        neg = {t.tobytes() for t in X[~labels]}
        if not (set(pos) & neg):
            break
        extra_size += 2                       # extend the vocabulary: only features that split a clash
        if extra_size > max_feature_size:
            return SolveResult(None, None, time.perf_counter() - t0, "inseparable", len(features), 0)
        bank = feature_bank(ctx, extra_size)
        bank_sigs = bank._cat()[0]
        for i in range(bank.count):
            col = _object_features(ctx, bank_sigs[i: i + 1], train)[:, 0]
            keys = [t.tobytes() for t in X]
            clash = set(pos) & neg
            groups: dict[bytes, set] = {}
            for k, v in zip(keys, col):
                if k in clash:
                    groups.setdefault(k, set()).add(bool(v))
            if any(len(vals) == 2 for vals in groups.values()):
                features.append(bank.formula(i))
                sigs = np.concatenate([sigs, bank_sigs[i: i + 1]])
                X = np.concatenate([X, col[:, None]], axis=1)
                pos = {t.tobytes(): t for t in X[labels]}
                neg = {t.tobytes() for t in X[~labels]}
                if not (set(pos) & neg):
                    break
    types = list(pos.values())
    if inst.regime == "ci":                   # every NO world must be mismatched somewhere
        pos_keys = set(pos)
        for k, w in enumerate(worlds):
            if w.kind != "no":
                continue
            Xn = _object_features(ctx, sigs, [k])
            pred = np.array([t.tobytes() in pos_keys for t in Xn])
            if np.array_equal(pred, w.labels):
                fresh = [i for i in range(w.domain) if not w.labels[i] and Xn[i].tobytes() not in neg]
                if fresh:
                    types.append(Xn[fresh[0]])
                    pos_keys.add(Xn[fresh[0]].tobytes())
    f = _dnf(features, types)
    return SolveResult(f, size(f), time.perf_counter() - t0, "found", len(features), len(types))
