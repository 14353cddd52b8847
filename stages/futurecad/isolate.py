"""Calls in a worker process, so that a native crash of the CAD kernel (a segfault in OCC, which no Python
handler can catch) costs that call and not the stage.

prepare builds each generated part in such a worker: OCC's shape cleaning after a fillet can segfault on a
valid-looking solid (a 0.5 fillet of the circular edges where a hole cuts a slot's floor did, at 500 test
parts). One spawned worker serves every call in turn and is started again after a crash, so the kernel's
one-time set-up (~2 CPU-s on the first script) and the imports are paid once per crash, not per call. A
forked child per call was measured and not kept: forking before the kernel's first call paid its set-up
per part (prepare 21 -> 390 CPU-s), forking after it deadlocked on the kernel's threads.

    with Isolated() as iso:
        value = iso.call(fn, *args)      # fn(*args) in the worker; ChildCrashed if the worker died
"""
from __future__ import annotations

import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable


class ChildCrashed(RuntimeError):
    """The worker died during the call (a signal, or an exit before it answered)."""

    def __init__(self, what: str, exitcode: int | None):
        how = f"signal {-exitcode}" if exitcode is not None and exitcode < 0 else f"exit code {exitcode}"
        super().__init__(f"{what}: the worker process died ({how})")
        self.exitcode = exitcode


def _single_threaded() -> None:
    import torch
    torch.set_num_threads(1)


class Isolated:
    """One spawned worker process for calls made one at a time; restarted after it dies."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None
        self.crashes = 0

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in the worker (``fn`` module-level, arguments and value picklable): its value, or its
        exception re-raised here; ChildCrashed when the worker dies during the call."""
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn"),
                                             initializer=_single_threaded)
        procs: list = []
        try:
            future = self._pool.submit(fn, *args)
            # the worker processes, taken now: once the pool breaks, its manager thread may clear its own table
            # before this thread reads it (seen under load: the crash then reported "exit code None")
            procs = list((getattr(self._pool, "_processes", None) or {}).values())
            return future.result()
        except BrokenProcessPool:
            for p in procs:
                p.join(timeout=5)                         # the dead worker's exit status
            code = next((p.exitcode for p in procs if p.exitcode is not None), None)
            self.close()
            self.crashes += 1
            raise ChildCrashed(getattr(fn, "__name__", "call"), code) from None

    def close(self) -> None:
        if self._pool is not None:
            procs = list((getattr(self._pool, "_processes", None) or {}).values())
            self._pool.shutdown(wait=False, cancel_futures=True)
            for p in procs:
                if p.is_alive():
                    p.kill()
            self._pool = None

    def __enter__(self) -> "Isolated":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
