"""prepare: procedural CadQuery parts (plates, blocks, cylinders, bosses; holes, steps, slots) built by
running their scripts through the sandboxed interpreter; every face/edge exported (UV grids, curves);
ground-truth operand sets from geometric predicates; NL queries from seen / held-out templates;
description→script pairs whose fillet/chamfer step carries a query; topology-change cases.

Test parts go through a STEP round trip (written to steps/, read back as the grounding CLI reads
them), so their primitive ids are CadQuery's enumeration order of the loaded file.

    python -m stages prepare futurecad [--profile smoke]
"""
from __future__ import annotations

import json

import numpy as np
import polars as pl
import torch
from pydantic import Field, field_validator

from stages.common.config import Seed, Seeds, StageConfig, unique_items
from stages.common.paths import write_json
from stages.common.runner import StageContext
from stages.futurecad import cad

FILLET_SIZES = (0.5, 1.0)


class Config(StageConfig):
    n_train_parts: int = Field(100, ge=4, le=20_000, description="training parts (grounding + SFT/RL programs)")
    n_test_parts: int = Field(30, ge=4, le=5_000, description="held-out parts (through a STEP round trip)")
    split_seed: Seed = 0
    seeds: Seeds = Field(default_factory=lambda: [0, 1, 2], max_length=10, description="run seeds of train/evaluate")
    test_seen_per_target: int = Field(1, ge=1, le=4, description="seen-template queries per test target")
    programs_per_part: int = Field(3, ge=1, le=8, description="description→script pairs per training part")
    n_points: int = Field(256, ge=16, le=8192, description="surface points per target solid (Chamfer)")

    @field_validator("seeds")
    @classmethod
    def _distinct(cls, v):
        return unique_items(v, "seeds")


def oracle_grounder(solid, query: str) -> list[int]:
    """Ground a canonical query (query_selector's text) with the geometric predicate itself."""
    spec = CANON.get(" ".join(query.split()))
    if spec is None:
        raise cad.ScriptError(f"oracle: not a canonical query {query!r}")
    return cad.target_ids(cad.export_primitives(solid), spec)


CANON = {cad.query_text(s, op): s for s in cad.EDGE_SPECS for op in ("fillet", "chamfer")}


def _valid_fillet(base: str, spec, op: str, size: float) -> str | None:
    """The query-carrying script when the oracle-grounded fillet/chamfer executes, else None."""
    script = cad.fillet_script(base, spec, op, size, cad.query_selector(spec, op))
    try:
        cad.run_script(script, oracle_grounder)
    except cad.ScriptError:
        return None
    return script


def prim_tensors(prims: cad.Primitives) -> dict:
    return {"faces": torch.from_numpy(prims.faces), "edges": torch.from_numpy(prims.edges),
            "face_type": torch.tensor([cad.FACE_TYPES.index(t) for t in prims.face_type], dtype=torch.long),
            "edge_type": torch.tensor([cad.EDGE_TYPES.index(t) for t in prims.edge_type], dtype=torch.long)}


def part_queries(prims: cad.Primitives, templates: tuple[str, ...], rng, per_target: int | None) -> list[dict]:
    rows = []
    seen_sets = set()
    for si, spec in enumerate(cad.SPECS):
        ids = cad.target_ids(prims, spec)
        n = len(prims.edge_attr) if spec[0] == "edges" else len(prims.face_attr)
        key = (spec[0], tuple(ids))
        if not ids or len(ids) == n or key in seen_sets:
            continue
        seen_sets.add(key)
        tpls = list(range(len(templates))) if per_target is None else \
            sorted(rng.choice(len(templates), size=min(per_target, len(templates)), replace=False).tolist())
        for ti in tpls:
            op = cad.OPS[spec[0]][int(rng.integers(2))]
            rows.append({"spec": si, "prim": spec[0], "template": ti, "op": op,
                         "query": cad.render_query(templates[ti], spec, op, rng), "target": json.dumps(ids)})
    return rows


def run(cfg: Config, ctx: StageContext) -> None:
    rng = np.random.default_rng(cfg.split_seed)
    steps = ctx.out / "steps"
    steps.mkdir()
    parts, queries, programs, topo, tensors = [], [], [], [], []
    n_total = cfg.n_train_parts + cfg.n_test_parts
    while len(parts) < n_total:
        spec_part = cad.random_part(rng)
        split = "train" if len(parts) < cfg.n_train_parts else "test"
        try:
            solid = cad.run_script(spec_part["script"]).solid
        except cad.ScriptError:
            continue
        pid = len(parts)
        if split == "test":                                  # STEP round trip: ids as the CLI sees them
            path = steps / f"part_{pid:04d}.step"
            cad.write_step(solid, path)
            solid = cad.load_step(path)
        prims = cad.export_primitives(solid)
        tensors.append(prim_tensors(prims))
        parts.append({"part": pid, "split": split, "family": spec_part["family"], "script": spec_part["script"],
                      "description": spec_part["description"], "n_faces": len(prims.face_attr),
                      "n_edges": len(prims.edge_attr)})
        if split == "train":
            for r in part_queries(prims, cad.SEEN_TEMPLATES, rng, None):
                queries.append(dict(r, part=pid, split="train", templates="seen"))
        else:
            for r in part_queries(prims, cad.SEEN_TEMPLATES, rng, cfg.test_seen_per_target):
                queries.append(dict(r, part=pid, split="test", templates="seen"))
            for r in part_queries(prims, cad.HELDOUT_TEMPLATES, rng, None):
                queries.append(dict(r, part=pid, split="test", templates="heldout"))

        # program: description -> script with one query-carrying fillet/chamfer step (valid under the oracle)
        order = rng.permutation(len(cad.EDGE_SPECS))
        n_prog = cfg.programs_per_part if split == "train" else 1
        for k in order:
            if n_prog == 0:
                break
            spec = cad.EDGE_SPECS[int(k)]
            op = ("fillet", "chamfer")[int(rng.integers(2))]
            size = FILLET_SIZES[int(rng.integers(len(FILLET_SIZES)))]
            script = _valid_fillet(spec_part["script"], spec, op, size)
            if script is None:
                continue
            desc = f"{spec_part['description']} ; {cad.query_text(spec, op)} size {cad._fmt(size)}"
            target = cad.run_script(script, oracle_grounder).solid
            programs.append({"part": pid, "split": split, "description": desc, "script": script,
                             "diag": cad.diag_of(target), "volume": float(target.Volume())})
            n_prog -= 1

        # topology change: indices recorded on the design before its last feature, replayed after it
        if split == "test":
            original = spec_part["base"] + "".join(spec_part["segments"][:-1])
            before = cad.export_primitives(cad.run_script(original).solid)
            after = cad.export_primitives(cad.run_script(spec_part["script"]).solid)
            for k in order:
                spec = cad.EDGE_SPECS[int(k)]
                ids_before, ids_after = cad.target_ids(before, spec), cad.target_ids(after, spec)
                if not ids_before or not ids_after:
                    continue
                if _valid_fillet(spec_part["script"], spec, "fillet", 0.5) is None:
                    continue
                topo.append({"part": pid, "edited_script": spec_part["script"], "original_script": original,
                             "spec": cad.EDGE_SPECS.index(spec), "ids_original": json.dumps(ids_before),
                             "ids_edited": json.dumps(ids_after),
                             "query": cad.query_text(spec, "fillet"), "inserted": spec_part["features"][-1]})
                break

    pl.DataFrame(parts).write_parquet(ctx.out / "parts.parquet")
    pl.DataFrame(queries).write_parquet(ctx.out / "queries.parquet")
    pl.DataFrame(programs).write_parquet(ctx.out / "programs.parquet")
    pl.DataFrame(topo, schema={"part": pl.Int64, "edited_script": pl.Utf8, "original_script": pl.Utf8,
                               "spec": pl.Int64, "ids_original": pl.Utf8, "ids_edited": pl.Utf8,
                               "query": pl.Utf8, "inserted": pl.Utf8}).write_parquet(ctx.out / "topology.parquet")
    torch.save(tensors, ctx.out / "primitives.pt")
    q = pl.DataFrame(queries)
    write_json(ctx.out / "meta.json", {
        "seeds": list(cfg.seeds), "n_points": cfg.n_points, "n_parts": len(parts),
        "n_queries": {f"{s}/{t}": int(q.filter((pl.col("split") == s) & (pl.col("templates") == t)).height)
                      for s, t in (("train", "seen"), ("test", "seen"), ("test", "heldout"))},
        "n_programs": {s: int(sum(p["split"] == s for p in programs)) for s in ("train", "test")},
        "n_topology": len(topo), "families": {f: sum(p["family"] == f for p in parts) for f in cad.FAMILIES},
        "seen_templates": list(cad.SEEN_TEMPLATES), "heldout_templates": list(cad.HELDOUT_TEMPLATES)})
