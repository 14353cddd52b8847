"""The Well (issue 42): tiny HDF5 datasets written at test time in The Well's schema (root attrs,
dimensions, boundary_conditions with masks, scalars, t0/t1/t2 fields), read by ``the_well``'s WellDataset
through stages.walrus.well, one periodic and one non-periodic (walls/open) dataset; the prepare stage
on them (source kind file) and a model forward on the non-periodic one through the jitter branch."""
from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from stages.common.config import validate
from stages.common.runner import StageContext
from stages.common.sources import SourceError
from stages.walrus import prepare
from stages.walrus.jitter import OPEN, PERIODIC, WALL
from stages.walrus.model import Walrus
from stages.walrus.well import load_well_group

pytestmark = pytest.mark.real_source


def write_well_file(path: Path, name: str, n_traj: int, n_t: int, nx: int, ny: int, bcs: dict[str, tuple[str, str]],
                    seed: int) -> dict[str, np.ndarray]:
    """One HDF5 file in The Well's layout (docs/data_format.md). bcs: axis name -> (low, high) bc_type."""
    rng = np.random.default_rng(seed)
    fields = {"density": rng.normal(size=(n_traj, n_t, nx, ny)).astype(np.float32),
              "velocity": rng.normal(size=(n_traj, n_t, nx, ny, 2)).astype(np.float32)}
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        f.attrs.update({"dataset_name": name, "grid_type": "cartesian", "n_spatial_dims": 2,
                        "n_trajectories": n_traj, "simulation_parameters": ["Re"], "Re": 100.0})
        dims = f.create_group("dimensions")
        dims.attrs["spatial_dims"] = ["x", "y"]
        t = dims.create_dataset("time", data=np.linspace(0, 1, n_t, dtype=np.float32))
        t.attrs["sample_varying"] = False
        for ax, n in (("x", nx), ("y", ny)):
            d = dims.create_dataset(ax, data=np.linspace(0, 1, n, endpoint=False, dtype=np.float32))
            d.attrs.update({"sample_varying": False, "time_varying": False})
        bc = f.create_group("boundary_conditions")
        for ax, (lo, hi) in bcs.items():
            n = nx if ax == "x" else ny
            for side, kind in ((0, lo), (1, hi)) if lo != hi else ((None, lo),):
                g = bc.create_group(f"{ax}_{kind}_{side}")
                g.attrs.update({"associated_dims": [ax], "associated_fields": [], "bc_type": kind,
                                "sample_varying": False, "time_varying": False})
                mask = np.zeros(n, dtype=bool)
                if side is None:
                    mask[[0, -1]] = True
                else:
                    mask[0 if side == 0 else -1] = True
                g.create_dataset("mask", data=mask)
                g.create_dataset("values", data=np.zeros(int(mask.sum()), dtype=np.float32))
        sc = f.create_group("scalars")
        sc.attrs["field_names"] = ["Re"]
        s = sc.create_dataset("Re", data=np.array(100.0, dtype=np.float32))
        s.attrs.update({"sample_varying": False, "time_varying": False})
        for order, names in (("t0_fields", ["density"]), ("t1_fields", ["velocity"]), ("t2_fields", [])):
            grp = f.create_group(order)
            grp.attrs["field_names"] = names
            for nm in names:
                d = grp.create_dataset(nm, data=fields[nm])
                d.attrs.update({"dim_varying": [True, True], "sample_varying": True, "time_varying": True})
    return fields


def make_well(base: Path) -> dict:
    """Two datasets x three splits: `shear_flow` (periodic x, y) and `channel_like` (periodic x; y: wall below,
    open above), 32 x 32, 7 frames."""
    out = {}
    for name, bcs in (("shear_flow", {"x": ("periodic", "periodic"), "y": ("periodic", "periodic")}),
                      ("channel_like", {"x": ("periodic", "periodic"), "y": ("wall", "open")})):
        for k, split in enumerate(("train", "valid", "test")):
            out[(name, split)] = write_well_file(base / name / "data" / split / f"{name}_{split}.hdf5", name,
                                                 3, 7, 32, 32, bcs, seed=10 * k + len(name))
    return out


def test_well_fixture_through_the_well(tmp_path):
    truth = make_well(tmp_path)
    traj, bcs, info = load_well_group(tmp_path, "channel_like", "train", ["velocity_x", "velocity_y"], 16, 6, 2)
    assert traj.shape == (2, 6, 2, 16, 16) and traj.dtype == np.float32
    assert bcs == ((PERIODIC, PERIODIC), (WALL, OPEN))                 # x periodic; y wall (low) / open (high)
    v = truth[("channel_like", "train")]["velocity"][:2, :6]           # (n, T, x, y, 2)
    expect = v.reshape(2, 6, 16, 2, 16, 2, 2).mean(axis=(3, 5)).transpose(0, 1, 4, 2, 3)   # 2x2 block mean
    np.testing.assert_allclose(traj, expect, rtol=1e-6, atol=1e-6)
    assert info["dataset_name"] == "channel_like" and info["n_trajectories"] == 3
    dens, pbcs, _ = load_well_group(tmp_path, "shear_flow", "test", ["density", "velocity_y"], 32, 7, 5)
    assert dens.shape == (3, 7, 2, 32, 32) and pbcs == ((PERIODIC, PERIODIC), (PERIODIC, PERIODIC))
    np.testing.assert_array_equal(dens[:, :, 0], truth[("shear_flow", "test")]["density"])
    # the non-periodic dataset exercises the non-periodic jitter branch: zero pad + wall/open flags on y
    m = Walrus(d=16, depth=1, heads=1, max_t=2, jitter="domain", tokens_per_axis=4)
    shift, rolls = m.draw(np.random.default_rng(0), (16, 16), bcs)
    assert int(rolls[:, 1].abs().max()) == 0                           # no token roll along the open/wall axis
    with torch.no_grad():
        out = m(torch.from_numpy(traj[:, :2]), bcs, shift, rolls)
    assert out.shape == (2, 2, 2, 16, 16) and torch.isfinite(out).all()


def test_well_loader_errors_name_the_key(tmp_path):
    make_well(tmp_path)
    with pytest.raises(SourceError, match="no HDF5 files"):
        load_well_group(tmp_path, "nothing_here", "train", ["velocity_x", "velocity_y"], 8, 6, 2)
    with pytest.raises(SourceError, match="well_fields: 'vorticity' is not a field"):
        load_well_group(tmp_path, "shear_flow", "train", ["vorticity", "velocity_y"], 8, 6, 2)
    with pytest.raises(SourceError, match="well_resolution: 5 does not divide"):
        load_well_group(tmp_path, "shear_flow", "train", ["velocity_x", "velocity_y"], 5, 6, 2)
    with pytest.raises(SourceError, match="n_frames: 9 frames asked"):
        load_well_group(tmp_path, "shear_flow", "train", ["velocity_x", "velocity_y"], 8, 9, 2)


class _Tracker:
    def log(self, *_a, **_k):
        pass


def test_prepare_reads_the_well_with_source_file(tmp_path):
    base = tmp_path / "well"
    make_well(base)
    cfg = validate(prepare.Config, {"source": {"kind": "file", "dataset": str(base)},
                                    "well_datasets": ["shear_flow", "channel_like"], "well_resolution": 16,
                                    "n_train": 3, "n_val": 1, "n_test": 2, "n_frames": 7, "rollout_steps": 4,
                                    "resolutions": [32], "tokens_per_axis": 4, "patch_size": 4},
                   "papers.walrus.prepare")
    out = tmp_path / "out"
    out.mkdir()
    ctx = StageContext(slug="walrus", stage="prepare", profile="full", out=out, root=tmp_path)
    ctx.tracker = _Tracker()
    prepare.run(cfg, ctx)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["groups"] == ["channel_like_16", "shear_flow_16"] and meta["source"] == "file"
    assert meta["bcs"]["channel_like_16"] == [["periodic", "periodic"], ["wall", "open"]]
    train = prepare.load_groups(out, "train")
    assert train["shear_flow_16"].shape == (3, 7, 2, 16, 16)
    assert prepare.load_groups(out, "test")["channel_like_16"].shape == (2, 7, 2, 16, 16)
    with pytest.raises(Exception, match="well_resolution: 12"):
        validate(prepare.Config, {"source": {"kind": "file", "dataset": str(base)}, "well_resolution": 12},
                 "papers.walrus.prepare")
