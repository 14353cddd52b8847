"""Where stage artifacts live, and how they are written atomically.

Layout: ``data/<slug>/<stage>/`` for prepare, train and evaluate; ``reports/<slug>/`` for report.
Every stage writes into a temporary sibling directory and renames it into place only when the
stage function returned, so an interrupted or failing run leaves no half-written artifact.
"""
from __future__ import annotations

import json
import math
import os
import re
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


def finite_json(obj: Any) -> Any:
    """obj with every NaN/±inf float replaced by None: JSON has no such tokens (most readers reject the
    bare NaN that Python's json writes). Where the reason matters, write a reason field beside it."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):  # numpy / torch arrays and scalars
        return finite_json(obj.tolist())
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        return finite_json(obj.item())
    return obj


def write_json(path: Path, obj: Any) -> None:
    """Canonical JSON (sorted keys), never NaN/Infinity tokens (written as null), atomically."""
    text = json.dumps(finite_json(obj), indent=2, sort_keys=True, default=_json_default, allow_nan=False)
    atomic_write_text(path, text + "\n")


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())


class InputError(ValueError):
    """A user-supplied input file is malformed or out of bounds (one line: the file and the problem)."""


def load_json_bounded(path: Path, max_bytes: int = 50_000_000, max_depth: int = 64, what: str = "input") -> Any:
    """json.load for files a user hands to a CLI: the size is checked before reading, nesting depth and
    number sizes after parsing (a 100k-deep nesting or a 5,000-digit integer is one line, not a
    traceback), NaN/Infinity tokens refused. Raises InputError naming the file and the problem."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: {what} file not found")
    size = path.stat().st_size
    if size > max_bytes:
        raise InputError(f"{path}: {what} file is {size:,} bytes (limit {max_bytes:,})")

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not valid JSON (use null)")

    try:
        doc = json.loads(path.read_bytes(), parse_constant=no_constant)
    except RecursionError:
        raise InputError(f"{path}: {what} nests deeper than Python can parse (limit {max_depth})") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: {what} is not UTF-8 text") from None
    except ValueError as err:  # JSONDecodeError, NaN/Infinity, an integer too long to convert
        raise InputError(f"{path}: not valid JSON ({str(err).splitlines()[0][:120]})") from None
    problem = structure_problem(doc, max_depth)
    if problem:
        raise InputError(f"{path}: {what} {problem}")
    return doc


_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


def json_text_depth(text: str | bytes) -> int:
    """Deepest [ / { nesting of a JSON text, brackets inside strings skipped, computed without parsing
    (a 100k-deep document is measured, not recursed into): the check to run before ``json.loads`` on
    text a user hands in. An unterminated string counts its brackets (errs towards refusing)."""
    import numpy as np

    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    bare = np.frombuffer(_JSON_STRING.sub(b'""', raw), dtype=np.uint8)
    step = np.zeros(bare.size, np.int64)
    step[(bare == ord("[")) | (bare == ord("{"))] = 1
    step[(bare == ord("]")) | (bare == ord("}"))] = -1
    return int(np.cumsum(step).max(initial=0))


def structure_problem(doc: Any, max_depth: int) -> str | None:
    """Why a parsed document is out of bounds (nesting deeper than max_depth, an integer beyond 64 bits),
    or None; iterative, so a deep document cannot exhaust the stack."""
    stack = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            return f"nests deeper than {max_depth} levels"
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
        elif isinstance(node, int) and not isinstance(node, bool) and abs(node) > 2 ** 63:
            return f"holds an integer beyond 64 bits ({str(node)[:20]}...)"
    return None


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy / torch scalars
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")
