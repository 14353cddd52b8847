"""OPUS on a Hugging Face causal LM and a real web corpus (issue 41; the ``full`` profile's real path).

Real setting (the paper): a Llama/Qwen-family decoder pre-trained on a web corpus (FineWeb / FineWeb-Edu,
parquet shards) while OPUS picks K of every N candidate documents against a small in-distribution proxy
drawn from the benchmark target set. Here:

* ``load_web_corpus(ref, ...)``: a FineWeb-format file / folder / ``save_to_disk`` folder / hub dataset read
  through ``stages.common.hf.load_records`` (in memory). Schema: the documented FineWeb columns
  (``text`` string, ``id`` string, ``dump``, ``url``, ``date``, ``file_path``, ``language``,
  ``language_score``, ``token_count``); only ``text`` is required (and ``id``, when present, must be a
  string); blank documents are dropped. The same loader reads the proxy / benchmark target set from any
  table with a text column (``text_column``). Errors are one-line ``SourceError``s naming the key.
* ``tokenize_docs``: documents -> right-padded (N, T) ids and attention mask (truncated to T, EOS appended).
* ``capture_hf_linear_grads``: the ghost capture of ``stages.opus.ghost`` on an HF forward
  (``model(input_ids, attention_mask).logits``): per-sample next-token losses over each document's real
  tokens (padding never enters the loss, so padded positions get b = 0) and, for every ``nn.Linear``
  (q/k/v/o, gate/up/down, lm_head), its input a and output gradient b.
* ``score_hf``: φ_r(z) = Π_r(P_r·G_r(z)) through ``kernels.ghost_countsketch`` and ψ_r = Π_r(mean proxy
  gradient), the same ``Scored`` that ``stages.opus.selection.select_opus`` consumes (the paper's utility,
  redundancy penalty and Boltzmann sampling are shared with the toy path, unchanged).
  Tied embeddings (e.g. Qwen2.5-0.5B): ``lm_head`` is scored as a linear layer, so its sketch holds the
  output-side gradient of the shared matrix only (the embedding-lookup side is not an ``nn.Linear``), and the
  AdamW preconditioner of that matrix reads the state of the shared parameter.
* ``train_selected``: the online loop (per step: N candidates from a fixed stream, score, keep K, one
  optimizer step on the K) for an arm (random / high-loss / OPUS with the optimizer's preconditioner).
* ``run_full(cfg, ctx)``: called by train@opus before the toy arms when ``source.kind`` is hf/file (the full
  profile): the arms named in ``hf.arms`` × seeds from the same pretrained checkpoint, target-set validation
  loss curves into ``hf/runs.json`` and the kernel record ``hf/kernels.json`` (evaluate/report do not read
  them yet).
"""
from __future__ import annotations

import copy
import time
from typing import Callable

import torch
import torch.nn.functional as F
from pydantic import Field

from kernels.ghost_countsketch import countsketch, ghost_countsketch
from stages.common.config import StageConfig
from stages.common.hf import load_records
from stages.common.sources import SourceError
from stages.opus.ghost import hooked_linears, summed_gradient
from stages.opus.precondition import Preconditioner, preconditioner_from_optimizer
from stages.opus.selection import OpusScorer, Scored, select_opus, select_random

FINEWEB_COLUMNS = ("text", "id", "dump", "url", "date", "file_path", "language", "language_score", "token_count")


class HFOptions(StageConfig):
    """Options of the real-model path (read only when ``source.kind`` is hf/file)."""
    seq_len: int = Field(512, ge=4, le=131072, description="tokens per document (truncated / right-padded)")
    text_column: str = Field("text", min_length=1, max_length=200)
    proxy_text_column: str = Field("text", min_length=1, max_length=200)
    max_docs: int | None = Field(None, ge=1, le=1_000_000_000, description="read at most this many corpus docs")
    val_docs: int = Field(256, ge=1, le=10_000_000, description="target-set docs held out for validation")
    steps: int | None = Field(None, ge=1, le=1_000_000, description="selection steps per arm of the real path "
                              "(None: trainer.max_steps)")
    micro_batch: int | None = Field(None, ge=1, le=65536, description="documents per forward/backward pass "
                                    "(scoring, training step, evaluation); None: the whole batch at once")
    arms: list[str] = Field(default_factory=lambda: ["random", "high_loss", "opus_adamw"], min_length=1,
                            max_length=64, description="names of train.arms the real path runs (no window / "
                                                       "score_every / combined / vectorized / redundant-pool arm)")


def load_web_corpus(ref: str, *, key: str = "source.dataset", text_column: str = "text", split: str = "train",
                    revision: str | None = None, limit: int | None = None):
    """A web-corpus table (FineWeb schema; only the text column is required) as a ``datasets.Dataset``
    with blank documents dropped. One-line ``SourceError`` on a missing file, unreadable rows, a missing /
    non-string text column, a non-string ``id`` or no non-blank document."""
    ds = load_records(ref, columns={text_column: "string"}, key=key, split=split, revision=revision, limit=limit)
    if "id" in ds.column_names:
        dtype = getattr(ds.features["id"], "dtype", None)
        if dtype not in ("string", "large_string"):
            raise SourceError(f"{key}: {ref} column 'id' is {dtype}, expected string (FineWeb document ids)")
    keep = [i for i, t in enumerate(ds[text_column]) if t is not None and t.strip()]
    if not keep:
        raise SourceError(f"{key}: {ref} has no non-blank document in column {text_column!r}")
    return ds.select(keep, keep_in_memory=True) if len(keep) < len(ds) else ds


def tokenize_docs(texts: list[str], tokenizer, seq_len: int, *, add_eos: bool = True
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, T) right-padded token ids and attention mask; each document truncated to ``seq_len`` tokens
    (EOS appended before truncation). Every row has at least two real tokens (one next-token target)."""
    if tokenizer.pad_token_id is None:
        raise ValueError("tokenize_docs: the tokenizer has no pad token")
    rows = []
    for t in texts:
        r = tokenizer(t, add_special_tokens=False)["input_ids"]
        if add_eos and tokenizer.eos_token_id is not None:
            r = r + [tokenizer.eos_token_id]
        rows.append(r[:seq_len])
    if any(len(r) < 2 for r in rows):
        raise ValueError("tokenize_docs: a document has fewer than two tokens (no next-token target)")
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), T), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, :len(r)] = 1
    return ids, mask


def hf_per_sample_loss(model, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over each document's real targets: (B,)."""
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
    tgt_mask = mask[:, 1:].to(logits.dtype)
    ce = F.cross_entropy(logits.transpose(1, 2).float(), ids[:, 1:], reduction="none")   # (B, T-1)
    return (ce * tgt_mask).sum(1) / tgt_mask.sum(1).clamp_min(1)


def capture_hf_linear_grads(model, ids: torch.Tensor, mask: torch.Tensor
                            ) -> tuple[torch.Tensor, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """Per-sample losses (B,) and {linear layer: (a (B,T,d_in), b = ∂L_z/∂y (B,T,d_out))}: one forward and
    one backward of Σ_z L_z in eval mode (documents do not interact); .grad fields are left untouched."""
    was_training = model.training
    model.eval()
    try:
        with torch.enable_grad(), hooked_linears(model) as (inputs, outputs):
            losses = hf_per_sample_loss(model, ids, mask)
            names = list(outputs)
            grads = torch.autograd.grad(losses.sum(), [outputs[n] for n in names], allow_unused=True)
    finally:
        model.train(was_training)
    out = {}
    for n, g in zip(names, grads):
        a = inputs[n]
        out[n] = (a, torch.zeros(*a.shape[:-1], outputs[n].shape[-1], dtype=a.dtype, device=a.device)
                  if g is None else g.detach())
    return losses.detach(), out


def score_hf(scorer: OpusScorer, model, cand: tuple[torch.Tensor, torch.Tensor],
             proxy: tuple[torch.Tensor, torch.Tensor], precond: Preconditioner,
             sketch_fn: Callable | None = None, backend: str = "auto", chunk: int | None = None) -> Scored:
    """φ of every candidate document and ψ of the proxy batch (OPUS steps 1-4) on an HF model. ``chunk``:
    documents per capture pass (a real vocabulary makes the lm_head output gradient (B, T, V) large; samples
    do not interact, so chunking changes nothing but memory)."""
    sketch = sketch_fn or (lambda *x: ghost_countsketch(*x, backend=backend))
    sketches = scorer.sketches
    n = cand[0].shape[0]
    step = chunk or n
    phi_chunks, losses = [], []
    for i in range(0, n, step):
        loss, c = capture_hf_linear_grads(model, cand[0][i:i + step], cand[1][i:i + step])
        losses.append(loss)
        phis = []
        for name, (hashes, signs) in sketches.items():
            a, b = c.pop(name)
            # ALGO: φ_r(z) = Π_r(P_r G_r(z)), G_r(z) = Σ_t b_t a_tᵀ  (fused kernel, no per-sample gradient)
            phis.append(sketch(a.float(), b.float(), precond.diag[name], hashes, signs, scorer.m))
        phi_chunks.append(torch.cat(phis, 1))
        del c
    np_ = proxy[0].shape[0]
    pstep = chunk or np_
    grad_sum: dict[str, torch.Tensor] = {}
    for i in range(0, np_, pstep):
        _, p = capture_hf_linear_grads(model, proxy[0][i:i + pstep], proxy[1][i:i + pstep])
        for name in sketches:
            pa, pb = p.pop(name)
            g = summed_gradient(pa.float(), pb.float())
            grad_sum[name] = g if name not in grad_sum else grad_sum[name] + g
    # ALGO: ψ_r = Π_r(mean raw proxy gradient)
    psi = torch.cat([countsketch(grad_sum[name] / np_, hashes, signs, scorer.m)
                     for name, (hashes, signs) in sketches.items()])
    return Scored(torch.cat(phi_chunks), psi, precond.eta, torch.cat(losses))


@torch.no_grad()
def eval_loss(model, ids: torch.Tensor, mask: torch.Tensor, batch: int = 64) -> float:
    """Token-weighted next-token loss of the documents (the target-set validation loss)."""
    was = model.training
    model.eval()
    tot, cnt = 0.0, 0.0
    for i in range(0, ids.shape[0], batch):
        x, m = ids[i:i + batch], mask[i:i + batch]
        per = hf_per_sample_loss(model, x, m)
        n = m[:, 1:].sum(1).float()
        tot += float((per * n).sum())
        cnt += float(n.sum())
    model.train(was)
    return tot / max(cnt, 1.0)


def batch_loss(model, ids: torch.Tensor, mask: torch.Tensor, micro_batch: int | None = None,
               backward: bool = False) -> torch.Tensor:
    """Token-weighted mean next-token loss of a batch (what the optimizer steps on), over micro-batches of
    ``micro_batch`` documents (each scaled by its share of the batch's target tokens, so the gradient is
    that of the whole batch); ``backward`` runs each micro-batch's backward at once (bounded memory)."""
    total_tokens = mask[:, 1:].sum().clamp_min(1)
    step = micro_batch or ids.shape[0]
    out = torch.zeros((), device=ids.device)
    for i in range(0, ids.shape[0], step):
        x, m = ids[i:i + step], mask[i:i + step]
        logits = model(input_ids=x, attention_mask=m).logits[:, :-1]
        tgt = torch.where(m[:, 1:] > 0, x[:, 1:], torch.full_like(x[:, 1:], -100))
        part = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tgt.reshape(-1), ignore_index=-100,
                               reduction="sum") / total_tokens
        if backward:
            part.backward()
            part = part.detach()
        out = out + part
    return out


def train_selected(model, arm, pool: tuple[torch.Tensor, torch.Tensor], proxy: tuple[torch.Tensor, torch.Tensor],
                   val: tuple[torch.Tensor, torch.Tensor], *, steps: int, n: int, k: int, seed: int,
                   sketch_size: int, tau: float, eta_scale: float, proxy_batch: int, optimizer: torch.optim.Optimizer,
                   eval_every: int, rec=None, micro_batch: int | None = None) -> dict:
    """The online selection loop of one arm (``arm``: an ArmConfig; selector random / high_loss / opus,
    preconditioner optimizer / identity, sampling boltzmann / greedy, redundancy, standardized)."""
    ids, mask = pool
    if ids.shape[0] < n:
        raise ValueError(f"train_selected: the pool ({ids.shape[0]}) is smaller than the buffer N={n}")
    dev = ids.device
    gen = torch.Generator(device=dev).manual_seed(10_000 + seed)
    stream = torch.cat([torch.randperm(ids.shape[0], generator=torch.Generator().manual_seed(seed))
                        for _ in range(-(-steps * n // ids.shape[0]))])[: steps * n].to(dev)
    scorer = OpusScorer(model, sketch_size, seed) if arm.selector == "opus" else None

    def sketch(*x):
        if rec is None:
            return ghost_countsketch(*x)
        return rec.call("ghost_countsketch", ghost_countsketch, *x)

    curve = [(0, eval_loss(model, *val, batch=micro_batch or 64))]
    picked, precond_kinds, score_s, train_losses = [], {}, 0.0, []
    model.train()
    for step in range(steps):
        idx = stream[step * n:(step + 1) * n]
        cand = (ids[idx], mask[idx])
        t0 = time.perf_counter()
        if arm.selector == "random":
            sel = select_random(n, k, gen)
        elif arm.selector == "high_loss":
            with torch.no_grad():
                was = model.training
                model.eval()
                mb = micro_batch or n
                per = torch.cat([hf_per_sample_loss(model, cand[0][i:i + mb], cand[1][i:i + mb])
                                 for i in range(0, n, mb)])
                sel = torch.topk(per, k).indices
                model.train(was)
        else:
            weights = OpusScorer.weights(model)
            precond = preconditioner_from_optimizer(optimizer, weights, arm.preconditioner)
            precond_kinds[precond.kind] = precond_kinds.get(precond.kind, 0) + 1
            pidx = torch.randperm(proxy[0].shape[0], generator=gen, device=dev)[:proxy_batch]
            scored = score_hf(scorer, model, cand, (proxy[0][pidx], proxy[1][pidx]), precond, sketch_fn=sketch,
                              chunk=micro_batch)
            sel, _ = select_opus(scored, k, tau, arm.sampling == "greedy", gen, eta_scale, arm.redundancy,
                                 arm.standardized)
        score_s += time.perf_counter() - t0
        chosen = idx[sel]
        picked.append(chosen.cpu().tolist())
        optimizer.zero_grad(set_to_none=True)
        loss = batch_loss(model, ids[chosen], mask[chosen], micro_batch, backward=True)
        optimizer.step()
        train_losses.append(float(loss.detach()))
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            curve.append((step + 1, eval_loss(model, *val, batch=micro_batch or 64)))
    return {"arm": arm.name, "seed": seed, "val_curve": curve, "final_val_loss": curve[-1][1],
            "train_losses": train_losses, "picked": picked, "precond_kinds": precond_kinds,
            "score_s_total": score_s, "update_tokens": int(sum(int(mask[p].sum()) for p in picked))}


def check_real_config(cfg) -> list:
    """The real path's keys (config load, before any work): a corpus, a target set, and ``hf.arms`` naming
    arms of ``train.arms`` the real path can run. Returns those arms; raises ValueError("<key>: ...")."""
    if cfg.source.dataset is None:
        raise ValueError("source.dataset: the web corpus (e.g. a FineWeb-Edu parquet shard) is missing")
    if cfg.proxy_source.kind == "toy" or cfg.proxy_source.dataset is None:
        raise ValueError("proxy_source.dataset: the benchmark target set (proxy + validation) is missing")
    by_name = {a.name: a for a in cfg.arms}
    missing = [a for a in cfg.hf.arms if a not in by_name]
    if missing:
        raise ValueError(f"hf.arms: {missing} are not in arms ({', '.join(by_name)})")
    arms = [by_name[a] for a in cfg.hf.arms]
    for arm in arms:
        if arm.window is not None or arm.score_every != 1 or arm.combined or arm.vectorized or arm.pool != "main":
            raise ValueError(f"hf.arms: {arm.name} uses window/score_every/combined/vectorized/the redundant pool, "
                             "which the real path does not run")
    return arms


def run_full(cfg, ctx) -> None:
    """train@opus with a real source: ``cfg.source`` (hf/file: the model and the web corpus) and
    ``cfg.proxy_source`` (the benchmark target set: proxy + held-out validation docs)."""
    from kernels.record import KernelRecord
    from stages.common.device import pick_device
    from stages.common.hf import pretrained_causal_lm, source_tokenizer
    from stages.common.paths import write_json

    key = "papers.opus.train"
    src, psrc, o = cfg.source, cfg.proxy_source, cfg.hf
    device = pick_device(cfg.device)
    tok = source_tokenizer(src, f"{key}.source")
    base = pretrained_causal_lm(src, key=f"{key}.source").to(device)
    corpus = load_web_corpus(src.dataset, key=f"{key}.source.dataset", text_column=o.text_column, split=src.split,
                             revision=src.revision, limit=o.max_docs)
    target = load_web_corpus(psrc.dataset, key=f"{key}.proxy_source.dataset", text_column=o.proxy_text_column,
                             split=psrc.split, revision=psrc.revision)
    if len(target) <= o.val_docs:
        raise SourceError(f"{key}.hf.val_docs: {o.val_docs} held-out docs leave no proxy in "
                          f"{psrc.dataset} ({len(target)} docs)")
    pool = tuple(t.to(device) for t in tokenize_docs(corpus[o.text_column], tok, o.seq_len))
    tgt = tokenize_docs(target[o.proxy_text_column], tok, o.seq_len)
    val = (tgt[0][:o.val_docs].to(device), tgt[1][:o.val_docs].to(device))
    proxy = (tgt[0][o.val_docs:].to(device), tgt[1][o.val_docs:].to(device))
    arms = check_real_config(cfg)
    rec = KernelRecord(device)
    runs = []
    for seed in cfg.seeds:
        for arm in arms:
            torch.manual_seed(seed)
            model = copy.deepcopy(base).train()
            if arm.optimizer == "sgd":
                opt = torch.optim.SGD(model.parameters(), lr=cfg.sgd_lr)
            else:
                opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                                        weight_decay=cfg.weight_decay)
            print(f"train@opus (real source): arm={arm.name} seed={seed}")
            runs.append(train_selected(model, arm, pool, proxy, val, steps=o.steps or cfg.trainer.max_steps,
                                       n=cfg.buffer_size,
                                       k=cfg.k, seed=seed, sketch_size=cfg.sketch_size, tau=cfg.tau,
                                       eta_scale=cfg.eta_scale, proxy_batch=cfg.proxy_batch, optimizer=opt,
                                       eval_every=cfg.eval_every, rec=rec, micro_batch=o.micro_batch))
            del model, opt
    out = ctx.out / "hf"
    out.mkdir(parents=True, exist_ok=True)
    rec.save(out)
    write_json(out / "runs.json", {"source": src.model_dump(mode="json"),
                                          "proxy_source": psrc.model_dump(mode="json"), "k": cfg.k,
                                          "buffer_size": cfg.buffer_size, "sketch_size": cfg.sketch_size,
                                          "corpus_docs": len(corpus), "target_docs": len(target),
                                          "device": str(device), "runs": runs})
