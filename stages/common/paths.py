"""Where stage artifacts live, and how they are written atomically.

Layout: ``data/<slug>/<stage>/`` for prepare, train and evaluate; ``reports/<slug>/`` for report.
Every stage writes into a temporary sibling directory and renames it into place only when the
stage function returned, so an interrupted or failing run leaves no half-written artifact.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(os.environ.get("PAPERS_ROOT", Path(__file__).resolve().parents[2]))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temps(final: Path) -> list[Path]:
    """Temp dirs ``.<name>.tmp-<pid>-*`` left beside ``final`` by a process that no longer runs
    (SIGKILL, power loss): the next run of the stage removes them."""
    removed = []
    for tmp in Path(final).parent.glob(f".{Path(final).name}.tmp-*"):
        try:
            pid = int(tmp.name.rsplit(".tmp-", 1)[1].split("-", 1)[0])
        except (IndexError, ValueError):
            continue
        if pid != os.getpid() and not _pid_alive(pid):
            shutil.rmtree(tmp, ignore_errors=True)
            removed.append(tmp)
    return removed


def stage_dir(slug: str, stage: str, root: Path = ROOT) -> Path:
    """The declared DVC output directory of ``<stage>@<slug>``."""
    if stage == "report":
        return root / "reports" / slug
    return root / "data" / slug / stage


@contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Yield an empty temp dir next to ``final``; on success it replaces ``final`` in one rename."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(final)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-{os.getpid()}-", dir=final.parent))
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700; outputs get normal permissions
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if final.exists():
        old = final.parent / f".{final.name}.old-{os.getpid()}"
        os.replace(final, old)
    os.replace(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def atomic_write_text(path: Path, text: str) -> None:
    """Write a file via a temp file and rename (for single files outside a stage's atomic dir)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy / torch scalars
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")
