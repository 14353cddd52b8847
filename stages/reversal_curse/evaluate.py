"""evaluate: reversal accuracy of every trained model through the fused linear+CE kernel, the
structure of the learned W_OV (off-diagonal held-out asymmetry, nuclear norm at fixed margin), and
the convex minimum-nuclear-norm solution of the reference world's problems.

Per-seed lists everywhere (metrics: theory.<arm>.<key> = [seed 0, seed 1, ...] in prepare's seed
order), so the report's claims are seed-aware.
"""
from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from pydantic import Field

from kernels.fused_linear_ce import linear_cross_entropy_stats
from kernels.record import KernelRecord
from stages.common.config import StageConfig
from stages.common.device import DeviceName, pick_device
from stages.common.paths import read_json, write_json
from stages.common.runner import StageContext
from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig
from stages.reversal_curse.facts import arm_mask, mean_onehot
from stages.reversal_curse.measures import (min_nuclear_norm, nuclear_at_margin, offdiag_asymmetry,
                                            pair_block)
from stages.reversal_curse.models import KERNEL, OneLayerModel, load_arm_models
from stages.reversal_curse.train import load_world, test_rows


class Config(StageConfig):
    device: DeviceName = "auto"
    convex_solver: Literal["SCS"] = Field("SCS", description="cvxpy solver for the min-nuclear-norm reference")


def fact_sets(cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Which facts each accuracy is measured on."""
    kind, split = cols["kind"], cols["split"]
    return {"reverse_acc": test_rows(cols),                                  # the held-out reversals
            "indist_reverse_acc": (split == "train") & (kind == "reverse"),
            "forward_acc": kind == "forward"}


def per_seed(rows: list[dict], keys: list[str], seeds: list[int]) -> dict[str, dict]:
    """{arm: {key: [per seed], key_mean: mean}} in the seed order of ``seeds``."""
    out: dict[str, dict] = {}
    for name in dict.fromkeys(r["name"] for r in rows):
        mine = {r["seed"]: r for r in rows if r["name"] == name}
        out[name] = {"seeds": seeds}
        for key in keys:
            vals = [float(mine[s][key]) for s in seeds]
            out[name][key] = vals
            out[name][f"{key}_mean"] = float(np.mean(vals))
    return out


@torch.no_grad()
def run(cfg: Config, ctx: StageContext) -> None:
    torch.set_num_threads(1)  # small matrices; one thread is fastest and deterministic
    device = pick_device(cfg.device)
    rec = KernelRecord(device)
    meta = read_json(ctx.input("prepare") / "meta.json")
    models = read_json(ctx.input("train") / "models.json")
    seeds = meta["seeds"]
    arms = models["theory"]["arms"]
    spec_arms = [next(a for a in arms if a["name"] == s["name"]) | {"seed": s["seed"]}
                 for s in models["theory"]["specs"]]
    out: dict = {"seeds": seeds}
    blocks: dict = {}

    for world in ("main", "ref"):
        wm = meta["worlds"][world]
        V, n = wm["vocab_size"], wm["n_pairs"]
        gd = models["theory"][world]
        build = lambda arm: OneLayerModel(V, gd["d"], arm["init_scale"], arm["factorized"],  # noqa: E731
                                          torch.Generator().manual_seed(0))
        loaded = load_arm_models(ctx.input("train") / f"theory_{world}.pt", spec_arms, build, device)
        cols = {s: load_world(ctx, world, s) for s in seeds}
        rows = []
        for arm, model in loaded:
            c = cols[arm["seed"]]
            e, r, y = (torch.as_tensor(c[k], device=device) for k in ("entity", "relation", "target"))
            row = {"name": arm["name"], "seed": arm["seed"]}
            for key, mask in fact_sets(c).items():
                m = torch.as_tensor(mask, device=device)
                if model.factorized:
                    h, unembed = model.hidden_and_unembed(e[m], r[m])
                else:
                    h, unembed = mean_onehot(e[m], r[m], V), model.w
                loss, pred = rec.call(KERNEL, linear_cross_entropy_stats, h.contiguous(), unembed, y[m])
                row[key] = (pred == y[m]).float().mean().item()
                if key == "reverse_acc":
                    row["reverse_loss"] = loss.mean().item()
            held = torch.as_tensor(c["pair"][test_rows(c)], device=device)
            a_idx, b_idx = held, held + n
            w = model.w_ov()
            train = torch.as_tensor(arm_mask(c["kind"], c["split"], arm["bridge"]), device=device)
            row["offdiag_asym"] = offdiag_asymmetry(w, a_idx, b_idx)
            row["nuclear_norm"] = torch.linalg.matrix_norm(w.double(), ord="nuc").item()
            row["nuclear_at_margin"] = nuclear_at_margin(w, e[train], r[train], y[train])
            rows.append(row)
            if world == "main" and arm["seed"] == seeds[0]:
                k = min(n, 20)
                ents = torch.cat([torch.arange(k, device=device), n + torch.arange(k, device=device)])
                blocks[arm["name"]] = {"pair_block": pair_block(w, a_idx, b_idx),
                                       # a_0..a_{k-1} then b_0..b_{k-1}: forward entries bottom-left, reverse top-right
                                       "entity_block": w[ents][:, ents].tolist(), "entity_block_k": k}
                if arm["factorized"] and arm["bridge"] == "AB" and "parity" not in out:
                    hh, uu = model.hidden_and_unembed(e[:64], r[:64])
                    rec.parity(KERNEL, linear_cross_entropy_stats, hh.contiguous(), uu, y[:64],
                               slice=f"first 64 facts of the main world, arm {arm['name']}, seed {seeds[0]}")
                    out["parity"] = True
        out[world] = per_seed(rows, ["reverse_acc", "indist_reverse_acc", "forward_acc", "reverse_loss",
                                     "offdiag_asym", "nuclear_norm", "nuclear_at_margin"], seeds)
        out[world + "_world"] = {"n_pairs": n, "n_heldout": wm["n_heldout"], "chance": 1.0 / n, "d": gd["d"]}
    out.pop("parity", None)

    # --- convex reference: min ‖W‖_* s.t. training margins ≥ 1, per bridge and seed, on the ref world
    wm = meta["worlds"]["ref"]
    convex_rows = []
    for bridge in dict.fromkeys(a["bridge"] for a in arms):
        for s in seeds:
            c = load_world(ctx, "ref", s)
            tr = arm_mask(c["kind"], c["split"], bridge)
            value, w_star = min_nuclear_norm(wm["vocab_size"], c["entity"][tr], c["relation"][tr], c["target"][tr],
                                             solver=cfg.convex_solver)
            w_t = torch.as_tensor(w_star)
            test = test_rows(c)
            logits = 0.5 * (w_t[:, c["entity"][test]] + w_t[:, c["relation"][test]])
            held = torch.as_tensor(c["pair"][test])
            convex_rows.append({"name": bridge, "seed": s, "value": value,
                                "reverse_acc": float((logits.argmax(0).numpy() == c["target"][test]).mean()),
                                "offdiag_asym": offdiag_asymmetry(w_t, held, held + wm["n_pairs"])})
    out["convex"] = per_seed(convex_rows, ["value", "reverse_acc", "offdiag_asym"], seeds)
    for bridge, m in out["convex"].items():
        m["reverse_acc_min"], m["reverse_acc_max"] = min(m["reverse_acc"]), max(m["reverse_acc"])
    # GD's nuclear norm at fixed margin relative to the convex optimum of the same problem (1 = optimal)
    for arm in arms:
        ref = out["ref"][arm["name"]]
        ref["nuc_ratio"] = [g / o for g, o in zip(ref["nuclear_at_margin"], out["convex"][arm["bridge"]]["value"])]
        ref["nuc_ratio_mean"] = float(np.mean(ref["nuc_ratio"]))

    # --- the real one-layer transformer
    tcfg = TinyTransformerConfig(**models["transformer"]["config"])
    tspecs = models["transformer"]["specs"]
    cols = {s: load_world(ctx, "main", s) for s in seeds}
    trows = []
    for arm, model in load_arm_models(ctx.input("train") / "transformer.pt", tspecs,
                                      lambda arm: TinyTransformer(tcfg), device):
        c = cols[arm["seed"]]
        tokens = torch.as_tensor(np.stack([c["entity"], c["relation"]], 1), device=device)
        y = torch.as_tensor(c["target"], device=device)
        row = {"name": arm["name"], "seed": arm["seed"]}
        for key, mask in fact_sets(c).items():
            m = torch.as_tensor(mask, device=device)
            h = model.hidden(tokens[m])[:, -1]  # (N, C) last position
            loss, pred = rec.call(KERNEL, linear_cross_entropy_stats, h.contiguous(), model.unembed, y[m])
            row[key] = (pred == y[m]).float().mean().item()
        trows.append(row)
    out["transformer"] = per_seed(trows, ["reverse_acc", "indist_reverse_acc", "forward_acc"], seeds)
    out["chance"] = out["main_world"]["chance"]
    rec.save(ctx.out)
    write_json(ctx.out / "metrics.json", out)
    write_json(ctx.out / "blocks.json", blocks)
