"""The heterophilous-benchmark `.npz` loader (roman-empire, amazon-ratings, minesweeper, tolokers, questions) on
small fixtures in the published schema, the L2G factorization and L2G-Net on them, and the prepare stage
reading one (issue 42). Nothing is downloaded: the fixtures are written here."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import torch

from stages.common.runner import MissingInputError
from stages.l2g_net.gft import bisection_parts, factorize
from stages.l2g_net.heterophilous import HeterophilousFormatError, load_heterophilous_npz, write_heterophilous_npz
from stages.l2g_net.train import Config as TrainConfig
from stages.l2g_net.train import node_split, spectral_tensors, task_laplacian


def _fixture(path, classes: int = 2, n: int = 44, splits: int = 10, seed: int = 0):
    """Two dense communities joined by a few edges; labels heterophilous; 10 fixed 50/25/25 splits. The edge
    list holds each edge once in one direction, plus a duplicate and a self-loop (the loader must drop them)."""
    rng = np.random.default_rng(seed)
    half = n // 2
    edges = [(u, v) for u in range(n) for v in range(u + 1, n)
             if (u < half) == (v < half) and rng.random() < 0.35]
    edges += [(int(rng.integers(half)), int(half + rng.integers(n - half))) for _ in range(5)]
    edges += [edges[0][::-1], (3, 3)]                               # duplicate (reversed) and self-loop
    y = rng.integers(classes, size=n)
    x = rng.normal(size=(n, 7)).astype(np.float32)
    masks = np.zeros((3, splits, n), bool)
    for s in range(splits):
        perm = rng.permutation(n)
        masks[0, s, perm[: n // 2]] = masks[1, s, perm[n // 2: 3 * n // 4]] = masks[2, s, perm[3 * n // 4:]] = True
    return write_heterophilous_npz(path, x, y, np.array(edges), *masks), len(set(map(tuple, map(sorted, edges[:-2]))))


@pytest.mark.real_source
def test_heterophilous_fixture_factorization_and_l2g_net(tmp_path):
    path, m = _fixture(tmp_path / "minesweeper.npz")
    data = load_heterophilous_npz(path)
    A = data["adjacency"]
    assert data["name"] == "minesweeper" and data["metric"] == "roc_auc" and data["num_classes"] == 2
    assert A.shape == (44, 44) and (A != A.T).nnz == 0 and A.diagonal().sum() == 0 and A.nnz == 2 * m
    assert data["splits"]["train"].shape == (10, 44) and data["x"].dtype == np.float32
    # the L2G factorization of its normalized Laplacian: exact against dense eigh, cut sparsified or not
    L = task_laplacian(A, "normalized")
    parts, _ = bisection_parts(L, 2, method="spectral")
    lam = scipy.linalg.eigvalsh(L.toarray())
    np.testing.assert_allclose(factorize(L, parts).eigenvalues, lam, atol=1e-11)
    cfg = TrainConfig.model_validate({"seeds": [3, 12], "dim": 8, "num_layers": 1, "target_cut": 2,
                                      "partitioner": "spectral", "eval_every": 2, "trainer": {"max_steps": 6}})
    from kernels.record import KernelRecord

    spec, info = spectral_tensors(cfg, A, KernelRecord(torch.device("cpu")), torch.device("cpu"))
    assert info["exact_eig_err_vs_true_L"] < 1e-10 and info["eig_err_vs_sparsified"] < 1e-10
    assert info["exact_cut_edges"] >= info["cut_edges_kept"]
    # L2G-Net (sparsified and exact cut) trains on it through the pipeline's own run function, on split seed % 10
    from stages.common.jobs import run_jobs
    from stages.l2g_net.train import _run_job

    payload = {"fixture": {"cfg": cfg.model_dump(mode="json"), "spec": spec, "x": data["x"], "y": data["y"],
                           "fixed": data["splits"], "out": str(tmp_path), "device": "cpu"}}
    for kind in ("l2g", "l2g_exact"):
        r = run_jobs(_run_job, [("fixture", kind, (12,), 8)], payload, 1)[0][0]
        assert 0.0 <= r["best_val_auc"] <= 1.0 and (tmp_path / f"{kind}_seed12.pt").exists()
    masks = node_split(44, 12, 0.5, 0.25, data["splits"])
    assert all((masks[k] == data["splits"][k][2]).all() for k in masks)          # seed 12 -> split 2


@pytest.mark.real_source
def test_multiclass_fixture_trains_with_accuracy(tmp_path):
    """roman-empire / amazon-ratings are multi-class: the model emits one logit per class, scored by accuracy."""
    from stages.l2g_net.model import NodeTask, build_model
    from stages.common.trainer import TrainerConfig, make_trainer

    path, _ = _fixture(tmp_path / "roman_empire.npz", classes=3)
    data = load_heterophilous_npz(path)
    assert data["metric"] == "accuracy" and data["num_classes"] == 3
    L = task_laplacian(data["adjacency"], "normalized")
    f = factorize(L, bisection_parts(L, 2, method="spectral")[0])
    lam, U = scipy.linalg.eigh(L.toarray())
    spec = {"parts": f.parts, "local_bases": f.local_bases, "eigenvalues": f.eigenvalues, "chain": f.chain_matrix(),
            "local_eigenvalues": [f.local_eigenvalues[o:o + p.size] for o, p in zip(f.offsets, f.parts)],
            "U": U, "lam": lam, "A": data["adjacency"]}
    torch.manual_seed(0)
    model = build_model("l2g", spec, in_features=7, dim=8, num_layers=1, num_basis=6, dropout=0.0, cheb_k=3,
                        num_targets=3)
    masks = {k: torch.as_tensor(v[0]) for k, v in data["splits"].items()}
    task = NodeTask(model, torch.tensor(data["x"]), torch.tensor(data["y"]), masks, lr=0.01, weight_decay=0.0,
                    spectral_lr_mult=1.0, eval_every=1)
    make_trainer(TrainerConfig(max_steps=3, enable_progress_bar=False)).fit(
        task, torch.utils.data.DataLoader([0], batch_size=1))
    assert model(torch.tensor(data["x"])).shape == (44, 3)
    acc = [h["val_auc"] for h in task.history]
    assert len(acc) == 3 and all(a * 11 == pytest.approx(round(a * 11)) for a in acc)   # 11 val nodes: k/11


def test_prepare_reads_the_benchmark_file(tmp_path):
    from stages.l2g_net.prepare import _real_task

    path, m = _fixture(tmp_path / "tolokers.npz")
    out = tmp_path / "task"
    out.mkdir()
    info = _real_task(str(path), out)
    assert info["n"] == 44 and info["edges"] == m and info["splits"] == 10 and info["name"] == "tolokers"
    assert sorted(p.name for p in out.iterdir()) == ["adjacency.npz", "nodes.npz", "splits.npz"]
    bad, _ = _fixture(tmp_path / "amazon_ratings.npz", classes=5)
    with pytest.raises(MissingInputError, match="5 classes"):
        _real_task(str(bad), tmp_path)


def test_full_profile_without_the_file_fails_before_any_work(tmp_path):
    from stages.common.runner import run_pipeline

    with pytest.raises(MissingInputError, match=r"task\.source\.path: .*minesweeper\.npz: no such file"):
        run_pipeline("l2g_net", root=tmp_path, profile="full", stages=("prepare",))
    assert not any((tmp_path / "data").rglob("*.npz"))


@pytest.mark.parametrize("edit, match", [
    (lambda d: d.pop("val_masks"), "missing key 'val_masks'"),
    (lambda d: d.update(train_masks=d["train_masks"].astype(int)), "train_masks must be a boolean"),
    (lambda d: d.update(edges=np.array([[0, 99]])), "outside 0..43"),
    (lambda d: d.update(node_labels=-d["node_labels"] - 1), "non-negative"),
    (lambda d: d.update(test_masks=d["train_masks"]), "in two of train/val/test"),
    (lambda d: d.update(node_features=np.full((44, 2), np.nan)), "finite"),
])
def test_bad_files_name_the_key(tmp_path, edit, match):
    path, _ = _fixture(tmp_path / "x.npz")
    d = dict(np.load(path))
    edit(d)
    np.savez(path, **d)
    with pytest.raises(HeterophilousFormatError, match=match):
        load_heterophilous_npz(path)


def test_worker_processes_give_the_in_process_results(tmp_path, monkeypatch):
    """(task, model) jobs in a pool of worker processes equal the in-process runs (each run seeds itself).
    The stage spawns its workers; here they are forked (same code path, jobs and results still pickled) so the test
    does not pay two fresh interpreter imports. (The pool's fail-fast path — an error or SIGTERM kills the workers
    instead of running the queue — was checked by hand.)"""
    import multiprocessing

    real = multiprocessing.get_context
    monkeypatch.setattr(multiprocessing, "get_context", lambda method=None: real("fork"))
    from kernels.record import KernelRecord
    from stages.common.jobs import run_jobs
    from stages.l2g_net.train import _run_job

    path, _ = _fixture(tmp_path / "minesweeper.npz", n=30)
    data = load_heterophilous_npz(path)
    cfg = TrainConfig.model_validate({"seeds": [0], "dim": 6, "num_layers": 1, "target_cut": 2, "partitioner": "spectral",
                                      "eval_every": 1, "trainer": {"max_steps": 3}})
    spec, _ = spectral_tensors(cfg, data["adjacency"], KernelRecord(torch.device("cpu")), torch.device("cpu"))
    runs = {}
    for w in (1, 2):
        out = tmp_path / f"w{w}"
        out.mkdir()
        payload = {"t": {"cfg": cfg.model_dump(mode="json"), "spec": spec, "x": data["x"], "y": data["y"],
                         "fixed": data["splits"], "out": str(out), "device": "cpu"}}
        runs[w] = [r for rs in run_jobs(_run_job, [("t", "l2g", (4, 5), 6), ("t", "gcn", (7,), 9)], payload, w)
                   for r in rs]
    assert [r["seed"] for r in runs[1]] == [4, 5, 7]
    for a, b in zip(runs[1], runs[2]):
        assert a["history"] == b["history"] and a["best_val_auc"] == b["best_val_auc"]
    for name in ("l2g_seed4.pt", "gcn_seed7.pt"):
        sa, sb = torch.load(tmp_path / "w1" / name), torch.load(tmp_path / "w2" / name)
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
