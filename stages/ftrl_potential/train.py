"""train: run every learning dynamic on every game until an ε-NE (hitting time T_ε) or the cap.

Experiments (ε = eps_scale / m unless said otherwise; all two-player FTRL runs through
kernels.ftrl_dynamics.ftrl_run, batched over starts/seeds/ε):
  chain       every arm × m: the uniform start (cap `uniform_cap`, per-arm `cap` override) and
              `start_seeds` random starts (cap `cap`), separate batches
  fp_ties     fictitious play from U_0 = 0 with RANDOM tie-breaking (a random priority permutation per
              run and player, `tie_seeds`), through the kernel (cap `cap`) and exactly by events
              (exact_fp, any T) on chain_int for m in fp_exact_ms; plus the default lowest-index rule
  staircase   the staircase_arm from the uniform start (the card's pre-check game)
  random      random_game_arm on random identical-interest games (one per seed) — the baseline
  fixed_eps   fixed_eps_arm (lazy alternating) at a FIXED ε on chain and random games, m in fixed_eps_ms
  eps_sweep   fixed_eps_arm on the chain games, every m in eps_sweep_ms × every ε in eps_sweep
              (the upper bound's ε dependence, on the games where the lower bound makes it tight)
  multi       N-player fictitious play, exactly by events: the snake-in-the-box games from the path
              start (lowest-index ties) and with random tie-breaking; the Gray-code snake (shortcut)
Writes runs.parquet (one row per kernel run), iterates.pt, traces.pt, fp_exact.parquet, multi.parquet.
"""
from __future__ import annotations

import math

import numpy as np
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
from stages.ftrl_potential.dynamics import Arm, run_arm, starts
from stages.ftrl_potential.exact_fp import exact_fp, path_followed
from stages.ftrl_potential.games import chain_cells

# max_m: the largest chain size of an arm's uniform-start kernel run, set by cost (T_ε grows 10-20x per
# unit m: MWU needs > 400k steps at m = 6, FP 353,421 — fictitious play also runs exactly to m = 8)
DEFAULT_ARMS = [
    Arm(name="fp", reg="fp", max_m=5),
    Arm(name="mwu", reg="entropic", eta=1.0, max_m=5),
    Arm(name="mwu_eta0.1", reg="entropic", eta=0.1, max_m=5),
    Arm(name="mwu_sqrt", reg="entropic", eta=1.0, schedule="sqrt", max_m=5),
    Arm(name="euclidean", reg="euclidean", eta=0.1),
    Arm(name="euclidean_sqrt", reg="euclidean", eta=0.3, schedule="sqrt", max_m=5),
    Arm(name="logbarrier", reg="logbarrier", eta=1.0, cap=3000, max_m=4),
    Arm(name="alt_mwu", reg="entropic", eta=1.0, alternating=True, max_m=5),
]


class Config(StageConfig):
    seed: Seed = 0
    eps_scale: float = Field(0.1, gt=0, le=1.0, description="ε = eps_scale / m on the chain games")
    fixed_eps: float = Field(0.05, gt=0, le=1.0, description="the fixed ε of the upper-bound experiment")
    eps_sweep: list[float] = Field(default=[0.1, 0.07, 0.05, 0.035, 0.03, 0.025], min_length=3, max_length=16,
                                   description="ε values of the upper-bound sweep (decreasing)")
    eps_sweep_cap: int = Field(200_000, ge=10, le=10_000_000)
    cap: int = Field(20_000, ge=10, le=10_000_000, description="hitting-time cap of random starts and baselines")
    uniform_cap: int = Field(100_000, ge=10, le=10_000_000, description="cap of the uniform-start chain runs")
    arms: list[Arm] = Field(default=DEFAULT_ARMS, min_length=1)
    start_seeds: Seeds = Field(default=[0, 1, 2, 3, 4], description="random starts per (arm, m); >= 3 for claims")
    tie_seeds: Seeds = Field(default=[0, 1, 2, 3, 4], description="random tie-break orders of fictitious play")
    start_scale: float = Field(1.0, gt=0, le=100.0, description="random start: z_1 = scale · N(0, I)")
    staircase_arm: str = "mwu"
    random_game_arm: str = "mwu"
    fixed_eps_arm: str = "alt_mwu"
    multi_eps_fraction: float = Field(0.2, gt=0, lt=1, description="multi-player ε = fraction × the path increment")
    trace_points: int = Field(64, ge=1, le=4096)
    parity_cap: int = Field(12, ge=1, le=1000, description="steps of the interpreter parity slice (fast regs)")
    device: DeviceName = "auto"

    @field_validator("start_seeds", "tie_seeds")
    @classmethod
    def _seeds(cls, v, info):
        return unique_items(v, info.field_name)

    @field_validator("eps_sweep")
    @classmethod
    def _eps(cls, v):
        if any(e <= 0 or e > 1 for e in v) or any(b >= a for a, b in zip(v, v[1:])):
            raise ValueError("eps_sweep: values in (0, 1], strictly decreasing")
        return v

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
             "cap": cap, "eps": float(e)} for s, st, h, e in zip(seeds, start, out["hit"].tolist(), eps)]


def random_priorities(seed: int, m: int, n_players: int, sizes) -> list[list[int]]:
    """One random permutation of priorities per player (random tie-breaking, fixed per run)."""
    rng = np.random.default_rng([seed, m, 31])
    return [[int(x) for x in rng.permutation(sizes[p])] for p in range(n_players)]


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
        eps = eps if isinstance(eps, list) else [eps] * len(seeds)
        rows.extend(_rows(exp, arm, m, seeds, start, out, cap, eps, n))
        xs.extend(out["x"].cpu()), ys.extend(out["y"].cpu())

    for arm in tqdm(cfg.arms, desc="train: chain games, every arm"):
        ucap = arm.cap or cfg.uniform_cap
        rcap = min(arm.cap or cfg.cap, cfg.cap)
        every = max(1, ucap // cfg.trace_points)
        for m in meta["ms"]:
            # fictitious play compares cumulative utilities only: it runs on the integer game 2m·A (exact
            # ties, same trajectory), with ε and the random starts in the same units
            k = 2 * m if arm.reg == "fp" else 1
            A = (games["chain_int"][m].to(torch.float64) if k > 1 else games["chain"][m]).to(device)
            n = A.shape[0]
            eps = cfg.eps_scale / m
            if arm.max_m is not None and m > arm.max_m:                         # cost: see DEFAULT_ARMS
                continue
            u0, v0 = starts(1, n, arm, cfg.start_scale, None, device)              # uniform start
            out = run_arm(arm, A[None].contiguous(), eps * k, ucap, u0, v0, rec, every=every)
            keep("chain", arm, m, [-1], ["uniform"], out, ucap, eps, n)
            traces[(arm.name, m)] = {"phi": out["phi"][0].cpu() / k, "gap": out["gap"][0].cpu() / k, "every": every}
            ctx.tracker.log({f"hit/{arm.name}/m{m}": int(out["hit"][0])})
            ur, vr = [], []
            for s in cfg.start_seeds:                                           # one stream per (seed, m)
                g = generator(device, cfg.seed * 7919 + s * 104_729 + m)
                a, b = starts(1, n, arm, cfg.start_scale, g, device)
                ur.append(a), vr.append(b)
            S = len(cfg.start_seeds)
            out = run_arm(arm, A.expand(S, n, n).contiguous(), eps * k, rcap, k * torch.cat(ur), k * torch.cat(vr), rec)
            keep("chain", arm, m, cfg.start_seeds, ["random"] * S, out, rcap, eps, n)

    # fictitious play with random tie-breaking from U_0 = 0: the kernel (cap) on ms ...
    fp = Arm(name="fp_random_ties", reg="fp")
    fp_max = arms["fp"].max_m if "fp" in arms and arms["fp"].max_m else max(meta["ms"])
    for m in [m for m in meta["ms"] if m <= fp_max]:
        A = games["chain_int"][m].to(torch.float64).to(device)                  # exact ties (see above)
        n = A.shape[0]
        T = len(cfg.tie_seeds)
        pr = [random_priorities(s, m, 2, (n, n)) for s in cfg.tie_seeds]
        px = torch.tensor([p[0] for p in pr], dtype=A.dtype, device=device)
        py = torch.tensor([p[1] for p in pr], dtype=A.dtype, device=device)
        z = torch.zeros(T, n, dtype=A.dtype, device=device)
        rec.count("ftrl_run")
        out = ftrl_run(A.expand(T, n, n).contiguous(), z, z.clone(), torch.ones(T, dtype=A.dtype, device=device),
                       torch.full((T,), cfg.eps_scale / m * 2 * m, dtype=A.dtype, device=device), cfg.cap, "fp",
                       backend=rec.backend, prio_x=px, prio_y=py)
        keep("fp_ties", fp, m, cfg.tie_seeds, ["uniform"] * T, out, cfg.cap, cfg.eps_scale / m, n)
    # ... and exactly, by events, for every m in fp_exact_ms (lowest-index ties and the random orders)
    exact = []
    for m in tqdm(meta["fp_exact_ms"], desc="train: exact fictitious play (2 players)"):
        Ti = games["chain_int"][m].numpy()
        n = Ti.shape[0]
        eps = cfg.eps_scale / m * 2 * m                                            # ε in the integer units
        path = chain_cells(m)
        for tie, s in [("lowest", -1)] + [("random", s) for s in cfg.tie_seeds]:
            prio = None if tie == "lowest" else random_priorities(s, m, 2, (n, n))
            hit, stages = exact_fp(Ti, eps, prio)
            pf = path_followed(stages, path)
            exact.append({"m": m, "ties": tie, "seed": s, "hit": str(hit), "log10_hit": math.log10(hit) if hit > 0 else -1.0,
                          "stages": len(stages), "chain_cells_visited": pf["visited"], "chain_length": len(path),
                          "first_profile": str(stages[0][0]), "last_profile": str(stages[-1][0])})

    arm = arms[cfg.staircase_arm]
    for m in meta["ms"]:
        A = games["staircase"][m].to(device)[None]
        u0, v0 = starts(1, A.shape[1], arm, cfg.start_scale, None, device)
        keep("staircase", arm, m, [-1], ["uniform"], run_arm(arm, A, cfg.eps_scale / m, cfg.cap, u0, v0, rec),
             cfg.cap, cfg.eps_scale / m, A.shape[1])

    seeds = meta["random_game_seeds"]
    for exp, arm, ms, eps_of in (("random", arms[cfg.random_game_arm], meta["ms"], lambda m: cfg.eps_scale / m),
                                 ("fixed_eps", arms[cfg.fixed_eps_arm], meta["fixed_eps_ms"], lambda m: cfg.fixed_eps)):
        cap = min(arm.cap or cfg.cap, cfg.cap)
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

    arm = arms[cfg.fixed_eps_arm]                                          # the ε sweep: one batch per m
    E = len(cfg.eps_sweep)
    for m in tqdm(meta["eps_sweep_ms"], desc="train: eps sweep"):
        A = games["chain"][m].to(device)
        n = A.shape[0]
        z = torch.zeros(E, n, dtype=A.dtype, device=device)
        rec.count("ftrl_run")
        out = ftrl_run(A.expand(E, n, n).contiguous(), z, z.clone(), torch.full((E,), arm.eta, dtype=A.dtype, device=device),
                       torch.tensor(cfg.eps_sweep, dtype=A.dtype, device=device), cfg.eps_sweep_cap, arm.reg,
                       arm.schedule, arm.alternating, backend=rec.backend)
        keep("eps_sweep", arm, m, list(range(E)), ["uniform"] * E, out, cfg.eps_sweep_cap, list(cfg.eps_sweep), n)

    multi = []
    for kind in ("box", "gray"):
        for N in tqdm(meta["multi_players"], desc=f"train: N-player fictitious play ({kind})"):
            Ti, path = games[kind][N]["T"].numpy(), [tuple(p) for p in games[kind][N]["path"]]
            L = len(path)
            d = int(Ti[path[1]] - Ti[path[0]])                                 # path increment (integer units)
            eps = cfg.multi_eps_fraction * d
            ties = [("lowest", -1)] + ([("random", s) for s in cfg.tie_seeds] if kind == "box" else [])
            for tie, s in ties:
                prio = None if tie == "lowest" else random_priorities(s, N, N, (2,) * N)
                hit, stages = exact_fp(Ti, eps, prio)
                pf = path_followed(stages, path)
                multi.append({"construction": kind, "players": N, "path_length": L, "ties": tie, "seed": s,
                              "hit": str(hit), "log10_hit": math.log10(hit) if hit > 0 else -1.0,
                              "stages": len(stages), "follows_path": pf["follows"], "path_visited": pf["visited"],
                              "path_indices": str(pf["indices"][:64]), "eps": float(eps)})

    # parity of the Triton path on a slice of the real inputs: the first chain size, every arm,
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
    pl.DataFrame(exact).write_parquet(ctx.out / "fp_exact.parquet")
    pl.DataFrame(multi).write_parquet(ctx.out / "multi.parquet")
    write_json(ctx.out / "meta.json", {"arms": [a.model_dump() for a in cfg.arms], "cap": cfg.cap,
                                       "uniform_cap": cfg.uniform_cap,
                                       "eps_scale": cfg.eps_scale, "fixed_eps": cfg.fixed_eps,
                                       "eps_sweep": cfg.eps_sweep, "eps_sweep_cap": cfg.eps_sweep_cap,
                                       "start_seeds": cfg.start_seeds, "tie_seeds": cfg.tie_seeds,
                                       "start_scale": cfg.start_scale, "multi_eps_fraction": cfg.multi_eps_fraction,
                                       "staircase_arm": cfg.staircase_arm, "random_game_arm": cfg.random_game_arm,
                                       "fixed_eps_arm": cfg.fixed_eps_arm, "device": str(device)})
    rec.save(ctx.out)
