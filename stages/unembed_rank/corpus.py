"""The offline byte-level corpus: files already on this machine, never downloaded.

In-domain: the Python standard library's own top-level ``*.py`` sources. Out-of-domain: a different
file family, the CPython C headers (``include/*.h``) — code, like the paper's OOD sets, but another
language. Files are read in sorted name order; in-domain files are split train/val by file (every
``val_every``-th file to val) so that no file straddles the split. Text is UTF-8 bytes (vocab 256).

Pinned by default: the running interpreter's stdlib differs by patch version AND by build (the sorted
list holds ``_sysconfigdata__<platform>.py``, whose text is the build's own paths and flags), so the
same code read on two machines gave two corpora and, for two claims, two verdicts. ``stdlib_snapshot.tar.xz``
(beside this module) holds the first files of each family's sorted list as CPython 3.11.7 (the committed
runs' interpreter) has them; ``corpus: live`` in params reads this interpreter's files instead.

    python -m stages.unembed_rank.corpus 40 7    # rebuild the snapshot: first 40 *.py and 7 *.h of this Python
"""
from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import platform
import sys
import sysconfig
import tarfile
from pathlib import Path

import numpy as np

SEP = b"\n\x00\n"  # a file boundary, a byte that never occurs in the sources
SNAPSHOT = Path(__file__).with_name("stdlib_snapshot.tar.xz")
FAMILIES = {"stdlib_py": "*.py", "c_headers": "*.h"}   # family -> the glob its snapshot was taken with


class SnapshotFile:
    """One file of the snapshot, with the two things ``read_bytes`` uses of a Path."""

    def __init__(self, name: str, data: bytes):
        self.name, self.data = name, data

    def read_bytes(self) -> bytes:
        return self.data


class Snapshot:
    """The pinned corpus: per family, a PREFIX (``files``) of the sorted file list (``files_total`` long)."""

    def __init__(self, path: Path = SNAPSHOT):
        with tarfile.open(path, "r:xz") as tar:
            self.manifest = json.loads(tar.extractfile("manifest.json").read())
            self.files = {fam: [SnapshotFile(n, tar.extractfile(f"{fam}/{n}").read()) for n in info["names"]]
                          for fam, info in self.manifest["families"].items()}

    def total(self, family: str) -> int:
        """Length of the whole sorted list the snapshot's files are a prefix of."""
        return self.manifest["families"][family]["files_total"]

    def complete(self, family: str) -> bool:
        return len(self.files[family]) == self.total(family)

    def describe(self) -> str:
        return f"snapshot of CPython {self.manifest['python']} ({SNAPSHOT.name})"


def source_root(family: str) -> Path:
    return Path(sysconfig.get_paths()["stdlib" if family == "stdlib_py" else "include"])


def list_files(root: Path, pattern: str) -> list[Path]:
    return sorted(p for p in root.glob(pattern) if p.is_file())


def read_bytes(files: list[Path] | list[SnapshotFile], max_bytes: int) -> tuple[np.ndarray, list[str]]:
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


def split_by_file(files: list, val_every: int) -> tuple[list, list]:
    val = files[val_every - 1::val_every]
    return [f for f in files if f not in val], val


def digest(arr: np.ndarray) -> str:
    return hashlib.sha256(arr.tobytes()).hexdigest()[:16]


def build_snapshot(keep: dict[str, int], path: Path = SNAPSHOT) -> None:
    """Write the snapshot: the first ``keep[family]`` files of each family's sorted list, as this Python has them."""
    manifest = {"python": platform.python_version(), "built_with": sys.version.split()[0], "families": {}}
    members: list[tuple[str, bytes]] = []
    for fam, n in keep.items():
        files = list_files(source_root(fam), FAMILIES[fam])
        manifest["families"][fam] = {"glob": FAMILIES[fam], "files_total": len(files),
                                     "names": [f.name for f in files[:n]]}
        members += [(f"{fam}/{f.name}", f.read_bytes()) for f in files[:n]]
    members.insert(0, ("manifest.json", json.dumps(manifest, indent=1).encode()))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz", preset=9) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644   # no timestamps: the same bytes every build
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buf.getvalue())


if __name__ == "__main__":
    build_snapshot({"stdlib_py": int(sys.argv[1]), "c_headers": int(sys.argv[2])})
