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
from stages.clip_binding.evaluate import recomb_items
from stages.clip_binding.models import recombination_accuracy, recombinations
from stages.clip_binding.scenes import World


@pytest.mark.parametrize("k,v", [(2, 4), (3, 3)])
def test_recombinations_by_enumeration(k, v):
    w = World(k, v, 2)
    g = torch.Generator().manual_seed(k * 10 + v)
    o1, o2 = torch.randint(0, w.n_objects, (20,), generator=g), torch.randint(0, w.n_objects, (20,), generator=g)
    got = recombinations(w, o1, o2)
    assert got.shape == (20, 2 ** k - 2)
    for b in range(20):
        a, c = w.concepts(o1[b]).tolist(), w.concepts(o2[b]).tolist()
        want = set()
        for pick in itertools.product((0, 1), repeat=k):
            if len(set(pick)) == 1:
                continue                               # all from o1 or all from o2: the positives
            vals = [a[i] if p == 0 else c[i] for i, p in enumerate(pick)]
            want.add(sum(x * v ** (k - 1 - i) for i, x in enumerate(vals)))
        assert set(got[b].tolist()) == want


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
    w = World(2, 5, 2)
    model = _tiny_model(w)
    objs = _all_differ_pairs(w, 40, 1)
    got = recombination_accuracy(model, objs)
    with torch.no_grad():
        for b in range(len(objs)):
            x = model.embed_scenes(objs[b:b + 1], torch.tensor([2]))[0]
            (a1, b1), (a2, b2) = w.concepts(objs[b]).tolist()
            negs = [a1 * 5 + b2, a2 * 5 + b1]
            cos = lambda o: float(torch.nn.functional.cosine_similarity(   # noqa: E731
                x, model.embed_objects(torch.tensor([o]))[0], dim=0))
            want = min(cos(int(objs[b, 0])), cos(int(objs[b, 1]))) > max(cos(o) for o in negs)
            assert bool(got[b]) == want


def test_a_perfect_binder_passes_and_a_bag_of_concepts_code_fails():
    w = World(2, 4, 2)
    model = _tiny_model(w)
    objs = _all_differ_pairs(w, 30, 2)
    # perfect binder: each object's probe is a one-hot of its id, the scene embeds the sum of its objects'
    eye = torch.eye(w.n_objects)
    model.embed_scenes = lambda o, n: eye[o[:, 0]] + eye[o[:, 1]]
    model.embed_queries = lambda o: (None, eye[o])
    assert recombination_accuracy(model, objs).all()
    # bag of concepts: scene = sum of concept one-hots, probe = its concept one-hots (exactly additive, equal norms)
    def bag(o):
        vals = w.concepts(o)
        return torch.nn.functional.one_hot(w.concept_tokens(vals), w.n_concept_tokens).sum(-2).float()
    model.embed_scenes = lambda o, n: bag(o[:, 0]) + bag(o[:, 1])
    model.embed_queries = lambda o: (None, bag(o))
    assert not recombination_accuracy(model, objs).any()


def test_recombination_accuracy_refuses_scenes_sharing_a_concept():
    w = World(2, 4, 2)
    with pytest.raises(ValueError, match="differ in every concept"):
        recombination_accuracy(_tiny_model(w), torch.tensor([[0, 1]]))    # (0,0) and (0,1) share concept 1


def test_recomb_items_picks_two_object_all_differ_scenes():
    w = World(2, 4, 2)
    model = _tiny_model(w)
    objs = torch.tensor([[0, 5], [0, 1], [5, 10], [3, 3], [0, 5]])    # 0=(0,0) 5=(1,1) 1=(0,1) 10=(2,2) 3=(0,3)
    n = torch.tensor([2, 2, 2, 2, 1])
    assert recomb_items(w, model, objs, n).numel() == 2            # rows 0 and 2 only
    assert recomb_items(World(2, 4, 1), model, objs[:, :1], torch.ones(5, dtype=torch.long)).numel() == 0


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
