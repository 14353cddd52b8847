"""prepare: the byte-level corpus (train / in-domain val / OOD), saved as uint8 tensors + meta.json.

    python -m stages prepare unembed_rank
"""
from __future__ import annotations

import numpy as np
from pydantic import Field

from stages.common.config import ConfigError, StageConfig
from stages.common.paths import write_json
from stages.common.runner import StageContext
from stages.unembed_rank.corpus import digest, list_files, read_bytes, source_root, split_by_file


class Config(StageConfig):
    id_glob: str = Field("*.py", min_length=1, description="in-domain files under the stdlib directory")
    ood_glob: str = Field("*.h", min_length=1, description="OOD files under the CPython include directory")
    train_bytes: int = Field(400_000, ge=1_000, le=50_000_000, description="in-domain training bytes")
    val_bytes: int = Field(40_000, ge=200, le=5_000_000, description="in-domain validation bytes")
    ood_bytes: int = Field(40_000, ge=200, le=5_000_000, description="out-of-domain bytes")
    val_every: int = Field(10, ge=2, le=100, description="every val_every-th in-domain file goes to val")


def run(cfg: Config, ctx: StageContext) -> None:
    id_root, ood_root = source_root("stdlib_py"), source_root("c_headers")
    id_files, ood_files = list_files(id_root, cfg.id_glob), list_files(ood_root, cfg.ood_glob)
    if len(id_files) < cfg.val_every:
        raise ConfigError(f"papers.unembed_rank.prepare.id_glob: {cfg.id_glob!r} matches {len(id_files)} "
                          f"files under {id_root} (need ≥ val_every = {cfg.val_every})")
    if not ood_files:
        raise ConfigError(f"papers.unembed_rank.prepare.ood_glob: {cfg.ood_glob!r} matches no file under {ood_root}")
    train_files, val_files = split_by_file(id_files, cfg.val_every)
    splits = {"train": read_bytes(train_files, cfg.train_bytes), "val": read_bytes(val_files, cfg.val_bytes),
              "ood": read_bytes(ood_files, cfg.ood_bytes)}
    meta = {"vocab_size": 256, "splits": {}}
    for name, (arr, used) in splits.items():
        np.save(ctx.out / f"{name}.npy", arr)
        meta["splits"][name] = {"bytes": int(arr.size), "files": len(used), "sha256_16": digest(arr),
                                "first_files": used[:5]}
    write_json(ctx.out / "meta.json", meta)
