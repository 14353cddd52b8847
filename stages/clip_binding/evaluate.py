"""evaluate@clip_binding: held-out binding accuracy (coverage sweep), binding-function complexity, additivity.

    python -m stages evaluate clip_binding [--profile smoke]

1. Coverage: every (fraction, seed) model on its fixed held-out test scenes (only unseen objects),
   pooled queries per batch of `eval_batch` scenes; accuracy = min positive logit > max negative logit,
   read off the fused kernel (kernels/cosine_soft_ce.py), for concept and object queries.
   `bag_binding_acc` is the same score for an oracle bag-of-concepts scorer (knows which concept
   values are in the scene, not which object they belong to): the no-binding reference.
2. Complexity: regress the 2-object scene embeddings of (i) the trained encoders at the largest
   coverage fraction and (ii) the high-complexity control y = g(a) + g(b), g a random table, from
   concept ids with concat-MLP / multiplicative / sum+mult slot models; R² and frozen-probe accuracy
   (predicted embeddings scored against the encoder's own object probes, through the kernel) on scenes
   of unseen objects.
3. Additivity: R² of y(a, b) ≈ μ + A_1[a] + A_2[b] on held-out scenes.

With ``source: {kind: hf, model: <CLIP checkpoint>}`` (the ``full`` profile only) a real CLIP text tower
(``stages.clip_binding.clip``: captions of every scene, probes = object phrases) is a third encoder kind
``clip`` of the complexity analysis and the additivity fit; its embeddings and the others are zero-padded to
one width, which leaves R² and cosine probe scores unchanged.

The regressor bank of each complexity fraction and the coverage scores of each model are independent pieces (each
draws only from generators seeded by its own indices): ``workers`` of them run at once in single-threaded processes
(stages/common/jobs.py), the banks first (the longest); the parent assembles their results in the serial order and
runs the parity check and the additivity fit.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from pydantic import Field

from kernels.cosine_soft_ce import cosine_soft_ce
from kernels.record import KernelRecord
from stages.common.config import Fraction, Seed, StageConfig
from stages.common.device import DeviceName, pick_device
from stages.common.jobs import payload, run_jobs
from stages.common.paths import read_json, write_json
from stages.common.runner import StageContext
from stages.common.sources import SourceConfig
from stages.common.trainer import TrainerConfig, make_trainer
from stages.clip_binding.complexity import (FAMILIES, RegressorBank, additive_code_r2, additivity_r2, pair_ids,
                                            r2_score)
from stages.clip_binding.models import (BindingModel, heldout_accuracy, recombination_accuracy, seen_pair_scenes,
                                        steps_loader)
from stages.clip_binding.prepare import frac_key
from stages.clip_binding.scenes import World, sample_scenes


class Config(StageConfig):
    seed: Seed = 0
    device: DeviceName = "auto"
    torch_threads: int = Field(1, ge=1, le=64)
    eval_batch: int = Field(256, ge=8, le=8192, description="scenes per pooled-query batch")
    train_scenes: int = Field(1024, ge=8, le=100_000, description="seen-object scenes for the train accuracy")
    hidden: int = Field(16, ge=1, le=512, description="slot-table width of the complexity regressors")
    mlp_hidden: int = Field(128, ge=1, le=4096)
    reg_steps: int = Field(400, ge=1, le=100_000)
    reg_lr: float = Field(1e-2, gt=0, le=1.0)
    max_train_scenes: int = Field(1024, ge=4, le=1_000_000, description="cap on regression training scenes")
    reg_restarts: int = Field(3, ge=1, le=16, description="independent initialisations of every regressor; "
                              "a seed's R² is their median (robust to one diverged fit), the spread is reported")
    additivity_test_fraction: Fraction = 0.2
    ridge_alpha: float = Field(1e-3, gt=0, le=1e3)
    trainer: TrainerConfig = TrainerConfig(enable_progress_bar=False)
    source: SourceConfig = SourceConfig()   # toy: no CLIP; hf/file (full only): a CLIPModel checkpoint
    workers: int = Field(1, ge=1, le=64, description=(
        "evaluation pieces (one regressor bank per complexity fraction, one coverage evaluation per model) run at "
        "once, each in its own single-threaded process (stages/common/jobs.py; 1: one after another in this "
        "process, same results)"))


def load_models(ctx: StageContext, world: World, device) -> dict[str, BindingModel]:
    train_dir = ctx.input("train")
    info = read_json(train_dir / "models.json")
    return {label: load_model(train_dir, info["kwargs"], world, label, device) for label in info["labels"]}


def bag_of_concepts_correct(world: World, objs, n, pq) -> torch.Tensor:
    """Oracle bag-of-concepts scorer: a query object looks present iff each of its concept values is
    in the scene; correct iff no negative query looks present (binding-free upper reference)."""
    vals = world.concepts(objs)                                                   # (B, N, k)
    used = torch.arange(world.n_max, device=objs.device)[None, :] < n[:, None]
    qv = world.concepts(pq["query_objs"])                                         # (M, k)
    present = ((vals[:, :, None, :] == qv[None, None, :, :]) & used[:, :, None, None]).any(1).all(-1)  # (B, M)
    neg = pq["object_labels"] == 0
    return ~(present & neg).any(-1)


def heldout_pairs(world: World, objs: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """The distinct unordered object pairs of the 2-object scenes among (objs, n) whose objects differ in every
    concept, each once: (m, 2)."""
    if world.n_max < 2:
        return objs.new_zeros((0, 2))
    pick = (n == 2) & (world.concepts(objs[:, 0]) != world.concepts(objs[:, 1])).all(-1)
    pairs = torch.sort(objs[pick][:, :2], dim=1).values
    return torch.unique(pairs, dim=0) if len(pairs) else pairs


def recomb_items(model: BindingModel, pairs: torch.Tensor) -> dict[str, torch.Tensor]:
    """``recombination_accuracy`` per pair ({"lenient", "strict"}: (m,) bool; empty when there are no pairs)."""
    if not len(pairs):
        empty = torch.zeros(0, dtype=torch.bool)
        return {"lenient": empty, "strict": empty}
    return recombination_accuracy(model, pairs)


COVERAGE_KEYS = ("object_acc", "binding_acc", "concept_acc", "bag_binding_acc", "n_binding_items",
                 "binding_acc_distinct", "bag_binding_acc_distinct", "n_binding_distinct_items",
                 "train_binding_acc", "train_bag_binding_acc", "train_binding_acc_any_neg", "n_train_binding_items",
                 "recomb_acc", "recomb_acc_lenient", "n_recomb_items", "train_recomb_acc", "train_recomb_acc_lenient",
                 "n_train_recomb_items", "n_train_recomb_pairs", "probe_additive_r2")


def _calls(rec: KernelRecord) -> int:
    return rec.to_dict().get("cosine_soft_ce", {}).get("calls", 0)


def load_model(train_dir: Path, kwargs: dict, world: World, label: str, device) -> BindingModel:
    m = BindingModel(world, torch.arange(1), seed=0, **kwargs)
    m.load_state_dict(torch.load(Path(train_dir) / "models" / f"{label}.pt"))
    return m.to(device).eval()


@torch.no_grad()
def coverage_unit(cfg: Config, world: World, model: BindingModel, j: int, test_objs: torch.Tensor,
                  test_n: torch.Tensor, coverage_mask: torch.Tensor, rec: KernelRecord, device,
                  parity_inputs: bool = False) -> dict:
    """The coverage scores of one (fraction, seed j) model: {key: value} over ``COVERAGE_KEYS``, and with
    ``parity_inputs`` the kernel inputs of its first 64 held-out test scenes (x, object probes, labels, scale)."""
    acc = {}
    objs_all, n_all = test_objs.to(device), test_n.to(device)
    g = torch.Generator(device=device).manual_seed(cfg.seed + 7 * j)
    res = {k: [] for k in ("obj", "con", "bind", "bag", "bind_d", "bag_d")}
    parity = None
    for s0 in range(0, objs_all.shape[0], cfg.eval_batch):
        objs, n = objs_all[s0:s0 + cfg.eval_batch], n_all[s0:s0 + cfg.eval_batch]
        r = heldout_accuracy(model, objs, n, g, rec.backend)
        rec.count("cosine_soft_ce", 2)
        if parity_inputs and parity is None:
            x, pq, s = r["inputs"]
            _, qo = model.embed_queries(pq["query_objs"])
            parity = (x[:64], qo, pq["object_labels"][:64], s)
        two = (n == 2) & (objs[:, 0] != objs[:, 1]) if world.n_max > 1 else n > 0
        bag = bag_of_concepts_correct(world, objs, n, r["inputs"][1])
        res["obj"].append(r["object_correct"])
        res["con"].append(r["concept_correct"])
        res["bind"].append(r["object_correct"][two])
        res["bag"].append(bag[two])
        # ... and only the 2-object scenes whose objects differ in EVERY concept: a scene sharing a concept value
        # is passed by the bag-of-concepts oracle (no binding needed; red team of the v = 6 study)
        apart = two & (world.concepts(objs[:, 0]) != world.concepts(objs[:, 1])).all(-1) if world.n_max > 1 else two
        res["bind_d"].append(r["object_correct"][apart])
        res["bag_d"].append(bag[apart])
    cat = {k: torch.cat(v).float() for k, v in res.items()}
    acc["object_acc"] = float(cat["obj"].mean())
    acc["concept_acc"] = float(cat["con"].mean())
    acc["binding_acc"] = float(cat["bind"].mean())
    acc["n_binding_items"] = int(cat["bind"].numel())    # test scenes behind binding_acc (item noise)
    acc["bag_binding_acc"] = float(cat["bag"].mean())
    n_d = int(cat["bind_d"].numel())
    acc["binding_acc_distinct"] = float(cat["bind_d"].mean()) if n_d else float("nan")
    acc["bag_binding_acc_distinct"] = float(cat["bag_d"].mean()) if n_d else float("nan")
    acc["n_binding_distinct_items"] = n_d
    # the recombination test (strict and lenient) on the distinct held-out pairs of the 2-object test
    # scenes whose objects differ in every concept
    ra = recomb_items(model, heldout_pairs(world, objs_all, n_all))
    for key, kind in (("recomb_acc", "strict"), ("recomb_acc_lenient", "lenient")):
        acc[key] = float(ra[kind].float().mean()) if ra[kind].numel() else float("nan")
    acc["n_recomb_items"] = int(ra["strict"].numel())      # diagnostic only (no claim reads it)
    # the same binding score on scenes of SEEN objects (does the model bind at all?): negatives drawn as
    # in training (training objects only, unless heldout_negatives) and, apart, from all objects
    train_objs = torch.arange(world.n_objects, device=device)[coverage_mask.to(device)]
    objs, n = sample_scenes(world, train_objs, cfg.train_scenes, g, n_fixed=min(2, world.n_max))
    two = objs[:, 0] != objs[:, -1] if world.n_max > 1 else n > 0
    pool = None if model.heldout_negatives else train_objs
    r = heldout_accuracy(model, objs, n, torch.Generator(device=device).manual_seed(cfg.seed + 7 * j), rec.backend, pool)
    bag = bag_of_concepts_correct(world, objs, n, r["inputs"][1])
    acc["train_binding_acc"] = float(r["object_correct"][two].float().mean())
    acc["train_bag_binding_acc"] = float(bag[two].float().mean())
    acc["n_train_binding_items"] = int(two.sum())
    r = heldout_accuracy(model, objs, n, torch.Generator(device=device).manual_seed(cfg.seed + 7 * j), rec.backend)
    acc["train_binding_acc_any_neg"] = float(r["object_correct"][two].float().mean())
    rec.count("cosine_soft_ce", 4)
    # ... and on seen objects: distinct pairs of training objects whose whole bag (every pair-scene) is
    # made of training objects
    ra = recomb_items(model, seen_pair_scenes(world, train_objs, cfg.train_scenes,
                                              torch.Generator(device=device).manual_seed(cfg.seed + 7 * j)))
    for key, kind in (("train_recomb_acc", "strict"), ("train_recomb_acc_lenient", "lenient")):
        acc[key] = float(ra[kind].float().mean()) if ra[kind].numel() else float("nan")
    # the pair count (the shared verdict rule reads it as the item count; under 2 items it is inconclusive)
    acc["n_train_recomb_pairs"] = int(ra["strict"].numel())
    acc["n_train_recomb_items"] = int(ra["strict"].numel())
    # how additive the probe's object code is (an additive code cannot pass the recombination test)
    every = torch.arange(world.n_objects, device=device)
    acc["probe_additive_r2"] = additive_code_r2(
        model.embed_objects(every).cpu().double().numpy(), world.concepts(every).cpu().numpy(), world.v,
        cfg.ridge_alpha)
    return {"acc": acc, "parity": None if parity is None else tuple(t.cpu() for t in parity)}


@torch.no_grad()
def embeddings(world, models, meta, enc_frac, device, d_out):
    """All ordered 2-object scenes (a, b): Y (E, P, d) for trained encoders then controls; probes (E, n_obj, d)."""
    n_obj = world.n_objects
    a, b = torch.meshgrid(torch.arange(n_obj, device=device), torch.arange(n_obj, device=device), indexing="ij")
    a, b = a.reshape(-1), b.reshape(-1)
    Y, P = [], []
    for seed in meta["seeds"]:
        m = models[f"{frac_key(enc_frac)}_s{seed}"]
        Y.append(m.embed_scenes(torch.stack([a, b], 1), torch.full_like(a, 2)))
        P.append(m.embed_queries(torch.arange(n_obj, device=device))[1])
    for seed in meta["seeds"]:
        g = torch.Generator(device=device).manual_seed(5_000 + seed)
        table = torch.randn(n_obj, d_out, generator=g, device=device)   # high-complexity control g(obj)
        Y.append(table[a] + table[b])                                    # scene = Σ_obj g(obj)
        P.append(table)
    return a, b, torch.stack(Y), torch.stack(P)


def probe_accuracy(pred, probes, a, b, n_obj, rec, backend) -> list[float]:
    """Predicted scene embeddings vs frozen L2-normed object probes: min pos > max neg (kernel)."""
    targets = torch.zeros(a.shape[0], n_obj, device=a.device)
    targets[torch.arange(a.shape[0]), a] = 1.0
    targets[torch.arange(a.shape[0]), b] = 1.0
    one = torch.ones((), device=a.device)
    out = []
    for e in range(pred.shape[0]):
        _, mn, mx = cosine_soft_ce(pred[e], probes[e], targets, one, backend=backend)
        rec.count("cosine_soft_ce")
        out.append(float((mn > mx).float().mean()))
    return out


def _pad(x: torch.Tensor, d: int) -> torch.Tensor:
    """Zero columns up to width d: R² (SSE and SST) and cosine scores are unchanged."""
    return torch.nn.functional.pad(x, (0, d - x.shape[-1]))


def complexity_inputs(cfg, world, models, meta, device, d_out) -> dict:
    """The complexity analysis' shared inputs (CPU tensors, the payload of its jobs): every ordered 2-object scene
    (a, b), the trained encoders' and the controls' embeddings Y (2S, P, d) and probes P (2S, n_obj, d), and with a
    real CLIP source its scene and probe features Yc (P, dc), Pc (n_obj, dc), one model for every seed's split."""
    enc_frac = max(meta["train_object_fractions"])
    a, b, Y, P = embeddings(world, models, meta, enc_frac, device, d_out)
    out = {"a": a.cpu(), "b": b.cpu(), "Y": Y.cpu(), "P": P.cpu(), "d_out": d_out, "enc_frac": enc_frac}
    if cfg.source.kind != "toy":      # a real CLIP text tower: one model, analysed on every seed's split
        from stages.clip_binding.clip import clip_world, load_clip

        model, tok = load_clip(cfg.source)
        Yc, Pc = clip_world(model.to(device), tok, world, a, b)
        out.update(Yc=Yc.cpu(), Pc=Pc.cpu())
    return out


def encoder_stack(inp: dict, S: int, device) -> tuple[torch.Tensor, torch.Tensor, dict[str, slice], int]:
    """Y (E, P, d), P (E, n_obj, d) of every analysed encoder (trained, control, clip: S each; zero-padded to one
    width), the slice of each kind, and that width."""
    Y, P, d_out = inp["Y"].to(device), inp["P"].to(device), inp["d_out"]
    kinds = {"trained": slice(0, S), "control": slice(S, 2 * S)}
    if "Yc" in inp:
        Yc, Pc = inp["Yc"].to(device), inp["Pc"].to(device)
        d_out = max(d_out, Yc.shape[-1])
        Y = torch.cat([_pad(Y, d_out), _pad(Yc, d_out)[None].expand(S, -1, -1)])
        P = torch.cat([_pad(P, d_out), _pad(Pc, d_out)[None].expand(S, -1, -1)])
        kinds["clip"] = slice(2 * S, 3 * S)
    return Y, P, kinds, d_out


def complexity_unit(cfg: Config, world: World, inp: dict, meta: dict, complexity_masks: torch.Tensor, ci: int,
                    rec: KernelRecord, device) -> tuple[dict, list[dict]]:
    """One complexity fraction: every regressor family × restart of every encoder (one RegressorBank seeded
    cfg.seed + ci). -> ({kind: {family or summary: value at this fraction}}, loss curve rows)."""
    S = len(meta["seeds"])
    Y, P, kinds, d_out = encoder_stack(inp, S, device)
    a, b = inp["a"].to(device), inp["b"].to(device)
    c = meta["complexity_fractions"][ci]
    E = Y.shape[0]
    mean_all = Y.mean(1, keepdim=True)
    ids_all = pair_ids(world, a, b)                                              # (P, 2k)
    out = {kind: {fam: None for fam in FAMILIES} for kind in kinds}
    tr_ids, tr_y, te_ids, te_y, te_a, te_b = [], [], [], [], [], []
    for e in range(E):
        j = e % S
        seen = complexity_masks[ci, j].to(device)
        tr = torch.nonzero(seen[a] & seen[b]).squeeze(1)
        te = torch.nonzero(~seen[a] & ~seen[b]).squeeze(1)
        g = torch.Generator(device=device).manual_seed(cfg.seed + 31 * j + ci)
        tr = tr[torch.randperm(tr.numel(), generator=g, device=device)[: cfg.max_train_scenes]]
        tr_ids.append(ids_all[tr]); tr_y.append(Y[e, tr])
        te_ids.append(ids_all[te]); te_y.append(Y[e, te]); te_a.append(a[te]); te_b.append(b[te])
    R = cfg.reg_restarts                      # slice r·E + e = restart r of encoder e (one bank)
    rep = lambda xs: torch.stack(xs).repeat(R, *([1] * xs[0].dim()))   # noqa: E731
    te_ids_r, te_y_r, mean_r = rep(te_ids), rep(te_y), mean_all.repeat(R, 1, 1)
    bank = RegressorBank(E * R, world.v, d_out, cfg.hidden, cfg.mlp_hidden, cfg.reg_lr,
                         rep(tr_ids), rep(tr_y), seed=cfg.seed + ci,
                         test=(te_ids_r, te_y_r, mean_r), eval_every=max(1, cfg.reg_steps // 8)).to(device)
    make_trainer(cfg.trainer, None, max_steps=cfg.reg_steps).fit(bank, steps_loader(cfg.reg_steps))
    curves = [{"fraction": c, "step": 50 * t, "loss": l} for t, l in enumerate(bank.losses)]
    bank = bank.to(device).eval()
    by_restart = lambda xs: [[xs[r * E + e] for r in range(R)] for e in range(E)]   # noqa: E731
    with torch.no_grad():
        for fam in FAMILIES:
            pred = bank.predict(fam, te_ids_r)
            r2 = by_restart(r2_score(te_y_r, pred, mean_r).tolist())           # ALGO: R² on unseen objects
            pacc = by_restart([probe_accuracy(pred[i:i + 1], P[i % E:i % E + 1], te_a[i % E], te_b[i % E],
                                              world.n_objects, rec, rec.backend)[0] for i in range(E * R)])
            best = by_restart(bank.best_r2[fam].tolist())
            for kind, sl in kinds.items():
                out[kind][fam] = {
                    "r2": [float(np.median(x)) for x in r2[sl]], "r2_restarts": r2[sl],
                    "probe_acc": [float(np.median(x)) for x in pacc[sl]],
                    "best_eval_r2": [float(np.median(x)) for x in best[sl]]}
        true_acc = [probe_accuracy(te_y[e][None], P[e:e + 1], te_a[e], te_b[e], world.n_objects, rec,
                                   rec.backend)[0] for e in range(E)]
        for kind, sl in kinds.items():
            out[kind]["true_probe_acc"] = true_acc[sl]
    for kind, sl in kinds.items():   # best family per seed by final R² (does ANY regressor generalise?)
        fams = [max(FAMILIES, key=lambda fam: out[kind][fam]["r2"][s]) for s in range(S)]
        out[kind]["best_r2"] = [out[kind][f]["r2"][s] for s, f in enumerate(fams)]
        out[kind]["best_probe_acc"] = [out[kind][f]["probe_acc"][s] for s, f in enumerate(fams)]
        out[kind]["best_family"] = fams
    return out, curves


def eval_run(job: tuple) -> dict:
    """One piece of the evaluation (a job of ``jobs.run_jobs``: inputs from its payload): ("complexity", ci) or
    ("coverage", i, j). Each draws only from generators seeded by its own indices, so its result is the same in
    any process and order. -> its result and its kernel call count."""
    p = payload()
    cfg, meta, device = Config.model_validate(p["cfg"]), p["meta"], torch.device(p["device"])
    world = World(meta["k"], meta["v"], meta["n_max"])
    rec = KernelRecord(device)
    if job[0] == "complexity":
        out, curves = complexity_unit(cfg, world, p["complexity"], meta, p["complexity_masks"], job[1], rec, device)
        return {"job": job, "out": out, "curves": curves, "calls": _calls(rec)}
    _, i, j = job
    label = f"{frac_key(meta['train_object_fractions'][i])}_s{meta['seeds'][j]}"
    model = load_model(p["train_dir"], p["kwargs"], world, label, device)
    r = coverage_unit(cfg, world, model, j, p["test_objs"][i, j], p["test_n"][i, j], p["coverage_masks"][i, j], rec,
                      device, parity_inputs=(i, j) == (0, 0))
    return {"job": job, **r, "calls": _calls(rec)}


def run(cfg: Config, ctx: StageContext) -> None:
    torch.set_num_threads(cfg.torch_threads)
    device = pick_device(cfg.device)
    prep = ctx.input("prepare")
    meta = read_json(prep / "meta.json")
    splits = torch.load(prep / "splits.pt")
    world = World(meta["k"], meta["v"], meta["n_max"])
    models = load_models(ctx, world, device)
    d_out = next(iter(models.values())).scene_enc.head.out_features
    rec = KernelRecord(device)
    inp = complexity_inputs(cfg, world, models, meta, device, d_out)
    del models
    fracs, seeds, cfracs = meta["train_object_fractions"], meta["seeds"], meta["complexity_fractions"]
    # independent pieces in a pool, the longest first: one regressor bank per complexity fraction, then one
    # coverage evaluation per (fraction, seed) model
    jobs = [("complexity", ci) for ci in reversed(range(len(cfracs)))]
    jobs += [("coverage", i, j) for i in reversed(range(len(fracs))) for j in range(len(seeds))]
    data = {"cfg": cfg.model_dump(mode="json"), "meta": meta, "device": str(device), "complexity": inp,
            "complexity_masks": splits["complexity_masks"], "coverage_masks": splits["coverage_masks"],
            "test_objs": splits["test_objs"], "test_n": splits["test_n"], "train_dir": str(ctx.input("train")),
            "kwargs": read_json(ctx.input("train") / "models.json")["kwargs"]}
    done = {r["job"]: r for r in run_jobs(eval_run, jobs, data, cfg.workers)}
    for r in done.values():
        rec.count("cosine_soft_ce", r["calls"])
    coverage: dict = {}
    for i, f in enumerate(fracs):                                 # assembled in (fraction, seed) order, as before
        coverage[frac_key(f)] = {k: [done[("coverage", i, j)]["acc"][k] for j in range(len(seeds))]
                                 for k in COVERAGE_KEYS}
    x, qo, labels, s = (t.to(device) for t in done[("coverage", 0, 0)]["parity"])
    rec.parity("cosine_soft_ce", cosine_soft_ce, x, qo, labels, s,
               slice=f"the first 64 held-out test scenes of the {frac_key(fracs[0])} seed-{seeds[0]} model")
    S = len(seeds)
    Y, _, kinds, _ = encoder_stack(inp, S, device)
    complexity: dict = {kind: {fam: {} for fam in FAMILIES} for kind in kinds}
    curves = []
    for ci, c in enumerate(cfracs):
        r = done[("complexity", ci)]
        for kind, d in r["out"].items():
            for key, v in d.items():
                complexity[kind].setdefault(key, {})[frac_key(c)] = v
        curves += r["curves"]
    # additivity: y(a, b) ≈ μ + A_1[a] + A_2[b]
    g = np.random.default_rng(cfg.seed)
    an, bn = inp["a"].numpy(), inp["b"].numpy()
    test_mask = g.random(an.shape[0]) < cfg.additivity_test_fraction
    add = [additivity_r2(Y[e].cpu().double().numpy(), an, bn, world.n_objects, test_mask, cfg.ridge_alpha)
           for e in range(Y.shape[0])]
    complexity["additivity"] = {kind: add[sl] for kind, sl in kinds.items()}
    complexity["encoder_fraction"] = inp["enc_frac"]
    rec.save(ctx.out)
    write_json(ctx.out / "eval.json", {"coverage": coverage, "complexity": complexity, "seeds": meta["seeds"],
                                       "regression_curves": curves})
