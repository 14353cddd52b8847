"""Pseudo-spectral (FFT) solvers in torch for four 2D periodic scenarios on [0, 2π)².

Every scenario is written as û_t = L û + N(û) with L diagonal in Fourier space (viscosity /
diffusion) and N evaluated pseudo-spectrally (products in physical space, 2/3-rule dealiasing);
time stepping is the integrating-factor (Lawson) RK4. Each scenario stores two fields:

  kolmogorov  ω_t + u·∇ω = ν Δω − α ω + k_f cos(k_f y)    stored as velocity (u, v) = (ψ_y, −ψ_x), ω = −Δψ
  burgers     u_t + (u·∇) u = ν Δu                         vector field (u, v)
  advdiff     c_t + a·∇c = κ_i Δc, two scalars (c1, c2)     constant velocity a per trajectory
  wave        u_tt = c² Δu                                  (u, u_t)
  channel     Kolmogorov-type forced flow between two free-slip walls (rows 0 and N are walls,
              columns periodic): ω_t + u·∇ω = ν Δω − α ω + k_f sin(k_f y), stored as (u, v)

channel is the one non-periodic scenario (its rows see wall boundaries, so the model takes the
non-periodic jitter branch there). It is solved exactly on the doubled periodic domain: the vorticity
and stream function are odd about both walls (a sine series in y), the advection term keeps that
symmetry, so ψ = 0 (no penetration, v = 0) and ∂u/∂y = 0 (free slip) hold on the walls at every step;
the stored fields are the physical half, y = jπ/N for j = 0..N−1 (row 0 is the wall).

advdiff and wave have exact Fourier solutions (``advdiff_exact``, ``wave_exact``) used by the tests.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

SCENARIOS = ("kolmogorov", "burgers", "advdiff", "wave", "channel")
FIELDS = {"kolmogorov": ("u", "v"), "burgers": ("u", "v"), "advdiff": ("c1", "c2"), "wave": ("u", "u_t"),
          "channel": ("u", "v")}
# boundary conditions per axis (rows, columns) as (low, high), The Well's names
BOUNDARIES = {name: (("periodic", "periodic"), ("periodic", "periodic")) for name in SCENARIOS}
BOUNDARIES["channel"] = (("wall", "wall"), ("periodic", "periodic"))


@dataclass(frozen=True)
class Physics:
    nu: float = 0.01          # viscosity / diffusivity
    nu2: float = 0.03         # second diffusivity (advdiff c2)
    drag: float = 0.1         # kolmogorov linear drag α
    kf: int = 4               # kolmogorov forcing wavenumber
    speed: float = 1.0        # wave speed c
    dt: float = 0.02          # solver step
    frame_every: int = 10     # solver steps per stored frame
    burn_in: int = 0          # solver steps before the first stored frame


PHYSICS = {
    "kolmogorov": Physics(nu=0.02, drag=0.1, kf=4, dt=0.04, frame_every=5, burn_in=100),
    "burgers": Physics(nu=0.03, dt=0.02, frame_every=3),
    "advdiff": Physics(nu=0.01, nu2=0.03, dt=0.04, frame_every=3),
    "wave": Physics(speed=1.0, dt=0.01, frame_every=5),
    "channel": Physics(nu=0.02, drag=0.1, kf=4, dt=0.02, frame_every=5, burn_in=200),
}


def wavenumbers(n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Integer wavenumbers (ky, kx), each (n, n), float64."""
    k = torch.fft.fftfreq(n, d=1.0 / n, device=device).to(torch.float64)
    return torch.meshgrid(k, k, indexing="ij")


def dealias(n: int, device: torch.device) -> torch.Tensor:
    ky, kx = wavenumbers(n, device)
    kmax = n / 3.0                       # 2/3 rule: keep |k| < (2/3)(n/2)
    return ((ky.abs() < kmax) & (kx.abs() < kmax)).to(torch.float64)


def random_field(batch: int, fields: int, n: int, kpeak: float, gen: torch.Generator,
                 device: torch.device) -> torch.Tensor:
    """Smooth random periodic fields (batch, fields, n, n), unit RMS, spectrum ∝ exp(−(|k|/kpeak)²)."""
    noise = torch.randn(batch, fields, n, n, generator=gen, device=device, dtype=torch.float64)
    ky, kx = wavenumbers(n, device)
    k = torch.sqrt(kx ** 2 + ky ** 2)
    filt = torch.exp(-(k / kpeak) ** 2) * (k > 0)
    u = torch.fft.ifft2(torch.fft.fft2(noise) * filt).real
    return u / u.pow(2).mean(dim=(-2, -1), keepdim=True).sqrt().clamp_min(1e-12)


def ifrk4_step(uh: torch.Tensor, lin: torch.Tensor, nonlin, dt: float) -> torch.Tensor:
    """ALGO: integrating-factor RK4 for û_t = L û + N(û), L diagonal (Lawson's method)."""
    e = torch.exp(lin * dt / 2)
    e2 = e * e
    a = nonlin(uh)
    b = nonlin(e * (uh + dt / 2 * a))
    c = nonlin(e * uh + dt / 2 * b)
    d = nonlin(e2 * uh + dt * e * c)
    return e2 * uh + dt / 6 * (e2 * a + 2 * e * (b + c) + d)


class Scenario:
    """One scenario at one resolution: spectral operators, initial state, state -> stored fields."""

    def __init__(self, name: str, n: int, device: torch.device, physics: Physics | None = None):
        if name not in SCENARIOS or name == "channel":
            raise ValueError(f"unknown scenario {name!r} (known: {', '.join(SCENARIOS)})")
        self.name, self.n, self.device = name, n, device
        self.p = physics or PHYSICS[name]
        self.ky, self.kx = wavenumbers(n, device)
        self.k2 = self.kx ** 2 + self.ky ** 2
        self.mask = dealias(n, device)
        x = torch.arange(n, device=device, dtype=torch.float64) * (2 * math.pi / n)
        self.y = x[:, None].expand(n, n)
        self.velocity = None  # advdiff: (B, 2, 1, 1) constant (ay, ax)
        p = self.p
        if name == "kolmogorov":
            self.lin = (-p.nu * self.k2 - p.drag)[None, None]
            self.forcing = torch.fft.fft2(p.kf * torch.cos(p.kf * self.y))[None, None]
        elif name == "burgers":
            self.lin = (-p.nu * self.k2)[None, None]
        elif name == "advdiff":
            self.lin = torch.stack([-p.nu * self.k2, -p.nu2 * self.k2])[None]
        else:
            self.lin = torch.zeros(1, 1, n, n, dtype=torch.float64, device=device)

    # --- gradients -----------------------------------------------------------------------------
    def _dx(self, uh):
        return torch.fft.ifft2(1j * self.kx * uh).real

    def _dy(self, uh):
        return torch.fft.ifft2(1j * self.ky * uh).real

    def _phys(self, uh):
        return torch.fft.ifft2(uh).real

    def velocity_from_vorticity(self, wh: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        psih = wh / torch.where(self.k2 == 0, torch.ones_like(self.k2), self.k2)
        psih = psih * (self.k2 > 0)
        return self._dy(psih), -self._dx(psih)

    # --- N(û) ----------------------------------------------------------------------------------
    def nonlinear(self, uh: torch.Tensor) -> torch.Tensor:
        if self.name == "kolmogorov":
            u, v = self.velocity_from_vorticity(uh)
            adv = u * self._dx(uh) + v * self._dy(uh)          # (B, 1, n, n)
            return -torch.fft.fft2(adv) * self.mask + self.forcing
        if self.name == "burgers":
            u, v = self._phys(uh[:, :1]), self._phys(uh[:, 1:])
            adv = u * self._dx(uh) + v * self._dy(uh)
            return -torch.fft.fft2(adv) * self.mask
        if self.name == "advdiff":
            ay, ax = self.velocity[:, :1], self.velocity[:, 1:]
            adv = ax * self._dx(uh) + ay * self._dy(uh)        # a·∇c in physical space
            return -torch.fft.fft2(adv)
        c2 = self.p.speed ** 2
        return torch.cat([uh[:, 1:], -c2 * self.k2 * uh[:, :1]], dim=1)

    def initial(self, batch: int, gen: torch.Generator) -> torch.Tensor:
        """Spectral initial state û0 (batch, F, n, n) complex128."""
        if self.name == "kolmogorov":
            w = 2.0 * random_field(batch, 1, self.n, 4.0, gen, self.device)
            return torch.fft.fft2(w)
        if self.name == "burgers":
            return torch.fft.fft2(random_field(batch, 2, self.n, 3.0, gen, self.device))
        if self.name == "advdiff":
            ang = 2 * math.pi * torch.rand(batch, generator=gen, device=self.device, dtype=torch.float64)
            spd = 0.5 + torch.rand(batch, generator=gen, device=self.device, dtype=torch.float64)
            self.velocity = torch.stack([spd * torch.sin(ang), spd * torch.cos(ang)], 1)[:, :, None, None]
            return torch.fft.fft2(random_field(batch, 2, self.n, 4.0, gen, self.device))
        u = random_field(batch, 1, self.n, 3.0, gen, self.device)
        return torch.fft.fft2(torch.cat([u, torch.zeros_like(u)], 1))

    def fields(self, uh: torch.Tensor) -> torch.Tensor:
        """Stored physical fields (batch, 2, n, n)."""
        if self.name == "kolmogorov":
            u, v = self.velocity_from_vorticity(uh[:, 0])
            return torch.stack([u, v], 1)
        return self._phys(uh)

    def step(self, uh: torch.Tensor) -> torch.Tensor:
        return ifrk4_step(uh, self.lin, self.nonlinear, self.p.dt)

    def trajectories(self, batch: int, frames: int, gen: torch.Generator) -> torch.Tensor:
        """(batch, frames, 2, n, n) float64 physical fields."""
        uh = self.initial(batch, gen)
        for _ in range(self.p.burn_in):
            uh = self.step(uh)
        out = []
        for f in range(frames):
            if f:
                for _ in range(self.p.frame_every):
                    uh = self.step(uh)
            out.append(self.fields(uh))
        return torch.stack(out, 1)


def advdiff_exact(c0: torch.Tensor, velocity: torch.Tensor, kappa: torch.Tensor, t: float) -> torch.Tensor:
    """Exact solution of c_t + a·∇c = κ Δc: ĉ(k, t) = ĉ0(k) exp(−(κ|k|² + i a·k) t).
    c0 (B, F, n, n), velocity (B, 2, 1, 1) = (ay, ax), kappa (F,)."""
    n = c0.shape[-1]
    ky, kx = wavenumbers(n, c0.device)
    k2 = kx ** 2 + ky ** 2
    ay, ax = velocity[:, :1], velocity[:, 1:]
    decay = torch.exp(-(kappa[None, :, None, None] * k2 + 1j * (ax * kx + ay * ky)) * t)
    return torch.fft.ifft2(torch.fft.fft2(c0) * decay).real


def wave_exact(u0: torch.Tensor, speed: float, t: float) -> torch.Tensor:
    """Exact u(t) of u_tt = c² Δu with u_t(0) = 0: û(k, t) = û0(k) cos(c|k|t)."""
    n = u0.shape[-1]
    ky, kx = wavenumbers(n, u0.device)
    k = torch.sqrt(kx ** 2 + ky ** 2)
    return torch.fft.ifft2(torch.fft.fft2(u0) * torch.cos(speed * k * t)).real


class ChannelScenario:
    """Forced 2D flow between free-slip walls (rows) with periodic columns, on the doubled domain.

    Physical channel: y ∈ [0, π] (walls at 0 and π), x ∈ [0, π) periodic, N x N points. The solver
    grid is 2N rows (y ∈ [0, 2π), vorticity odd about y = 0 and y = π) by N columns (kx ∈ 2ℤ)."""

    def __init__(self, n: int, device: torch.device, physics: Physics | None = None):
        self.name, self.n, self.device = "channel", n, device
        self.p = physics or PHYSICS["channel"]
        ky = torch.fft.fftfreq(2 * n, d=1.0 / (2 * n), device=device).to(torch.float64)
        kx = 2.0 * torch.fft.fftfreq(n, d=1.0 / n, device=device).to(torch.float64)
        self.ky, self.kx = torch.meshgrid(ky, kx, indexing="ij")
        self.k2 = self.kx ** 2 + self.ky ** 2
        kmax_y, kmax_x = (2 * n) / 3.0, 2.0 * n / 3.0          # 2/3 rule on both axes
        self.mask = ((self.ky.abs() < kmax_y) & (self.kx.abs() < kmax_x)).to(torch.float64)
        y = torch.arange(2 * n, device=device, dtype=torch.float64) * (math.pi / n)
        self.y = y[:, None].expand(2 * n, n)
        p = self.p
        self.lin = (-p.nu * self.k2 - p.drag)[None, None]
        self.forcing = torch.fft.fft2(p.kf * torch.sin(p.kf * self.y))[None, None]

    def _dx(self, uh):
        return torch.fft.ifft2(1j * self.kx * uh).real

    def _dy(self, uh):
        return torch.fft.ifft2(1j * self.ky * uh).real

    def velocity_from_vorticity(self, wh):
        psih = wh / torch.where(self.k2 == 0, torch.ones_like(self.k2), self.k2) * (self.k2 > 0)
        return self._dy(psih), -self._dx(psih)

    def nonlinear(self, wh):
        u, v = self.velocity_from_vorticity(wh)
        return -torch.fft.fft2(u * self._dx(wh) + v * self._dy(wh)) * self.mask + self.forcing

    def odd_in_y(self, w: torch.Tensor) -> torch.Tensor:
        """(w(y) - w(-y)) / 2 on the doubled grid (row j <-> row (2N - j) mod 2N)."""
        refl = torch.roll(torch.flip(w, dims=(-2,)), shifts=1, dims=-2)
        return 0.5 * (w - refl)

    def initial(self, batch: int, gen: torch.Generator) -> torch.Tensor:
        noise = torch.randn(batch, 1, 2 * self.n, self.n, generator=gen, device=self.device, dtype=torch.float64)
        k = torch.sqrt(self.k2)
        w = torch.fft.ifft2(torch.fft.fft2(noise) * torch.exp(-(k / 4.0) ** 2) * (k > 0)).real
        w = self.odd_in_y(w)
        w = 2.0 * w / w.pow(2).mean(dim=(-2, -1), keepdim=True).sqrt().clamp_min(1e-12)
        return torch.fft.fft2(w)

    def fields(self, wh: torch.Tensor) -> torch.Tensor:
        u, v = self.velocity_from_vorticity(wh[:, 0])
        return torch.stack([u, v], 1)[..., : self.n, :]            # the physical half: rows 0..N-1

    def step(self, wh):
        return ifrk4_step(wh, self.lin, self.nonlinear, self.p.dt)

    def trajectories(self, batch: int, frames: int, gen: torch.Generator) -> torch.Tensor:
        wh = self.initial(batch, gen)
        for _ in range(self.p.burn_in):
            wh = self.step(wh)
        out = []
        for f in range(frames):
            if f:
                for _ in range(self.p.frame_every):
                    wh = self.step(wh)
            out.append(self.fields(wh))
        return torch.stack(out, 1)


def make_scenario(name: str, n: int, device: torch.device):
    return ChannelScenario(n, device) if name == "channel" else Scenario(name, n, device)
