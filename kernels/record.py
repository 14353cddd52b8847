"""Which kernel path ran, how often, and how the Triton path compares on real inputs.

Every evaluate (and, where kernels are used, train) stage keeps one record:

    from kernels.record import KernelRecord
    rec = KernelRecord(device)                                   # device the stage computes on
    loss = rec.call("fused_linear_ce", linear_cross_entropy, h, w, y)   # hot loop: backend chosen here
    rec.parity("fused_linear_ce", linear_cross_entropy, h[:64], w, y[:64],
               slice="first 64 eval rows of seed 0")             # Triton path vs torch reference
    rec.save(ctx.out)                                            # kernels.json, read by the report

Paths: ``triton-cuda`` when the stage runs on CUDA; on CPU the hot loop runs the torch reference
(``torch-reference``) and ``parity`` runs the Triton kernel under the interpreter
(``TRITON_INTERPRET=1``, which ``python -m stages`` sets on machines without CUDA before triton is
imported) on a slice of the stage's real inputs. ``parity_max_abs_err`` is the largest absolute
difference between the two paths over every output tensor. A kernel function takes a ``backend=``
keyword ("triton" | "torch").
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import torch

from kernels.dispatch import interpreting, triton_available

RECORD_FILE = "kernels.json"


def _tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for item in out for t in _tensors(item)]
    if isinstance(out, dict):
        return [t for item in out.values() for t in _tensors(item)]
    return []


def max_abs_err(a: Any, b: Any) -> float:
    ta, tb = _tensors(a), _tensors(b)
    if len(ta) != len(tb) or not ta:
        raise ValueError(f"parity: outputs differ in structure ({len(ta)} vs {len(tb)} tensors)")
    err = 0.0
    for x, y in zip(ta, tb):
        if x.shape != y.shape:
            raise ValueError(f"parity: output shapes differ {tuple(x.shape)} vs {tuple(y.shape)}")
        if x.numel():
            err = max(err, float((x.detach().double() - y.detach().double()).abs().max()))
    return err


class KernelRecord:
    """Per-stage record of kernel calls: backend, call count, parity on a slice of real inputs."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.entries: dict[str, dict[str, Any]] = {}

    @property
    def backend(self) -> str:
        """The backend= the hot loop passes: Triton on CUDA, the torch reference on CPU."""
        return "triton" if self.device.type == "cuda" and triton_available() else "torch"

    @property
    def path(self) -> str:
        return "triton-cuda" if self.backend == "triton" else "torch-reference"

    def _entry(self, name: str) -> dict[str, Any]:
        return self.entries.setdefault(name, {"backend": self.path, "calls": 0,
                                              "parity_max_abs_err": None, "parity_backend": None,
                                              "slice": None})

    def count(self, name: str, n: int = 1) -> None:
        """Count n calls made elsewhere with ``backend=rec.backend``."""
        self._entry(name)["calls"] += int(n)

    def call(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self.count(name)
        return fn(*args, backend=self.backend, **kwargs)

    def parity(self, name: str, fn: Callable[..., Any], *args: Any, slice: str, **kwargs: Any) -> float | None:
        """Run fn's Triton path and torch reference on the same (real) inputs; record max |Δ|.

        On CPU this needs the interpreter; without it (or without triton) the record says so and
        returns None rather than pretending."""
        entry = self._entry(name)
        entry["slice"] = slice
        on_cuda = all(t.is_cuda for t in _tensors(list(args)))
        if not triton_available() or not (on_cuda or interpreting()):
            entry["parity_backend"] = "unavailable (no CUDA and TRITON_INTERPRET unset)"
            return None
        with torch.no_grad():
            ref = fn(*args, backend="torch", **kwargs)
            tri = fn(*args, backend="triton", **kwargs)
        err = max_abs_err(tri, ref)
        entry["parity_backend"] = "triton-cuda" if on_cuda else "triton-interpret"
        prev = entry["parity_max_abs_err"]
        entry["parity_max_abs_err"] = err if prev is None else max(prev, err)
        return err

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {k: dict(v) for k, v in sorted(self.entries.items())}

    def save(self, out_dir: Path) -> None:
        """Write kernels.json atomically (temp file + rename) into a stage's output dir."""
        path = Path(out_dir) / RECORD_FILE
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)


def merge_records(*dirs: Path) -> dict[str, dict[str, Any]]:
    """kernels.json of several stage outputs merged (calls add up; worst parity kept)."""
    out: dict[str, dict[str, Any]] = {}
    for d in dirs:
        path = Path(d) / RECORD_FILE
        if not path.exists():
            continue
        for name, e in json.loads(path.read_text()).items():
            if name not in out:
                out[name] = dict(e)
                continue
            o = out[name]
            o["calls"] += e["calls"]
            if e.get("parity_max_abs_err") is not None:
                prev = o.get("parity_max_abs_err")
                if prev is None or e["parity_max_abs_err"] > prev:
                    o.update(parity_max_abs_err=e["parity_max_abs_err"], parity_backend=e["parity_backend"],
                             slice=e["slice"])
    return out


def describe(kernels: dict[str, dict[str, Any]]) -> str:
    """The report's sentence(s) about which path ran, generated from the record."""
    if not kernels:
        return "This paper's stages recorded no kernel calls."
    lines = []
    for name, e in kernels.items():
        s = f"- `{name}`: {e['calls']} call(s) on **{e['backend']}**"
        if e.get("parity_max_abs_err") is not None:
            s += (f"; the Triton path was checked ({e['parity_backend']}) on {e['slice']}: "
                  f"max |Δ| = {e['parity_max_abs_err']:.3g} against the torch reference")
        elif e.get("parity_backend"):
            s += f"; Triton parity not checked: {e['parity_backend']}"
        lines.append(s + ".")
    return "\n".join(lines)


class KernelCounter:
    """One kernel's call counter for code that calls the kernel itself (deep inside a model or a
    reward): ``counter.backend`` is what to pass as ``backend=``, ``counter(n)`` counts n calls into
    the stage's KernelRecord. Without a record (unit tests) it runs the torch reference and counts
    nothing."""

    def __init__(self, rec: KernelRecord | None = None, name: str = "token_logprob"):
        self.rec, self.name = rec, name

    @property
    def backend(self) -> str:
        return self.rec.backend if self.rec is not None else "torch"

    def __call__(self, n: int = 1) -> None:
        if self.rec is not None:
            self.rec.count(self.name, n)

