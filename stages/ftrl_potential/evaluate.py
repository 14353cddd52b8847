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
            if r["experiment"] in ("chain", "fixed_eps_chain", "fp_ties", "eps_sweep"):
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


def multi_summary(multi: pl.DataFrame) -> dict:
    """Exact N-player fictitious play: the snake-in-the-box (box) and the Gray-code snake (gray)."""
    out = {}
    for kind in ("box", "gray"):
        part = multi.filter((pl.col("construction") == kind) & (pl.col("ties") == "lowest")).sort("players")
        Ns = part["players"].to_list()
        lnT = [math.log(int(h)) if int(h) > 0 else math.nan for h in part["hit"].to_list()]
        e = {"players": Ns, "path_length": part["path_length"].to_list(), "hit": part["hit"].to_list(),
             "log10_hit": part["log10_hit"].to_list(), "follows_path": [bool(v) for v in part["follows_path"]],
             "path_visited": part["path_visited"].to_list(), "ln_hit": lnT}
        e["all_follow"] = int(all(e["follows_path"]))
        e["min_visited_fraction"] = min(v / L for v, L in zip(e["path_visited"], e["path_length"]))
        ok = [i for i, v in enumerate(lnT) if math.isfinite(v) and v > 1]
        if len(ok) >= 2:
            e["loglog_slope"] = float(np.polyfit([Ns[i] for i in ok], [math.log(lnT[i]) for i in ok], 1)[0])
            e["log_slope"] = float(np.polyfit([Ns[i] for i in ok], [lnT[i] for i in ok], 1)[0])
            ratios = [lnT[ok[j + 1]] / lnT[ok[j]] for j in range(len(ok) - 1)]
            e["ln_hit_ratios"] = ratios
            e["min_ln_hit_ratio"] = min(ratios)
        else:
            e["loglog_slope"] = e["log_slope"] = e["min_ln_hit_ratio"] = 0.0
            e["ln_hit_ratios"] = []
        rnd = multi.filter((pl.col("construction") == kind) & (pl.col("ties") == "random"))
        e["random_ties"] = {str(N): {"log10_hit": rnd.filter(pl.col("players") == N)["log10_hit"].to_list(),
                                     "follows_path": [bool(v) for v in rnd.filter(pl.col("players") == N)["follows_path"]],
                                     "path_visited": rnd.filter(pl.col("players") == N)["path_visited"].to_list()}
                            for N in Ns} if rnd.height else {}
        out[kind] = e
    return out


def fp_summary(runs: pl.DataFrame, exact: pl.DataFrame, meta: dict, tmeta: dict) -> dict:
    """Fictitious play on the chain: exact hitting times (lowest-index and random tie-breaks), per-seed
    growth slopes, and the kernel's FP hits against the exact ones (identical where both exist)."""
    ms = meta["fp_exact_ms"]
    lowest = exact.filter(pl.col("ties") == "lowest").sort("m")
    out = {"ms": ms, "lowest": {"hit": lowest["hit"].to_list(), "log10_hit": lowest["log10_hit"].to_list(),
                                "chain_cells_visited": lowest["chain_cells_visited"].to_list()}}
    ln = [math.log(int(h)) for h in lowest["hit"].to_list()]
    out["lowest"]["slope"] = float(np.polyfit(ms, ln, 1)[0])
    rs, hits = [], {}
    for s in tmeta["tie_seeds"]:
        part = exact.filter((pl.col("ties") == "random") & (pl.col("seed") == s)).sort("m")
        h = [int(v) for v in part["hit"].to_list()]
        hits[str(s)] = [str(v) for v in h]
        rs.append(float(np.polyfit(ms, [math.log(max(v, 1)) for v in h], 1)[0]))
        out.setdefault("visited", {})[str(s)] = part["chain_cells_visited"].to_list()
    out["random_ties"] = {"hits": hits, "slope": rs}
    # the kernel against the exact event-driven play, wherever the kernel finished before its cap
    k = runs.filter(pl.col("experiment") == "fp_ties")
    mism, compared = 0, 0
    for r in k.iter_rows(named=True):
        e = exact.filter((pl.col("ties") == "random") & (pl.col("seed") == r["seed"]) & (pl.col("m") == r["m"]))
        if r["hit"] > 0 and e.height:
            compared += 1
            mism += int(int(e["hit"][0]) != r["hit"])
    u = runs.filter((pl.col("experiment") == "chain") & (pl.col("arm") == "fp") & (pl.col("start") == "uniform"))
    for r in u.iter_rows(named=True):
        e = exact.filter((pl.col("ties") == "lowest") & (pl.col("m") == r["m"]))
        if r["hit"] > 0 and e.height:
            compared += 1
            mism += int(int(e["hit"][0]) != r["hit"])
    out["kernel_vs_exact"] = {"compared": compared, "mismatches": mism}
    return out


def eps_sweep_summary(runs: pl.DataFrame, meta: dict, tmeta: dict) -> dict:
    """T_ε of lazy alternating MWU on the chain games for every (m, ε); per ε the hardest size and
    T_max(ε) = max_m T_ε(m) (capped runs count at the cap: a lower bound), whether the hardest size is
    inside the range (T_ε falls again at larger m: saturation), and the growth of log T_max in 1/ε."""
    sw = runs.filter(pl.col("experiment") == "eps_sweep")
    eps = tmeta["eps_sweep"]
    ms = meta["eps_sweep_ms"]
    grid = {}
    for m in ms:
        part = sw.filter(pl.col("m") == m).sort("seed")
        grid[str(m)] = [int(h) if h > 0 else -1 for h in part["hit"].to_list()]
    cap = tmeta["eps_sweep_cap"]
    tmax, arg, sat, capped = [], [], [], []
    for j, e in enumerate(eps):
        col = [cap if grid[str(m)][j] < 0 else grid[str(m)][j] for m in ms]
        i = int(np.argmax(col))
        tmax.append(float(col[i]))
        arg.append(ms[i])
        capped.append(any(grid[str(m)][j] < 0 for m in ms))
        sat.append(bool(i < len(ms) - 1 and col[-1] < col[i]))
    inv = [1.0 / e for e in eps]
    ok = [j for j, t in enumerate(tmax) if t > math.e]
    k = float(np.polyfit([math.log(inv[j]) for j in ok], [math.log(math.log(tmax[j])) for j in ok], 1)[0]) if len(ok) >= 2 else 0.0
    lin = float(np.polyfit([inv[j] for j in ok], [math.log(tmax[j]) for j in ok], 1)[0]) if len(ok) >= 2 else 0.0
    return {"eps": eps, "ms": ms, "grid": grid, "cap": cap, "T_max": tmax, "hardest_m": arg, "saturated": sat,
            "capped": capped, "saturated_fraction": float(np.mean(sat)), "any_capped": int(any(capped)),
            "loglog_exponent": k, "log_T_per_inverse_eps": lin}


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
    same = [i for i, m in enumerate(runs["m"].to_list()) if m == first["m"]][:4]   # iterates of the first run's m
    rec.parity("ne_gap", ne_gap, A0.expand(len(same), *A0.shape[1:]).contiguous(),
               torch.stack([its["x"][i] for i in same]).to(device), torch.stack([its["y"][i] for i in same]).to(device),
               slice=f"the first {len(same)} stored iterates (chain, smallest m)")
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
        u = a.filter(pl.col("start") == "uniform").sort("m")
        t, c, cap = hits_of(u)
        um = u["m"].to_list()
        inc = increments([v for v, cc in zip(t, c) if not cc])  # growth between uncapped sizes only
        uniform[arm["name"]] = {"ms": um, "hits": t, "capped": c, "cap": cap, "slope": log_slope(um, t),
                                "first_increment": inc[0] if len(inc) >= 2 else None,
                                "last_increment": inc[-1] if len(inc) >= 2 else None,
                                "reg": arm["reg"], "schedule": arm["schedule"], "alternating": arm["alternating"]}
        slopes = []
        for s in S:
            part = a.filter((pl.col("start") == "random") & (pl.col("seed") == s)).sort("m")
            ts, _, _ = hits_of(part)
            slopes.append(log_slope(part["m"].to_list(), ts))
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

    summary_multi = multi_summary(pl.read_parquet(tr / "multi.parquet"))
    summary_fp = fp_summary(runs, pl.read_parquet(tr / "fp_exact.parquet"), meta, tmeta)
    summary_sweep = eps_sweep_summary(runs, meta, tmeta)
    summary = {
        "eps_scale": tmeta["eps_scale"], "fixed_eps": tmeta["fixed_eps"], "ms": ms,
        "uniform": uniform, "random_start": random_start, "ftrl_arms": ftrl_arms,
        "uniform_min_ftrl_slope": min(uniform[a]["slope"] for a in ftrl_arms),
        "uniform_max_m": {a: max(uniform[a]["ms"]) for a in uniform},
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
        "multi": summary_multi, "fp": summary_fp, "eps_sweep": summary_sweep,
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
