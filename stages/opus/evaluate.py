"""evaluate@opus: static filters on the whole pool, sketch fidelity, overhead in FLOPs and time.

    python -m stages evaluate opus           # writes data/opus/evaluate/{evaluate.json, kernels.json}

1. Static filter. The final `static_arm` model + live optimizer state of each seed scores documents
   once with the OPUS alignment utility η⟨φ(z), ψ⟩ (no redundancy: documents are independent); a
   low utility flags a document. Populations: (a) a random sample of the training pool itself (all
   candidates, every kind at its pool share: what a user filtering a contaminated corpus sees) and
   (b) clean target vs toxic documents only (the static set). Baselines on the same documents:
   per-document loss under the same model (high loss flagged: perplexity filtering) and the
   trigger-n-gram count (the oracle that knows the contamination).
2. Sketch fidelity: sketched vs ghost-exact alignment and Gram entries for several sketch sizes m.
3. Overhead per cost variant (full scoring; one combined capture; W-token windows; scoring every k
   steps; on-device selection; all together): matmul FLOPs counted by torch's FlopCounterMode for
   the scoring of one trained step (amortised over k steps) against one training step on K, the
   scored-to-trained token ratio, and median wall-clock times (runtime fields, never claims).
   Also a timing sweep over the buffer size N and the sketch size m.
"""
from __future__ import annotations

import copy
import statistics
import time
from typing import Annotated

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, field_validator
from sklearn.metrics import roc_auc_score
from torch.utils.flop_counter import FlopCounterMode

from kernels.ghost_countsketch import ghost_countsketch
from kernels.record import KernelRecord
from stages.common.config import ConfigError, PositiveInt, Seed, StageConfig, unique_items
from stages.common.device import DeviceName, pick_device
from stages.common.paths import read_json, write_json
from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig
from stages.opus.ghost import capture_linear_grads, ghost_dot, ghost_gram, per_sample_loss, summed_gradient
from stages.opus.precondition import preconditioner_from_optimizer
from stages.opus.selection import OpusScorer, select_opus
from stages.opus.train import load_tokens

Size = Annotated[int, Field(ge=2, le=1 << 20)]

# cost variants of the scorer: (name, combined, window, score_every, vectorized); window None = whole sequence
VARIANTS = [("full", False, None, 1, False), ("combined", True, None, 1, False), ("window16", False, 16, 1, False),
            ("every4", False, None, 4, False), ("vectorized", False, None, 1, True), ("cheap", True, 16, 4, True)]
# the trained arm whose selections each variant reproduces (combined / vectorized change no selection math)
VARIANT_ARM = {"full": "opus_adamw", "combined": "opus_adamw", "window16": "opus_window", "every4": "opus_every4",
               "vectorized": "opus_adamw", "cheap": "opus_cheap"}


class Config(StageConfig):
    seed: Seed = 0
    static_arm: str = Field("opus_adamw", min_length=1)    # whose checkpoints score the static sets
    filter_docs: int = Field(2000, ge=20, le=10_000_000)   # pool documents in the all-candidates filter
    score_chunk: int = Field(200, ge=1, le=1 << 20)        # documents scored per forward/backward
    fidelity_sizes: list[PositiveInt] = Field(default_factory=lambda: [16, 64, 256, 1024, 4096], min_length=1,
                                              max_length=16)
    fidelity_docs: int = Field(48, ge=2, le=4096)          # documents in the sketched-vs-exact Gram check
    overhead_buffers: list[Size] = Field(default_factory=lambda: [16, 64, 256], min_length=1, max_length=16)
    overhead_sketch_sizes: list[PositiveInt] = Field(default_factory=lambda: [64, 1024, 4096], min_length=1,
                                                     max_length=16)
    overhead_reps: int = Field(3, ge=1, le=100)
    parity_docs: int = Field(3, ge=1, le=64)               # real documents in the Triton parity slice
    device: DeviceName = "auto"

    @field_validator("fidelity_sizes", "overhead_buffers", "overhead_sketch_sizes")
    @classmethod
    def _distinct(cls, v, info):
        return unique_items(v, info.field_name)


def load_run(path, device):
    """Model and live optimizer rebuilt from a train checkpoint, on `device`."""
    ck = torch.load(path, weights_only=False, map_location=device)
    model = TinyTransformer(TinyTransformerConfig(**ck["model_cfg"])).to(device)
    model.load_state_dict(ck["model"])
    groups = ck["optimizer"]["param_groups"]
    if ck["arm"]["optimizer"] == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=groups[0]["lr"])
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=groups[0]["lr"])
    opt.load_state_dict(ck["optimizer"])
    return model, opt


def static_utility(model, opt, scorer: OpusScorer, docs, proxy, chunk: int, k: int, rec: KernelRecord):
    """η⟨φ(z), ψ⟩ per document (η = η_opt / K, the per-sample step of training) and its loss."""
    precond = preconditioner_from_optimizer(opt, scorer.weights(model), "optimizer")
    utils, losses = [], []
    sketch = lambda *x: rec.call("ghost_countsketch", ghost_countsketch, *x)  # noqa: E731
    for i in range(0, len(docs), chunk):
        scored = scorer.score(model, docs[i:i + chunk], proxy, precond, sketch_fn=sketch)
        utils.append(scored.alignment() / k)
        losses.append(scored.losses)
    return torch.cat(utils).cpu(), torch.cat(losses).cpu(), precond.kind


def trigger_count(docs: torch.Tensor, trigger: list[int]) -> torch.Tensor:
    """Occurrences of the trigger n-gram in each document (the contamination oracle)."""
    n = len(trigger)
    win = docs.unfold(1, n, 1)  # (B, T-n+1, n)
    return (win == torch.tensor(trigger, device=docs.device)).all(-1).sum(1)


def aurocs(is_toxic: np.ndarray, scores: dict[str, np.ndarray]) -> dict[str, float]:
    return {name: float(roc_auc_score(is_toxic, s)) for name, s in scores.items()}


def sketch_fidelity(model, opt, docs, proxy, sizes, seed) -> list[dict]:
    """Sketched vs ghost-exact alignment and Gram entries, per sketch size m."""
    _, cand = capture_linear_grads(model, docs)
    _, prox = capture_linear_grads(model, proxy)
    weights = OpusScorer.weights(model)
    precond = preconditioner_from_optimizer(opt, weights, "optimizer")
    identity = preconditioner_from_optimizer(opt, weights, "identity")
    dev = docs.device
    exact_align = torch.zeros(len(docs), device=dev)
    exact_gram = torch.zeros(len(docs), len(docs), device=dev)
    for name, (a, b) in cand.items():
        g_bar = summed_gradient(*prox[name]) / len(proxy)
        # ALGO: ghost ⟨P G(z), ḡ⟩ = Σ_t b_tᵀ (D ⊙ ḡ) a_t   (no per-sample gradient formed)
        exact_align += ghost_dot(a, b, precond.diag[name] * g_bar)
        exact_gram += ghost_gram(a, b, a, b)  # ⟨G(z), G(z')⟩, P = I
    off = ~torch.eye(len(docs), dtype=torch.bool, device=dev)
    rows = []
    for m in sizes:
        scorer = OpusScorer(model, m, seed + m)
        sk = scorer.score(model, docs, proxy, precond, backend="torch")
        sk_id = scorer.score(model, docs, proxy, identity, backend="torch")
        gram = sk_id.phi @ sk_id.phi.T
        rows.append({"m": m, "total_buckets": m * len(scorer.layer_names),
                     "align_pearson": float(np.corrcoef((sk.phi @ sk.psi).cpu(), exact_align.cpu())[0, 1]),
                     "gram_pearson": float(np.corrcoef(gram[off].cpu(), exact_gram[off].cpu())[0, 1]),
                     "gram_rel_err": float((gram - exact_gram).norm() / exact_gram.norm())})
    return rows


def _median_time(fn, reps: int, device) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _flops(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def variant_cost(model, opt, pool, proxy, n: int, m: int, proxy_batch: int, tau: float, reps: int,
                 gen: torch.Generator, combined=False, window=None, every=1, vectorized=False,
                 backend: str = "torch") -> dict:
    """Scoring + selection cost of ONE trained step (amortised over `every` steps) against one
    AdamW training step on K = N/2: matmul FLOPs (counted), tokens, median seconds."""
    k = max(1, n // 2)
    dev = pool.device
    cand = pool[torch.randint(0, len(pool), (n * every,), generator=gen, device=dev)]
    prox = proxy[:proxy_batch]
    seq = pool.shape[1]
    scorer = OpusScorer(model, m, 0).to(dev)

    def score():
        precond = preconditioner_from_optimizer(opt, scorer.weights(model), "optimizer")
        scored = scorer.score(model, cand, prox, precond, backend=backend, combined=combined, window=window,
                              generator=gen)
        select_opus(scored, k * every, tau, False, gen, vectorized=vectorized)

    train_model = copy.deepcopy(model)
    train_opt = torch.optim.AdamW(train_model.parameters(), lr=1e-6)
    batch = cand[:k]

    def step():
        logits = train_model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        train_opt.zero_grad()
        loss.backward()
        train_opt.step()

    w = min(window or seq, seq)
    score_flops, step_flops = _flops(score) / every, _flops(step)
    t_score, t_step = _median_time(score, reps, dev) / every, _median_time(step, reps, dev)
    return {"N": n, "K": k, "m": m, "every": every, "window": w, "combined": combined, "vectorized": vectorized,
            "score_flops": score_flops, "step_flops": step_flops, "flop_overhead": score_flops / step_flops,
            "scored_per_trained_token": (n * every + proxy_batch) * (w - 1) / every / (k * (seq - 1)),
            "score_s": t_score, "step_s": t_step, "time_overhead": t_score / t_step}


def run(cfg: Config, ctx) -> None:
    torch.set_num_threads(1)
    device = pick_device(cfg.device)
    rec = KernelRecord(device)
    prep, train = ctx.input("prepare"), ctx.input("train")
    runs = read_json(train / "runs.json")
    corpus = read_json(prep / "corpus.json")
    k, tau = runs["k"], runs["tau"]
    seeds = sorted({r["seed"] for r in runs["runs"] if r["arm"] == cfg.static_arm})
    if not seeds:
        arms = sorted({r["arm"] for r in runs["runs"]})
        raise ConfigError(f"papers.opus.evaluate.static_arm={cfg.static_arm!r} was not trained (arms: {arms})")
    static_tokens, static_kind = load_tokens(prep / "static", "static")
    proxy = load_tokens(prep / "proxy", "proxy")[0].to(device)
    pool, pool_kind = load_tokens(prep / "pool", "pool")
    gen_cpu = torch.Generator().manual_seed(cfg.seed)
    sample = torch.randperm(len(pool), generator=gen_cpu)[: cfg.filter_docs]
    populations = {"pool": (pool[sample].to(device), pool_kind[sample]),  # all candidates, pool shares
                   "target_only": (static_tokens[(static_kind == 0) | (static_kind == 4)].to(device),
                                   static_kind[(static_kind == 0) | (static_kind == 4)])}
    trigger = corpus["trigger"]

    static = []
    for seed in seeds:
        model, opt = load_run(train / "ckpt" / f"{cfg.static_arm}-s{seed}.pt", device)
        scorer = OpusScorer(model, runs["sketch_size"], seed).to(device)
        row = {"seed": seed}
        for pop, (docs, kinds) in populations.items():
            util, loss, kind = static_utility(model, opt, scorer, docs, proxy, cfg.score_chunk, k, rec)
            toxic = (kinds == 4).numpy()
            row[pop] = aurocs(toxic, {"opus": (-util).numpy(), "loss": loss.numpy(),
                                      "trigger": trigger_count(docs, trigger).cpu().numpy().astype(float)})
            row[pop]["mean_utility_by_kind"] = {str(i): float(util[kinds == i].mean()) for i in sorted(set(kinds.tolist()))}
            row["preconditioner"] = kind
        static.append(row)
        print(f"evaluate@opus: static filter seed {seed}: pool AUROC {row['pool']}, target-only {row['target_only']}")

    model, opt = load_run(train / "ckpt" / f"{cfg.static_arm}-s{seeds[0]}.pt", device)
    # Triton parity on a slice of the real inputs (the first documents of the pool sample, live AdamW D)
    scorer = OpusScorer(model, runs["sketch_size"], seeds[0]).to(device)
    precond = preconditioner_from_optimizer(opt, scorer.weights(model), "optimizer")
    _, cap = capture_linear_grads(model, populations["pool"][0][: cfg.parity_docs])
    for name, (h, s_) in scorer.sketches.items():
        a, b = cap[name]
        rec.parity("ghost_countsketch", ghost_countsketch, a, b, precond.diag[name], h, s_, scorer.m,
                   slice=f"every linear layer's captured activations/output grads of the first {cfg.parity_docs} "
                         f"pool-sample documents, live AdamW preconditioner of {cfg.static_arm} seed {seeds[0]}, "
                         f"m = {scorer.m}")

    sub = torch.randperm(len(static_tokens), generator=gen_cpu)[: cfg.fidelity_docs]
    fidelity = sketch_fidelity(model, opt, static_tokens[sub].to(device), proxy, cfg.fidelity_sizes, cfg.seed)
    print(f"evaluate@opus: sketch fidelity {[(r['m'], round(r['align_pearson'], 3)) for r in fidelity]}")

    pool_dev = pool.to(device)
    n_default, m_default = runs["buffer_size"], runs["sketch_size"]
    pb = min(runs["proxy_batch"], len(proxy))
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    variants = []
    for name, combined, window, every, vectorized in VARIANTS:
        row = variant_cost(model, opt, pool_dev, proxy, n_default, m_default, pb, tau, cfg.overhead_reps, gen,
                           combined, window, every, vectorized)
        variants.append({"variant": name, "arm": VARIANT_ARM[name], **row})
    print(f"evaluate@opus: FLOP overhead per variant {[(v['variant'], round(v['flop_overhead'], 2)) for v in variants]}")
    sweep_n = [variant_cost(model, opt, pool_dev, proxy, n, m_default, pb, tau, cfg.overhead_reps, gen)
               for n in cfg.overhead_buffers]
    sweep_m = [variant_cost(model, opt, pool_dev, proxy, n_default, m, pb, tau, cfg.overhead_reps, gen)
               for m in cfg.overhead_sketch_sizes]
    rec.save(ctx.out)
    write_json(ctx.out / "evaluate.json", {"static_arm": cfg.static_arm, "filter_docs": int(len(sample)),
                                           "static": static, "fidelity": fidelity, "variants": variants,
                                           "overhead_vs_n": sweep_n, "overhead_vs_m": sweep_m,
                                           "device": str(device)})
