"""prepare's CAD work in a worker process (stages/futurecad/isolate.py): values and exceptions come back, a native
crash is a ChildCrashed and the next call gets a fresh worker; a part whose build crashes is skipped like a
refused script, named in meta.json, and the run still makes the parts it asked for."""
from __future__ import annotations

import json
import math
import os

import polars as pl
import pytest

from stages.futurecad import isolate
from stages.futurecad import prepare as prep


def test_worker_returns_raises_and_survives_a_native_crash():
    with isolate.Isolated() as iso:
        assert iso.call(math.factorial, 10) == 3_628_800
        with pytest.raises(ValueError):
            iso.call(int, "not a number")
        first = iso.call(os.getpid)
        with pytest.raises(isolate.ChildCrashed, match="signal 6"):
            iso.call(os.abort)                       # SIGABRT in the worker, like OCC's SIGSEGV
        assert iso.crashes == 1
        second = iso.call(os.getpid)
        assert second != first and second != os.getpid()
        assert iso.call(math.factorial, 5) == 120    # the fresh worker serves the next call


def test_crash_reports_the_signal_when_the_pool_clears_its_table_first(monkeypatch):
    """The pool's manager thread may clear its process table before the caller reads it (seen under load in CI:
    "exit code None"); the worker processes are taken at submit, so the signal is still reported."""
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    class ClearingPool(ProcessPoolExecutor):
        def submit(self, *args, **kw):
            future = super().submit(*args, **kw)
            result = future.result

            def cleared_first(timeout=None):
                try:
                    return result(timeout)
                except BrokenProcessPool:
                    self._processes = None                # the manager thread's clean-up won the race
                    raise
            future.result = cleared_first
            return future

    monkeypatch.setattr(isolate, "ProcessPoolExecutor", ClearingPool)
    with isolate.Isolated() as iso:
        with pytest.raises(isolate.ChildCrashed, match="signal 6"):
            iso.call(os.abort)


class _CrashOn:
    """Stands in for isolate.Isolated in this process: the k-th call raises ChildCrashed, the others run."""
    k = 3

    def __init__(self):
        self.n = 0

    def call(self, fn, *args):
        self.n += 1
        if self.n == self.k:
            raise isolate.ChildCrashed(fn.__name__, -11)
        return fn(*args)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


SMALL = dict(n_train_parts=6, n_val_parts=2, n_test_parts=3, seeds=[0], programs_per_part=1, test_programs_per_part=1,
             topology_per_part=1, absent_per_part=2, foreign_per_part=1, nonsense_per_part=1, test_foreign_per_part=1,
             test_nonsense=4, n_points=64)


def _prepare(root):
    from stages.common.runner import StageContext
    out = root / "prepare"
    out.mkdir(parents=True)
    prep.run(prep.Config(**SMALL), StageContext(slug="futurecad", stage="prepare", profile="default", out=out, root=root))
    return out


def test_prepare_skips_a_part_that_crashes_the_kernel(monkeypatch, tmp_path):
    out_ok = _prepare(tmp_path / "ok")
    meta_ok = json.loads((out_ok / "meta.json").read_text())
    assert "parts_skipped_kernel_crash" not in meta_ok
    parts_ok = pl.read_parquet(out_ok / "parts.parquet")

    monkeypatch.setattr(isolate, "Isolated", _CrashOn)
    calls = []
    real_random_part = prep.cad.random_part
    monkeypatch.setattr(prep.cad, "random_part", lambda rng: calls.append(real_random_part(rng)) or calls[-1])
    out = _prepare(tmp_path / "crash")
    meta = json.loads((out / "meta.json").read_text())
    parts = pl.read_parquet(out / "parts.parquet")
    skipped = meta["parts_skipped_kernel_crash"]
    assert len(skipped) == 1 and "signal 11" in skipped[0]["error"]
    assert skipped[0]["script"] == calls[_CrashOn.k - 1]["script"]       # the third part drawn
    assert len(parts) == len(parts_ok) == meta["n_parts"]                 # still every part asked for
    assert skipped[0]["script"] not in parts["script"].to_list()
    # the parts before the crash are the same; the one after it is the next draw of the same stream
    assert parts["script"].to_list()[:_CrashOn.k - 1] == parts_ok["script"].to_list()[:_CrashOn.k - 1]
    assert parts["script"][_CrashOn.k - 1] == calls[_CrashOn.k]["script"]

