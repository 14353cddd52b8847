"""prepare: the token streams the teacher, the students and the evaluation read.

toy (default): a byte-level corpus of Python standard-library sources, split train/val by file; token = byte
(vocab 256). ``corpus: snapshot`` (default) reads them from ``stdlib_snapshot.tar.xz`` beside this module: the first 19
top-level ``*.py`` files of CPython 3.11.7's sorted list (the committed runs' interpreter), so every machine reads the
same bytes (this interpreter's stdlib differs by patch version and build: ``_sysconfigdata__<platform>.py`` is one of
the files). ``corpus: live`` reads this interpreter's files. Rebuilt with ``stages.unembed_rank.corpus.build_snapshot``
({"stdlib_py": 19}, path=...), the same format as unembed_rank's snapshot.
full (``source.kind: hf | file``): the KD corpus (``source.dataset``, e.g. fineweb-edu or WikiText-2 train)
and the evaluation sets (``eval_sources``, e.g. WikiText-2 test and C4 validation), each read through
``stages.common.hf.load_records`` (column ``text``) and tokenized with the model's tokenizer.

Writes train.npy, val_<name>.npy (one per evaluation set; the first is the claims' set) and meta.json.

    python -m stages prepare star_kv
"""
from __future__ import annotations

import hashlib
import json
import platform
import sysconfig
import tarfile
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from stages.common.config import ConfigError, StageConfig
from stages.common.paths import write_json
from stages.common.runner import StageContext
from stages.common.sources import SourceConfig, SourceError

TOY_EVAL = "stdlib_val"
SNAPSHOT = Path(__file__).with_name("stdlib_snapshot.tar.xz")
SNAPSHOT_GLOB = "*.py"


class SnapshotFile:
    """One file of the snapshot, with what ``read_files`` uses of a Path."""

    def __init__(self, name: str, data: bytes):
        self.name, self.data = name, data

    def read_bytes(self) -> bytes:
        return self.data


def snapshot_files() -> tuple[list[SnapshotFile], int, str]:
    """The snapshot's files (a prefix of the sorted list), the full list's length, and a line naming it."""
    with tarfile.open(SNAPSHOT, "r:xz") as tar:
        manifest = json.loads(tar.extractfile("manifest.json").read())
        info = manifest["families"]["stdlib_py"]
        files = [SnapshotFile(n, tar.extractfile(f"stdlib_py/{n}").read()) for n in info["names"]]
    return files, info["files_total"], f"snapshot of CPython {manifest['python']} ({SNAPSHOT.name})"


class Config(StageConfig):
    source: SourceConfig = SourceConfig()
    eval_sources: dict[str, SourceConfig] = Field(
        default_factory=dict, max_length=8,
        description="name -> held-out text set (kind hf/file, full profile only); the first decides the claims")
    text_column: str = Field("text", min_length=1, max_length=100)
    corpus: Literal["snapshot", "live"] = Field("snapshot", description=(
        "toy: the pinned CPython 3.11.7 files (the same bytes on every machine) or this interpreter's stdlib (live)"))
    glob: str = Field("*.py", min_length=1, description="toy: files under the stdlib directory")
    train_tokens: int = Field(300_000, ge=100, le=2_000_000_000)
    val_tokens: int = Field(30_000, ge=20, le=200_000_000)
    val_every: int = Field(10, ge=2, le=100, description="toy: every val_every-th file goes to val")

    @model_validator(mode="after")
    def _eval_sets(self):
        if self.source.kind == "toy" and self.eval_sources:
            raise ValueError("eval_sources: only read with a real source (source.kind hf or file)")
        if self.source.kind != "toy" and not self.eval_sources:
            raise ValueError("eval_sources: a real source needs at least one held-out set (e.g. WikiText-2 test)")
        for name, src in self.eval_sources.items():
            if not name.isidentifier():
                raise ValueError(f"eval_sources.{name}: names must be identifiers (they become file names)")
            if src.dataset is None:
                raise ValueError(f"eval_sources.{name}.dataset: missing")
        if self.source.kind != "toy" and self.source.dataset is None:
            raise ValueError("source.dataset: the KD corpus is missing")
        return self


def read_files(files: list[Path], n: int) -> np.ndarray:
    out, total = [], 0
    for f in files:
        b = f.read_bytes()
        out.append(b)
        total += len(b)
        if total >= n:
            break
    return np.frombuffer(b"".join(out)[:n], dtype=np.uint8).copy()


def tokenizer_for(source: SourceConfig, key: str = "papers.star_kv.prepare.source"):
    from stages.common.hf import source_tokenizer

    return source_tokenizer(source, key)


def load_text_tokens(dataset: str, tokenizer, n_tokens: int, *, column: str = "text", split: str = "train",
                     revision: str | None = None, key: str = "source.dataset") -> np.ndarray:
    """Records of a text dataset (jsonl/json/parquet/csv file or folder, save_to_disk folder, or hub dataset;
    WikiText / C4 / fineweb-edu schema: a string column `column`) read through load_records, empty lines
    dropped, tokenized and concatenated with the tokenizer's EOS between documents; the first n_tokens ids."""
    from stages.common.hf import load_records

    ds = load_records(dataset, columns={column: "string"}, key=key, split=split, revision=revision)
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for text in ds[column]:
        if not text or not text.strip():
            continue
        ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
        if eos is not None:
            ids.append(eos)
        if len(ids) >= n_tokens:
            break
    if len(ids) < n_tokens:
        raise SourceError(f"{key}: {dataset} holds {len(ids)} tokens, fewer than the {n_tokens} requested")
    dtype = np.uint16 if len(tokenizer) <= 65535 else np.int32
    return np.asarray(ids[:n_tokens], dtype=dtype)


def run(cfg: Config, ctx: StageContext) -> None:
    key = "papers.star_kv.prepare"
    if cfg.source.kind == "toy":
        root = Path(sysconfig.get_paths()["stdlib"])
        if cfg.corpus == "snapshot":
            if cfg.glob != SNAPSHOT_GLOB:
                raise ConfigError(f"{key}.glob: the pinned snapshot holds only {SNAPSHOT_GLOB!r} files (got "
                                  f"{cfg.glob!r}); set {key}.corpus: live to read this interpreter's files")
            files, total, corpus = snapshot_files()
        else:
            files = sorted(p for p in root.glob(cfg.glob) if p.is_file())
            total, corpus = len(files), f"live stdlib of Python {platform.python_version()}"
        if total < 2 * cfg.val_every:
            raise ConfigError(f"{key}.glob: {cfg.glob!r} matches {total} files in the {corpus} (need ≥ 2 × val_every "
                              f"= {2 * cfg.val_every})")
        val_files = files[::cfg.val_every]
        train_files = [f for f in files if f not in set(val_files)]
        train = read_files(train_files, cfg.train_tokens)
        vals = {TOY_EVAL: read_files(val_files, cfg.val_tokens)}
        for what, got, n in (("train_tokens", train.size, cfg.train_tokens),
                             ("val_tokens", vals[TOY_EVAL].size, cfg.val_tokens)):
            if got < n:
                hint = (f"the pinned snapshot holds the first {len(files)} files; set {key}.corpus: live for more"
                        if len(files) < total else "the sources hold no more")
                raise ConfigError(f"{key}.{what}: {n} bytes requested, {got} available ({hint})")
        vocab, tok_name = 256, "bytes"
    else:
        tok = tokenizer_for(cfg.source, f"{key}.source")
        train = load_text_tokens(cfg.source.dataset, tok, cfg.train_tokens, column=cfg.text_column,
                                 split=cfg.source.split, revision=cfg.source.revision, key=f"{key}.source.dataset")
        vals = {name: load_text_tokens(src.dataset, tok, cfg.val_tokens, column=cfg.text_column, split=src.split,
                                       revision=src.revision, key=f"{key}.eval_sources.{name}.dataset")
                for name, src in cfg.eval_sources.items()}
        vocab, tok_name = len(tok), cfg.source.tokenizer or cfg.source.model
        corpus = f"{cfg.source.kind}: {cfg.source.dataset}"
    np.save(ctx.out / "train.npy", train)
    for name, v in vals.items():
        np.save(ctx.out / f"val_{name}.npy", v)
    write_json(ctx.out / "meta.json", {
        "vocab_size": int(vocab), "tokenizer": tok_name, "corpus": corpus, "train_tokens": int(train.size),
        "eval_sets": list(vals), "val_tokens": {k: int(v.size) for k, v in vals.items()},
        "sha256_16": {k: hashlib.sha256(v.tobytes()).hexdigest()[:16]
                      for k, v in (("train", train), *vals.items())}})
