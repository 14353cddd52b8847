"""prepare: the byte-level corpus (train / in-domain val / OOD), saved as uint8 tensors + meta.json.

``corpus: snapshot`` (default) reads the pinned CPython 3.11.7 files (``stages/unembed_rank/corpus.py``),
so every machine gets the committed runs' bytes; ``corpus: live`` reads this interpreter's stdlib.

    python -m stages prepare unembed_rank
"""
from __future__ import annotations

import platform
from typing import Literal

import numpy as np
from pydantic import Field

from stages.common.config import ConfigError, StageConfig
from stages.common.paths import write_json
from stages.common.runner import StageContext
from stages.unembed_rank.corpus import FAMILIES, Snapshot, digest, list_files, read_bytes, source_root, split_by_file

KEY = "papers.unembed_rank.prepare"


class Config(StageConfig):
    corpus: Literal["snapshot", "live"] = Field("snapshot", description=(
        "snapshot: the pinned CPython 3.11.7 files (the same bytes on every machine); live: this interpreter's "
        "stdlib and headers (the bytes differ between Python versions and builds)"))
    id_glob: str = Field("*.py", min_length=1, description="in-domain files under the stdlib directory")
    ood_glob: str = Field("*.h", min_length=1, description="OOD files under the CPython include directory")
    train_bytes: int = Field(400_000, ge=1_000, le=50_000_000, description="in-domain training bytes")
    val_bytes: int = Field(40_000, ge=200, le=5_000_000, description="in-domain validation bytes")
    ood_bytes: int = Field(40_000, ge=200, le=5_000_000, description="out-of-domain bytes")
    val_every: int = Field(10, ge=2, le=100, description="every val_every-th in-domain file goes to val")


def source_files(cfg: Config) -> tuple[dict[str, list], str, Snapshot | None]:
    """{family: sorted files} from the snapshot or this interpreter, and a line saying which."""
    globs = {"stdlib_py": ("id_glob", cfg.id_glob), "c_headers": ("ood_glob", cfg.ood_glob)}
    if cfg.corpus == "live":
        files = {fam: list_files(source_root(fam), glob) for fam, (_, glob) in globs.items()}
        return files, f"live stdlib of Python {platform.python_version()}", None
    snap = Snapshot()
    for fam, (key, glob) in globs.items():
        if glob != FAMILIES[fam]:
            raise ConfigError(f"{KEY}.{key}: the pinned snapshot holds only {FAMILIES[fam]!r} files (got {glob!r}); "
                              f"set {KEY}.corpus: live to read this interpreter's files")
    return snap.files, snap.describe(), snap


def run(cfg: Config, ctx: StageContext) -> None:
    files, source, snap = source_files(cfg)
    id_files, ood_files = files["stdlib_py"], files["c_headers"]
    n_total = snap.total("stdlib_py") if snap is not None else len(id_files)
    if n_total < cfg.val_every:
        raise ConfigError(f"{KEY}.id_glob: {cfg.id_glob!r} matches {n_total} "
                          f"files under {source_root('stdlib_py')} (need ≥ val_every = {cfg.val_every})")
    if len(id_files) < cfg.val_every:      # only a snapshot's prefix can be shorter than the list
        raise ConfigError(f"{KEY}.val_every: {cfg.val_every} puts the first val file at position {cfg.val_every} of "
                          f"the sorted list; the pinned snapshot holds its first {len(id_files)} files; set "
                          f"{KEY}.corpus: live to read this interpreter's files")
    if not ood_files:
        raise ConfigError(f"{KEY}.ood_glob: {cfg.ood_glob!r} matches no file under {source_root('c_headers')}")
    train_files, val_files = split_by_file(id_files, cfg.val_every)
    wanted = {"train": ("train_bytes", cfg.train_bytes, train_files, "stdlib_py"),
              "val": ("val_bytes", cfg.val_bytes, val_files, "stdlib_py"),
              "ood": ("ood_bytes", cfg.ood_bytes, ood_files, "c_headers")}
    splits = {}
    for name, (key, n, split_files, fam) in wanted.items():   # every split checked before anything is written
        arr, used = read_bytes(split_files, n)
        if arr.size < n:
            hint = (f"the pinned snapshot holds the first {len(id_files if fam == 'stdlib_py' else ood_files)} "
                    f"files; set {KEY}.corpus: live for more" if snap is not None and not snap.complete(fam)
                    else f"the {fam} files hold no more")
            raise ConfigError(f"{KEY}.{key}: {n} bytes requested, {arr.size} available ({hint})")
        splits[name] = (arr, used)
    meta = {"vocab_size": 256, "corpus": source, "splits": {}}
    for name, (arr, used) in splits.items():
        np.save(ctx.out / f"{name}.npy", arr)
        meta["splits"][name] = {"bytes": int(arr.size), "files": len(used), "sha256_16": digest(arr),
                                "first_files": used[:5]}
    write_json(ctx.out / "meta.json", meta)
