"""Layering: kernels/ imports nothing from stages/ or flows/; flows/ modules form no import circle;
stages/ never imports flows/."""
from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

from stages.common.paths import ROOT


def imports_of(path: Path) -> set[str]:
    """Every module a file imports, at any depth (function-level imports count too)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def test_kernels_import_nothing_from_stages_or_flows():
    bad = {f"kernels/{p.name}": sorted(m for m in imports_of(p) if m.split(".")[0] in ("stages", "flows"))
           for p in sorted((ROOT / "kernels").glob("*.py"))}
    assert {k: v for k, v in bad.items() if v} == {}


def test_stages_never_import_flows():
    bad = {str(p.relative_to(ROOT)): sorted(m for m in imports_of(p) if m.split(".")[0] == "flows")
           for p in sorted((ROOT / "stages").rglob("*.py"))}
    assert {k: v for k, v in bad.items() if v} == {}


def test_flows_have_no_import_circle():
    graph = nx.DiGraph()
    modules = {p.stem for p in (ROOT / "flows").glob("*.py") if p.stem != "__init__"}
    for name in modules:
        graph.add_node(name)
        for mod in imports_of(ROOT / "flows" / f"{name}.py"):
            parts = mod.split(".")
            if parts[0] == "flows" and len(parts) > 1 and parts[1] in modules and parts[1] != name:
                graph.add_edge(name, parts[1])
            elif mod == "flows":
                continue
    assert list(nx.simple_cycles(graph)) == []
