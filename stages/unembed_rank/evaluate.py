"""evaluate: every trained run's final in-domain and OOD loss over the whole val / OOD splits through
the fused linear+CE kernel, the geometry of its final W_U and last-token representations, and the
grid analyses (hyperparameter effects on erank, raw / partial / within-stratum correlations,
incremental R², late saturation).

    python -m stages evaluate unembed_rank
"""
from __future__ import annotations

import numpy as np
import polars as pl
import torch
from sklearn.model_selection import KFold
from pydantic import Field, model_validator

from kernels.fused_linear_ce import linear_cross_entropy_stats
from kernels.record import KernelRecord
from stages.common.config import StageConfig
from stages.common.device import DeviceName, pick_device
from stages.common.paths import read_json, write_json
from stages.common.runner import StageContext
from stages.common.sources import SourceConfig
from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig
from stages.unembed_rank import analysis as A
from stages.unembed_rank.geometry import geometry
from stages.unembed_rank.lm import KERNEL, eval_loss, eval_windows

METRICS = ("erank", "erank_sq", "cosine", "isotropy", "h_erank", "h_erank_sq", "h_cosine", "h_isotropy")


class Config(StageConfig):
    device: DeviceName = "auto"
    torch_threads: int = Field(1, ge=1, le=64, description="intra-op threads; the models are tiny, so 1 is fastest")
    max_windows: int = Field(128, ge=1, le=1_000_000, description="val / OOD windows per final evaluation")
    # real path (full profile only): a family of HF checkpoints read from disk (stages/unembed_rank/hf_source.py)
    checkpoints: dict[str, SourceConfig] = Field(default_factory=dict, max_length=64)
    eval_source: SourceConfig = SourceConfig()
    ood_source: SourceConfig = SourceConfig()
    text_column: str = Field("text", min_length=1, max_length=200)
    hf_seq_len: int = Field(512, ge=2, le=131072, description="tokens per evaluation window of a checkpoint")
    hf_eval_tokens: int = Field(1_000_000, ge=10, le=1_000_000_000, description="tokens read per corpus")
    matched_loss_max_gap: float = Field(0.05, gt=0.0, le=10.0,
                                        description="guard of the matched-loss crossing: the largest ID-loss gap "
                                                    "(nats) between the two logged points that bracket it; a wider "
                                                    "bracket makes that run's value NaN (inconclusive)")

    @model_validator(mode="after")
    def _real(self):
        if self.checkpoints or self.eval_source.kind != "toy" or self.ood_source.kind != "toy":
            from stages.unembed_rank.hf_source import check_evaluate_sources
            check_evaluate_sources(self)
        return self


@torch.no_grad()
def run(cfg: Config, ctx: StageContext) -> None:
    torch.set_num_threads(cfg.torch_threads)
    if cfg.checkpoints:                               # full profile: also the real checkpoints (hf/, hf_source.py)
        from stages.unembed_rank.hf_source import run_full_evaluate
        with torch.no_grad():
            run_full_evaluate(cfg, ctx)
    device = pick_device(cfg.device)
    rec = KernelRecord(device)
    info = read_json(ctx.input("train") / "runs.json")
    T = info["seq_len"]
    states = torch.load(ctx.input("train") / "models.pt", map_location=device)
    splits = {s: torch.from_numpy(np.load(ctx.input("prepare") / f"{s}.npy")) for s in ("val", "ood")}
    val = eval_windows(splits["val"], T, cfg.max_windows).to(device)  # the first non-overlapping windows
    ood = eval_windows(splits["ood"], T, cfg.max_windows).to(device)
    mcfgs = {int(d): TinyTransformerConfig(**m) for d, m in info["models"].items()}
    rows = []
    for i, spec in enumerate(info["runs"]):
        mcfg = mcfgs[spec["d_model"]]
        model = TinyTransformer(mcfg).to(device)
        model.load_state_dict(states[spec["name"]])
        model.eval()
        id_loss, h = eval_loss(model, val, rec)
        ood_loss, _ = eval_loss(model, ood, rec)
        rows.append({"run": spec["name"], **{k: spec[k] for k in (*A.HPARAMS, "seed", "steps", "tokens")},
                     **{f"in_{d}": spec[f"in_{d}"] for d in A.DESIGNS}, "val_loss": id_loss, "ood_loss": ood_loss,
                     **geometry(model.unembed, h)})
        if i == 0:
            w = val[:2]
            hh = model.hidden(w[:, :-1]).reshape(-1, mcfg.d_model)[:96].contiguous()
            rec.parity(KERNEL, linear_cross_entropy_stats, hh, model.unembed, w[:, 1:].reshape(-1)[:96],
                       slice=f"96 positions of the first 2 in-domain val windows, run {spec['name']}")
    history = pl.read_csv(ctx.input("train") / "history.csv")
    sat = A.saturation(history)
    res = (pl.DataFrame(rows).join(sat, on="run", how="left")
           .sort("seed", "d_model", "final_lr_frac", "lr", "batch_size", "weight_decay"))
    res.write_csv(ctx.out / "results.csv")
    main, tok, stp, probe = (res.filter(pl.col(f"in_{d}")) for d in A.DESIGNS)
    main_hist = history.filter(pl.col("run").is_in(main["run"].to_list()))

    out: dict = {"grid": {k: info[k] for k in ("seeds", "extra_seeds", "batch_sizes", "weight_decays", "lrs",
                                                "final_lr_fracs", "d_models", "tokens", "equal_steps")}
                          | {"equal_steps_weight_decays": info.get("equal_steps_weight_decays", info["weight_decays"])},
                 "n_runs": res.height, "n_main": main.height, "n_tokens": tok.height, "n_steps": stp.height,
                 "n_probe": probe.height}
    # hyperparameter effects: the main block (one width, one final LR, every seed), equal tokens and equal steps
    out["erank_effects"] = A.hparam_effects(main, "erank")
    out["erank_sq_effects"] = A.hparam_effects(main, "erank_sq")
    if stp.height:
        out["equal_steps"] = A.hparam_effects(stp, "erank")
        out["equal_steps_loss"] = A.hparam_effects(stp, "val_loss")
    # correlation analyses: every equal-token run (all cells), every varying hyperparameter controlled
    out["controls"] = A.varying(tok)
    out["corr"] = {loss: {m: A.correlations(tok, m, loss) for m in METRICS} for loss in ("val_loss", "ood_loss")}
    out["delta_r2"] = {loss: {m: A.delta_r2(tok, m, loss) for m in METRICS} for loss in ("val_loss", "ood_loss")}
    # robustness of the erank ΔR²: the paper's 5-fold CV (shuffled, fixed split seed) instead of leave-one-out
    out["delta_r2_5fold"] = {loss: A.delta_r2(tok, "erank", loss, cv=KFold(5, shuffle=True, random_state=0))
                             for loss in ("val_loss", "ood_loss")}
    # saturation: compared within the probe, the runs that share the regime where the val loss can rise late
    # (pooled over every design, the unsaturated side would be dominated by barely trained near-full-rank runs
    # that cannot saturate); the pooled counts are kept as context. No probe: every run.
    out["saturation"] = A.saturation_counts(probe if probe.height else res)
    out["saturation_all"] = A.saturation_counts(res)
    out["saturation_by_design"] = {d: A.saturation_counts(f) for d, f in zip(A.DESIGNS, (main, tok, stp, probe))
                                   if f.height}
    # matched loss on the regular points plus the dense early ones (every step ≤ dense_steps), guarded; two
    # levels: the main block's (equal tokens) and the equal-steps design's (its largest final loss)
    dense_path = ctx.input("train") / "history_dense.csv"
    dense = pl.read_csv(dense_path) if dense_path.exists() else None
    fine = A.merge_dense(history, dense)
    out["matched_loss"] = A.matched_loss(fine.filter(pl.col("run").is_in(main["run"].to_list())), main,
                                         max_gap=cfg.matched_loss_max_gap)
    if stp.height:
        out["matched_loss_steps"] = A.matched_loss(fine.filter(pl.col("run").is_in(stp["run"].to_list())), stp,
                                                   max_gap=cfg.matched_loss_max_gap)
    out["dense_steps"] = info.get("dense_steps", 0)
    init = history.filter(pl.col("step") == 0)
    out["init"] = {"erank": float(init["erank"].mean()), "erank_sq": float(init["erank_sq"].mean()),
                   "val_loss": float(init["val_loss"].mean())}
    # agreement of the other geometry metrics with erank (pooled Spearman over the equal-token runs)
    out["agreement"] = {m: A.spearman(tok["erank"].to_numpy(), tok[m].to_numpy()) for m in METRICS if m != "erank"}
    A.strata(tok, "erank", "val_loss").write_csv(ctx.out / "strata_val.csv")
    A.strata(tok, "erank", "ood_loss").write_csv(ctx.out / "strata_ood.csv")
    # best run per seed (main block): is it also the run with the highest erank?
    best = main.sort("val_loss").group_by("seed", maintain_order=True).first().sort("seed")
    top = main.sort("erank", descending=True).group_by("seed", maintain_order=True).first().sort("seed")
    out["best"] = {"best_run": best["run"].to_list(), "top_erank_run": top["run"].to_list(),
                   "best_erank_rank": [int((main.filter(pl.col("seed") == s)["erank"] > e).sum()) + 1
                                       for s, e in zip(best["seed"], best["erank"])]}
    write_json(ctx.out / "analysis.json", out)
    rec.save(ctx.out)
