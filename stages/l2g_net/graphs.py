"""Graph generators (networkx) for the exactness suite, the scaling study and the long-range task.

Every generator returns a networkx Graph on nodes 0..n-1 with a float ``weight`` on each edge;
``laplacian(G)`` gives the scipy.sparse Laplacian L = D - W.
"""
from __future__ import annotations

import networkx as nx
import numpy as np
import scipy.sparse as sp


def laplacian(G: nx.Graph) -> sp.csr_matrix:
    return sp.csr_matrix(nx.laplacian_matrix(G, nodelist=range(G.number_of_nodes()), weight="weight"),
                         dtype=np.float64)


def _weights(G: nx.Graph, rng: np.random.Generator | None, low: float = 0.1, high: float = 3.0) -> nx.Graph:
    for u, v in G.edges:
        G[u][v]["weight"] = 1.0 if rng is None else float(rng.uniform(low, high))
    return G


def join_by_bridges(blocks: list[nx.Graph], bridges: int, rng: np.random.Generator, weighted: bool) -> nx.Graph:
    """Disjoint union of ``blocks`` plus ``bridges`` random edges between consecutive blocks (a ring)."""
    G = nx.disjoint_union_all(blocks)
    starts = np.cumsum([0] + [b.number_of_nodes() for b in blocks])
    nb = len(blocks)
    for k in range(bridges):
        a, b = k % nb, (k + 1) % nb
        if a == b:
            break
        for _ in range(1000):  # distinct bridges: every requested bridge is a cut edge
            u = int(starts[a] + rng.integers(blocks[a].number_of_nodes()))
            v = int(starts[b] + rng.integers(blocks[b].number_of_nodes()))
            if not G.has_edge(u, v):
                break
        G.add_edge(u, v, weight=float(rng.uniform(0.5, 2.0)) if weighted else 1.0)
    return G


def sbm_blocks(num_blocks: int, block_size: int, avg_degree: float, bridges: int, seed: int,
               weighted: bool = False) -> nx.Graph:
    """``num_blocks`` Erdos-Renyi blocks (mean degree ``avg_degree``) joined in a ring by ``bridges`` edges."""
    rng = np.random.default_rng(seed)
    p = min(1.0, avg_degree / max(block_size - 1, 1))
    blocks = []
    for b in range(num_blocks):
        g = nx.fast_gnp_random_graph(block_size, p, seed=int(rng.integers(2**31)))  # O(n + m) sampler
        blocks.append(_weights(g, rng if weighted else None))
    return join_by_bridges(blocks, bridges, rng, weighted)


def exactness_suite(seed: int, scale: int) -> dict[str, nx.Graph]:
    """Graphs that stress the method: components, isolated nodes, repeated eigenvalues, weights.

    ``scale`` sets the size of the larger members (~scale nodes).
    """
    rng = np.random.default_rng(seed)
    s = max(scale, 16)
    suite: dict[str, nx.Graph] = {}
    # stochastic block model with two dense halves and a few bridges
    suite["sbm_halves"] = sbm_blocks(2, s // 2, 8.0, 3, seed + 1)
    # Barabasi-Albert halves joined by bridges, weighted edges
    ba = [_weights(nx.barabasi_albert_graph(s // 2, 3, seed=seed + 2 + k), rng) for k in range(2)]
    suite["ba_halves_weighted"] = join_by_bridges(ba, 4, rng, weighted=True)
    # grids joined by k bridges (grid spectra have many repeated eigenvalues)
    side = max(3, int(np.sqrt(s / 3)))
    grids = [nx.convert_node_labels_to_integers(nx.grid_2d_graph(side, side)) for _ in range(3)]
    suite["grids_bridged"] = join_by_bridges([_weights(g, None) for g in grids], 5, rng, weighted=False)
    # disjoint identical copies (every eigenvalue repeated), stars and complete graphs, isolated nodes
    copies = [nx.petersen_graph() for _ in range(max(2, s // 40))]
    extras = [nx.star_graph(max(3, s // 12)), nx.complete_graph(max(4, s // 16)), nx.complete_graph(max(4, s // 16))]
    G = nx.disjoint_union_all([_weights(g, None) for g in copies + extras])
    G.add_nodes_from(range(G.number_of_nodes(), G.number_of_nodes() + 4))  # isolated nodes
    suite["copies_stars_isolated"] = G
    # weighted random graph with several components and weights over six orders of magnitude
    comps = [nx.gnp_random_graph(max(5, s // 4), 0.15, seed=seed + 10 + k) for k in range(3)]
    H = nx.disjoint_union_all(comps)
    for u, v in H.edges:
        H[u][v]["weight"] = float(10 ** rng.uniform(-3, 3))
    H.add_nodes_from(range(H.number_of_nodes(), H.number_of_nodes() + 2))
    suite["weighted_components"] = H
    # a hypercube: highly repeated integer spectrum
    suite["hypercube"] = _weights(nx.convert_node_labels_to_integers(nx.hypercube_graph(
        max(3, int(np.log2(max(s, 8)))))), None)
    return {k: nx.convert_node_labels_to_integers(g) for k, g in suite.items()}


def random_parts(n: int, num_parts: int, rng: np.random.Generator) -> list[list[int]]:
    """A random partition of the nodes (a stress test: many cut edges, scattered parts)."""
    perm = rng.permutation(n)
    return [p.tolist() for p in np.array_split(perm, min(num_parts, n))]


def ba_graph(n: int, m: int, seed: int) -> nx.Graph:
    """Barabasi-Albert graph (the paper's scaling family), unit weights."""
    return _weights(nx.barabasi_albert_graph(n, m, seed=seed), None)


def grid_graph(n: int) -> nx.Graph:
    """A square 4-neighbour grid with about n nodes (side = round(sqrt(n))), unit weights."""
    side = max(2, int(round(np.sqrt(n))))
    return _weights(nx.convert_node_labels_to_integers(nx.grid_2d_graph(side, side)), None)


def minesweeper(side: int, mine_fraction: float, hidden_fraction: float, seed: int) -> dict:
    """The Minesweeper benchmark of Platonov et al. (2023), generated: a side x side grid where each
    cell is joined to its 8 neighbours (king moves), ``mine_fraction`` of the cells are mines (the
    label), node features = one-hot number of neighbouring mines (0..8) plus a 'feature unknown'
    flag, with the features of ``hidden_fraction`` of the nodes hidden (zeros, flag 1).

    Returns {"graph": nx.Graph, "x": (n, 10) float32, "y": (n,) int64}.
    """
    rng = np.random.default_rng(seed)
    G = nx.Graph()
    n = side * side
    G.add_nodes_from(range(n))
    for r in range(side):
        for c in range(side):
            for dr, dc in ((0, 1), (1, -1), (1, 0), (1, 1)):
                rr, cc = r + dr, c + dc
                if 0 <= rr < side and 0 <= cc < side:
                    G.add_edge(r * side + c, rr * side + cc, weight=1.0)
    y = np.zeros(n, dtype=np.int64)
    y[rng.choice(n, size=int(round(mine_fraction * n)), replace=False)] = 1
    A = nx.to_scipy_sparse_array(G, nodelist=range(n), weight=None, format="csr")
    counts = np.asarray(A @ y).astype(np.int64)                   # neighbouring mines, 0..8
    x = np.zeros((n, 10), dtype=np.float32)
    x[np.arange(n), counts] = 1.0
    hidden = rng.choice(n, size=int(round(hidden_fraction * n)), replace=False)
    x[hidden] = 0.0
    x[hidden, 9] = 1.0
    return {"graph": G, "x": x, "y": y, "counts": counts}


def source_parity(side: int, num_sources: int, drop_fraction: float, seed: int) -> dict:
    """Distance-to-source parity, a heterophilous long-range task generated here: a side x side
    4-neighbour grid with ``drop_fraction`` of its edges removed (kept connected: removals that
    disconnect are skipped), ``num_sources`` random source nodes; node features = [is source, not a
    source]; the label is the parity of the hop distance to the nearest source (BFS). The grid is
    bipartite, so the label flips across every edge inside a source's Voronoi cell (edge homophily
    near 0): a node's label needs the distance to, and side of, a source up to ~side / sqrt(sources)
    hops away.

    Returns {"graph", "x": (n, 2) float32, "y": (n,) int64, "distance": (n,) int64, "sources"}.
    """
    rng = np.random.default_rng(seed)
    G = nx.convert_node_labels_to_integers(nx.grid_2d_graph(side, side), ordering="sorted")
    edges = list(G.edges)
    for k in rng.permutation(len(edges))[: int(round(drop_fraction * len(edges)))]:
        u, v = edges[k]
        G.remove_edge(u, v)
        if not nx.has_path(G, u, v):
            G.add_edge(u, v)
    _weights(G, None)
    n = G.number_of_nodes()
    sources = np.sort(rng.choice(n, size=num_sources, replace=False))
    dist = nx.multi_source_dijkstra_path_length(G, [int(s) for s in sources], weight=None)
    d = np.array([dist[i] for i in range(n)], dtype=np.int64)
    x = np.zeros((n, 2), dtype=np.float32)
    x[:, 1] = 1.0
    x[sources, 0], x[sources, 1] = 1.0, 0.0
    return {"graph": G, "x": x, "y": (d % 2).astype(np.int64), "distance": d, "sources": sources}


def edge_homophily(G: nx.Graph, y: np.ndarray) -> float:
    """Fraction of edges whose endpoints share a label."""
    e = np.array(list(G.edges), dtype=np.int64).reshape(-1, 2)
    return float(np.mean(y[e[:, 0]] == y[e[:, 1]])) if len(e) else float("nan")
