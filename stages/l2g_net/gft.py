"""L2G-Net's exact local-to-global factorization of the graph Fourier transform.

    fact = factorize(L)                 # L: symmetric graph Laplacian (numpy or scipy.sparse)
    fact.eigenvalues                    # ascending, shape [n]
    Y = fact.transform(X)               # U^T X,  X of shape [n] or [n, c]
    X = fact.inverse(Y)                 # U Y
    U = fact.dense()                    # only when asked

The method (card: papers/l2g_net.md):
  1. Split the nodes into parts (``parts`` or the built-in partitioner). With the cut edges removed
     the Laplacian L0 is block diagonal, so U0 = blockdiag(eigh of each part's Laplacian).
  2. Add each cut edge (i, j, w) back as a rank-one update L <- L + w v v^T, v = e_i - e_j.
     In the current eigenbasis this is D + w z z^T with z = U^T v, whose eigenpairs are found by
     deflation (tiny z_i; nearly equal d_i merged by Givens rotations), the secular equation
     (safeguarded rational/bisection root finding, one root per interlacing interval), and
     Gu-Eisenstat recomputation of z for orthogonal eigenvectors. The new basis is U <- U G C
     with C the Cauchy-like matrix C_ij = a_j z_i / (d_i - lam~_j).
  3. Hence U^T = P C_K^T G_K^T ... C_1^T G_1^T U0^T: one (Givens, Cauchy) factor per cut edge,
     kept as O(n) numbers each, never as an n x n matrix; ``transform``/``inverse`` apply the chain.
Rotations and Cauchy factors are applied to the z vectors of all later cut edges as soon as they
are found ("propagated to later updates"), so every update sees the exact current basis.

Partitioning: ``partition`` (used when ``parts`` is None) splits only where the cut is small and
reports every refused split in ``Factorization.partition_info``; ``Factorization.fallback`` names
the fallback (a part left to one dense eigh). ``bisection_parts`` forces k parts (the paper's
recursive bisection) and ``sparsify_cut`` is the paper's effective-resistance cut sparsification
(the factorization is then exact for the sparsified Laplacian, not for L).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import scipy.linalg
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from stages.l2g_net import secular_jit

EPS = np.finfo(np.float64).eps
ROW_BLOCK = 512  # rows/roots handled at once, so no temporary exceeds ROW_BLOCK x n


class GraphInputError(ValueError):
    """The Laplacian or the parts list is not valid; the message names the problem."""


# --------------------------------------------------------------------------------------------
# input checks
# --------------------------------------------------------------------------------------------
def _check_laplacian(L) -> sp.csr_matrix:
    """Validate L and return it as a float64 CSR matrix (symmetric, finite, weights >= 0)."""
    if sp.issparse(L):
        if np.iscomplexobj(L.data):
            raise GraphInputError(f"L: complex matrix (dtype {L.dtype}); a graph Laplacian is real")
        M = sp.csr_matrix(L, dtype=np.float64) if L.dtype != np.float64 else sp.csr_matrix(L)
    else:
        if np.iscomplexobj(L):
            raise GraphInputError(f"L: complex matrix (dtype {np.asarray(L).dtype}); a graph Laplacian is real")
        try:
            arr = np.asarray(L, dtype=np.float64)
        except (TypeError, ValueError) as err:
            raise GraphInputError(f"L: not a numeric matrix ({err})") from None
        if arr.ndim != 2:
            raise GraphInputError(f"L: expected a square 2-D matrix, got shape {arr.shape}")
        M = sp.csr_matrix(arr)
    n, m = M.shape
    if n != m:
        raise GraphInputError(f"L: expected a square matrix, got shape {M.shape}")
    if n == 0:
        raise GraphInputError("L: empty matrix (0 nodes)")
    M.sum_duplicates()
    bad = ~np.isfinite(M.data)
    if bad.any():
        coo = M.tocoo()
        k = int(np.flatnonzero(~np.isfinite(coo.data))[0])
        raise GraphInputError(f"L: contains NaN or infinite entries, e.g. L[{coo.row[k]}, {coo.col[k]}] = "
                              f"{coo.data[k]}")
    scale = float(np.abs(M.data).max()) if M.nnz else 0.0
    asym = (M - M.T).tocoo()
    if asym.nnz and np.abs(asym.data).max() > 1e-12 * max(scale, 1e-300):
        k = int(np.argmax(np.abs(asym.data)))
        i, j = int(asym.row[k]), int(asym.col[k])
        raise GraphInputError(f"L: not symmetric: L[{i}, {j}] = {float(M[i, j])!r} but L[{j}, {i}] = {float(M[j, i])!r}")
    off = sp.triu(M, k=1).tocoo()
    pos = off.data > 0
    if pos.any():
        k = int(np.flatnonzero(pos)[0])
        raise GraphInputError(
            f"L: negative edge weight between nodes {off.row[k]} and {off.col[k]}: L[{off.row[k]}, {off.col[k]}] "
            f"= {off.data[k]} > 0 (a Laplacian's off-diagonal entries are -w_ij with w_ij >= 0; "
            "did you pass an adjacency matrix?)")
    M = (M + M.T) * 0.5  # exact symmetry for the tolerance-level asymmetry allowed above
    return sp.csr_matrix(M)


def _check_parts(parts, n: int) -> list[np.ndarray]:
    if isinstance(parts, (str, bytes)) or not isinstance(parts, Sequence):
        raise GraphInputError(f"parts: expected a list of node-index lists, got {type(parts).__name__}")
    out, seen = [], np.zeros(n, dtype=np.int64)
    for k, part in enumerate(parts):
        try:
            arr = np.asarray(part)
        except (TypeError, ValueError):
            raise GraphInputError(f"parts[{k}]: not a list of node indices") from None
        if arr.ndim != 1:
            raise GraphInputError(f"parts[{k}]: expected a flat list of node indices, got shape {arr.shape}")
        if arr.size == 0:
            raise GraphInputError(f"parts[{k}]: empty part")
        if not np.issubdtype(arr.dtype, np.integer):
            raise GraphInputError(f"parts[{k}]: node indices must be integers (got dtype {arr.dtype})")
        if arr.min() < 0 or arr.max() >= n:
            bad = arr[(arr < 0) | (arr >= n)][0]
            raise GraphInputError(f"parts[{k}]: node index {int(bad)} out of range for a graph of {n} nodes")
        np.add.at(seen, arr, 1)
        out.append(arr.astype(np.int64))
    repeated = np.flatnonzero(seen > 1)
    if repeated.size:
        raise GraphInputError(f"parts: nodes listed more than once: {repeated[:10].tolist()}"
                              f"{' ...' if repeated.size > 10 else ''} (each node must be in exactly one part)")
    missing = np.flatnonzero(seen == 0)
    if missing.size:
        raise GraphInputError(f"parts: nodes missing from every part: {missing[:10].tolist()}"
                              f"{' ...' if missing.size > 10 else ''} ({missing.size} of {n}; every node must "
                              "be in exactly one part)")
    return out


# --------------------------------------------------------------------------------------------
# partitioner: connected components, then recursive spectral bisection (Fiedler sweep cut)
# --------------------------------------------------------------------------------------------
def _fiedler_vector(A: sp.csr_matrix) -> np.ndarray:
    """Fiedler vector of the graph with weighted adjacency A, made canonical: the projection of a fixed start
    vector onto the lambda_2 eigenspace (every eigenvector within a relative 1e-9 of lambda_2: the lowest
    eigenpairs are computed in growing batches until one lies above it; for a disconnected graph exactly the null
    space, from its components), orthogonal to the constant vector.
    When lambda_2 is repeated (square grids, hypercubes) an eigensolver's basis of it is arbitrary, and its last
    bits differ between processes and machines; the projection is not (up to rounding), so the sweep cut is
    reproducible."""
    m = A.shape[0]
    v0 = np.cos(np.arange(m) * 0.7 + 0.1)  # deterministic start vector
    nc, labels = connected_components(A, directed=False)
    if nc > 1:  # lambda_2 = 0: its eigenspace is the null space, spanned by the components' indicators, so the
        # projection of v0 onto it is v0's mean on each component (exact, no eigensolver: shift-invert ARPACK
        # stalls on null spaces of dozens of components, as the parts of sparse BA graphs have)
        v = (np.bincount(labels, weights=v0) / np.bincount(labels))[labels]
        v -= v.mean()
        if np.linalg.norm(v) > 1e-8 * np.linalg.norm(v0):
            return v / np.linalg.norm(v)
    deg = np.asarray(A.sum(axis=1)).ravel()
    Lp = sp.diags(deg) - A
    tol = 1e-9 * max(2.0 * float(deg.max()), 1e-300)          # lambda_max <= 2 max degree
    top = min(m - 1, 3)
    while True:
        vals, vecs = _lowest_eigenpairs(Lp, top, v0, deg)
        if top == m - 1 or vals[-1] - vals[1] > tol:          # the whole lambda_2 eigenspace is in hand
            break
        top = min(m - 1, 2 * top + 1)
    space = vecs[:, np.abs(vals - vals[1]) <= tol]            # the lambda_2 eigenspace (with the null space if 0)
    v = space @ (space.T @ v0)
    v -= v.mean()                                             # orthogonal to the constant vector
    if np.linalg.norm(v) <= 1e-8 * np.linalg.norm(v0):        # v0 (almost) orthogonal to it: an eigenvector
        v = vecs[:, 1] - vecs[:, 1].mean()
    return v / np.linalg.norm(v)


def _lowest_eigenpairs(Lp: sp.spmatrix, top: int, v0: np.ndarray, deg: np.ndarray):
    """Eigenpairs 0..top of the Laplacian Lp, ascending (dense eigh up to 400 nodes, else shift-invert ARPACK)."""
    m = Lp.shape[0]
    if m <= 400:
        return scipy.linalg.eigh(Lp.toarray(), subset_by_index=[0, top])
    from scipy.sparse.linalg import ArpackError, eigsh

    shift = 1e-3 * max(float(deg.max()), 1e-12)
    try:
        vals, vecs = eigsh(sp.csc_matrix(Lp), k=top + 1, sigma=-shift, which="LM", v0=v0)
    except ArpackError:  # no convergence, or "no shifts could be applied" (error 3: a null space of dozens of
        # components, as the parts of a sparse BA graph can have): dense eigh instead (slower, exact)
        return scipy.linalg.eigh(Lp.toarray(), subset_by_index=[0, top])
    order = np.argsort(vals)
    return vals[order], vecs[:, order]


def _sweep_cut(A: sp.csr_matrix, fiedler: np.ndarray, min_size: int) -> tuple[np.ndarray, int]:
    """Best ratio cut (#cut edges / (|S| |T|)) among prefixes of the Fiedler ordering."""
    m = A.shape[0]
    order = np.argsort(fiedler, kind="stable")
    B = (A[order][:, order] != 0).astype(np.float64)
    deg = np.asarray(B.sum(axis=1)).ravel()
    back = np.asarray(sp.tril(B, k=-1).sum(axis=1)).ravel()  # edges to earlier nodes in the order
    cut = np.cumsum(deg - 2 * back)                           # cut edges after taking order[:k+1]
    sizes = np.arange(1, m + 1)
    ok = (sizes >= min_size) & (m - sizes >= min_size)
    ratio = np.where(ok, cut / (sizes * np.maximum(m - sizes, 1)), np.inf)
    k = int(np.argmin(ratio))
    mask = np.zeros(m, dtype=bool)
    mask[order[: k + 1]] = True
    return mask, int(round(cut[k]))


def _check_partitioner_args(min_part_size, max_cut_fraction) -> None:
    if isinstance(min_part_size, bool) or not isinstance(min_part_size, (int, np.integer)) or min_part_size <= 0:
        raise GraphInputError(f"min_part_size: must be a positive integer (got {min_part_size!r})")
    if not isinstance(max_cut_fraction, (int, float)) or not np.isfinite(max_cut_fraction) or max_cut_fraction <= 0:
        raise GraphInputError(f"max_cut_fraction: must be a finite number > 0 (got {max_cut_fraction!r})")


def _adjacency(M: sp.csr_matrix) -> sp.csr_matrix:
    A = -(M - sp.diags(M.diagonal()))
    A.eliminate_zeros()
    return sp.csr_matrix(A)


def partition_with_info(L, min_part_size: int = 48, max_cut_fraction: float = 1 / 48) -> tuple[list[np.ndarray], dict]:
    """``partition`` plus what it refused: ``info["refused"]`` lists every split it declined (part
    size, cut edges of the best sweep cut, the limit) and ``info["fallback"]`` names the fallback
    when a refusal left a part to one dense eigh (None when no split was refused)."""
    _check_partitioner_args(min_part_size, max_cut_fraction)
    M = _check_laplacian(L)
    A = _adjacency(M)
    parts: list[np.ndarray] = []
    refused: list[dict] = []
    stack = [np.arange(M.shape[0])]
    while stack:
        nodes = stack.pop()
        sub = A[nodes][:, nodes]
        ncomp, labels = connected_components(sub, directed=False)
        if ncomp > 1:  # free split: no edges between components
            stack.extend(nodes[labels == c] for c in range(ncomp))
            continue
        if nodes.size < 2 * min_part_size:
            parts.append(nodes)
            continue
        mask, ncut = _sweep_cut(sub, _fiedler_vector(sub), min_part_size)
        if ncut <= max_cut_fraction * nodes.size:
            stack.extend([nodes[mask], nodes[~mask]])
        else:
            parts.append(nodes)
            refused.append({"size": int(nodes.size), "cut_edges": int(ncut),
                            "limit": float(max_cut_fraction * nodes.size)})
    parts.sort(key=lambda p: int(p.min()))
    fallback = None
    if refused:
        big = max(r["size"] for r in refused)
        kind = "single_dense_eigh" if len(parts) == 1 else "dense_eigh_on_refused_parts"
        fallback = (f"{kind}: the partitioner refused {len(refused)} split(s) (best sweep cut "
                    f"{min(r['cut_edges'] for r in refused)} edges > max_cut_fraction x part size); "
                    f"the largest unsplit part ({big} nodes) is solved by one dense eigh")
    return parts, {"method": "spectral_bisection", "refused": refused, "fallback": fallback}


def partition(L, min_part_size: int = 48, max_cut_fraction: float = 1 / 48) -> list[np.ndarray]:
    """Parts for the factorization: connected components, split recursively by spectral bisection.

    A part of s nodes is split (sweep cut of its Fiedler vector) only when both halves keep at
    least ``min_part_size`` nodes and the cut has at most ``max_cut_fraction * s`` edges: each cut
    edge costs one O(s^2) rank-one update, each split saves ~3/4 of an O(s^3) eigendecomposition.
    Refused splits are reported by ``partition_with_info``.
    """
    return partition_with_info(L, min_part_size, max_cut_fraction)[0]


PARTITIONERS = ("auto", "metis", "spectral")


def resolve_partitioner(method: str = "auto") -> str:
    """The bisection that ``bisection_parts`` runs: "metis" (pymetis, as the official code) when
    requested or, for "auto", when pymetis imports; else "spectral" (Fiedler sweep cuts)."""
    if method not in PARTITIONERS:
        raise GraphInputError(f"partitioner: expected one of {', '.join(PARTITIONERS)} (got {method!r})")
    if method == "spectral":
        return "spectral"
    try:
        import pymetis  # noqa: F401
    except ImportError:
        if method == "metis":
            raise GraphInputError("partitioner: 'metis' requested but pymetis is not installed "
                                  "(pip install pymetis, or use 'auto' / 'spectral')") from None
        return "spectral"
    return "metis"


def _metis_bisect(sub: sp.csr_matrix, seed: int = 0) -> np.ndarray:
    """# ALGO: METIS 2-way partition of the (unweighted) graph (the official code's recursive bisection)."""
    import pymetis

    B = sp.csr_matrix((sub != 0).astype(np.int8))
    B.setdiag(0)
    B.eliminate_zeros()
    B.sort_indices()
    res = pymetis.part_graph(2, adjacency=pymetis.CSRAdjacency(B.indptr.astype(np.int64), B.indices.astype(np.int64)),
                             options=pymetis.Options(seed=seed))
    mask = np.asarray(res.vertex_part) == 0
    if mask.all() or not mask.any():          # METIS left one side empty (tiny / edgeless graph)
        mask = np.zeros(sub.shape[0], dtype=bool)
        mask[: sub.shape[0] // 2] = True
    return mask


def bisection_parts(L, num_parts: int, balance: float = 1 / 3,
                    method: str = "auto") -> tuple[list[np.ndarray], list[tuple[list[int], list[int]]]]:
    """Recursive bisection into exactly ``num_parts`` parts whatever the cut (the paper's METIS
    recursive bisection): the largest part is split in two, by METIS (``method`` "metis", or "auto"
    with pymetis installed; ``resolve_partitioner`` says which) or by a Fiedler sweep cut with both
    halves >= ``balance`` x size ("spectral", the fallback).

    Returns (parts, splits): splits[k] = (part ids on one side, part ids on the other) of the k-th
    bisection, so every cut edge crosses exactly one split (used by ``sparsify_cut``).
    """
    M = _check_laplacian(L)
    n = M.shape[0]
    if isinstance(num_parts, bool) or not isinstance(num_parts, (int, np.integer)) or not 1 <= num_parts <= n:
        raise GraphInputError(f"num_parts: must be an integer in [1, {n}] (got {num_parts!r})")
    if not 0 < balance <= 0.5:
        raise GraphInputError(f"balance: must be in (0, 0.5] (got {balance!r})")
    which = resolve_partitioner(method)
    A = _adjacency(M)
    groups: list[np.ndarray] = [np.arange(n)]
    tree: list[tuple[int, int]] = []   # (group a, group b) created by each split
    while len(groups) < num_parts:
        g = int(np.argmax([x.size for x in groups]))
        nodes = groups[g]
        if nodes.size < 2:
            break
        sub = A[nodes][:, nodes]
        if which == "metis":
            mask = _metis_bisect(sub)
        else:
            mask, _ = _sweep_cut(sub, _fiedler_vector(sub), max(1, int(np.ceil(balance * nodes.size))))
        groups[g] = nodes[mask]
        groups.append(nodes[~mask])
        tree.append((g, len(groups) - 1))
    # leaves are the final groups; a split (g, h) separates the leaves descending from g after the
    # split from those descending from h: replay the splits backwards to collect them
    desc = {i: {i} for i in range(len(groups))}
    splits_rev = []
    for g, h in reversed(tree):
        splits_rev.append((sorted(desc[g]), sorted(desc[h])))
        desc[g] = desc[g] | desc[h]
    return groups, list(reversed(splits_rev))


def sparsify_cut(L, parts: list, splits: list[tuple[list[int], list[int]]], target_cut: int, seed: int = 0,
                 n_sketches: int = 16, max_reweight: float = 5.0) -> tuple[sp.csr_matrix, dict]:
    """# ALGO: effective-resistance cut sparsification (Spielman-Srivastava, as the official code):
    for each bisection, sample ``target_cut`` of its cut edges with p_e ~ w_e R_e (R_e from JL
    sketches, CG solves of (L + 1e-4 I)), re-weight each draw by w_e / (target_cut p_e) capped at
    ``max_reweight`` x w_e, and drop the other cut edges. Returns (L_sparse, info); the factorization
    of L_sparse is exact for L_sparse, not for L."""
    from scipy.sparse.linalg import cg

    M = _check_laplacian(L)
    n = M.shape[0]
    if isinstance(target_cut, bool) or not isinstance(target_cut, (int, np.integer)) or target_cut <= 0:
        raise GraphInputError(f"target_cut: must be a positive integer (got {target_cut!r})")
    plist = _check_parts(parts, n)
    part_of = np.empty(n, dtype=np.int64)
    for k, nodes in enumerate(plist):
        part_of[nodes] = k
    rng = np.random.default_rng(seed)
    A = sp.triu(_adjacency(M), k=1).tocoo()
    rows, cols, w = A.row, A.col, A.data
    is_cut = part_of[rows] != part_of[cols]
    lap = sp.diags(np.asarray(_adjacency(M).sum(axis=1)).ravel()) - _adjacency(M)
    Lreg = sp.csr_matrix(lap + 1e-4 * sp.eye(n))
    Q = rng.choice([-1.0, 1.0], size=(n, n_sketches)) / np.sqrt(n_sketches)
    Z = np.column_stack([cg(Lreg, Q[:, k], rtol=1e-3, maxiter=200)[0] for k in range(n_sketches)])
    side = np.full(len(plist), -1)
    keep = ~is_cut
    new_r, new_c, new_w = [], [], []
    before = int(is_cut.sum())
    for left, right in splits:
        side[:] = -1
        side[left] = 0
        side[right] = 1
        sa, sb = side[part_of[rows]], side[part_of[cols]]
        sel = np.flatnonzero(is_cut & (sa >= 0) & (sb >= 0) & (sa != sb))
        if sel.size <= target_cut:
            keep[sel] = True
            continue
        R = ((Z[rows[sel]] - Z[cols[sel]]) ** 2).sum(axis=1)
        imp = np.maximum(w[sel] * R, 1e-300)
        p = imp / imp.sum()
        kept: dict[int, float] = {}
        for e in rng.choice(sel.size, size=target_cut, replace=True, p=p):
            kept[int(e)] = kept.get(int(e), 0.0) + w[sel[e]] * min(1.0 / (target_cut * p[e]), max_reweight)
        for e, wt in sorted(kept.items()):
            new_r.append(rows[sel[e]]), new_c.append(cols[sel[e]]), new_w.append(wt)
    r = np.concatenate([rows[keep], np.asarray(new_r, dtype=rows.dtype)])
    c = np.concatenate([cols[keep], np.asarray(new_c, dtype=cols.dtype)])
    ww = np.concatenate([w[keep], np.asarray(new_w)])
    W = sp.coo_matrix((ww, (r, c)), shape=(n, n))
    W = sp.csr_matrix(W + W.T)
    # keep L's diagonal offset (L - (D - W): zero for a combinatorial Laplacian) so that normalized /
    # generalized Laplacians keep their self-terms
    offset = M.diagonal() - np.asarray(_adjacency(M).sum(axis=1)).ravel()
    Ls = sp.csr_matrix(sp.diags(np.asarray(W.sum(axis=1)).ravel() + offset) - W)
    after = int((part_of[r] != part_of[c]).sum())
    return Ls, {"cut_edges_before": before, "cut_edges_after": after, "target_cut": int(target_cut),
                "splits": len(splits)}


def _order_cut_edges(part_of: np.ndarray, sizes: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Greedy merge order: next the cut edge whose endpoint groups have the smallest union.

    The order changes only the cost (the active size m of each update), never the result.
    """
    parent = np.arange(sizes.size)
    size = sizes.astype(np.int64).copy()

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    remaining = list(range(len(edges)))
    order = []
    while remaining:
        best, best_cost = None, None
        for pos, e in enumerate(remaining):
            ga, gb = find(part_of[edges[e, 0]]), find(part_of[edges[e, 1]])
            cost = size[ga] if ga == gb else size[ga] + size[gb]
            if best_cost is None or cost < best_cost:
                best, best_cost = pos, cost
        e = remaining.pop(best)
        ga, gb = find(part_of[edges[e, 0]]), find(part_of[edges[e, 1]])
        if ga != gb:
            parent[gb] = ga
            size[ga] += size[gb]
        order.append(e)
    return np.asarray(order, dtype=np.int64)


# --------------------------------------------------------------------------------------------
# the secular equation
# --------------------------------------------------------------------------------------------
def solve_secular(d: np.ndarray, z: np.ndarray, rho: float, max_iter: int = 200):
    """Roots of f(lam) = 1/rho + sum_i z_i^2 / (d_i - lam) as (origin, tau): the compiled per-root loop of
    ``secular_jit`` (the method of ``solve_secular_numpy``, which the tests compare it with)."""
    m = d.size
    z2 = z * z
    if m == 1:
        return np.zeros(1, dtype=np.int64), np.array([rho * z2[0]])
    origin, tau = np.empty(m, dtype=np.int64), np.empty(m)
    secular_jit.secular_roots(np.ascontiguousarray(d, dtype=np.float64), z2, float(rho), int(max_iter), origin, tau)
    return origin, tau


def solve_secular_numpy(d: np.ndarray, z: np.ndarray, rho: float, max_iter: int = 200):
    """Roots of f(lam) = 1/rho + sum_i z_i^2 / (d_i - lam) for strictly increasing d, z != 0, rho > 0.

    # ALGO: secular equation 1 + rho sum_i z_i^2/(d_i - lam~) = 0, root j in (d_j, d_{j+1}),
    #       last root in (d_m, d_m + rho |z|^2) (interlacing).
    Each root is returned as (origin index k_j, offset tau_j) with lam~_j = d[k_j] + tau_j and the
    origin the nearer pole, so that d_i - lam~_j = (d_i - d[k_j]) - tau_j is accurate to full
    relative precision (needed for orthogonal eigenvectors). Iteration: a two-pole rational model
    of f matched in value and slope (Bunch-Nielsen-Sorensen fixed weights), safeguarded by the
    bracket kept from the sign of f (bisection when the model step leaves it).
    """
    m = d.size
    z2 = z * z
    if m == 1:
        return np.zeros(1, dtype=np.int64), np.array([rho * z2[0]])
    origin = np.empty(m, dtype=np.int64)
    tau = np.empty(m)
    for start in range(0, m, ROW_BLOCK):
        cols = np.arange(start, min(m, start + ROW_BLOCK))
        origin[cols], tau[cols] = _solve_block(d, z2, rho, cols, max_iter)
    return origin, tau


def _secular_terms(d, z2, rho, origin, tau, pole):
    """f, psi', phi', |sum| and the two pole distances at lam = d[origin] + tau (vector over roots)."""
    delta = (d[:, None] - d[origin][None, :]) - tau[None, :]        # (m, a): d_i - lam
    t = z2[:, None] / delta
    t2 = t / delta
    lower = np.arange(d.size)[:, None] <= pole[None, :]             # psi: poles i <= p, phi: i > p
    # sign-separated sums (as LAPACK dlaed4): psi <= 0 and phi >= 0 are each summed without
    # cancellation (numpy pairwise summation); the one cancelling addition comes last
    psi = np.where(lower, t, 0.0).sum(axis=0)
    phi = np.where(lower, 0.0, t).sum(axis=0)
    f = (1.0 / rho + psi) + phi
    dpsi = np.where(lower, t2, 0.0).sum(axis=0)
    dphi = np.where(lower, 0.0, t2).sum(axis=0)
    err = 1.0 / rho + np.abs(phi) + np.abs(psi)                      # sum of |terms|: the rounding scale of f
    cols = np.arange(tau.size)
    return f, dpsi, dphi, err, delta[pole, cols], delta[pole + 1, cols]


def _solve_block(d, z2, rho, roots, max_iter):
    m = d.size
    a = roots.size
    last = roots == m - 1
    pole = np.where(last, m - 2, roots)              # the two-pole model uses d_p, d_{p+1}
    origin = roots.copy()
    gap = np.where(last, rho * z2.sum(), d[np.minimum(roots + 1, m - 1)] - d[roots])
    lo = np.zeros(a)
    hi = gap.copy()
    inner = ~last
    if inner.any():  # the sign of f at the interval's midpoint says which pole is nearer
        idx = np.flatnonzero(inner)
        f_mid = 1.0 / rho + (z2[:, None] / ((d[:, None] - d[roots[idx]][None, :]) - 0.5 * gap[idx][None, :])).sum(0)
        right = f_mid < 0                             # root in the upper half -> shift to d_{j+1}
        r = idx[right]
        origin[r] = roots[r] + 1
        lo[r], hi[r] = -0.5 * gap[r], 0.0
        lft = idx[~right]
        hi[lft] = 0.5 * gap[lft]
    tau = 0.5 * (lo + hi)
    active = np.arange(a)
    for _ in range(max_iter):
        if active.size == 0:
            break
        o, t, p = origin[active], tau[active], pole[active]
        f, dpsi, dphi, err, dp, dq = _secular_terms(d, z2, rho, o, t, p)
        # bracket update from the sign of the increasing function f
        lo[active] = np.where(f < 0, t, lo[active])
        hi[active] = np.where(f > 0, t, hi[active])
        width = hi[active] - lo[active]
        done = (np.abs(f) <= 4 * EPS * err) | (width <= 2 * EPS * np.maximum(np.abs(lo[active]), np.abs(hi[active])))
        # ALGO: rational model f ~ C + b/(dp - eta) + e/(dq - eta), b = dp^2 psi', e = dq^2 phi'
        C = f - dp * dpsi - dq * dphi
        B = C * (dp + dq) + dp * dp * dpsi + dq * dq * dphi
        c0 = dp * dq * f
        disc = B * B - 4.0 * C * c0
        with np.errstate(all="ignore"):
            sq = np.sqrt(np.maximum(disc, 0.0))
            q = 0.5 * (B + np.copysign(sq, B))
            eta1 = np.where(C != 0, q / C, np.nan)
            eta2 = np.where(q != 0, c0 / q, np.nan)
        cand1, cand2 = t + eta1, t + eta2
        lo_a, hi_a = lo[active], hi[active]
        in1 = (cand1 > lo_a) & (cand1 < hi_a) & (disc >= 0)
        in2 = (cand2 > lo_a) & (cand2 < hi_a) & (disc >= 0)
        pick2 = in2 & (~in1 | (np.abs(eta2) < np.abs(eta1)))
        new = np.where(pick2, cand2, np.where(in1, cand1, 0.5 * (lo_a + hi_a)))  # safeguard: bisection
        tau[active] = np.where(done, t, new)
        active = active[~done]
    return origin, tau


def gu_eisenstat_z_numpy(d, z, rho, origin, tau):
    """Reference of ``secular_jit.gu_eisenstat_z`` (vectorized in row blocks).

    # ALGO: Gu-Eisenstat: z^_i^2 = prod_j (lam~_j - d_i) / (rho prod_{j != i} (d_j - d_i)).

    Evaluated as a product of ratios that each lie in (0, 1]: for j < i (lam~_j - d_i)/(d_j - d_i),
    for i <= j < m-1 (lam~_j - d_i)/(d_{j+1} - d_i), and (lam~_m - d_i)/rho; the eigenvectors built
    from z^ are then numerically orthogonal even when computed roots are close to the poles.
    """
    m = d.size
    zhat = np.empty(m)
    jj = np.arange(m)
    for start in range(0, m, ROW_BLOCK):
        rows = np.arange(start, min(m, start + ROW_BLOCK))
        num = -((d[rows][:, None] - d[origin][None, :]) - tau[None, :])  # lam~_j - d_i
        nxt = np.minimum(jj + 1, m - 1)
        den = np.where(jj[None, :] < rows[:, None], d[None, :] - d[rows][:, None],
                       d[nxt][None, :] - d[rows][:, None])
        den[:, m - 1] = rho
        zhat[rows] = np.sqrt(np.prod(num / den, axis=1))
    return np.copysign(zhat, z)


def column_scales_numpy(d, zhat, origin, tau):
    """Reference of ``secular_jit.column_scales``: a_j = 1 / || z^ / (d - lam~_j) ||, which makes each Cauchy
    column a unit eigenvector."""
    m = d.size
    a = np.empty(m)
    for start in range(0, m, ROW_BLOCK):
        cols = np.arange(start, min(m, start + ROW_BLOCK))
        delta = (d[:, None] - d[origin[cols]][None, :]) - tau[cols][None, :]
        a[cols] = 1.0 / np.sqrt(((zhat[:, None] / delta) ** 2).sum(axis=0))
    return a


# --------------------------------------------------------------------------------------------
# Cauchy factors
# --------------------------------------------------------------------------------------------
CauchyFn = Callable[..., np.ndarray]


def cauchy_apply_numpy(z, d, org, tau, a, X, transpose: bool = True) -> np.ndarray:
    """C^T X (transpose) or C X with C_ij = a_j z_i / ((d_i - org_j) - tau_j), row blocks at a time."""
    m = d.size
    out = np.empty((m, X.shape[1]))
    for start in range(0, m, ROW_BLOCK):
        r = slice(start, min(m, start + ROW_BLOCK))
        if transpose:   # rows j of C^T
            blk = (a[r][:, None] * z[None, :]) / ((d[None, :] - org[r][:, None]) - tau[r][:, None])
        else:           # rows i of C
            blk = (z[r][:, None] * a[None, :]) / ((d[r][:, None] - org[None, :]) - tau[None, :])
        out[r] = blk @ X
    return out


@dataclass
class CauchyFactor:
    """One cut edge's factor: Givens rotations (deflation) then a Cauchy-like block on rows ``idx``."""

    rot_p: np.ndarray   # rotation planes (p, j): row p is deflated, j carries the merged weight
    rot_j: np.ndarray
    rot_c: np.ndarray
    rot_s: np.ndarray
    idx: np.ndarray     # non-deflated positions, ordered by increasing old eigenvalue d
    d: np.ndarray       # old eigenvalues at idx
    z: np.ndarray       # Gu-Eisenstat z^
    org: np.ndarray     # origin pole value per new root (lam~_j = org_j + tau_j)
    tau: np.ndarray
    a: np.ndarray       # column normalizers

    def forward(self, Y: np.ndarray, cauchy: CauchyFn) -> None:
        """Y <- (G C)^T Y in place (coefficients in the old basis -> the new one)."""
        for p, j, c, s in zip(self.rot_p, self.rot_j, self.rot_c, self.rot_s):
            yp, yj = Y[p].copy(), Y[j].copy()
            Y[p], Y[j] = c * yp - s * yj, s * yp + c * yj
        if self.idx.size:
            Y[self.idx] = cauchy(self.z, self.d, self.org, self.tau, self.a, Y[self.idx], transpose=True)

    def backward(self, Y: np.ndarray, cauchy: CauchyFn) -> None:
        """Y <- (G C) Y in place."""
        if self.idx.size:
            Y[self.idx] = cauchy(self.z, self.d, self.org, self.tau, self.a, Y[self.idx], transpose=False)
        for p, j, c, s in zip(self.rot_p[::-1], self.rot_j[::-1], self.rot_c[::-1], self.rot_s[::-1]):
            yp, yj = Y[p].copy(), Y[j].copy()
            Y[p], Y[j] = c * yp + s * yj, -s * yp + c * yj


def rank_one_update(lam: np.ndarray, z: np.ndarray, w: float, later: np.ndarray | None = None) -> CauchyFactor:
    """Eigen-update of diag(lam) + w z z^T; lam is updated in place, ``later`` z's are propagated.

    ``lam`` holds the current eigenvalues by position; the returned factor maps coefficients in the
    current basis to the new one.
    """
    nz = float(np.linalg.norm(z))
    rho = w * nz * nz
    zh = z / nz if nz > 0 else z.copy()
    tol = 8.0 * EPS * max(float(np.abs(lam).max()), rho)
    empty_i, empty_f = np.zeros(0, dtype=np.int64), np.zeros(0)
    # ALGO: deflation (1): rho |z_i| <= tol -> (lam_i, u_i) stays an eigenpair
    cand = np.flatnonzero(rho * np.abs(zh) > tol)
    cand = cand[np.argsort(lam[cand], kind="stable")]
    # ALGO: deflation (2): nearly equal lam_p ~ lam_j -> Givens rotation zeroing z_p (dlaed2's rule)
    rp, rj, rc, rs, keep = [], [], [], [], []
    lam_l, z_l = lam.tolist(), zh.tolist()
    prev = None
    for j in cand.tolist():
        if prev is None:
            prev = j
            continue
        zp, zj = z_l[prev], z_l[j]
        r = float(np.hypot(zp, zj))
        c, s = zj / r, zp / r
        if abs((lam_l[j] - lam_l[prev]) * c * s) <= tol:
            lp, lj = lam_l[prev], lam_l[j]
            lam_l[prev], lam_l[j] = c * c * lp + s * s * lj, s * s * lp + c * c * lj
            z_l[prev], z_l[j] = 0.0, r
            rp.append(prev), rj.append(j), rc.append(c), rs.append(s)
        else:
            keep.append(prev)
        prev = j
    if prev is not None:
        keep.append(prev)
    lam[:] = lam_l
    zh = np.asarray(z_l)
    idx = np.asarray(keep, dtype=np.int64)
    idx = idx[np.argsort(lam[idx], kind="stable")]
    rot = (np.asarray(rp, dtype=np.int64), np.asarray(rj, dtype=np.int64), np.asarray(rc), np.asarray(rs))
    if idx.size == 0:
        fac = CauchyFactor(*rot, empty_i, empty_f, empty_f, empty_f, empty_f, empty_f)
    else:
        d = lam[idx].copy()
        zz = zh[idx]
        if np.any(np.diff(d) <= 0):  # cannot happen after deflation (2); guard the solver's contract
            raise RuntimeError("rank-one update: non-deflated eigenvalues are not strictly increasing")
        rho_k = w * nz * nz
        origin, tau = solve_secular(d, zz, rho_k)
        zhat = secular_jit.gu_eisenstat_z(d, zz, rho_k, origin, tau)
        a = secular_jit.column_scales(d, zhat, origin, tau)
        org = d[origin]
        fac = CauchyFactor(*rot, idx, d, zhat, org, tau, a)
        lam[idx] = org + tau
    if later is not None and later.size:
        # only later z's that are nonzero on the rows this factor touches change (a z of an edge in
        # another, not yet merged group of parts is exactly zero there): skip the rest
        touched = np.concatenate([fac.idx, fac.rot_p, fac.rot_j])
        cols = np.flatnonzero(np.any(later[touched] != 0, axis=0)) if touched.size else np.zeros(0, np.int64)
        if cols.size == later.shape[1]:
            fac.forward(later, cauchy_apply_numpy)
        elif cols.size:
            sub = later[:, cols]
            fac.forward(sub, cauchy_apply_numpy)
            later[:, cols] = sub
    return fac


# --------------------------------------------------------------------------------------------
# the factorization
# --------------------------------------------------------------------------------------------
@dataclass
class Factorization:
    """U^T = P C_K^T G_K^T ... C_1^T G_1^T U0^T, kept as local bases plus one factor per cut edge."""

    n: int
    parts: list[np.ndarray]
    local_bases: list[np.ndarray]       # eigenvectors of each part's Laplacian
    local_eigenvalues: np.ndarray       # by position (U0 coordinates)
    offsets: np.ndarray                 # position of each part's first eigenvector
    factors: list[CauchyFactor]
    cut_edges: np.ndarray               # (K, 2), in update order
    cut_weights: np.ndarray
    order: np.ndarray                   # positions sorted by eigenvalue
    eigenvalues: np.ndarray             # ascending
    timings: dict = field(default_factory=dict)
    partition_info: dict = field(default_factory=dict)   # partitioner's refusals (see partition_with_info)

    @property
    def fallback(self) -> str | None:
        """Names the fallback when the partitioner refused a cut (a part solved by one dense eigh)."""
        return self.partition_info.get("fallback")

    def chain_matrix(self, cauchy: CauchyFn | None = None) -> np.ndarray:
        """The (n, n) product P C_K^T G_K^T ... C_1^T G_1^T (local coefficients, position order ->
        global spectral coefficients): the official code's ``basis_cauchy`` (Eq. 10), formed by
        applying every factor to the identity (all n columns at once)."""
        Y = np.eye(self.n)
        for fac in self.factors:
            fac.forward(Y, cauchy or cauchy_apply_numpy)
        return Y[self.order]

    def _as_matrix(self, X, what: str) -> tuple[np.ndarray, bool]:
        arr = np.asarray(X, dtype=np.float64)
        if arr.ndim not in (1, 2) or arr.shape[0] != self.n:
            raise ValueError(f"{what}: expected shape [{self.n}] or [{self.n}, c], got {arr.shape}")
        return (arr[:, None].copy() if arr.ndim == 1 else arr.copy()), arr.ndim == 1

    def local_transform(self, X: np.ndarray) -> np.ndarray:
        """U0^T X (block by block), in position order."""
        Y = np.empty_like(X)
        for nodes, Q, off in zip(self.parts, self.local_bases, self.offsets):
            Y[off:off + nodes.size] = Q.T @ X[nodes]
        return Y

    def local_inverse(self, Y: np.ndarray) -> np.ndarray:
        X = np.empty_like(Y)
        for nodes, Q, off in zip(self.parts, self.local_bases, self.offsets):
            X[nodes] = Q @ Y[off:off + nodes.size]
        return X

    def transform(self, X, cauchy: CauchyFn | None = None) -> np.ndarray:
        """U^T X for X of shape [n] or [n, c] (the graph Fourier transform)."""
        cauchy = cauchy or cauchy_apply_numpy
        M, vec = self._as_matrix(X, "transform(X)")
        Y = self.local_transform(M)
        for fac in self.factors:
            fac.forward(Y, cauchy)
        Y = Y[self.order]
        return Y[:, 0] if vec else Y

    def inverse(self, Y, cauchy: CauchyFn | None = None) -> np.ndarray:
        """U Y for Y of shape [n] or [n, c] (the inverse graph Fourier transform)."""
        cauchy = cauchy or cauchy_apply_numpy
        M, vec = self._as_matrix(Y, "inverse(Y)")
        Z = np.empty_like(M)
        Z[self.order] = M
        for fac in reversed(self.factors):
            fac.backward(Z, cauchy)
        X = self.local_inverse(Z)
        return X[:, 0] if vec else X

    def filter(self, h: Callable[[np.ndarray], np.ndarray], X, cauchy: CauchyFn | None = None) -> np.ndarray:
        """h(L) X = U h(Lambda) U^T X."""
        Y = self.transform(X, cauchy)
        resp = h(self.eigenvalues)
        Y = Y * (resp if Y.ndim == 1 else resp[:, None])
        return self.inverse(Y, cauchy)

    def dense(self) -> np.ndarray:
        """The n x n eigenvector matrix U (columns in eigenvalue order); O(K n^3), only on request."""
        return self.inverse(np.eye(self.n))


def factorize(L, parts=None, *, min_part_size: int = 48, max_cut_fraction: float = 1 / 48) -> Factorization:
    """Exact eigendecomposition of the graph Laplacian L as local bases + one Cauchy factor per cut edge."""
    import time

    t0 = time.process_time()  # CPU seconds of this process (robust to other jobs on the machine)
    _check_partitioner_args(min_part_size, max_cut_fraction)
    M = _check_laplacian(L)
    n = M.shape[0]
    if parts is None:
        parts_list, info = partition_with_info(M, min_part_size=min_part_size, max_cut_fraction=max_cut_fraction)
    else:
        parts_list, info = _check_parts(parts, n), {"method": "given", "refused": [], "fallback": None}
    t1 = time.process_time()
    part_of = np.empty(n, dtype=np.int64)
    local_index = np.empty(n, dtype=np.int64)
    for k, nodes in enumerate(parts_list):
        part_of[nodes] = k
        local_index[nodes] = np.arange(nodes.size)
    upper = sp.triu(M, k=1).tocoo()
    keep = upper.data != 0
    rows, cols, w = upper.row[keep], upper.col[keep], -upper.data[keep]
    is_cut = part_of[rows] != part_of[cols]
    edges = np.stack([rows[is_cut], cols[is_cut]], axis=1).astype(np.int64)
    weights = w[is_cut]
    # ALGO: L = L0 + sum_cut w (e_i - e_j)(e_i - e_j)^T, L0 block diagonal over the parts
    cut_deg = np.zeros(n)
    np.add.at(cut_deg, edges[:, 0], weights)
    np.add.at(cut_deg, edges[:, 1], weights)
    sizes = np.array([p.size for p in parts_list], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    bases, lam0 = [], np.empty(n)
    for nodes, off in zip(parts_list, offsets):
        block = M[nodes][:, nodes].toarray()
        block[np.diag_indices_from(block)] -= cut_deg[nodes]
        vals, vecs = scipy.linalg.eigh(block)   # local GFT of one subgraph
        bases.append(vecs)
        lam0[off:off + nodes.size] = vals
    t2 = time.process_time()
    order_e = _order_cut_edges(part_of, sizes, edges) if len(edges) else np.zeros(0, dtype=np.int64)
    edges, weights = edges[order_e], weights[order_e]
    # z of every cut edge in the U0 basis: U0^T (e_i - e_j) = row i of U0 - row j of U0
    Z = np.zeros((n, len(edges)))
    for k, (i, j) in enumerate(edges):
        Z[offsets[part_of[i]] + np.arange(sizes[part_of[i]]), k] += bases[part_of[i]][local_index[i]]
        Z[offsets[part_of[j]] + np.arange(sizes[part_of[j]]), k] -= bases[part_of[j]][local_index[j]]
    lam = lam0.copy()
    factors = []
    for k in range(len(edges)):
        # ALGO: rank-one update L <- L + w v v^T with z = U^T v; later z's get this factor too
        factors.append(rank_one_update(lam, Z[:, k].copy(), float(weights[k]), later=Z[:, k + 1:]))
    t3 = time.process_time()
    order = np.argsort(lam, kind="stable")
    return Factorization(n=n, parts=parts_list, local_bases=bases, local_eigenvalues=lam0, offsets=offsets,
                         factors=factors, cut_edges=edges, cut_weights=weights, order=order,
                         eigenvalues=lam[order],
                         timings={"partition_s": t1 - t0, "local_eigh_s": t2 - t1, "updates_s": t3 - t2},
                         partition_info=info)
