"""evaluate: re-check every hitting time with the exact ε-NE gap (kernels.ftrl_dynamics.ne_gap),
then the growth fits of T_ε against the game size.

For every run, the stored iterate (x_T, y_T) at its hitting time must have gap <= ε, and a run that
hit the cap must still have gap > ε at t = cap; `verify.*` counts violations (0 expected). Fits:
least-squares slope of log T_ε vs m per arm (uniform start), per random start seed, per random game
seed, at fixed ε; log log T vs N for multi-player fictitious play. Writes summary.json, runs.parquet
(with the re-checked gaps).
"""
from __future__ import annotations

import math

import numpy as np
import polars as pl
import torch

from kernels.ftrl_dynamics import ne_gap
from kernels.record import KernelRecord
from stages.common.config import StageConfig
from stages.common.device import DeviceName, pick_device
from stages.common.paths import read_json, write_json
from stages.common.runner import StageContext
from stages.ftrl_potential.fits import censored, increments, log_slope

FTRL_REGS = ("entropic", "euclidean", "logbarrier")


class Config(StageConfig):
    device: DeviceName = "auto"


def recheck_gaps(runs: pl.DataFrame, its: dict, games: dict, rec: KernelRecord, device) -> np.ndarray:
    """Exact gap of every stored iterate, batched per game size through the ne_gap kernel."""
    gaps = np.full(runs.height, np.nan)
    rows = runs.with_row_index("i")
    for (exp, n), part in rows.group_by("experiment", "n", maintain_order=True):
        idx = part["i"].to_list()
        As = []
        for r in part.iter_rows(named=True):
            if r["experiment"] in ("chain", "fixed_eps_chain"):
                As.append(games["chain"][r["m"]])
            elif r["experiment"] == "staircase":
                As.append(games["staircase"][r["m"]])
            else:
                As.append(games["random"][r["seed"]][r["m"]])
        A = torch.stack(As).to(device)
        x = torch.stack([its["x"][i] for i in idx]).to(device)
        y = torch.stack([its["y"][i] for i in idx]).to(device)
        gaps[idx] = rec.call("ne_gap", ne_gap, A, x, y).cpu().numpy()
    return gaps


def run(cfg: Config, ctx: StageContext) -> None:
    torch.set_num_threads(1)
    device = pick_device(cfg.device)
    rec = KernelRecord(device)
    prep, tr = ctx.input("prepare"), ctx.input("train")
    meta, tmeta = read_json(prep / "meta.json"), read_json(tr / "meta.json")
    games = torch.load(prep / "games.pt")
    runs = pl.read_parquet(tr / "runs.parquet")
    its = torch.load(tr / "iterates.pt")
    gaps = recheck_gaps(runs, its, games, rec, device)
    runs = runs.with_columns(pl.Series("gap_at_stop", gaps))
    first = runs.row(0, named=True)
    A0 = games["chain"][first["m"]].to(device)[None]
    rec.parity("ne_gap", ne_gap, A0.expand(4, *A0.shape[1:]).contiguous(), torch.stack(its["x"][:4]).to(device),
               torch.stack(its["y"][:4]).to(device), slice="the first 4 stored iterates (chain, smallest m)")
    hit_bad = runs.filter((pl.col("hit") > 0) & (pl.col("gap_at_stop") > pl.col("eps") * (1 + 1e-9))).height
    cap_bad = runs.filter((pl.col("hit") < 0) & (pl.col("gap_at_stop") <= pl.col("eps"))).height
    runs.write_parquet(ctx.out / "runs.parquet")

    arms = tmeta["arms"]
    ms = meta["ms"]
    S = tmeta["start_seeds"]

    def hits_of(frame: pl.DataFrame) -> tuple[list[float], list[bool], int]:
        frame = frame.sort("m")
        cap = int(frame["cap"][0])
        t, c = censored(frame["hit"].to_list(), cap)
        return t, c, cap

    uniform, random_start = {}, {}
    chain = runs.filter(pl.col("experiment") == "chain")
    for arm in arms:
        a = chain.filter(pl.col("arm") == arm["name"])
        t, c, cap = hits_of(a.filter(pl.col("start") == "uniform"))
        inc = increments([v for v, cc in zip(t, c) if not cc])  # growth between uncapped sizes only
        uniform[arm["name"]] = {"hits": t, "capped": c, "cap": cap, "slope": log_slope(ms, t),
                                "first_increment": inc[0] if len(inc) >= 2 else None,
                                "last_increment": inc[-1] if len(inc) >= 2 else None,
                                "reg": arm["reg"], "schedule": arm["schedule"], "alternating": arm["alternating"]}
        slopes = []
        for s in S:
            ts, _, _ = hits_of(a.filter((pl.col("start") == "random") & (pl.col("seed") == s)))
            slopes.append(log_slope(ms, ts))
        random_start[arm["name"]] = {"slope": slopes, "capped_runs": int((a.filter(pl.col("start") == "random")["hit"] < 0).sum())}
    ftrl_arms = [a["name"] for a in arms if a["reg"] in FTRL_REGS and not a["alternating"]]

    stair = runs.filter(pl.col("experiment") == "staircase").sort("m")
    rg = runs.filter(pl.col("experiment") == "random")
    fe = runs.filter(pl.col("experiment") == "fixed_eps")
    fec = runs.filter(pl.col("experiment") == "fixed_eps_chain")
    seeds = meta["random_game_seeds"]
    rg_slopes = [log_slope(ms, hits_of(rg.filter(pl.col("seed") == s))[0]) for s in seeds]
    fe_slopes = [log_slope(meta["fixed_eps_ms"], hits_of(fe.filter(pl.col("seed") == s))[0]) for s in seeds]
    fec_t, fec_c, _ = hits_of(fec)

    multi = pl.read_parquet(tr / "multi.parquet").sort("players")
    mt, mc = censored(multi["hit"].to_list(), int(multi["cap"][0]))
    Ns = multi["players"].to_list()
    loglog = [math.log(math.log(t)) if t > math.e else math.nan for t in mt]
    ok = [i for i, v in enumerate(loglog) if math.isfinite(v)]
    multi_inc = increments(mt)
    summary = {
        "eps_scale": tmeta["eps_scale"], "fixed_eps": tmeta["fixed_eps"], "ms": ms,
        "uniform": uniform, "random_start": random_start, "ftrl_arms": ftrl_arms,
        "uniform_min_ftrl_slope": min(uniform[a]["slope"] for a in ftrl_arms),
        "uniform_min_ftrl_convexity": min([uniform[a]["last_increment"] - uniform[a]["first_increment"]
                                           for a in ftrl_arms if uniform[a]["first_increment"] is not None] or [math.nan]),
        "convexity_arms": [a for a in ftrl_arms if uniform[a]["first_increment"] is not None],
        "staircase": {"hits": censored(stair["hit"].to_list(), int(stair["cap"][0]))[0],
                      "max_hit": max(censored(stair["hit"].to_list(), int(stair["cap"][0]))[0])},
        "random_games": {"slope": rg_slopes,
                         "hits": {str(s): hits_of(rg.filter(pl.col("seed") == s))[0] for s in seeds}},
        "fixed_eps": {"random_slope": fe_slopes, "chain_slope": log_slope(meta["fixed_eps_ms"], fec_t),
                      "chain_hits": fec_t, "chain_capped": fec_c, "ms": meta["fixed_eps_ms"],
                      "random_hits": {str(s): hits_of(fe.filter(pl.col("seed") == s))[0] for s in seeds},
                      "chain_max_hit": max(fec_t)},
        "multi": {"players": Ns, "hits": mt, "capped": mc, "cap": int(multi["cap"][0]),
                  "loglog_slope": float(np.polyfit([Ns[i] for i in ok], [loglog[i] for i in ok], 1)[0]) if len(ok) >= 2 else math.nan,
                  "log_slope": log_slope(Ns, mt),
                  "increment_growth": (multi_inc[-1] / multi_inc[0]) if multi_inc[0] > 0 else math.nan,
                  "increments": multi_inc},
        "verify": {"runs": runs.height, "hit_gap_violations": hit_bad, "cap_gap_violations": cap_bad,
                   "max_gap_at_hit_over_eps": float(runs.filter(pl.col("hit") > 0).select(
                       (pl.col("gap_at_stop") / pl.col("eps")).max()).item())},
    }
    traces = torch.load(tr / "traces.pt")
    mono = {}
    for key, tr_ in traces.items():
        phi = tr_["phi"][~torch.isnan(tr_["phi"])]
        d = phi.diff()
        mono[key] = float((d >= -1e-12).double().mean()) if d.numel() else math.nan
    summary["potential_monotone_fraction"] = mono
    write_json(ctx.out / "summary.json", summary)
    rec.save(ctx.out)
