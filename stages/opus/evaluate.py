"""evaluate@opus: static OPUS filter (toxic flagging AUROC), sketch fidelity vs ghost-exact, overhead sweep.

    python -m stages evaluate opus           # writes data/opus/evaluate/evaluate.json

1. Static filter: the final model + live AdamW state of each `static_arm` run scores the labelled
   static set once with the OPUS alignment utility η⟨φ(z), ψ⟩ (no redundancy: documents are scored
   independently); a low utility flags a document. AUROC of −U for toxic vs clean target documents
   (and vs every other document).
2. Sketch fidelity: the sketched alignment ⟨Π(P G(z)), Π(ḡ)⟩ against the exact ⟨P G(z), ḡ⟩ computed
   with the ghost identity ⟨G(z), M⟩ = Σ_t b_tᵀ M a_t, and sketched vs ghost-exact Gram entries
   ⟨G(z), G(z')⟩, for several sketch sizes m.
3. Overhead: time of OPUS scoring+selection over N candidates / time of one training step on K = ρN,
   measured for several N and m.
All sketches go through kernels.ghost_countsketch (dispatcher backend from params).
"""
from __future__ import annotations

import copy
import statistics
import time
from typing import Annotated, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, PositiveInt
from sklearn.metrics import roc_auc_score

from stages.common.config import ConfigError, StageConfig
from stages.common.paths import read_json, write_json
from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig
from stages.opus.ghost import capture_linear_grads, ghost_dot, ghost_gram, summed_gradient
from stages.opus.precondition import preconditioner_from_optimizer
from stages.opus.selection import OpusScorer, select_opus
from stages.opus.train import load_tokens


class Config(StageConfig):
    seed: int = 0
    static_arm: str = "opus_adamw"                           # whose checkpoints score the static set
    score_chunk: int = Field(200, ge=1)                      # documents scored per forward/backward
    fidelity_sizes: list[PositiveInt] = Field(default_factory=lambda: [16, 64, 256, 1024, 4096], min_length=1)
    fidelity_docs: int = Field(48, ge=2)                     # documents in the sketched-vs-exact Gram check
    overhead_buffers: list[Annotated[int, Field(ge=2)]] = Field(default_factory=lambda: [16, 32, 64, 128, 256],
                                                                min_length=1)
    overhead_sketch_sizes: list[PositiveInt] = Field(default_factory=lambda: [64, 256, 1024, 4096], min_length=1)
    overhead_reps: int = Field(5, ge=1)
    kernel_backend: Literal["auto", "torch", "triton"] = "auto"



def load_run(path, lr_fallback: float = 3e-3):
    """Model and live optimizer rebuilt from a train checkpoint."""
    ck = torch.load(path, weights_only=False)
    model = TinyTransformer(TinyTransformerConfig(**ck["model_cfg"]))
    model.load_state_dict(ck["model"])
    groups = ck["optimizer"]["param_groups"]
    if ck["arm"]["optimizer"] == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=groups[0].get("lr", lr_fallback))
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=groups[0].get("lr", lr_fallback))
    opt.load_state_dict(ck["optimizer"])
    return model, opt


def static_scores(model, opt, scorer: OpusScorer, docs: torch.Tensor, proxy: torch.Tensor, chunk: int, k: int):
    precond = preconditioner_from_optimizer(opt, scorer.weights(model), "optimizer")
    utils = []
    for i in range(0, len(docs), chunk):
        scored = scorer.score(model, docs[i:i + chunk], proxy, precond)
        utils.append(scored.alignment() / k)  # η⟨φ, ψ⟩ with the per-sample step η = η_opt / K
    return torch.cat(utils), precond.kind


def sketch_fidelity(model, opt, docs, proxy, sizes, backend, seed) -> list[dict]:
    """Sketched vs ghost-exact alignment and Gram entries, per sketch size m."""
    _, cand = capture_linear_grads(model, docs)
    _, prox = capture_linear_grads(model, proxy)
    weights = OpusScorer(model, 1, 0).weights(model)
    precond = preconditioner_from_optimizer(opt, weights, "optimizer")
    exact_align = torch.zeros(len(docs))
    exact_gram = torch.zeros(len(docs), len(docs))
    for name, (a, b) in cand.items():
        g_bar = summed_gradient(*prox[name]) / len(proxy)
        # ALGO: ghost ⟨P G(z), ḡ⟩ = Σ_t b_tᵀ (D ⊙ ḡ) a_t   (no per-sample gradient formed)
        exact_align += ghost_dot(a, b, precond.diag[name] * g_bar)
        exact_gram += ghost_gram(a, b, a, b)  # ⟨G(z), G(z')⟩, P = I
    off = ~torch.eye(len(docs), dtype=torch.bool)
    rows = []
    for m in sizes:
        scorer = OpusScorer(model, m, seed + m, backend)
        identity = preconditioner_from_optimizer(opt, weights, "identity")
        sk = scorer.score(model, docs, proxy, precond)
        sk_id = scorer.score(model, docs, proxy, identity)
        gram = sk_id.phi @ sk_id.phi.T
        rows.append({"m": m, "total_buckets": m * len(scorer.sketches),
                     "align_pearson": float(np.corrcoef(sk.phi @ sk.psi, exact_align)[0, 1]),
                     "gram_pearson": float(np.corrcoef(gram[off], exact_gram[off])[0, 1]),
                     "gram_rel_err": float((gram - exact_gram).norm() / exact_gram.norm())})
    return rows


def _median_time(fn, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def overhead(model, opt, pool, proxy, n: int, m: int, proxy_batch: int, tau: float, reps: int, backend: str,
             gen: torch.Generator) -> dict:
    """Median seconds of OPUS scoring+selection over N vs one AdamW training step on K = N/2."""
    k = max(1, n // 2)
    cand = pool[torch.randint(0, len(pool), (n,), generator=gen)]
    prox = proxy[:proxy_batch]
    scorer = OpusScorer(model, m, 0, backend)

    def score():
        precond = preconditioner_from_optimizer(opt, scorer.weights(model), "optimizer")
        select_opus(scorer.score(model, cand, prox, precond), k, tau, False, gen)

    train_model = copy.deepcopy(model)
    train_opt = torch.optim.AdamW(train_model.parameters(), lr=1e-6)
    batch = cand[:k]

    def step():
        logits = train_model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        train_opt.zero_grad()
        loss.backward()
        train_opt.step()

    precond = preconditioner_from_optimizer(opt, scorer.weights(model), "optimizer")
    scored = scorer.score(model, cand, prox, precond)
    t_capture = _median_time(lambda: (capture_linear_grads(model, cand), capture_linear_grads(model, prox)), reps)
    t_scored = _median_time(lambda: scorer.score(model, cand, prox, precond), reps)
    t_select = _median_time(lambda: select_opus(scored, k, tau, False, gen), reps)
    t_score, t_step = _median_time(score, reps), _median_time(step, reps)
    return {"N": n, "K": k, "m": m, "score_s": t_score, "step_s": t_step, "overhead": t_score / t_step,
            "capture_s": t_capture, "sketch_s": max(t_scored - t_capture, 0.0), "select_s": t_select}


def run(cfg: Config, ctx) -> None:
    torch.set_num_threads(1)
    prep, train = ctx.input("prepare"), ctx.input("train")
    runs = read_json(train / "runs.json")
    k, tau = runs["k"], runs["tau"]
    seeds = sorted({r["seed"] for r in runs["runs"] if r["arm"] == cfg.static_arm})
    if not seeds:
        arms = sorted({r["arm"] for r in runs["runs"]})
        raise ConfigError(f"papers.opus.evaluate.static_arm={cfg.static_arm!r} was not trained (arms: {arms})")
    static_tokens, static_kind = load_tokens(prep / "static", "static")
    proxy = load_tokens(prep / "proxy", "proxy")[0]
    pool = load_tokens(prep / "pool", "pool")[0]
    toxic, target = static_kind == 4, static_kind == 0

    static = []
    for seed in seeds:
        model, opt = load_run(train / "ckpt" / f"{cfg.static_arm}-s{seed}.pt")
        scorer = OpusScorer(model, runs["sketch_size"], seed, cfg.kernel_backend)
        util, kind = static_scores(model, opt, scorer, static_tokens, proxy, cfg.score_chunk, k)
        flag = (-util).numpy()  # low utility -> flagged
        tt = toxic | target
        static.append({"seed": seed, "preconditioner": kind,
                       "auroc_toxic_vs_target": float(roc_auc_score(toxic[tt].numpy(), flag[tt.numpy()])),
                       "auroc_toxic_vs_all": float(roc_auc_score(toxic.numpy(), flag)),
                       "mean_utility_by_kind": {str(i): float(util[static_kind == i].mean())
                                                for i in sorted(set(static_kind.tolist()))}})
        print(f"evaluate@opus: static filter seed {seed}: AUROC toxic vs target "
              f"{static[-1]['auroc_toxic_vs_target']:.3f}, vs all {static[-1]['auroc_toxic_vs_all']:.3f}")

    model, opt = load_run(train / "ckpt" / f"{cfg.static_arm}-s{seeds[0]}.pt")
    gen = torch.Generator().manual_seed(cfg.seed)
    sub = torch.randperm(len(static_tokens), generator=gen)[: cfg.fidelity_docs]
    fidelity = sketch_fidelity(model, opt, static_tokens[sub], proxy, cfg.fidelity_sizes, cfg.kernel_backend, cfg.seed)
    print(f"evaluate@opus: sketch fidelity {[(r['m'], round(r['align_pearson'], 3)) for r in fidelity]}")

    n_default, m_default = runs["buffer_size"], runs["sketch_size"]
    pb = min(16, len(proxy))
    sweep_n = [overhead(model, opt, pool, proxy, n, m_default, pb, tau, cfg.overhead_reps, cfg.kernel_backend, gen)
               for n in cfg.overhead_buffers]
    sweep_m = [overhead(model, opt, pool, proxy, n_default, m, pb, tau, cfg.overhead_reps, cfg.kernel_backend, gen)
               for m in cfg.overhead_sketch_sizes]
    print(f"evaluate@opus: overhead vs N {[(r['N'], round(r['overhead'], 2)) for r in sweep_n]}")
    write_json(ctx.out / "evaluate.json", {"static_arm": cfg.static_arm, "static": static, "fidelity": fidelity,
                                           "overhead_vs_n": sweep_n, "overhead_vs_m": sweep_m,
                                           "kernel_backend": cfg.kernel_backend})
