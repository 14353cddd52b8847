"""train: run every learning dynamic on every game until an ε-NE (hitting time T_ε) or the cap.

Experiments (ε = eps_scale / m unless said otherwise; all two-player runs through
kernels.ftrl_dynamics.ftrl_run, batched over starts/seeds):
  chain      every arm × m, from the uniform start AND from `start_seeds` random starts (one batch)
  staircase  the staircase_arm from the uniform start (the card's pre-check game)
  random     random_game_arm on random identical-interest games (one per seed) — the baseline
  fixed_eps  fixed_eps_arm (lazy alternating) at a FIXED ε on chain and random games, m in fixed_eps_ms
  multi      N-player fictitious play on the snake game, ε = multi_eps_scale / m^N
Writes runs.parquet (one row per run), iterates.pt (x, y at the hit / cap per run), traces.pt
(Φ and gap every `cap/trace_points` steps for the uniform-start chain runs), multi.parquet.
"""
from __future__ import annotations


import polars as pl
import torch
from pydantic import Field, field_validator, model_validator
from tqdm import tqdm

from kernels.ftrl_dynamics import ftrl_run
from kernels.record import KernelRecord
from stages.common.config import Seed, Seeds, StageConfig, unique_items
from stages.common.device import DeviceName, generator, pick_device
from stages.common.paths import read_json, write_json
from stages.common.runner import StageContext
from stages.ftrl_potential.dynamics import Arm, multi_fp_hitting_time, run_arm, starts

DEFAULT_ARMS = [
    Arm(name="fp", reg="fp"),
    Arm(name="mwu", reg="entropic", eta=1.0),
    Arm(name="mwu_eta0.1", reg="entropic", eta=0.1),
    Arm(name="mwu_sqrt", reg="entropic", eta=1.0, schedule="sqrt"),
    Arm(name="euclidean", reg="euclidean", eta=0.1),
    Arm(name="euclidean_sqrt", reg="euclidean", eta=0.3, schedule="sqrt"),
    Arm(name="logbarrier", reg="logbarrier", eta=1.0, cap=3000),
    Arm(name="alt_mwu", reg="entropic", eta=1.0, alternating=True),
]


class Config(StageConfig):
    seed: Seed = 0
    eps_scale: float = Field(0.1, gt=0, le=1.0, description="ε = eps_scale / m on the chain games")
    fixed_eps: float = Field(0.05, gt=0, le=1.0, description="the fixed ε of the upper-bound experiment")
    cap: int = Field(20_000, ge=10, le=10_000_000, description="hitting-time cap (reported as '>= cap')")
    arms: list[Arm] = Field(default=DEFAULT_ARMS, min_length=1)
    start_seeds: Seeds = Field(default=[0, 1, 2, 3, 4], description="random starts per (arm, m); >= 3 for claims")
    start_scale: float = Field(1.0, gt=0, le=100.0, description="random start: z_1 = scale · N(0, I)")
    staircase_arm: str = "mwu"
    random_game_arm: str = "mwu"
    fixed_eps_arm: str = "alt_mwu"
    multi_eps_scale: float = Field(0.5, gt=0, le=1.0, description="multi-player ε = scale / (number of profiles)")
    multi_cap: int = Field(200_000, ge=10, le=10_000_000)
    trace_points: int = Field(64, ge=1, le=4096)
    parity_cap: int = Field(12, ge=1, le=1000, description="steps of the interpreter parity slice (fast regs)")
    device: DeviceName = "auto"

    @field_validator("start_seeds")
    @classmethod
    def _seeds(cls, v):
        return unique_items(v, "start_seeds")

    @model_validator(mode="after")
    def _arms(self):
        names = [a.name for a in self.arms]
        unique_items(names, "arms[].name")
        for key in ("staircase_arm", "random_game_arm", "fixed_eps_arm"):
            if getattr(self, key) not in names:
                raise ValueError(f"{key}: {getattr(self, key)!r} is not one of arms ({', '.join(names)})")
        return self


def _rows(exp, arm, m, seeds, start, out, cap, eps, n):
    return [{"experiment": exp, "arm": arm.name, "reg": arm.reg, "eta": arm.eta, "schedule": arm.schedule,
             "alternating": arm.alternating, "m": m, "n": n, "seed": s, "start": st, "hit": int(h),
             "cap": cap, "eps": eps} for s, st, h in zip(seeds, start, out["hit"].tolist())]


def run(cfg: Config, ctx: StageContext) -> None:
    torch.set_num_threads(1)
    device = pick_device(cfg.device)
    rec = KernelRecord(device)
    prep = ctx.input("prepare")
    meta = read_json(prep / "meta.json")
    games = torch.load(prep / "games.pt")
    arms = {a.name: a for a in cfg.arms}
    rows, xs, ys, traces = [], [], [], {}

    def keep(exp, arm, m, seeds, start, out, cap, eps, n):
        rows.extend(_rows(exp, arm, m, seeds, start, out, cap, eps, n))
        xs.extend(out["x"].cpu()), ys.extend(out["y"].cpu())

    S = len(cfg.start_seeds)
    for arm in tqdm(cfg.arms, desc="train: chain games, every arm"):
        cap = arm.cap or cfg.cap
        every = max(1, cap // cfg.trace_points)
        for m in meta["ms"]:
            A = games["chain"][m].to(device)
            n = A.shape[0]
            eps = cfg.eps_scale / m
            u0, v0 = starts(1, n, arm, cfg.start_scale, None, device)          # uniform start
            ur, vr = [], []
            for s in cfg.start_seeds:                                           # one stream per (seed, m)
                g = generator(device, cfg.seed * 7919 + s * 104_729 + m)
                a, b = starts(1, n, arm, cfg.start_scale, g, device)
                ur.append(a), vr.append(b)
            ux0, uy0 = torch.cat([u0, *ur]), torch.cat([v0, *vr])
            out = run_arm(arm, A.expand(1 + S, n, n).contiguous(), eps, cap, ux0, uy0, rec, every=every)
            keep("chain", arm, m, [-1, *cfg.start_seeds], ["uniform"] + ["random"] * S, out, cap, eps, n)
            traces[(arm.name, m)] = {"phi": out["phi"][0].cpu(), "gap": out["gap"][0].cpu(), "every": every}
            ctx.tracker.log({f"hit/{arm.name}/m{m}": int(out["hit"][0])})

    arm = arms[cfg.staircase_arm]
    for m in meta["ms"]:
        A = games["staircase"][m].to(device)[None]
        u0, v0 = starts(1, A.shape[1], arm, cfg.start_scale, None, device)
        keep("staircase", arm, m, [-1], ["uniform"], run_arm(arm, A, cfg.eps_scale / m, cfg.cap, u0, v0, rec),
             cfg.cap, cfg.eps_scale / m, A.shape[1])

    seeds = meta["random_game_seeds"]
    for exp, arm, ms, eps_of in (("random", arms[cfg.random_game_arm], meta["ms"], lambda m: cfg.eps_scale / m),
                                 ("fixed_eps", arms[cfg.fixed_eps_arm], meta["fixed_eps_ms"], lambda m: cfg.fixed_eps)):
        cap = arm.cap or cfg.cap
        for m in tqdm(ms, desc=f"train: {exp}"):
            A = torch.stack([games["random"][s][m] for s in seeds]).to(device)
            u0, v0 = starts(len(seeds), A.shape[1], arm, cfg.start_scale, None, device)
            keep(exp, arm, m, seeds, ["uniform"] * len(seeds), run_arm(arm, A, eps_of(m), cap, u0, v0, rec),
                 cap, eps_of(m), A.shape[1])
            if exp == "fixed_eps":
                A = games["chain"][m].to(device)[None]
                u0, v0 = starts(1, A.shape[1], arm, cfg.start_scale, None, device)
                keep("fixed_eps_chain", arm, m, [-1], ["uniform"], run_arm(arm, A, eps_of(m), cap, u0, v0, rec),
                     cap, eps_of(m), A.shape[1])

    multi = []
    for N in tqdm(meta["multi_players"], desc="train: multi-player FP"):
        T = games["multi"][N]
        L = T.numel()
        hit, phis = multi_fp_hitting_time(T, cfg.multi_eps_scale / L, cfg.multi_cap)
        multi.append({"players": N, "m": meta["multi_m"], "profiles": L, "hit": hit, "cap": cfg.multi_cap,
                      "eps": cfg.multi_eps_scale / L, "final_phi": phis[-1]})

    # parity of the Triton path on a slice of the real inputs: the first two chain sizes, every arm,
    # uniform + first random start, truncated to parity_cap steps (the interpreter is slow)
    for arm in cfg.arms:
        m = meta["ms"][0]
        A = games["chain"][m].to(device)
        g = generator(device, cfg.seed)
        ur, vr = starts(1, A.shape[0], arm, cfg.start_scale, g, device)
        z = torch.zeros_like(ur)
        steps = cfg.parity_cap if arm.reg in ("entropic", "fp") else max(1, cfg.parity_cap // 4)
        B2 = A.expand(2, *A.shape).contiguous()
        eta = torch.full((2,), arm.eta, dtype=A.dtype, device=device)
        rec.parity("ftrl_run", ftrl_run, B2, torch.cat([z, ur]), torch.cat([z, vr]), eta,
                   torch.full((2,), cfg.eps_scale / m, dtype=A.dtype, device=device), steps, arm.reg, arm.schedule,
                   arm.alternating, 1, slice=f"chain m={m}, every arm, uniform + one random start, first "
                                          f"{cfg.parity_cap} steps ({max(1, cfg.parity_cap // 4)} for euclidean/log-barrier)")

    pl.DataFrame(rows).write_parquet(ctx.out / "runs.parquet")
    torch.save({"x": xs, "y": ys}, ctx.out / "iterates.pt")  # lists: the games differ in size
    torch.save({f"{k[0]}|{k[1]}": v for k, v in traces.items()}, ctx.out / "traces.pt")
    pl.DataFrame(multi).write_parquet(ctx.out / "multi.parquet")
    write_json(ctx.out / "meta.json", {"arms": [a.model_dump() for a in cfg.arms], "cap": cfg.cap,
                                       "eps_scale": cfg.eps_scale, "fixed_eps": cfg.fixed_eps,
                                       "start_seeds": cfg.start_seeds, "start_scale": cfg.start_scale,
                                       "staircase_arm": cfg.staircase_arm, "random_game_arm": cfg.random_game_arm,
                                       "fixed_eps_arm": cfg.fixed_eps_arm, "multi_cap": cfg.multi_cap,
                                       "device": str(device)})
    rec.save(ctx.out)
