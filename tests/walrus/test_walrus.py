"""walrus: solver accuracy vs exact Fourier solutions, the wall-bounded channel, the official jitterers on
every shift (issue 56), flags, the patch-line statistic, VRMSE, the core patch-frequency effect, bad input,
and the smoke pipeline end to end (prepare output untouched by train, issue 57)."""
from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from stages.common.config import ConfigError, validate
from stages.walrus import prepare
from stages.walrus.common import hmlp_pad
from stages.walrus.evaluate import marginal_power, patch_harmonics, patch_line_stat, power2d
from stages.walrus.jitter import (OPEN, PERIODIC, PERIODIC_2D, WALL, axis_maps, boundary_flags, forward_map,
                                  inverse_map, official_sequence, shift_half)
from stages.walrus.model import Walrus, normalized_l1, rollout, window_stats
from stages.walrus.solvers import ChannelScenario, Physics, Scenario, advdiff_exact, wave_exact
from stages.walrus.train import vrmse

CPU = torch.device("cpu")
CHANNEL = ((WALL, WALL), (PERIODIC, PERIODIC))


# ----------------------------------------------------------------------------- solvers
def test_advdiff_matches_exact_fourier_solution():
    """IF-RK4 with the advection term explicit vs ĉ0 exp(-(κ|k|² + i a·k) t), κ ≠ 1, two resolutions."""
    for n in (32, 64):
        sc = Scenario("advdiff", n, CPU, Physics(nu=0.013, nu2=0.041, dt=0.02))
        uh = sc.initial(3, torch.Generator().manual_seed(n))
        c0 = sc.fields(uh)
        for _ in range(60):
            uh = sc.step(uh)
        exact = advdiff_exact(c0, sc.velocity, torch.tensor([0.013, 0.041], dtype=torch.float64), 60 * 0.02)
        assert (sc.fields(uh) - exact).abs().max().item() < 1e-4
        assert (exact - c0).abs().max().item() > 0.1             # the solution moved


def test_wave_matches_exact_and_converges_in_dt():
    errs = []
    for dt in (0.02, 0.01):
        sc = Scenario("wave", 32, CPU, Physics(speed=1.3, dt=dt))
        uh = sc.initial(2, torch.Generator().manual_seed(1))
        u0 = sc.fields(uh)[:, :1]
        for _ in range(int(round(1.0 / dt))):
            uh = sc.step(uh)
        errs.append((sc.fields(uh)[:, :1] - wave_exact(u0, 1.3, 1.0)).abs().max().item())
    assert errs[1] < 1e-4 and errs[0] / errs[1] > 8          # RK4: ~16x per halving of dt


def test_kolmogorov_velocity_is_divergence_free_and_finite():
    sc = Scenario("kolmogorov", 32, CPU, Physics(nu=0.02, drag=0.1, kf=4, dt=0.04, frame_every=2, burn_in=5))
    tr = sc.trajectories(2, 4, torch.Generator().manual_seed(0))
    assert torch.isfinite(tr).all()
    uh = torch.fft.fft2(tr[:, -1])
    div = torch.fft.ifft2(1j * sc.kx * uh[:, 0] + 1j * sc.ky * uh[:, 1]).real
    assert div.abs().max() < 1e-9 * max(1.0, tr.abs().max().item())


def test_channel_walls_free_slip_divergence_free_and_not_periodic():
    """the wall-bounded scenario: v = 0 on the wall row, the doubled-domain vorticity stays odd about the
    walls, the velocity is divergence-free, and the stored field is not periodic along the rows."""
    sc = ChannelScenario(16, CPU, Physics(nu=0.02, drag=0.1, kf=3, dt=0.02, frame_every=3, burn_in=20))
    g = torch.Generator().manual_seed(4)
    wh = sc.initial(2, g)
    for _ in range(40):
        wh = sc.step(wh)
    w = torch.fft.ifft2(wh).real
    assert torch.allclose(sc.odd_in_y(w), w, atol=1e-10)                  # symmetry kept by the dynamics
    f = sc.fields(wh)
    assert f.shape == (2, 2, 16, 16)
    assert f[:, 1, 0].abs().max() < 1e-9                                 # v = 0 on the wall (row 0)
    u, v = sc.velocity_from_vorticity(wh[:, 0])
    div = torch.fft.ifft2(1j * sc.kx * torch.fft.fft2(u) + 1j * sc.ky * torch.fft.fft2(v)).real
    assert div.abs().max() < 1e-9
    assert (f[:, 0, 0] - f[:, 0, -1]).abs().max() > 1e-2                  # rows: not a periodic pair
    assert float(u.std()) > 0.1                                           # the forcing drives a flow


# ----------------------------------------------------------------------------- jitterers (issue 56)
def test_axis_maps_by_hand():
    """n = 6, p = 4, e = 1: hand-worked source indices of the padded grids."""
    # domain (fixed): roll x by 1 -> [x5 x0 x1 x2 x3 x4], circular pad 1
    assert forward_map(6, (PERIODIC, PERIODIC), "domain", 1, 4, 1).tolist() == [4, 5, 0, 1, 2, 3, 4, 5]
    # patch (non-fixed): circular pad 1 -> [x5 x0 .. x5 x0], then roll the 8-long padded grid by 1
    assert forward_map(6, (PERIODIC, PERIODIC), "patch", 1, 4, 1).tolist() == [0, 5, 0, 1, 2, 3, 4, 5]
    # wall: zero pad P = p/2 + e = 3, roll the 12-long padded grid by 2 (-1 / -2: low / high strip)
    assert forward_map(6, (WALL, OPEN), "domain", 2, 4, 1).tolist() == [-2, -2, -1, -1, -1, 0, 1, 2, 3, 4, 5, -2]
    assert forward_map(6, (WALL, WALL), "none", 0, 4, 1).tolist() == [-1, 0, 1, 2, 3, 4, 5, -2]
    # un-jitter: domain crops e then rolls back; patch rolls the padded grid back then crops
    assert inverse_map(6, (PERIODIC, PERIODIC), "domain", 1, 4, 1).tolist() == [2, 3, 4, 5, 6, 1]
    assert inverse_map(6, (PERIODIC, PERIODIC), "patch", 1, 4, 1).tolist() == [2, 3, 4, 5, 6, 7]
    assert inverse_map(6, (WALL, WALL), "domain", 2, 4, 1).tolist() == [5, 6, 7, 8, 9, 10]
    assert [shift_half(32, (PERIODIC, PERIODIC), m, 8, 6) for m in ("domain", "patch", "none")] == [16, 4, 0]
    assert shift_half(32, (WALL, WALL), "domain", 8, 6) == 10


@pytest.mark.parametrize("mode", ["patch", "domain", "none"])
@pytest.mark.parametrize("bcs", [PERIODIC_2D, CHANNEL, ((OPEN, WALL), (WALL, OPEN))])
def test_jitter_maps_equal_official_pad_roll_sequence_on_every_shift(mode, bcs):
    """patch = PatchJittererBoundaryPad (pad -> roll the padded grid; un-jitter: roll back -> crop),
    domain = FixedPatchJittererBoundaryPad (kept), none = no jitter: the index maps and flag channels equal
    the official torch.pad / torch.roll sequence (replayed in jitter.official_sequence) for every shift in
    the official draw's support, at hMLP strides (2, 2) on 16² and (4, 2) on 32²."""
    g = torch.Generator().manual_seed(3)
    for (s1, s2), n in (((2, 2), 16), ((4, 2), 32)):
        p, e = s1 * s2, hmlp_pad(s1, s2)
        x = torch.randn(2, 2, n, n, generator=g, dtype=torch.float64)
        hs = [shift_half(n, bc, mode, p, e) for bc in bcs]
        ranges = [range(-(h - 1), h) if h > 1 else [0] for h in hs]
        count = 0
        for sy in ranges[0]:
            for sx in ranges[1]:
                ref, unjitter = official_sequence(x, bcs, mode, (sy, sx), s1, s2)
                my, mx, iy, ix = axis_maps((n, n), bcs, mode, (sy, sx), s1, s2)
                grid = x[..., my.clamp_min(0)[:, None], mx.clamp_min(0)[None, :]]
                grid = grid * ((my >= 0)[:, None] & (mx >= 0)[None, :])
                got = torch.cat([grid, boundary_flags(my, mx, bcs, x.dtype)[None].expand(2, -1, -1, -1)], 1)
                assert got.shape == ref.shape and torch.equal(got, ref), (sy, sx)
                z = torch.randn(2, 2, *ref.shape[-2:], generator=g, dtype=torch.float64)
                assert torch.equal(unjitter(z), z[..., iy[:, None], ix[None, :]]), (sy, sx)
                count += 1
        assert count == math.prod(len(r) for r in ranges)


def test_patch_mode_is_not_the_old_roll_then_pad_order():
    """the non-fixed jitterer wraps the padded grid: a seam, so it differs from a periodic shift of the field."""
    my = forward_map(32, (PERIODIC, PERIODIC), "patch", 3, 4, 5)
    old = torch.remainder(torch.arange(42) - 5 - 3, 32)
    assert not torch.equal(my, old)
    assert torch.equal(forward_map(32, (PERIODIC, PERIODIC), "domain", 3, 4, 5), old)


def test_flags_by_hand_on_a_wall_and_open_box():
    bcs = ((WALL, OPEN), (PERIODIC, PERIODIC))
    my = forward_map(4, bcs[0], "domain", 0, 4, 1)        # P = 3: [-1 -1 -1 0 1 2 3 -2 -2 -2]
    mx = forward_map(4, bcs[1], "domain", 0, 4, 1)
    f = boundary_flags(my, mx, bcs)
    assert f.shape == (3, 10, 6)
    assert f[0, :, 0].tolist() == [0, 0, 0, 1, 1, 1, 1, 0, 0, 0]       # bias: off on the strips
    assert f[1, :, 0].tolist() == [1, 1, 1, 0, 0, 0, 0, 0, 0, 0]       # WALL strip (low side)
    assert f[2, :, 0].tolist() == [0, 0, 0, 0, 0, 0, 0, 1, 1, 1]       # OPEN strip (high side)
    assert torch.equal(f[:, :, :1].expand_as(f), f)                     # constant along the periodic axis
    corner = boundary_flags(torch.tensor([-1, 0]), torch.tensor([-1, 0]), ((WALL, WALL), (WALL, WALL)))
    assert corner[1, 0, 0] == 2 and corner[0, 0, 0] == 0                # corners are in two strips


def test_jitter_is_roll_then_unroll_exactly():
    """domain mode on a periodic grid: model(x, s) == roll(model(roll(x, s), 0), -s) (no token roll)."""
    torch.manual_seed(0)
    m = Walrus(d=16, depth=2, heads=1, max_t=3, jitter="domain", token_roll=False, tokens_per_axis=4).double()
    with torch.no_grad():
        m.dec2.normal_(0, 0.1)
    for n, s in ((32, (5, -11)), (64, (-31, 3))):
        x = torch.randn(2, 3, 2, n, n, dtype=torch.float64)
        a = m(x, PERIODIC_2D, torch.tensor(s))
        b = torch.roll(m(torch.roll(x, s, dims=(-2, -1)), PERIODIC_2D, torch.tensor([0, 0])), (-s[0], -s[1]),
                       dims=(-2, -1))
        assert torch.allclose(a, b, atol=1e-10)


def test_normalisation_scale_invariance():
    """per-sample per-field RMS: scaling a field by σ ≠ 1 leaves the loss unchanged."""
    torch.manual_seed(0)
    m = Walrus(d=16, depth=1, heads=1, max_t=3, jitter="none", tokens_per_axis=4).double()
    with torch.no_grad():
        m.dec2.normal_(0, 0.1)
    w = torch.randn(2, 4, 2, 32, 32, dtype=torch.float64)
    rms_in, _ = window_stats(w[:, :3])
    assert torch.allclose(rms_in[0, 0, 1, 0, 0], w[0, :3, 1].pow(2).mean().sqrt() + 1e-6)
    w2 = w.clone()
    w2[:, :, 1] *= 7.3
    w2[1] *= 0.21
    assert torch.allclose(normalized_l1(m, w, 3), normalized_l1(m, w2, 3), rtol=1e-4)


def test_rollout_of_zero_model_is_persistence_with_jitter_on_walls():
    m = Walrus(d=16, depth=1, heads=1, max_t=3, jitter="domain", tokens_per_axis=4).double()
    x = torch.randn(2, 3, 2, 32, 32, dtype=torch.float64)
    r = rollout(m, x, 5, CHANNEL, np.random.default_rng(0))
    assert torch.allclose(r, x[:, -1:].expand(-1, 5, -1, -1, -1))


def test_vrmse_against_numpy():
    g = torch.Generator().manual_seed(2)
    y = 2.5 * torch.randn(3, 4, 2, 8, 8, generator=g)
    p = y + 0.3 * torch.randn(3, 4, 2, 8, 8, generator=g)
    yn, pn = y.numpy(), p.numpy()
    ref = np.sqrt(((pn - yn) ** 2).mean((-2, -1)) / (yn.reshape(3, 4, 2, -1).var(-1, ddof=1) + 1e-7)).mean(-1)
    assert np.allclose(vrmse(p, y).numpy(), ref, rtol=1e-5)


# ----------------------------------------------------------------------------- the patch-line statistic
def test_patch_line_statistic_detects_a_patch_periodic_artifact():
    """a smooth field plus a pattern that repeats every patch (p = 8 on 32²: lines at k = 4, 8) has excess
    power on the patch lines; the smooth field alone and a pattern at a neighbouring wavenumber do not."""
    n, n_tok = 32, 4
    g = torch.Generator().manual_seed(5)
    noise = torch.randn(6, 2, n, n, generator=g, dtype=torch.float64)
    k = torch.fft.fftfreq(n, d=1.0 / n)
    ky, kx = torch.meshgrid(k, k, indexing="ij")
    base = torch.fft.ifft2(torch.fft.fft2(noise) * (kx ** 2 + ky ** 2 + 1).pow(-1.2)).real
    j = torch.arange(n, dtype=torch.float64)
    bump = torch.exp(-((j % 8) - 3.5) ** 2)                 # period 8 = p in both directions
    art = 0.2 * base.std() * (bump[:, None] + bump[None, :])
    assert patch_harmonics(n, n_tok, 2 / 3) == [4, 8]
    clean = patch_line_stat(base, (n_tok, n_tok), 2 / 3)
    dirty = patch_line_stat(base + art, (n_tok, n_tok), 2 / 3)
    assert dirty - clean > 0.3
    off = 0.3 * base.std() * torch.cos(2 * math.pi * 5 * j / n)[None, :].expand(n, n)   # k = 5: a neighbour
    assert patch_line_stat(base + off, (n_tok, n_tok), 2 / 3) - clean < -0.1
    # marginal power by hand on a single mode: all of it at |kx| = 3
    u = torch.cos(2 * math.pi * 3 * j / n)[None, :].expand(n, n)
    pm = marginal_power(u, 1)
    assert float(pm[3]) == pytest.approx(float(power2d(u).sum()), rel=1e-12) and float(pm.sum() - pm[3]) < 1e-20


def test_core_effect_jitter_removes_patch_frequency_aliasing():
    """A fixed patch grid (patchify, mean per patch, piecewise-constant decode) aliases a single Fourier mode
    k0 into k0 ± m·N/p; the same encoder-decoder under domain jitter (index maps), averaged over the shifts,
    is shift-equivariant and keeps all power at k0. Fails if the jitter does not wrap the grid or is not undone."""
    from kernels.rolled_patchify import rolled_patchify, rolled_unpatchify

    n, p, k0 = 32, 4, 3
    j = torch.arange(n, dtype=torch.float64)
    x = (1.7 * torch.cos(2 * math.pi * k0 * j / n + 0.4))[None, None, None, :].expand(1, 1, n, n).contiguous()

    def codec(field, shift):
        my = forward_map(n, (PERIODIC, PERIODIC), "domain", shift[0], p, 0)
        mx = forward_map(n, (PERIODIC, PERIODIC), "domain", shift[1], p, 0)
        tok = rolled_patchify(field, my, mx, p, p, backend="torch").view(1, 1, p * p, -1).mean(2)
        dec = F.fold(tok.repeat_interleave(p * p, 1), (n, n), p, stride=p)
        iy = inverse_map(n, (PERIODIC, PERIODIC), "domain", shift[0], p, 0)
        ix = inverse_map(n, (PERIODIC, PERIODIC), "domain", shift[1], p, 0)
        return rolled_unpatchify(dec, iy, ix, backend="torch")

    def off_mode_fraction(y):
        pw = power2d(y)[0, 0]
        keep = torch.zeros_like(pw, dtype=torch.bool)
        keep[0, k0] = keep[0, n - k0] = True
        return float(pw[~keep].sum() / pw.sum())

    fixed = codec(x, (0, 0))
    jit = torch.stack([codec(x, (a - n // 2 + 1, b - n // 2 + 1)) for a in range(p) for b in range(p)]).mean(0)
    assert off_mode_fraction(fixed) > 1e-2
    assert off_mode_fraction(jit) < 1e-20
    pw = power2d(fixed)[0, 0]
    assert pw[0, n // p - k0] > 1e-3 * pw[0, k0]
    # and the patch-line statistic sees the fixed grid's artifact on the lines m·N/p (k0 = 3 aliases to 5, 11, ...)
    assert patch_line_stat(fixed, (n // p, n // p), 1.0) != patch_line_stat(x, (n // p, n // p), 1.0)


# ----------------------------------------------------------------------------- config errors
@pytest.mark.parametrize("block,match", [
    ({"patch_size": 5}, "patch_size"),
    ({"n_frames": 20, "context": 3, "rollout_steps": 40}, "longer than the trajectories"),
    ({"scenarios": ["kolmogorov", "navier"]}, "scenarios"),
    ({"tokens_per_axis": 3}, "tokens_per_axis"),
    ({"scenarios": ["advdiff", "wave"], "multires_scenarios": ["kolmogorov"]}, "multires_scenarios"),
    ({"source": {"kind": "hf", "model": "x/y"}}, "kind: file"),
    ({"well_fields": ["velocity_x", "../x"]}, "plain name"),
])
def test_bad_input_fails_at_config_load(block, match):
    with pytest.raises(ConfigError, match=match):
        validate(prepare.Config, block, "papers.walrus.prepare")


def test_bad_train_input_fails_at_config_load():
    from stages.walrus import train
    for block, match in (({"arm_seeds": {"fixed_tok": 9}}, "outside 1..5"),
                         ({"arms": ["jitter_off"], "arm_seeds": {"fixed_tok": 1}, "ft_steps": 0}, "not in arms"),
                         ({"curve_every": 5, "curve_arms": ["jitter_patch"], "arms": ["jitter_on"]}, "curve_arms"),
                         ({"curve_long_window": 50, "curve_horizon": 10}, "curve_long_window")):
        with pytest.raises(ConfigError, match=match):
            validate(train.Config, block, "papers.walrus.train")


# ----------------------------------------------------------------------------- the pipeline
def _digest(folder) -> dict[str, str]:
    return {str(f.relative_to(folder)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(folder.rglob("*")) if f.is_file()}


def test_smoke_pipeline(smoke_run):
    out = smoke_run("walrus", stages=("prepare",))
    before = _digest(out["prepare"])
    out.update(smoke_run("walrus", stages=("train", "evaluate", "report")))
    assert _digest(out["prepare"]) == before              # issue 57: no HF cache files in the prepare output
    metrics = json.loads((out["report"] / "metrics.json").read_text())
    names = [c["name"] for c in metrics["claims"]]
    groups = metrics["metrics"]["seeds"] and sorted(metrics["metrics"]["groups"])
    assert groups == ["advdiff_32", "advdiff_64", "channel_32"]          # wave is held out
    for g in groups:
        assert f"jitter_lowers_long_vrmse_{g}" in names and f"jitter_suppresses_patch_lines_{g}" in names
    for name in ("jitter_lowers_long_vrmse", "jitter_suppresses_patch_lines", "one_step_nearly_unchanged",
                 "patch_jitter_lowers_long_vrmse", "adaptive_tok_matches_fixed", "pretraining_transfers",
                 "unjittered_rollouts_unstable", "model_beats_persistence", "one_step_band_narrower_than_skill"):
        assert name in names
    kinds = {c["name"]: c["kind"] for c in metrics["claims"]}
    assert kinds["unjittered_rollouts_unstable"] == "check" and kinds["jitter_lowers_long_vrmse_channel_32"] == "finding"
    for c in metrics["claims"]:
        assert c["verdict"] in ("holds", "fails", "inconclusive") and c["refuted_by"]
    ev = json.loads((out["evaluate"] / "evaluate.json").read_text())
    assert ev["bcs"]["channel_32"] == [["wall", "wall"], ["periodic", "periodic"]]
    k = metrics["kernels"]["rolled_patchify"]
    assert k["calls"] > 0 and k["parity_max_abs_err"] == 0.0
    for fig in ("vrmse_vs_step", "learning_curve", "patch_line_excess", "energy_spectra", "rollout_frames"):
        assert (out["report"] / "figures" / f"{fig}.png").stat().st_size > 0
    specs = json.loads((out["report"] / "plots" / "_specs.json").read_text())
    assert len(specs["vrmse_vs_step"]["y"]) >= 5                          # one series per arm + persistence
    text = (out["report"] / "report.md").read_text()
    for head in ("## Deviations", "## Discussion", "## Threats to validity"):
        assert head in text
    tr = json.loads((out["train"] / "train.json").read_text())
    assert [p["step"] for p in tr["curves"]["jitter_off"]] == [2, 3]      # curve_every 2, last step 3
    import datasets
    dd = datasets.load_from_disk(str(out["prepare"] / "dataset"))
    assert set(dd) == {"advdiff_32", "advdiff_64", "channel_32", "wave_32"}
