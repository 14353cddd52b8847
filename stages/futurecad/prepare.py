"""prepare: procedural CadQuery parts (plates, blocks, cylinders, bosses; holes, steps, slots) built by
running their scripts through the sandboxed interpreter; every face/edge exported (UV grids, curves);
ground-truth operand sets from geometric predicates; NL queries; description→script programs whose
fillet/chamfer step carries a query; topology-change cases; the external STEP parts.

Splits of the parts: ``train`` (grounder training; their programs split into SFT programs and RL prompts —
RL never sees an SFT prompt), ``val`` (grounding learning curve and abstention calibration, the program arms'
validation prompts; stratified over the generator's (family, feature mix) strata, ``cad.STRATA``, so that the
early stopping and the development sweeps see every kind of part the test set can hold), ``test`` (every reported number; through a STEP round trip so that primitive ids are CadQuery's
enumeration order of the loaded file, as the CLI sees them).

Queries (column ``templates``): ``seen`` / ``heldout`` templates with per-word paraphrases, ``freetext``
(``freetext.FREE_TEXT``, written independently of the templates; test only), and queries whose right answer
is "no such feature" (empty target): ``absent`` (a spec the part does not have), ``foreign`` (a feature
type no part has: ``freetext.TRAIN_FOREIGN`` in training, ``TEST_FOREIGN`` in test), ``nonsense``
(random letter strings and salads of template frame words; plus ``TEST_NONSENSE`` in test).

    python -m stages prepare futurecad [--profile smoke]
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import polars as pl
import torch
from pydantic import Field, field_validator, model_validator

from stages.common.config import Seed, Seeds, StageConfig, unique_items
from stages.common.paths import write_json
from stages.common.runner import StageContext
from stages.futurecad import cad, cputime, freetext, isolate

FILLET_SIZES = (0.5, 1.0)
REPO = Path(__file__).resolve().parents[2]          # step_dir is relative to the code (the fixture ships in it)
FRAME_WORDS = ("the", "every", "located", "at", "on", "that", "are", "them", "please", "all", "there", ",", ";", ":",
               "fillet", "chamfer", "select", "shell")


class Config(StageConfig):
    n_train_parts: int = Field(100, ge=4, le=20_000, description="training parts (grounding; SFT/RL programs)")
    n_val_parts: int = Field(15, ge=1, le=5_000, description=(
        "validation parts (learning curves, calibration, the program arms' early stopping), stratified: drawn in "
        "turn for each (family, feature mix) stratum of the generator (cad.STRATA, 15), so that at least 15 "
        "parts cover every stratum the test parts can come from"))
    n_test_parts: int = Field(30, ge=2, le=5_000, description="held-out parts (through a STEP round trip)")
    rl_frac: float = Field(0.4, gt=0, lt=1, description="share of training parts whose programs are RL prompts "
                                                           "(the rest are SFT programs; disjoint parts)")
    split_seed: Seed = 0
    seeds: Seeds = Field(default_factory=lambda: [0, 1, 2, 3, 4], max_length=10,
                         description="run seeds of train/evaluate")
    test_seen_per_target: int = Field(1, ge=1, le=6, description="seen-template queries per test target")
    absent_per_part: int = Field(6, ge=0, le=40, description="absent-feature queries per train/val part")
    foreign_per_part: int = Field(2, ge=0, le=20, description="foreign-feature queries per train/val part")
    nonsense_per_part: int = Field(3, ge=0, le=20, description="nonsense queries per train/val part")
    test_foreign_per_part: int = Field(3, ge=0, le=10, description="TEST_FOREIGN queries per test part")
    test_nonsense: int = Field(40, ge=0, le=2000, description="generated nonsense test queries (+ the hand list)")
    programs_per_part: int = Field(3, ge=1, le=8, description="description→script pairs per train/val part")
    test_programs_per_part: int = Field(2, ge=1, le=8, description="description→script pairs per test part")
    topology_per_part: int = Field(4, ge=1, le=13, description="topology-change cases per test part (at most)")
    n_points: int = Field(256, ge=16, le=8192, description="surface points per target solid (Chamfer)")
    step_dir: str = Field("stages/futurecad/step_parts", min_length=1, max_length=4096,
                          description="external STEP parts + queries.jsonl (BRepGround row schema), relative "
                                      "to the repo root or absolute; `full` names a real converted corpus")

    @field_validator("seeds")
    @classmethod
    def _distinct(cls, v):
        return unique_items(v, "seeds")

    @model_validator(mode="after")
    def _parts(self):
        n_rl = round(self.n_train_parts * self.rl_frac)
        if n_rl < 1 or n_rl >= self.n_train_parts:
            raise ValueError(f"rl_frac: {self.rl_frac} leaves no RL or no SFT part of {self.n_train_parts}")
        return self


def oracle_grounder(solid, query: str) -> list[int]:
    """Ground a canonical query (query_selector's text) with the geometric predicate itself."""
    spec = CANON.get(" ".join(query.split()))
    if spec is None:
        raise cad.ScriptError(f"oracle: not a canonical query {query!r}")
    return cad.target_ids(cad.export_cached(solid), spec)


CANON = {cad.query_text(s, op): s for s in cad.EDGE_SPECS for op in ("fillet", "chamfer")}


def _valid_fillet(base: str, spec, op: str, size: float, cache: dict | None = None):
    """(script, solid) of the query-carrying script when the oracle-grounded fillet/chamfer executes."""
    script = cad.fillet_script(base, spec, op, size, cad.query_selector(spec, op))
    try:
        return script, cad.run_script(script, oracle_grounder, cache=cache).solid
    except cad.ScriptError:
        return None, None


def prim_tensors(prims: cad.Primitives) -> dict:
    return {"faces": torch.from_numpy(prims.faces), "edges": torch.from_numpy(prims.edges),
            "face_type": torch.tensor([cad.FACE_TYPES.index(t) for t in prims.face_type], dtype=torch.long),
            "edge_type": torch.tensor([cad.EDGE_TYPES.index(t) for t in prims.edge_type], dtype=torch.long)}


def _row(spec_i, prim, templates, query, ids, template=-1, op="", size_matters=False) -> dict:
    return {"spec": spec_i, "prim": prim, "templates": templates, "template": template, "op": op, "query": query,
            "target": json.dumps(ids), "size_matters": size_matters}


def part_queries(prims: cad.Primitives, templates: tuple[str, ...], rng, per_target: int | None,
                 kind: str = "seen") -> list[dict]:
    """Queries for every spec present on the part (non-empty, not every primitive). Unqualified specs with
    the same set as an earlier one are skipped; superlatives are always kept (ties: the whole set)."""
    rows = []
    seen_sets = set()
    for si, spec in enumerate(cad.SPECS):
        ids = cad.target_ids(prims, spec)
        n = len(prims.edge_attr) if spec[0] == "edges" else len(prims.face_attr)
        key = (spec[0], tuple(ids))
        if not ids or len(ids) == n or (not spec[3] and key in seen_sets):
            continue
        seen_sets.add(key)
        tpls = list(range(len(templates))) if per_target is None else \
            sorted(rng.choice(len(templates), size=min(per_target, len(templates)), replace=False).tolist())
        for ti in tpls:
            op = cad.OPS[spec[0]][int(rng.integers(2))]
            rows.append(_row(si, spec[0], kind, cad.render_query(templates[ti], spec, op, rng), ids, ti, op,
                             cad.size_matters(prims, spec)))
    return rows


def absent_queries(prims: cad.Primitives, rng, k: int) -> list[dict]:
    """Up to k queries (seen templates) for specs this part does not have: the right answer is no match."""
    absent = [si for si, s in enumerate(cad.SPECS) if not cad.target_ids(prims, s)]
    rows = []
    for si in rng.permutation(absent)[:k].tolist() if absent else []:
        spec = cad.SPECS[si]
        ti = int(rng.integers(len(cad.SEEN_TEMPLATES)))
        op = cad.OPS[spec[0]][int(rng.integers(2))]
        rows.append(_row(si, spec[0], "absent", cad.render_query(cad.SEEN_TEMPLATES[ti], spec, op, rng), [], ti, op))
    return rows


def nonsense_query(rng) -> str:
    """Random letter strings, a salad of template frame words (no type/place word), or a mix."""
    kind = int(rng.integers(3))
    n = int(rng.integers(2, 7))
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = []
    for _ in range(n):
        if kind == 0 or (kind == 2 and rng.random() < 0.5):
            words.append("".join(letters[int(i)] for i in rng.integers(0, 26, int(rng.integers(3, 9)))))
        else:
            words.append(FRAME_WORDS[int(rng.integers(len(FRAME_WORDS)))])
    return " ".join(words)


def _programs(part: dict, split: str, role: str, rng, n_prog: int, n_points: int, cache: dict) -> tuple[list, list]:
    progs, tgts = [], []
    for k in rng.permutation(len(cad.EDGE_SPECS)):
        if n_prog == 0:
            break
        spec = cad.EDGE_SPECS[int(k)]
        op = ("fillet", "chamfer")[int(rng.integers(2))]
        size = FILLET_SIZES[int(rng.integers(len(FILLET_SIZES)))]
        script, target = _valid_fillet(part["script"], spec, op, size, cache)
        if script is None:
            continue
        desc = f"{part['description']} ; {cad.query_text(spec, op)} size {cad._fmt(size)}"
        diag = cad.diag_of(target)
        progs.append({"part": part["part"], "split": split, "role": role, "description": desc, "script": script,
                      "diag": diag, "volume": float(target.Volume())})
        buf = io.BytesIO()
        target.exportBrep(buf)
        brep = buf.getvalue() if split == "test" else b""
        tgts.append({"points": torch.from_numpy(cad.surface_points(target, n_points, diag=diag)),
                     "brep": torch.frombuffer(bytearray(brep), dtype=torch.uint8) if brep else torch.zeros(0, dtype=torch.uint8)})
        n_prog -= 1
    return progs, tgts


def _topology(part: dict, rng, cap: int, cache: dict) -> list[dict]:
    """Operands recorded by index on the design before its last feature, replayed after it. same_set: the
    edited design's target edges are geometrically the recorded ones (only the numbering may change)."""
    original = part["base"] + "".join(part["segments"][:-1])
    before = cad.export_primitives(cad.run_script(original).solid)
    after = cad.export_primitives(cad.run_script(part["script"], cache=cache).solid)
    out = []
    for k in rng.permutation(len(cad.EDGE_SPECS)):
        spec = cad.EDGE_SPECS[int(k)]
        ids_before, ids_after = cad.target_ids(before, spec), cad.target_ids(after, spec)
        if not ids_before or not ids_after:
            continue
        if _valid_fillet(part["script"], spec, "fillet", 0.5, cache)[0] is None:
            continue
        out.append({"part": part["part"], "edited_script": part["script"], "original_script": original,
                    "spec": int(k), "ids_original": json.dumps(ids_before), "ids_edited": json.dumps(ids_after),
                    "query": cad.query_text(spec, "fillet"), "inserted": part["features"][-1],
                    "same_set": cad.match_edges(before, after, ids_before, ids_after),
                    "renumbered": ids_before != ids_after})
        if len(out) == cap:
            break
    return out


def external_rows(step_dir: Path) -> tuple[list[dict], list[dict], list[str]]:
    """The external STEP parts: (query rows, primitive tensors per part, STEP file names)."""
    rows, tensors, names = [], [], []
    for r in cad.load_step_dir(step_dir):
        if r["step"] not in names:
            names.append(r["step"])
            tensors.append(prim_tensors(r["prims"]))
        f = [i for i, v in enumerate(r["face_labels"]) if v]
        e = [i for i, v in enumerate(r["edge_labels"]) if v]
        if f and e:
            raise cad.StepError(f"{step_dir}: row {r['id']} labels faces and edges at once (not supported)")
        prim = "faces" if f else "edges"
        for q in r["queries"]:
            rows.append({"id": r["id"], "ext_part": names.index(r["step"]), "step": r["step"], "prim": prim,
                         "query": q, "target": json.dumps(f or e),
                         "templates": "external" if (f or e) else "external_absent"})
    return rows, tensors, names


def _build_part(cfg: Config, part: dict, pid: int, split: str, role: str, rng, steps: Path):
    """One part's CAD work and its draws from ``rng``: (exported primitives, part row, query rows, programs,
    program targets, topology cases), or None when the kernel refuses the part's script. Returns the rng state
    with it (it runs in prepare's worker process: isolate.Isolated)."""
    cache: dict = {}                                     # this part's workplane and groundings
    try:
        solid = cad.run_script(part["script"], cache=cache).solid
    except cad.ScriptError:
        return None, rng.bit_generator.state
    part["part"] = pid
    if split == "test":                                  # STEP round trip: ids as the CLI sees them
        path = steps / f"part_{pid:04d}.step"
        cad.write_step(solid, path)
        solid = cad.load_step(path)
    prims = cad.export_primitives(solid)
    row = {"part": pid, "split": split, "role": role, "family": part["family"],
           "features": "+".join(part["features"]), "script": part["script"],
           "description": part["description"], "n_faces": len(prims.face_attr), "n_edges": len(prims.edge_attr)}
    rows: list[dict] = []
    if split != "test":
        rows += part_queries(prims, cad.SEEN_TEMPLATES, rng, None if split == "train" else 2)
        rows += absent_queries(prims, rng, cfg.absent_per_part)
        for q in rng.choice(freetext.TRAIN_FOREIGN, size=cfg.foreign_per_part, replace=False).tolist():
            rows.append(_row(-1, "edges", "foreign", q, []))
        rows += [_row(-1, "edges", "nonsense", nonsense_query(rng), []) for _ in range(cfg.nonsense_per_part)]
    else:
        rows += part_queries(prims, cad.SEEN_TEMPLATES, rng, cfg.test_seen_per_target)
        rows += part_queries(prims, cad.HELDOUT_TEMPLATES, rng, None, kind="heldout")
        rows += absent_queries(prims, rng, cfg.absent_per_part)
        for q, spec in freetext.FREE_TEXT:                  # written independently of the templates
            ids = cad.target_ids(prims, spec)
            n = len(prims.edge_attr) if spec[0] == "edges" else len(prims.face_attr)
            if len(ids) < n:
                rows.append(_row(cad.SPECS.index(spec), spec[0], "freetext" if ids else "absent_freetext", q,
                                 ids, size_matters=cad.size_matters(prims, spec)))
        for q in rng.choice(freetext.TEST_FOREIGN, size=cfg.test_foreign_per_part, replace=False).tolist():
            rows.append(_row(-1, "edges", "foreign", q, []))
    rows = [dict(r, part=pid, split=split) for r in rows]
    n_prog = cfg.test_programs_per_part if split == "test" else cfg.programs_per_part
    progs, tgts = _programs(part, split, role, rng, n_prog, cfg.n_points, cache)
    topo = _topology(part, rng, cfg.topology_per_part, cache) if split == "test" else []
    return (prims, row, rows, progs, tgts, topo), rng.bit_generator.state


def val_quota(n_val: int) -> dict:
    """Parts per (family, feature mix) stratum of the validation split: cad.STRATA in turn, n_val in all."""
    quota = {s: 0 for s in cad.STRATA}
    for i in range(n_val):
        quota[cad.STRATA[i % len(cad.STRATA)]] += 1
    return quota


MAX_VAL_DRAWS_PER_PART = 500     # a stratum whose parts the kernel always refuses must stop prepare, not hang it


def run(cfg: Config, ctx: StageContext) -> None:
    rng = np.random.default_rng(cfg.split_seed)
    quota = val_quota(cfg.n_val_parts)
    val_draws = 0
    steps = ctx.out / "steps"
    steps.mkdir()
    parts, queries, programs, targets, topo, tensors = [], [], [], [], [], []
    n_rl = round(cfg.n_train_parts * cfg.rl_frac)
    n_total = cfg.n_train_parts + cfg.n_val_parts + cfg.n_test_parts
    crashed = []                                             # parts whose CAD work crashed the kernel
    with isolate.Isolated() as worker:                       # the CAD work in a worker process (isolate.py)
        while len(parts) < n_total:
            part = cad.random_part(rng)
            pid = len(parts)
            split = ("train" if pid < cfg.n_train_parts else "val" if pid < cfg.n_train_parts + cfg.n_val_parts
                     else "test")
            role = {"train": "rl" if pid >= cfg.n_train_parts - n_rl else "sft", "val": "val", "test": "test"}[split]
            if split == "val":   # stratified: a draw from a stratum already filled is drawn again
                val_draws += 1
                if val_draws > MAX_VAL_DRAWS_PER_PART * cfg.n_val_parts:
                    missing = [cad.stratum_name(s) for s, n in quota.items() if n]
                    raise RuntimeError(f"n_val_parts: no buildable part of stratum {missing} after {val_draws - 1} "
                                       "draws (the CAD kernel refused them all)")
                if not quota[cad.stratum(part)]:
                    continue
            try:                 # a native crash of the CAD kernel skips the part, like a script it refuses
                built, state = worker.call(_build_part, cfg, part, pid, split, role, rng, steps)
            except isolate.ChildCrashed as err:
                crashed.append({"script": part["script"], "error": str(err)})
                continue                                     # rng stays after random_part, as for a refusal
            rng.bit_generator.state = state                  # the worker's draws, carried on here
            if built is None:
                continue
            prims, row, rows, progs, tgts, tp = built
            if split == "val":
                quota[cad.stratum(part)] -= 1
            tensors.append(prim_tensors(prims))
            parts.append(row)
            queries += rows
            programs += progs
            targets += tgts
            topo += tp
    # test nonsense: the hand list and generated strings, each on a random test part
    test_pids = [p["part"] for p in parts if p["split"] == "test"]
    nrng = np.random.default_rng([cfg.split_seed, 1])
    for q in freetext.TEST_NONSENSE + [nonsense_query(nrng) for _ in range(cfg.test_nonsense)]:
        queries.append(dict(_row(-1, "edges", "nonsense", q, []), part=int(nrng.choice(test_pids)), split="test"))

    # external STEP parts (the real-format loader; the fixture set at default)
    step_dir = Path(cfg.step_dir) if Path(cfg.step_dir).is_absolute() else REPO / cfg.step_dir
    ext_rows, ext_tensors, ext_names = external_rows(step_dir)

    pl.DataFrame(parts).write_parquet(ctx.out / "parts.parquet")
    pl.DataFrame(queries).write_parquet(ctx.out / "queries.parquet")
    pl.DataFrame(programs).write_parquet(ctx.out / "programs.parquet")
    pl.DataFrame(topo, schema={"part": pl.Int64, "edited_script": pl.Utf8, "original_script": pl.Utf8,
                               "spec": pl.Int64, "ids_original": pl.Utf8, "ids_edited": pl.Utf8,
                               "query": pl.Utf8, "inserted": pl.Utf8, "same_set": pl.Boolean,
                               "renumbered": pl.Boolean}).write_parquet(ctx.out / "topology.parquet")
    pl.DataFrame(ext_rows).write_parquet(ctx.out / "external.parquet")
    torch.save(tensors, ctx.out / "primitives.pt")
    torch.save(ext_tensors, ctx.out / "external_primitives.pt")
    torch.save({"points": torch.stack([t["points"] for t in targets]), "brep": [t["brep"] for t in targets]},
               ctx.out / "program_targets.pt")
    q = pl.DataFrame(queries)
    tp = pl.DataFrame(topo) if topo else None
    write_json(ctx.out / "meta.json", {
        "seeds": list(cfg.seeds), "n_points": cfg.n_points, "n_parts": len(parts),
        "n_parts_split": {s: sum(p["split"] == s for p in parts) for s in ("train", "val", "test")},
        "n_queries": {f"{s}/{t}": int(n) for s, t, n in
                      q.group_by("split", "templates").len().sort("split", "templates").iter_rows()},
        "n_programs": {r: int(sum(p["role"] == r for p in programs)) for r in ("sft", "rl", "val", "test")},
        "n_topology": len(topo),
        "n_topology_same_set": int(tp["same_set"].sum()) if tp is not None else 0,
        "n_topology_renumbered": int((tp["same_set"] & tp["renumbered"]).sum()) if tp is not None else 0,
        "families": {f: sum(p["family"] == f for p in parts) for f in cad.FAMILIES},
        "strata": {sp: {cad.stratum_name(st): sum(p["split"] == sp and (p["family"], p["features"]) ==
                                                  (st[0], "+".join(st[1])) for p in parts) for st in cad.STRATA}
                   for sp in ("train", "val", "test")},
        "external": {"step_dir": cfg.step_dir, "parts": ext_names, "n_queries": len(ext_rows)},
        "seen_templates": list(cad.SEEN_TEMPLATES), "heldout_templates": list(cad.HELDOUT_TEMPLATES),
        **({"parts_skipped_kernel_crash": crashed} if crashed else {})})   # only when a part crashed the kernel
    cputime.record(ctx)
