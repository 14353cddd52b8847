"""Seeded instance generator for the three regimes (after SerafimBatzoglou/concept-synth).

    insts, heldout = generate(GenSpec(per_template=2, seed=0))

A hidden concept T is a gold formula from one of the TEMPLATES (depth = quantifier nesting,
0..3; ∀∃ nesting, R/S in both directions, equality), with its predicates and relation directions
drawn at random. Five templates lie outside the one-literal-guard fragment of the original
grammar (OUTSIDE_OLD_FRAGMENT: mutual edges, x != y with a successor, a 3-cycle back to x). Worlds: domain 5..8, each unary atom true with prob. p_unary, each binary atom
with prob. p_edge; labels = the gold formula's value.
- FULLOBS: 4 fully observed worlds.
- CI: 6 YES worlds (labels = T) + 2 NO worlds whose labels are T with 1-2 objects flipped.
- EC: 4 worlds in which every ground atom is hidden (unknown) with prob. unknown_rate (0.35).
Every instance gets held-out fully observed worlds of the same concept (not shown to solvers).
An instance is redrawn when its training labels are too unbalanced to say anything.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stages.induction.formula import parse, quantifier_depth, size
from stages.induction.instances import Instance, World, empty_atoms
from stages.induction.semantics import evaluate

# name -> template; {U1},{U2} unary predicates, {Bk}(a,b) a relation atom with random predicate/direction
TEMPLATES = {
    "unary": "({U1} x)",
    "unary_diff": "(and ({U1} x) (not ({U2} x)))",
    "unary_or_loop": "(or ({U1} x) ({B1x}))",
    "some_succ": "(exists y (and {B1xy} ({U1} y)))",
    "all_succ": "(forall y (or (not {B1xy}) ({U1} y)))",
    "self_and_succ": "(and ({U1} x) (exists y (and {B1xy} (not ({U2} y)))))",
    "other_both": "(exists y (and (not (= x y)) ({U1} y) ({U2} y)))",
    "succ_succ": "(exists y (and {B1xy} (exists z (and {B2yz} ({U1} z)))))",
    "all_some": "(forall y (or (not {B1xy}) (exists z (and {B2yz} ({U1} z)))))",
    "some_all": "(exists y (and {B1xy} (forall z (or (not {B2yz}) ({U1} z)))))",
    "chain3": "(exists y (and {B1xy} (exists z (and {B2yz} (exists w (and {B3zw} ({U1} w)))))))",
    "all_some_all": "(forall y (or (not {B1xy}) (exists z (and {B2yz} (forall w (or (not {B3zw}) ({U1} w)))))))",
    # outside the one-literal-guard fragment: the quantifier body mentions x twice, or uses equality
    "mutual": "(exists y (and ({RA} x y) ({RB} y x)))",
    "mutual_succ": "(exists y (and ({RA} x y) ({RB} y x) ({U1} y)))",
    "other_succ": "(exists y (and ({RA} x y) (not (= x y)) ({U1} y)))",
    "all_other_succ": "(forall y (or (not ({RA} x y)) (= x y) ({U1} y)))",
    "triangle": "(exists y (and ({RA} x y) (exists z (and ({RB} y z) ({RC} z x)))))",
}
# which templates the original grammar (one literal guard per quantifier) could express
OUTSIDE_OLD_FRAGMENT = ("mutual", "mutual_succ", "other_succ", "all_other_succ", "triangle")
FRAGMENT = {t: ("outside" if t in OUTSIDE_OLD_FRAGMENT else "inside") for t in TEMPLATES}


@dataclass(frozen=True)
class GenSpec:
    per_template: int = 2            # instances per (regime, template)
    regimes: tuple[str, ...] = ("fullobs", "ci", "ec")
    templates: tuple[str, ...] = tuple(TEMPLATES)
    min_domain: int = 5
    max_domain: int = 8
    p_unary: float = 0.4
    p_edge: float = 0.25
    fullobs_worlds: int = 4
    ci_yes: int = 6
    ci_no: int = 2
    ec_worlds: int = 4
    unknown_rate: float = 0.35
    heldout_worlds: int = 4
    min_minority: float = 0.15      # training labels: each class at least this fraction
    seed: int = 0
    id_prefix: str = ""


def instantiate(template: str, rng: np.random.Generator) -> str:
    u1, u2 = rng.permutation(["P", "Q"])
    subs = {"U1": u1, "U2": u2}
    for k, (a, b) in enumerate((("x", "y"), ("y", "z"), ("z", "w")), start=1):
        pred = rng.choice(["R", "S"])
        args = (a, b) if rng.random() < 0.5 else (b, a)
        subs[f"B{k}{a}{b}"] = f"({pred} {args[0]} {args[1]})"
    subs["B1x"] = f"{rng.choice(['R', 'S'])} x x"
    for k in ("RA", "RB", "RC"):
        subs[k] = str(rng.choice(["R", "S"]))
    return template.format(**subs)


def random_world(rng: np.random.Generator, spec: GenSpec) -> World:
    D = int(rng.integers(spec.min_domain, spec.max_domain + 1))
    facts = empty_atoms(D)
    for p in ("P", "Q"):
        facts[p] = rng.random(D) < spec.p_unary
    for r in ("R", "S"):
        facts[r] = rng.random((D, D)) < spec.p_edge
    return World(D, facts, empty_atoms(D), np.zeros(D, bool))


def labelled(world: World, gold) -> World:
    world.labels = evaluate(gold, world)
    return world


def _balanced(worlds: list[World], spec: GenSpec) -> bool:
    labels = np.concatenate([w.labels for w in worlds])
    frac = labels.mean()
    return spec.min_minority <= frac <= 1 - spec.min_minority


def _hide(world: World, rate: float, rng: np.random.Generator) -> World:
    facts, unknown = empty_atoms(world.domain), empty_atoms(world.domain)
    for k, arr in world.facts.items():
        hidden = rng.random(arr.shape) < rate
        unknown[k] = hidden
        facts[k] = arr & ~hidden
    return World(world.domain, facts, unknown, world.labels.copy())


def make_instance(iid: str, regime: str, template: str, rng: np.random.Generator,
                  spec: GenSpec, tries: int = 200) -> tuple[Instance, dict]:
    for _ in range(tries):
        gold_text = instantiate(TEMPLATES[template], rng)
        gold = parse(gold_text)
        if regime == "fullobs":
            worlds = [labelled(random_world(rng, spec), gold) for _ in range(spec.fullobs_worlds)]
            shown = worlds
        elif regime == "ci":
            worlds = [labelled(random_world(rng, spec), gold) for _ in range(spec.ci_yes + spec.ci_no)]
            for w in worlds[spec.ci_yes:]:
                w.kind = "no"
                flip = rng.choice(w.domain, size=int(rng.integers(1, 3)), replace=False)
                w.labels = w.labels.copy()
                w.labels[flip] = ~w.labels[flip]
            shown = worlds[: spec.ci_yes]
        else:
            full = [labelled(random_world(rng, spec), gold) for _ in range(spec.ec_worlds)]
            shown = full
            worlds = [_hide(w, spec.unknown_rate, rng) for w in full]
        if not _balanced(shown, spec):
            continue
        heldout = [labelled(random_world(rng, spec), gold) for _ in range(spec.heldout_worlds)]
        inst = Instance(iid, regime, worlds, gold_text)
        meta = {"id": iid, "regime": regime, "template": template, "fragment": FRAGMENT[template],
                "seed": spec.seed, "depth": quantifier_depth(gold),
                "gold_size": size(gold), "heldout": [w.to_json("fullobs") for w in heldout]}
        return inst, meta
    raise RuntimeError(f"{iid}: template {template!r} gave no balanced instance in {tries} tries")


def generate(spec: GenSpec) -> tuple[list[Instance], list[dict]]:
    rng = np.random.default_rng(spec.seed)
    prefix = {"fullobs": f"{spec.id_prefix}fo", "ci": f"{spec.id_prefix}ci", "ec": f"{spec.id_prefix}ec"}
    insts, metas = [], []
    for regime in spec.regimes:
        k = 0
        for template in spec.templates:
            for _ in range(spec.per_template):
                k += 1
                inst, meta = make_instance(f"{prefix[regime]}-{k:04d}", regime, template, rng, spec)
                insts.append(inst)
                metas.append(meta)
    return insts, metas
