"""Hugging Face models, tokenizers and datasets for the language-model papers (issue 41).

Two ways to get a causal LM, one API:

    from stages.common.hf import TinyLMConfig, causal_lm, load_tokenizer, train_tokenizer, load_records
    model = causal_lm(cfg.source, cfg.tiny, vocab_size=len(tok), seed=cfg.seed)   # toy: tiny from config
    # kind: hf under the full profile: AutoModelForCausalLM.from_pretrained(<hub name or local folder>)

* ``tiny_causal_lm(TinyLMConfig, vocab_size, seed=...)``: a randomly initialised ``LlamaForCausalLM``
  (GQA when ``n_kv_heads < n_heads``, RoPE), ``Qwen2ForCausalLM`` or ``GPT2LMHeadModel``, seeded (the
  global RNG is left untouched), dropout 0 - what tests and the toy path use.
* ``pretrained_causal_lm(SourceConfig)``: ``from_pretrained`` on a local checkpoint folder or a hub name
  (only when ``stages.common.sources.resolve_ref`` allows it: refused with one line naming the key when
  HF_HUB_OFFLINE=1 / no network, so nothing downloads in tests).
* ``train_tokenizer(texts, path)``: a tiny byte-level BPE (or WordPiece) trained with ``tokenizers`` on a
  few sentences and saved as ``tokenizer.json``; ``load_tokenizer(ref)`` loads such a file (or an HF
  tokenizer folder / hub name) as a ``PreTrainedTokenizerFast``.
* ``load_records(ref, columns=...)``: jsonl/json/parquet/csv files, ``save_to_disk`` folders or hub
  datasets through HF ``datasets`` (in memory; the builder's cache goes to a temporary folder that is
  deleted), with one-line ``SourceError``s for a missing file, an empty file, bad JSON or a missing /
  mistyped column.
* ``HFCausalPolicy``: the ``stages.common.grpo.GRPOPolicy`` adapter for any HF causal LM: left-padded
  prompts, KV-cached sampling with a seeded generator (Gumbel-max), per-token log-probs from the HF
  forward (``model(input_ids, attention_mask, position_ids).logits``) through ``kernels.token_logprob``;
  the loss mask covers the completion up to and including EOS (prompt tokens never enter the loss).
* ``encode_pairs`` / ``completion_mask_from_offsets``: prompt/completion SFT batches with the prompt
  masked out by token lengths (prompt and completion tokenised apart, as TRL does) or by the fast
  tokenizer's character offsets (for already-joined text).
* ``add_lora`` (peft) and ``disable_dropout``.
"""
from __future__ import annotations

import inspect
import json
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from kernels.token_logprob import IGNORE_INDEX, token_logprob
from stages.common.config import StageConfig
from stages.common.sources import SourceConfig, SourceError, resolve_ref

__all__ = ["TinyLMConfig", "SourceConfig", "SourceError", "tiny_causal_lm", "pretrained_causal_lm", "causal_lm",
           "train_tokenizer", "load_tokenizer", "source_tokenizer", "load_records", "left_pad", "encode_pairs",
           "completion_mask_from_offsets", "sft_steps", "position_ids", "HFCausalPolicy", "add_lora", "disable_dropout",
           "TORCH_DTYPES"]

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                "float64": torch.float64}
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")          # pad, bos, eos, unk of train_tokenizer


# ----------------------------------------------------------------------------------------------
# models
# ----------------------------------------------------------------------------------------------
class TinyLMConfig(StageConfig):
    """A small HF causal LM built from config (random init): the toy path and the tests."""
    arch: Literal["llama", "qwen2", "gpt2"] = "llama"
    d_model: int = Field(64, ge=8, le=16384)
    n_layers: int = Field(2, ge=1, le=128)
    n_heads: int = Field(4, ge=1, le=128)
    n_kv_heads: int | None = Field(None, ge=1, le=128, description="GQA key/value heads (llama, qwen2); "
                                                                    "None = n_heads")
    d_ff: int | None = Field(None, ge=4, le=65536, description="MLP width (None: 4 · d_model)")
    max_positions: int = Field(512, ge=8, le=131072)
    tie_embeddings: bool = False
    rope_theta: float = Field(10000.0, gt=0, le=1e9)

    @model_validator(mode="after")
    def _heads(self):
        if self.d_model % self.n_heads:
            raise ValueError(f"n_heads: {self.n_heads} does not divide d_model {self.d_model}")
        if self.arch != "gpt2" and (self.d_model // self.n_heads) % 2:
            raise ValueError(f"n_heads: head dim {self.d_model // self.n_heads} must be even (RoPE rotates pairs)")
        if self.n_kv_heads is not None:
            if self.arch == "gpt2" and self.n_kv_heads != self.n_heads:
                raise ValueError("n_kv_heads: gpt2 has no grouped-query attention (leave it unset)")
            if self.n_heads % self.n_kv_heads:
                raise ValueError(f"n_kv_heads: {self.n_kv_heads} does not divide n_heads {self.n_heads}")
        return self


def _hf_config(cfg: TinyLMConfig, vocab_size: int, pad: int | None, bos: int | None, eos: int | None):
    from transformers import GPT2Config, LlamaConfig, Qwen2Config

    d_ff = cfg.d_ff or 4 * cfg.d_model
    kv = cfg.n_kv_heads or cfg.n_heads
    ids = dict(pad_token_id=pad, bos_token_id=bos, eos_token_id=eos, tie_word_embeddings=cfg.tie_embeddings)
    if cfg.arch == "gpt2":
        return GPT2Config(vocab_size=vocab_size, n_embd=cfg.d_model, n_layer=cfg.n_layers, n_head=cfg.n_heads,
                          n_inner=d_ff, n_positions=cfg.max_positions, resid_pdrop=0.0, embd_pdrop=0.0,
                          attn_pdrop=0.0, summary_first_dropout=0.0, **ids)
    common = dict(vocab_size=vocab_size, hidden_size=cfg.d_model, intermediate_size=d_ff,
                  num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=kv,
                  max_position_embeddings=cfg.max_positions, rope_theta=cfg.rope_theta, attention_dropout=0.0,
                  **ids)
    return LlamaConfig(**common) if cfg.arch == "llama" else Qwen2Config(**common)


def tiny_causal_lm(cfg: TinyLMConfig, vocab_size: int, *, seed: int = 0, dtype: torch.dtype = torch.float32,
                   pad_token_id: int | None = None, bos_token_id: int | None = None,
                   eos_token_id: int | None = None, attn_implementation: str = "sdpa"):
    """A randomly initialised HF causal LM from ``cfg`` (same seed, same weights; the global RNG state
    is restored afterwards). ``attn_implementation`` "sdpa" (default; "eager" gives NaN on fully
    masked left-pad rows in transformers 5.x)."""
    from transformers import AutoModelForCausalLM

    if not 2 <= vocab_size <= 1_000_000:
        raise ValueError(f"vocab_size: {vocab_size} out of range [2, 1000000]")
    hf_cfg = _hf_config(cfg, vocab_size, pad_token_id, bos_token_id, eos_token_id)
    hf_cfg._attn_implementation = attn_implementation
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(hf_cfg, dtype=dtype, attn_implementation=attn_implementation)
    return model.eval()


def pretrained_causal_lm(source: SourceConfig, *, key: str = "source", device: str | torch.device | None = None,
                         attn_implementation: str | None = None, allow_download: bool = True):
    """``AutoModelForCausalLM.from_pretrained`` on ``source.model`` (a local checkpoint folder, a cached
    hub name, or - only where the hub is reachable - a hub name to download), in ``source.dtype``."""
    from transformers import AutoModelForCausalLM

    if source.kind == "toy" or source.model is None:
        raise SourceError(f"{key}.model: pretrained_causal_lm needs kind hf/file with a model (got kind {source.kind})")
    ref = resolve_ref(source.model, f"{key}.model", revision=source.revision, allow_download=allow_download)
    kwargs: dict[str, Any] = dict(dtype=TORCH_DTYPES[source.dtype], local_files_only=ref.local)
    if source.revision is not None and ref.hub_name is not None and not ref.local:
        kwargs["revision"] = source.revision
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    try:
        model = AutoModelForCausalLM.from_pretrained(ref.ref, **kwargs)
    except (OSError, ValueError) as err:
        raise SourceError(f"{key}.model: {source.model} is not a loadable causal LM "
                          f"({str(err).splitlines()[0][:200]})") from None
    if device is not None:
        model = model.to(device)
    return model.eval()


def causal_lm(source: SourceConfig, tiny: TinyLMConfig, vocab_size: int, *, seed: int = 0,
              key: str = "source", dtype: torch.dtype | None = None, **ids: int | None):
    """``toy``: ``tiny_causal_lm(tiny, vocab_size, seed)``; ``hf``/``file``: ``pretrained_causal_lm(source)``."""
    if source.kind == "toy":
        return tiny_causal_lm(tiny, vocab_size, seed=seed, dtype=dtype or TORCH_DTYPES[source.dtype], **ids)
    return pretrained_causal_lm(source, key=key)


def disable_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """p = 0 on every nn.Dropout and the config's dropout rates (GRPO's old/new log-probs must agree)."""
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    cfg = getattr(model, "config", None)
    for name in ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "dropout"):
        if cfg is not None and isinstance(getattr(cfg, name, None), float):
            setattr(cfg, name, 0.0)
    return model


def add_lora(model, *, r: int = 8, alpha: float = 16.0, dropout: float = 0.0,
             target_modules: Sequence[str] | None = None):
    """Wrap ``model`` with LoRA adapters (peft); only the adapters train. Default targets: the attention
    projections of Llama/Qwen2 (q_proj, k_proj, v_proj, o_proj) or GPT-2 (c_attn, c_proj)."""
    from peft import LoraConfig, get_peft_model

    if target_modules is None:
        names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
        target_modules = [t for t in ("q_proj", "k_proj", "v_proj", "o_proj") if t in names] or \
                         [t for t in ("c_attn", "c_proj") if t in names]
    cfg = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(target_modules),
                     task_type="CAUSAL_LM")
    return get_peft_model(model, cfg)


# ----------------------------------------------------------------------------------------------
# tokenizers
# ----------------------------------------------------------------------------------------------
def train_tokenizer(texts: Iterable[str], path: str | Path, *, vocab_size: int = 320,
                    kind: Literal["bpe", "wordpiece"] = "bpe"):
    """Train a tiny tokenizer on ``texts``, save it as ``path`` (a tokenizer.json file) and return it as a
    ``PreTrainedTokenizerFast`` with pad/bos/eos/unk = <pad>, <s>, </s>, <unk> (ids 0..3).
    ``bpe``: byte-level BPE (every string encodes, offsets map to characters); ``wordpiece``: BERT-style."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    texts = list(texts)
    if not texts:
        raise ValueError("train_tokenizer: no texts")
    if kind == "bpe":
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    elif kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="<unk>"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                            show_progress=False)
    else:
        raise ValueError(f"train_tokenizer: kind must be bpe or wordpiece (got {kind!r})")
    tok.train_from_iterator(texts, trainer=trainer)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return load_tokenizer(path)


def source_tokenizer(source: SourceConfig, key: str):
    """The tokenizer a real source names: ``source.tokenizer``, else the model's own (at the model's
    revision). ``key`` is the source's params key; errors name ``<key>.tokenizer`` / ``<key>.model``."""
    ref = source.tokenizer or source.model
    if ref is None:
        raise SourceError(f"{key}.tokenizer: neither a tokenizer nor a model to take it from")
    return load_tokenizer(ref, key=f"{key}.tokenizer" if source.tokenizer else f"{key}.model",
                          revision=None if source.tokenizer else source.revision)


def load_tokenizer(ref: str | Path, *, key: str = "source.tokenizer", revision: str | None = None,
                   allow_download: bool = True):
    """A tokenizer from a ``tokenizer.json`` file (``PreTrainedTokenizerFast``; pad/bos/eos/unk set when the
    file has <pad>/<s>/</s>/<unk>), a local tokenizer folder or a hub name (``AutoTokenizer``)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    path = Path(ref).expanduser()
    if path.is_file():
        try:
            vocab = json.loads(path.read_text()).get("model", {}).get("vocab", {})
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
            raise SourceError(f"{key}: {path} is not a tokenizer.json file") from None
        names = dict(zip(("pad_token", "bos_token", "eos_token", "unk_token"), SPECIAL_TOKENS))
        special = {k: v for k, v in names.items() if isinstance(vocab, dict) and v in vocab}
        try:
            return PreTrainedTokenizerFast(tokenizer_file=str(path), **special)
        except Exception as err:  # noqa: BLE001 - tokenizers raises its own exception types
            raise SourceError(f"{key}: {path} is not a tokenizer.json file ({str(err).splitlines()[0][:160]})") from None
    res = resolve_ref(str(ref), key, revision=revision, allow_download=allow_download)
    try:
        tok = AutoTokenizer.from_pretrained(res.ref, local_files_only=res.local,
                                            **({"revision": revision} if revision and not res.local else {}))
    except (OSError, ValueError) as err:
        raise SourceError(f"{key}: {ref} has no loadable tokenizer ({str(err).splitlines()[0][:160]})") from None
    if tok.pad_token is None and tok.eos_token is not None:
        tok.pad_token = tok.eos_token                                        # common for decoder-only LMs
    return tok


def left_pad(tokenizer, texts: Sequence[str], *, max_length: int | None = None,
             add_bos: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts as (N, Lp) ``input_ids`` and ``attention_mask``, padded on the left with the pad id
    (what generation needs: every row's last prompt token sits in the last column)."""
    if tokenizer.pad_token_id is None:
        raise ValueError("left_pad: the tokenizer has no pad token")
    rows = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    if add_bos:
        rows = [[tokenizer.bos_token_id] + r for r in rows]
    if max_length is not None:
        rows = [r[-max_length:] for r in rows]                               # keep the end of long prompts
    if any(len(r) == 0 for r in rows):
        raise ValueError("left_pad: an empty prompt (no tokens)")
    L = max(len(r) for r in rows)
    ids = torch.full((len(rows), L), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), L), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, L - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, L - len(r):] = 1
    return ids, mask


def encode_pairs(tokenizer, prompts: Sequence[str], completions: Sequence[str], *, add_eos: bool = True,
                 max_length: int | None = None) -> dict[str, torch.Tensor]:
    """SFT batch: prompt and completion tokenised apart and concatenated (no BPE merge across the
    boundary), right-padded. Returns input_ids, attention_mask and ``labels`` (the next-token targets of
    ``input_ids[:, 1:]``, IGNORE_INDEX on prompt tokens and padding: the prompt is masked by its length)."""
    if len(prompts) != len(completions):
        raise ValueError(f"encode_pairs: {len(prompts)} prompts vs {len(completions)} completions")
    seqs, starts = [], []
    for p, c in zip(prompts, completions):
        pi = tokenizer(p, add_special_tokens=False)["input_ids"]
        ci = tokenizer(c, add_special_tokens=False)["input_ids"] + ([tokenizer.eos_token_id] if add_eos else [])
        s = pi + ci
        if max_length is not None:
            s = s[:max_length]
        seqs.append(s)
        starts.append(len(pi))
    L = max(len(s) for s in seqs)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.full((len(seqs), L), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), L), dtype=torch.long)
    labels = torch.full((len(seqs), L - 1), IGNORE_INDEX, dtype=torch.long)
    for i, (s, st) in enumerate(zip(seqs, starts)):
        ids[i, :len(s)] = torch.tensor(s, dtype=torch.long)
        mask[i, :len(s)] = 1
        for t in range(max(st, 1), len(s)):                                  # target t predicted at t-1
            labels[i, t - 1] = s[t]
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def sft_steps(model, tokenizer, prompts: Sequence[str], completions: Sequence[str], *, steps: int, batch: int,
              lr: float, seed: int, weight_decay: float = 0.0, max_length: int | None = None) -> list[float]:
    """Supervised fine-tuning: next-token cross-entropy on the completions only (prompt masked by
    ``encode_pairs``), AdamW, batches drawn with a seeded generator. Returns the per-step losses."""
    import torch.nn.functional as F

    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=weight_decay)
    g = torch.Generator().manual_seed(seed)
    dev = next(model.parameters()).device
    model.train()
    losses = []
    for _ in range(steps):
        idx = torch.randint(0, len(prompts), (batch,), generator=g).tolist()
        b = encode_pairs(tokenizer, [prompts[i] for i in idx], [completions[i] for i in idx], max_length=max_length)
        logits = model(input_ids=b["input_ids"].to(dev), attention_mask=b["attention_mask"].to(dev)).logits[:, :-1]
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), b["labels"].to(dev).reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses



def completion_mask_from_offsets(tokenizer, texts: Sequence[str], boundaries: Sequence[int]) -> dict[str, torch.Tensor]:
    """Already-joined prompt+completion texts: tokenise once (fast tokenizer offsets) and mark a token as
    completion when its first character is at or after the boundary (the prompt's length in characters).
    Returns input_ids, attention_mask and completion_mask (N, L), right-padded."""
    enc = tokenizer(list(texts), add_special_tokens=False, return_offsets_mapping=True, padding=True,
                    return_tensors="pt")
    offsets = enc["offset_mapping"]                                          # (N, L, 2) char spans
    b = torch.as_tensor(list(boundaries), dtype=torch.long)[:, None]
    comp = (offsets[..., 0] >= b) & (enc["attention_mask"] > 0)
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "completion_mask": comp.long()}


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """HF's left-padding positions: 0 at each row's first real token, counting real tokens (pads: 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)


# ----------------------------------------------------------------------------------------------
# datasets
# ----------------------------------------------------------------------------------------------
_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def _blank(path: Path) -> bool:
    """Empty or whitespace only (reads at most the first MiB: real files are large)."""
    with path.open("rb") as f:
        head = f.read(1 << 20)
    return not head.strip() and path.stat().st_size <= len(head)


def _check_columns(ds, columns: Mapping[str, str | None] | Sequence[str], key: str, where: str):
    spec = dict(columns) if isinstance(columns, Mapping) else {c: None for c in columns}
    have = list(ds.column_names)
    missing = [c for c in spec if c not in have]
    if missing:
        raise SourceError(f"{key}: {where} lacks column{'s' if len(missing) > 1 else ''} "
                          f"{', '.join(repr(m) for m in missing)} (columns: {', '.join(have) or 'none'})")
    for col, want in spec.items():
        if want is None:
            continue
        feat = ds.features[col]
        got = getattr(feat, "dtype", type(feat).__name__)
        ok = {"string": got in ("string", "large_string"),
              "int": str(got).startswith(("int", "uint")),
              "float": str(got).startswith("float") or str(got).startswith(("int", "uint")),
              "bool": got == "bool",
              "list": type(feat).__name__ in ("Sequence", "List", "LargeList")}.get(want)
        if ok is None:
            raise ValueError(f"load_records: unknown column type {want!r} (string, int, float, bool, list)")
        if not ok:
            raise SourceError(f"{key}: {where} column {col!r} is {got}, expected {want}")


def load_records(ref: str | Path, *, columns: Mapping[str, str | None] | Sequence[str] = (),
                 key: str = "source.dataset", split: str = "train", revision: str | None = None,
                 limit: int | None = None, allow_download: bool = True):
    """A ``datasets.Dataset`` (in memory) from a local jsonl/json/parquet/csv file, a folder of such files,
    a ``save_to_disk`` folder, or a hub dataset (cached, or downloaded where the hub is reachable).
    ``columns``: required column names, or name -> type ("string", "int", "float", "bool", "list").
    Errors (``SourceError``, one line naming ``key``): missing file, empty file/no rows, unreadable rows,
    missing or mistyped column."""
    import datasets

    datasets.disable_progress_bars()
    path = Path(ref).expanduser()
    with tempfile.TemporaryDirectory(prefix="hf-datasets-") as cache:
        try:
            if path.is_file():
                builder = _BUILDERS.get(path.suffix.lower())
                if builder is None:
                    raise SourceError(f"{key}: {path} has suffix {path.suffix or '(none)'}; "
                                      f"expected one of {', '.join(_BUILDERS)}")
                if _blank(path):
                    raise SourceError(f"{key}: {path} is empty (no rows)")
                ds = datasets.load_dataset(builder, data_files=str(path), split="train", keep_in_memory=True,
                                           cache_dir=cache)
            elif path.is_dir() and ((path / "dataset_info.json").exists() or (path / "state.json").exists()):
                ds = datasets.load_from_disk(str(path), keep_in_memory=True)
                if isinstance(ds, datasets.DatasetDict):
                    if split not in ds:
                        raise SourceError(f"{key}: {path} has no split {split!r} (splits: {', '.join(ds)})")
                    ds = ds[split]
            elif path.is_dir():
                files = sorted(f for f in path.rglob("*") if f.suffix.lower() in _BUILDERS)
                kinds = {_BUILDERS[f.suffix.lower()] for f in files}
                if not files:
                    raise SourceError(f"{key}: {path} holds no {'/'.join(_BUILDERS)} files")
                if len(kinds) > 1:
                    raise SourceError(f"{key}: {path} mixes file formats ({', '.join(sorted(kinds))})")
                ds = datasets.load_dataset(kinds.pop(), data_files=[str(f) for f in files], split="train",
                                           keep_in_memory=True, cache_dir=cache)
            else:
                res = resolve_ref(str(ref), key, repo_type="dataset", revision=revision,
                                  allow_download=allow_download)
                ds = datasets.load_dataset(res.ref, split=split, keep_in_memory=True, cache_dir=cache,
                                           **({"revision": revision} if revision and not res.local else {}))
        except SourceError:
            raise
        except Exception as err:  # noqa: BLE001 - datasets raises many types (DatasetGenerationError, ArrowInvalid)
            cause = err.__cause__ or err
            msg = (str(cause).strip().splitlines() or [type(cause).__name__])[0][:200]
            raise SourceError(f"{key}: {ref} could not be read ({type(cause).__name__}: {msg})") from None
    if len(ds) == 0:
        raise SourceError(f"{key}: {ref} has no rows")
    _check_columns(ds, columns, key, str(ref))
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))), keep_in_memory=True)
    return ds


# ----------------------------------------------------------------------------------------------
# GRPO policy adapter (stages.common.grpo.GRPOPolicy) for HF causal LMs
# ----------------------------------------------------------------------------------------------
def cache_kwargs(model) -> str:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model     # peft wrappers
    params = inspect.signature(base.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def output_cache(out):
    return getattr(out, "cache", None) if getattr(out, "cache", None) is not None else getattr(out, "past_key_values", None)


class HFCausalPolicy(torch.nn.Module):
    """GRPO policy over an HF causal LM (``GRPOModule(HFCausalPolicy(...), reward_fn, cfg, lr)``).

    The prompt table is fixed at construction (``left_pad``); a batch of prompts is a LongTensor of
    row indices into it (``stages.common.grpo.PromptLoader(torch.arange(N), ...)``).

    rollout(prompts, G, generator) -> {"prompt" (B,), "input_ids" (B, Lp+Lc), "attention_mask", "tokens"
        (B, Lc), "mask" (B, Lc) float: 1 up to and including EOS}: rows prompt-major, sampled token by
        token with the KV cache; ALGO: y_t = argmax(z_t / T + Gumbel(u_t)), u_t ~ U(0,1)^(B×V) drawn from
        ``generator`` once per step (= a sample of softmax(z_t / T)); finished rows emit pad.
    token_logprobs(roll) -> (B, Lc): ALGO: log softmax(z_t / T)[y_t] from one HF forward over prompt +
        completion (position ids from the attention mask), via kernels.token_logprob; 0 where mask = 0.
    ``on_score`` (e.g. ``lambda: rec.count("token_logprob")``) is called once per scoring pass.
    """

    def __init__(self, model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, *, max_new_tokens: int,
                 eos_token_id: int, pad_token_id: int, temperature: float = 1.0, backend: str = "auto",
                 on_score: Callable[[], None] | None = None, dropout_off: bool = True):
        super().__init__()
        if prompt_ids.shape != prompt_mask.shape or prompt_ids.dim() != 2:
            raise ValueError(f"HFCausalPolicy: prompt_ids {tuple(prompt_ids.shape)} and prompt_mask "
                             f"{tuple(prompt_mask.shape)} must be the same (N, Lp)")
        if not bool((prompt_mask[:, -1] > 0).all()):
            raise ValueError("HFCausalPolicy: prompts must be left-padded (every row's last column a real token)")
        if max_new_tokens < 1 or not temperature > 0:
            raise ValueError("HFCausalPolicy: max_new_tokens >= 1 and temperature > 0")
        self.model = disable_dropout(model) if dropout_off else model
        self.register_buffer("prompt_ids", prompt_ids.long(), persistent=False)
        self.register_buffer("prompt_mask", prompt_mask.long(), persistent=False)
        self.max_new_tokens, self.temperature = int(max_new_tokens), float(temperature)
        self.eos, self.pad = int(eos_token_id), int(pad_token_id)
        self.backend, self.on_score = backend, on_score
        self._kw = cache_kwargs(model)

    def _sample_dtype(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.to(torch.promote_types(logits.dtype, torch.float32))

    @torch.no_grad()
    def rollout(self, prompts: torch.Tensor, group_size: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
        idx = prompts.to(self.prompt_ids.device).long().repeat_interleave(group_size)   # prompt-major rows
        ids, am = self.prompt_ids[idx], self.prompt_mask[idx]
        pos = position_ids(am)
        out = self.model(input_ids=ids, attention_mask=am, position_ids=pos, use_cache=True)
        logits, cache = out.logits[:, -1], output_cache(out)
        nxt_pos = pos[:, -1] + 1
        B = ids.shape[0]
        alive = torch.ones(B, dtype=torch.bool, device=ids.device)
        toks, mask = [], []
        for t in range(self.max_new_tokens):
            z = self._sample_dtype(logits) / self.temperature
            u = torch.rand(z.shape, generator=generator, device=z.device, dtype=z.dtype).clamp_min(1e-30)
            y = (z - torch.log(-torch.log(u))).argmax(-1)                    # Gumbel-max sample
            y = torch.where(alive, y, torch.full_like(y, self.pad))
            mask.append(alive.clone())
            toks.append(y)
            alive = alive & (y != self.eos)
            if t == self.max_new_tokens - 1 or not bool(alive.any()):
                break
            am = torch.cat([am, mask[-1].long()[:, None]], 1)
            out = self.model(input_ids=y[:, None], attention_mask=am, position_ids=nxt_pos[:, None],
                             use_cache=True, **{self._kw: cache})
            logits, cache = out.logits[:, -1], output_cache(out)
            nxt_pos = nxt_pos + 1
        tokens = torch.stack(toks, 1)
        m = torch.stack(mask, 1)
        full_ids = torch.cat([self.prompt_ids[idx], tokens], 1)
        full_am = torch.cat([self.prompt_mask[idx], m.long()], 1)
        return {"prompt": idx, "input_ids": full_ids, "attention_mask": full_am, "tokens": tokens,
                "mask": m.float()}

    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, keep: int = 0) -> torch.Tensor:
        """The HF forward's logits (the last ``keep`` positions; 0 = all)."""
        return self.model(input_ids=input_ids, attention_mask=attention_mask,
                          position_ids=position_ids(attention_mask), logits_to_keep=keep).logits

    def token_logprobs(self, roll: dict[str, torch.Tensor]) -> torch.Tensor:
        tokens = roll["tokens"]
        Lc = tokens.shape[1]
        logits = self.logits(roll["input_ids"], roll["attention_mask"], keep=Lc + 1)[:, :-1]   # predict y_1..y_Lc
        tgt = torch.where(roll["mask"] > 0, tokens, torch.full_like(tokens, IGNORE_INDEX))
        if self.on_score is not None:
            self.on_score()
        return token_logprob(logits, tgt, temperature=self.temperature, backend=self.backend)
