"""infer.py (what a trained futurecad model answers with, no Lightning): the query tensors, the checkpoint loader,
``ModelGrounder`` (scores sliced to the part's real primitives, the decision with the checkpoint's thresholds) and
``ProgramScorer`` (reward = executes × (1 − min(CD / diag, 1))), against hand-worked numbers, an independent
brute-force Chamfer distance and a fake sandbox. No CAD kernel: primitives are built by hand, so these are fast."""
from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch

from kernels.record import KernelRecord
from stages.futurecad import cad, infer
from stages.futurecad.infer import EMPTY_KINDS, ModelGrounder, decide, ProgramScorer, load_ground, load_parts, query_tensors
from stages.futurecad.model import PAD, UNK, BRepGround, encode_query, pad_parts, predict
from stages.futurecad.prepare import prim_tensors

VOCAB = ["<pad>", "<unk>", "circular", "edges", "fillet", "the", "top"]
# non-default sizes everywhere, so a loader that ignores the checkpoint's meta cannot pass
GROUND = {"d_model": 16, "n_heads": 2, "text_layers": 1, "fusion_layers": 1, "max_words": 7,
          "max_faces": 6, "max_edges": 11, "threshold": 0.65, "abstain_threshold": 0.7}


def _prims(n_faces: int = 4, n_edges: int = 7, seed: int = 3) -> cad.Primitives:
    g = np.random.default_rng(seed)
    return cad.Primitives(g.normal(size=(n_faces, cad.UV * cad.UV, cad.FACE_CH)).astype(np.float32),
                          g.normal(size=(n_edges, cad.CURVE, cad.EDGE_CH)).astype(np.float32),
                          ["PLANE", "CYLINDER", "PLANE", "PLANE"][:n_faces], ["LINE", "CIRCLE"] * 3 + ["LINE"],
                          [{}] * n_faces, [{}] * n_edges)


def _checkpoint(tmp_path, ground=None, seed: int = 5):
    ground = dict(GROUND, **(ground or {}))
    torch.manual_seed(seed)
    net = BRepGround(len(VOCAB), ground["d_model"], ground["n_heads"], ground["text_layers"],
                     ground["fusion_layers"], ground["max_words"]).eval()
    path = tmp_path / "ground.pt"
    torch.save({"state": net.state_dict(), "meta": json.dumps({"vocab": VOCAB, "ground": ground})}, path)
    return net, path


def test_query_tensors_and_load_parts(tmp_path, monkeypatch):
    vocab = {w: i for i, w in enumerate(VOCAB)}
    rows = [{"query": "fillet the top edges"}, {"query": "Fillet THE circular blob"}]
    t = query_tensors(rows, vocab, 6)
    assert t.dtype == torch.long and t.tolist() == [[4, 5, 6, 3, PAD, PAD], [4, 5, 2, UNK, PAD, PAD]]
    assert query_tensors(rows, vocab, 2).tolist() == [[4, 5], [4, 5]]                  # cut at max_words
    assert query_tensors([], vocab, 6).dtype == torch.long                            # an empty batch too
    parts = [{"faces": torch.ones(2, 3)}, {"faces": torch.zeros(1, 3)}]
    torch.save(parts, tmp_path / "primitives.pt")
    back = load_parts(tmp_path)
    assert len(back) == 2 and torch.equal(back[0]["faces"], parts[0]["faces"])
    torch.save(parts + [_NotWeights()], tmp_path / "primitives.pt")   # weights only: no arbitrary objects,
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")       # even where a default load would allow them
    with pytest.raises(pickle.UnpicklingError):
        load_parts(tmp_path)
    assert {"absent", "foreign", "nonsense", "absent_freetext", "external_absent"} == set(EMPTY_KINDS)


def test_load_ground_round_trip(tmp_path, monkeypatch):
    net, path = _checkpoint(tmp_path)
    back, meta = load_ground(path)
    assert not back.training and meta["vocab"] == VOCAB and meta["ground"]["max_edges"] == 11
    assert back.word.weight.shape == (len(VOCAB), 16) and back.wpos.weight.shape[0] == 7
    assert len(back.text.layers) == 1 and len(back.fusion.layers) == 1 and back.fusion.layers[0].self_attn.num_heads == 2
    for (k, a), (k2, b) in zip(net.state_dict().items(), back.state_dict().items()):
        assert k == k2 and torch.equal(a, b)
    ck = torch.load(path, weights_only=True)
    torch.save(dict(ck, extra=_NotWeights()), path)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(pickle.UnpicklingError):
        load_ground(path)


class _NotWeights:
    """An arbitrary pickled object: a weights-only load refuses it."""


def test_model_grounder_scores_and_answer(tmp_path, monkeypatch):
    net, path = _checkpoint(tmp_path)
    g = ModelGrounder(*load_ground(path))
    prims = _prims()
    q = "fillet the circular edges on the top"
    fs, es = g.scores(prims, q)
    # independent: the same net on the part padded to the checkpoint's sizes, sliced by hand
    parts = pad_parts([prim_tensors(prims)], 6, 11)
    words = torch.tensor([encode_query(q, {w: i for i, w in enumerate(VOCAB)}, 7)])
    scores, _ = predict(net, words, parts)
    s = scores[0].numpy()
    assert fs.shape == (4,) and es.shape == (7,) and g.calls == 1
    np.testing.assert_array_equal(fs, s[:4])                         # faces in order, then edges in order
    np.testing.assert_array_equal(es, s[6:13])
    # this seed's scores (the fixture, not the code under test): faces all < 0.3, edges spread over 0.5..0.75
    assert fs.max() < 0.3 and 0.5 < es.min() and es.max() < 0.75 and len(set(np.round(es, 3))) >= 4
    # the decision reads the checkpoint's thresholds (0.65 select, 0.7 abstain), not the 0.5 defaults
    top = float(es.max())
    a = g.answer(prims, q)
    assert g.calls == 2 and not a["abstained"] and a["top_score"] == pytest.approx(top)
    np.testing.assert_array_equal(a["face_scores"], fs)
    np.testing.assert_array_equal(a["edge_scores"], es)
    want = [i for i, v in enumerate(es) if v > 0.65]
    assert a["edges"] == want and want != [i for i, v in enumerate(es) if v > 0.5] and a["faces"] == []
    g.meta["ground"].update(abstain_threshold=top + 0.01)             # the top score below it: abstain
    a = g.answer(prims, q)
    assert a["abstained"] and a["edges"] == [] and a["faces"] == []
    t = _other_threshold(es)
    g.meta["ground"].update(threshold=t, abstain_threshold=top - 0.01)
    a = g.answer(prims, q)
    assert not a["abstained"] and a["edges"] == [i for i, v in enumerate(es) if v > t]
    # an all-unknown query abstains whatever the scores
    g.meta["ground"].update(abstain_threshold=0.0)
    a = g.answer(prims, "xyzzy plugh")
    assert a["abstained"] and "vocabulary" in a["reason"]
    # the sandbox's call: a solid -> its edge ids (the CAD export replaced by the hand-made primitives)
    monkeypatch.setattr(cad, "export_cached", lambda solid: {"a solid": prims}[solid])
    g.meta["ground"].update(threshold=t, abstain_threshold=top - 0.01)
    assert g("a solid", q) == [i for i, v in enumerate(es) if v > t]
    g.meta["ground"].pop("threshold"), g.meta["ground"].pop("abstain_threshold")       # older checkpoints: 0.5
    a = g.answer(prims, q)
    assert not a["abstained"] and a["edges"] == list(range(7)) and a["faces"] == []


def test_loading_and_scoring_follow_the_requested_device(tmp_path, monkeypatch):
    """No second device here: the meta device stands in (tensors without data that record where they are)."""
    net, path = _checkpoint(tmp_path)
    seen = {}
    load = torch.load

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return load(*args, **kwargs)

    monkeypatch.setattr(infer.torch, "load", spy)
    back, _ = load_ground(path, "meta")
    assert seen["map_location"] == "meta" and seen["weights_only"] is True
    assert {p.device.type for p in back.parameters()} == {"meta"}
    monkeypatch.setattr(infer.torch, "load", load)
    g = ModelGrounder(*load_ground(path))
    g.net = g.net.to("meta")
    devices = set()

    def fake_predict(net, words, parts, **kw):
        devices.update({words.device.type} | {v.device.type for v in parts.values()})
        return torch.zeros(1, 6 + 11), None

    monkeypatch.setattr(infer, "predict", fake_predict)
    g.scores(_prims(), "fillet the top edges")
    assert devices == {"meta"}


def test_program_scorer_sends_both_point_sets_to_its_device():
    class Rec:
        def call(self, name, fn, x, y):
            self.devices = (x.device.type, y.device.type)
            return torch.zeros(x.shape[0])

    rec = Rec()
    res = {"a": {"ok": True, "error": "", "points": np.zeros((5, 3), np.float32), "iou": None}}
    scorer = ProgramScorer(_FakeSandbox(res), torch.zeros(1, 5, 3), [1.0], rec, torch.device("meta"))
    scorer.score(["a"], [0])
    assert rec.devices == ("meta", "meta")


def _other_threshold(scores) -> float:
    """A threshold between two of the scores, as far from 0.5 as possible, selecting another set than 0.5 does."""
    v = np.sort(np.asarray(scores, dtype=np.float64))
    t = float(max((v[:-1] + v[1:]) / 2, key=lambda m: abs(m - 0.5)))
    assert [x > t for x in scores] != [x > 0.5 for x in scores]
    return t


def test_decide_exact_answers_and_boundaries():
    assert decide(np.array([0.9]), np.array([0.2]), 0, 0.5, 0.5) == {
        "abstained": True, "reason": "no query word is in the grounder's vocabulary", "top_score": 0.9,
        "faces": [], "edges": []}
    assert decide(np.array([0.25]), np.array([0.375]), 1, 0.3, 0.4) == {
        "abstained": True, "reason": "top score 0.375 below the abstention threshold 0.4", "top_score": 0.375,
        "faces": [], "edges": []}
    # a top score equal to the abstention threshold answers; a score equal to the selection threshold is not taken
    assert decide(np.array([0.5]), np.array([0.25]), 1, 0.5, 0.5) == {
        "abstained": False, "reason": "", "top_score": 0.5, "faces": [], "edges": []}
    assert decide(np.array([0.5, 0.75]), np.array([0.5, 0.625, 0.875]), 2, 0.5, 0.5) == {
        "abstained": False, "reason": "", "top_score": 0.875, "faces": [1], "edges": [1, 2]}
    assert decide(np.array([]), np.array([]), 3, 0.5, 0.0)["top_score"] == 0.0           # nothing scored: top 0


class _FakeSandbox:
    """run_many's contract: one result per text, in order; records what it was asked."""

    def __init__(self, results):
        self.results, self.calls = results, []

    def run_many(self, texts, breps=None):
        self.calls.append((list(texts), breps))
        return [self.results[t] for t in texts]


def _brute_chamfer(x: np.ndarray, y: np.ndarray) -> float:
    d = np.sqrt(((x[:, None, :] - y[None, :, :]) ** 2).sum(-1))
    return float(d.min(1).mean() + d.min(0).mean())


def test_program_scorer_reward_by_brute_force():
    g = np.random.default_rng(11)
    targets = torch.from_numpy(g.normal(size=(3, 20, 3)).astype(np.float32))
    diags = [7.5, 2.5, 1e-3]                                  # the last one drives CD / diag above 1: clamped
    near = targets[1].numpy() + 0.05 * g.normal(size=(20, 3)).astype(np.float32)
    far = g.normal(size=(20, 3)).astype(np.float32) * 3.0
    res = {"a": {"ok": True, "error": "", "points": near, "iou": 0.8},
           "b": {"ok": False, "error": "edges(): selection is empty"},
           "c": {"ok": True, "error": "", "points": far, "iou": 0.25},
           "d": {"ok": True, "error": "", "points": targets[0].numpy(), "iou": 1.0}}
    sb = _FakeSandbox(res)
    rec = KernelRecord("cpu")
    scorer = ProgramScorer(sb, targets, diags, rec, torch.device("cpu"), breps=[b"t0", b"t1", b"t2"])
    out = scorer.score(["a", "b", "c", "d"], [1, 0, 2, 0])
    cd_a = _brute_chamfer(near, targets[1].numpy())
    assert out["ncd"].tolist() == pytest.approx([cd_a / 2.5, 1.0, 1.0, 0.0], abs=1e-5)
    assert out["reward"].tolist() == pytest.approx([1 - cd_a / 2.5, 0.0, 0.0, 1.0], abs=1e-5)
    assert out["exec"].tolist() == [1.0, 0.0, 1.0, 1.0]
    assert out["errors"] == ["", "edges(): selection is empty", "", ""]
    assert out["iou"].tolist() == [0.0, 0.0, 0.0, 0.0] and sb.calls[-1][1] is None      # no IoU asked
    assert rec.to_dict()["chamfer"]["calls"] == 1                                        # one batched call
    out = scorer.score(["c", "a"], [0, 1], iou=True)
    assert sb.calls[-1] == (["c", "a"], [b"t0", b"t1"])                                  # the targets' B-Reps
    assert out["iou"].tolist() == pytest.approx([0.25, 0.8])
    cd_c = _brute_chamfer(far, targets[0].numpy())
    assert out["ncd"].tolist() == pytest.approx([min(cd_c / 7.5, 1.0), cd_a / 2.5], abs=1e-5)
    # nothing executes: no kernel call, reward 0 and ncd 1 everywhere
    out = scorer.score(["b", "b"], [0, 1])
    assert out["reward"].tolist() == [0.0, 0.0] and out["ncd"].tolist() == [1.0, 1.0]
    assert out["exec"].tolist() == [0.0, 0.0] and rec.to_dict()["chamfer"]["calls"] == 2
