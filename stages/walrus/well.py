"""The Well's HDF5 datasets (the `full` profile's real data), read through ``the_well``'s own loader.

Layout (https://polymathic-ai.org/the_well/data_format/): ``<base>/<dataset>/data/<split>/*.hdf5``,
each file with root attrs (dataset_name, n_spatial_dims, n_trajectories, grid_type), ``dimensions``
(spatial_dims, time, one coordinate array per axis), ``boundary_conditions`` (one group per boundary
with bc_type wall/open/periodic, associated_dims and a mask), ``scalars`` and ``t0_fields`` /
``t1_fields`` / ``t2_fields`` (scalar, vector, tensor fields as (traj, time, *space[, D...]) float32
arrays). ``the_well.data.WellDataset`` (full-trajectory mode) reads a split into whole trajectories
with flattened channels named ``field`` (t0) or ``field_x``/``field_y`` (t1 components) and the
boundary conditions as one (low, high) code per axis (WALL 0, OPEN 1, PERIODIC 2: the jitter's codes).

``load_well_group`` turns one dataset split into the miniature's group format: (n, T, C, H, W)
float32 (axis order of ``dimensions.spatial_dims``), the chosen channels by name, each axis
block-averaged to ``resolution`` (an integer factor per axis: periodicity is kept), the first
``n_frames`` frames. Problems (missing folder, unknown field, resolution that does not divide, too
few frames) raise ``SourceError``: one line naming the params key.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from stages.common.sources import SourceError
from stages.walrus.jitter import as_bcs

WELL_SPLITS = {"train": "train", "val": "valid", "test": "test"}
KEY = "papers.walrus.prepare.source.dataset"


def _block_mean(x: np.ndarray, axis: int, factor: int) -> np.ndarray:
    shape = list(x.shape)
    shape[axis: axis + 1] = [shape[axis] // factor, factor]
    return x.reshape(shape).mean(axis=axis + 1)


def well_split_dir(base: str | Path, name: str, split: str) -> Path:
    return Path(base) / name / "data" / WELL_SPLITS[split]


def load_well_group(base: str | Path, name: str, split: str, fields: list[str], resolution: int,
                    n_frames: int, max_traj: int) -> tuple[np.ndarray, tuple[tuple[int, int], ...], dict]:
    """(trajectories (n, T, C, R, R) float32, bcs per axis, info) of one Well dataset split."""
    import torch
    from the_well.data import WellDataset

    where = well_split_dir(base, name, split)
    if not where.is_dir() or not (list(where.glob("*.hdf5")) + list(where.glob("*.h5"))):
        raise SourceError(f"{KEY}: no HDF5 files in {where} (The Well layout: <base>/<dataset>/data/<split>/*.hdf5)")
    try:
        ds = WellDataset(path=str(Path(base) / name), well_split_name=WELL_SPLITS[split], n_steps_input=1,
                         n_steps_output=1, full_trajectory_mode=True, max_rollout_steps=100_000,
                         use_normalization=False, return_grid=False, boundary_return_type="padding")
    except (KeyError, AssertionError, OSError, ValueError) as err:
        raise SourceError(f"{KEY}: {where} is not a readable Well dataset ({type(err).__name__}: {err})") from err
    md = ds.metadata
    if md.n_spatial_dims != 2:
        raise SourceError(f"{KEY}: {name} has {md.n_spatial_dims} spatial dims; the miniature model is 2D")
    names = [f for order in range(3) for f in md.field_names[order]]
    missing = [f for f in fields if f not in names]
    if missing:
        raise SourceError(f"papers.walrus.prepare.well_fields: {missing[0]!r} is not a field of {name} "
                          f"(fields: {', '.join(names)})")
    chans = [names.index(f) for f in fields]
    shape = tuple(int(s) for s in md.spatial_resolution)
    for n in shape:
        if n % resolution:
            raise SourceError(f"papers.walrus.prepare.well_resolution: {resolution} does not divide {name}'s "
                              f"grid {shape} (block averaging needs an integer factor per axis)")
    trajs, bcs = [], None
    for i in range(min(len(ds), max_traj)):
        s = ds[i]
        x = torch.cat([s["input_fields"], s["output_fields"]], 0).numpy()           # (T, H, W, C)
        if x.shape[0] < n_frames:
            raise SourceError(f"papers.walrus.prepare.n_frames: {n_frames} frames asked, {name} has {x.shape[0]}")
        x = x[:n_frames][..., chans].transpose(0, 3, 1, 2)                        # (T, C, H, W)
        for ax, n in enumerate(shape):
            x = _block_mean(x, 2 + ax, n // resolution)
        trajs.append(x.astype(np.float32))
        b = tuple(tuple(int(v) for v in pair) for pair in s["boundary_conditions"].tolist())
        bcs = b if bcs is None else bcs
    if not trajs:
        raise SourceError(f"{KEY}: {where} holds no trajectory")
    info = {"dataset_name": md.dataset_name, "spatial_dims": shape, "fields": list(fields),
            "n_trajectories": len(ds)}
    return np.stack(trajs), as_bcs(bcs), info
