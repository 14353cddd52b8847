"""Development sweep (validation only): futurecad's SFT schedule and GSPO learning rate / step count.

On development seeds used by no reported run, on the validation prompts only (no test data is read):
  1. the shared SFT checkpoint with a constant lr (the old schedule) and with warmup-stable-decay (the last
     ``--decay`` of ``sft_steps`` decaying linearly): validation reward along SFT and at the checkpoint;
  2. from the WSD checkpoint, GSPO at each ``--lrs`` for ``--rl-steps`` steps, validation every
     ``rl_steps // curve_points`` steps.
The rule that turns the curves into params, fixed before the sweep ran:
  - rl_lr: the lr whose mean (over dev seeds) validation curve has the highest mean over its points after
    step 0 (area under the curve: rewards an lr that gains early and holds, not one lucky peak);
  - rl_steps: the first curve step at which that lr's mean curve comes within ``--tol`` of its maximum.
Everything else is the default profile's params (the environment grounder is a trained grounder's checkpoint).

    python reports/studies/futurecad_rl_dev.py --prep data/futurecad/prepare \
        --grounder data/futurecad/train/ground_s0.pt --out reports/studies/futurecad_rl_dev
"""
from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np


def seed_job(args: tuple) -> dict:
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
    pc = cfg.program.model_copy(update={"rl_steps": a["rl_steps"], "curve_points": a["curve_points"],
                                        "sft_decay_steps": a["decay"],
                                        "sft_lr": a["sft_lr"] if a["sft_lr"] is not None else cfg.program.sft_lr})
    cfg = cfg.model_copy(update={"program": pc})
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
        rec = KernelRecord(torch.device("cpu"))
        scorer = ProgramScorer(sandbox, p["points"], p["diags"], rec, torch.device("cpu"))
        val_fn = T.program_val_fn(p, pc, scorer)
        for decay in (0, a["decay"]):
            t0 = time.process_time()
            lm, _, _, curve = T.sft_checkpoint(seed, p, pc.model_copy(update={"sft_decay_steps": decay}), tcfg,
                                               val_fn)
            end = val_fn(lm)
            rows += [{"seed": seed, "run": f"sft_decay{decay}", "lr": pc.sft_lr, "step": r["step"],
                      "val_reward": r["val_reward"], "val_exec": r["val_exec"]} for r in curve]
            rows.append({"seed": seed, "run": f"sft_decay{decay}", "lr": pc.sft_lr, "step": pc.sft_steps,
                         "val_reward": end["val_reward"], "val_exec": end["val_exec"]})
            print(f"seed {seed} SFT decay {decay}: val reward {end['val_reward']:.3f} "
                  f"({time.process_time() - t0:.0f} CPU-s)", flush=True)
        for lr in a["lrs"]:                             # lm: the WSD checkpoint (the last one trained)
            t0 = time.process_time()
            grpo, best = T.rl_arm(lm, seed, p, pc, tcfg, val_fn, scorer, rec, rl_lr=lr)
            for h in grpo.history:
                if "val_reward" in h:
                    rows.append({"seed": seed, "run": "gspo", "lr": lr, "step": h["step"],
                                 "val_reward": h["val_reward"], "val_exec": h["val_exec"]})
            print(f"seed {seed} GSPO lr {lr:g}: best val {best['val']:.3f} at step {best['step']} "
                  f"({time.process_time() - t0:.0f} CPU-s)", flush=True)
    finally:
        sandbox.close()
    return {"rows": rows}


def choose(rows: list[dict], tol: float) -> dict:
    import polars as pl

    g = pl.DataFrame(rows).filter(pl.col("run") == "gspo").group_by(["lr", "step"]).agg(
        pl.col("val_reward").mean()).sort(["lr", "step"])
    auc = g.filter(pl.col("step") > 0).group_by("lr").agg(pl.col("val_reward").mean().alias("auc")).sort("lr")
    lr = float(auc.sort(["auc", "lr"], descending=[True, False])["lr"][0])
    curve = g.filter(pl.col("lr") == lr).sort("step")
    top = float(curve["val_reward"].max())
    step = int(curve.filter(pl.col("val_reward") >= top - tol)["step"][0])
    return {"rl_lr": lr, "rl_steps": step, "auc": dict(zip(auc["lr"].to_list(), auc["auc"].to_list())),
            "curve_max": top, "tol": tol}


def write_report(out: Path) -> None:
    """report.md beside curves.csv and choice.json: the two SFT schedules and the GSPO curves, means over seeds."""
    import polars as pl

    d = pl.read_csv(out / "curves.csv")
    info = json.loads((out / "choice.json").read_text())
    a, pick = info["args"], info["choice"]
    seeds = sorted(d["seed"].unique().to_list())

    def table(frame, key):
        cols = sorted(frame[key].unique().to_list())
        steps = sorted(frame["step"].unique().to_list())
        head = "| step | " + " | ".join(f"{key} {c}" for c in cols) + " |\n|" + " --- |" * (len(cols) + 1) + "\n"
        body = ""
        for st in steps:
            cells = []
            for c in cols:
                v = frame.filter((pl.col("step") == st) & (pl.col(key) == c))
                cells.append(f"{v['val_reward'].mean():.3f} / {v['val_exec'].mean():.3f}" if len(v) else "—")
            body += f"| {st} | " + " | ".join(cells) + " |\n"
        return head + body

    sft = d.filter(pl.col("run") != "gspo")
    gspo = d.filter(pl.col("run") == "gspo")
    end = {r: sft.filter((pl.col("run") == r) & (pl.col("step") == sft["step"].max()))
           for r in sorted(sft["run"].unique().to_list())}
    per_seed = "; ".join(f"{r}: " + ", ".join(f"seed {row['seed']} {row['val_reward']:.3f}" for row in e.iter_rows(named=True))
                         for r, e in end.items())
    text = f"""# futurecad: development sweep of the SFT schedule and the GSPO learning rate (validation only)

Script: [`futurecad_rl_dev.py`](../futurecad_rl_dev.py) (its docstring has the rule). Development seeds {seeds}
(no reported run uses them), the default profile's data and params otherwise, {a['rl_steps']} GSPO steps with a
validation point every {a['rl_steps'] // a['curve_points']} steps, greedy decoding of the validation prompts (no test
data read). Environment grounder: a trained default grounder (seed 0). Wall time {info['wall_s']:.0f} s on 2 cores.

## SFT checkpoint (lr {a.get('sft_lr') or 'of params'}): constant lr vs warmup-stable-decay (last {a['decay']} steps decaying linearly)

Validation reward / executability along SFT, mean over the dev seeds (the two runs are the same until the decay
starts). At the checkpoint — {per_seed}.

{table(sft, 'run')}
## GSPO from the WSD checkpoint: validation reward / executability per learning rate (mean over dev seeds)

{table(gspo, 'lr')}
## Choice (the rule in the script, fixed before the sweep)

Mean validation reward after step 0 per lr: {", ".join(f"{float(k):g}: {v:.3f}" for k, v in pick['auc'].items())}.
Chosen **rl_lr = {pick['rl_lr']:g}**; its mean curve peaks at {pick['curve_max']:.3f} and first comes within
{pick['tol']} of that at step **{pick['rl_steps']}** → `rl_steps: {pick['rl_steps']}`. The decay length
(`sft_decay_steps: {a['decay']}`) and the SFT lr come from the SFT-only sweep
([`futurecad_sft_dev`](../futurecad_sft_dev/report.md)).
"""
    (out / "report.md").write_text(text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prep", default="data/futurecad/prepare")
    ap.add_argument("--grounder", default="data/futurecad/train/ground_s0.pt")
    ap.add_argument("--out", default="reports/studies/futurecad_rl_dev")
    ap.add_argument("--seeds", type=int, nargs="+", default=[10, 11])
    ap.add_argument("--lrs", type=float, nargs="+", default=[1e-4, 3e-4, 1e-3])
    ap.add_argument("--rl-steps", type=int, default=48)
    ap.add_argument("--curve-points", type=int, default=12)
    ap.add_argument("--decay", type=int, default=40)
    ap.add_argument("--sft-lr", type=float, default=None, help="SFT lr (default: params)")
    ap.add_argument("--tol", type=float, default=0.01)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--report-only", action="store_true", help="rewrite report.md from curves.csv and choice.json")
    ap.add_argument("--append", action="store_true", help="add these lrs to the existing curves.csv (the grid "
                    "extended where the choice sat on its edge) and choose over all of them")
    a = vars(ap.parse_args())
    out = Path(a["out"])
    if a.pop("report_only"):
        write_report(out)
        return
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with ProcessPoolExecutor(a["workers"], mp_context=get_context("spawn")) as pool:
        results = list(pool.map(seed_job, [(s, a) for s in a["seeds"]]))
    rows = [r for res in results for r in res["rows"]]
    import polars as pl

    d = pl.DataFrame(rows)
    if a["append"] and (out / "curves.csv").is_file():
        old = pl.read_csv(out / "curves.csv")
        d = pl.concat([old, d.join(old.select("seed", "run", "lr", "step"), on=["seed", "run", "lr", "step"],
                                   how="anti")], how="vertical_relaxed")
        a["lrs"] = sorted(set(json.loads((out / "choice.json").read_text())["args"]["lrs"]) | set(a["lrs"]))
    d.write_csv(out / "curves.csv")
    rows = d.to_dicts()
    pick = choose(rows, a["tol"])
    (out / "choice.json").write_text(json.dumps({"args": a, "choice": pick, "wall_s": round(time.time() - t0, 1)},
                                                indent=1) + "\n")
    print(json.dumps(pick, indent=1))
    write_report(out)
    for d in out.glob("_scratch_s*"):
        for f in d.iterdir():
            f.unlink()
        d.rmdir()


if __name__ == "__main__":
    main()
