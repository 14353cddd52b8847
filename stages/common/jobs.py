"""Independent runs (a seed's training run, one arm of one seed, one sampler's evaluation stream) in a pool of
single-threaded processes, one per core (issue 55: "seeds in parallel processes only where vectorizing is
impossible").

Where processes and not a vectorized seed ensemble (``stages.common.ensemble``): when the work is compute-bound,
not overhead-bound. Stacking seeds saves nothing on dense transformer batches of tens to thousands of rows (the
ensemble benchmark: ~1.1x at d = 64, T = 32, B = 32, none beyond; justgrpo's py-spy profile,
``reports/profiles/justgrpo-train.txt``, puts ~97% of its train stage in its own torch ops). Runs that share nothing
but their inputs then take half the wall time in two processes on two cores. Each run must draw only from its own
seeded generators, so its result does not depend on the pool: ``workers: 1`` runs the same functions in this
process, in the same order, with the same single intra-op thread (each paper that uses the pool tests that the two
agree exactly).

    results = run_jobs(fn, jobs, payload, workers)   # [fn(job) for job in jobs], payload read via payload()

``fn`` must be a module-level function (it is pickled by name); ``payload`` (tensors, dicts) is sent once to
each worker. Errors and interrupts stop the pool at once (queued jobs cancelled, workers killed).

``STAGES_MAX_WORKERS`` (environment, a positive integer) caps ``workers``: ``make repro`` runs two papers at a time
on two cores and sets it to cores // lanes, so two lanes do not start four processes on two cores (the results are
the same either way: pool = in-process).
"""
from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import torch
from threadpoolctl import threadpool_limits

_PAYLOAD: dict[str, Any] = {}


def _init_worker(payload: dict[str, Any]) -> None:
    torch.set_num_threads(1)                # one intra-op thread per process: the processes are the parallelism
    threadpool_limits(1)                    # and one BLAS/OpenMP thread for numpy/scipy work in the jobs
    _PAYLOAD.clear()
    _PAYLOAD.update(payload)


def payload() -> dict[str, Any]:
    """The payload of the current pool (in a worker process, or in this process when workers = 1)."""
    return _PAYLOAD


def max_workers() -> int:
    """The cap on pool processes from ``STAGES_MAX_WORKERS`` (unset: no cap)."""
    raw = os.environ.get("STAGES_MAX_WORKERS", "").strip()
    if not raw:
        return 1 << 30
    try:
        cap = int(raw)
    except ValueError:
        cap = 0
    if cap < 1:
        raise ValueError(f"STAGES_MAX_WORKERS: {raw!r} is not a positive integer")
    return cap


def run_jobs(fn: Callable[[Any], Any], jobs: Sequence[Any], data: dict[str, Any], workers: int) -> list[Any]:
    """``[fn(job) for job in jobs]``, in job order; with ``workers > 1`` in that many spawned single-threaded
    processes (jobs are handed out in order, so put the longest first)."""
    if workers < 1:
        raise ValueError(f"workers: {workers} < 1")
    workers = min(workers, max_workers())
    if workers == 1 or len(jobs) <= 1:
        threads = torch.get_num_threads()
        with threadpool_limits(1):          # restored on exit, like torch's thread count below
            _init_worker(data)
            try:
                return [fn(j) for j in jobs]
            finally:
                torch.set_num_threads(threads)
                _PAYLOAD.clear()
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    pool = ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=mp.get_context("spawn"),
                               initializer=_init_worker, initargs=(data,))
    try:
        results = list(pool.map(fn, jobs))
    except BaseException:   # an error or an interrupt: stop now, queue nothing more
        procs = list(getattr(pool, "_processes", {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in procs:  # SIGKILL: Lightning's own SIGTERM handler would let a run finish first
            proc.kill()
        raise
    pool.shutdown(wait=True)
    return results
