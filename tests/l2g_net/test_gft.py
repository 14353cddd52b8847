"""Exactness of stages.l2g_net.gft.factorize against numpy/scipy eigh, and its bad-input errors."""
from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp

from stages.l2g_net import secular_jit
from stages.l2g_net.gft import (GraphInputError, _fiedler_vector, bisection_parts, column_scales_numpy, factorize,
                                  gu_eisenstat_z_numpy, partition, rank_one_update, resolve_partitioner,
                                  solve_secular, solve_secular_numpy, sparsify_cut)
from stages.l2g_net.scaling import crossover, fits
from stages.l2g_net.scaling import main as scaling_main
from stages.l2g_net.graphs import exactness_suite, laplacian, random_parts, sbm_blocks

TOL = 1e-10


def check_exact(L, parts=None, **kw):
    """Eigenvalues vs numpy eigh, U^T U = I, U diag(lam) U^T = L, transform/inverse agree with dense U."""
    f = factorize(L, parts, **kw)
    Ld = L.toarray() if sp.issparse(L) else np.asarray(L, float)
    n = Ld.shape[0]
    ref = np.linalg.eigvalsh(Ld)
    scale = max(np.abs(ref).max(), 1.0)
    assert f.eigenvalues.shape == (n,)
    assert np.all(np.diff(f.eigenvalues) >= 0), "eigenvalues must be ascending"
    assert np.abs(f.eigenvalues - ref).max() / scale < TOL
    U = f.dense()
    assert np.abs(U.T @ U - np.eye(n)).max() < TOL
    assert np.abs(U @ np.diag(f.eigenvalues) @ U.T - Ld).max() / scale < TOL
    X = np.random.default_rng(0).normal(size=(n, 3))
    np.testing.assert_allclose(f.transform(X), U.T @ X, atol=1e-10)
    np.testing.assert_allclose(f.inverse(X), U @ X, atol=1e-10)
    np.testing.assert_allclose(f.transform(X[:, 0]), U.T @ X[:, 0], atol=1e-10)
    assert f.transform(X[:, 0]).shape == (n,)
    return f


def _weighted(G, rng, lo=-3, hi=3):
    for u, v in G.edges:
        G[u][v]["weight"] = float(10 ** rng.uniform(lo, hi))
    return G


@pytest.mark.parametrize("seed", range(4))
def test_random_graphs_random_parts(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 70))
    G = _weighted(nx.gnp_random_graph(n, float(rng.uniform(0.05, 0.3)), seed=seed), rng)
    check_exact(laplacian(G), random_parts(n, int(rng.integers(2, 7)), rng))
    check_exact(laplacian(G))


def test_disconnected_isolated_repeated_eigenvalues():
    rng = np.random.default_rng(1)
    # identical copies (every eigenvalue repeated), stars and complete graphs (large multiplicities),
    # isolated nodes (zero rows), all split across parts so updates must deflate
    G = nx.disjoint_union_all([nx.petersen_graph()] * 3 + [nx.star_graph(7), nx.complete_graph(6),
                                                           nx.complete_graph(6), nx.empty_graph(3)])
    L = laplacian(G)
    n = L.shape[0]
    f = check_exact(L)
    assert len(f.parts) >= 7  # one part per component (isolated nodes are parts of their own)
    check_exact(L, random_parts(n, 5, rng))
    check_exact(L, [[i] for i in range(n)])  # every edge is a cut edge: maximal deflation


def test_hypercube_and_grids_bridged():
    check_exact(laplacian(nx.convert_node_labels_to_integers(nx.hypercube_graph(5))), random_parts(32, 4, np.random.default_rng(0)))
    suite = exactness_suite(seed=3, scale=60)
    for name, G in suite.items():
        check_exact(laplacian(G))


def test_dense_numpy_input_and_weights_over_decades():
    rng = np.random.default_rng(5)
    G = _weighted(nx.disjoint_union(nx.gnp_random_graph(15, 0.4, seed=1), nx.gnp_random_graph(12, 0.4, seed=2)), rng, -4, 4)
    G.add_edge(0, 20, weight=1e-6)  # a very weak bridge (tiny rho)
    L = laplacian(G).toarray()
    check_exact(L, [list(range(15)), list(range(15, 27))])


def test_partitioner_finds_blocks_and_covers_nodes():
    G = sbm_blocks(4, 60, 12.0, 4, seed=0)
    L = laplacian(G)
    parts = partition(L, min_part_size=16, max_cut_fraction=1 / 8)
    allnodes = np.sort(np.concatenate(parts))
    assert np.array_equal(allnodes, np.arange(240))
    blocks = {tuple(sorted(set(p // 60))) for p in map(np.asarray, parts)}
    assert len(parts) == 4 and all(len(b) == 1 for b in blocks)
    f = check_exact(L, None, min_part_size=16, max_cut_fraction=1 / 8)
    assert len(f.cut_edges) == 4


def test_secular_roots_interlace_and_solve():
    rng = np.random.default_rng(2)
    d = np.sort(rng.uniform(0, 5, 40)) + np.arange(40) * 1e-2
    z = rng.normal(size=40)
    z /= np.linalg.norm(z)
    rho = 1.7
    origin, tau = solve_secular(d, z, rho)
    lam = d[origin] + tau
    ref = np.linalg.eigvalsh(np.diag(d) + rho * np.outer(z, z))
    np.testing.assert_allclose(lam, ref, atol=1e-13)
    assert np.all(lam[:-1] > d[:-1]) and np.all(lam[:-1] < d[1:]) and lam[-1] > d[-1]


@pytest.mark.parametrize("m, spread, rho, znorm", [(1, 1.0, 0.8, 1.0), (2, 1.0, 2.5, 1.9), (37, 1e-6, 0.3, 0.4),
                                                   (300, 1.0, 4.2, 1.9), (150, 1.0, 0.7, 0.6)])
def test_compiled_secular_loops_match_numpy_references_and_eigh(m, spread, rho, znorm):
    """secular_jit's per-root loops (the production path) vs gft's vectorized numpy versions and a dense eigh:
    roots, Gu-Eisenstat z and column scales, on poles that are spread out or clustered within 1e-6."""
    rng = np.random.default_rng(m)
    d = np.cumsum(rng.uniform(0.1, 1.0, m)) * spread + 0.7
    z = rng.normal(size=m)
    z *= znorm / np.linalg.norm(z)       # |z| != 1, as after deflation: the last root lies in (d_m, d_m + rho |z|^2)
    origin, tau = solve_secular(d, z, rho)
    o_ref, t_ref = solve_secular_numpy(d, z, rho)
    lam, lam_ref = d[origin] + tau, d[o_ref] + t_ref
    brute = np.linalg.eigvalsh(np.diag(d) + rho * np.outer(z, z))
    np.testing.assert_allclose(lam, brute, rtol=0, atol=1e-13 * max(1.0, brute.max()))
    np.testing.assert_allclose(lam, lam_ref, rtol=1e-13, atol=0)
    if m == 1:
        return
    # the distances to the poles, which the eigenvectors are built from, agree to relative precision
    gaps, gaps_ref = (d[:, None] - d[origin][None, :]) - tau, (d[:, None] - d[o_ref][None, :]) - t_ref
    np.testing.assert_allclose(gaps, gaps_ref, rtol=1e-9, atol=0)
    zhat = secular_jit.gu_eisenstat_z(d, z, rho, origin, tau)
    np.testing.assert_allclose(zhat, gu_eisenstat_z_numpy(d, z, rho, origin, tau), rtol=1e-12)
    a = secular_jit.column_scales(d, zhat, origin, tau)
    np.testing.assert_allclose(a, column_scales_numpy(d, zhat, origin, tau), rtol=1e-12)
    U = (zhat[:, None] / gaps) * a[None, :]            # the Cauchy eigenvectors: orthonormal, and they solve it
    assert np.abs(U.T @ U - np.eye(m)).max() < 1e-12
    A = np.diag(d) + rho * np.outer(z, z)
    assert np.abs(A @ U - U * lam[None, :]).max() < 1e-12 * np.abs(A).max()


@pytest.mark.parametrize("m, spread, rho", [(37, 1e-6, 0.3), (300, 1.0, 4.2), (200, 1.0, 0.05), (120, 1e-3, 30.0)])
def test_secular_roots_converge_in_few_iterations(m, spread, rho):
    """The two-pole rational step converges in a handful of iterations (3-5 here; LAPACK's dlaed4 allows 30):
    8 are enough for full accuracy, where bisection alone from the half-gap bracket needs 20-40."""
    rng = np.random.default_rng(m)
    d = np.cumsum(rng.uniform(0.1, 1.0, m)) * spread + 0.7
    z = rng.normal(size=m)
    z /= np.linalg.norm(z)
    origin, tau = solve_secular(d, z, rho, max_iter=8)
    brute = np.linalg.eigvalsh(np.diag(d) + rho * np.outer(z, z))
    np.testing.assert_allclose(d[origin] + tau, brute, rtol=0, atol=1e-13 * max(1.0, brute.max()))
    o_ref, t_ref = solve_secular_numpy(d, z, rho)
    np.testing.assert_allclose((d[:, None] - d[origin][None, :]) - tau, (d[:, None] - d[o_ref][None, :]) - t_ref,
                               rtol=1e-9, atol=0)


def test_warm_up_compiles_what_a_factorization_uses():
    """After warm_up, a factorization adds no compiled signature: no timed call pays for compilation."""
    if not hasattr(secular_jit.secular_roots, "signatures"):
        pytest.skip("NUMBA_DISABLE_JIT: the loops run as Python")
    secular_jit.warm_up()
    fns = (secular_jit.secular_roots, secular_jit.gu_eisenstat_z, secular_jit.column_scales)
    before = [list(f.signatures) for f in fns]
    assert all(len(b) >= 1 for b in before)
    fact = factorize(laplacian(nx.barabasi_albert_graph(120, 2, seed=1)), min_part_size=16, max_cut_fraction=0.5)
    assert len(fact.factors) > 0                  # the rank-one updates ran
    assert [list(f.signatures) for f in fns] == before


def _many_components_graph() -> nx.Graph:
    """86 components: a 321-node tree, 40 isolated nodes, 40 pairs, 5 triangles (456 nodes)."""
    G = nx.barabasi_albert_graph(321, 1, seed=3)
    k = 321
    G.add_nodes_from(range(k, k + 40))
    k += 40
    for _ in range(40):
        G.add_edge(k, k + 1)
        k += 2
    for _ in range(5):
        G.add_edges_from([(k, k + 1), (k + 1, k + 2), (k, k + 2)])
        k += 3
    return G


def _adj_lap(G):
    A = sp.csr_matrix(nx.to_scipy_sparse_array(G, format="csr", dtype=float))
    A.data *= 1.7                                   # non-unit weights
    return A, (sp.diags(np.asarray(A.sum(axis=1)).ravel()) - A).tocsr()


def test_fiedler_vector_of_disconnected_graph_is_null_space_projection():
    """A disconnected part (86 components; the large-n study's BA parts have dozens, where shift-invert ARPACK
    stopped with error 3): the Fiedler vector is the projection of the start vector onto the null space, brute
    force: every eigenvector of a dense eigh with eigenvalue ~0."""
    A, L = _adj_lap(_many_components_graph())
    v = _fiedler_vector(A)
    lam, U = np.linalg.eigh(L.toarray())
    null = U[:, lam < 1e-9]
    assert null.shape[1] == 86
    v0 = np.cos(np.arange(A.shape[0]) * 0.7 + 0.1)
    ref = null @ (null.T @ v0)
    ref -= ref.mean()
    np.testing.assert_allclose(v, ref / np.linalg.norm(ref), atol=1e-10)
    parts, _ = bisection_parts(L, 3, method="spectral")
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(A.shape[0]))


def test_spectral_partitioner_survives_arpack_error(monkeypatch):
    """Shift-invert ARPACK can stop with error 3 ("no shifts could be applied"), not only fail to converge: the
    Fiedler search then falls back to dense eigh instead of raising (eigsh is made to raise it here)."""
    import scipy.sparse.linalg as sla

    A, L = _adj_lap(nx.barabasi_albert_graph(450, 2, seed=5))    # connected, > 400 nodes: ARPACK's path
    calls = []

    def eigsh_error_3(M, k=6, **kw):
        calls.append(k)
        raise sla.ArpackError(3)

    monkeypatch.setattr(sla, "eigsh", eigsh_error_3)
    v = _fiedler_vector(A)
    assert calls
    lam = np.linalg.eigvalsh(L.toarray())
    assert abs(np.linalg.norm(v) - 1) < 1e-12 and abs(v.sum()) < 1e-9
    np.testing.assert_allclose(L @ v, lam[1] * v, atol=1e-9)     # an eigenvector of lambda_2 (simple here)


def test_rank_one_update_deflates_tiny_z_and_equal_eigenvalues():
    lam = np.array([0.0, 1.0, 1.0, 1.0, 2.0, 3.0])
    z = np.array([0.5, 0.3, -0.4, 0.2, 0.0, 1e-20])
    fac = rank_one_update(lam, z, 1.0)  # lam is updated in place
    assert fac.rot_p.size == 2           # the triple eigenvalue 1 is merged by two rotations
    assert 4 not in fac.idx and 5 not in fac.idx  # zero / tiny z_i deflated
    ref = np.linalg.eigvalsh(np.diag([0.0, 1, 1, 1, 2, 3]) + np.outer(z, z))
    np.testing.assert_allclose(np.sort(lam), ref, atol=1e-14)


# ----------------------------------------------------------------------------- bad input
def _path_L(n=5):
    return laplacian(nx.path_graph(n)).toarray()


@pytest.mark.parametrize("L, match", [
    (np.array([[1.0, -1.0, 0], [-0.5, 1.0, -0.5], [0, -0.5, 0.5]]), "not symmetric"),
    (np.array([[1.0, 1.0], [1.0, 1.0]]), "negative edge weight"),
    (np.array([[1.0, np.nan], [np.nan, 1.0]]), "NaN"),
    (np.ones((2, 3)), "square"),
    (np.zeros((0, 0)), "empty"),
])
def test_bad_laplacian(L, match):
    with pytest.raises(GraphInputError, match=match):
        factorize(L)


def test_bad_laplacian_sparse():
    L = sp.csr_matrix(_path_L())
    L[0, 1] = 2.0
    L[1, 0] = 2.0
    with pytest.raises(GraphInputError, match="negative edge weight between nodes 0 and 1"):
        factorize(L)


@pytest.mark.parametrize("parts, match", [
    ([[0, 1], [2, 3]], r"missing from every part: \[4\]"),
    ([[0, 1, 2], [2, 3, 4]], r"more than once: \[2\]"),
    ([[0, 1, 2], [3, 4, 7]], "out of range"),
    ([[0, 1, 2, 3, 4], []], "empty part"),
    ([[0.0, 1.0], [2, 3, 4]], "integers"),
    ("01234", "list of node-index lists"),
])
def test_bad_parts(parts, match):
    with pytest.raises(GraphInputError, match=match):
        factorize(_path_L(), parts)


def test_transform_shape_error():
    f = factorize(_path_L())
    with pytest.raises(ValueError, match=r"expected shape \[5\]"):
        f.transform(np.ones(4))


# ----------------------------------------------------------------------------- issue 31 / 33 additions
def test_complex_input_rejected():
    L = _path_L().astype(complex)
    with pytest.raises(GraphInputError, match="complex"):
        factorize(L)
    with pytest.raises(GraphInputError, match="complex"):
        factorize(sp.csr_matrix(L))


@pytest.mark.parametrize("bad", [0, -3])
def test_min_part_size_must_be_positive(bad):
    with pytest.raises(GraphInputError, match="min_part_size"):
        factorize(_path_L(), min_part_size=bad)
    with pytest.raises(GraphInputError, match="min_part_size"):
        partition(_path_L(), min_part_size=bad)


def _two_cliques(size: int) -> sp.csr_matrix:
    """Two K_size joined by one edge: the best cut (1 edge) leaves exactly ``size`` nodes per side."""
    G = nx.disjoint_union(nx.complete_graph(size), nx.complete_graph(size))
    G.add_edge(0, size)
    return laplacian(_weighted(G, np.random.default_rng(0), 0, 0))


def test_partition_boundary_exactly_min_size():
    L = _two_cliques(6)  # 12 nodes, halves of exactly 6
    parts = partition(L, min_part_size=6, max_cut_fraction=0.5)
    assert sorted(len(p) for p in parts) == [6, 6]           # halves of exactly min_size are allowed
    assert len(partition(L, min_part_size=7, max_cut_fraction=0.5)) == 1  # one more: no split possible
    check_exact(L, None, min_part_size=6, max_cut_fraction=0.5)


def test_fallback_is_named_when_a_cut_is_refused():
    G = nx.convert_node_labels_to_integers(nx.grid_2d_graph(12, 12))  # best cut 12 edges > 144/48 = 3
    L = laplacian(G)
    f = factorize(L, min_part_size=16)
    assert len(f.parts) == 1 and f.fallback is not None and f.fallback.startswith("single_dense_eigh")
    assert f.partition_info["refused"][0]["cut_edges"] >= 12
    g = factorize(L, min_part_size=16, max_cut_fraction=0.2)  # 12 <= 0.2 * 144: split accepted
    assert len(g.parts) >= 2 and g.fallback is None
    assert factorize(L, [list(range(72)), list(range(72, 144))]).fallback is None


@pytest.mark.parametrize("method", ["metis", "spectral"])
def test_bisection_parts_count_balance_and_splits(method):
    if method == "metis":
        pytest.importorskip("pymetis")
    L = laplacian(nx.convert_node_labels_to_integers(nx.grid_2d_graph(10, 10)))
    parts, splits = bisection_parts(L, 5, method=method)
    assert len(parts) == 5 and len(splits) == 4
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(100))
    assert min(len(p) for p in parts) >= 100 // 3 // 3
    part_of = np.empty(100, int)
    for k, p in enumerate(parts):
        part_of[p] = k
    A = sp.triu(-(L - sp.diags(L.diagonal())), 1).tocoo()
    for i, j in zip(A.row, A.col):  # every cut edge crosses exactly one split
        if part_of[i] != part_of[j]:
            crossings = sum((part_of[i] in a and part_of[j] in b) or (part_of[i] in b and part_of[j] in a)
                            for a, b in splits)
            assert crossings == 1


def test_sparsify_cut_keeps_target_per_split_and_is_factorized_exactly():
    G = nx.convert_node_labels_to_integers(nx.grid_2d_graph(12, 12))
    L = laplacian(G)
    parts, splits = bisection_parts(L, 4)
    Ls, info = sparsify_cut(L, parts, splits, target_cut=2, seed=3)
    assert info["cut_edges_before"] > info["cut_edges_after"] and info["cut_edges_after"] <= 2 * len(splits)
    Ld, Lsd = L.toarray(), Ls.toarray()
    part_of = np.empty(144, int)
    for k, p in enumerate(parts):
        part_of[p] = k
    same = part_of[:, None] == part_of[None, :]
    off = ~np.eye(144, dtype=bool)
    np.testing.assert_array_equal(Lsd[same & off], Ld[same & off])   # edges inside parts untouched
    np.testing.assert_allclose(Lsd.sum(axis=1), 0, atol=1e-12)        # still a Laplacian
    kept_w = -Lsd[~same]
    assert np.all(kept_w[kept_w > 0] >= 1.0 - 1e-12)                  # HT re-weighting only grows weights
    check_exact(Ls, parts)
    Lall, info_all = sparsify_cut(L, parts, splits, target_cut=10**4)
    np.testing.assert_allclose(Lall.toarray(), Ld)                    # a target above every cut keeps L


def test_chain_matrix_is_global_basis_times_local():
    L = laplacian(sbm_blocks(3, 20, 6.0, 4, seed=2))
    f = factorize(L, [list(range(20)), list(range(20, 40)), list(range(40, 60))])
    C = f.chain_matrix()
    X = np.random.default_rng(1).normal(size=(60, 3))
    np.testing.assert_allclose(C @ f.local_transform(X), f.transform(X), atol=1e-12)
    np.testing.assert_allclose(C.T @ C, np.eye(60), atol=1e-12)


def test_metis_bisection_finds_the_bridge_and_partitioner_names():
    """Two 40-node cliques joined by one edge: METIS must cut exactly that edge; the resolver names
    what runs and rejects unknown partitioners."""
    pytest.importorskip("pymetis")
    G = nx.disjoint_union(nx.complete_graph(40), nx.complete_graph(40))
    G.add_edge(3, 57)
    L = laplacian(G)
    assert resolve_partitioner("auto") == "metis" and resolve_partitioner("spectral") == "spectral"
    for method in ("metis", "spectral"):
        parts, splits = bisection_parts(L, 2, method=method)
        assert sorted(sorted(p.tolist()) for p in parts) == [list(range(40)), list(range(40, 80))]
        assert len(factorize(L, parts).cut_edges) == 1
    with pytest.raises(GraphInputError, match="partitioner"):
        resolve_partitioner("kahip")


def test_fitted_exponents_and_crossover_against_known_power_laws():
    n = np.array([100.0, 200, 400, 800, 1600, 3200])
    fit = fits([{"family": "x", "partitioner": "p", "n": int(v), "l2g_s": 2.0 * v, "eigh_s": v ** 2 / 100,
                 "updates_s": 0.5 * v ** 1.5, "eig_err_vs_sparsified": None, "probe_err_vs_sparsified": 0.0,
                 "spectral_err_vs_true_L": 0.0} for v in n])["x_p"]
    assert abs(fit["l2g_exponent"] - 1) < 1e-9 and abs(fit["eigh_exponent"] - 2) < 1e-9
    assert abs(fit["updates_exponent"] - 1.5) < 1e-9
    assert abs(fit["fitted_crossover_n"] - 200.0) < 1e-6             # 2 n = n^2 / 100
    assert fit["first_n_l2g_faster"] == 400 and fit["l2g_faster_at_sizes"] == 4
    assert crossover(n, 3 * n, 5 * n) is None


def test_scaling_cli_rejects_bad_input(tmp_path, capsys):
    assert scaling_main(["--sizes", "100", "200", "--out", str(tmp_path / "a.json")]) == 2
    assert "--sizes" in capsys.readouterr().err
    assert scaling_main(["--sizes", "100", "200", "300", "400", "500", "600", "--out", str(tmp_path)]) == 2
    assert "--out" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_committed_large_n_study_is_the_median_of_3_run_the_report_describes():
    """The report says the committed study is STUDY_CMD's median-of-3 run over six sizes to n = 8000, with every
    run's time kept; the committed JSON must be that run (a one-shot or partial run would contradict the text)."""
    import json

    from stages.common.paths import ROOT
    from stages.l2g_net.report import STUDY_CMD

    doc = json.loads((ROOT / "reports/studies/l2g_net_scaling_large.json").read_text())
    assert doc["command"] == STUDY_CMD
    assert doc["settings"]["repeats"] >= 3
    assert sorted({r["family"] for r in doc["rows"]}) == ["ba", "grid"]
    for fam in ("ba", "grid"):
        sizes = sorted({r["n"] for r in doc["rows"] if r["family"] == fam})
        assert len(sizes) == 6 and sizes[-1] >= 7900
    for r in doc["rows"]:
        assert len(r["l2g_s_runs"]) == len(r["eigh_s_runs"]) == doc["settings"]["repeats"]
        assert r["l2g_s"] == float(np.median(r["l2g_s_runs"])) and r["eigh_s"] == float(np.median(r["eigh_s_runs"]))
    assert {c["verdict"] for c in doc["claims"]} <= {"holds", "fails", "inconclusive"} and len(doc["claims"]) == 8


def _projected_fiedler(A) -> np.ndarray:
    """Brute force: every eigenpair by numpy, the lambda_2 eigenspace by tolerance, the fixed start vector projected
    onto it, orthogonal to the constant vector."""
    Ad = np.asarray(A.todense(), dtype=float)
    lam, U = np.linalg.eigh(np.diag(Ad.sum(1)) - Ad)
    space = U[:, np.abs(lam - lam[1]) <= 1e-7]
    v0 = np.cos(np.arange(Ad.shape[0]) * 0.7 + 0.1)
    v = space @ (space.T @ v0)
    v -= v.mean()
    return v / np.linalg.norm(v)


@pytest.mark.parametrize("side, weight", [(12, 1.0), (21, 2.5)])   # 144 nodes: dense path; 441: ARPACK path
def test_fiedler_vector_is_canonical_on_a_repeated_lambda2(side, weight):
    """A square grid's lambda_2 has multiplicity 2, so any eigensolver's Fiedler vector is an arbitrary vector of
    that plane; the partitioner's is the projection of its fixed start vector, the same on every machine."""
    import networkx as nx
    import scipy.sparse as sps

    from stages.l2g_net.gft import _fiedler_vector

    A = sps.csr_matrix(nx.to_scipy_sparse_array(nx.grid_2d_graph(side, side), dtype=float) * weight)
    Ad = A.toarray()
    lam = np.linalg.eigvalsh(np.diag(Ad.sum(1)) - Ad)
    assert abs(lam[2] - lam[1]) < 1e-9 * lam[-1]                      # the setting: lambda_2 repeated
    np.testing.assert_allclose(_fiedler_vector(A), _projected_fiedler(A), atol=1e-6)


def test_fiedler_vector_of_a_disconnected_graph_separates_components():
    """lambda_2 = 0 with two components: the vector lies in the null space, orthogonal to the constant, i.e. one
    value on each component."""
    import networkx as nx
    import scipy.sparse as sps

    from stages.l2g_net.gft import _fiedler_vector

    g = nx.disjoint_union(nx.cycle_graph(7), nx.path_graph(5))
    A = sps.csr_matrix(nx.to_scipy_sparse_array(g, dtype=float) * 1.5)
    v = _fiedler_vector(A)
    assert np.ptp(v[:7]) < 1e-8 and np.ptp(v[7:]) < 1e-8 and abs(v[0] - v[7]) > 0.1
    np.testing.assert_allclose(v, _projected_fiedler(A), atol=1e-8)
