"""stages/clip_binding/complexity.py against independent references (mutation-tested, see mutation.json).

Every expected value comes from plain loops, numpy least squares / closed-form ridge, sklearn's r2_score
or hand-worked numbers, never from the module itself. No training loops: the regressor bank's
methods (init, slots, predict, training_step, optimizer) are checked one call at a time."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from sklearn.metrics import r2_score as sk_r2

from stages.clip_binding.complexity import FAMILIES, RegressorBank, additivity_r2, pair_ids, r2_score
from stages.clip_binding.scenes import World

# ---------------------------------------------------------------- r2_score


def test_r2_matches_sklearn_variance_weighted():
    """With mean_all = the mean of y, 1 − ΣSSE/ΣSST over all outputs is sklearn's variance-weighted R²."""
    rng = np.random.default_rng(1)
    y = rng.normal(size=(3, 7, 4)) * np.array([1.0, 3.0, 0.5, 2.0])
    pred = y + rng.normal(size=y.shape) * 0.7
    got = r2_score(torch.tensor(y), torch.tensor(pred), torch.tensor(y.mean(1, keepdims=True)))
    assert got.shape == (3,)
    for e in range(3):
        assert float(got[e]) == pytest.approx(sk_r2(y[e], pred[e], multioutput="variance_weighted"), abs=1e-12)


def test_r2_uses_the_given_mean_not_the_sample_mean():
    # y = [[1], [3]], pred = [[2], [2]], mean_all = 0:  SSE = 1 + 1 = 2, SST = 1 + 9 = 10 -> 1 - 0.2 = 0.8
    y = torch.tensor([[[1.0], [3.0]]], dtype=torch.float64)
    pred = torch.tensor([[[2.0], [2.0]]], dtype=torch.float64)
    assert float(r2_score(y, pred, torch.zeros(1, 1, 1, dtype=torch.float64))[0]) == pytest.approx(0.8, abs=1e-12)
    # two outputs, mean_all = (1, -1): y = [[2, 0], [0, -3]], pred = [[2, 1], [1, -3]]
    # SSE = 0 + 1 + 1 + 0 = 2;  SST = 1 + 1 + 1 + 4 = 7  ->  1 - 2/7
    y = torch.tensor([[[2.0, 0.0], [0.0, -3.0]]], dtype=torch.float64)
    pred = torch.tensor([[[2.0, 1.0], [1.0, -3.0]]], dtype=torch.float64)
    m = torch.tensor([[[1.0, -1.0]]], dtype=torch.float64)
    assert float(r2_score(y, pred, m)[0]) == pytest.approx(1 - 2 / 7, abs=1e-12)


def test_r2_constant_target_uses_the_1e_minus_12_floor():
    y = torch.zeros(1, 2, 3, dtype=torch.float64)
    assert float(r2_score(y, y.clone(), torch.zeros(1, 1, 3, dtype=torch.float64))[0]) == 1.0   # 0/1e-12, no NaN
    pred = torch.full((1, 2, 3), 1e-6, dtype=torch.float64)          # SSE = 6e-12 -> 1 - 6e-12/1e-12 = -5
    assert float(r2_score(y, pred, torch.zeros(1, 1, 3, dtype=torch.float64))[0]) == pytest.approx(-5.0, rel=1e-9)


# ---------------------------------------------------------------- pair_ids


@pytest.mark.parametrize("k,v", [(2, 3), (3, 2)])
def test_pair_ids_by_enumeration(k, v):
    w = World(k=k, v=v, n_max=2)
    objs = list(itertools.product(range(v), repeat=k))            # object id = its index in this order
    a, b = (t.reshape(-1) for t in torch.meshgrid(torch.arange(len(objs)), torch.arange(len(objs)), indexing="ij"))
    ids = pair_ids(w, a, b)
    assert ids.shape == (len(objs) ** 2, 2 * k)
    for i, (ia, ib) in enumerate(itertools.product(range(len(objs)), repeat=2)):
        assert ids[i].tolist() == list(objs[ia]) + list(objs[ib])


def test_pair_ids_batched_leading_dims():
    w = World(k=2, v=4, n_max=2)
    a = torch.tensor([[5, 0], [15, 9]])          # 5 = (1,1), 0 = (0,0), 15 = (3,3), 9 = (2,1)
    b = torch.tensor([[2, 12], [4, 7]])          # 2 = (0,2), 12 = (3,0), 4 = (1,0), 7 = (1,3)
    assert pair_ids(w, a, b).tolist() == [[[1, 1, 0, 2], [0, 0, 3, 0]], [[3, 3, 1, 0], [2, 1, 1, 3]]]


# ---------------------------------------------------------------- additivity_r2


def _grid(n):
    a, b = (x.reshape(-1) for x in np.meshgrid(np.arange(n), np.arange(n), indexing="ij"))
    return a, b


def _lstsq_r2(y, a, b, n, test):
    """Unregularised additive fit by numpy least squares (min-norm; its predictions are unique here)."""
    X = np.zeros((len(a), 1 + 2 * n))
    X[:, 0] = 1.0
    X[np.arange(len(a)), 1 + a] = 1.0
    X[np.arange(len(a)), 1 + n + b] = 1.0
    coef = np.linalg.lstsq(X[~test], y[~test], rcond=None)[0]
    pred = X[test] @ coef
    return 1 - ((y[test] - pred) ** 2).sum() / ((y[test] - y.mean(0)) ** 2).sum(), pred


def _ridge_pred(y, a, b, n, test, alpha):
    """Closed-form ridge with an unpenalised intercept: centre X, y on the training rows."""
    X = np.zeros((len(a), 2 * n))
    X[np.arange(len(a)), a] = 1.0
    X[np.arange(len(a)), n + b] = 1.0
    Xt, yt = X[~test], y[~test]
    xm, ym = Xt.mean(0), yt.mean(0)
    W = np.linalg.solve((Xt - xm).T @ (Xt - xm) + alpha * np.eye(2 * n), (Xt - xm).T @ (yt - ym))
    return (X[test] - xm) @ W + ym


def test_additivity_exactly_additive_is_one():
    rng = np.random.default_rng(3)
    n = 7
    a, b = _grid(n)
    A1, A2 = rng.normal(size=(n, 3)) * 2.5, rng.normal(size=(n, 3)) * 0.4
    test = rng.random(len(a)) < 0.3
    y = -1.5 + A1[a] + A2[b]
    assert additivity_r2(y, a, b, n, test, 1e-9) == pytest.approx(1.0, abs=1e-9)


def test_additivity_matches_least_squares_on_non_additive_data():
    rng = np.random.default_rng(4)
    n = 6
    a, b = _grid(n)
    A1, A2 = rng.normal(size=(n, 2)), rng.normal(size=(n, 2)) * 3.0
    y = 0.7 + A1[a] + A2[b] + 0.8 * A1[a] * A2[b] + np.array([0.0, 4.0])   # additive + an interaction
    test = rng.random(len(a)) < 0.25
    want, _ = _lstsq_r2(y, a, b, n, test)
    assert 0.0 < want < 0.99
    assert additivity_r2(y, a, b, n, test, 1e-9) == pytest.approx(want, abs=1e-6)


def test_additivity_pure_interaction_on_unseen_objects_is_exactly_zero():
    """y(a, b) = u[a]·v[b] with u, v zero-mean over the seen objects AND over all objects: the additive
    fit learns nothing (every seen main effect is 0), unseen objects get the intercept 0, and the SST
    is about the all-scene mean 0 -> R² = 1 − Σy²/Σy² = 0 exactly."""
    u = np.array([1.0, -2.0, 1.0, 3.0, -3.0])        # seen 0..2 sum 0; all sum 0
    v = np.array([2.0, 2.0, -4.0, 1.5, -1.5])
    a, b = _grid(5)
    y = (u[a] * v[b])[:, None]
    test = (a >= 3) & (b >= 3)
    train = (a < 3) & (b < 3)
    keep = test | train
    assert additivity_r2(y[keep], a[keep], b[keep], 5, test[keep], 0.5) == pytest.approx(0.0, abs=1e-12)


def test_additivity_alpha_is_the_ridge_penalty():
    rng = np.random.default_rng(5)
    n = 5
    a, b = _grid(n)
    y = rng.normal(size=(len(a), 3)) + rng.normal(size=(n, 3))[a] * 2.0
    test = rng.random(len(a)) < 0.3
    for alpha in (0.3, 4.0):
        pred = _ridge_pred(y, a, b, n, test, alpha)
        want = 1 - ((y[test] - pred) ** 2).sum() / ((y[test] - y.mean(0)) ** 2).sum()
        assert additivity_r2(y, a, b, n, test, alpha) == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_additivity_zero_sst_uses_the_1e_minus_12_floor():
    """Held-out scenes all equal the all-scene mean (SST = 0) but the fit mispredicts them:
    R² = 1 − SSE / 1e-12, SSE from the closed-form ridge."""
    # objects 0, 1, 2; training pairs among {0, 1} carry a main effect of a; every test pair has y = 0
    a = np.array([0, 0, 1, 1, 0, 2, 1, 2])
    b = np.array([0, 1, 0, 1, 2, 0, 2, 2])
    y = np.array([1.0, 1.0, -1.0, -1.0, 0.0, 0.0, 0.0, 0.0])[:, None]   # mean 0 = every test y
    test = np.array([False] * 4 + [True] * 4)
    alpha = 0.2
    pred = _ridge_pred(y, a, b, 3, test, alpha)
    sse = ((y[test] - pred) ** 2).sum()
    assert sse > 1e-3
    assert additivity_r2(y, a, b, 3, test, alpha) == pytest.approx(1 - sse / 1e-12, rel=1e-6)


# ---------------------------------------------------------------- RegressorBank (no training loop)

E, S, V, D, HID, MLP = 2, 4, 3, 5, 3, 6


def _bank(seed=7, test=None, eval_every=None, n=9, lr=0.02):
    """eval_every=None: the constructor's default is used (not passed)."""
    g = torch.Generator().manual_seed(100 + seed)
    ids = torch.randint(0, V, (E, n, S), generator=g)
    y = torch.randn(E, n, D, generator=g, dtype=torch.float32) * 1.7 + 0.3
    extra = {} if eval_every is None else {"eval_every": eval_every}
    return RegressorBank(E, V, D, HID, MLP, lr, ids, y, seed=seed, test=test, **extra), ids, y


def _perturb_biases(bank):
    g = torch.Generator().manual_seed(99)
    with torch.no_grad():
        bank.b1.copy_(torch.randn(bank.b1.shape, generator=g))
        for f in FAMILIES:
            bank.out_b[f].copy_(torch.randn(bank.out_b[f].shape, generator=g))


def test_bank_init_draws_and_scales():
    """Init order (one generator seeded with `seed`): the 4 slot tables N(0,1), W1 · (S·h)^-1/2, then the 4
    output maps · fan_in^-1/2 with fan = mlp_hidden | h | 2h | 2h; biases 0; best R² = −inf; no losses yet."""
    bank, ids, y = _bank(seed=7)
    g = torch.Generator().manual_seed(7)
    for f in FAMILIES:
        assert torch.equal(bank.tables[f].data, torch.randn(E, S, V, HID, generator=g))
    assert torch.allclose(bank.w1.data, torch.randn(E, S * HID, MLP, generator=g) * (S * HID) ** -0.5)
    for f, fan in zip(FAMILIES, (MLP, HID, 2 * HID, 2 * HID), strict=True):
        assert torch.allclose(bank.out_w[f].data, torch.randn(E, fan, D, generator=g) * fan ** -0.5)
        assert torch.equal(bank.out_b[f].data, torch.zeros(E, 1, D))
    assert torch.equal(bank.b1.data, torch.zeros(E, 1, MLP))
    assert torch.equal(bank.ids, ids) and torch.equal(bank.y, y)
    assert {"ids", "y"} <= {n for n, _ in bank.named_buffers()}
    assert bank.losses == [] and bank.eval_every == 50 and bank.test_data is None
    for f in FAMILIES:
        assert bank.best_r2[f].shape == (E,) and bool(torch.all(torch.isneginf(bank.best_r2[f])))
    assert set(bank.best_r2) == set(FAMILIES)
    # every parameter is trainable and a different seed draws different tables
    assert len(list(bank.parameters())) == 4 + 2 + 4 + 4
    assert not torch.equal(_bank(seed=8)[0].tables["mlp"].data, bank.tables["mlp"].data)


def test_bank_slots_and_predict_by_loops():
    bank, ids, _ = _bank(seed=3)
    _perturb_biases(bank)
    q = torch.tensor([[[0, 1, 2, 0], [2, 2, 1, 1], [1, 0, 0, 2]], [[2, 0, 1, 1], [0, 0, 0, 0], [1, 2, 2, 0]]])
    tab = {f: bank.tables[f].detach().numpy().astype(np.float64) for f in FAMILIES}
    w1, b1 = bank.w1.detach().numpy().astype(np.float64), bank.b1.detach().numpy().astype(np.float64)
    with torch.no_grad():
        z = bank.slots("mult", q)
        assert z.shape == (E, 3, S, HID)
        for e, i, s in itertools.product(range(E), range(3), range(S)):
            assert torch.equal(z[e, i, s], bank.tables["mult"][e, s, q[e, i, s]])
        got = {f: bank.predict(f, q).numpy() for f in FAMILIES}
    for f in FAMILIES:
        W, c = bank.out_w[f].detach().numpy().astype(np.float64), bank.out_b[f].detach().numpy().astype(np.float64)
        for e, i in itertools.product(range(E), range(3)):
            zs = [tab[f][e, s, q[e, i, s]] for s in range(S)]
            if f == "mlp":
                hid = np.maximum(np.concatenate(zs) @ w1[e] + b1[e, 0], 0.0)
            elif f == "mult":
                hid = zs[0] * zs[1] * zs[2] * zs[3]
            elif f == "sum_mult":
                hid = np.concatenate([zs[0] * zs[1] * zs[2] * zs[3], zs[0] + zs[1] + zs[2] + zs[3]])
            else:   # mult_within: slots 0,1 are object a's concepts, 2,3 object b's
                assert f == "mult_within"
                hid = np.concatenate([zs[0] * zs[1], zs[2] * zs[3]])
            np.testing.assert_allclose(got[f][e, i], hid @ W[e] + c[e, 0], rtol=1e-5, atol=1e-5)
    # the ReLU matters: some hidden units are negative before it
    pre = torch.bmm(bank.slots("mlp", q).flatten(2), bank.w1) + bank.b1
    assert bool((pre < 0).any()) and bool((pre > 0).any())


def test_training_step_loss_and_logging_schedule():
    bank, ids, y = _bank(seed=5)
    _perturb_biases(bank)
    with torch.no_grad():
        preds = {f: bank.predict(f, ids).double().numpy() for f in FAMILIES}
    yy = y.double().numpy()
    # Σ_families Σ_encoders mean over (scenes, outputs) of the squared error
    want = sum(((preds[f][e] - yy[e]) ** 2).mean() for f in FAMILIES for e in range(E))
    loss = bank.training_step(None, 0)
    assert float(loss.detach()) == pytest.approx(want, rel=1e-5)
    assert bank.losses == [pytest.approx(want, rel=1e-5)]
    for i, logged in [(1, 1), (49, 1), (50, 2), (51, 2), (99, 2), (100, 3)]:
        bank.training_step(None, i)      # batch 49 does not evaluate: no test data
        assert len(bank.losses) == logged, i


def test_training_step_keeps_best_test_r2_every_eval_every():
    g = torch.Generator().manual_seed(1)
    t_ids = torch.randint(0, V, (E, 6, S), generator=g)
    t_y = torch.randn(E, 6, D, generator=g) * 2.0
    mean_all = torch.randn(E, 1, D, generator=g) * 0.5
    bank, _, _ = _bank(seed=2, test=(t_ids, t_y, mean_all), eval_every=3)

    def r2_by_hand(f):
        with torch.no_grad():
            p = bank.predict(f, t_ids).double().numpy()
        ty, m = t_y.double().numpy(), mean_all.double().numpy()
        return np.array([1 - ((ty[e] - p[e]) ** 2).sum() / ((ty[e] - m[e]) ** 2).sum() for e in range(E)])

    for i in (0, 1, 3, 4):                            # (i + 1) % 3 != 0: no evaluation
        bank.training_step(None, i)
        assert all(bool(torch.all(torch.isneginf(bank.best_r2[f]))) for f in FAMILIES), i
    first = {f: r2_by_hand(f) for f in FAMILIES}
    bank.training_step(None, 2)
    for f in FAMILIES:
        np.testing.assert_allclose(bank.best_r2[f].numpy(), first[f], rtol=1e-5)
        assert bank.best_r2[f].device.type == "cpu"
    # make encoder 0 better (exact targets via the biases) and encoder 1 worse: best is elementwise max
    with torch.no_grad():
        for f in FAMILIES:
            p = bank.predict(f, t_ids)
            bank.out_b[f][0] += (t_y[0] - p[0]).mean(0, keepdim=True)
            bank.out_b[f][1] += 50.0
    second = {f: r2_by_hand(f) for f in FAMILIES}
    assert all(second[f][0] > first[f][0] and second[f][1] < first[f][1] for f in FAMILIES)
    bank.training_step(None, 5)
    for f in FAMILIES:
        np.testing.assert_allclose(bank.best_r2[f].numpy(), np.maximum(first[f], second[f]), rtol=1e-5)


def test_default_eval_every_is_50():
    g = torch.Generator().manual_seed(2)
    test = (torch.randint(0, V, (E, 4, S), generator=g), torch.randn(E, 4, D, generator=g), torch.zeros(E, 1, D))
    bank, ids, y = _bank(seed=1, test=test)
    bank.training_step(None, 48)
    assert bool(torch.isneginf(bank.best_r2["mult"]).all())
    bank.training_step(None, 49)
    assert bool(torch.isfinite(bank.best_r2["mult"]).all())


def test_optimizer_is_adam_over_every_parameter_with_lr():
    bank, _, _ = _bank(lr=0.037)
    opt = bank.configure_optimizers()
    assert isinstance(opt, torch.optim.Adam)
    assert opt.param_groups[0]["lr"] == 0.037
    assert {id(p) for p in opt.param_groups[0]["params"]} == {id(p) for p in bank.parameters()}
