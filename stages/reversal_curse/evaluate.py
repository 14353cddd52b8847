"""evaluate: reversal accuracy of every trained model through the fused linear+CE kernel, and
the structure of the learned W_OV (symmetry of the {a_i, b_i} blocks, nuclear norm)."""
from __future__ import annotations

from typing import Literal

import numpy as np
import torch

from kernels.fused_linear_ce import linear_cross_entropy_stats
from stages.common.config import StageConfig
from stages.common.paths import read_json, write_json
from stages.common.runner import StageContext
from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig
from stages.reversal_curse.facts import mean_onehot
from stages.reversal_curse.models import OneLayerModel, load_arm_models
from stages.reversal_curse.train import load_facts


class Config(StageConfig):
    kernel_backend: Literal["auto", "triton", "torch"] = "auto"


def heldout_asymmetry(w_ov: torch.Tensor, a_idx: torch.Tensor, b_idx: torch.Tensor) -> float:
    """||M - Mᵀ||_F / ||M||_F for M = W_OV restricted to the held-out entities {a_i} ∪ {b_i}.

    0 for a symmetric block (reversal learned), about √2 when only W[b_i, a_i] is large.
    """
    ents = torch.cat([a_idx, b_idx])
    m = w_ov[ents][:, ents]
    return (torch.linalg.norm(m - m.T) / torch.linalg.norm(m).clamp_min(1e-12)).item()


def pair_block(w_ov: torch.Tensor, a_idx: torch.Tensor, b_idx: torch.Tensor) -> list[list[float]]:
    """Mean over held-out pairs of [[W[a,a], W[a,b]], [W[b,a], W[b,b]]] (rows: output, cols: input)."""
    return [[w_ov[a_idx, a_idx].mean().item(), w_ov[a_idx, b_idx].mean().item()],
            [w_ov[b_idx, a_idx].mean().item(), w_ov[b_idx, b_idx].mean().item()]]


def accuracy(h: torch.Tensor, unembed: torch.Tensor, y: torch.Tensor, backend: str) -> tuple[float, float]:
    loss, pred = linear_cross_entropy_stats(h, unembed, y, backend=backend)
    return (pred == y).float().mean().item(), loss.mean().item()


def summarize(rows: list[dict], keys: list[str]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for name in dict.fromkeys(r["name"] for r in rows):
        mine = [r for r in rows if r["name"] == name]
        out[name] = {"seeds": [r["seed"] for r in mine]}
        for key in keys:
            vals = [r[key] for r in mine]
            out[name][key] = float(np.mean(vals))
            out[name][f"{key}_per_seed"] = vals
    return out


@torch.no_grad()
def run(cfg: Config, ctx: StageContext) -> None:
    cols, meta = load_facts(ctx)
    models = read_json(ctx.input("train") / "models.json")
    V, n = meta["vocab_size"], meta["n_pairs"]
    entity, relation = torch.as_tensor(cols["entity"]), torch.as_tensor(cols["relation"])
    target = torch.as_tensor(cols["target"])
    kind, split = cols["kind"], cols["split"]
    sets = {  # which facts each accuracy is measured on
        "reverse_acc": (split == "test") & (kind == "reverse"),          # the held-out reversals
        "indist_reverse_acc": (split == "train") & (kind == "reverse"),
        "forward_acc": kind == "forward",
    }
    held_pairs = torch.as_tensor(cols["pair"][sets["reverse_acc"]])
    a_idx, b_idx = held_pairs, held_pairs + n
    xbar = mean_onehot(entity, relation, V)
    tokens = torch.stack([entity, relation], dim=1)

    theory_rows, blocks = [], {}
    arms = models["theory"]["arms"]
    build = lambda arm: OneLayerModel(V, models["theory"]["d"], arm["init_scale"], arm["factorized"],
                                      torch.Generator())
    for arm, model in load_arm_models(ctx.input("train") / "theory.pt", arms, build):
        row = {"name": arm["name"], "seed": arm["seed"]}
        for key, mask in sets.items():
            m = torch.as_tensor(mask)
            h, unembed = model.hidden_and_unembed(xbar[m])
            row[key], loss = accuracy(h, unembed, target[m], cfg.kernel_backend)
            if key == "reverse_acc":
                row["reverse_loss"] = loss
        w_ov = model.w_ov()
        row["asymmetry"] = heldout_asymmetry(w_ov, a_idx, b_idx)
        row["nuclear_norm"] = torch.linalg.matrix_norm(w_ov, ord="nuc").item()
        theory_rows.append(row)
        if arm["seed"] == arms[0]["seed"]:
            blocks[arm["name"]] = {"pair_block": pair_block(w_ov, a_idx, b_idx),
                                   "entity_block": w_ov[: 2 * n, : 2 * n].tolist()}

    tcfg = TinyTransformerConfig(**models["transformer"]["config"])
    trans_rows = []
    for arm, model in load_arm_models(ctx.input("train") / "transformer.pt", models["transformer"]["arms"],
                                      lambda arm: TinyTransformer(tcfg)):
        row = {"name": arm["name"], "seed": arm["seed"]}
        for key, mask in sets.items():
            m = torch.as_tensor(mask)
            h = model.hidden(tokens[m])[:, -1]  # (N, C) last position
            row[key], loss = accuracy(h, model.unembed, target[m], cfg.kernel_backend)
            if key == "reverse_acc":
                row["reverse_loss"] = loss
        trans_rows.append(row)

    keys = ["reverse_acc", "indist_reverse_acc", "forward_acc", "reverse_loss"]
    write_json(ctx.out / "metrics.json", {
        "chance": 1.0 / n, "n_pairs": n, "n_heldout": int(sets["reverse_acc"].sum()),
        "theory": summarize(theory_rows, keys + ["asymmetry", "nuclear_norm"]),
        "transformer": summarize(trans_rows, keys),
    })
    write_json(ctx.out / "blocks.json", blocks)
