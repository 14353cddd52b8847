"""clip_binding's binding test (issue 52 red team): recombination objects by enumeration, the recombination
accuracy against a per-scene loop over the model's own encoders, a perfect binder and a bag-of-concepts code,
and the additive-code R² diagnostic."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from stages.clip_binding import train
from stages.clip_binding.complexity import additive_code_r2
from stages.clip_binding.evaluate import heldout_pairs, recomb_items
from stages.clip_binding.models import recombination_accuracy, recombinations, seen_pair_scenes
from stages.clip_binding.scenes import World


@pytest.mark.parametrize("k,v", [(2, 4), (3, 3)])
def test_recombinations_by_enumeration(k, v):
    w = World(k, v, 2)
    g = torch.Generator().manual_seed(k * 10 + v)
    o1, o2 = torch.randint(0, w.n_objects, (20,), generator=g), torch.randint(0, w.n_objects, (20,), generator=g)
    got = recombinations(w, o1, o2)
    assert got.shape == (20, 2 ** k)
    for b in range(20):
        a, c = w.concepts(o1[b]).tolist(), w.concepts(o2[b]).tolist()
        for m in range(2 ** k):                       # bit i of m set: concept i from o2
            vals = [c[i] if (m >> i) & 1 else a[i] for i in range(k)]
            assert int(got[b, m]) == sum(x * v ** (k - 1 - i) for i, x in enumerate(vals))
        assert int(got[b, 0]) == int(o1[b]) and int(got[b, -1]) == int(o2[b])


def _tiny_model(w: World, seed: int = 3):
    kw = dict(d_model=8, n_heads=2, n_layers=1, d_ff=16, d_out=6, batch_size=8, lr=3e-3, weight_decay=0.1,
              warmup=0.2, steps=2)
    return train.build_model(w, torch.arange(w.n_objects), kw, seed=seed, backend="torch").eval()


def _all_differ_pairs(w: World, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    rows = []
    while len(rows) < n:
        o = torch.randint(0, w.n_objects, (2,), generator=g)
        if bool((w.concepts(o[0]) != w.concepts(o[1])).all()):
            rows.append(o)
    return torch.stack(rows)


def test_recombination_accuracy_matches_a_per_scene_loop():
    """k = 2: scene (o1, o2) and its recombined scene (r1, r2), each against the four probes, one at a time."""
    w = World(2, 5, 2)
    model = _tiny_model(w)
    objs = _all_differ_pairs(w, 240, 1)
    # a scene code that is not a bag of concepts (so both outcomes occur): random object tables, multiplied
    g = torch.Generator().manual_seed(7)
    U, V, P = (torch.randn(w.n_objects, 6, generator=g) for _ in range(3))
    model.embed_scenes = lambda o, n: U[o[:, 0]] * V[o[:, 1]] + U[o[:, 1]] * V[o[:, 0]]
    model.embed_objects = lambda o: P[o]
    model.embed_queries = lambda o: (None, P[o])
    got = recombination_accuracy(model, objs)
    lenient_seen = strict_seen = 0
    with torch.no_grad():
        for b in range(len(objs)):
            (a1, b1), (a2, b2) = w.concepts(objs[b]).tolist()
            o1, o2, r1, r2 = a1 * 5 + b1, a2 * 5 + b2, a1 * 5 + b2, a2 * 5 + b1

            def passes(p, q, others):
                x = model.embed_scenes(torch.tensor([[p, q]]), torch.tensor([2]))[0]
                cos = lambda o: float(torch.nn.functional.cosine_similarity(   # noqa: E731
                    x, model.embed_objects(torch.tensor([o]))[0], dim=0))
                return min(cos(p), cos(q)) > max(cos(o) for o in others)
            first, second = passes(o1, o2, (r1, r2)), passes(r1, r2, (o1, o2))
            assert bool(got["lenient"][b]) == first
            assert bool(got["strict"][b]) == (first and second)
            lenient_seen += first
            strict_seen += first and second
    assert 0 < strict_seen < lenient_seen      # the draws exercise both outcomes (else the test says little)


def test_a_perfect_binder_passes_and_a_bag_of_concepts_scene_code_fails_whatever_the_probe():
    w = World(2, 4, 2)
    model = _tiny_model(w)
    objs = _all_differ_pairs(w, 30, 2)
    eye = torch.eye(w.n_objects)
    # perfect binder: each object's probe is a one-hot of its id, the scene embeds the sum of its objects'
    model.embed_scenes = lambda o, n: eye[o[:, 0]] + eye[o[:, 1]]
    model.embed_queries = lambda o: (None, eye[o])
    r = recombination_accuracy(model, objs)
    assert r["strict"].all() and r["lenient"].all()

    def bag(o):
        return torch.nn.functional.one_hot(w.concept_tokens(w.concepts(o)), w.n_concept_tokens).sum(-2).float()
    # bag-of-concepts scene code: every probe code fails the strict test (both pair-scenes share one embedding)
    model.embed_scenes = lambda o, n: bag(o[:, 0]) + bag(o[:, 1])
    table = torch.randn(w.n_objects, w.n_concept_tokens, generator=torch.Generator().manual_seed(0))
    folded = eye[:, :w.n_concept_tokens] + eye[:, w.n_concept_tokens:]
    for probe in (bag, lambda o: folded[o], lambda o: table[o]):
        model.embed_queries = lambda o, probe=probe: (None, probe(o))
        assert not recombination_accuracy(model, objs)["strict"].any()
    # an additive probe code with equal norms fails the lenient test too
    model.embed_queries = lambda o: (None, bag(o))
    assert not recombination_accuracy(model, objs)["lenient"].any()


def test_an_additive_probe_code_with_unequal_norms_passes_only_the_lenient_test():
    """The third reviewer's hand-worked case (k = v = 2): probes m + A[a] + B[b], m = (1, 0), A = ±(0, 5.05),
    B = ±(0, -4.95); positives (1, ±0.1), recombinations (1, ±10); a scene at (1, 0) ranks the positives first."""
    w = World(2, 2, 2)
    model = _tiny_model(w)
    A, B = {0: 5.05, 1: -5.05}, {0: -4.95, 1: 4.95}

    def probe(o):
        vals = w.concepts(o)
        return torch.stack([torch.ones(len(o)), torch.tensor([A[int(a)] + B[int(b)] for a, b in vals])], 1)
    model.embed_queries = lambda o: (None, probe(o))
    model.embed_scenes = lambda o, n: torch.tensor([[1.0, 0.0]]).expand(len(o), 2)   # one embedding per bag
    objs = torch.tensor([[0, 3], [3, 0]])                  # (0,0)+(1,1): probes (1, 0.1) and (1, -0.1)
    r = recombination_accuracy(model, objs)
    assert r["lenient"].all() and not r["strict"].any()


def test_recombination_accuracy_refuses_scenes_sharing_a_concept():
    w = World(2, 4, 2)
    with pytest.raises(ValueError, match="differ in every concept"):
        recombination_accuracy(_tiny_model(w), torch.tensor([[0, 1]]))    # (0,0) and (0,1) share concept 1


def test_seen_pair_scenes_are_distinct_pairs_whose_whole_bag_is_training_objects():
    w = World(2, 4, 2)
    train_objs = torch.tensor([0, 5, 1, 4, 10, 15, 2])     # 0=(0,0) 5=(1,1) 1=(0,1) 4=(1,0) 10=(2,2) 15=(3,3) 2=(0,2)
    got = seen_pair_scenes(w, train_objs, 100, torch.Generator().manual_seed(0))
    want = set()
    for p, q in itertools.combinations(train_objs.tolist(), 2):
        (a1, b1), (a2, b2) = divmod(p, 4), divmod(q, 4)
        if a1 != a2 and b1 != b2 and a1 * 4 + b2 in train_objs.tolist() and a2 * 4 + b1 in train_objs.tolist():
            want.add(frozenset((p, q)))
    assert {frozenset(r) for r in got.tolist()} == want == {frozenset((0, 5)), frozenset((1, 4))}
    assert len(seen_pair_scenes(w, train_objs, 1, torch.Generator().manual_seed(0))) == 1
    assert seen_pair_scenes(World(2, 4, 1), train_objs, 100, torch.Generator()).shape == (0, 2)


def test_heldout_pairs_are_the_distinct_all_differ_two_object_pairs():
    w = World(2, 4, 2)
    objs = torch.tensor([[0, 5], [5, 0], [0, 1], [5, 10], [3, 3], [0, 5]])
    n = torch.tensor([2, 2, 2, 2, 2, 1])
    got = heldout_pairs(w, objs, n)
    assert sorted(map(tuple, got.tolist())) == [(0, 5), (5, 10)]
    r = recomb_items(_tiny_model(w), got)
    assert r["strict"].shape == (2,) and r["lenient"].shape == (2,)
    assert recomb_items(_tiny_model(w), got[:0])["strict"].numel() == 0


def test_additive_code_r2_one_for_additive_and_low_for_a_random_table():
    rng = np.random.default_rng(0)
    k, v, d = 2, 6, 5
    vals = np.array(list(itertools.product(range(v), repeat=k)))
    A = rng.normal(size=(k, v, d)) * 2.5
    y = 0.7 + A[0][vals[:, 0]] + A[1][vals[:, 1]]
    assert additive_code_r2(y, vals, v, 1e-9) == pytest.approx(1.0, abs=1e-6)
    table = rng.normal(size=(len(vals), d)) * 2.5
    r2 = additive_code_r2(table, vals, v, 1e-9)
    # brute force: least squares with an intercept on the same one-hot design
    X = np.zeros((len(vals), k * v))
    for c in range(k):
        X[np.arange(len(vals)), c * v + vals[:, c]] = 1
    X1 = np.hstack([np.ones((len(vals), 1)), X])
    beta, *_ = np.linalg.lstsq(X1, table, rcond=None)
    want = 1 - ((table - X1 @ beta) ** 2).sum() / ((table - table.mean(0)) ** 2).sum()
    assert r2 == pytest.approx(want, abs=1e-6) and r2 < 0.5


def test_encoder_block_is_the_official_one_gelu_and_xavier():
    import math

    from stages.clip_binding.models import Encoder
    torch.manual_seed(0)
    enc = Encoder(30, 16, 2, 1, 40, 12, 9)
    layer = enc.enc.layers[0]
    assert layer.activation is torch.nn.functional.gelu or "gelu" in str(layer.activation).lower()
    for name, p in enc.named_parameters():
        if p.dim() > 1:                                  # xavier_uniform_: U(-b, b), b = sqrt(6 / (fan_in + fan_out))
            fan_out, fan_in = p.shape[0], p.shape[1]
            b = math.sqrt(6.0 / (fan_in + fan_out))
            assert float(p.abs().max()) <= b + 1e-6 and float(p.abs().max()) > 0.8 * b, name
    torch.manual_seed(0)
    plain = Encoder(30, 16, 2, 1, 40, 12, 9, activation="relu", xavier_init=False)
    assert float(plain.tok.weight.abs().max()) > 2.0        # nn.Embedding's default N(0, 1), far outside xavier's bound


def test_additive_code_r2_is_the_ridge_fit_with_an_unpenalised_intercept_and_scale_free():
    rng = np.random.default_rng(1)
    k, v, d, alpha = 2, 4, 3, 3.0
    vals = np.array(list(itertools.product(range(v), repeat=k)))
    y = rng.normal(size=(len(vals), d)) * 0.002 + 0.05 * vals[:, :1]     # tiny variance: SST far below 1
    X = np.zeros((len(vals), k * v))
    for c in range(k):
        X[np.arange(len(vals)), c * v + vals[:, c]] = 1
    Xc, yc = X - X.mean(0), y - y.mean(0)                                # ridge, intercept not penalised
    beta = np.linalg.solve(Xc.T @ Xc + alpha * np.eye(k * v), Xc.T @ yc)
    pred = Xc @ beta + y.mean(0)
    want = 1 - ((y - pred) ** 2).sum() / ((y - y.mean(0)) ** 2).sum()
    assert additive_code_r2(y, vals, v, alpha) == pytest.approx(want, abs=1e-9)
    assert 0.05 < want < 0.95                                            # the penalty matters here
