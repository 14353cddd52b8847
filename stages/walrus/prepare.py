"""prepare: spectral (FFT) solver trajectories of four 2D periodic scenarios at two resolutions.

Each (scenario, resolution) group holds ``n_train + n_test`` trajectories of ``n_frames`` frames
with two fields each (see solvers.py), stored as one HF ``datasets`` DatasetDict (keys
``<scenario>_<N>``, column ``fields`` an Array4D (T, 2, N, N) float32) with per-field statistics
(mean, std, RMS, RMS of frame differences; train split) in stats.json. The task spec (context,
rollout horizon, fixed patch size, tokens per axis) is validated before any solver runs, so a bad
value stops early. Resolutions after the first
are generated only for ``multires_scenarios`` (null: every scenario), which keeps the default profile
cheap while the compute-adaptive vs fixed tokenization comparison still sees a second resolution.

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
from stages.walrus.common import STRIDES, torch_threads
from stages.walrus.solvers import FIELDS, PHYSICS, SCENARIOS, Scenario

ScenarioName = Literal["kolmogorov", "burgers", "advdiff", "wave"]


class Config(StageConfig):
    seed: Seed = 0
    scenarios: list[ScenarioName] = Field(default_factory=lambda: list(SCENARIOS), min_length=1)
    resolutions: list[int] = Field(default_factory=lambda: [32, 64], min_length=1)
    multires_scenarios: list[ScenarioName] | None = Field(
        None, description="scenarios generated at every resolution; the others only at resolutions[0] "
                          "(null: all). The second resolution is what compute-adaptive tokenization is about.")
    n_train: int = Field(8, ge=1, le=512, description="training trajectories per (scenario, resolution)")
    n_test: int = Field(4, ge=1, le=512, description="test trajectories per (scenario, resolution)")
    n_frames: int = Field(48, ge=2, le=1000)
    context: int = Field(3, ge=1, le=64, description="input frames of the model (the paper: 6)")
    rollout_steps: int = Field(40, ge=1, le=1000, description="autoregressive rollout horizon")
    patch_size: int = Field(4, ge=2, le=64, description="fixed-tokenization patch (total hMLP stride)")
    tokens_per_axis: int = Field(8, ge=2, le=64, description="compute-adaptive target token count per axis")
    num_threads: int = Field(1, ge=1, le=64)
    device: DeviceName = "auto"

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
        extra = [s for s in (self.multires_scenarios or []) if s not in self.scenarios]
        if extra:
            raise ValueError(f"multires_scenarios: {extra[0]!r} is not in scenarios ({', '.join(self.scenarios)})")
        if self.context + self.rollout_steps > self.n_frames:
            raise ValueError(f"context: context ({self.context}) + rollout_steps ({self.rollout_steps}) is longer "
                             f"than the trajectories (n_frames = {self.n_frames})")
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


def run(cfg: Config, ctx: StageContext) -> None:
    import datasets

    device = pick_device(cfg.device)
    groups, stats = {}, {}
    with torch_threads(cfg.num_threads):
        for si, name in enumerate(cfg.scenarios):
            for ri, n in enumerate(cfg.resolutions):
                if ri > 0 and cfg.multires_scenarios is not None and name not in cfg.multires_scenarios:
                    continue
                gen = generator(device, cfg.seed * 1000 + 10 * SCENARIOS.index(name) + ri)
                sc = Scenario(name, n, device)
                traj = sc.trajectories(cfg.n_train + cfg.n_test, cfg.n_frames, gen).float().cpu().numpy()
                if not np.isfinite(traj).all():
                    raise RuntimeError(f"prepare@walrus: solver for {name} at {n}² produced non-finite values")
                key = f"{name}_{n}"
                split = ["train"] * cfg.n_train + ["test"] * cfg.n_test
                feats = datasets.Features({
                    "traj": datasets.Value("int32"), "split": datasets.Value("string"),
                    "scenario": datasets.Value("string"), "resolution": datasets.Value("int32"),
                    "fields": datasets.Array4D(shape=(cfg.n_frames, 2, n, n), dtype="float32")})
                groups[key] = datasets.Dataset.from_dict(
                    {"traj": list(range(len(split))), "split": split, "scenario": [name] * len(split),
                     "resolution": [n] * len(split), "fields": traj}, features=feats)
                st = field_stats(traj[: cfg.n_train])
                p = PHYSICS[name]
                stats[key] = {"scenario": name, "resolution": n, "fields": list(FIELDS[name]), **st,
                              "frame_dt": p.dt * p.frame_every}
                ctx.tracker.log({f"prepare/{key}/rms_{f}": r for f, r in zip(FIELDS[name], st["rms"])})
    datasets.DatasetDict(groups).save_to_disk(str(ctx.out / "dataset"))
    write_json(ctx.out / "stats.json", stats)
    write_json(ctx.out / "meta.json", {
        "scenarios": list(cfg.scenarios), "resolutions": list(cfg.resolutions), "n_frames": cfg.n_frames,
        "context": cfg.context, "rollout_steps": cfg.rollout_steps, "patch_size": cfg.patch_size,
        "tokens_per_axis": cfg.tokens_per_axis, "multires_scenarios": cfg.multires_scenarios, "n_train": cfg.n_train, "n_test": cfg.n_test,
        "groups": sorted(groups)})


def load_groups(prep_dir, split: str) -> dict[str, torch.Tensor]:
    """{"<scenario>_<N>": (n, T, 2, N, N) float32 tensor} for one split."""
    import datasets

    dd = datasets.load_from_disk(str(prep_dir / "dataset"))
    out = {}
    for key in sorted(dd):
        ds = dd[key].filter(lambda s: s == split, input_columns="split").with_format("numpy")
        out[key] = torch.from_numpy(np.asarray(ds["fields"], dtype=np.float32))
    return out
