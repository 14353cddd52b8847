"""Batched simulator of fair contextual bandits, and the fixed command-line interface.

    python -m stages.fair_bandits.simulate --scm SCM.json --horizon T --seeds S --out R.json
        [--methods dologb,ucb,primal_dual,tabular,oracle] [--device auto|cpu|cuda] [--rho 10] [--threads 1]

runs every method for seeds 0..S-1 on the SCM (format: stages/fair_bandits/scm.py, at its τ) and
writes R.json: per method the final cumulative regret, violation (overall and per effect DE/IE/SE),
penalized regret, reward, and fitted log-log exponents (per seed; null with a reason where a curve
cannot be fitted, e.g. a regret that is not positive). `tabular` is skipped (with the reason
recorded) on SCMs whose counterfactual_feature is "one_minus_a". Bad input (unreadable or invalid
SCM, T or S out of range, --out a directory or equal to the input) prints one line and exits 2
before any work; R.json is written atomically and holds no NaN/Infinity token. The CLI runs on
one intra-op thread by default (`--threads`): the rounds are thousands of tiny tensor ops, which
extra threads only slow down.

Engine (`run_group`): every instance — (world variant, method, horizon, seed) — of a group of
worlds that share their learner tensors (same arms, θ*, probabilities; they may differ in τ,
fairness mode and effect cells) advances together; each round is one kernels.fair_round_step call
over the whole batch. Random numbers (exploration arms, reward uniforms, tie-break mixers) are
pre-drawn per seed for the longest horizon and shared by every method, world and horizon (common
random numbers); contexts are drawn per (world, seed) by numpy. An instance with horizon T_b explores
for ⌊√T_b⌋ rounds, uses δ = 1/√T_b, and its metrics are read on its first T_b rounds.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from kernels.fair_round_step import fair_round_step
from stages.fair_bandits.methods import LOGISTIC, METHODS, Logistic, Tabular, explores
from stages.fair_bandits.metrics import finite_json, round_metrics, summarize
from stages.fair_bandits.scm import CELLS, EFFECTS, SCMError, World, load_scm

MAX_HORIZON = 1_000_000
MAX_SEEDS = 1000


def allowed_cells(world: World, tau: float | None = None) -> np.ndarray:
    """Contexts kept by the official rejection loop: those whose a has a truly fair arm. When no
    context has one (or resampling is off), all 8 are kept."""
    tau = world.tau if tau is None else tau
    feas = world.feasible(torch.tensor([tau], dtype=torch.float64, device=world.device))[0].any(-1).cpu().numpy()
    keep = np.array([feas[ia] for ia, _, _ in CELLS])
    if not world.scm.resample_infeasible or not keep.any():
        return np.ones(8, dtype=bool)
    return keep


def draw_contexts(world: World, seed: int, T: int, stream: int = 0) -> np.ndarray:
    """(T,) context indices: shuffled blocks over the allowed cells ("balanced_blocks", the
    official generator) or i.i.d. from P(a)P(z|a)P(w|a,z) restricted to them ("scm"). The stream
    depends on the seed (and `stream`), not on the world, so worlds that keep the same cells see
    the same contexts (paired)."""
    rng = np.random.default_rng([seed, stream, 7])
    cells = np.flatnonzero(allowed_cells(world))
    if world.scm.context_sampling == "balanced_blocks":
        nblocks = -(-T // len(cells))
        blocks = rng.permuted(np.tile(cells, (nblocks, 1)), axis=1)
        return blocks.reshape(-1)[:T]
    p = world.p_context.cpu().numpy()[cells]
    if p.sum() <= 0:
        raise SCMError(f"{world.scm.name}: every context that has a fair arm has zero probability under the SCM")
    return rng.choice(cells, size=T, p=p / p.sum())


def predraw(seeds: list[int], T: int, K: int, device: torch.device):
    """Per seed: exploration arms (⌊√T⌋,), reward uniforms (T,), tie-break mixers (T, K), each from
    its own generator stream so that a shorter horizon's draws are a prefix of a longer one's."""
    T0 = int(math.floor(math.sqrt(T)))
    ex, us, mix = [], [], []

    def gen(s: int, stream: int) -> torch.Generator:
        g = torch.Generator(device=device)
        g.manual_seed(int(s) * 3 + stream)
        return g

    for s in seeds:
        ex.append(torch.randint(0, K, (max(T0, 1),), generator=gen(s, 0), device=device))
        us.append(torch.rand(T, generator=gen(s, 1), device=device, dtype=torch.float64))
        mix.append(torch.rand(T, K, generator=gen(s, 2), device=device, dtype=torch.float64))
    return T0, torch.stack(ex), torch.stack(us), torch.stack(mix)


@dataclass(frozen=True)
class Instance:
    world: str      # world variant (SCM name)
    method: str
    horizon: int
    seed: int


def learner_key(world: World) -> str:
    """What the learners see of a world (arms, θ*, S, probabilities, features): worlds with the same
    key can share one batch; they may differ only in τ, fairness mode, effect cells, rejection."""
    d = world.scm.model_dump()
    for k in ("name", "description", "tau", "tau_mode", "boundary_protected", "effect_cells", "resample_infeasible"):
        d.pop(k)
    return repr(sorted(d.items()))


def run_group(worlds: dict[str, World], instances: list[Instance], contexts: dict[tuple[str, int], np.ndarray],
              backend: str = "torch", rho: float = 10.0, beta_scale: float = 0.1, rec=None,
              parity_round: int | None = None, rounds: int | None = None) -> dict[str, torch.Tensor]:
    """Run logistic-kind instances (dologb, dologb_scaled, ucb, primal_dual, oracle) of worlds that
    share their learner tensors, all in one batch, for max horizon rounds (or the first `rounds`).

    contexts[(world, seed)]: (T_max,) context indices. Returns, over instances (in order):
    act (B, T_max) int16; excluded (B, T_max) int8 arms the optimistic test removed (0 during
    exploration and for unconstrained kinds); excluded_fair (B, T_max) int8: how many of them were truly
    fair (0 on the confidence event); cert_slack (B, T_max) float32: min over the round's
    truly unfair arms of max_j (|c_j| − τ − 2ξ_j) (≥ 0: on the confidence event every unfair arm is
    provably excluded; +inf when the context has no unfair arm); beta (T_max,) of instance 0."""
    names = list(dict.fromkeys(i.world for i in instances))
    base = worlds[names[0]]
    key = learner_key(base)
    for n in names[1:]:
        if learner_key(worlds[n]) != key:
            raise ValueError(f"run_group: world {n!r} differs from {names[0]!r} in what the learner sees")
    dev = base.device
    B = len(instances)
    T = max(i.horizon for i in instances)
    seeds = sorted({i.seed for i in instances})
    sidx = torch.tensor([seeds.index(i.seed) for i in instances], device=dev)
    T0max, ex, us, mix = predraw(seeds, T, base.K, dev)
    ex, us, mix = ex[sidx], us[sidx], mix[sidx]
    f64 = torch.float64
    taus = torch.tensor([worlds[i.world].tau for i in instances], dtype=f64, device=dev)
    horizons = torch.tensor([i.horizon for i in instances], dtype=f64, device=dev)
    T0 = torch.tensor([int(math.floor(math.sqrt(i.horizon))) if explores(i.method) else 0 for i in instances],
                      device=dev)
    cells = torch.stack([worlds[i.world].cell_mask for i in instances])
    comp = {n: worlds[n].comparator(torch.tensor([worlds[n].tau], dtype=f64, device=dev))[0][0] for n in names}
    oracle_arm = torch.stack([comp[i.world] for i in instances])                       # (B, 8)
    margin = torch.stack([worlds[i.world].effects.abs() - worlds[i.world].tau for i in instances])  # (B, 2, 3, K)
    unfair = torch.stack([~worlds[i.world].feasible(torch.tensor([worlds[i.world].tau], dtype=f64, device=dev))[0]
                          for i in instances])                                         # (B, 2, K)
    kinds = [i.method for i in instances]
    method = Logistic(kinds, base, taus, horizons, rho, beta_scale, cells, oracle_arm)
    for i in instances:
        if len(contexts[(i.world, i.seed)]) < i.horizon:
            raise ValueError(f"run_group: contexts of {i.world!r} seed {i.seed} are shorter than horizon {i.horizon}")
    # an instance shorter than the batch's longest horizon keeps running on its last context (never read)
    ctx_all = torch.as_tensor(np.stack([np.pad(contexts[(i.world, i.seed)][:T], (0, max(0, T - len(contexts[(i.world, i.seed)]))),
                                               mode="edge") for i in instances]), device=dev, dtype=torch.long)
    a_of_c = torch.tensor([ia for ia, _, _ in CELLS], device=dev)
    counts = torch.zeros(B, 8, base.K, dtype=torch.int64, device=dev)
    succ = torch.zeros(B, 8, base.K, dtype=f64, device=dev)
    lam = torch.zeros(B, 3, dtype=f64, device=dev)
    acts = torch.empty(B, T, dtype=torch.int16, device=dev)
    excluded = torch.zeros(B, T, dtype=torch.int8, device=dev)
    excluded_fair = torch.zeros(B, T, dtype=torch.int8, device=dev)
    slack = torch.empty(B, T, dtype=torch.float32, device=dev)
    betas = torch.empty(T, dtype=f64)
    rows = torch.arange(B, device=dev)
    none = torch.full((B,), -1, dtype=torch.long, device=dev)
    inf = torch.tensor(torch.inf, dtype=f64, device=dev)
    name = "+".join(dict.fromkeys(kinds))
    for t in range(1, (T if rounds is None else min(rounds, T)) + 1):
        c = ctx_all[:, t - 1]
        ia = a_of_c[c]
        score, eff, xi = method.scores(t, c, ia)
        explore = torch.where(T0 >= t, ex[:, min(t, T0max) - 1], none) if t <= T0max else none
        args = (score, eff, xi, taus, explore, mix[:, t - 1], us[:, t - 1], base.mu[c], c,
                counts, succ, lam, method.eta, method.lam_max)
        if rec is not None and parity_round == t:
            rec.parity("fair_round_step", fair_round_step, *args,
                       slice=f"round {t} of {name} on worlds {'+'.join(names)} (all {B} instances)")
        step = fair_round_step(*args, backend=backend)
        lam = step.lam
        method.update(c, step.action, step.reward, step)
        acts[:, t - 1] = step.action.to(torch.int16)
        feas = ((eff.abs() - xi) < taus[:, None, None]).all(1)                      # the kernel's test, (B, K)
        out_now = (~feas) & (explore < 0)[:, None]
        excluded[:, t - 1] = out_now.sum(1).to(torch.int8)
        uf = unfair[rows, ia]                                                          # (B, K) truly unfair
        excluded_fair[:, t - 1] = (out_now & ~uf).sum(1).to(torch.int8)
        m = margin[rows, ia]                                                           # (B, 3, K)
        cert = (m - 2 * xi).amax(1)                                                    # (B, K) ≥ 0: certified out
        slack[:, t - 1] = torch.where(uf, cert, inf).amin(1).to(torch.float32)
        betas[t - 1] = float(method.est.beta_all(t)[0])
    if rec is not None:
        rec.count("fair_round_step", T)
    return {"act": acts, "excluded": excluded, "excluded_fair": excluded_fair, "cert_slack": slack, "beta": betas}


def run_tabular(world: World, seeds: list[int], T: int, contexts: dict[tuple[str, int], np.ndarray],
                backend: str = "torch", rec=None, parity_round: int | None = None) -> dict[str, torch.Tensor]:
    """The tabular (non-parametric) variant on one world at its τ, seeds in one batch."""
    dev = world.device
    S = len(seeds)
    taus = torch.full((S,), world.tau, dtype=torch.float64, device=dev)
    T0, ex, us, mix = predraw(seeds, T, world.K, dev)
    method = Tabular(world, taus, T)
    ctx_all = torch.as_tensor(np.stack([contexts[(world.scm.name, s)][:T] for s in seeds]), device=dev,
                              dtype=torch.long)
    a_of_c = torch.tensor([ia for ia, _, _ in CELLS], device=dev)
    counts = torch.zeros(S, 8, world.K, dtype=torch.int64, device=dev)
    succ = torch.zeros(S, 8, world.K, dtype=torch.float64, device=dev)
    lam = torch.zeros(S, 3, dtype=torch.float64, device=dev)
    acts = torch.empty(S, T, dtype=torch.int16, device=dev)
    excluded = torch.zeros(S, T, dtype=torch.int8, device=dev)
    none = torch.full((S,), -1, dtype=torch.long, device=dev)
    for t in range(1, T + 1):
        c = ctx_all[:, t - 1]
        score, eff, xi = method.scores(t, c, a_of_c[c])
        explore = ex[:, t - 1] if t <= T0 else none
        args = (score, eff, xi, taus, explore, mix[:, t - 1], us[:, t - 1], world.mu[c], c, counts, succ, lam,
                method.eta, method.lam_max)
        if rec is not None and parity_round == t:
            rec.parity("fair_round_step", fair_round_step, *args,
                       slice=f"round {t} of tabular on world {world.scm.name} (all {S} instances)")
        step = fair_round_step(*args, backend=backend)
        counts, succ = step.counts, step.succ
        method.update(c, step.action, step.reward, step)
        acts[:, t - 1] = step.action.to(torch.int16)
        feas = ((eff.abs() - xi) < taus[:, None, None]).all(1)
        excluded[:, t - 1] = torch.where(explore < 0, (~feas).sum(1), 0).to(torch.int8)
    if rec is not None:
        rec.count("fair_round_step", T)
    return {"act": acts, "excluded": excluded}


def simulate(scm_path: Path, T: int, S: int, methods: list[str], device: torch.device, rho: float = 10.0) -> dict:
    scm = load_scm(scm_path)
    world = World(scm, device)
    seeds = list(range(S))
    contexts = {(scm.name, s): draw_contexts(world, s, T) for s in seeds}
    t_min = max(2 * int(math.sqrt(T)), T // 20, 1)
    result = {"scm": scm.name, "horizon": T, "seeds": seeds, "tau": world.tau, "tau_mode": scm.tau_mode,
              "effect_cells": scm.effect_cells, "exponent_window": [t_min, T], "effects": list(EFFECTS),
              "methods": {}, "skipped": {}}
    backend = "torch" if device.type == "cpu" else "auto"
    logs = {}
    group = [m for m in methods if m in LOGISTIC]
    if group:
        inst = [Instance(scm.name, m, T, s) for m in group for s in seeds]
        out = run_group({scm.name: world}, inst, contexts, backend, rho)
        for g, m in enumerate(group):
            logs[m] = out["act"][g * S:(g + 1) * S]
    if "tabular" in methods:
        try:
            logs["tabular"] = run_tabular(world, seeds, T, contexts, backend)["act"]
        except ValueError as err:
            result["skipped"]["tabular"] = str(err)
    ctx = torch.as_tensor(np.stack([contexts[(scm.name, s)] for s in seeds]), device=device)
    tau_b = torch.full((S,), world.tau, dtype=torch.float64, device=device)
    for m in methods:
        if m not in logs:
            continue
        summ = summarize(round_metrics(world, tau_b, ctx, logs[m]), T, t_min)
        result["methods"][m] = {"final": summ["final"], "exponents": summ["exponents"],
                                "exponent_reasons": summ["exponent_reasons"],
                                "mean_final": {k: float(np.mean(v)) for k, v in summ["final"].items()}}
    return finite_json(result)


def _fail(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stages.fair_bandits.simulate", description=__doc__.splitlines()[0])
    ap.add_argument("--scm", required=True, type=Path)
    ap.add_argument("--horizon", required=True, type=int)
    ap.add_argument("--seeds", required=True, type=int)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--rho", type=float, default=10.0, help="primal_dual dual cap ρ (step ρ/√T)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1: tiny ops)")
    args = ap.parse_args(argv)
    if not 2 <= args.horizon <= MAX_HORIZON:
        return _fail(f"--horizon: must be in [2, {MAX_HORIZON}] (got {args.horizon})")
    if not 1 <= args.seeds <= MAX_SEEDS:
        return _fail(f"--seeds: must be in [1, {MAX_SEEDS}] (got {args.seeds})")
    if not 1 <= args.threads <= 256:
        return _fail(f"--threads: must be in [1, 256] (got {args.threads})")
    if not (math.isfinite(args.rho) and 0 < args.rho <= 1e4):
        return _fail(f"--rho: must be a finite number in (0, 1e4] (got {args.rho})")
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods or len(set(methods)) != len(methods):
        return _fail(f"--methods: expected distinct names from {', '.join(METHODS)} (got {args.methods!r})")
    if args.out.is_dir():
        return _fail(f"--out: {args.out} is a directory; give a file path")
    if args.out.exists() and args.scm.exists() and args.out.resolve() == args.scm.resolve():
        return _fail(f"--out: {args.out} is the input SCM file; refusing to overwrite it")
    if not args.out.parent.exists():
        return _fail(f"--out: folder {args.out.parent} does not exist")
    torch.set_num_threads(args.threads)
    try:
        load_scm(args.scm)
        from stages.common.device import DeviceError, pick_device

        try:
            device = pick_device(args.device)
        except DeviceError as err:
            return _fail(str(err))
        result = simulate(args.scm, args.horizon, args.seeds, methods, device, args.rho)
    except SCMError as err:
        return _fail(str(err))
    from stages.common.paths import atomic_write_text

    atomic_write_text(args.out, json.dumps(result, indent=2, sort_keys=True, allow_nan=False) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
