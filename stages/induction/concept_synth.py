"""Loader for the upstream INDUCTION release (SerafimBatzoglou/concept-synth, benchmarks/induction) in its
own schema, and the tasks the pipeline builds from it.

    recs = load_records("…/induction_fullobs_benchmarked36_v1.yaml.gz")    # benchmark records (yaml[.gz]/json[l])
    held = load_holdout("…/induction_fullobs_benchmarked36_generated_iid_holdout_v1.jsonl")
    llm  = load_llm_report("…/claude_opus_5_5_challenge100_round1_report.json")
    tasks = load_upstream_dir(Path("stages/induction/upstream"))          # everything vendored there

Upstream schema (docs/dataset_schema.md, schemas/benchmark_record.schema.json of the release):
- **benchmark record** (`induction_benchmark_record_v1`; gzip-compressed YAML lists upstream): `instanceId`,
  `task` (FullObs | CI | EC), `scenario` (AD | C | E), `problem` {`worlds`, `task`: `trainWorldIds` /
  `testWorldIds` (FullObs, EC) or `yesWorldIds` / `noWorldIds` (CI)}, `problemDescription.hiddenTarget.formula`
  (the planted gold concept, S-expression; `astSize` optional);
- **world**: `worldId`, `domain` (object names, e.g. "a0"), `domainSize` (optional), `predicates`
  {P|Q|R|S: {"true": [...], "false": [...]}} with unary atoms "a3" and binary atoms "(a0, a3)",
  `targetExtension` {`T_true`, `T_false` (optional: the complement)}, `unknownAtoms` {pred: [atoms]} (EC only),
  `observationMode` full | partial. Atoms listed nowhere are false (closed world).
- **generated IID holdout** JSONL (one line per released task): `task_id`, `requested_worlds`,
  `generated_worlds`, `worlds` (fully observed worlds of the same hidden concept; 0 when upstream could
  generate none).
- **verified model report** (`induction_challenge100_verified_model_report_v1`): `model`, `tasks` [{`task_id`,
  `category_or_slice`, `correct` (train-correct), `evaluable`, `correct_ast`, `formula`, `holdout`
  {`available`, `correct`, `generated_worlds`}}] -- the published LLM numbers per task;
- **public model registry** (`induction_challenge100_round1_public_registry_v1`, docs/…_model_registry.yaml):
  `models` [{`id`, `display_name`, `protocol`, `benchmarked36` {`evaluable`, `correct`,
  `correct_formula_ast_sizes`, `holdout_evaluable`, `holdout_correct`}, `challenge64`, `challenge100`}] --
  published per-model AGGREGATES over the 36 new36 tasks (no per-task results).

Every malformed entry raises :class:`UpstreamError` with one line naming the file (and line), the task id
and the field. Files are size-bounded before they are read and JSON nesting is bounded before it is parsed;
YAML is read with a safe loader that refuses aliases (no alias bombs).

Tasks (:func:`build_tasks`): with benchmark records, each record is a task **as released** (its training
worlds; held-out = its test worlds + the released holdout worlds of that task id). With only the holdout
file, a task with ``>= train_worlds + 1`` released holdout worlds gives one **fold** per held-out world j
(train on the other worlds, test on world j) -- the released worlds of the released hidden concept, not
the released training worlds (those are only in the .yaml.gz records).
"""
from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from stages.common.paths import json_text_depth
from stages.induction.formula import BINARY, UNARY, FormulaError, binary_size, parse, quantifier_depth
from stages.induction.instances import (MAX_DOMAIN, MAX_FILE_BYTES, MAX_JSON_DEPTH, Instance, World, check_depth,
                                        empty_atoms, read_bounded)

RECORD_SCHEMA = "induction_benchmark_record_v1"
REPORT_SCHEMA = "induction_challenge100_verified_model_report_v1"
TASKS = {"FullObs": "fullobs", "CI": "ci", "EC": "ec"}
SCENARIOS = {"FullObs": "AD", "CI": "C", "EC": "E"}
REGISTRY_SCHEMA = "induction_challenge100_round1_public_registry_v1"
HOLDOUT_GLOB = "*holdout*.jsonl"
RECORD_GLOBS = ("*.yaml.gz", "*.yaml", "*_records.json", "*_records.jsonl")
REPORT_GLOB = "*_report.json"
REGISTRY_GLOB = "*registry*.yaml"
_PAIR_RE = re.compile(r"\(\s*([^\s,()]+)\s*,\s*([^\s,()]+)\s*\)\Z")
_FAMILY_RE = re.compile(r"(?:fullobs|ci|ec)_v\d+_(?P<family>.+?)_(?P<num>\d+)\Z")
MAX_DECOMPRESSED = 4 * MAX_FILE_BYTES


class UpstreamError(ValueError):
    """A malformed upstream file or entry; the one-line message names file, line, task id and field."""


class _Where:
    def __init__(self, path: Path | str, line: int | None = None, task: str = "?"):
        self.path, self.line, self.task = str(path), line, task

    def err(self, fld: str, msg: str) -> UpstreamError:
        at = f"{self.path}:{self.line}" if self.line is not None else self.path
        return UpstreamError(f"{at}: task {self.task!r}: field {fld}: {msg}")


def family_of(task_id: str, fallback: str = "other") -> str:
    m = _FAMILY_RE.match(task_id)
    return m.group("family") if m else fallback


# ---------------------------------------------------------------- worlds
def _names(obj: Any, where: _Where, fld: str) -> list[str]:
    if not isinstance(obj, list) or not all(isinstance(v, str) and v for v in obj):
        raise where.err(fld, f"expected a list of object names (strings), got {str(obj)[:60]!r}")
    return obj


def _index(name: Any, index: dict[str, int], where: _Where, fld: str) -> int:
    if not isinstance(name, str) or name not in index:
        raise where.err(fld, f"object {name!r} is not in the world's domain")
    return index[name]


def _atom_args(pred: str, atom: Any, index: dict[str, int], where: _Where, fld: str) -> tuple[int, ...]:
    if pred in UNARY:
        return (_index(atom, index, where, fld),)
    m = _PAIR_RE.match(atom.strip()) if isinstance(atom, str) else None
    if m is None:
        raise where.err(fld, f"expected a binary atom written \"(a, b)\", got {atom!r}")
    return (_index(m.group(1), index, where, fld), _index(m.group(2), index, where, fld))


def _atom_set(pred: str, atoms: Any, index: dict[str, int], where: _Where, fld: str) -> set[tuple[int, ...]]:
    if not isinstance(atoms, list):
        raise where.err(fld, f"expected a list of atoms, got {type(atoms).__name__}")
    return {_atom_args(pred, a, index, where, f"{fld}[{k}]") for k, a in enumerate(atoms)}


def parse_world(obj: Any, where: _Where, fld: str, allow_unknown: bool) -> tuple[str, World]:
    """(worldId, World) from an upstream world object (labels from targetExtension)."""
    if not isinstance(obj, dict):
        raise where.err(fld, f"expected a world object, got {type(obj).__name__}")
    wid = obj.get("worldId", "")
    if not isinstance(wid, str):
        raise where.err(f"{fld}.worldId", f"expected a string, got {wid!r}")
    domain = _names(obj.get("domain"), where, f"{fld}.domain")
    if not 1 <= len(domain) <= MAX_DOMAIN:
        raise where.err(f"{fld}.domain", f"expected 1..{MAX_DOMAIN} objects, got {len(domain)}")
    if len(set(domain)) != len(domain):
        dup = next(v for v in domain if domain.count(v) > 1)
        raise where.err(f"{fld}.domain", f"object {dup!r} is listed twice")
    if "domainSize" in obj and obj["domainSize"] != len(domain):
        raise where.err(f"{fld}.domainSize", f"{obj['domainSize']!r} does not match the {len(domain)} objects of domain")
    index = {name: k for k, name in enumerate(domain)}
    D = len(domain)
    facts, unknown = empty_atoms(D), empty_atoms(D)
    preds = obj.get("predicates")
    if not isinstance(preds, dict):
        raise where.err(f"{fld}.predicates", f"expected a mapping predicate -> {{true, false}}, got {type(preds).__name__}")
    unk = obj.get("unknownAtoms") or {}
    if not isinstance(unk, dict):
        raise where.err(f"{fld}.unknownAtoms", f"expected a mapping predicate -> atoms, got {type(unk).__name__}")
    if unk and any(unk.values()) and not allow_unknown:
        raise where.err(f"{fld}.unknownAtoms", "unknown atoms are only allowed in EC tasks")
    for pred in set(preds) | set(unk):
        if pred not in UNARY + BINARY:
            raise where.err(f"{fld}.predicates.{pred}", f"unknown predicate {pred!r} (vocabulary: P, Q, R, S)")
    for pred, ext in preds.items():
        f = f"{fld}.predicates.{pred}"
        if not isinstance(ext, dict) or set(ext) - {"true", "false"}:
            raise where.err(f, f"expected {{\"true\": [...], \"false\": [...]}}, got {str(ext)[:60]!r}")
        true = _atom_set(pred, ext.get("true", []), index, where, f"{f}.true")
        false = _atom_set(pred, ext.get("false", []), index, where, f"{f}.false")
        both = true & false
        if both:
            raise where.err(f, f"atom {pred}{sorted(both)[0]} is listed both true and false")
        for args in true:
            facts[pred][args] = True
        u = _atom_set(pred, unk.get(pred, []), index, where, f"{fld}.unknownAtoms.{pred}")
        if u & (true | false):
            raise where.err(f"{fld}.unknownAtoms.{pred}", f"atom {pred}{sorted(u & (true | false))[0]} is both "
                                                          "unknown and observed")
        for args in u:
            unknown[pred][args] = True
    for pred in set(unk) - set(preds):
        for args in _atom_set(pred, unk[pred], index, where, f"{fld}.unknownAtoms.{pred}"):
            unknown[pred][args] = True
    tgt = obj.get("targetExtension")
    if not isinstance(tgt, dict) or "T_true" not in tgt:
        raise where.err(f"{fld}.targetExtension", "expected {\"T_true\": [...]} (the objects where T holds)")
    pos = {_index(a, index, where, f"{fld}.targetExtension.T_true[{k}]")
           for k, a in enumerate(_names(tgt["T_true"], where, f"{fld}.targetExtension.T_true"))}
    if tgt.get("T_false") is not None:
        neg = {_index(a, index, where, f"{fld}.targetExtension.T_false[{k}]")
               for k, a in enumerate(_names(tgt["T_false"], where, f"{fld}.targetExtension.T_false"))}
        if pos & neg or len(pos | neg) != D:
            raise where.err(f"{fld}.targetExtension", "T_true and T_false do not partition the domain "
                                                      f"({len(pos & neg)} in both, {D - len(pos | neg)} in neither)")
    labels = np.zeros(D, bool)
    labels[list(pos)] = True
    return wid, World(D, facts, unknown, labels)


# ---------------------------------------------------------------- files
def _load_text(path: Path, error=UpstreamError) -> bytes:
    raw = read_bounded(path, MAX_FILE_BYTES, error)
    if str(path).endswith(".gz"):
        try:
            with gzip.open(path, "rb") as fh:
                raw = fh.read(MAX_DECOMPRESSED + 1)
        except (OSError, EOFError) as err:
            raise error(f"{path}: not a readable gzip file ({err})") from None
        if len(raw) > MAX_DECOMPRESSED:
            raise error(f"{path}: decompresses to more than {MAX_DECOMPRESSED:,} bytes (refused)")
    if b"\x00" in raw:
        raise error(f"{path}: binary content (NUL byte), expected text")
    return raw


def _yaml(raw: bytes, path: Path) -> Any:
    """A YAML document through the safe loader (C-accelerated when available), aliases refused."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    indent = max((len(line) - len(line.lstrip(b" ")) for line in raw.splitlines()), default=0)
    if indent > 4 * MAX_JSON_DEPTH or json_text_depth(raw) > MAX_JSON_DEPTH:
        raise UpstreamError(f"{path}: YAML nested too deeply (refused before parsing)")
    try:
        text = raw.decode("utf-8")
        for ev in yaml.parse(text, Loader=loader):          # events only: cheap, and no alias is expanded
            if isinstance(ev, yaml.AliasEvent):
                raise UpstreamError(f"{path}:{ev.start_mark.line + 1}: YAML alias *{ev.anchor} refused (released "
                                    "files use none; aliases can expand without bound)")
        return yaml.load(text, Loader=loader)
    except UnicodeDecodeError as err:
        raise UpstreamError(f"{path}: not UTF-8 text (offset {err.start})") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise UpstreamError(f"{at}: not valid YAML ({getattr(err, 'problem', None) or err})") from None
    except RecursionError:
        raise UpstreamError(f"{path}: YAML nested too deeply") from None


def _json_doc(raw: bytes, path: Path) -> Any:
    check_depth(raw, str(path), error=UpstreamError)
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise UpstreamError(f"{path}: not UTF-8 text (offset {err.start})") from None
    except json.JSONDecodeError as err:
        raise UpstreamError(f"{path}:{err.lineno}: not valid JSON ({err.msg} at column {err.colno})") from None
    except ValueError as err:  # an integer literal too long to convert
        raise UpstreamError(f"{path}: not valid JSON ({str(err).splitlines()[0][:100]})") from None


def _jsonl(raw: bytes, path: Path):
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UpstreamError(f"{path}: not UTF-8 text (offset {err.start})") from None
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        check_depth(line.encode(), f"{path}:{line_no}", error=UpstreamError)
        try:
            yield line_no, json.loads(line)
        except json.JSONDecodeError as err:
            raise UpstreamError(f"{path}:{line_no}: not valid JSON ({err.msg} at column {err.colno})") from None
        except ValueError as err:  # an integer literal too long to convert
            raise UpstreamError(f"{path}:{line_no}: not valid JSON ({str(err).splitlines()[0][:100]})") from None


# ---------------------------------------------------------------- benchmark records
@dataclass
class Record:
    """One released benchmark instance, in project terms."""

    id: str
    task: str                        # FullObs | CI | EC
    regime: str                      # fullobs | ci | ec
    family: str
    train: list[World]
    test: list[World]                # the record's own testWorldIds (fully observed), held out
    gold: str
    gold_ast: int | None             # upstream's astSize when given
    meta: dict[str, Any] = field(default_factory=dict)


def parse_record(obj: Any, where: _Where) -> Record:
    if not isinstance(obj, dict):
        raise where.err("(record)", f"expected a mapping, got {type(obj).__name__}")
    iid = obj.get("instanceId")
    if not isinstance(iid, str) or not iid:
        raise where.err("instanceId", f"expected a non-empty string, got {iid!r}")
    where.task = iid
    if obj.get("schemaVersion") != RECORD_SCHEMA:
        raise where.err("schemaVersion", f"expected {RECORD_SCHEMA!r}, got {obj.get('schemaVersion')!r}")
    task = obj.get("task")
    if task not in TASKS:
        raise where.err("task", f"expected one of FullObs, CI, EC, got {task!r}")
    if obj.get("scenario") not in (None, SCENARIOS[task]):
        raise where.err("scenario", f"{obj['scenario']!r} does not match task {task} ({SCENARIOS[task]})")
    prob = obj.get("problem")
    if not isinstance(prob, dict):
        raise where.err("problem", "expected a mapping with worlds and task")
    if prob.get("instanceId", iid) != iid:
        raise where.err("problem.instanceId", f"{prob['instanceId']!r} differs from instanceId {iid!r}")
    worlds = prob.get("worlds")
    if not isinstance(worlds, list) or not worlds:
        raise where.err("problem.worlds", "expected a non-empty list of worlds")
    by_id: dict[str, World] = {}
    for k, w in enumerate(worlds):
        wid, world = parse_world(w, where, f"problem.worlds[{k}]", allow_unknown=task == "EC")
        if not wid:
            raise where.err(f"problem.worlds[{k}].worldId", "missing (records name every world)")
        if wid in by_id:
            raise where.err(f"problem.worlds[{k}].worldId", f"duplicate world id {wid!r}")
        by_id[wid] = world
    spec = prob.get("task")
    if not isinstance(spec, dict):
        raise where.err("problem.task", "expected a mapping naming the task's world ids")

    def ids(key: str, required: bool) -> list[str]:
        v = spec.get(key, [] if not required else None)
        if v is None or not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise where.err(f"problem.task.{key}", f"expected a list of world ids, got {v!r}")
        if required and not v:
            raise where.err(f"problem.task.{key}", "expected at least one world id")
        for x in v:
            if x not in by_id:
                raise where.err(f"problem.task.{key}", f"world id {x!r} is not among problem.worlds")
        return v

    if task == "CI":
        yes, no = ids("yesWorldIds", True), ids("noWorldIds", False)
        train = [by_id[i] for i in yes] + [by_id[i] for i in no]
        for w in train[len(yes):]:
            w.kind = "no"
        test: list[World] = []
    else:
        train = [by_id[i] for i in ids("trainWorldIds", True)]
        test = [by_id[i] for i in ids("testWorldIds", False)]
        if any(w.has_unknown for w in test):
            raise where.err("problem.task.testWorldIds", "test worlds must be fully observed")
    desc = obj.get("problemDescription")
    target = desc.get("hiddenTarget") if isinstance(desc, dict) else None
    gold = target.get("formula") if isinstance(target, dict) else None
    if not isinstance(gold, str) or not gold:
        raise where.err("problemDescription.hiddenTarget.formula", f"expected the gold formula, got {gold!r}")
    try:
        parse(gold)
    except FormulaError as err:
        raise where.err("problemDescription.hiddenTarget.formula", f"malformed formula: {err}") from None
    ast = target.get("astSize")
    if ast is not None and (not isinstance(ast, int) or isinstance(ast, bool) or ast < 0):
        raise where.err("problemDescription.hiddenTarget.astSize", f"expected a non-negative integer, got {ast!r}")
    fam = family_of(iid, str(desc.get("gold_family_id") or "other"))
    return Record(iid, task, TASKS[task], fam, train, test, gold, ast,
                  {k: desc.get(k) for k in ("gold_family_id", "gold_subfamily_key", "gold_qd") if k in desc})


def load_records(path: Path) -> list[Record]:
    """Benchmark records from .yaml.gz / .yaml (a YAML list) or .json (a list) / .jsonl (one per line)."""
    path = Path(path)
    raw = _load_text(path)
    name = path.name.removesuffix(".gz")
    if name.endswith(".jsonl"):
        items = list(_jsonl(raw, path))
    else:
        doc = _json_doc(raw, path) if name.endswith(".json") else _yaml(raw, path)
        if not isinstance(doc, list):
            raise UpstreamError(f"{path}: expected a list of benchmark records, got {type(doc).__name__}")
        items = [(None, r) for r in doc]
    out, seen = [], {}
    for k, (line, obj) in enumerate(items):
        where = _Where(path, line if line is not None else None, f"#{k}")
        rec = parse_record(obj, where)
        if rec.id in seen:
            raise where.err("instanceId", f"duplicate instance id (first as record #{seen[rec.id]})")
        seen[rec.id] = k
        out.append(rec)
    if not out:
        raise UpstreamError(f"{path}: no benchmark records")
    return out


# ---------------------------------------------------------------- generated IID holdout worlds
@dataclass
class Holdout:
    task_id: str
    requested: int
    worlds: list[World]
    world_ids: list[str]


def load_holdout(path: Path) -> dict[str, Holdout]:
    path = Path(path)
    out: dict[str, Holdout] = {}
    for line_no, obj in _jsonl(_load_text(path), path):
        where = _Where(path, line_no)
        if not isinstance(obj, dict):
            raise where.err("(line)", f"expected a JSON object, got {type(obj).__name__}")
        tid = obj.get("task_id")
        if not isinstance(tid, str) or not tid:
            raise where.err("task_id", f"expected a non-empty string, got {tid!r}")
        where.task = tid
        if tid in out:
            raise where.err("task_id", "duplicate task id")
        worlds = obj.get("worlds")
        if not isinstance(worlds, list):
            raise where.err("worlds", f"expected a list of worlds, got {type(worlds).__name__}")
        for key in ("requested_worlds", "generated_worlds"):
            v = obj.get(key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise where.err(key, f"expected a non-negative integer, got {v!r}")
        if obj["generated_worlds"] != len(worlds):
            raise where.err("generated_worlds", f"{obj['generated_worlds']} but {len(worlds)} worlds are listed")
        parsed = [parse_world(w, where, f"worlds[{k}]", allow_unknown=False) for k, w in enumerate(worlds)]
        out[tid] = Holdout(tid, obj["requested_worlds"], [w for _, w in parsed], [i for i, _ in parsed])
    if not out:
        raise UpstreamError(f"{path}: no holdout entries")
    return out


# ---------------------------------------------------------------- published model reports
@dataclass
class LLMTask:
    task_id: str
    category: str
    correct: bool                    # train-correct on the released task
    evaluable: bool
    correct_ast: int | None
    formula: str | None
    holdout_available: bool
    holdout_correct: bool | None


@dataclass
class LLMReport:
    model: str
    path: str
    tasks: dict[str, LLMTask]


def load_llm_report(path: Path) -> LLMReport:
    path = Path(path)
    doc = _json_doc(_load_text(path), path)
    where = _Where(path)
    if not isinstance(doc, dict):
        raise where.err("(document)", f"expected a JSON object, got {type(doc).__name__}")
    if doc.get("schema_version") != REPORT_SCHEMA:
        raise where.err("schema_version", f"expected {REPORT_SCHEMA!r}, got {doc.get('schema_version')!r}")
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise where.err("model", f"expected a model name, got {model!r}")
    tasks = doc.get("tasks")
    if not isinstance(tasks, list):
        raise where.err("tasks", "expected a list of per-task results")
    out: dict[str, LLMTask] = {}
    for k, t in enumerate(tasks):
        if not isinstance(t, dict):
            raise where.err(f"tasks[{k}]", f"expected an object, got {type(t).__name__}")
        tid = t.get("task_id")
        if not isinstance(tid, str) or not tid:
            raise where.err(f"tasks[{k}].task_id", f"expected a non-empty string, got {tid!r}")
        where.task = tid
        for key in ("correct", "evaluable"):
            if not isinstance(t.get(key), bool):
                raise where.err(f"tasks[{k}].{key}", f"expected true/false, got {t.get(key)!r}")
        ast = t.get("correct_ast")
        if ast is not None and (not isinstance(ast, int) or isinstance(ast, bool) or ast < 0):
            raise where.err(f"tasks[{k}].correct_ast", f"expected a non-negative integer or null, got {ast!r}")
        formula = t.get("formula")
        if formula is not None and not isinstance(formula, str):
            raise where.err(f"tasks[{k}].formula", f"expected a string or null, got {type(formula).__name__}")
        if t["correct"] and formula is None:
            raise where.err(f"tasks[{k}].formula", "a correct task must carry its formula")
        h = t.get("holdout") or {}
        if not isinstance(h, dict) or not isinstance(h.get("available", False), bool):
            raise where.err(f"tasks[{k}].holdout", f"expected {{available, correct, ...}}, got {str(h)[:60]!r}")
        hc = h.get("correct")
        if hc is not None and not isinstance(hc, bool):
            raise where.err(f"tasks[{k}].holdout.correct", f"expected true/false/null, got {hc!r}")
        if tid in out:
            raise where.err(f"tasks[{k}].task_id", "duplicate task id")
        out[tid] = LLMTask(tid, str(t.get("category_or_slice") or family_of(tid)), t["correct"], t["evaluable"],
                           ast, formula, bool(h.get("available", False)), hc)
    return LLMReport(model, str(path), out)


# ---------------------------------------------------------------- published model registry (aggregates)
@dataclass
class RegistryModel:
    id: str
    display_name: str
    evaluable: int                   # benchmarked36: responses that parse
    correct: int                     # benchmarked36: train-correct (of 36)
    correct_ast: list[int]           # AST sizes of the correct formulas
    holdout_evaluable: int
    holdout_correct: int


def load_registry(path: Path, subset: str = "benchmarked36") -> list[RegistryModel]:
    """Per-model aggregates over the `subset` tasks from the public model registry (YAML, aliases refused)."""
    path = Path(path)
    doc = _yaml(_load_text(path), path)
    where = _Where(path)
    if not isinstance(doc, dict) or doc.get("schema_version") != REGISTRY_SCHEMA:
        got = doc.get("schema_version") if isinstance(doc, dict) else type(doc).__name__
        raise where.err("schema_version", f"expected {REGISTRY_SCHEMA!r}, got {got!r}")
    models = doc.get("models")
    if not isinstance(models, list) or not models:
        raise where.err("models", "expected a non-empty list of models")
    out, seen = [], set()

    def count(block: dict, key: str, fld: str) -> int:
        v = block.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= 10_000:
            raise where.err(f"{fld}.{key}", f"expected a count, got {v!r}")
        return v

    for k, mdl in enumerate(models):
        fld = f"models[{k}]"
        if not isinstance(mdl, dict) or not isinstance(mdl.get("id"), str) or not mdl["id"]:
            raise where.err(f"{fld}.id", "expected a model id")
        where.task = mdl["id"]
        if mdl["id"] in seen:
            raise where.err(f"{fld}.id", "duplicate model id")
        seen.add(mdl["id"])
        block = mdl.get(subset)
        if not isinstance(block, dict):
            raise where.err(f"{fld}.{subset}", "expected the subset's aggregate block")
        bf = f"{fld}.{subset}"
        ev, cor = count(block, "evaluable", bf), count(block, "correct", bf)
        hev, hcor = count(block, "holdout_evaluable", bf), count(block, "holdout_correct", bf)
        sizes = block.get("correct_formula_ast_sizes")
        if not isinstance(sizes, list) or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                                                  for v in sizes):
            raise where.err(f"{bf}.correct_formula_ast_sizes", f"expected a list of AST sizes, got {str(sizes)[:60]!r}")
        if len(sizes) != cor or not cor <= ev or not hcor <= hev <= cor:
            raise where.err(bf, f"inconsistent counts (evaluable {ev}, correct {cor}, {len(sizes)} AST sizes, "
                                f"holdout evaluable {hev}, holdout correct {hcor})")
        out.append(RegistryModel(mdl["id"], str(mdl.get("display_name") or mdl["id"]), ev, cor, sizes, hev, hcor))
    return out


# ---------------------------------------------------------------- the vendored folder and its tasks
@dataclass
class Upstream:
    """What is vendored: records (may be empty), holdout worlds, published model reports."""

    dir: Path
    records: list[Record]
    holdout: dict[str, Holdout]
    reports: list[LLMReport]
    files: dict[str, str]            # role -> file name
    registry: list[RegistryModel] = field(default_factory=list)


def load_upstream_dir(path: Path, families: list[str] | None = None) -> Upstream | None:
    """Everything vendored under `path` (None when the folder or its holdout file is absent)."""
    path = Path(path)
    if not path.is_dir():
        return None
    holdouts = sorted(path.glob(HOLDOUT_GLOB))
    registries = sorted(path.glob(REGISTRY_GLOB))
    record_files = sorted({p for g in RECORD_GLOBS for p in path.glob(g)} - set(registries))
    if not holdouts and not record_files:
        return None
    holdout: dict[str, Holdout] = {}
    for p in holdouts:
        for tid, h in load_holdout(p).items():
            if tid in holdout:
                raise UpstreamError(f"{p}: task {tid!r}: field task_id: also in another holdout file")
            holdout[tid] = h
    records = [r for p in record_files for r in load_records(p)]
    reports = [load_llm_report(p) for p in sorted(path.glob(REPORT_GLOB))]
    if families:
        records = [r for r in records if r.family in families]
        holdout = {k: v for k, v in holdout.items() if family_of(k) in families}
    registry = [m for p in registries for m in load_registry(p)]
    files = {"holdout": ", ".join(p.name for p in holdouts), "records": ", ".join(p.name for p in record_files),
             "reports": ", ".join(p.name for p in sorted(path.glob(REPORT_GLOB))),
             "registry": ", ".join(p.name for p in registries)}
    return Upstream(path, records, holdout, reports, files, registry)


@dataclass
class Task:
    """One solver problem built from the upstream release: an Instance plus its held-out worlds."""

    instance: Instance
    task_id: str
    family: str
    fold: int                        # held-out world index (fold mode) or 0 (as released)
    heldout: list[World]
    heldout_index: list[int]         # which released holdout world each held-out world is
    gold: str | None
    mode: str                        # released | holdout_folds


def build_tasks(up: Upstream, train_worlds: int, max_folds: int) -> list[Task]:
    """As released when records are vendored; else leave-one-world-out folds over the holdout worlds."""
    tasks: list[Task] = []
    if up.records:
        for r in up.records:
            h = up.holdout.get(r.id)
            held = list(r.test) + (h.worlds if h else [])
            idx = [-1] * len(r.test) + list(range(len(h.worlds) if h else 0))
            tasks.append(Task(Instance(r.id, r.regime, r.train, r.gold), r.id, r.family, 0, held, idx, r.gold,
                              "released"))
        return tasks
    for tid in sorted(up.holdout):
        worlds = up.holdout[tid].worlds
        if len(worlds) < train_worlds + 1:
            continue
        for j in range(min(max_folds, len(worlds))):
            train = [w for k, w in enumerate(worlds) if k != j][:train_worlds]
            tasks.append(Task(Instance(f"{tid}@f{j}", "fullobs", train, None), tid, family_of(tid), j, [worlds[j]],
                              [j], None, "holdout_folds"))
    return tasks


def formula_stats(text: str | None) -> dict[str, Any]:
    """Upstream-convention AST size and quantifier depth of a formula (None when absent or unparseable)."""
    if not text:
        return {"ast": None, "qd": None, "parse_error": None}
    try:
        f = parse(text)
    except FormulaError as err:
        return {"ast": None, "qd": None, "parse_error": str(err)}
    return {"ast": binary_size(f), "qd": quantifier_depth(f), "parse_error": None}
