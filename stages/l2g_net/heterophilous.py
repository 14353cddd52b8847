"""Loader for the heterophilous node-classification benchmarks of Platonov et al. (2023) in their `.npz` schema.

The datasets the paper evaluates L2G-Net on — roman-empire, amazon-ratings, minesweeper, tolokers,
questions — are distributed by yandex-research/heterophilous-graphs (``data/<name>.npz``, names with
``-`` written ``_``) as one ``.npz`` per graph:

    node_features  (n, f)  float       node features
    node_labels    (n,)    int         class per node (binary: minesweeper, tolokers, questions)
    edges          (m, 2)  int         edge list (one direction per edge; made undirected on load)
    train_masks    (S, n)  bool        S = 10 fixed splits; val_masks, test_masks alike

    data = load_heterophilous_npz("minesweeper.npz")
    data["adjacency"]  # scipy.sparse CSR, symmetric, unit weights, no self-loops
    data["splits"]     # {"train": (S, n) bool, "val": ..., "test": ...}

Nothing is downloaded here: the `full` profile names the file (papers.l2g_net.prepare.task.source),
tests build a tiny file in this schema. Bad files fail with one line naming the key.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse as sp

DATASETS = ("roman_empire", "amazon_ratings", "minesweeper", "tolokers", "questions")
KEYS = ("node_features", "node_labels", "edges", "train_masks", "val_masks", "test_masks")
BINARY = ("minesweeper", "tolokers", "questions")   # ROC AUC; the others: accuracy


class HeterophilousFormatError(ValueError):
    """The file is not in the heterophilous-benchmark `.npz` schema (the message names the key)."""


def load_heterophilous_npz(path: str | Path) -> dict:
    """Read one benchmark graph. Returns name, x (n, f) float32, y (n,) int64, num_classes, edges (m, 2)
    int64 (undirected, each once, no self-loops), adjacency (CSR, symmetric, unit weights) and splits."""
    path = Path(path)
    where = f"{path.name}"
    if not path.is_file():
        raise HeterophilousFormatError(f"{path}: no such file (the heterophilous benchmarks are not downloaded here; "
                                       "get <name>.npz from github.com/yandex-research/heterophilous-graphs, data/)")
    try:
        raw = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as err:
        raise HeterophilousFormatError(f"{where}: not a readable .npz file ({err})") from None
    missing = [k for k in KEYS if k not in raw.files]
    if missing:
        raise HeterophilousFormatError(f"{where}: missing key {missing[0]!r} (the schema has {', '.join(KEYS)})")
    x = np.asarray(raw["node_features"])
    y = np.asarray(raw["node_labels"])
    edges = np.asarray(raw["edges"])
    if x.ndim != 2 or not np.issubdtype(x.dtype, np.number) or not np.isfinite(x).all():
        raise HeterophilousFormatError(f"{where}: node_features must be a finite (n, f) numeric array (got {x.shape})")
    n = x.shape[0]
    if y.shape != (n,) or not np.issubdtype(y.dtype, np.integer) or (y < 0).any():
        raise HeterophilousFormatError(f"{where}: node_labels must be {n} non-negative integers (got {y.shape}, "
                                       f"{y.dtype})")
    if edges.ndim != 2 or edges.shape[1] != 2 or not np.issubdtype(edges.dtype, np.integer):
        raise HeterophilousFormatError(f"{where}: edges must be an (m, 2) integer array (got {edges.shape})")
    if edges.size and (edges.min() < 0 or edges.max() >= n):
        raise HeterophilousFormatError(f"{where}: edges refer to node {int(edges.max() if edges.max() >= n else edges.min())} "
                                       f"outside 0..{n - 1}")
    splits = {}
    for k in ("train", "val", "test"):
        m = np.asarray(raw[f"{k}_masks"])
        if m.ndim != 2 or m.shape[1] != n or m.dtype != np.bool_:
            raise HeterophilousFormatError(f"{where}: {k}_masks must be a boolean (splits, {n}) array "
                                           f"(got {m.shape}, {m.dtype})")
        splits[k] = m
    if not splits["train"].shape[0] == splits["val"].shape[0] == splits["test"].shape[0]:
        raise HeterophilousFormatError(f"{where}: train/val/test_masks hold different numbers of splits")
    overlap = (splits["train"] & splits["val"]) | (splits["train"] & splits["test"]) | (splits["val"] & splits["test"])
    if overlap.any():
        s = int(np.argwhere(overlap)[0, 0])
        raise HeterophilousFormatError(f"{where}: split {s}: a node is in two of train/val/test")
    for k, m in splits.items():
        if not m.any(axis=1).all():
            raise HeterophilousFormatError(f"{where}: {k}_masks: a split has no {k} node")
    # undirected, without self-loops and duplicates (the benchmark code makes the graph bidirected)
    e = edges[edges[:, 0] != edges[:, 1]]
    e = np.unique(np.sort(e, axis=1), axis=0)
    A = sp.coo_matrix((np.ones(len(e)), (e[:, 0], e[:, 1])), shape=(n, n))
    A = sp.csr_matrix(A + A.T)
    name = path.stem
    return {"name": name, "x": x.astype(np.float32), "y": y.astype(np.int64), "num_classes": int(y.max()) + 1,
            "edges": e.astype(np.int64), "adjacency": A, "splits": splits,
            "metric": "roc_auc" if int(y.max()) + 1 == 2 else "accuracy"}


def write_heterophilous_npz(path: str | Path, x: np.ndarray, y: np.ndarray, edges: np.ndarray,
                            train: np.ndarray, val: np.ndarray, test: np.ndarray) -> Path:
    """Write a graph in the benchmark's schema (fixtures; the same keys and dtypes as the published files)."""
    path = Path(path)
    np.savez(path, node_features=np.asarray(x, np.float32), node_labels=np.asarray(y, np.int64),
             edges=np.asarray(edges, np.int64), train_masks=np.asarray(train, bool), val_masks=np.asarray(val, bool),
             test_masks=np.asarray(test, bool))
    return path
