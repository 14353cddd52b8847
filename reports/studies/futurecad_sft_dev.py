"""Development sweep (validation only) of the SFT-only baseline: futurecad's SFT lr and decay length.

The GSPO lr was swept on validation (futurecad_rl_dev.py); so that the SFT-only arm is not a baseline below full
strength, its own knobs get the same treatment. On development seeds used by no reported run, on the validation
prompts only: for each (sft_lr, sft_decay_steps) in the grid, the shared SFT checkpoint (sft_steps steps, WSD) and
the SFT-only arm at the compute of the default RL budget (equal_compute_sft_steps more stable steps from the stable
state, then the decay), early-stopped on validation as in the pipeline.
The rule, fixed before the sweep ran: the (sft_lr, decay) whose SFT-only arm reaches the highest mean (over dev
seeds) best validation reward; ties keep the default. The chosen pair is used for both arms (RL starts from that
configuration's checkpoint).

    python reports/studies/futurecad_sft_dev.py --out reports/studies/futurecad_sft_dev
"""
from __future__ import annotations

import argparse
import itertools
import json
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path


def seed_job(args: tuple) -> list[dict]:
    import torch

    from kernels.record import KernelRecord
    from stages.common.config import load_stage_config
    from stages.common.trainer import TrainerConfig
    from stages.futurecad import train as T
    from stages.futurecad.infer import ProgramScorer
    from stages.futurecad.sandbox import CadSandbox

    seed, a = args
    torch.set_num_threads(1)
    cfg = load_stage_config("futurecad", "train", T.Config, "default")
    prep = Path(a["prep"])
    tmp = Path(a["out"]) / f"_scratch_s{seed}"
    tmp.mkdir(parents=True, exist_ok=True)
    p = T.run_inputs(cfg, prep, tmp, torch.device("cpu"))
    meta = json.loads((prep / "meta.json").read_text())
    tcfg = TrainerConfig.model_validate(p["trainer"])
    sandbox = CadSandbox(meta["n_points"], 1, timeout_s=cfg.script_timeout_s)
    rows = []
    try:
        sandbox.set_grounder(("model", str(Path(a["grounder"]).resolve())))
        scorer = ProgramScorer(sandbox, p["points"], p["diags"], KernelRecord(torch.device("cpu")), torch.device("cpu"))
        for lr, decay in itertools.product(a["lrs"], a["decays"]):
            t0 = time.process_time()
            pc = cfg.program.model_copy(update={"sft_lr": lr, "sft_decay_steps": decay})
            val_fn = T.program_val_fn(p, pc, scorer)
            lm, _, branch, _ = T.sft_checkpoint(seed, p, pc, tcfg, None)
            ck = val_fn(lm)
            _, cb = T.sft_only_arm(lm, branch, seed, p, pc, tcfg, val_fn)
            rows.append({"seed": seed, "sft_lr": lr, "decay": decay, "checkpoint_val": ck["val_reward"],
                         "checkpoint_exec": ck["val_exec"], "sft_only_best_val": cb.best,
                         "sft_only_best_step": cb.best_step - decay,
                         "sft_only_last_val": cb.rows[-1]["val_reward"]})
            print(f"seed {seed} lr {lr:g} decay {decay}: checkpoint {ck['val_reward']:.3f}, SFT-only best "
                  f"{cb.best:.3f} ({time.process_time() - t0:.0f} CPU-s)", flush=True)
    finally:
        sandbox.close()
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prep", default="data/futurecad/prepare")
    ap.add_argument("--grounder", default="data/futurecad/train/ground_s0.pt")
    ap.add_argument("--out", default="reports/studies/futurecad_sft_dev")
    ap.add_argument("--seeds", type=int, nargs="+", default=[10, 11])
    ap.add_argument("--lrs", type=float, nargs="+", default=[0.001, 0.003, 0.006])
    ap.add_argument("--decays", type=int, nargs="+", default=[20, 40, 80])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--append", action="store_true", help="add these grid points to the existing sweep.csv "
                    "(the grid extended where the optimum sat on its edge) and choose over all of them")
    a = vars(ap.parse_args())
    out = Path(a["out"])
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with ProcessPoolExecutor(a["workers"], mp_context=get_context("spawn")) as pool:
        rows = [r for res in pool.map(seed_job, [(s, a) for s in a["seeds"]]) for r in res]
    import polars as pl

    d = pl.DataFrame(rows)
    if a["append"] and (out / "sweep.csv").is_file():
        old = pl.read_csv(out / "sweep.csv")
        d = pl.concat([old, d.join(old.select("seed", "sft_lr", "decay"), on=["seed", "sft_lr", "decay"],
                                   how="anti")], how="vertical_relaxed")
        grid = json.loads((out / "choice.json").read_text())["args"]
        a["lrs"] = sorted(set(grid["lrs"]) | set(a["lrs"]))
        a["decays"] = sorted(set(grid["decays"]) | set(a["decays"]))
    d.write_csv(out / "sweep.csv")
    m = d.group_by(["sft_lr", "decay"]).agg(pl.col("checkpoint_val").mean(), pl.col("sft_only_best_val").mean(),
                                             pl.col("sft_only_last_val").mean()).sort(["sft_lr", "decay"])
    top = m["sft_only_best_val"].max()
    best = m.filter(pl.col("sft_only_best_val") == top)
    default = best.filter((pl.col("sft_lr") == 0.003) & (pl.col("decay") == 40))
    pick = (default if len(default) else best).row(0, named=True)
    table = "| sft_lr | decay | checkpoint val reward | SFT-only best val reward | SFT-only last val reward |\n"
    table += "| --- | --- | --- | --- | --- |\n" + "".join(
        f"| {r['sft_lr']:g} | {r['decay']} | {r['checkpoint_val']:.3f} | {r['sft_only_best_val']:.3f} | "
        f"{r['sft_only_last_val']:.3f} |\n" for r in m.iter_rows(named=True))
    (out / "choice.json").write_text(json.dumps({"args": a, "choice": pick, "wall_s": round(time.time() - t0, 1)},
                                                indent=1) + "\n")
    (out / "report.md").write_text(f"""# futurecad: development sweep of the SFT-only baseline (validation only)

Script: [`futurecad_sft_dev.py`](../futurecad_sft_dev.py) (its docstring has the rule). Development seeds
{a['seeds']}, the default profile's data and params otherwise (SFT-only arm at the compute of the default RL budget),
greedy decoding of the validation prompts (no test data read). Wall time {time.time() - t0:.0f} s on 2 cores (beside
another job). Means over the dev seeds; per-seed rows in `sweep.csv`.

{table}
Chosen: **sft_lr = {pick['sft_lr']:g}, sft_decay_steps = {pick['decay']}** (SFT-only best validation reward
{pick['sft_only_best_val']:.3f}).
""")
    print(table)
    print("choice", pick)
    for sd in out.glob("_scratch_s*"):
        for f in sd.iterdir():
            f.unlink()
        sd.rmdir()


if __name__ == "__main__":
    main()
