"""evaluate: autoregressive rollouts of every trained arm x seed; VRMSE(t), the patch-line statistic, spectra.

Rollouts start from the first ``context`` frames of each test trajectory and run ``rollout_steps``
steps, jitter on as in training (a fresh draw per forward call, seeded), statistics recomputed every
step. The patchify / un-jitter gathers of every forward call go through kernels/rolled_patchify
(backend from KernelRecord).

- VRMSE per (trajectory, step, field) on raw fields: sqrt(mean_space err² / (unbiased var_space(y) + 1e-7)),
  then the mean over fields (official eval). Stored per group: the mean curve, and per test trajectory
  (the items of the seed-aware claims) log10 of the mean VRMSE over the last ``long_window`` steps
  and the one-step VRMSE.
- Patch-line statistic (``patch_line_stat``), per group and fixed horizon h (``patch_horizons``): the
  power on the Fourier lines k = m·N/p (N/p = tokens per axis, the patch frequency) relative to the
  neighbouring lines m·N/p ± 1, in log10, from the marginal power spectrum of each axis, averaged over
  the harmonics m with m·N/p + 1 inside the data's resolved band (``kmax_frac`` of N/2: the solvers'
  2/3 dealiasing) and over both axes; the artifact is the prediction's value minus the truth's, with
  power pooled over the test trajectories and the ``spectrum_steps`` steps ending at h. Positive:
  excess power on the patch lines (a patch-grid artifact).
- Isotropic energy spectrum E(k) at the end of the rollout (figure).

    python -m stages evaluate walrus
"""
from __future__ import annotations

import math

import numpy as np
import torch
from pydantic import Field, field_validator

from kernels.record import KernelRecord
from kernels.rolled_patchify import rolled_patchify, rolled_unpatchify
from stages.common.config import Seed, StageConfig, unique_items
from stages.common.device import DeviceName, pick_device
from stages.common.paths import read_json, write_json
from stages.common.runner import StageContext
from stages.walrus.common import K1, torch_threads
from stages.walrus.jitter import axis_maps
from stages.walrus.model import Walrus, rollout
from stages.walrus.prepare import load_bcs, load_groups
from stages.walrus.train import Config as TrainConfig
from stages.walrus.train import build, vrmse


class Config(StageConfig):
    seed: Seed = 1234
    n_eval: int = Field(4, ge=1, le=512, description="test trajectories rolled out per group")
    long_window: int = Field(10, ge=1, le=1000, description="last steps averaged for long-horizon VRMSE")
    spectrum_steps: int = Field(5, ge=1, le=1000, description="steps pooled for a spectrum (ending at the horizon)")
    patch_horizons: list[int] = Field(default_factory=lambda: [1, 10, 20, 40], min_length=1,
                                      description="rollout steps at which the patch-line statistic is measured")
    kmax_frac: float = Field(2 / 3, gt=0, le=1.0, description="resolved band of the data, as a fraction of N/2 "
                                                              "(the solvers' 2/3 dealiasing)")
    vrmse_cap: float = Field(1e3, gt=1, le=1e12, description="a blown-up (or non-finite) rollout step counts as this VRMSE")
    frame_steps: list[int] = Field(default_factory=lambda: [1, 10, 20, 40], min_length=1)
    num_threads: int = Field(1, ge=1, le=64)
    device: DeviceName = "auto"

    @field_validator("patch_horizons", "frame_steps")
    @classmethod
    def _uniq(cls, v, info):
        return unique_items(v, info.field_name)


# ---------------------------------------------------------------------------------------------
# spectra
# ---------------------------------------------------------------------------------------------
def power2d(u: torch.Tensor) -> torch.Tensor:
    """|û|²/2 per mode of (..., N, M) real fields (û normalised by N·M)."""
    n, m = u.shape[-2:]
    return 0.5 * torch.fft.fft2(u.double()).abs().pow(2) / (n * m) ** 2


def shells(n: int, device) -> torch.Tensor:
    k = torch.fft.fftfreq(n, d=1.0 / n, device=device)
    ky, kx = torch.meshgrid(k, k, indexing="ij")
    return torch.sqrt(kx ** 2 + ky ** 2).round().long()


def isotropic_spectrum(u: torch.Tensor) -> torch.Tensor:
    """E(k), k = 0..N/2, averaged over every leading index (square fields)."""
    n = u.shape[-1]
    p = power2d(u).reshape(-1, n * n).mean(0)
    sh = shells(n, u.device).flatten()
    e = torch.zeros(int(sh.max()) + 1, dtype=p.dtype, device=u.device).index_add_(0, sh, p)
    return e[: n // 2 + 1]


def marginal_power(u: torch.Tensor, axis: int) -> torch.Tensor:
    """Power per |k| along one axis (0 = rows, 1 = columns), summed over the other axis' wavenumbers
    and averaged over every leading index: (N//2 + 1,)."""
    p = power2d(u)
    p = p.reshape(-1, *p.shape[-2:]).mean(0)
    line = p.sum(dim=1 - axis)                                      # (N,) over signed k
    n = line.shape[0]
    k = torch.fft.fftfreq(n, d=1.0 / n, device=u.device).abs().long()
    return torch.zeros(n // 2 + 1, dtype=line.dtype, device=u.device).index_add_(0, k, line)


def patch_harmonics(n: int, n_tok: int, kmax_frac: float) -> list[int]:
    """Patch-line wavenumbers m·N/p (m >= 1) whose upper neighbour lies inside the resolved band."""
    kmax = kmax_frac * n / 2
    return [k for k in range(n_tok, n // 2 + 1, n_tok) if k + 1 <= kmax]


def patch_line_stat(u: torch.Tensor, n_tok: tuple[int, int], kmax_frac: float) -> float:
    """ALGO: mean over axes and harmonics of log10 P(m·N/p) / mean(P(m·N/p − 1), P(m·N/p + 1)). u (..., N, M)."""
    vals = []
    for axis in (0, 1):
        n = u.shape[-2 + axis]
        pm = marginal_power(u, axis)
        for k in patch_harmonics(n, n_tok[axis], kmax_frac):
            hi = pm[k + 1] if k + 1 < len(pm) else pm[k - 1]
            neigh = 0.5 * (pm[k - 1] + hi)
            vals.append(float(torch.log10(pm[k].clamp_min(1e-300) / neigh.clamp_min(1e-300))))
    return float(np.mean(vals)) if vals else math.nan


def tokens_per_axis(model: Walrus, shape: tuple[int, int]) -> tuple[int, int]:
    s1, s2 = model.strides(shape[0])
    return shape[0] // (s1 * s2), shape[1] // (s1 * s2)


def patchify_pair(x: torch.Tensor, bcs, mode: str, shift, s1: int, s2: int, backend: str = "auto"):
    """The two gathers of one forward call on a real input slice (for the parity record)."""
    my, mx, iy, ix = axis_maps(tuple(x.shape[-2:]), bcs, mode, shift, s1, s2, x.device)
    p = rolled_patchify(x, my, mx, K1, s1, backend=backend)
    y = x[..., my.clamp_min(0)[:, None], mx.clamp_min(0)[None, :]]   # a decoded grid of the padded size
    return p, rolled_unpatchify(y, iy, ix, backend=backend)


def run(cfg: Config, ctx: StageContext) -> None:
    device = pick_device(cfg.device)
    prep, trn = ctx.input("prepare"), ctx.input("train")
    meta, tinfo = read_json(prep / "meta.json"), read_json(trn / "train.json")
    from stages.common.config import ConfigError
    if cfg.n_eval > meta["n_test"]:
        raise ConfigError(f"papers.walrus.evaluate.n_eval: {cfg.n_eval} exceeds the {meta['n_test']} test trajectories")
    R, C = meta["rollout_steps"], meta["context"]
    for key in ("frame_steps", "patch_horizons"):
        bad = [s for s in getattr(cfg, key) if not 1 <= s <= R]
        if bad:
            raise ConfigError(f"papers.walrus.evaluate.{key}: {bad[0]} outside 1..rollout_steps ({R})")
    if cfg.long_window > R:
        raise ConfigError(f"papers.walrus.evaluate.long_window: {cfg.long_window} exceeds rollout_steps ({R})")
    if cfg.spectrum_steps > min(cfg.patch_horizons):
        raise ConfigError(f"papers.walrus.evaluate.spectrum_steps: {cfg.spectrum_steps} is longer than the first "
                          f"patch horizon ({min(cfg.patch_horizons)})")
    tcfg = TrainConfig(**tinfo["config"], seeds=[0], arms=["jitter_on"], ft_steps=0)
    bcs = load_bcs(meta)
    test = {k: v[: cfg.n_eval].to(device) for k, v in load_groups(prep, "test").items()}
    rec = KernelRecord(device)
    pre_groups = tinfo["pretrain_groups"]
    held = [k for k in sorted(test) if tinfo["held_out"] != "none" and k.startswith(tinfo["held_out"] + "_")]
    out: dict = {"groups": {}, "transfer": {}, "persistence": {}, "spectra": {"truth": {}}, "patch_truth": {},
                 "rollout_steps": R, "context": C, "long_window": cfg.long_window,
                 "patch_horizons": list(cfg.patch_horizons), "pretrain_groups": pre_groups, "held_groups": held,
                 "bcs": {k: meta["bcs"][k] for k in test}, "n_eval": cfg.n_eval, "nonfinite_rollouts": 0}
    frames: dict[str, np.ndarray] = {}
    frame_group = next((g for g in pre_groups if g.startswith("channel_")), pre_groups[-1])

    def evaluate_model(name: str, seed: int, path, groups: list[str]) -> dict[str, dict]:
        model: Walrus = build(tcfg, meta, "jitter_on" if name in ("finetune", "scratch") else name)
        model.load_state_dict(torch.load(path, map_location=device))
        model.to(device).eval()
        model.kernel_backend = rec.backend
        res = {}
        for gi, g in enumerate(groups):
            rng = np.random.default_rng([cfg.seed, seed, gi])      # jitter stays on at evaluation, seeded
            data = test[g]
            truth = data[:, C:C + R]
            before = model.kernel_calls
            with torch.no_grad():
                pred = rollout(model, data[:, :C], R, bcs[g], rng)
            rec.count("rolled_patchify", model.kernel_calls - before)
            finite = torch.isfinite(pred).flatten(1).all(1)
            out["nonfinite_rollouts"] += int((~finite).sum())
            pred = torch.nan_to_num(pred, nan=0.0, posinf=0.0, neginf=0.0)
            v = vrmse(pred, truth).nan_to_num(nan=cfg.vrmse_cap, posinf=cfg.vrmse_cap).clamp(max=cfg.vrmse_cap)
            v[~finite] = cfg.vrmse_cap
            v = v.double()                                          # (n, R)
            n_tok = tokens_per_axis(model, tuple(data.shape[-2:]))
            patch = {}
            for h in cfg.patch_horizons:
                sl = slice(max(h - cfg.spectrum_steps, 0), h)
                sp = patch_line_stat(pred[:, sl], n_tok, cfg.kmax_frac)
                st = patch_line_stat(truth[:, sl], n_tok, cfg.kmax_frac)
                patch[str(h)] = sp - st
                out["patch_truth"].setdefault(g, {}).setdefault(str(n_tok[0]), {})[str(h)] = st
            sl = slice(R - cfg.spectrum_steps, R)
            res[g] = {"curve": v.mean(0).tolist(),
                      "log_long": torch.log10(v[:, R - cfg.long_window:].mean(1)).tolist(),
                      "one_step": v[:, 0].tolist(), "patch": patch, "n_tok": list(n_tok),
                      **({"items": v.tolist()} if name in ("finetune", "scratch") else {}),
                      "spec_pred": isotropic_spectrum(pred[:, sl]).tolist() if data.shape[-1] == data.shape[-2] else None}
            out["spectra"]["truth"][g] = isotropic_spectrum(truth[:, sl]).tolist()
            if seed == first_seed and g == frame_group and name in ("jitter_off", "jitter_on"):
                frames[name] = pred[0, [s - 1 for s in cfg.frame_steps], 0].cpu().numpy()
                frames["truth"] = truth[0, [s - 1 for s in cfg.frame_steps], 0].cpu().numpy()
        return res

    seeds_of = tinfo["seeds"]
    first_seed = next(iter(seeds_of.values()))[0]
    with torch_threads(cfg.num_threads):
        for arm, entries in tinfo["arms"].items():
            for e in entries:
                res = evaluate_model(arm, e["seed"], trn / "models" / f"{arm}_s{e['seed']}.pt", pre_groups)
                for g, r in res.items():
                    spec = r.pop("spec_pred")
                    out["groups"].setdefault(arm, {}).setdefault(g, {})[str(e["seed"])] = r
                    if spec is not None:
                        out["spectra"].setdefault(arm, {}).setdefault(g, {})[str(e["seed"])] = spec
        for kind, entries in tinfo["transfer"].items():
            for e in entries:
                res = evaluate_model(kind, e["seed"], trn / "models" / f"{kind}_s{e['seed']}.pt", held)
                for g, r in res.items():
                    r.pop("spec_pred")
                    out["transfer"].setdefault(kind, {}).setdefault(g, {})[str(e["seed"])] = r
        # trivial predictor: persistence u(t+k) = u(t), per group
        for g in pre_groups + held:
            c = vrmse(test[g][:, C - 1:C].expand(-1, R, -1, -1, -1), test[g][:, C:C + R]).double()   # (n, R)
            out["persistence"][g] = {"curve": c.mean(0).tolist(), "one_step": c[:, 0].tolist(),
                                     "log_long": torch.log10(c[:, R - cfg.long_window:].mean(1)).tolist()}
        # parity of the Triton path on real input slices: a periodic and a wall-bounded group
        tmpl = build(tcfg, meta, "jitter_on")
        for g in dict.fromkeys([pre_groups[0], frame_group]):
            x = test[g][:1, :C].reshape(C, 2, *test[g].shape[-2:])
            s1, s2 = tmpl.strides(x.shape[-1])
            shift = (x.shape[-2] // 2 - 1 if bcs[g][0][0] == 2 else 2, -3)
            rec.parity("rolled_patchify", patchify_pair, x, bcs[g], "domain", shift, s1, s2,
                       slice=f"first test window of {g} ({C} frames, bcs {meta['bcs'][g]}), official fixed jitter, "
                             f"shift {shift}, hMLP strides ({s1}, {s2})")
    rec.save(ctx.out)
    np.savez(ctx.out / "frames.npz", **frames, steps=np.array(cfg.frame_steps))
    out["frame_group"] = frame_group
    write_json(ctx.out / "evaluate.json", out)
