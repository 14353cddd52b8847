"""gft input checks, message by message (issue 33): every GraphInputError names the problem with
the values the user passed, and the boundaries (index n−1 vs n, 10 vs 11 listed nodes, zero
off-diagonals) sit where the docstrings say."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from stages.l2g_net.gft import GraphInputError, factorize


def _path(n=4, w=1.5):
    L = np.zeros((n, n))
    for i in range(n - 1):
        L[i, i + 1] = L[i + 1, i] = -w
        L[i, i] += w
        L[i + 1, i + 1] += w
    return L


def _err(L, parts=None) -> str:
    with pytest.raises(GraphInputError) as err:
        factorize(L, parts)
    return str(err.value)


def test_laplacian_messages_exact():
    assert _err(_path() + 0j) == "L: complex matrix (dtype complex128); a graph Laplacian is real"
    assert _err(sp.csr_matrix(_path() + 0j)) == "L: complex matrix (dtype complex128); a graph Laplacian is real"
    assert _err([["a", "b"], ["c", "d"]]).startswith("L: not a numeric matrix (could not convert string to float")
    assert _err(np.ones(3)) == "L: expected a square 2-D matrix, got shape (3,)"
    assert _err(sp.csr_matrix(np.zeros((2, 3)))) == "L: expected a square matrix, got shape (2, 3)"
    assert _err(np.zeros((0, 0))) == "L: empty matrix (0 nodes)"
    L = _path()
    L[2, 1] = L[1, 2] = np.nan
    assert _err(L) == "L: contains NaN or infinite entries, e.g. L[1, 2] = nan"
    L = _path()
    L[3, 3] = np.inf
    assert _err(sp.csr_matrix(L)) == "L: contains NaN or infinite entries, e.g. L[3, 3] = inf"
    L = _path()
    L[0, 1] = -1.25
    assert _err(L) == "L: not symmetric: L[0, 1] = -1.25 but L[1, 0] = -1.5"
    A = -_path()
    np.fill_diagonal(A, 0.0)
    assert _err(A) == ("L: negative edge weight between nodes 0 and 1: L[0, 1] = 1.5 > 0 (a Laplacian's "
                       "off-diagonal entries are -w_ij with w_ij >= 0; did you pass an adjacency matrix?)")


def test_laplacian_accepted_forms():
    # float32 and int inputs are converted to float64; a zero off-diagonal (no edge) is not an error;
    # an asymmetry at 1e-13 of the largest entry is tolerated and symmetrized
    L = _path(5, 2.0)
    for X in (L.astype(np.float32), L.astype(np.int64), sp.csr_matrix(L.astype(np.float32)), sp.coo_matrix(L)):
        f = factorize(X)
        assert np.allclose(np.sort(f.eigenvalues), np.sort(np.linalg.eigvalsh(L)), atol=1e-10)
        assert f.eigenvalues.dtype == np.float64
    L2 = _path(5, 2.0)
    L2[0, 1] += 1e-13 * 4.0
    f = factorize(L2)
    assert np.allclose(np.sort(f.eigenvalues), np.sort(np.linalg.eigvalsh((L2 + L2.T) / 2)), atol=1e-10)
    L3 = _path(5, 2.0)
    L3[0, 1] += 1e-11 * 4.0
    assert _err(L3) == "L: not symmetric: L[0, 1] = -1.99999999996 but L[1, 0] = -2.0"
    one = factorize(np.zeros((1, 1)))             # a single isolated node
    assert one.eigenvalues.tolist() == [0.0]


def test_parts_messages_exact():
    L = _path(12)
    assert _err(L, "0123") == "parts: expected a list of node-index lists, got str"
    assert _err(L, {0: [1]}) == "parts: expected a list of node-index lists, got dict"
    assert _err(L, [[0, 1], [[2, 3], [4, 5]]]) == "parts[1]: expected a flat list of node indices, got shape (2, 2)"
    assert _err(L, [list(range(12)), []]) == "parts[1]: empty part"
    assert _err(L, [[0.0, 1.0], list(range(2, 12))]) == "parts[0]: node indices must be integers (got dtype float64)"
    assert _err(L, [list(range(11)) + [12]]) == "parts[0]: node index 12 out of range for a graph of 12 nodes"
    assert _err(L, [[-1] + list(range(12))]) == "parts[0]: node index -1 out of range for a graph of 12 nodes"
    assert _err(L, [list(range(11)), [12, 11]]) == "parts[1]: node index 12 out of range for a graph of 12 nodes"
    # 11 repeated nodes: the first 10 and " ..."; exactly 10: no ellipsis
    assert _err(L, [list(range(12)), list(range(11))]) == (
        "parts: nodes listed more than once: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9] ... (each node must be in exactly one part)")
    assert _err(L, [list(range(12)), list(range(10))]) == (
        "parts: nodes listed more than once: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9] (each node must be in exactly one part)")
    assert _err(L, [[0]]) == ("parts: nodes missing from every part: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10] ... "
                              "(11 of 12; every node must be in exactly one part)")
    assert _err(L, [[0, 1]]) == ("parts: nodes missing from every part: [2, 3, 4, 5, 6, 7, 8, 9, 10, 11] "
                                 "(10 of 12; every node must be in exactly one part)")


def test_parts_accepted_forms():
    L = _path(6, 0.7)
    want = np.sort(np.linalg.eigvalsh(L))
    for parts in ([[0, 1, 2], [3, 4, 5]], [np.array([5, 0]), (1, 2, 3, 4)], [[0, 1, 2, 3, 4, 5]],
                  [np.array([0, 1, 2], dtype=np.int32), [3, 4, 5]]):
        f = factorize(L, parts)
        assert np.allclose(np.sort(f.eigenvalues), want, atol=1e-10), parts


# ---- cut sparsification: counts, re-weighting, cap, offsets, errors --------------------------------------
def _grid_parts():
    import networkx as nx

    from stages.l2g_net.gft import bisection_parts
    from stages.l2g_net.graphs import laplacian
    G = nx.convert_node_labels_to_integers(nx.grid_2d_graph(10, 10))
    for k, (u, v) in enumerate(sorted(G.edges())):
        G[u][v]["weight"] = 0.5 + (k % 7) * 0.3                          # non-unit, varied weights
    L = laplacian(G)
    parts, splits = bisection_parts(L, 4, method="spectral")
    return L, parts, splits


def _cut_edges(L, parts):
    part_of = np.empty(L.shape[0], int)
    for k, p in enumerate(parts):
        part_of[p] = k
    A = sp.triu(-sp.csr_matrix(L), k=1).tocoo()
    m = (A.data > 0) & (part_of[A.row] != part_of[A.col])
    return {(int(i), int(j)): float(w) for i, j, w in zip(A.row[m], A.col[m], A.data[m])}, part_of


def test_sparsify_cut_draw_count_cap_and_info():
    from stages.l2g_net.gft import sparsify_cut
    L, parts, splits = _grid_parts()
    cut, part_of = _cut_edges(L, parts)
    T, cap = 3, 1e-9                      # the cap binds for every draw: each draw adds exactly cap·w_e
    Ls, info = sparsify_cut(L, parts, splits, target_cut=T, seed=5, max_reweight=cap)
    assert info == {"cut_edges_before": len(cut), "cut_edges_after": info["cut_edges_after"], "target_cut": T,
                    "splits": len(splits)}
    kept, _ = _cut_edges(Ls, parts)
    assert info["cut_edges_after"] == len(kept) and set(kept) <= set(cut)
    draws = sum(kept[e] / (cap * cut[e]) for e in kept)
    assert draws == pytest.approx(T * len(splits), rel=1e-9)              # T draws per split, no more
    Ld, Lsd = L.toarray(), Ls.toarray()
    same = part_of[:, None] == part_of[None, :]
    off = ~np.eye(L.shape[0], dtype=bool)
    np.testing.assert_array_equal(Lsd[same & off], Ld[same & off])
    np.testing.assert_allclose(Lsd.sum(1), 0, atol=1e-12)
    Ls2, _ = sparsify_cut(L, parts, splits, target_cut=T, seed=5, max_reweight=cap)
    assert (Ls2 != Ls).nnz == 0                                          # same seed, same graph


def test_sparsify_cut_is_unbiased_without_cap():
    # Horvitz-Thompson: E[Σ kept weight across the cut] = Σ w_e over the cut, for any sampling p
    from stages.l2g_net.gft import sparsify_cut
    L, parts, splits = _grid_parts()
    cut, _ = _cut_edges(L, parts)
    totals = []
    for seed in range(150):
        Ls, _ = sparsify_cut(L, parts, splits, target_cut=4, seed=seed, max_reweight=1e12)
        totals.append(sum(_cut_edges(Ls, parts)[0].values()))
    totals = np.array(totals)
    se = totals.std(ddof=1) / np.sqrt(len(totals))
    assert abs(totals.mean() - sum(cut.values())) < 4 * se, (totals.mean(), sum(cut.values()), se)
    capped = [sum(_cut_edges(sparsify_cut(L, parts, splits, target_cut=4, seed=s, max_reweight=1.0)[0], parts)[0]
                  .values()) for s in range(20)]
    assert max(capped) <= 4 * len(splits) * max(cut.values()) + 1e-9        # cap 1: at most T·max w per split


def test_sparsify_cut_keeps_diagonal_offset_and_rejects_bad_target():
    from stages.l2g_net.gft import sparsify_cut
    L, parts, splits = _grid_parts()
    c = np.linspace(0.1, 0.9, L.shape[0])
    Lg = sp.csr_matrix(L + sp.diags(c))               # a generalized Laplacian: D - W + diag(c)
    Ls, _ = sparsify_cut(Lg, parts, splits, target_cut=2, seed=1)
    np.testing.assert_allclose(np.asarray(Ls.sum(axis=1)).ravel(), c, atol=1e-12)
    for bad in (0, -2, True, 2.5, "3"):
        with pytest.raises(GraphInputError) as err:
            sparsify_cut(L, parts, splits, target_cut=bad)
        assert str(err.value) == f"target_cut: must be a positive integer (got {bad!r})"
