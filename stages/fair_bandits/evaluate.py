"""evaluate: official metrics per (world, method, horizon, seed), curves, growth exponents, binding
statistics of the feasibility test, the reproduction check against the official computation, and
the per-round time comparison.

- Metrics (official simulation.py): cumulative regret against each round's best truly fair arm, its
  positive part R⁺ (defined exponent when the signed regret is negative), violation max|effect| − τ
  (and per effect), penalized regret, reward; the uniform-random policy's expected reward.
- Exponents: (sweep) per seed, least squares of log final value on log T over the world's horizon
  sweep; (late) per seed, of log cumulative value on log t over the longest run's checkpoints in
  [late_fraction·T, T]. Undefined fits are null with a reason.
- Binding: per constrained instance at the longest horizon, the first round the optimistic test
  excluded an arm, the rounds it did, truly fair arms it excluded (0 expected: on the confidence event
  only unfair arms can go), the rounds where the sufficient certificate 2ξ_k ≤ margin_k held for every
  unfair arm, and the share of post-exploration rounds where DO-LogB's arm differs from UCB's.
- Reproduction: official_ref.run_official (a transcription of the official loop) on the recorded
  draws of one seed of each official world, against the project's DO-LogB actions and curves.
- Timing (CPU time of this single-threaded process, runtime only, never read by a claim): OMD update vs a recompute-from-history
  MLE at several t; per-round time of the project's full round (one instance; a batch of S seeds)
  and of the transcribed official loop.
Writes results.json, curves.parquet, timing.json (no NaN/Infinity in any JSON).
"""
from __future__ import annotations

import math
import time

import numpy as np
import polars as pl
import torch
from pydantic import Field, field_validator

from stages.common.config import StageConfig
from stages.common.paths import read_json, write_json
from stages.common.runner import StageContext
from stages.fair_bandits.methods import OMDEstimator
from stages.fair_bandits.metrics import checkpoints, finite_json, fit_exponent, round_metrics, summarize
from stages.fair_bandits.official_ref import run_official
from stages.fair_bandits.scm import CELLS, World, load_scm
from stages.fair_bandits.simulate import Instance, draw_contexts, predraw, run_group

KEYS = ("regret", "regret_plus", "violation", "penalized_regret")


class Config(StageConfig):
    seed: int = Field(0, ge=0)
    late_fraction: float = Field(0.25, gt=0, lt=1, description="late-window exponent over [f·T, T]")
    repro_rounds: dict[str, int] = Field(default={"official_quirk": 6000, "official": 1500},
                                         description="world -> rounds of the official-code reproduction check "
                                                     "(the official worlds only: official_ref hard-codes them)")
    timing_ts: list[int] = Field(default=[100, 1000, 10000], min_length=2, max_length=8)
    timing_reps: int = Field(20, ge=1, le=1000)
    timing_repeats: int = Field(3, ge=1, le=20, description="round-time measurements per variant (the smallest is kept)")
    timing_rounds: int = Field(400, ge=10, le=5000, description="rounds timed per round-time measurement (a run "
                                "of this length at horizon 4× it, minus one of half the length)")
    mle_newton_steps: int = Field(3, ge=1, le=50, description="Newton steps of the history MLE per round")

    @field_validator("repro_rounds")
    @classmethod
    def _repro(cls, v):
        for k, r in v.items():
            if k not in ("official", "official_quirk"):
                raise ValueError(f"{k!r}: only the official worlds (official, official_quirk) can be reproduced")
            if not 10 <= r <= 200_000:
                raise ValueError(f"{k}: rounds must be in [10, 200000] (got {r})")
        return v


def history_mle_step(theta: torch.Tensor, X: torch.Tensor, y: torch.Tensor, steps: int, lam: float) -> torch.Tensor:
    """Recompute-from-history estimator: `steps` Newton steps of the ridge-logistic MLE on all t rows."""
    for _ in range(steps):
        s = torch.sigmoid(X @ theta)
        grad = X.T @ (s - y) + lam * theta
        hess = (X * (s * (1 - s))[:, None]).T @ X + lam * torch.eye(X.shape[1], dtype=X.dtype)
        theta = theta - torch.linalg.solve(hess, grad)
    return theta


def estimator_timing(cfg: Config, p: int) -> list[dict]:
    g = torch.Generator().manual_seed(cfg.seed)
    rows = []
    for t in cfg.timing_ts:
        X = torch.randn(t, p, generator=g, dtype=torch.float64)
        X = X / X.norm(dim=1, keepdim=True)
        y = (torch.rand(t, generator=g, dtype=torch.float64) < 0.5).to(torch.float64)
        est = OMDEstimator(1, p, 1.0, 0.01, "cpu")
        t0 = time.process_time()
        for r in range(cfg.timing_reps):
            est.update(X[r % t][None], y[r % t][None])
        rows.append({"t": t, "estimator": "one-pass OMD update", "us": 1e6 * (time.process_time() - t0) / cfg.timing_reps})
        theta = torch.zeros(p, dtype=torch.float64)
        t0 = time.process_time()
        for _ in range(cfg.timing_reps):
            history_mle_step(theta, X, y, cfg.mle_newton_steps, 1.0)
        rows.append({"t": t, "estimator": f"history MLE ({cfg.mle_newton_steps} Newton steps)",
                     "us": 1e6 * (time.process_time() - t0) / cfg.timing_reps})
    return rows


def cell_triples(world: World, ctx: np.ndarray) -> list[tuple[int, int, int]]:
    a_vals = world.scm.protected_values
    return [(int(a_vals[CELLS[c][0]]), CELLS[c][1], CELLS[c][2]) for c in ctx]


def round_timing(cfg: Config, world: World, ctx_row: np.ndarray, seeds: list[int]) -> dict:
    """µs per round (after the exploration rounds, setup excluded: the time of a run of R rounds minus
    that of a run of R/2, over R/2): the project's full DO-LogB round for 1 instance and for a batch of
    len(seeds) instances (per instance), and the transcribed official loop (1 instance). CPU time of this
    process (single-threaded, so other jobs on a shared machine inflate it far less than wall-clock), the
    smallest of `timing_repeats` measurements."""
    R = cfg.timing_rounds
    name = world.scm.name
    out = {"rounds": R, "repeats": cfg.timing_repeats, "clock": "process CPU time, min over repeats"}

    def clock_once(fn) -> float:
        t0 = time.process_time()
        fn(R // 2)
        t1 = time.process_time()
        fn(R)
        return 1e6 * ((time.process_time() - t1) - (t1 - t0)) / (R - R // 2)

    def clock(fn) -> float:
        return min(clock_once(fn) for _ in range(cfg.timing_repeats))

    for label, ss in (("project, 1 instance", seeds[:1]), (f"project, batch of {len(seeds)} seeds", seeds)):
        ctxs = {(name, s): ctx_row for s in ss}
        out[label] = clock(lambda r: run_group({name: world}, [Instance(name, "dologb", 4 * R, s) for s in ss], ctxs,
                                               rounds=r)) / len(ss)
    T0, ex, us, mix = predraw(seeds[:1], 4 * R, world.K, "cpu")
    trip = cell_triples(world, ctx_row[:R])
    out["official loop (transcribed), 1 instance"] = clock(
        lambda r: run_official(trip, ex[0].numpy(), mix[0].numpy(), us[0].numpy(), 4 * R, world.tau,
                               world.scm.effect_cells, rounds=r))
    return out


def reproduction(cfg: Config, world: World, log: dict, contexts: torch.Tensor, seeds: list[int]) -> dict:
    """The transcribed official loop on the recorded draws of the first seed's longest DO-LogB run."""
    T = max(h for _, h, _ in log["instances"])
    b = log["instances"].index(("dologb", T, seeds[0]))
    R = min(cfg.repro_rounds[world.scm.name], T)
    ctx = contexts[0, :R].long().numpy()
    T0, ex, us, mix = predraw(seeds[:1], T, world.K, "cpu")
    off = run_official(cell_triples(world, ctx), ex[0].numpy(), mix[0].numpy(), us[0].numpy(), T, world.tau,
                       world.scm.effect_cells, rounds=R)
    act = log["act"][b, :R].long()
    m = round_metrics(world, torch.tensor([world.tau], dtype=torch.float64), torch.as_tensor(ctx)[None], act[None])
    res = {"rounds": R, "horizon": T, "seed": seeds[0],
           "same_actions": float((act.numpy() == off["action"]).mean()),
           "first_differing_round": int(np.flatnonzero(act.numpy() != off["action"])[0] + 1)
           if (act.numpy() != off["action"]).any() else None}
    for k in ("regret", "violation", "penalized_regret"):
        a, o = m[k][0].cumsum(0).numpy(), np.cumsum(off[k])
        res[f"max_abs_diff_cum_{k}"] = float(np.abs(a - o).max())
        res[f"official_final_{k}"] = float(o[-1])
        res[f"project_final_{k}"] = float(a[-1])
    return res


def binding_stats(log: dict, b: int, T: int, excl_uncon) -> dict:
    ex = log["excluded"][b, :T].numpy().astype(int)
    exf = log["excluded_fair"][b, :T].numpy().astype(int)
    sl = log["cert_slack"][b, :T].numpy()
    T0 = int(math.floor(math.sqrt(T)))
    first = int(np.flatnonzero(ex > 0)[0] + 1) if (ex > 0).any() else None
    cert = sl[T0:] >= 0
    unc = np.flatnonzero(~cert)
    return {"first_exclusion_round": first, "exclusion_rounds": int((ex > 0).sum()),
            "exclusion_share_after_first": float((ex[first - 1:] > 0).mean()) if first else 0.0,
            "fair_arm_exclusions": int(exf.sum()), "certified_rounds": int(cert.sum()),
            # first round from which the certificate held in every remaining round (None: not by T)
            "certified_from_round": (T0 + 1 if not len(unc) else None if unc[-1] == len(cert) - 1
                                     else T0 + int(unc[-1]) + 2),
            "differs_from_ucb_share": excl_uncon}


def run(cfg: Config, ctx: StageContext) -> None:
    torch.set_num_threads(1)
    prep, trained = ctx.input("prepare"), ctx.input("train")
    pmeta = read_json(prep / "meta.json")
    contexts = torch.load(prep / "contexts.pt")
    seeds = pmeta["seeds"]
    S = len(seeds)
    results, curve_rows, repro = {}, [], {}
    p = None
    for name, wm in pmeta["worlds"].items():
        world = World(load_scm(prep / f"{name}.scm.json"))
        p = world.p
        log = torch.load(trained / f"logs_{name}.pt")
        hz = wm["horizons"]
        T = hz[-1]
        ctxs = contexts[name].long()
        tau1 = torch.tensor([world.tau], dtype=torch.float64)
        res = {"tau": world.tau, "horizons": hz, "methods": {}, "sweep": {},
               "uniform_reward": {str(h): world.mu[ctxs[:, :h]].mean(-1).sum(1).tolist() for h in hz}}
        late = int(cfg.late_fraction * T)
        by = {}                                                       # (method, horizon) -> per-seed finals
        for b, (m, h, s) in enumerate(log["instances"]):
            j = seeds.index(s)
            pr = round_metrics(world, tau1, ctxs[j:j + 1, :h], log["act"][b:b + 1, :h])
            summ = summarize(pr, h, late if h == T else max(1, h // 4))
            by.setdefault((m, h), {})[s] = (summ, b)
        ucb_act = {s: log["act"][by[("ucb", T)][s][1], :T].long() for s in seeds} if ("ucb", T) in by else {}
        T0 = int(math.floor(math.sqrt(T)))
        for (m, h), per in by.items():
            if h != T:
                continue
            summs = [per[s][0] for s in seeds]
            entry = {"final": {k: [x["final"][k][0] for x in summs] for k in summs[0]["final"]},
                     "late_exponents": {k: [x["exponents"][k][0] for x in summs] for k in KEYS},
                     "late_exponent_reasons": {k: [x["exponent_reasons"][k][0] for x in summs] for k in KEYS}}
            if m in ("dologb", "dologb_scaled"):
                entry["binding"] = [binding_stats(
                    log, per[s][1], T,
                    float((log["act"][per[s][1], T0:T].long() != ucb_act[s][T0:]).double().mean()) if ucb_act else None)
                    for s in seeds]
            res["methods"][m] = entry
            for key, curves in summs[0]["curves"].items():
                if key not in KEYS + ("violated_rounds",):
                    continue
                arr = np.asarray([x["curves"][key][0] for x in summs])
                for jj, t in enumerate(summs[0]["checkpoints"]):
                    curve_rows.append({"world": name, "method": m, "metric": key, "t": int(t),
                                       "mean": float(arr[:, jj].mean()),
                                       "se": float(arr[:, jj].std(ddof=1) / math.sqrt(S)) if S > 1 else 0.0})
        for m in wm["sweep_methods"]:
            if len(hz) < 2:
                break
            entry = {"final": {k: [[by[(m, h)][s][0]["final"][k][0] for h in hz] for s in seeds] for k in KEYS},
                     "exponents": {}, "exponent_reasons": {}}
            for k in KEYS:
                fits = [fit_exponent(hz, entry["final"][k][j]) for j in range(S)]
                entry["exponents"][k] = [f[0] for f in fits]
                entry["exponent_reasons"][k] = [f[1] for f in fits]
            res["sweep"][m] = entry
        if "tabular" in log:
            tab = log["tabular"]
            th = tab["horizon"]
            pr = round_metrics(world, tau1.expand(S), ctxs[:, :th], tab["act"].long())
            summ = summarize(pr, th, int(cfg.late_fraction * th))
            res["tabular"] = {"horizon": th, "final": summ["final"], "late_exponents": summ["exponents"],
                              "exclusion_rounds": (tab["excluded"] > 0).sum(1).tolist()}
        res["beta_T"] = float(log["beta"][-1])
        results[name] = res
        if name in cfg.repro_rounds:
            repro[name] = reproduction(cfg, world, log, contexts[name], seeds)
    first = next(iter(pmeta["worlds"]))
    qname = "official_quirk" if "official_quirk" in pmeta["worlds"] else first
    qworld = World(load_scm(prep / f"{qname}.scm.json"))
    R = 4 * cfg.timing_rounds
    timing = {"estimator": estimator_timing(cfg, p), "newton_steps": cfg.mle_newton_steps, "reps": cfg.timing_reps,
              "round": round_timing(cfg, qworld, draw_contexts(qworld, seeds[0], R), seeds), "world": qname}
    write_json(ctx.out / "results.json", finite_json({"seeds": seeds, "late_fraction": cfg.late_fraction,
                                                      "worlds": results, "reproduction": repro}))
    pl.DataFrame(curve_rows).write_parquet(ctx.out / "curves.parquet")
    write_json(ctx.out / "timing.json", finite_json(timing))
