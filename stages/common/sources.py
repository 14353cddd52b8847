"""Where each paper's real data/model comes from, and the fixture test that proves the loader.

Every paper declares ``SOURCES`` in ``stages/<slug>/__init__.py``:

    from stages.common.sources import Source
    SOURCES = [Source(
        real="The Well: shear_flow, turbulent_radiative_layer_2D (HDF5, `the_well` layout)",
        params_key="papers.walrus.prepare.source",            # where params name it (`full` sets it)
        loader="stages.walrus.well:load_well_hdf5",            # module:function reading the real format
        fixture_test="tests/walrus/test_real_source.py::test_well_fixture",  # pytest -m real_source
    )]

A paper without a real source (a synthetic world or an official generator only) declares
``Source(real=None, note="synthetic/official world only: ...")``. ``python -m stages sources``
prints the table; tests/common checks that every loader and fixture test exists.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

from stages.common.paths import ROOT


@dataclass(frozen=True)
class Source:
    real: str | None                 # the real dataset/model named for `full` (None: synthetic only)
    params_key: str = ""             # papers.<slug>.<stage>.<key> that selects it
    loader: str = ""                 # "module:function" reading the real format
    fixture_test: str = ""           # "tests/<slug>/test_x.py::test_y" (marked real_source)
    note: str = ""                   # what `full` runs, or why there is no real source


def paper_sources(slug: str) -> list[Source] | None:
    """The paper's declared sources (None when it declares none yet)."""
    mod = importlib.import_module(f"stages.{slug}")
    return getattr(mod, "SOURCES", None)


def check_source(src: Source, root: Path = ROOT) -> list[str]:
    """Problems with a declaration: a loader that does not import, a fixture test file that is missing."""
    problems = []
    if src.real is None:
        return problems if src.note else ["no real source and no note saying why"]
    mod, _, func = src.loader.partition(":")
    try:
        if not callable(getattr(importlib.import_module(mod), func)):
            problems.append(f"loader {src.loader} is not callable")
    except (ImportError, AttributeError) as err:
        problems.append(f"loader {src.loader} does not import ({type(err).__name__})")
    path, _, test = src.fixture_test.partition("::")
    if not path or not (root / path).exists():
        problems.append(f"fixture test file {path or '(none)'} is missing")
    elif test and f"def {test.split('[')[0]}" not in (root / path).read_text():
        problems.append(f"fixture test {test} not found in {path}")
    return problems


def sources_table(slugs: list[str], root: Path = ROOT) -> str:
    lines = ["| paper | real source (full profile) | selected by | loader | fixture test | status |",
             "| --- | --- | --- | --- | --- | --- |"]
    for slug in slugs:
        srcs = paper_sources(slug)
        if not srcs:
            lines.append(f"| {slug} | (not declared) | | | | missing |")
            continue
        for s in srcs:
            problems = check_source(s, root)
            status = "ok" if not problems else "; ".join(problems)
            real = s.real or f"synthetic/official world only — {s.note}"
            lines.append(f"| {slug} | {real} | {s.params_key or '—'} | {s.loader or '—'} | "
                         f"{s.fixture_test or '—'} | {status} |")
    return "\n".join(lines)
