"""futurecad: the sandboxed interpreter (whitelist, no exec, analytic volumes), primitive export against
CadQuery's own selectors, the topology-change effect (index replay breaks, query predicate does not),
the reward (0 for failures, 1 for the target itself), BRepGround-mini learning at tiny scale, the smoke
pipeline end to end with the fixed CLI on a hand-made STEP part, and bad-input errors."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import polars as pl
import pytest
import torch

from kernels.record import KernelRecord
from stages.common.config import ConfigError
from stages.futurecad import cad
from stages.futurecad.infer import ProgramScorer, query_tensors
from stages.futurecad.lit import GroundModule
from stages.futurecad.model import (BRepGround, GroundLoader, build_vocab, keyword_rule, label_matrix, pad_parts,
                                    predict, set_metrics, type_only)
from stages.futurecad.prepare import oracle_grounder, part_queries, prim_tensors
from stages.futurecad.sandbox import CadSandbox

BOX_HOLE = 'cq.Workplane("XY").box(40, 30, 8).faces(">Z").workplane().center(7, 0).hole(6)'


# ---------------------------------------------------------------------------- interpreter
def test_interpreter_volume_matches_analytic():
    solid = cad.run_script(BOX_HOLE).solid
    assert math.isclose(solid.Volume(), 40 * 30 * 8 - math.pi * 3 ** 2 * 8, rel_tol=1e-6)
    cyl = cad.run_script('cq.Workplane("XY").circle(5).extrude(7.5)').solid
    assert math.isclose(cyl.Volume(), math.pi * 25 * 7.5, rel_tol=1e-6)
    # the whitespace-joined token form (what the program model emits) parses to the same calls
    assert cad.parse_script(cad.detokenize_script(cad.script_tokens(BOX_HOLE))) == cad.parse_script(BOX_HOLE)


@pytest.mark.parametrize("text,msg", [
    ('__import__("os").system("true")', "whitelist"),
    ('cq.Workplane("XY").box(1, 2, 3).exportStep("x")', "whitelist"),
    ('os.Workplane("XY")', "whitelist"),
    ('cq.Workplane("XY").box(1, 2, h=3)', "keywords"),
    ('cq.Workplane("XY").box(1, 2, 3).edges(Query("  ")).fillet(1)', "empty query"),
    ('cq.Workplane("XY").box(1, 2, 3).edges(Index(99)).fillet(0.1)', "out of range"),
    ('cq.Workplane("XY").box(4, 4, 4).edges(Index(0)).fillet(9)', "CAD kernel"),
    ('cq.Workplane("XY").box(1, 2, 3).faces(">X")', "selector"),
    ('cq.Workplane("XY").box(1, 2, (3).__class__)', "number"),
    ('cq.Workplane("XY").box(1, 2', "syntax"),
    ("", "empty"),
])
def test_interpreter_rejects(text, msg):
    with pytest.raises(cad.ScriptError, match=msg):
        cad.run_script(text, oracle_grounder)


# ---------------------------------------------------------------------------- export and targets
def test_export_against_cadquery_selectors():
    import cadquery as cq

    wp = cq.Workplane("XY").box(40, 30, 8).faces(">Z").workplane().center(7, 0).hole(6)
    solid = wp.val()
    prims = cad.export_primitives(solid)
    assert len(prims.face_attr) == len(solid.Faces()) and len(prims.edge_attr) == len(solid.Edges())
    edges = solid.Edges()
    vertical = {i for i, e in enumerate(edges) if any(e.isSame(x) for x in wp.edges("|Z").vals())}
    seam = {i for i in vertical if prims.edge_type[i] == "LINE" and not prims.edge_attr[i]["outer"]}
    assert set(cad.target_ids(prims, ("edges", "vertical straight", "sides", ""))) == vertical - seam
    assert len(vertical - seam) == 4
    top_face = {i for i, f in enumerate(solid.Faces()) if f.isSame(wp.faces(">Z").val())}
    assert set(cad.target_ids(prims, ("faces", "planar", "top", ""))) == top_face
    circ_top = {i for i, e in enumerate(edges) if any(e.isSame(x) for x in wp.faces(">Z").edges("%CIRCLE").vals())}
    assert set(cad.target_ids(prims, ("edges", "circular", "top", ""))) == circ_top and len(circ_top) == 1
    # UV-grid normals of the top face point up; a vertical edge's tangent is ±z; points lie in [-1, 1]
    (ti,) = top_face
    g = prims.faces[ti]
    assert np.allclose(g[g[:, 6] > 0.5, 3:6], [0, 0, 1], atol=1e-6)
    (vi, *_) = sorted(vertical - seam)
    assert np.allclose(np.abs(prims.edges[vi][:, 5]), 1, atol=1e-6)
    assert np.abs(prims.faces[..., :3]).max() <= 1 + 1e-6 and np.abs(prims.edges[..., :3]).max() <= 1 + 1e-6


def test_topology_change_breaks_index_not_query():
    """Core effect: an earlier feature renumbers edges; ids recorded before it select the wrong edges."""
    before = cad.export_primitives(cad.run_script('cq.Workplane("XY").box(40, 30, 8)').solid)
    after = cad.export_primitives(cad.run_script(BOX_HOLE).solid)
    spec = ("edges", "straight", "bottom", "")
    ids_before, ids_after = cad.target_ids(before, spec), cad.target_ids(after, spec)
    assert len(ids_before) == len(ids_after) == 4
    assert ids_before != ids_after                                   # index replay picks other edges
    q = cad.query_text(spec, "fillet")
    idx = cad.run_script(BOX_HOLE + f".edges({cad.index_selector(ids_before)}).fillet(1)", record=True)
    qry = cad.run_script(BOX_HOLE + f'.edges(Query("{q}")).fillet(1)', oracle_grounder, record=True)
    assert qry.selections[0]["ids"] == ids_after
    assert idx.selections[0]["ids"] != ids_after
    assert not math.isclose(idx.solid.Volume(), qry.solid.Volume(), rel_tol=1e-6)


def test_queries_and_baselines():
    prims = cad.export_primitives(cad.run_script(
        'cq.Workplane("XY").box(40, 30, 10).faces(">Z").workplane().circle(5).extrude(4)'
        '.faces(">Z").workplane().hole(4)').solid)
    rng = np.random.default_rng(3)
    rows = part_queries(prims, cad.SEEN_TEMPLATES, rng, None)
    assert rows and all(r["query"] and "{" not in r["query"] for r in rows)
    # canonical words: the keyword rule recovers the predicate's set; the type-only selector over-selects
    spec = ("edges", "circular", "top", "")
    q = cad.render_query(cad.SEEN_TEMPLATES[0], spec, "fillet")
    truth = set(cad.target_ids(prims, spec))
    assert set(keyword_rule(q, prims)[1]) == truth
    assert set(type_only(q, prims)[1]) > truth
    assert set_metrics({1, 2}, {2, 3}) == (0.0, 0.5)
    # paraphrases the rule was not written for still give a (possibly wrong) selection, never an error
    for spec in cad.SPECS:
        for t in cad.SEEN_TEMPLATES + cad.HELDOUT_TEMPLATES:
            q = cad.render_query(t, spec, cad.OPS[spec[0]][0], rng)
            for fn in (keyword_rule, type_only):
                prim, ids = fn(q, prims)
                assert prim in ("edges", "faces") and all(isinstance(i, int) for i in ids)


# ---------------------------------------------------------------------------- reward and sandbox
def test_reward_and_sandbox_crash():
    """Reward: 0 for failures, 1 for the target itself, in between for a wrong part; a native crash of the CAD
    kernel (a worker killed mid-script) kills only that worker: a recorded failure, the next script runs."""
    target = cad.run_script(BOX_HOLE).solid
    pts = torch.from_numpy(cad.surface_points(target, 96))[None]
    with CadSandbox(96, workers=1) as sb:
        sb.set_grounder(("oracle",))
        scorer = ProgramScorer(sb, pts, [cad.diag_of(target)], KernelRecord("cpu"), torch.device("cpu"))
        s = scorer.score([BOX_HOLE, BOX_HOLE + '.shell(1)', "import os", BOX_HOLE.replace("hole(6)", "hole(12)")],
                         [0, 0, 0, 0])
        r, ncd = s["reward"], s["ncd"]
        assert float(r[0]) == pytest.approx(1.0, abs=1e-6) and float(ncd[0]) == pytest.approx(0.0, abs=1e-6)
        assert float(r[1]) == 0.0 and float(r[2]) == 0.0 and float(ncd[1]) == 1.0 and s["exec"].tolist() == [1, 0, 0, 1]
        assert 0.0 < float(r[3]) < 1.0
        assert "whitelist" in s["errors"][1] and sb.executed == 2      # parse errors never reach a worker
        # a query-carrying script through the oracle grounder executes (the chamfer changes the volume)
        q = BOX_HOLE + '.edges(Query("fillet the circular edges on the top")).chamfer(1)'
        assert scorer.score([q], [0])["exec"].tolist() == [1.0]
        sb.set_grounder(("callable", "tests.futurecad.test_futurecad:_crash_on_box13"))
        crash = 'cq.Workplane("XY").box(13, 3, 3).edges(Query("x")).fillet(1)'
        s = scorer.score([crash, BOX_HOLE], [0, 0])
        assert s["reward"][0] == 0.0 and float(s["reward"][1]) == pytest.approx(1.0, abs=1e-6)
        assert sb.crashes == 1 and "crashed" in s["errors"][0]


def test_sandbox_prefetch_equals_run_many_and_guards_its_thread():
    """prefetch(): the same results as run_many on a fresh sandbox, each distinct script executed once, the later
    run_many answered from the cache; the sandbox refuses other calls until wait(); a script error reaches wait()
    as a failed script, not an exception; close() during a prefetch stops it without respawning workers."""
    import io

    buf = io.BytesIO()
    cad.run_script(BOX_HOLE).solid.exportBrep(buf)
    texts = [BOX_HOLE, BOX_HOLE.replace("hole(6)", "hole(9)"), "import os", BOX_HOLE,
             BOX_HOLE + '.edges(Query("fillet the circular edges on the top")).chamfer(1)', BOX_HOLE]
    breps = [None, None, None, None, None, buf.getvalue()]               # the last one also scores IoU
    with CadSandbox(64, workers=2) as ref:
        ref.set_grounder(("oracle",))
        want = ref.run_many(texts, breps)
    with CadSandbox(64, workers=2) as sb:
        sb.set_grounder(("oracle",))
        pending = sb.prefetch(texts, breps)
        for call in (lambda: sb.run_many(texts), lambda: sb.set_grounder(("oracle",)), lambda: sb.prefetch(texts)):
            with pytest.raises(RuntimeError, match="prefetch is running"):
                call()
        pending.wait()
        assert sb.executed == 4 and sb.requested == 0           # BOX_HOLE twice; "import os" refused unexecuted
        got = sb.run_many(texts, breps)
        assert sb.executed == 4 and sb.requested == len(texts)          # all from the cache
    for a, b in zip(want, got):
        assert a["ok"] == b["ok"] and a["error"] == b["error"]
        if a["ok"]:
            assert np.array_equal(a["points"], b["points"]) and a["iou"] == b["iou"]
    assert [r["ok"] for r in got] == [True, True, False, True, True, True]
    assert got[0]["iou"] is None and got[5]["iou"] == pytest.approx(1.0, abs=1e-9)
    sb = CadSandbox(64, workers=1)
    sb.set_grounder(("oracle",))
    pending = sb.prefetch([BOX_HOLE.replace("hole(6)", f"hole({2 + d / 8})") for d in range(40)])
    sb.close()
    with pytest.raises(RuntimeError, match="prefetch failed"):
        pending.wait()
    assert sb.workers == [None] and sb.pids() == []                    # nothing respawned after close()


def _crash_on_box13(solid, query):
    """A grounder that kills its process (what a native segfault looks like to the parent)."""
    import os

    os._exit(139)


def test_fast_cad_paths_equal_cadquery():
    """The fast tessellation equals CadQuery's, the cheaper newObject gives the same solids, and the prefix cache
    gives the same results in any order without leaking one script's pending wires into another."""
    import cadquery as cq

    solid = cad.run_script(BOX_HOLE + '.faces(">Z").workplane().center(-12, 0).slot2D(8, 4).cutBlind(-3)').solid
    V, T = cad.tessellate(solid, 0.2, 0.3)
    verts, tris = solid.tessellate(0.2, 0.3)
    assert np.array_equal(V, np.array([[v.x, v.y, v.z] for v in verts])) and np.array_equal(T, np.array(tris))
    ref = cq.Workplane("XY").box(40, 30, 8).faces(">Z").workplane().center(7, 0).hole(6).val()
    assert math.isclose(cad.run_script(BOX_HOLE).solid.Volume(), ref.Volume(), rel_tol=1e-12)
    q = 'fillet the circular edges on the top'
    scripts = [BOX_HOLE + f'.edges(Query("{q}")).fillet(1)',
               BOX_HOLE + f'.edges(Query("{q}")).fillet(1).faces(">Z").workplane().rect(5, 5)',   # leaves a wire
               BOX_HOLE + '.faces(">Z").workplane().rect(4, 4).cutBlind(-2)',
               BOX_HOLE + '.edges(Query("fillet the straight edges on the top")).chamfer(0.5)']
    plain = [cad.run_script(t, oracle_grounder).solid.Volume() for t in scripts]
    cache: dict = {}
    for order in (range(4), reversed(range(4)), [1, 2, 1, 0, 3]):
        for i in order:
            assert cad.run_script(scripts[i], oracle_grounder, cache=cache).solid.Volume() == pytest.approx(plain[i], rel=1e-12)
    assert sum(k[0] == "ground" for k in cache) == 2
    # export memo: a fresh compound around the same solid hits; another solid does not
    wp = cq.Workplane("XY").box(3, 4, 5)
    p1 = cad.export_cached(wp.findSolid())
    assert cad.export_cached(wp.findSolid()) is p1
    assert cad.export_cached(cq.Workplane("XY").box(3, 4, 6).findSolid()) is not p1


def test_match_edges_and_topology_split():
    before = cad.export_primitives(cad.run_script('cq.Workplane("XY").box(40, 30, 8)').solid)
    after = cad.export_primitives(cad.run_script(BOX_HOLE).solid)
    spec = ("edges", "straight", "bottom", "")
    a, b = cad.target_ids(before, spec), cad.target_ids(after, spec)
    assert a != b and cad.match_edges(before, after, a, b)                 # same edges, renumbered
    top_a, top_b = (cad.target_ids(p, ("edges", "straight", "top", "")) for p in (before, after))
    assert cad.match_edges(before, after, top_a, top_b)
    # a second hole adds a circle: the circular-top set changes
    two = cad.export_primitives(cad.run_script(BOX_HOLE + '.faces(">Z").workplane().center(-20, 0).hole(4)').solid)
    c1, c2 = (cad.target_ids(p, ("edges", "circular", "top", "")) for p in (after, two))
    assert len(c1) == 1 and len(c2) == 2 and not cad.match_edges(after, two, c1, c2)
    assert not cad.match_edges(before, after, a, b[:-1])


def test_freetext_list_is_well_formed():
    from stages.futurecad import freetext

    assert len(freetext.FREE_TEXT) >= 30
    frames = {t.split("{")[0].strip() for t in cad.SEEN_TEMPLATES + cad.HELDOUT_TEMPLATES if not t.startswith("{")}
    for q, spec in freetext.FREE_TEXT:
        assert spec in cad.SPECS and q == " ".join(q.split()) and q.islower()
        assert not any(q.startswith(f) for f in frames if f)
    assert {s for _, s in freetext.FREE_TEXT} == set(cad.SPECS)       # every target kind is asked in free text
    known = {w for q in freetext.TRAIN_FOREIGN for w in q.split()} | {
        w for t in cad.SEEN_TEMPLATES for w in t.split()} | {w for v in cad.SYNONYMS.values() for p in v for w in p.split()}
    for q in freetext.TEST_FOREIGN:                              # each names a feature word never seen in training
        assert set(q.split()) - known, q


# ---------------------------------------------------------------------------- learning at tiny scale
def test_brepground_learns_beyond_type_only():
    rng = np.random.default_rng(0)
    parts, rows, prim_list = [], [], []
    while len(parts) < 4:
        p = cad.random_part(rng)
        prims = cad.export_primitives(cad.run_script(p["script"]).solid)
        for r in part_queries(prims, cad.SEEN_TEMPLATES[:1], rng, None):
            rows.append(dict(r, part=len(parts)))
        parts.append(prim_tensors(prims))
        prim_list.append(prims)
    vocab_list = build_vocab(r["query"] for r in rows)
    vocab = {w: i for i, w in enumerate(vocab_list)}
    padded = pad_parts(parts, 32, 64)
    words = query_tensors(rows, vocab, 24)
    y = label_matrix(rows, padded, 32, 64)
    pidx = torch.tensor([r["part"] for r in rows])
    torch.manual_seed(0)
    net = BRepGround(len(vocab_list), d=32, heads=4, text_layers=1, fusion_layers=2)
    module = GroundModule(net, 3e-3)
    opt = module.configure_optimizers()
    for batch in GroundLoader(words, pidx, y, padded, 16, 150, seed=0):
        logits = net(batch["words"], batch["faces"], batch["edges"], batch["face_type"], batch["edge_type"],
                     batch["fmask"], batch["emask"])
        mask = torch.cat([batch["fmask"], batch["emask"]], 1).float()
        loss = (torch.nn.functional.binary_cross_entropy_with_logits(logits, batch["y"], reduction="none") * mask).sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    _, sel = predict(net, words, {k: v[pidx] for k, v in padded.items()})
    model_f1, type_f1 = [], []
    for i, r in enumerate(rows):
        off = 0 if r["prim"] == "faces" else 32
        pred = set(torch.nonzero(sel[i, off: off + (32 if off == 0 else 64)]).flatten().tolist())
        truth = set(json.loads(r["target"]))
        model_f1.append(set_metrics(pred, truth)[1])
        type_f1.append(set_metrics(set(type_only(r["query"], prim_list[r["part"]])[1]), truth)[1])
    assert np.mean(model_f1) > np.mean(type_f1) + 0.1, (np.mean(model_f1), np.mean(type_f1))


# ---------------------------------------------------------------------------- pipeline, CLI, bad input
def test_smoke_pipeline_and_cli(smoke_run, tmp_path, capsys):
    import cadquery as cq

    from stages.futurecad import ground

    out = smoke_run("futurecad")
    metrics = json.loads((smoke_run.root / "reports" / "futurecad" / "metrics.json").read_text())
    names = {c["name"]: c for c in metrics["claims"]}
    assert {"query_survives_renumbering", "query_correct_after_target_change", "rl_beats_sft_equal_compute",
            "rl_raises_executability", "heldout_templates_generalize", "ground_beats_rule_freetext",
            "cli_matches_batch", "abstains_nonsense"} <= set(names)
    assert {c["kind"] for c in metrics["claims"]} == {"finding", "check"}
    assert metrics["kernels"]["chamfer"]["calls"] > 0 and metrics["kernels"]["token_logprob"]["calls"] > 0
    ev = metrics["metrics"]
    assert set(ev["program"]["arms"]) == {"sft", "sft_more", "rl", "constant"}
    full = json.loads((out["evaluate"] / "eval.json").read_text())["program"]
    fid = full["fidelity"]                          # per arm, per measure: seeds × held-out descriptions in [0, 1]
    n_test = ev["program"]["n_test"]
    # the description-blind baseline: one SFT program's script, the same for every seed and description
    sft_scripts = {" ".join(r["script"].split()) for r in pl.read_parquet(out["prepare"] / "programs.parquet")
                   .filter(pl.col("role") == "sft").to_dicts()}
    assert full["constant"]["script"] in sft_scripts and full["constant"]["candidates"] == len(sft_scripts)
    assert all(r == full["arms"]["constant"]["reward"][0] for r in full["arms"]["constant"]["reward"])
    assert {"rl_beats_constant_script", "sft_only_beats_constant_script"} <= set(names)
    assert all(0 < d <= 1 for v in full["distinct"].values() for d in v)
    extra = full["equal_compute_sft_steps"]   # SFT-only keeps its own run's state (0..extra) or the RL checkpoint
    assert all(v["sft_more_step"] == "checkpoint" or 0 <= v["sft_more_step"] <= extra
               for v in full["selected_checkpoints"].values())
    assert set(fid) == {"sft", "sft_more", "rl", "constant"} and all(
        len(v) == len(ev["program"]["seeds"]) and all(len(r) == n_test and all(0 <= x <= 1 for x in r) for r in v)
        for a in fid.values() for v in a.values())
    meta = json.loads((out["prepare"] / "meta.json").read_text())   # smoke: 2 validation parts, the first 2 strata
    assert meta["strata"]["val"] == {cad.stratum_name(st): int(k < 2) for k, st in enumerate(cad.STRATA)}
    assert ev["program"]["equal_compute_sft_steps"] == 6           # ⌈2 steps · 2 prompts · group 2 · 8 / (3 · 4)⌉
    assert all(c["matches_batch"] for c in ev["cli"]["cases"])
    for f in ("seen", "heldout", "freetext", "external"):
        assert {"exact", "f1", "recall@3", "recall@5", "recall@10", "ap"} <= set(ev["grounding"]["model"][f])
    rep = (smoke_run.root / "reports" / "futurecad" / "report.md").read_text()
    assert "Threats to validity" in rep and "Deviations" in rep
    for fig in ("grounded_parts", "grounding_accuracy", "program_learning_curves"):
        assert (smoke_run.root / "reports" / "futurecad" / "figures" / f"{fig}.png").exists()
    ckpt = out["train"] / json.loads((out["train"] / "models.json").read_text())["cli_checkpoint"]
    # the figure's cases (evaluate): held-out edge queries on distinct test parts, the grounder's answer as the CLI
    # gives it, the part's surface and its edges as read back from STEP
    cases = json.loads((out["evaluate"] / "figure_cases.json").read_text())
    assert 1 <= len(cases) <= 4 and len({c["part"] for c in cases}) == len(cases)
    for c in cases:
        step_file = out["prepare"] / "steps" / f"part_{c['part']:04d}.step"
        n_edges = len(cad.load_step(step_file).Edges())
        assert np.asarray(c["points"]).shape == (600, 3) and np.asarray(c["edges"]).shape == (n_edges, cad.CURVE, 3)
        assert c["target"] and set(c["selected"]) <= set(range(n_edges))
        assert not (c["abstained"] and c["selected"])
    res = tmp_path / "fig.json"
    assert ground.main(["--step", str(out["prepare"] / "steps" / f"part_{cases[0]['part']:04d}.step"), "--query",
                        cases[0]["query"], "--out", str(res), "--checkpoint", str(ckpt)]) == 0
    assert sorted(json.loads(res.read_text())["selected"]["edges"]) == cases[0]["selected"]

    # hand-made part (not from the generator): an L-bracket with a counterbored-like pair of holes
    hand = (cq.Workplane("XY").box(50, 20, 6).faces(">Z").workplane().center(-15, 0).hole(5)
            .faces(">Z").workplane().center(15, 0).rect(10, 12).cutBlind(-3))
    step = tmp_path / "bracket.step"
    cq.exporters.export(hand, str(step))
    res = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "stages.futurecad.ground", "--step", str(step), "--query",
                           "fillet the circular edges on the top", "--out", str(res), "--checkpoint", str(ckpt)],
                          capture_output=True, text=True, timeout=900)  # hang guard only (a loaded 2-core box)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(res.read_text())
    loaded = cad.load_step(step)
    assert r["n_edges"] == len(loaded.Edges()) and r["n_faces"] == len(loaded.Faces())
    assert set(map(int, r["scores"]["edges"])) == set(range(r["n_edges"]))
    assert all(r["scores"]["edges"][str(i)] > 0.5 for i in r["selected"]["edges"])
    assert isinstance(r["abstained"], bool) and (not r["abstained"] or r["selected"] == {"edges": [], "faces": []})

    # out-of-vocabulary queries abstain: exit 0, "abstained": true, empty selections, a reason
    for q in ("xyzzy plugh frobnicate", ";;;"):
        res = tmp_path / "abstain.json"
        capsys.readouterr()                                   # drop earlier output: the line below must be this run's
        rc = ground.main(["--step", str(step), "--query", q, "--out", str(res), "--checkpoint", str(ckpt)])
        a = json.loads(res.read_text())
        assert rc == 0 and a["abstained"] is True and a["selected"] == {"edges": [], "faces": []}
        assert "vocabulary" in a["reason"] and "no match" in capsys.readouterr().out

    # bad input: one line on stderr, exit 2, nothing written
    bad = tmp_path / "bad.step"
    bad.write_text("ISO-10303-21;\nthis is not a step file\n")
    for argv, msg in ([["--step", str(bad), "--query", "x"], "not a readable STEP"],
                      [["--step", str(step), "--query", "   "], "empty query"],
                      [["--step", str(step), "--query", "x", "--out", str(step)], "equals"],
                      [["--step", str(step), "--query", "x", "--out", str(tmp_path)], "directory"],
                      [["--step", str(tmp_path / "none.step"), "--query", "x"], "not a file"],
                      [["--step", str(step), "--query", "x", "--abstain-threshold", "1.5"], "abstain"]):
        if "--out" not in argv:
            argv = argv + ["--out", str(tmp_path / "never.json")]
        rc = ground.main(argv + ["--checkpoint", str(ckpt)])
        assert rc == 2, argv
    assert not (tmp_path / "never.json").exists()
    proc = subprocess.run([sys.executable, "-m", "stages.futurecad.ground", "--step", str(bad), "--query", "x",
                           "--out", str(tmp_path / "never.json"), "--checkpoint", str(ckpt)],
                          capture_output=True, text=True, timeout=900)  # hang guard only (a loaded 2-core box)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "STEP" in proc.stderr


def test_strata_are_every_mix_the_generator_draws():
    """cad.STRATA (enumerated from the feature table) against 4,000 draws of random_part: the same set; and the
    validation quota walks the strata in turn."""
    from stages.futurecad.prepare import val_quota

    rng = np.random.default_rng(11)
    assert {cad.stratum(cad.random_part(rng)) for _ in range(4000)} == set(cad.STRATA)
    assert len(cad.STRATA) == 15 == len(set(cad.STRATA))
    assert val_quota(15) == dict.fromkeys(cad.STRATA, 1)
    q = val_quota(32)
    assert sum(q.values()) == 32 and {q[s] for s in cad.STRATA[:2]} == {3} and set(q[s] for s in cad.STRATA[2:]) == {2}


def test_bad_params_are_named(tmp_path):
    from stages.common.config import validate
    from stages.futurecad import prepare, train

    with pytest.raises(ConfigError, match="n_train_parts"):
        validate(prepare.Config, {"n_train_parts": 0}, "papers.futurecad.prepare")
    with pytest.raises(ConfigError, match="typo"):
        validate(prepare.Config, {"typo": 1}, "papers.futurecad.prepare")
    with pytest.raises(ConfigError, match="n_heads"):
        validate(train.Config, {"ground": {"d_model": 30, "n_heads": 4}}, "papers.futurecad.train")
    from stages.futurecad import report
    with pytest.raises(ConfigError, match="rl_study"):
        validate(report.Config, {"rl_study": 3}, "papers.futurecad.report")
    with pytest.raises(ConfigError, match="rl_study"):
        validate(report.Config, {"rl_study": ""}, "papers.futurecad.report")
