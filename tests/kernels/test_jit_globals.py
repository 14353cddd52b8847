"""Every module global a @triton.jit function reads is one the GPU compiler accepts: a module (tl, math), another
jit function, or a ``tl.constexpr``. The interpreter (TRITON_INTERPRET=1, every CPU test) reads any Python global,
so a plain float used inside a kernel passes on the CPU and fails to compile on a GPU (cosine_soft_ce's BIG did,
on the first CUDA run: "CompilationError ... at 11:30")."""
from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import textwrap
import types

import pytest

import kernels

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

MODULES = [info.name for info in pkgutil.iter_modules(kernels.__path__)]
KERNEL_MODULES = [m for m in MODULES if m not in ("bench", "dispatch", "testing", "record", "naive")]


def _is_jit(obj) -> bool:
    """A @triton.jit function: a JITFunction, or under TRITON_INTERPRET=1 an InterpretedFunction."""
    return isinstance(obj, triton.runtime.jit.KernelInterface) and isinstance(getattr(obj, "fn", None),
                                                                            types.FunctionType)


def _jit_functions(module):
    for name, obj in vars(module).items():
        if _is_jit(obj):
            yield name, obj.fn


def _bad_globals(fn) -> list[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    func = tree.body[0]
    local = {a.arg for a in func.args.args} | {n.id for n in ast.walk(func)
                                                 if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    bad = []
    for node in ast.walk(func):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in local:
            if node.id not in fn.__globals__:
                continue                                              # builtins (range, float, min)
            value = fn.__globals__[node.id]
            ok = isinstance(value, (types.ModuleType, tl.constexpr)) or _is_jit(value)
            if not ok:
                bad.append(f"{node.id} ({type(value).__name__}) at line {node.lineno}")
    return bad


@pytest.mark.parametrize("name", MODULES)
def test_kernels_read_only_constexpr_globals(name):
    module = importlib.import_module(f"kernels.{name}")
    if name in KERNEL_MODULES:
        assert any(True for _ in _jit_functions(module)), f"kernels/{name}.py: no @triton.jit function found"
    bad = {fname: b for fname, fn in _jit_functions(module) if (b := _bad_globals(fn))}
    assert not bad, f"kernels/{name}.py: globals a GPU compile refuses (make them tl.constexpr): {bad}"


def test_the_check_finds_a_plain_float_global():
    """The check itself: a kernel reading a plain-float global is flagged, one reading a constexpr is not."""
    ns = {"tl": tl, "BIG": 3.0e38, "CBIG": tl.constexpr(3.0e38)}
    src = "def k(x):\n    y = BIG\n    z = CBIG\n    return tl.full([1], y, tl.float32)\n"
    exec(compile(src, "<k>", "exec"), ns)
    fn = ns["k"]
    fn.__globals__.update(ns)
    import linecache
    linecache.cache["<k>"] = (len(src), None, src.splitlines(True), "<k>")
    assert _bad_globals(fn) == ["BIG (float) at line 2"]
