"""evaluate: autoregressive rollouts of every trained arm x seed; VRMSE(t) and energy spectra.

Rollouts start from the first ``context`` frames of each test trajectory and run ``rollout_steps``
(≥ 40 at default) steps, jitter on as in training (a fresh shift per forward call), statistics
recomputed every step. The rolled patchify / unpatchify of every forward call goes through
kernels/rolled_patchify (backend from KernelRecord).

- VRMSE per (sample, step, field) on raw fields: sqrt(mean_space err² / (unbiased var_space(y) + 1e-7)),
  then the mean over fields (official eval).
- Isotropic energy spectrum E(k) (shell sums of |û|²/2), error = mean_k |log10 E_pred/E_true| over
  1 ≤ k ≤ N/2 at the last ``spectrum_steps`` steps; the patch-frequency artifact is reported
  separately as |log10 P_pred/P_true| over the Fourier lines kx or ky = m·N/p (m ≥ 1), p the
  model's total hMLP stride.

    python -m stages evaluate walrus
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field

from kernels.record import KernelRecord
from kernels.rolled_patchify import rolled_patchify, rolled_unpatchify
from stages.common.config import Seed, StageConfig
from stages.common.device import DeviceName, pick_device
from stages.common.paths import read_json, write_json
from stages.common.runner import StageContext
from stages.walrus.common import hmlp_pad, torch_threads
from stages.walrus.model import Walrus, rollout
from stages.walrus.prepare import load_groups
from stages.walrus.train import Config as TrainConfig
from stages.walrus.train import build


class Config(StageConfig):
    seed: Seed = 1234
    n_eval: int = Field(4, ge=1, le=512, description="test trajectories rolled out per group")
    long_window: int = Field(10, ge=1, le=1000, description="last steps averaged for long-horizon VRMSE")
    spectrum_steps: int = Field(5, ge=1, le=1000)
    frame_steps: list[int] = Field(default_factory=lambda: [1, 10, 20, 40], min_length=1)
    num_threads: int = Field(1, ge=1, le=64)
    device: DeviceName = "auto"


def vrmse(pred: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """ALGO: VRMSE per (B, T, C) = sqrt(mean err² / (unbiased spatial var(y) + 1e-7)) -> mean over C: (B, T)."""
    err = (pred - truth).pow(2).mean(dim=(-2, -1))
    var = truth.flatten(-2).var(dim=-1, unbiased=True)
    return torch.sqrt(err / (var + 1e-7)).mean(-1)


def power2d(u: torch.Tensor) -> torch.Tensor:
    """|û|²/2 per mode of (..., N, N) real fields (û normalised by N²)."""
    n = u.shape[-1]
    return 0.5 * torch.fft.fft2(u.double()).abs().pow(2) / n ** 4


def shells(n: int, device) -> torch.Tensor:
    k = torch.fft.fftfreq(n, d=1.0 / n, device=device)
    ky, kx = torch.meshgrid(k, k, indexing="ij")
    return torch.sqrt(kx ** 2 + ky ** 2).round().long()


def isotropic_spectrum(u: torch.Tensor) -> torch.Tensor:
    """E(k), k = 0..N/2, averaged over every leading index."""
    n = u.shape[-1]
    p = power2d(u).reshape(-1, n * n).mean(0)
    sh = shells(n, u.device).flatten()
    e = torch.zeros(int(sh.max()) + 1, dtype=p.dtype, device=u.device).index_add_(0, sh, p)
    return e[: n // 2 + 1]


def patch_lines(n: int, n_tok: int, device) -> torch.Tensor:
    """Mask of Fourier modes with kx or ky a non-zero multiple of N/p (the patch frequency)."""
    k = torch.fft.fftfreq(n, d=1.0 / n, device=device).abs().long()
    on = (k > 0) & (k % n_tok == 0)
    return on[:, None] | on[None, :]


def spectral_metrics(pred: torch.Tensor, truth: torch.Tensor, n_tok: int) -> dict[str, float]:
    n = pred.shape[-1]
    ep, et = isotropic_spectrum(pred), isotropic_spectrum(truth)
    err = (ep[1:] / et[1:].clamp_min(1e-30)).log10().abs().mean()
    mask = patch_lines(n, n_tok, pred.device)
    pp = power2d(pred).reshape(-1, n, n).mean(0)[mask].sum()
    pt = power2d(truth).reshape(-1, n, n).mean(0)[mask].sum()
    return {"spectrum_err": float(err), "patch_excess": float((pp / pt.clamp_min(1e-30)).log10().abs()),
            "patch_log_ratio": float((pp / pt.clamp_min(1e-30)).log10())}


def patchify_pair(x: torch.Tensor, shift, s1: int, s2: int, backend: str = "auto"):
    """The two gathers of one forward call on a real input slice (for the parity record)."""
    e = hmlp_pad(s1, s2)
    p = rolled_patchify(x, shift, 8, s1, e, backend=backend)
    y = F.pad(x, (e, e, e, e), mode="circular")
    return p, rolled_unpatchify(y, shift, e, backend=backend)


def run(cfg: Config, ctx: StageContext) -> None:
    device = pick_device(cfg.device)
    prep, trn = ctx.input("prepare"), ctx.input("train")
    meta, tinfo = read_json(prep / "meta.json"), read_json(trn / "train.json")
    from stages.common.config import ConfigError
    if cfg.n_eval > meta["n_test"]:
        raise ConfigError(f"papers.walrus.evaluate.n_eval: {cfg.n_eval} exceeds the {meta['n_test']} test trajectories")
    R, C = meta["rollout_steps"], meta["context"]
    bad = [s for s in cfg.frame_steps if not 1 <= s <= R]
    if bad:
        raise ConfigError(f"papers.walrus.evaluate.frame_steps: {bad[0]} outside 1..rollout_steps ({R})")
    tcfg = TrainConfig(**tinfo["config"], seeds=[0], arms=["jitter_on"], ft_steps=0)
    test = {k: v[: cfg.n_eval].to(device) for k, v in load_groups(prep, "test").items()}
    rec = KernelRecord(device)
    out: dict = {"groups": {}, "arms": {}, "transfer": {}, "persistence": {}, "curves": {}, "spectra": {},
                 "rollout_steps": R, "context": C,
                 "long_window": cfg.long_window}
    pre_groups = tinfo["pretrain_groups"]
    held = [k for k in sorted(test) if tinfo["held_out"] != "none" and k.startswith(tinfo["held_out"] + "_")]
    frames: dict[str, np.ndarray] = {}
    frame_group = pre_groups[-1]

    def evaluate_model(name: str, seed: int, path, groups: list[str]) -> dict[str, dict]:
        model: Walrus = build(tcfg, meta, "jitter_on" if name in ("finetune", "scratch") else name, seed)
        model.load_state_dict(torch.load(path, map_location=device))
        model.to(device).eval()
        model.kernel_backend = rec.backend
        res = {}
        for g in groups:
            model.rng.seed(cfg.seed * 7 + seed)          # jitter stays on at evaluation, seeded
            data = test[g]
            truth = data[:, C:C + R]
            before = model.kernel_calls
            with torch.no_grad():
                pred = rollout(model, data[:, :C], R)
            rec.count("rolled_patchify", model.kernel_calls - before)
            v = vrmse(pred, truth)                        # (n, R)
            s1, s2 = model.strides(data.shape[-1])
            n_tok = data.shape[-1] // (s1 * s2)
            sl = slice(R - cfg.spectrum_steps, R)
            res[g] = {"curve": v.mean(0).tolist(), **spectral_metrics(pred[:, sl], truth[:, sl], n_tok),
                      "spec_pred": isotropic_spectrum(pred[:, sl]).tolist(),
                      "spec_true": isotropic_spectrum(truth[:, sl]).tolist(), "n_tok": n_tok}
            if seed == tinfo_seeds[0] and g == frame_group and name in ("jitter_off", "jitter_on"):
                frames[name] = pred[0, [s - 1 for s in cfg.frame_steps], 0].cpu().numpy()
                frames["truth"] = truth[0, [s - 1 for s in cfg.frame_steps], 0].cpu().numpy()
        return res

    def summarize(per_group: dict[str, dict]) -> dict[str, float]:
        curves = np.array([r["curve"] for r in per_group.values()])        # (G, R)
        hi = max(int(g.rsplit("_", 1)[1]) for g in per_group)
        hi_curves = np.array([r["curve"] for g, r in per_group.items() if int(g.rsplit("_", 1)[1]) == hi])
        return {"one_step": float(curves[:, 0].mean()), "long": float(curves[:, -cfg.long_window:].mean()),
                "mean": float(curves.mean()), "long_hi": float(hi_curves[:, -cfg.long_window:].mean()),
                "spectrum_err": float(np.mean([r["spectrum_err"] for r in per_group.values()])),
                "patch_excess": float(np.mean([r["patch_excess"] for r in per_group.values()]))}

    tinfo_seeds = [e["seed"] for e in next(iter(tinfo["arms"].values()))]
    with torch_threads(cfg.num_threads):
        for arm, entries in tinfo["arms"].items():
            stats = {k: [] for k in ("one_step", "long", "mean", "long_hi", "spectrum_err", "patch_excess")}
            for e in entries:
                res = evaluate_model(arm, e["seed"], trn / "models" / f"{arm}_s{e['seed']}.pt", pre_groups)
                out["groups"].setdefault(arm, {})[str(e["seed"])] = {
                    g: {k: r[k] for k in ("spectrum_err", "patch_excess", "patch_log_ratio", "n_tok")}
                    for g, r in res.items()}
                out["curves"].setdefault(arm, []).append(np.mean([r["curve"] for r in res.values()], 0).tolist())
                out["spectra"].setdefault(arm, {})[str(e["seed"])] = {g: r["spec_pred"] for g, r in res.items()}
                out["spectra"]["truth"] = {g: r["spec_true"] for g, r in res.items()}
                for k, v in summarize(res).items():
                    stats[k].append(v)
            out["arms"][arm] = stats
        for kind, entries in tinfo["transfer"].items():
            stats = {k: [] for k in ("one_step", "long", "mean", "long_hi", "spectrum_err", "patch_excess")}
            for e in entries:
                res = evaluate_model(kind, e["seed"], trn / "models" / f"{kind}_s{e['seed']}.pt", held)
                out["curves"].setdefault(kind, []).append(np.mean([r["curve"] for r in res.values()], 0).tolist())
                for k, v in summarize(res).items():
                    stats[k].append(v)
            out["transfer"][kind] = stats
        # trivial predictor: persistence u(t+k) = u(t), per group set
        for name, groups in (("pretrain", pre_groups), ("held_out", held)):
            if groups:
                curves = [vrmse(test[g][:, C - 1:C].expand(-1, R, -1, -1, -1), test[g][:, C:C + R]).mean(0)
                          for g in groups]
                c = torch.stack(curves).cpu().numpy()
                out["persistence"][name] = {"one_step": float(c[:, 0].mean()),
                                            "long": float(c[:, -cfg.long_window:].mean()), "mean": float(c.mean())}
                out["curves"][f"persistence_{name}"] = [c.mean(0).tolist()]
        # parity of the Triton path on a real input slice (first test window of one group)
        g = pre_groups[0]
        x = test[g][:1, :C].reshape(C, 2, *test[g].shape[-2:])
        s1, s2 = build(tcfg, meta, "jitter_on", 0).strides(x.shape[-1])
        for name in ("rolled_patchify",):
            rec.parity(name, patchify_pair, x, (x.shape[-1] // 2 - 1, -3), s1, s2,
                       slice=f"first test window of {g} ({C} frames), shift (N/2-1, -3), hMLP strides ({s1}, {s2})")
    rec.save(ctx.out)
    np.savez(ctx.out / "frames.npz", **frames, steps=np.array(cfg.frame_steps))
    out["frame_group"] = frame_group
    out["held_groups"], out["pretrain_groups"] = held, pre_groups
    write_json(ctx.out / "evaluate.json", out)
