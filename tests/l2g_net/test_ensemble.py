"""The seeds of a (task, model) as one vectorized ensemble (issue 55): every seed equals its solo run (same split,
initialization, dropout masks, AdamW steps) to float rounding, for every model kind; and the pieces that make it
possible: planned dropout (masks drawn outside the forward from a per-seed generator), the weighted train loss
(no boolean indexing), graph constants shared by the members, the sparse product's batching rule."""
from __future__ import annotations

import copy
import math

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from kernels.record import KernelRecord
from stages.common.jobs import run_jobs
from stages.l2g_net.model import (KINDS, GraphConstants, PlannedDropout, SparseOperator, _SpMM, build_model,
                                  draw_dropout_masks, dropout_generator, dropout_masks, dropout_sites, node_loss)
from stages.l2g_net.train import Config, _run_job, spectral_tensors

DIMS = {"l2g": 6, "l2g_exact": 6, "full_gft": 5, "chebnet": 4, "chebnet_long": 3, "gcn": 7, "gin": 7}


@pytest.fixture(scope="module")
def graph():
    """A 30-node graph of two communities with a few bridges; heterophilous labels; 5 features."""
    g = nx.stochastic_block_model([15, 15], [[0.4, 0.05], [0.05, 0.4]], seed=3)
    A = sp.csr_matrix(nx.to_scipy_sparse_array(g, nodelist=range(30), format="csr"), dtype=np.float64)
    rng = np.random.default_rng(1)
    return A, rng.normal(size=(30, 5)).astype(np.float32), rng.integers(0, 3, size=30)


def _runs(graph, tmp, kind, vectorize, classes=2, seeds=(3, 5, 8), dropout=0.3):
    A, x, y3 = graph
    y = (y3 > 0).astype(np.int64) if classes == 2 else y3
    cfg = Config.model_validate({"seeds": list(seeds), "dim": 6, "num_layers": 2, "num_basis": 5, "cheb_k": 3,
                                 "cheb_k_long": 5, "target_cut": 2, "partitioner": "spectral", "dropout": dropout,
                                 "lr": 0.02, "spectral_lr_mult": 3.0, "weight_decay": 0.01, "eval_every": 3,
                                 "vectorize_seeds": vectorize, "trainer": {"max_steps": 9}})
    spec, _ = spectral_tensors(cfg, A, KernelRecord(torch.device("cpu")), torch.device("cpu"))
    if classes > 2:         # the multi-class head: the stage builds it from the labels of a benchmark file
        import stages.l2g_net.train as train_mod
        real = train_mod.build_model
        train_mod.build_model = lambda *a, **k: real(*a, **k, num_targets=classes)
    try:
        groups = [tuple(seeds)] if vectorize else [(s,) for s in seeds]
        payload = {"t": {"cfg": cfg.model_dump(mode="json"), "spec": spec, "x": x, "y": y, "fixed": None,
                         "out": str(tmp), "device": "cpu"}}
        results = [r for rs in run_jobs(_run_job, [("t", kind, g, DIMS[kind]) for g in groups], payload, 1) for r in rs]
    finally:
        if classes > 2:
            train_mod.build_model = real
    states = {s: torch.load(tmp / f"{kind}_seed{s}.pt") for s in seeds}
    return results, states, spec


@pytest.mark.parametrize("kind, classes", [(k, 2) for k in KINDS] + [("l2g", 3), ("chebnet", 3)])
def test_ensemble_seed_equals_its_solo_run(graph, tmp_path, kind, classes):
    (tmp_path / "solo").mkdir()
    (tmp_path / "ens").mkdir()
    solo, solo_states, spec = _runs(graph, tmp_path / "solo", kind, False, classes)
    ens, ens_states, _ = _runs(graph, tmp_path / "ens", kind, True, classes)
    assert [r["seed"] for r in ens] == [r["seed"] for r in solo] == [3, 5, 8]
    for a, b in zip(solo, ens):
        assert a["params"] == b["params"] and a["dim"] == b["dim"]
        assert [h["step"] for h in a["history"]] == [h["step"] for h in b["history"]] == [3, 6, 9]
        np.testing.assert_allclose([h["train_bce"] for h in b["history"]], [h["train_bce"] for h in a["history"]],
                                   rtol=2e-5, atol=2e-6)
        np.testing.assert_allclose([h["val_auc"] for h in b["history"]], [h["val_auc"] for h in a["history"]],
                                   atol=1e-6)
        assert a["best_step"] == b["best_step"]
    for s in (3, 5, 8):
        sa, sb = solo_states[s], ens_states[s]
        assert list(sa) == list(sb)                  # the solo model's state_dict keys, in its order
        for name in sa:
            torch.testing.assert_close(sb[name], sa[name], rtol=1e-4, atol=1e-5, msg=f"seed {s} {name}")
    # the members differ from each other (their own inits, splits and masks), and the state loads into the model
    assert not torch.equal(ens_states[3]["inp.weight"], ens_states[5]["inp.weight"])
    model = build_model(kind, spec, in_features=5, dim=DIMS[kind], num_layers=2, num_basis=5, dropout=0.3, cheb_k=3,
                        cheb_k_long=5, num_targets=1 if classes == 2 else classes)
    model.load_state_dict(ens_states[8], strict=True)


def test_members_draw_their_own_dropout_masks(graph, tmp_path):
    """Dropout is on in training: a run with dropout 0 ends elsewhere, and two seeds' masks differ."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with_dropout, _, _ = _runs(graph, tmp_path / "a", "gcn", True)
    without, _, _ = _runs(graph, tmp_path / "b", "gcn", True, dropout=0.0)
    for a, b in zip(with_dropout, without):
        assert a["history"][-1]["train_bce"] != pytest.approx(b["history"][-1]["train_bce"], rel=1e-3)
    model = build_model("gcn", {"A": graph[0]}, in_features=5, dim=4, num_layers=2, num_basis=5, dropout=0.3, cheb_k=3)
    sites = dropout_sites(model)
    assert [n for n, _ in sites] == ["drop", "layers.0.module.ff.net.1", "layers.0.module.ff.net.4",
                                     "layers.1.module.ff.net.1", "layers.1.module.ff.net.4"]
    m3 = draw_dropout_masks(sites, 30, dropout_generator(3))
    m5 = draw_dropout_masks(sites, 30, dropout_generator(5))
    assert all(not torch.equal(m3[k], m5[k]) for k in m3)
    again = draw_dropout_masks(sites, 30, dropout_generator(3))
    assert all(torch.equal(m3[k], again[k]) for k in m3)


@pytest.mark.parametrize("kind", ["l2g", "chebnet", "gin"])
def test_one_step_member_gradients_are_the_solo_gradients(graph, kind):
    """The ensemble's training loss is the SUM of the member losses, so member k's gradient is exactly seed k's solo
    gradient (a mean would divide it by S, which AdamW's scale invariance hides from the trajectories)."""
    from stages.l2g_net.model import NodeTask, NodeTaskEnsemble
    from stages.l2g_net.train import node_split
    A, x, y3 = graph
    y = torch.as_tensor((y3 > 0).astype(np.int64))
    x = torch.as_tensor(x)
    cfg = Config.model_validate({"target_cut": 2, "partitioner": "spectral", "num_basis": 5})
    spec, _ = spectral_tensors(cfg, A, KernelRecord(torch.device("cpu")), torch.device("cpu"))
    make = lambda seed: build_model(kind, spec, in_features=5, dim=DIMS[kind], num_layers=2, num_basis=5,  # noqa: E731
                                    dropout=0.3, cheb_k=3, cheb_k_long=5)
    seeds = [3, 5, 8]
    splits = [node_split(30, s, 0.5, 0.25) for s in seeds]
    masks = {k: torch.as_tensor(np.stack([sp_[k] for sp_ in splits])) for k in ("train", "val", "test")}
    hp = dict(lr=0.01, weight_decay=0.0, spectral_lr_mult=2.0, eval_every=1)
    ens = NodeTaskEnsemble(make, seeds, x, y, masks, **hp)
    ens.training_step(None, 0).backward()
    for k, seed in enumerate(seeds):
        torch.manual_seed(seed)
        solo = NodeTask(make(seed), x, y, {n: torch.as_tensor(v) for n, v in splits[k].items()}, dropout_seed=seed,
                        **hp)
        solo.training_step(None, 0).backward()
        for name, p in solo.model.named_parameters():
            torch.testing.assert_close(ens.ensemble.stacked.get_parameter(name).grad[k], p.grad, rtol=1e-4,
                                       atol=1e-6, msg=f"{kind} seed {seed} {name}")


def test_planned_dropout_masks_are_inverted_bernoulli():
    p = 0.35
    site = PlannedDropout(p, 40)
    masks = draw_dropout_masks([("d", site)], 500, dropout_generator(11))
    m = masks["d"]
    assert m.shape == (500, 40) and m.dtype == torch.float32
    assert torch.unique(m).tolist() == [0.0, pytest.approx(1 / (1 - p), rel=1e-6)]
    kept = float((m > 0).float().mean())
    assert abs(kept - (1 - p)) < 4 * math.sqrt(p * (1 - p) / m.numel())      # 4 sigma of Binomial(20000, 0.65)
    # consecutive draws move the generator: the next step's masks differ
    g = dropout_generator(11)
    first, second = draw_dropout_masks([("d", site)], 50, g), draw_dropout_masks([("d", site)], 50, g)
    assert not torch.equal(first["d"], second["d"])


def test_dropout_generator_is_not_the_init_stream():
    """The masks' generator is a stream of its own: not torch's global RNG after manual_seed(seed)."""
    torch.manual_seed(4)
    init_draw = torch.rand(20).numpy()
    mask_draw = dropout_generator(4).random(20, dtype=np.float32)
    assert not np.allclose(init_draw, mask_draw)
    assert np.array_equal(mask_draw, dropout_generator(4).random(20, dtype=np.float32))
    assert not np.array_equal(mask_draw, np.random.default_rng(4).random(20, dtype=np.float32))   # not seed alone


def test_planned_dropout_forward():
    x = torch.randn(6, 3) * 2.5 + 0.7
    d = PlannedDropout(0.4, 3)
    mask = torch.tensor([[0.0, 1 / 0.6, 1 / 0.6]] * 6)
    with dropout_masks(d, {"": mask}):
        torch.testing.assert_close(d(x), x * mask)
    assert d.mask is None                                           # handed back after the forward
    d.eval()
    with dropout_masks(d, {"": mask}):
        assert torch.equal(d(x), x)                                 # eval: identity, the mask is not used
    d.train()
    torch.manual_seed(0)
    free = d(torch.ones(200, 3))                                    # no mask handed in: F.dropout, global RNG
    assert torch.unique(free).tolist() == [0.0, pytest.approx(1 / 0.6, rel=1e-6)]
    assert 0.2 < float((free == 0).float().mean()) < 0.6
    assert torch.equal(PlannedDropout(0.0, 3)(x), x)               # p = 0: identity, and no site to draw
    assert dropout_sites(PlannedDropout(0.0, 3)) == []
    with pytest.raises(ValueError, match=r"dropout: expected a probability in \[0, 1\) \(got 1.0\)"):
        PlannedDropout(1.0, 3)


def test_dropout_masks_name_the_sites_and_reset_on_error():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), PlannedDropout(0.5, 3), PlannedDropout(0.2, 3))
    with pytest.raises(ValueError, match=r"expected one per site \['1', '2'\] \(got \['1'\]\)"):
        dropout_masks(model, {"1": torch.ones(2, 3)})
    with pytest.raises(RuntimeError, match="boom"):
        with dropout_masks(model, {"1": torch.ones(2, 3), "2": torch.ones(2, 3)}):
            assert model[1].mask is not None and model[2].mask is not None
            raise RuntimeError("boom")
    assert model[1].mask is None and model[2].mask is None


@pytest.mark.parametrize("classes", [2, 4])
def test_node_loss_is_the_mean_over_train_nodes(classes):
    """Against the loss written out by hand (log-sigmoid / log-softmax) on the selected nodes only."""
    g = torch.Generator().manual_seed(2)
    n = 9
    weight = torch.tensor([1, 0, 1, 1, 0, 0, 1, 0, 1], dtype=torch.bool)
    if classes == 2:
        logits = torch.randn(n, generator=g) * 3.0
        y = torch.randint(0, 2, (n,), generator=g)
        z, t = logits.double(), y.double()
        per = -(t * torch.log(torch.sigmoid(z)) + (1 - t) * torch.log(1 - torch.sigmoid(z)))
    else:
        logits = torch.randn(n, classes, generator=g) * 1.7
        y = torch.randint(0, classes, (n,), generator=g)
        per = -torch.log_softmax(logits.double(), -1)[torch.arange(n), y]
    want = float(per[weight].sum() / weight.sum())
    assert float(node_loss(logits, y, weight)) == pytest.approx(want, rel=1e-6)
    assert float(node_loss(logits, y, weight.float())) == pytest.approx(want, rel=1e-6)


def test_sparse_product_batches_the_members_columns():
    """Under vmap the members' (n, f) inputs go through one CSR product; values and gradients against a dense
    matmul per member, for inputs batched along dim 0 and along dim 1; a batched operator is refused."""
    rng = np.random.default_rng(5)
    M = sp.random(11, 11, density=0.3, random_state=rng) * 1.9
    op = SparseOperator(M)
    D = torch.tensor(M.toarray(), dtype=torch.float32)
    x = torch.randn(4, 11, 3, requires_grad=True)
    calls = []
    real_apply = _SpMM.apply

    def counting(*a):
        calls.append(tuple(a[2].shape))
        return real_apply(*a)

    _SpMM.apply = counting
    try:
        y = torch.func.vmap(op)(x)
        yt = torch.func.vmap(op, in_dims=1, out_dims=1)(x.transpose(0, 1))
    finally:
        _SpMM.apply = real_apply
    assert calls == [(11, 3), (11, 12)] * 2      # each member's (n, f) call becomes one (n, B*f) product
    want = torch.einsum("ij,bjf->bif", D, x)
    torch.testing.assert_close(y, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(yt.transpose(0, 1), want, atol=1e-5, rtol=1e-5)
    w = torch.randn(4, 11, 3)
    (grad,) = torch.autograd.grad((y * w).sum(), x)
    (want_grad,) = torch.autograd.grad((want * w).sum(), x)
    torch.testing.assert_close(grad, want_grad, atol=1e-5, rtol=1e-5)
    S, ST = op.const("S", x), op.const("ST", x)
    with pytest.raises(ValueError, match="shared by every member"):
        _SpMM.vmap(None, (0, None, 0), S, ST, x)
    with pytest.raises(ValueError, match="shared by every member"):
        _SpMM.vmap(None, (None, 0, 0), S, ST, x)


def test_graph_constants_follow_the_input_and_are_shared():
    class Holder(GraphConstants):
        def __init__(self):
            super().__init__()
            self.set_const("U", torch.tensor([[1.5, -2.0], [0.25, 3.0]]))
            self.set_const("idx", torch.tensor([1, 0]))
            self.w = torch.nn.Parameter(torch.ones(2))

    h = Holder()
    x32, x64 = torch.ones(2), torch.ones(2, dtype=torch.float64)
    assert h.const("U", x32) is h._graph["U"]                       # same device and dtype: the tensor itself
    u64 = h.const("U", x64)
    assert u64.dtype == torch.float64 and torch.equal(u64, h._graph["U"].double())
    assert h.const("U", x64) is u64                                 # converted once
    assert h.const("idx", x64).dtype == torch.long                 # index tensors keep their dtype
    assert set(h.state_dict()) == {"w"} and dict(h.named_buffers()) == {}
    twin = copy.deepcopy(h)
    assert twin.const("U", x32) is h.const("U", x32)               # shared, not copied
    assert twin.w is not h.w and twin._graph_cache == {}
    fresh = Holder()
    with torch.inference_mode():                                    # first conversion under inference_mode ...
        fresh.const("U", x64)
    w = torch.ones(2, dtype=torch.float64, requires_grad=True)
    (fresh.const("U", x64) @ w).sum().backward()                    # ... still usable by training afterwards
    torch.testing.assert_close(w.grad, torch.tensor([1.75, 1.0], dtype=torch.float64))
    h.set_const("U", torch.zeros(2, 2))                             # replacing a constant drops its conversions
    assert torch.equal(h.const("U", x64), torch.zeros(2, 2, dtype=torch.float64))
    assert twin.const("U", x32)[0, 0] == 1.5                       # the twin keeps the tensor it shared


def test_ensemble_refuses_masks_of_another_shape():
    from stages.l2g_net.model import NodeTaskEnsemble
    A = sp.csr_matrix(nx.to_scipy_sparse_array(nx.path_graph(6), format="csr"), dtype=np.float64)
    make = lambda seed: build_model("gcn", {"A": A}, in_features=2, dim=3, num_layers=1, num_basis=5,  # noqa: E731
                                    dropout=0.1, cheb_k=3)
    good = torch.ones(2, 6, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"masks\['val'\]: expected one row per seed, shape \(2, 6\); got \(6,\)"):
        NodeTaskEnsemble(make, [0, 1], torch.ones(6, 2), torch.zeros(6, dtype=torch.long),
                         {"train": good, "val": torch.ones(6, dtype=torch.bool)}, lr=0.01, weight_decay=0.0,
                         spectral_lr_mult=1.0, eval_every=1)


def test_solo_job_takes_one_seed(graph, tmp_path):
    A, x, y = graph
    cfg = Config.model_validate({"seeds": [0, 1], "dim": 4, "num_layers": 1, "vectorize_seeds": False,
                                 "partitioner": "spectral", "trainer": {"max_steps": 2}})
    payload = {"t": {"cfg": cfg.model_dump(mode="json"), "spec": {"A": A}, "x": x, "y": (y > 0).astype(np.int64),
                     "fixed": None, "out": str(tmp_path), "device": "cpu"}}
    with pytest.raises(ValueError, match=r"a solo job trains one seed \(got \[0, 1\]\)"):
        run_jobs(_run_job, [("t", "gcn", (0, 1), 4)], payload, 1)


def test_default_profile_vectorizes_the_seeds():
    from stages.common.runner import load_config
    cfg = load_config("l2g_net", "train", "default")[1]
    assert cfg.vectorize_seeds is True and len(cfg.seeds) >= 3
