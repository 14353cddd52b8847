"""The l2g_net pipeline end to end at the smoke profile, the model's modules, Minesweeper, config errors."""
from __future__ import annotations

import copy
import json

import networkx as nx
import numpy as np
import pytest
import scipy.linalg
import torch

from stages.common.config import ConfigError, validate
from stages.common.runner import load_config
from stages.l2g_net import evaluate, prepare, train
from stages.l2g_net.gft import factorize
from stages.l2g_net.graphs import edge_homophily, laplacian, minesweeper, sbm_blocks, source_parity
from stages.l2g_net.model import FullGFTModule, L2GModule, build_model, count_parameters, matched_dim

FINDINGS = ["exact", "scaling_exponent_ba", "faster_than_eigh_ba", "linear_in_cut", "l2g_beats_gcn",
            "l2g_beats_gin", "l2g_beats_chebnet", "l2g_beats_chebnet_long", "l2g_matches_full_gft",
            "parity_l2g_beats_chebnet", "parity_l2g_beats_chebnet_long", "parity_l2g_matches_full_gft"]
CHECKS = ["baselines_beat_chance", "parity_baselines_beat_chance", "parity_l2g_beats_gcn", "parity_l2g_beats_gin",
          "exact_cut_recovers_full_gft", "exact_cut_beats_sparsified", "parity_exact_cut_recovers_full_gft",
          "parity_exact_cut_beats_sparsified"]
MODELS = {"l2g", "l2g_exact", "full_gft", "chebnet", "chebnet_long", "gcn", "gin"}


def _tree_hash(folder) -> str:
    import hashlib

    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(folder)).encode() + f.read_bytes())
    return h.hexdigest()


def test_smoke_pipeline(smoke_run):
    out, hashes = {}, {}
    for stage in ("prepare", "train", "evaluate", "report"):   # no stage writes into an upstream output (issue 57)
        out.update(smoke_run("l2g_net", stages=(stage,)))
        for up, digest in hashes.items():
            assert _tree_hash(out[up]) == digest, f"{stage} modified {up}'s output"
        hashes[stage] = _tree_hash(out[stage])
    report = out["report"]
    metrics = json.loads((report / "metrics.json").read_text())
    assert set(metrics["runtime_s"]) == {"prepare", "train", "evaluate", "report"}
    assert [c["name"] for c in metrics["claims"]] == FINDINGS + CHECKS
    assert all(c["kind"] == ("finding" if c["name"] in FINDINGS else "check") for c in metrics["claims"])
    for claim in metrics["claims"]:
        assert claim["verdict"] in ("holds", "fails", "inconclusive") and claim["refuted_by"]
    # exactness does not depend on scale: it must hold even in the smoke run
    assert metrics["claims"][0]["verdict"] == "holds", metrics["claims"][0]
    k = metrics["kernels"]["cauchy_apply"]
    assert k["calls"] > 0 and k["parity_max_abs_err"] is not None and k["parity_max_abs_err"] < 1e-10
    for key in ("task", "parity"):
        task = metrics["metrics"][key]
        assert set(task["auc"]) == MODELS
        assert all(len(v) == 3 for v in task["auc"].values())
    wall = {c["name"] for c in metrics["claims"] if c.get("wallclock")}
    assert wall == {"scaling_exponent_ba", "faster_than_eigh_ba", "linear_in_cut"}
    assert metrics["metrics"]["scaling_partitioner"] in {"metis", "spectral"}
    gap = metrics["metrics"]["scaling"]["ba"]
    # the graphs are timed as jobs, largest first; rows come back in the manifest's order
    manifest = json.loads((out["prepare"] / "manifest.json").read_text())
    res = json.loads((out["evaluate"] / "results.json").read_text())
    assert [(r["family"], r["n"]) for r in res["scaling"]] == [(m["family"], m["n"]) for m in manifest["scaling"]]
    assert [r["bridges"] for r in res["scaling_k"]] == [m["bridges"] for m in manifest["scaling_k"]]
    assert res["timing_processes"] == 1 and all("kernel_calls" not in r for r in res["scaling_k"])
    assert gap["exponent_gap"] == pytest.approx(gap["eigh_exponent"] - gap["l2g_exponent"])
    # the exact-cut control: the chain of the true L, not of the sparsified graph
    for key in ("task_graph", "parity_graph"):
        g = metrics["metrics"][key]
        assert g["exact_eig_err_vs_true_L"] < 1e-10 and g["exact_cut_edges"] >= g["cut_edges_kept"]
    pdata = metrics["metrics"]["parity_data"]
    assert pdata["bipartite"] and pdata["label_is_colour_xor_source_colour"] == 1.0
    assert pdata["normalized_lambda_max"] == pytest.approx(2.0)
    for fig in ("scaling", "task", "parity"):
        assert (report / "figures" / f"{fig}.png").stat().st_size > 0
    specs = json.loads((report / "plots" / "_specs.json").read_text())
    for name, spec in specs.items():   # every DVC plot: numeric x, one column per series, finite values (issue 39)
        frame = __import__("polars").read_csv(report / "plots" / f"{name}.csv")
        assert frame.columns == [spec["x"], *spec["y"]] and frame.height > 0
    assert set(specs["val_curves"]["y"]) == MODELS
    text = (report / "report.md").read_text()
    assert "## Deviations" in text and "## Discussion" in text and "Partitioner fallback" in text
    assert "## Threats to validity" in text and "Structural favour, measured" in text
    assert "through the Triton kernel" not in text.split("## Kernel paths")[0]


def _spec(L, parts):
    f = factorize(L, parts)
    lam, U = scipy.linalg.eigh(L.toarray())
    return {"parts": f.parts, "local_bases": f.local_bases,
            "local_eigenvalues": [f.local_eigenvalues[o:o + p.size] for o, p in zip(f.offsets, f.parts)],
            "eigenvalues": f.eigenvalues, "chain": f.chain_matrix(), "U": U, "lam": lam}


def test_l2g_module_equals_full_gft_when_local_filters_are_off():
    """Core property of the model: the Cauchy chain gives the global spectrum exactly, so with the
    local banks switched off an L2G module computes the same function as the dense-GFT module
    (U r(Lambda) U^T is basis-independent even with repeated eigenvalues)."""
    L = laplacian(sbm_blocks(3, 12, 5.0, 4, seed=4))
    spec = _spec(L, [list(range(12)), list(range(12, 24)), list(range(24, 36))])
    torch.manual_seed(0)
    l2g = L2GModule(spec, 5, 6, dropout=0.0)
    full = FullGFTModule(spec, 5, 6, dropout=0.0)
    with torch.no_grad():
        for bank in l2g.local:
            bank.coeffs.zero_()
        full.glob.coeffs.copy_(torch.randn(6, 1))
        l2g.glob.coeffs.copy_(full.glob.coeffs)
        full.glob.combinator.copy_(torch.rand(1, 5) + 0.5)
        l2g.glob.combinator.copy_(full.glob.combinator)
        full.global_gate.fill_(0.3)
        l2g.global_gate.fill_(0.3)
        full.ff.load_state_dict(l2g.ff.state_dict())
        x = torch.randn(36, 5)
        torch.testing.assert_close(l2g(x), full(x), atol=2e-5, rtol=1e-4)
        # and the local stage matters once switched on
        for bank in l2g.local:
            bank.coeffs.fill_(1.0)
        assert (l2g(x) - full(x)).abs().max() > 1e-3


def test_matched_parameter_counts():
    L = laplacian(sbm_blocks(2, 12, 5.0, 2, seed=1))
    spec = {**_spec(L, [list(range(12)), list(range(12, 24))]),
            "A": -(L - __import__("scipy").sparse.diags(L.diagonal()))}
    kw = dict(in_features=10, num_layers=2, num_basis=6, dropout=0.1, cheb_k=8)
    count = lambda kind, d: count_parameters(build_model(kind, spec, dim=d, **kw))  # noqa: E731
    target = count("l2g", 24)
    for kind in ("full_gft", "gcn", "gin", "chebnet", "chebnet_long"):
        d = matched_dim(kind, target, count)
        assert abs(count(kind, d) - target) <= abs(count(kind, d + 1) - target)
        assert abs(count(kind, d) - target) / target < 0.15
    assert matched_dim("chebnet", target, count) < matched_dim("gcn", target, count)  # K linear maps per layer
    assert matched_dim("chebnet_long", target, count) < matched_dim("chebnet", target, count)


def test_sparse_operator_values_and_gradients_against_dense():
    """SparseOperator's custom backward (S^T g from a CSR built once) against autograd through a dense matmul,
    on a non-symmetric matrix with repeated (summed) entries, so S^T != S and the transpose is exercised."""
    import scipy.sparse as sps
    from stages.l2g_net.model import SparseOperator
    rng = np.random.default_rng(3)
    rows, cols = rng.integers(0, 9, 40), rng.integers(0, 9, 40)
    M = sps.coo_matrix((rng.normal(size=40) * 1.7, (rows, cols)), shape=(9, 9))
    op = SparseOperator(M)
    D = torch.tensor(M.toarray(), dtype=torch.float32)
    assert (D - D.T).abs().max() > 0.1
    x = torch.randn(9, 4, requires_grad=True)
    xd = x.detach().clone().requires_grad_(True)
    w = torch.randn(9, 4)
    y, yd = op(x), D @ xd
    torch.testing.assert_close(y, yd, atol=1e-5, rtol=1e-5)
    (y * w).sum().backward()
    (yd * w).sum().backward()
    torch.testing.assert_close(x.grad, xd.grad, atol=1e-5, rtol=1e-5)
    assert op.state_dict() == {}                      # rebuilt from the graph, not saved with the weights
    twin = copy.deepcopy(op)                           # graph constants shared (never written), not copied
    assert twin.const("S", x) is op.const("S", x) and twin.const("ST", x) is op.const("ST", x)
    torch.testing.assert_close(twin(x.detach()), y.detach())


@pytest.mark.parametrize("kind", ["gcn", "gin", "chebnet"])
def test_propagation_modules_against_dense_formulas(kind):
    """GCN D^-1/2 (A+I) D^-1/2 x, GIN (1+eps) x + A x, ChebNet's T_k(L~) x, computed densely in numpy."""
    import scipy.sparse as sps
    from stages.l2g_net.model import PropModule
    g = nx.gnm_random_graph(14, 30, seed=2)
    A = sps.csr_matrix(nx.to_numpy_array(g) * 1.5)     # weighted (w != 1)
    n, K = 14, 5
    torch.manual_seed(0)
    mod = copy.deepcopy(PropModule(kind, A, 1.8, dim=3, dropout=0.0, cheb_k=K))   # deepcopy-able (CSR constants)
    seen = {}
    mod.ff.register_forward_pre_hook(lambda m, a: seen.update(z=a[0].detach().numpy()))
    with torch.no_grad():
        if kind == "gin":
            mod.eps.fill_(0.4)
        x = torch.randn(n, 3)
        mod(x)
    Ad, X = A.toarray(), x.numpy().astype(np.float64)
    if kind == "gcn":
        d = (Ad + np.eye(n)).sum(1) ** -0.5
        want = (d[:, None] * (Ad + np.eye(n)) * d[None, :]) @ X
    elif kind == "gin":
        want = 1.4 * X + Ad @ X
    else:
        d = np.maximum(Ad.sum(1), 1e-12) ** -0.5
        Lt = 2.0 * (np.eye(n) - d[:, None] * Ad * d[None, :]) / 1.8 - np.eye(n)
        T = [X, Lt @ X]
        for _ in range(2, K):
            T.append(2 * Lt @ T[-1] - T[-2])
        want = np.concatenate(T, axis=1)
    np.testing.assert_allclose(seen["z"], want, atol=1e-4, rtol=1e-4)


def test_timed_graphs_same_in_pool_and_in_process(smoke_run):
    """evaluate's timed-graph jobs: everything but the timings is the same in two worker processes as in this one
    (scaling rows of both families, a cut-size row with its exactness and kernel calls), with the stage's default
    partitioner. Counts and sizes must be equal; error metrics near machine precision only to rounding (LAPACK's
    last bits differ between processes)."""
    from stages.common.jobs import run_jobs
    from stages.l2g_net.gft import resolve_partitioner

    prep = smoke_run("l2g_net", stages=("prepare",))["prepare"]
    manifest = json.loads((prep / "manifest.json").read_text())
    cfg = evaluate.Config(part_size=32, target_cut=2, exact_max_cut=40, timing_repeats=1)
    last = {m["family"]: i for i, m in enumerate(manifest["scaling"])}
    jobs = [("scaling", i) for i in last.values()] + [("scaling_k", len(manifest["scaling_k"]) - 1)]
    data = {"cfg": cfg.model_dump(mode="json"), "prep": str(prep), "manifest": manifest,
            "partitioners": [resolve_partitioner("auto")], "device": "cpu"}
    one, two = run_jobs(evaluate._timed_graph, jobs, data, 1), run_jobs(evaluate._timed_graph, jobs, data, 2)

    def timing(k: str) -> bool:
        return k.endswith("_s") or k.endswith("_runs") or k == "sparsify_speedup"    # a ratio of two timings

    def same(a: dict, b: dict) -> None:
        untimed = [k for k in a if not timing(k)]
        assert untimed == [k for k in b if not timing(k)]
        for k in untimed:
            if isinstance(a[k], float):
                assert b[k] == pytest.approx(a[k], rel=1e-9, abs=1e-13), k
            else:
                assert a[k] == b[k], k

    for rows_a, rows_b in zip(one[:2], two[:2]):
        assert len(rows_a) == len(rows_b) == 1
        same(rows_a[0], rows_b[0])
    same(one[2], two[2])
    assert one[2]["kernel_calls"] > 0 and {rows[0]["family"] for rows in one[:2]} == set(last)


def test_source_parity_labels_by_independent_bfs():
    from scipy.sparse.csgraph import shortest_path

    r = source_parity(9, 3, 0.15, seed=5)
    G, y, src = r["graph"], r["y"], r["sources"]
    assert nx.is_connected(G) and nx.is_bipartite(G) and G.number_of_nodes() == 81
    assert G.number_of_edges() < 2 * 9 * 8                                       # edges were removed
    D = shortest_path(nx.to_scipy_sparse_array(G, nodelist=range(81)), unweighted=True, indices=src)
    np.testing.assert_array_equal(r["distance"], D.min(axis=0).astype(int))
    np.testing.assert_array_equal(y, D.min(axis=0).astype(int) % 2)
    assert r["x"][src, 0].tolist() == [1.0] * 3 and r["x"][:, 0].sum() == 3 and (r["x"].sum(axis=1) == 1).all()
    # bipartite: an edge joins equal labels only where the nearest sources have opposite colours
    assert edge_homophily(G, y) < 0.3


def test_minesweeper_counts_by_brute_force():
    ms = minesweeper(9, 0.2, 0.5, seed=3)
    G, x, y = ms["graph"], ms["x"], ms["y"]
    assert G.number_of_nodes() == 81 and y.sum() == round(0.2 * 81)
    assert G.degree[4 * 9 + 4] == 8 and G.degree[0] == 3          # king moves: interior 8, corner 3
    for v in range(81):
        r, c = divmod(v, 9)
        want = sum(y[rr * 9 + cc] for rr in range(r - 1, r + 2) for cc in range(c - 1, c + 2)
                   if (rr, cc) != (r, c) and 0 <= rr < 9 and 0 <= cc < 9)
        assert ms["counts"][v] == want
        if x[v, 9] == 0:
            assert x[v, want] == 1 and x[v].sum() == 1
        else:
            assert x[v, :9].sum() == 0
    assert x[:, 9].sum() == round(0.5 * 81)
    assert nx.is_connected(G)


@pytest.mark.parametrize("module, block, key", [
    (prepare, {"scaling": {"sizes": [500, 250, 1000, 2000, 3000, 4000]}}, "sizes"),
    (prepare, {"scaling": {"sizes": [100, 200, 300]}}, "sizes"),
    (prepare, {"scaling": {"families": ["ba", "ba"]}}, "families"),
    (prepare, {"scaling": {"families": ["er"]}}, "families"),
    (prepare, {"suite_scale": 3}, "suite_scale"),
    (prepare, {"cut_n": 100, "cut_blocks": 2, "cut_sizes": [4, 8, 5000]}, "cut_sizes"),
    (prepare, {"task": {"side": 1000}}, "side"),
    (prepare, {"parity": {"side": 8, "num_sources": 40}}, "num_sources"),
    (prepare, {"parity": {"drop_fraction": 0.9}}, "drop_fraction"),
    (train, {"tasks": ["parity", "parity"]}, "tasks"),
    (train, {"tasks": ["cora"]}, "tasks"),
    (train, {"partitioner": "kahip"}, "partitioner"),
    (evaluate, {"partitioners": ["spectral", "spectral"]}, "partitioners"),
    (prepare, {"seed": -1}, "seed"),
    (prepare, {"bogus": 1}, "bogus"),
    (train, {"models": ["l2g", "transformer"]}, "models"),
    (train, {"models": ["l2g", "l2g"]}, "models"),
    (train, {"seeds": [0, 0, 1]}, "seeds"),
    (train, {"target_cut": 0}, "target_cut"),
    (train, {"laplacian": "random_walk"}, "laplacian"),
    (train, {"lr": float("nan")}, "lr"),
    (train, {"train_fraction": 0.8, "val_fraction": 0.3}, "val_fraction"),
    (train, {"trainer": {"max_steps": 10**6}}, "max_steps"),
    (train, {"device": "tpu"}, "device"),
    (evaluate, {"part_size": 0}, "part_size"),
    (evaluate, {"timing_repeats": 1000}, "timing_repeats"),
    (train, {"workers": 0}, "workers"),
    (prepare, {"task": {"source": {"kind": "heterophilous_npz"}}}, "path"),
    (prepare, {"task": {"source": {"kind": "ogb"}}}, "kind"),
])
def test_config_errors_name_the_key(module, block, key):
    with pytest.raises(ConfigError, match=key):
        validate(module.Config, block, "papers.l2g_net.stage")


def test_params_load_for_every_profile():
    for stage in ("prepare", "train", "evaluate", "report"):
        for profile in ("smoke", "default", "full"):
            load_config("l2g_net", stage, profile)
    assert len(load_config("l2g_net", "train", "default")[1].seeds) >= 3


def test_torch_free_numpy_roundtrip():
    L = laplacian(sbm_blocks(3, 20, 6.0, 3, seed=1))
    f = factorize(L, min_part_size=8, max_cut_fraction=0.5)
    X = np.random.default_rng(0).normal(size=(60, 4))
    np.testing.assert_allclose(f.inverse(f.transform(X)), X, atol=1e-12)
