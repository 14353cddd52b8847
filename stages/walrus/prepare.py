"""prepare: spectral (FFT) solver trajectories of 2D scenarios (four periodic, one wall-bounded) at
one or two resolutions, or The Well's HDF5 datasets (the `full` profile's ``source: {kind: file}``).

Each (scenario, resolution) group holds ``n_train + n_val + n_test`` trajectories of ``n_frames``
frames with two fields each (see solvers.py), stored as one HF ``datasets`` DatasetDict (keys
``<scenario>_<N>``, column ``fields`` an Array4D (T, 2, N, N) float32, column ``split``) with
per-field statistics (mean, std, RMS, RMS of frame differences; train split) and the boundary
conditions per axis (The Well's wall/open/periodic) in stats.json / meta.json. The val split feeds
the learning curve the train stage records; the test split the evaluation. The task spec (context,
rollout horizon, fixed patch size, tokens per axis) is validated before any solver runs. Resolutions
after the first are generated only for ``multires_scenarios`` (null: every scenario).

    python -m stages prepare walrus
"""
from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from pydantic import Field, field_validator, model_validator

from stages.common.config import Seed, StageConfig, unique_items
from stages.common.device import DeviceName, generator, pick_device
from stages.common.paths import write_json
from stages.common.runner import StageContext
from stages.common.sources import SourceConfig
from stages.walrus.common import STRIDES, torch_threads
from stages.walrus.jitter import BC_NAMES, as_bcs
from stages.walrus.solvers import BOUNDARIES, FIELDS, PHYSICS, SCENARIOS, make_scenario

SPLITS = ("train", "val", "test")
BC_LABEL = {v: k for k, v in BC_NAMES.items()}
ScenarioName = Literal["kolmogorov", "burgers", "advdiff", "wave", "channel"]


class Config(StageConfig):
    seed: Seed = 0
    scenarios: list[ScenarioName] = Field(default_factory=lambda: list(SCENARIOS), min_length=1)
    resolutions: list[int] = Field(default_factory=lambda: [32, 64], min_length=1)
    multires_scenarios: list[ScenarioName] | None = Field(
        None, description="scenarios generated at every resolution; the others only at resolutions[0] "
                          "(null: all). The second resolution is what compute-adaptive tokenization is about.")
    n_train: int = Field(8, ge=1, le=512, description="training trajectories per (scenario, resolution)")
    n_val: int = Field(2, ge=1, le=512, description="validation trajectories per group (the learning curve)")
    n_test: int = Field(4, ge=1, le=512, description="test trajectories per (scenario, resolution)")
    n_frames: int = Field(48, ge=2, le=1000)
    context: int = Field(3, ge=1, le=64, description="input frames of the model (the paper: 6)")
    rollout_steps: int = Field(40, ge=1, le=1000, description="autoregressive rollout horizon")
    patch_size: int = Field(4, ge=2, le=64, description="fixed-tokenization patch (total hMLP stride)")
    tokens_per_axis: int = Field(8, ge=2, le=64, description="compute-adaptive target token count per axis")
    num_threads: int = Field(1, ge=1, le=64)
    device: DeviceName = "auto"
    source: SourceConfig = SourceConfig()
    well_datasets: list[str] = Field(default_factory=lambda: ["shear_flow", "turbulent_radiative_layer_2D"],
                                     min_length=1, description="source kind file: dataset folders under "
                                     "source.dataset (The Well's base path), read instead of the solvers")
    well_fields: list[str] = Field(default_factory=lambda: ["velocity_x", "velocity_y"], min_length=2, max_length=2,
                                   description="channels taken from each Well dataset, by name (t1 components "
                                               "are <field>_x / <field>_y)")
    well_resolution: int = Field(64, ge=8, le=1024, description="each axis block-averaged to this many points")

    @field_validator("well_datasets", "well_fields")
    @classmethod
    def _names(cls, v, info):
        for s in v:
            if not s or len(s) > 200 or "/" in s or s.startswith("."):
                raise ValueError(f"{info.field_name}: {s!r} is not a plain name")
        return unique_items(v, info.field_name)

    @field_validator("scenarios")
    @classmethod
    def _scen(cls, v):
        return unique_items(v, "scenarios")

    @field_validator("multires_scenarios")
    @classmethod
    def _multi(cls, v):
        return None if v is None else unique_items(v, "multires_scenarios")

    @field_validator("resolutions")
    @classmethod
    def _res(cls, v):
        for n in v:
            if not 8 <= n <= 256:
                raise ValueError(f"resolutions: {n} outside [8, 256]")
        return unique_items(v, "resolutions")

    @model_validator(mode="after")
    def _spec(self):
        if self.source.kind == "hf":
            raise ValueError("source: walrus reads The Well's HDF5 files (kind: file), not a hub model")
        extra = [s for s in (self.multires_scenarios or []) if s not in self.scenarios]
        if extra:
            raise ValueError(f"multires_scenarios: {extra[0]!r} is not in scenarios ({', '.join(self.scenarios)})")
        if self.context + self.rollout_steps > self.n_frames:
            raise ValueError(f"context: context ({self.context}) + rollout_steps ({self.rollout_steps}) is longer "
                             f"than the trajectories (n_frames = {self.n_frames})")
        if self.source.kind == "file":
            n = self.well_resolution
            if n % self.tokens_per_axis or (n // self.tokens_per_axis) not in STRIDES:
                raise ValueError(f"well_resolution: {n} is not divided by tokens_per_axis {self.tokens_per_axis} into "
                                 f"an hMLP stride in {sorted(STRIDES)}")
        for n in self.resolutions:
            if n % self.patch_size or (n // self.patch_size) not in STRIDES:
                raise ValueError(f"patch_size: {self.patch_size} does not divide resolution {n} into an hMLP "
                                 f"stride in {sorted(STRIDES)}")
            if n % self.tokens_per_axis or (n // self.tokens_per_axis) not in STRIDES:
                raise ValueError(f"tokens_per_axis: {self.tokens_per_axis} does not divide resolution {n} into "
                                 f"an hMLP stride in {sorted(STRIDES)}")
        return self


def field_stats(x: np.ndarray) -> dict[str, list[float]]:
    """Per-field statistics of (n, T, F, N, N) trajectories."""
    d = np.diff(x, axis=1)
    ax = (0, 1, 3, 4)
    return {"mean": x.mean(ax).tolist(), "std": x.std(ax).tolist(),
            "rms": np.sqrt((x ** 2).mean(ax)).tolist(), "delta_rms": np.sqrt((d ** 2).mean(ax)).tolist()}


def _dataset(traj: np.ndarray, name: str, n: int, splits: list[str]):
    import datasets

    T = traj.shape[1]
    feats = datasets.Features({
        "traj": datasets.Value("int32"), "split": datasets.Value("string"),
        "scenario": datasets.Value("string"), "resolution": datasets.Value("int32"),
        "fields": datasets.Array4D(shape=(T, 2, n, n), dtype="float32")})
    return datasets.Dataset.from_dict(
        {"traj": list(range(len(splits))), "split": splits, "scenario": [name] * len(splits),
         "resolution": [n] * len(splits), "fields": traj}, features=feats)


def _solver_groups(cfg: Config, device, log):
    """{key: (trajectories (n, T, 2, N, N), splits, scenario, N, bcs, field names, frame_dt)}."""
    out = {}
    counts = {"train": cfg.n_train, "val": cfg.n_val, "test": cfg.n_test}
    for name in cfg.scenarios:
        for ri, n in enumerate(cfg.resolutions):
            if ri > 0 and cfg.multires_scenarios is not None and name not in cfg.multires_scenarios:
                continue
            gen = generator(device, cfg.seed * 1000 + 10 * SCENARIOS.index(name) + ri)
            sc = make_scenario(name, n, device)
            splits = [s for s in SPLITS for _ in range(counts[s])]
            traj = sc.trajectories(len(splits), cfg.n_frames, gen).float().cpu().numpy()
            if not np.isfinite(traj).all():
                raise RuntimeError(f"prepare@walrus: solver for {name} at {n}² produced non-finite values")
            p = PHYSICS[name]
            out[f"{name}_{n}"] = (traj, splits, name, n, as_bcs(BOUNDARIES[name]), list(FIELDS[name]),
                                  p.dt * p.frame_every)
    return out


def _well_groups(cfg: Config):
    from stages.walrus.well import load_well_group

    out = {}
    for name in cfg.well_datasets:
        parts, splits, bcs, info = [], [], None, None
        for split, n_traj in (("train", cfg.n_train), ("val", cfg.n_val), ("test", cfg.n_test)):
            traj, b, info = load_well_group(cfg.source.dataset, name, split, list(cfg.well_fields),
                                            cfg.well_resolution, cfg.n_frames, n_traj)
            parts.append(traj)
            splits += [split] * len(traj)
            bcs = b
        out[f"{name}_{cfg.well_resolution}"] = (np.concatenate(parts), splits, name, cfg.well_resolution, bcs,
                                                list(cfg.well_fields), None)
    return out


def run(cfg: Config, ctx: StageContext) -> None:
    import datasets

    device = pick_device(cfg.device)
    with torch_threads(cfg.num_threads):
        raw = _solver_groups(cfg, device, ctx.tracker) if cfg.source.kind == "toy" else _well_groups(cfg)
    groups, stats = {}, {}
    for key, (traj, splits, name, n, bcs, fields, frame_dt) in raw.items():
        groups[key] = _dataset(traj, name, n, splits)
        st = field_stats(traj[[i for i, s in enumerate(splits) if s == "train"]])
        stats[key] = {"scenario": name, "resolution": n, "fields": fields, **st, "frame_dt": frame_dt,
                      "bcs": [[BC_LABEL[v] for v in pair] for pair in bcs]}
        ctx.tracker.log({f"prepare/{key}/rms_{f}": r for f, r in zip(fields, st["rms"])})
    datasets.DatasetDict(groups).save_to_disk(str(ctx.out / "dataset"))
    write_json(ctx.out / "stats.json", stats)
    write_json(ctx.out / "meta.json", {
        "scenarios": list(dict.fromkeys(v[2] for v in raw.values())),
        "resolutions": list(cfg.resolutions), "n_frames": cfg.n_frames,
        "context": cfg.context, "rollout_steps": cfg.rollout_steps, "patch_size": cfg.patch_size,
        "tokens_per_axis": cfg.tokens_per_axis, "multires_scenarios": cfg.multires_scenarios,
        "n_train": cfg.n_train, "n_val": cfg.n_val, "n_test": cfg.n_test, "source": cfg.source.kind,
        "groups": sorted(groups), "bcs": {k: stats[k]["bcs"] for k in sorted(groups)}})


def load_groups(prep_dir, split: str) -> dict[str, torch.Tensor]:
    """{"<scenario>_<N>": (n, T, 2, N, N) float32 tensor} for one split.

    Reads the Arrow files in place and selects rows in numpy: nothing is written next to the
    prepare output (an HF ``.filter``/``.map`` there would drop cache files into it, issue 57)."""
    import datasets

    dd = datasets.load_from_disk(str(prep_dir / "dataset"), keep_in_memory=True)
    out = {}
    for key in sorted(dd):
        ds = dd[key].with_format("numpy")
        rows = np.flatnonzero(np.asarray(ds["split"]) == split)
        out[key] = torch.from_numpy(np.asarray(ds["fields"], dtype=np.float32)[rows].copy())
    return out


def load_bcs(meta: dict) -> dict[str, tuple[tuple[int, int], ...]]:
    """Boundary conditions per group from meta.json, as jitter codes."""
    return {k: as_bcs(v) for k, v in meta["bcs"].items()}
