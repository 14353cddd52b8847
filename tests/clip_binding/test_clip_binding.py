"""clip_binding: tokenisation and query pooling against brute force, the complexity regressors' core
effect (low-complexity binding generalizes, a random table does not), additivity, smoke pipeline, bad input."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch

from stages.common.config import ConfigError, validate
from stages.clip_binding import prepare, train
from stages.clip_binding.complexity import FAMILIES, RegressorBank, additivity_r2, pair_ids, r2_score
from stages.clip_binding.evaluate import bag_of_concepts_correct
from stages.clip_binding.models import steps_loader
from stages.clip_binding.scenes import World, pooled_queries, sample_scenes, split_objects
from stages.common.trainer import TrainerConfig, make_trainer


def test_tokenisation_matches_hand_written_scene():
    w = World(k=2, v=5, n_max=3)
    objs = torch.tensor([[7, 13, 0], [24, 0, 0]])          # 7 = (1, 2), 13 = (2, 3), 24 = (4, 4)
    tokens, eos = w.tokenize_scenes(objs, torch.tensor([2, 1]))
    S, E, X, P = w.SOO, w.EOO, w.EOS, w.PAD
    assert tokens[0].tolist() == [S, 1, 5 + 2, E, S, 2, 5 + 3, E, X, P, P, P, P]
    assert tokens[1].tolist() == [S, 4, 5 + 4, E, X, P, P, P, P, P, P, P, P]
    assert eos.tolist() == [8, 4]
    assert w.object_queries(torch.tensor([13])).tolist() == [[S, 2, 8, E, X]]
    vals = torch.tensor(list(itertools.product(range(5), range(5))))
    assert torch.equal(w.object_id(vals), torch.arange(25))
    assert torch.equal(w.concepts(torch.arange(25)), vals)


def test_pooled_queries_against_brute_force():
    w = World(k=3, v=3, n_max=3)
    g = torch.Generator().manual_seed(4)
    objs, n = sample_scenes(w, torch.arange(w.n_objects), 40, g)
    pq = pooled_queries(w, objs, n, g)
    for i in range(40):
        present = set(objs[i, : n[i]].tolist())
        for m, q in enumerate(pq["query_objs"].tolist()):
            assert pq["object_labels"][i, m] == float(q in present)
        cvals = {(c, int(w.concepts(torch.tensor(o))[c])) for o in present for c in range(3)}
        for t in range(w.n_concept_tokens):
            assert pq["concept_labels"][i, t] == float((t // 3, t % 3) in cvals)
    # every in-batch object is a query; every extra query is a swap negative: object 0 with one concept of object 1
    in_batch = {o for i in range(40) for o in objs[i, : n[i]].tolist()}
    assert in_batch <= set(pq["query_objs"].tolist())
    for q in set(pq["query_objs"].tolist()) - in_batch:
        qv = w.concepts(torch.tensor(q))
        ok = False
        for i in range(40):
            if n[i] >= 2:
                a, b = w.concepts(objs[i, 0]), w.concepts(objs[i, 1])
                ok |= all((qv[c] == a[c]) or (qv[c] == b[c]) for c in range(3)) and int((qv != a).sum()) == 1
        assert ok


def test_negative_pool_restricts_swap_negatives():
    w = World(k=2, v=6, n_max=2)
    g = torch.Generator().manual_seed(0)
    pool = torch.arange(0, 36, 2)
    objs, n = sample_scenes(w, pool, 64, g)
    pq = pooled_queries(w, objs, n, g, negative_pool=pool)
    assert set(pq["query_objs"].tolist()) <= set(pool.tolist())


def test_split_covers_every_value_and_holds_out():
    w = World(k=2, v=8, n_max=2)
    mask = split_objects(w, 0.25, torch.Generator().manual_seed(3))
    assert int(mask.sum()) == 16 and int((~mask).sum()) == 48
    vals = w.concepts(torch.arange(64)[mask])
    assert all(vals[:, c].unique().numel() == 8 for c in range(2))


def test_bag_of_concepts_scorer_brute_force():
    w = World(k=2, v=4, n_max=2)
    objs = torch.tensor([[w.object_id(torch.tensor([0, 1])), w.object_id(torch.tensor([2, 3]))]])
    n = torch.tensor([2])
    # the swap negative (0, 3) has both its values in the scene -> a bag of concepts cannot reject it
    pq = {"query_objs": torch.tensor([1, 3, 11]), "object_labels": torch.tensor([[1.0, 0.0, 1.0]])}
    assert not bag_of_concepts_correct(w, objs, n, pq).item()
    pq = {"query_objs": torch.tensor([1, 5, 11]), "object_labels": torch.tensor([[1.0, 0.0, 1.0]])}   # (1,1): 1 absent
    assert bag_of_concepts_correct(w, objs, n, pq).item()


HID = 8
def _fit_bank(y_fn, frac=0.5, steps=300, seed=0):
    """Regress y(a, b) for all pairs of a k=2, v=6 world from seen objects; R² per family on unseen pairs."""
    w = World(2, 6, 2)
    n = w.n_objects
    a, b = (t.reshape(-1) for t in torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij"))
    y = y_fn(w, a, b)                                              # (P, d)
    seen = split_objects(w, frac, torch.Generator().manual_seed(seed))
    tr, te = seen[a] & seen[b], ~seen[a] & ~seen[b]
    ids = pair_ids(w, a, b)
    bank = RegressorBank(1, w.v, y.shape[1], HID, 64, 1e-2, ids[tr][None], y[tr][None], seed=seed)
    make_trainer(TrainerConfig(enable_progress_bar=False), None, max_steps=steps).fit(bank, steps_loader(steps))
    with torch.no_grad():
        return {f: float(r2_score(y[te][None], bank.predict(f, ids[te][None]), y.mean(0, keepdim=True)[None])[0])
                for f in FAMILIES}


def test_core_effect_low_complexity_binding_generalizes_random_table_does_not():
    """The complexity analysis' core effect at tiny scale: a low-complexity binding function (additive
    over concept slots) is recovered on scenes of unseen objects; a random object table
    (the high-complexity control) is not, by any family."""
    g = torch.Generator().manual_seed(11)
    tables = 0.7 * torch.randn(4, 6, 5, generator=g)
    obj_table = 1.3 * torch.randn(36, 5, generator=g)

    def concept_additive(w, a, b):
        c = pair_ids(w, a, b)
        return sum(tables[s][c[:, s]] for s in range(4))

    threads = torch.get_num_threads()
    torch.set_num_threads(1)     # tiny tensors: more threads only spin on a shared 2-core machine
    try:
        low = _fit_bank(concept_additive)
        high = _fit_bank(lambda w, a, b: obj_table[a] + obj_table[b])
    finally:
        torch.set_num_threads(threads)
    assert low["mlp"] > 0.8 and low["sum_mult"] > 0.8, low
    assert max(high.values()) < 0.3, high


def test_additivity_r2_exact_and_non_additive():
    rng = np.random.default_rng(0)
    n = 10
    a, b = (x.reshape(-1) for x in np.meshgrid(np.arange(n), np.arange(n), indexing="ij"))
    A1, A2 = rng.normal(size=(n, 3)), rng.normal(size=(n, 3))
    test = rng.random(len(a)) < 0.2
    assert additivity_r2(2.0 + A1[a] + A2[b], a, b, n, test, 1e-6) > 0.999
    assert additivity_r2(A1[a] * A2[b], a, b, n, test, 1e-6) < 0.2     # interaction: not additive


def test_bad_input_named():
    base = {"k": 2, "v": 4}
    with pytest.raises(ConfigError, match=r"train_object_fractions"):
        validate(prepare.Config, {**base, "train_object_fractions": [0.5, 1.0]}, "papers.clip_binding.prepare")
    with pytest.raises(ConfigError, match=r"train_object_fractions"):
        validate(prepare.Config, {**base, "train_object_fractions": [0.0]}, "papers.clip_binding.prepare")
    with pytest.raises(ConfigError, match=r"n_max"):
        validate(prepare.Config, {"k": 1, "v": 2, "n_max": 3}, "papers.clip_binding.prepare")
    with pytest.raises(ConfigError, match=r"seeds"):
        validate(prepare.Config, {**base, "seeds": [1, 1]}, "papers.clip_binding.prepare")
    with pytest.raises(ConfigError, match=r"d_model"):
        validate(train.Config, {"d_model": 30, "n_heads": 4}, "papers.clip_binding.train")
    with pytest.raises(ValueError, match="train_object_fraction"):
        split_objects(World(2, 2, 1), 0.1, torch.Generator())


def test_smoke_pipeline(smoke_run):
    out = smoke_run("clip_binding")
    doc = json.loads((out["report"] / "metrics.json").read_text())
    names = {c["name"] for c in doc["claims"]}
    assert {"coverage_sharpens_binding", "mult_generalizes_trained", "scene_embeddings_additive"} <= names
    assert all(c["verdict"] in ("holds", "fails", "inconclusive") for c in doc["claims"])
    assert doc["kernels"]["cosine_soft_ce"]["calls"] > 0
    assert doc["kernels"]["cosine_soft_ce"]["parity_max_abs_err"] < 1e-4
    ev = json.loads((out["evaluate"] / "eval.json").read_text())
    assert len(ev["coverage"]["f25"]["binding_acc"]) == 3
    # every family (incl. the within-object product) on every seed, restarts kept, the seed value = their median
    kinds = {c["name"]: c["kind"] for c in doc["claims"]}
    assert kinds["nothing_generalizes_control"] == "check" and kinds["mult_within_generalizes_trained"] == "finding"
    for kind in ("trained", "control"):
        for fam in ("mlp", "mult", "sum_mult", "mult_within"):
            d = ev["complexity"][kind][fam]["f50"]
            assert len(d["r2_restarts"]) == 3 and all(len(r) == 2 for r in d["r2_restarts"])
            assert d["r2"] == pytest.approx([float(np.median(r)) for r in d["r2_restarts"]])
            assert all(len(set(r)) == 2 for r in d["r2_restarts"])     # restarts are distinct inits
    assert (out["report"] / "figures" / "accuracy_vs_coverage.png").exists()
    # the learning curve is recorded by the train stage (every curve_every steps and at the last step) and gates
    # the coverage reading through one seen_binding_learned check per coverage level
    import polars as pl
    hist = pl.read_csv(out["train"] / "history.csv")
    curve = hist.filter(pl.col("seen_binding_acc").is_not_null())
    steps = json.loads((out["train"] / "models.json").read_text())["kwargs"]["steps"]
    for (f, s), sub in curve.group_by(["fraction", "seed"]):
        assert sub["step"].max() == steps - 1 and sub.height >= 2
        assert sub["seen_binding_acc"].is_between(0, 1).all()
    assert kinds["seen_binding_learned_f25"] == "check" and kinds["seen_binding_learned_f75"] == "check"
    cov = ev["coverage"]["f75"]
    assert all(0 <= x <= 1 for k in ("train_binding_acc", "train_bag_binding_acc", "train_binding_acc_any_neg")
               for x in cov[k])
    assert (out["report"] / "figures" / "learning_curve.png").exists()
    assert "Were the encoders trained to bind seen objects?" in (out["report"] / "report.md").read_text()


def test_learning_curve_leaves_the_training_stream_untouched():
    """Recording seen-object binding accuracy during training (own generator, no grad) must not change the
    trajectory: the same seed with and without the curve ends with identical weights."""
    w = World(2, 3, 2)
    tr = torch.arange(w.n_objects)[split_objects(w, 0.5, torch.Generator().manual_seed(2))]
    kw = dict(d_model=8, n_heads=2, n_layers=1, d_ff=16, d_out=4, batch_size=12, lr=3e-3, weight_decay=0.1,
              warmup=0.2, steps=4)
    states = []
    for every in (0, 1):
        model = train.build_model(w, tr, dict(kw, curve_every=every, curve_scenes=16), seed=5, backend="torch")
        make_trainer(TrainerConfig(enable_progress_bar=False), None, max_steps=4).fit(model, steps_loader(4))
        states.append(model.state_dict())
        if every:
            accs = [h["seen_binding_acc"] for h in model.history if "seen_binding_acc" in h]
            assert len(accs) == 4 and all(0 <= a <= 1 for a in accs)
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
