"""Batched simulator of fair contextual bandits, and the fixed command-line interface.

    python -m stages.fair_bandits.simulate --scm SCM.json --horizon T --seeds S --out R.json
        [--methods dologb,ucb,primal_dual,tabular,oracle] [--device auto|cpu|cuda] [--rho 10]

runs every method for seeds 0..S-1 on the SCM (format: stages/fair_bandits/scm.py, at its τ) and
writes R.json: per method the final cumulative regret, violation (overall and per effect DE/IE/SE),
penalized regret, reward, and fitted log-log slopes (mean and per seed). `tabular` is skipped
(with the reason recorded) on SCMs whose counterfactual_feature is "one_minus_a". Bad input
(unreadable or invalid SCM, T or S out of range, --out a directory or equal to the input) prints
one line and exits 2 before any work; R.json is written atomically.

Engine: all instances (τ × seed) of one method advance together; each round is one
kernels.fair_round_step call. Random numbers (exploration arms, reward uniforms, tie-break mixers)
are pre-drawn per seed from torch generators on the compute device and shared across methods and
thresholds (common random numbers); contexts are drawn per (τ, seed) by numpy.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import torch

from kernels.fair_round_step import fair_round_step
from stages.fair_bandits.methods import METHODS, explores, make_method
from stages.fair_bandits.metrics import round_metrics, summarize
from stages.fair_bandits.scm import CELLS, EFFECTS, SCMError, World, load_scm

MAX_HORIZON = 1_000_000
MAX_SEEDS = 1000


def allowed_cells(world: World, tau: float) -> np.ndarray:
    """Contexts kept by the official rejection loop: those whose a has a truly fair arm. When no
    context has one (or resampling is off), all 8 are kept."""
    feas = world.feasible(torch.tensor([tau], dtype=torch.float64, device=world.device))[0].any(-1).cpu().numpy()
    keep = np.array([feas[ia] for ia, _, _ in CELLS])
    if not world.scm.resample_infeasible or not keep.any():
        return np.ones(8, dtype=bool)
    return keep


def draw_contexts(world: World, tau: float, seed: int, tau_index: int, T: int) -> np.ndarray:
    """(T,) context indices: shuffled blocks over the allowed cells ("balanced_blocks", the
    official generator) or i.i.d. from P(a)P(z|a)P(w|a,z) restricted to them ("scm")."""
    rng = np.random.default_rng([seed, tau_index, 7])
    cells = np.flatnonzero(allowed_cells(world, tau))
    if world.scm.context_sampling == "balanced_blocks":
        nblocks = -(-T // len(cells))
        blocks = rng.permuted(np.tile(cells, (nblocks, 1)), axis=1)
        return blocks.reshape(-1)[:T]
    p = world.p_context.cpu().numpy()[cells]
    if p.sum() <= 0:
        raise SCMError(f"{world.scm.name}: every context that has a fair arm has zero probability under the SCM")
    return rng.choice(cells, size=T, p=p / p.sum())


def predraw(seeds: list[int], T: int, K: int, device: torch.device):
    """Per seed: exploration arms (T0,), reward uniforms (T,), tie-break mixers (T, K)."""
    T0 = int(math.floor(math.sqrt(T)))
    ex, us, mix = [], [], []
    for s in seeds:
        g = torch.Generator(device=device)
        g.manual_seed(int(s))
        ex.append(torch.randint(0, K, (max(T0, 1),), generator=g, device=device))
        us.append(torch.rand(T, generator=g, device=device, dtype=torch.float64))
        mix.append(torch.rand(T, K, generator=g, device=device, dtype=torch.float64))
    return T0, torch.stack(ex), torch.stack(us), torch.stack(mix)


def run_method(name: str, world: World, taus: list[float], seeds: list[int], T: int, backend: str = "torch",
               rho: float = 10.0, rec=None, draws=None, contexts=None, beta_scale: float = 0.1,
               parity_round: int | None = None, seeds_per_tau: int | None = None) -> dict[str, torch.Tensor]:
    """Run one method on every (τ, seed) instance; instance i = τ index i // S, seed i % S.

    Returns ctx, act (B, T) int16, n_fallback (B,) rounds whose optimistic feasible set was empty."""
    dev = world.device
    S = len(seeds)
    tau_b = torch.tensor([t for t in taus for _ in seeds], dtype=torch.float64, device=dev)
    B = tau_b.shape[0]
    if contexts is None:
        contexts = np.stack([draw_contexts(world, t, s, i, T) for i, t in enumerate(taus) for s in seeds])
    ctx_all = torch.as_tensor(contexts, device=dev, dtype=torch.long)
    T0, ex, us, mix = draws if draws is not None else predraw(seeds, T, world.K, dev)
    if seeds_per_tau is None:  # draws are per seed: repeat them for every τ
        rep = lambda x: x.repeat(len(taus), *([1] * (x.dim() - 1)))  # noqa: E731  (B, ...) from (S, ...)
        ex, us, mix = rep(ex), rep(us), rep(mix)
    method = make_method(name, world, tau_b, T, rho, beta_scale)
    if isinstance(name, list):  # a batch of several logistic kinds: name = one kind per instance
        name = "+".join(dict.fromkeys(name))
    a_of_c = torch.tensor([ia for ia, _, _ in CELLS], device=dev)
    counts = torch.zeros(B, 8, world.K, dtype=torch.int64, device=dev)
    succ = torch.zeros(B, 8, world.K, dtype=torch.float64, device=dev)
    lam = torch.zeros(B, 3, dtype=torch.float64, device=dev)
    acts = torch.empty(B, T, dtype=torch.int16, device=dev)
    fallback = torch.zeros(B, dtype=torch.int64, device=dev)
    no_explore = torch.full((B,), -1, dtype=torch.long, device=dev)
    for t in range(1, T + 1):
        c = ctx_all[:, t - 1]
        ia = a_of_c[c]
        score, eff, xi = method.scores(t, c, ia)
        explore = ex[:, t - 1] if (explores(name) and t <= T0) else no_explore
        args = (score, eff, xi, tau_b, explore, mix[:, t - 1], us[:, t - 1], world.mu[c], c,
                counts, succ, lam, method.eta, method.lam_max)
        if rec is not None and parity_round == t:
            rec.parity("fair_round_step", fair_round_step, *args,
                       slice=f"round {t} of method {name} on SCM {world.scm.name} (all {B} instances)")
        step = fair_round_step(*args, backend=backend)
        counts, succ, lam = step.counts, step.succ, step.lam
        method.update(c, step.action, step.reward, step)
        acts[:, t - 1] = step.action.to(torch.int16)
        fallback += (~step.any_feasible).long() * (explore < 0).long()
    if rec is not None:
        rec.count("fair_round_step", T)
    return {"ctx": ctx_all.to(torch.int16), "act": acts, "n_fallback": fallback, "lam": lam}


def run_methods(names: list[str], world: World, taus: list[float], seeds: list[int], T: int, backend: str = "torch",
                rho: float = 10.0, rec=None, draws=None, contexts=None, beta_scale: float = 0.1,
                parity_round: int | None = None, skipped: dict | None = None) -> dict[str, dict[str, torch.Tensor]]:
    """Run several methods; the logistic ones share one batch (instances method-major, then τ, then
    seed), the others run alone. Returns {method: log} with each log over (τ, seed) instances."""
    from stages.fair_bandits.methods import LOGISTIC

    S, n_tau = len(seeds), len(taus)
    if contexts is None:
        contexts = np.stack([draw_contexts(world, t, s, i, T) for i, t in enumerate(taus) for s in seeds])
    if draws is None:
        draws = predraw(seeds, T, world.K, world.device)
    out = {}
    group = [m for m in names if m in LOGISTIC]
    if group:
        G = len(group)
        T0, ex, us, mix = draws
        rep = lambda x: x.repeat(G * n_tau, *([1] * (x.dim() - 1)))  # noqa: E731
        kinds = [m for m in group for _ in range(n_tau * S)]
        log = run_method(kinds, world, [t for _ in group for t in taus], seeds, T, backend, rho, rec,
                         (T0, rep(ex), rep(us), rep(mix)), np.concatenate([contexts] * G), beta_scale,
                         parity_round, seeds_per_tau=S)
        n = n_tau * S
        for g, m in enumerate(group):
            out[m] = {k: v[g * n:(g + 1) * n] for k, v in log.items()}
        parity_round = None
    for m in names:
        if m in LOGISTIC:
            continue
        try:
            out[m] = run_method(m, world, taus, seeds, T, backend, rho, rec, draws, contexts, beta_scale, parity_round)
        except ValueError as err:
            if m != "tabular" or skipped is None:
                raise
            skipped[m] = str(err)
            continue
        parity_round = None
    return {m: out[m] for m in names if m in out}


def simulate(scm_path: Path, T: int, S: int, methods: list[str], device: torch.device, rho: float = 10.0) -> dict:
    scm = load_scm(scm_path)
    world = World(scm, device)
    seeds = list(range(S))
    taus = [scm.tau]
    t_min = max(2 * int(math.sqrt(T)), T // 20, 1)
    draws = predraw(seeds, T, world.K, device)
    contexts = np.stack([draw_contexts(world, scm.tau, s, 0, T) for s in seeds])
    tau_b = torch.full((S,), scm.tau, dtype=torch.float64, device=device)
    result = {"scm": scm.name, "horizon": T, "seeds": seeds, "tau": scm.tau, "slope_window": [t_min, T],
              "effects": list(EFFECTS), "methods": {}, "skipped": {}}
    logs = run_methods(methods, world, taus, seeds, T, "torch" if device.type == "cpu" else "auto", rho,
                       draws=draws, contexts=contexts, skipped=result["skipped"])
    for name, log in logs.items():
        summ = summarize(round_metrics(world, tau_b, log["ctx"], log["act"]), T, t_min)
        entry = {"final": {k: v for k, v in summ["final"].items()}, "slopes": summ["slopes"],
                 "mean_final": {k: float(np.mean(v)) for k, v in summ["final"].items()},
                 "mean_slope": {k: float(np.nanmean(v)) if not all(map(math.isnan, v)) else None
                                for k, v in summ["slopes"].items()},
                 "empty_feasible_set_rounds": log["n_fallback"].tolist()}
        result["methods"][name] = entry
    return result


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
    args = ap.parse_args(argv)
    if not 2 <= args.horizon <= MAX_HORIZON:
        return _fail(f"--horizon: must be in [2, {MAX_HORIZON}] (got {args.horizon})")
    if not 1 <= args.seeds <= MAX_SEEDS:
        return _fail(f"--seeds: must be in [1, {MAX_SEEDS}] (got {args.seeds})")
    if not (math.isfinite(args.rho) and args.rho > 0):
        return _fail(f"--rho: must be a positive finite number (got {args.rho})")
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
    from stages.common.paths import write_json

    write_json(args.out, result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
