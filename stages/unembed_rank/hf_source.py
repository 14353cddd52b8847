"""Unembedding geometry of real Hugging Face causal LMs, and the training sweep on a real text corpus
(issue 41; the ``full`` profile's real path).

Real setting (the paper): a family of OLMo/Pythia-style checkpoints at several sizes, their unembedding
W_U (``lm_head``, or the input embedding when tied) and their in-domain (Pile) / out-of-domain (Paloma,
Dolma code) losses; and a controlled sweep (batch size × weight decay × lr × seed at an equal token budget)
on a real corpus. Here:

* ``unembedding(model)``: W_U (V, C) of any HF causal LM (``get_output_embeddings().weight``; tied models
  give the input embedding, flagged) restricted to the tokenizer's rows (vocabularies padded for speed, e.g.
  Pythia's 50304 for 50277 tokens, carry never-trained rows that would distort the spectrum).
* ``load_text_tokens(ref, tok, n_tokens)``: a text table (jsonl / parquet / ``save_to_disk`` folder / hub
  dataset with a ``text`` column — the Pile-10K and Paloma layouts) through ``stages.common.hf.load_records``,
  tokenised document by document with EOS between documents; one-line ``SourceError``s.
* ``checkpoint_row(model, tok, val, ood)``: erank(W_U) (σ and σ² variants), cosine, isotropy, the same of the
  final-layer last-token representations H, and the ID / OOD next-token loss through the fused linear +
  cross-entropy kernel (``kernels.fused_linear_ce``) on the decoder's last hidden states and W_U.
* ``sweep(...)``: the grid of train@unembed_rank on a tiny OLMo-style HF Llama (untied, SwiGLU, RMSNorm, RoPE)
  over the real tokens: AdamW with weight decay on 2-D weights except the input embedding, the OLMo warm-up +
  cosine schedule (``stages.unembed_rank.lm.lr_lambda``), the same seeded windows for every weight decay,
  token-aligned evaluations of the geometry and ID / OOD loss (history rows in the toy's columns).
* ``run_full_train`` / ``run_full_evaluate``: the hooks (when ``source.kind`` is hf/file) writing
  ``train/hf/{history.csv, runs.json, kernels.json}`` and ``evaluate/hf/{checkpoints.json, kernels.json}``.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from pydantic import Field

from kernels.fused_linear_ce import linear_cross_entropy, linear_cross_entropy_stats
from stages.common.config import StageConfig
from stages.common.hf import TinyLMConfig, load_records, source_tokenizer, tiny_causal_lm
from stages.common.sources import SourceConfig, SourceError
from stages.unembed_rank.geometry import erank_pct, isotropy
from stages.unembed_rank.lm import KERNEL, eval_windows, lr_lambda


class HFSweepOptions(StageConfig):
    """Real-corpus options (read only when ``source.kind`` is hf/file)."""
    text_column: str = Field("text", min_length=1, max_length=200)
    train_tokens: int = Field(50_000_000, ge=100, le=10_000_000_000, description="corpus tokens read for training")
    eval_tokens: int = Field(1_000_000, ge=10, le=1_000_000_000, description="tokens read for each of ID val / OOD")


def mean_cosine_rows(w: torch.Tensor) -> float:
    """Mean cosine similarity over distinct row pairs without the (V, V) Gram matrix (a real vocabulary of
    50k-150k rows would need 20-180 GB): for unit rows x_i, Σ_{i≠j} x_i·x_j = ‖Σ_i x_i‖² − Σ_i ‖x_i‖².
    Equals ``stages.unembed_rank.geometry.mean_cosine`` (the toy's Gram-matrix version) up to rounding."""
    x = torch.nn.functional.normalize(w.detach().double(), dim=-1)
    n = x.shape[0]
    total = x.sum(0)
    return float(((total @ total) - (x * x).sum()) / (n * (n - 1)))


def geometry_large(w: torch.Tensor, h: torch.Tensor | None = None) -> dict[str, float]:
    """``stages.unembed_rank.geometry.geometry`` for real vocabulary sizes (the same metrics and keys; the
    mean cosine without the Gram matrix)."""
    out = {"erank": erank_pct(w), "erank_sq": erank_pct(w, "sigma2"), "cosine": mean_cosine_rows(w),
           "isotropy": isotropy(w)}
    if h is not None:
        out.update({"h_erank": erank_pct(h), "h_erank_sq": erank_pct(h, "sigma2"), "h_cosine": mean_cosine_rows(h),
                    "h_isotropy": isotropy(h)})
    return out


def unembedding(model, vocab_rows: int | None = None) -> tuple[torch.Tensor, bool]:
    """(W_U restricted to the first ``vocab_rows`` rows, tied-to-the-input-embedding flag)."""
    out = model.get_output_embeddings()
    if out is None:
        raise SourceError("source.model: the model has no output embedding (not a causal LM head)")
    w = out.weight
    inp = model.get_input_embeddings()
    tied = inp is not None and inp.weight.data_ptr() == w.data_ptr()
    if vocab_rows is not None:
        if vocab_rows > w.shape[0]:
            raise SourceError(f"source.tokenizer: {vocab_rows} tokens but the model's W_U has {w.shape[0]} rows")
        w = w[:vocab_rows]
    return w, tied


def load_text_tokens(ref: str, tok, n_tokens: int, *, column: str = "text", key: str = "source.dataset",
                     split: str = "train", revision: str | None = None) -> np.ndarray:
    """The first ``n_tokens`` tokens of the table's documents (in file order, EOS after each): int64 array.
    Fewer tokens in the whole table is an error naming the key."""
    ds = load_records(ref, columns={column: "string"}, key=key, split=split, revision=revision)
    eos = tok.eos_token_id
    ids: list[int] = []
    for text in ds[column]:
        if not text:
            continue
        ids.extend(tok(text, add_special_tokens=False)["input_ids"])
        if eos is not None:
            ids.append(eos)
        if len(ids) >= n_tokens:
            break
    if len(ids) < n_tokens:
        raise SourceError(f"{key}: {ref} holds {len(ids)} tokens in column {column!r}, fewer than the "
                          f"{n_tokens} asked for")
    return np.asarray(ids[:n_tokens], dtype=np.int64)


def _decoder(model):
    return getattr(model, model.base_model_prefix, None) or model.base_model


@torch.no_grad()
def eval_loss_hf(model, windows: torch.Tensor, rec, w: torch.Tensor | None = None,
                 chunk: int = 32) -> tuple[float, torch.Tensor]:
    """Mean next-token loss over (n, T+1) windows through the fused kernel; also the last-token reps H."""
    w = model.get_output_embeddings().weight if w is None else w
    base = _decoder(model)
    total, count, last = 0.0, 0, []
    for i in range(0, windows.shape[0], chunk):
        x = windows[i:i + chunk].to(w.device)
        h = base(input_ids=x[:, :-1]).last_hidden_state
        loss, _ = rec.call(KERNEL, linear_cross_entropy_stats, h.reshape(-1, h.shape[-1]).float().contiguous(),
                           w.float(), x[:, 1:].reshape(-1))
        total += float(loss.sum())
        count += loss.numel()
        last.append(h[:, -1].float())
    return total / count, torch.cat(last)


def checkpoint_row(model, tok, val: torch.Tensor, ood: torch.Tensor, rec) -> dict[str, Any]:
    """Geometry of W_U and H and the ID / OOD losses of one checkpoint."""
    model.eval()
    w, tied = unembedding(model, len(tok))
    val_loss, h = eval_loss_hf(model, val, rec)
    ood_loss, _ = eval_loss_hf(model, ood, rec)
    full_w = model.get_output_embeddings().weight
    return {"val_loss": val_loss, "ood_loss": ood_loss, "tied": tied, "vocab_rows": int(w.shape[0]),
            "padded_rows": int(full_w.shape[0] - w.shape[0]), "d_model": int(w.shape[1]),
            "params": int(sum(p.numel() for p in model.parameters())), **geometry_large(w.float(), h)}


def olmo_tiny(d_model: int, n_layers: int, n_heads: int, seq_len: int, vocab: int, seed: int, tok=None):
    """The sweep's model: an untied Llama (SwiGLU, RMSNorm, RoPE, no biases) from config, seeded."""
    cfg = TinyLMConfig(arch="llama", d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                       d_ff=4 * d_model, max_positions=max(8, seq_len), tie_embeddings=False)
    ids = {} if tok is None else dict(pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                                      eos_token_id=tok.eos_token_id)
    return tiny_causal_lm(cfg, vocab, seed=seed, **ids)


def sweep(train: torch.Tensor, val: torch.Tensor, ood: torch.Tensor, grid: list[dict], *, tokens: int,
          seq_len: int, d_model: int, n_layers: int, n_heads: int, vocab: int, n_evals: int, warmup_frac: float,
          final_lr_frac: float, rec, tok=None, device: str | torch.device = "cpu") -> tuple[list[dict], list[dict]]:
    """Train one tiny HF model per grid cell at the same token budget; returns (history rows, runs)."""
    history, runs = [], []
    for spec in grid:
        bs, wd, lr, seed = spec["batch_size"], spec["weight_decay"], spec["lr"], spec["seed"]
        name = f"bs{bs}_wd{wd:g}_lr{lr:g}_s{seed}"
        steps = tokens // (bs * seq_len)
        if steps < 1:
            raise ValueError(f"sweep: tokens {tokens} < one batch of {bs} × {seq_len}")
        evals = sorted({max(1, round(steps * (i + 1) / n_evals)) for i in range(n_evals)})
        model = olmo_tiny(d_model, n_layers, n_heads, seq_len, vocab, seed, tok).to(device).train()
        decay, no_decay = [], []
        emb = model.get_input_embeddings().weight
        for p in model.parameters():
            (decay if p.ndim >= 2 and p is not emb else no_decay).append(p)
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
                                lr=lr, betas=(0.9, 0.95), eps=1e-8)
        warm = max(1, round(warmup_frac * steps))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_lambda(s, steps, warm, final_lr_frac))
        gen = torch.Generator().manual_seed(10_000 + seed)   # the same windows for every weight decay
        offsets = torch.randint(0, train.numel() - seq_len - 1, (steps, bs), generator=gen)
        base, w_u = _decoder(model), model.get_output_embeddings().weight
        tr_sum, tr_n = 0.0, 0

        def evaluate(step):
            nonlocal tr_sum, tr_n
            model.eval()
            v, h = eval_loss_hf(model, val, rec)
            o, _ = eval_loss_hf(model, ood, rec)
            history.append({"run": name, **spec, "step": step, "tokens": step * bs * seq_len, "frac": step / steps,
                            "train_loss": tr_sum / tr_n if tr_n else None, "val_loss": v, "ood_loss": o,
                            **geometry_large(w_u, h)})
            tr_sum, tr_n = 0.0, 0
            model.train()

        evaluate(0)
        for step in range(steps):
            batch = train[offsets[step][:, None] + torch.arange(seq_len + 1)].to(device)
            h = base(input_ids=batch[:, :-1]).last_hidden_state
            rec.count(KERNEL)
            loss = linear_cross_entropy(h.reshape(-1, h.shape[-1]), w_u, batch[:, 1:].reshape(-1),
                                        backend=rec.backend)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            tr_sum += float(loss.detach())
            tr_n += 1
            if step + 1 in evals:
                evaluate(step + 1)
        runs.append({"name": name, **spec, "steps": steps, "tokens": steps * bs * seq_len})
    return history, runs


def check_train_sources(cfg) -> None:
    """Config load: a real sweep needs an ID corpus, an OOD corpus and a tokenizer."""
    if cfg.source.dataset is None:
        raise ValueError("source.dataset: the real sweep's in-domain corpus (a text table) is missing")
    if cfg.source.tokenizer is None and cfg.source.model is None:
        raise ValueError("source.tokenizer: the real sweep needs a tokenizer (or a model whose tokenizer to use)")
    if cfg.ood_source.kind == "toy" or cfg.ood_source.dataset is None:
        raise ValueError("ood_source.dataset: the real sweep's out-of-domain corpus is missing")


def check_evaluate_sources(cfg) -> None:
    """Config load: checkpoints need both evaluation corpora; each checkpoint is a real model."""
    if not cfg.checkpoints:
        for k in ("eval_source", "ood_source"):
            if getattr(cfg, k).kind != "toy":
                raise ValueError(f"{k}: only read with checkpoints (none are named)")
        return
    for name, src in cfg.checkpoints.items():
        if src.kind == "toy" or src.model is None:
            raise ValueError(f"checkpoints.{name}: a checkpoint is a model (kind hf or file with model)")
    for k in ("eval_source", "ood_source"):
        if getattr(cfg, k).kind == "toy" or getattr(cfg, k).dataset is None:
            raise ValueError(f"{k}.dataset: the checkpoints' {k.split('_')[0]} corpus (a text table) is missing")


def run_full_train(cfg, ctx) -> None:
    """train@unembed_rank's real path: the grid of ``cfg`` on the real corpus (``source.dataset``, ID) and
    ``ood_source.dataset`` (OOD), tokenised with ``source.tokenizer`` (or ``source.model``'s)."""
    import polars as pl

    from kernels.record import KernelRecord
    from stages.common.paths import write_json
    from stages.unembed_rank.train import grid

    key = "papers.unembed_rank.train"
    src, osrc, o, T = cfg.source, cfg.ood_source, cfg.hf, cfg.model.seq_len
    tok = source_tokenizer(src, f"{key}.source")
    ids = load_text_tokens(src.dataset, tok, o.train_tokens + o.eval_tokens, column=o.text_column,
                           key=f"{key}.source.dataset", split=src.split, revision=src.revision)
    ood_ids = load_text_tokens(osrc.dataset, tok, o.eval_tokens, column=o.text_column,
                               key=f"{key}.ood_source.dataset", split=osrc.split, revision=osrc.revision)
    train = torch.from_numpy(ids[:o.train_tokens])
    val = eval_windows(torch.from_numpy(ids[o.train_tokens:]), T, cfg.eval_windows)
    ood = eval_windows(torch.from_numpy(ood_ids), T, cfg.eval_windows)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rec = KernelRecord(device)
    m = cfg.model
    history, runs = sweep(train, val, ood, grid(cfg), tokens=cfg.tokens, seq_len=T, d_model=m.d_model,
                          n_layers=m.n_layers, n_heads=m.n_heads, vocab=len(tok), n_evals=cfg.n_evals,
                          warmup_frac=cfg.warmup_frac, final_lr_frac=cfg.final_lr_fracs[0], rec=rec, tok=tok,
                          device=device)
    out = ctx.out / "hf"
    out.mkdir(parents=True, exist_ok=True)
    pl.DataFrame(history, infer_schema_length=None).write_csv(out / "history.csv")
    write_json(out / "runs.json", {"source": src.model_dump(mode="json"), "ood_source": osrc.model_dump(mode="json"),
                                   "vocab_size": len(tok), "seq_len": T, "tokens": cfg.tokens, "runs": runs})
    rec.save(out)


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman rank correlation (average ranks for ties); NaN below 3 points or with a constant side."""
    if len(x) < 3:
        return float("nan")
    from scipy.stats import spearmanr

    r = spearmanr(x, y).statistic
    return float(r) if r == r else float("nan")


def run_full_evaluate(cfg, ctx) -> None:
    """evaluate@unembed_rank's real path: every checkpoint of ``cfg.checkpoints`` (name -> hf/file source),
    read from disk (or the HF cache), its W_U / H geometry and ID / OOD loss on its own tokenisation of
    ``eval_source`` / ``ood_source``; Spearman of each metric with the losses across checkpoints."""
    from kernels.record import KernelRecord
    from stages.common.hf import pretrained_causal_lm
    from stages.common.paths import write_json

    key = "papers.unembed_rank.evaluate"
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rec = KernelRecord(device)
    rows = []
    for name, src in cfg.checkpoints.items():
        k = f"{key}.checkpoints.{name}"
        tok = source_tokenizer(src, k)
        val_ids = load_text_tokens(cfg.eval_source.dataset, tok, cfg.hf_eval_tokens, column=cfg.text_column,
                                   key=f"{key}.eval_source.dataset", split=cfg.eval_source.split)
        ood_ids = load_text_tokens(cfg.ood_source.dataset, tok, cfg.hf_eval_tokens, column=cfg.text_column,
                                   key=f"{key}.ood_source.dataset", split=cfg.ood_source.split)
        model = pretrained_causal_lm(src, key=k).to(device)
        val = eval_windows(torch.from_numpy(val_ids), cfg.hf_seq_len, cfg.max_windows)
        ood = eval_windows(torch.from_numpy(ood_ids), cfg.hf_seq_len, cfg.max_windows)
        rows.append({"checkpoint": name, "model": src.model, "revision": src.revision,
                     **checkpoint_row(model, tok, val, ood, rec)})
        del model
    metrics = ("erank", "erank_sq", "cosine", "isotropy", "h_erank", "h_erank_sq", "h_cosine", "h_isotropy")
    corr = {loss: {m: spearman([r[m] for r in rows], [r[loss] for r in rows]) for m in metrics}
            for loss in ("val_loss", "ood_loss")}
    out = ctx.out / "hf"
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "checkpoints.json", {"rows": rows, "spearman": corr, "seq_len": cfg.hf_seq_len,
                                          "windows": cfg.max_windows})
    rec.save(out)
