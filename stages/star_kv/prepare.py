"""prepare: a byte-level corpus of Python standard-library sources (files already on this machine),
split train/val by file; uint8 arrays + meta.json.

    python -m stages prepare star_kv
"""
from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

import numpy as np
from pydantic import Field

from stages.common.config import ConfigError, StageConfig
from stages.common.paths import write_json
from stages.common.runner import StageContext


class Config(StageConfig):
    glob: str = Field("*.py", min_length=1, description="files under the stdlib directory")
    train_bytes: int = Field(300_000, ge=2_000, le=50_000_000)
    val_bytes: int = Field(30_000, ge=500, le=5_000_000)
    val_every: int = Field(10, ge=2, le=100, description="every val_every-th file goes to val")


def read(files: list[Path], n: int) -> np.ndarray:
    out, total = [], 0
    for f in files:
        b = f.read_bytes()
        out.append(b)
        total += len(b)
        if total >= n:
            break
    return np.frombuffer(b"".join(out)[:n], dtype=np.uint8).copy()


def run(cfg: Config, ctx: StageContext) -> None:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob(cfg.glob) if p.is_file())
    if len(files) < 2 * cfg.val_every:
        raise ConfigError(f"papers.star_kv.prepare.glob: {cfg.glob!r} matches {len(files)} files under {root}")
    val_files = files[::cfg.val_every]
    train_files = [f for f in files if f not in set(val_files)]
    train, val = read(train_files, cfg.train_bytes), read(val_files, cfg.val_bytes)
    if train.size < cfg.train_bytes or val.size < cfg.val_bytes:
        raise ConfigError("papers.star_kv.prepare.train_bytes: more bytes requested than the sources hold")
    np.save(ctx.out / "train.npy", train)
    np.save(ctx.out / "val.npy", val)
    write_json(ctx.out / "meta.json", {"vocab_size": 256, "train_bytes": int(train.size), "val_bytes": int(val.size),
                                       "sha256_16": {k: hashlib.sha256(v.tobytes()).hexdigest()[:16]
                                                     for k, v in (("train", train), ("val", val))}})
