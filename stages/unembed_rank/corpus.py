"""The offline byte-level corpus: files already on this machine, never downloaded.

In-domain: the Python standard library's own top-level ``*.py`` sources. Out-of-domain: a different
file family, the CPython C headers (``include/*.h``) — code, like the paper's OOD sets, but another
language. Files are read in sorted name order; in-domain files are split train/val by file (every
``val_every``-th file to val) so that no file straddles the split. Text is UTF-8 bytes (vocab 256).
"""
from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

import numpy as np

SEP = b"\n\x00\n"  # a file boundary, a byte that never occurs in the sources


def source_root(family: str) -> Path:
    return Path(sysconfig.get_paths()["stdlib" if family == "stdlib_py" else "include"])


def list_files(root: Path, pattern: str) -> list[Path]:
    return sorted(p for p in root.glob(pattern) if p.is_file())


def read_bytes(files: list[Path], max_bytes: int) -> tuple[np.ndarray, list[str]]:
    """Concatenate files (sorted order) up to max_bytes; returns the uint8 array and files used."""
    parts, used, total = [], [], 0
    for f in files:
        if total >= max_bytes:
            break
        data = f.read_bytes() + SEP
        parts.append(data)
        used.append(f.name)
        total += len(data)
    blob = b"".join(parts)[:max_bytes]
    return np.frombuffer(blob, dtype=np.uint8).copy(), used


def split_by_file(files: list[Path], val_every: int) -> tuple[list[Path], list[Path]]:
    val = files[val_every - 1::val_every]
    return [f for f in files if f not in val], val


def digest(arr: np.ndarray) -> str:
    return hashlib.sha256(arr.tobytes()).hexdigest()[:16]
