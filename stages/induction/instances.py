"""Instance and prediction files (JSONL, format fixed by the card), validated early and clearly.

An instance line:
    {"id": "fo-0001", "regime": "fullobs" | "ci" | "ec",
     "worlds": [{"domain": 6, "facts": {"P": [0,3], "R": [[0,1]]}, "unknown": {"P": [5]},
                 "labels": [1,0,0,1,0,0], "kind": "yes"}], "gold": "(P x)"}

Every problem (bad JSON, missing field, labels of the wrong length, a fact outside the domain, an
unknown predicate, a malformed gold formula, ...) raises :class:`InstanceError` whose one-line
message names the file line, the instance id and the field.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from stages.common.paths import json_text_depth
from stages.induction.formula import BINARY, UNARY, FormulaError, parse

REGIMES = ("fullobs", "ci", "ec")
MAX_DOMAIN = 31  # bit-packed evaluation limit (kernels.quantifier_eval.MAX_DOMAIN)
MAX_FILE_BYTES = 256 * 2**20   # an instance / prediction / upstream file larger than this is refused unread
MAX_JSON_DEPTH = 32            # the formats nest 6-8 levels; deeper JSON is refused before it is parsed


class InstanceError(ValueError):
    """A malformed instance or prediction file; the message names file line, id and field."""


@dataclass
class World:
    """One finite structure. Arrays are bool: P/Q (D,), R/S (D, D); *_unk mark unknown atoms."""

    domain: int
    facts: dict[str, np.ndarray]
    unknown: dict[str, np.ndarray]
    labels: np.ndarray            # (D,) bool
    kind: str = "yes"             # ci: yes | no

    @property
    def has_unknown(self) -> bool:
        return any(a.any() for a in self.unknown.values())

    def to_json(self, regime: str) -> dict[str, Any]:
        out: dict[str, Any] = {"domain": self.domain, "facts": _atoms_json(self.facts)}
        if regime == "ec":
            out["unknown"] = _atoms_json(self.unknown)
        out["labels"] = [int(v) for v in self.labels]
        if regime == "ci":
            out["kind"] = self.kind
        return out


@dataclass
class Instance:
    id: str
    regime: str
    worlds: list[World]
    gold: str | None = None
    line: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "regime": self.regime,
                               "worlds": [w.to_json(self.regime) for w in self.worlds]}
        if self.gold is not None:
            out["gold"] = self.gold
        return out


def _atoms_json(arrays: dict[str, np.ndarray]) -> dict[str, list]:
    out: dict[str, list] = {}
    for p in UNARY:
        out[p] = [int(i) for i in np.flatnonzero(arrays[p])]
    for r in BINARY:
        out[r] = [[int(a), int(b)] for a, b in zip(*np.nonzero(arrays[r]))]
    return out


def empty_atoms(domain: int) -> dict[str, np.ndarray]:
    return {"P": np.zeros(domain, bool), "Q": np.zeros(domain, bool),
            "R": np.zeros((domain, domain), bool), "S": np.zeros((domain, domain), bool)}


# ---------------------------------------------------------------- validation
class _Where:
    def __init__(self, path: str, line: int, iid: str):
        self.path, self.line, self.iid = path, line, iid

    def error(self, field_name: str, msg: str) -> InstanceError:
        return InstanceError(f"{self.path}:{self.line}: instance {self.iid!r}: field {field_name}: {msg}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _parse_atoms(obj: Any, domain: int, where: _Where, fld: str) -> dict[str, np.ndarray]:
    arrays = empty_atoms(domain)
    if obj is None:
        return arrays
    if not isinstance(obj, dict):
        raise where.error(fld, f"expected a mapping of predicate -> atoms, got {type(obj).__name__}")
    for pred, atoms in obj.items():
        f = f"{fld}.{pred}"
        if pred not in UNARY + BINARY:
            raise where.error(f, f"unknown predicate {pred!r} (predicates: P, Q, R, S)")
        if not isinstance(atoms, list):
            raise where.error(f, f"expected a list of atoms, got {type(atoms).__name__}")
        for k, atom in enumerate(atoms):
            if pred in UNARY:
                if not _is_int(atom):
                    raise where.error(f"{f}[{k}]", f"expected an object index, got {atom!r}")
                args = (atom,)
            else:
                if not (isinstance(atom, list) and len(atom) == 2 and all(_is_int(a) for a in atom)):
                    raise where.error(f"{f}[{k}]", f"expected a pair [a, b] of object indices, got {atom!r}")
                args = tuple(atom)
            if any(a < 0 or a >= domain for a in args):
                shown = f"{pred}({', '.join(map(str, args))})"
                raise where.error(f"{f}[{k}]", f"fact {shown} is outside the domain 0..{domain - 1}")
            arrays[pred][args] = True
    return arrays


def _parse_world(obj: Any, regime: str, where: _Where, fld: str) -> World:
    if not isinstance(obj, dict):
        raise where.error(fld, f"expected a world object, got {type(obj).__name__}")
    unknown_keys = sorted(set(obj) - {"domain", "facts", "unknown", "labels", "kind"})
    if unknown_keys:
        raise where.error(f"{fld}.{unknown_keys[0]}", "unknown key (world keys: domain, facts, unknown, labels, kind)")
    domain = obj.get("domain")
    if not _is_int(domain) or not 1 <= domain <= MAX_DOMAIN:
        raise where.error(f"{fld}.domain", f"expected an integer in 1..{MAX_DOMAIN}, got {domain!r}")
    facts = _parse_atoms(obj.get("facts"), domain, where, f"{fld}.facts")
    if "unknown" in obj and regime != "ec" and obj["unknown"]:
        raise where.error(f"{fld}.unknown", f"unknown atoms are only allowed in regime 'ec' (this is {regime!r})")
    unknown = _parse_atoms(obj.get("unknown"), domain, where, f"{fld}.unknown")
    for p in UNARY + BINARY:
        both = facts[p] & unknown[p]
        if both.any():
            idx = tuple(int(i) for i in np.argwhere(both)[0])
            raise where.error(f"{fld}.unknown.{p}", f"atom {p}{idx} is listed both as a fact and as unknown")
    labels = obj.get("labels")
    if not isinstance(labels, list):
        raise where.error(f"{fld}.labels", f"expected a list of {domain} labels (0/1), got {type(labels).__name__}")
    if len(labels) != domain:
        raise where.error(f"{fld}.labels", f"expected {domain} labels (domain {domain}), got {len(labels)}")
    if any(v not in (0, 1) or isinstance(v, float) for v in labels):
        raise where.error(f"{fld}.labels", f"labels must be 0 or 1, got {labels!r}")
    kind = obj.get("kind", "yes")
    if regime == "ci" and "kind" not in obj:
        raise where.error(f"{fld}.kind", "regime 'ci' needs kind 'yes' or 'no' on every world")
    if kind not in ("yes", "no"):
        raise where.error(f"{fld}.kind", f"expected 'yes' or 'no', got {kind!r}")
    if kind == "no" and regime != "ci":
        raise where.error(f"{fld}.kind", f"kind 'no' is only meaningful in regime 'ci' (this is {regime!r})")
    return World(domain, facts, unknown, np.array(labels, dtype=bool), kind)


def parse_instance(obj: Any, path: str = "<instances>", line: int = 1) -> Instance:
    iid = obj.get("id", "?") if isinstance(obj, dict) else "?"
    where = _Where(path, line, str(iid))
    if not isinstance(obj, dict):
        raise where.error("(line)", f"expected a JSON object, got {type(obj).__name__}")
    if not isinstance(obj.get("id"), str) or not obj["id"]:
        raise where.error("id", f"expected a non-empty string, got {obj.get('id')!r}")
    unknown_keys = sorted(set(obj) - {"id", "regime", "worlds", "gold", "meta"})
    if unknown_keys:
        raise where.error(unknown_keys[0], "unknown key (instance keys: id, regime, worlds, gold)")
    regime = obj.get("regime")
    if regime not in REGIMES:
        raise where.error("regime", f"expected one of {', '.join(REGIMES)}, got {regime!r}")
    worlds = obj.get("worlds")
    if not isinstance(worlds, list) or not worlds:
        raise where.error("worlds", "expected a non-empty list of worlds")
    parsed = [_parse_world(w, regime, where, f"worlds[{k}]") for k, w in enumerate(worlds)]
    if regime == "ci" and not any(w.kind == "yes" for w in parsed):
        raise where.error("worlds", "regime 'ci' needs at least one 'yes' world")
    gold = obj.get("gold")
    if gold is not None:
        if not isinstance(gold, str):
            raise where.error("gold", f"expected a formula string, got {type(gold).__name__}")
        try:
            parse(gold)
        except FormulaError as err:
            raise where.error("gold", f"malformed formula: {err}") from None
    meta = obj.get("meta") or {}
    return Instance(obj["id"], regime, parsed, gold, line, meta if isinstance(meta, dict) else {})


def read_bounded(path: Path, max_bytes: int | None = None, error=None) -> bytes:
    """The file's bytes, refusing (one-line error) a file over max_bytes (default MAX_FILE_BYTES) before reading it."""
    error = error or InstanceError
    max_bytes = MAX_FILE_BYTES if max_bytes is None else max_bytes
    try:
        n = Path(path).stat().st_size
        if n > max_bytes:
            raise error(f"{path}: file is {n:,} bytes, over the limit of {max_bytes:,} bytes (refused unread)")
        return Path(path).read_bytes()
    except OSError as err:
        raise error(f"{path}: cannot read ({err.strerror or err})") from None


def check_depth(raw: bytes, where: str, max_depth: int | None = None, error=None) -> None:
    max_depth = MAX_JSON_DEPTH if max_depth is None else max_depth
    depth = json_text_depth(raw)
    if depth > max_depth:
        raise (error or InstanceError)(f"{where}: JSON nested {depth} levels deep, over the limit of {max_depth} "
                                       "(refused before parsing)")


def _json_lines(path: Path):
    raw_bytes = read_bounded(path)
    if b"\x00" in raw_bytes:
        raise InstanceError(f"{path}: binary file (NUL byte at offset {raw_bytes.index(0)}), expected JSON lines")
    try:
        text = raw_bytes.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw_bytes[: err.start].count(b"\n") + 1
        raise InstanceError(f"{path}:{line}: not UTF-8 text (byte 0x{raw_bytes[err.start]:02x} at offset "
                            f"{err.start})") from None
    for line_no, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        check_depth(raw.encode(), f"{path}:{line_no}")
        try:
            yield line_no, json.loads(raw)
        except json.JSONDecodeError as err:
            raise InstanceError(f"{path}:{line_no}: not valid JSON ({err.msg} at column {err.colno})") from None
        except ValueError as err:  # an integer literal too long to convert
            raise InstanceError(f"{path}:{line_no}: not valid JSON ({str(err).splitlines()[0][:100]})") from None


def load_instances(path: Path) -> list[Instance]:
    out: list[Instance] = []
    seen: dict[str, int] = {}
    for line_no, obj in _json_lines(path):
        inst = parse_instance(obj, str(path), line_no)
        if inst.id in seen:
            raise InstanceError(f"{path}:{line_no}: instance {inst.id!r}: field id: duplicate id "
                                f"(first at line {seen[inst.id]})")
        seen[inst.id] = line_no
        out.append(inst)
    if not out:
        raise InstanceError(f"{path}: no instances")
    return out


def write_instances(path: Path, instances: list[Instance]) -> None:
    Path(path).write_text("".join(json.dumps(i.to_json()) + "\n" for i in instances))


# ---------------------------------------------------------------- predictions
@dataclass
class Prediction:
    id: str
    formula: str | None
    size: int | None = None
    seconds: float | None = None
    line: int = 0


def load_predictions(path: Path, instances: list[Instance]) -> dict[str, Prediction]:
    """id -> prediction; every instance must have one (else InstanceError naming the id)."""
    preds: dict[str, Prediction] = {}
    for line_no, obj in _json_lines(path):
        if not isinstance(obj, dict):
            raise InstanceError(f"{path}:{line_no}: expected a JSON object, got {type(obj).__name__}")
        pid = obj.get("id")
        if not isinstance(pid, str) or not pid:
            raise InstanceError(f"{path}:{line_no}: field id: expected a non-empty string, got {pid!r}")
        formula = obj.get("formula")
        if formula is not None and not isinstance(formula, str):
            raise InstanceError(f"{path}:{line_no}: prediction {pid!r}: field formula: expected a string or null, "
                                f"got {type(formula).__name__}")
        if pid in preds:
            raise InstanceError(f"{path}:{line_no}: prediction {pid!r}: field id: duplicate id "
                                f"(first at line {preds[pid].line})")
        preds[pid] = Prediction(pid, formula, obj.get("size"), obj.get("seconds"), line_no)
    for inst in instances:
        if inst.id not in preds:
            raise InstanceError(f"{path}: instance {inst.id!r} (line {inst.line} of the instances): "
                                f"field id: no prediction with this id")
    return preds
