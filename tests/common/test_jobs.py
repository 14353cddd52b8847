"""The shared process pool (stages/common/jobs.py): jobs come back in order, each worker runs one intra-op
thread, the payload reaches the jobs, and a worker's error reaches the caller."""
from __future__ import annotations

import pytest
import torch

from stages.common.jobs import payload, run_jobs


def _draw(job):
    """A job that reads the payload and draws from its own seeded generator."""
    g = torch.Generator().manual_seed(job)
    return {"job": job, "x": (torch.randn(5, generator=g) * payload()["scale"]).tolist(),
            "threads": torch.get_num_threads()}


def _fail(job):
    if job == 2:
        raise ValueError(f"job {job} is bad")
    return job


def test_jobs_in_order_and_equal_across_workers():
    jobs = [3, 1, 2, 7]
    solo = run_jobs(_draw, jobs, {"scale": 2.5}, workers=1)
    pooled = run_jobs(_draw, jobs, {"scale": 2.5}, workers=2)
    assert [r["job"] for r in pooled] == jobs
    assert solo == pooled
    assert all(r["threads"] == 1 for r in pooled)                   # one intra-op thread per process
    g = torch.Generator().manual_seed(7)
    assert solo[3]["x"] == pytest.approx((torch.randn(5, generator=g) * 2.5).tolist(), abs=0)
    assert payload() == {}                                           # the in-process payload is dropped after


def test_worker_error_reaches_the_caller():
    with pytest.raises(ValueError, match="job 2 is bad"):
        run_jobs(_fail, [1, 2, 3], {}, workers=2)
    with pytest.raises(ValueError, match="workers"):
        run_jobs(_fail, [1], {}, workers=0)


def _die(job):
    import os
    os._exit(3)                         # a worker that dies without a Python exception (OOM kill, segfault)


class _Unpicklable:
    def __reduce__(self):
        raise RuntimeError("this payload cannot be pickled")


def test_dead_worker_or_bad_payload_raise_instead_of_hanging():
    """A worker process that dies (here: os._exit in its first job) breaks the pool and the caller gets an error
    (BrokenProcessPool), not a hang; a payload that cannot be sent to the workers fails at once."""
    from concurrent.futures.process import BrokenProcessPool

    with pytest.raises(BrokenProcessPool):
        run_jobs(_die, [1, 2, 3], {}, workers=2)
    with pytest.raises(RuntimeError, match="cannot be pickled"):
        run_jobs(_draw, [1, 2], {"scale": _Unpicklable()}, workers=2)


def _pid(job):
    import os
    return os.getpid()


def test_max_workers_env_caps_the_pool(monkeypatch):
    """STAGES_MAX_WORKERS (set by make repro's lanes) caps the pool: 1 runs the jobs in this process; a bad value
    is an error naming the variable."""
    import os
    monkeypatch.setenv("STAGES_MAX_WORKERS", "1")
    assert run_jobs(_pid, [0, 1, 2], {}, workers=2) == [os.getpid()] * 3
    monkeypatch.setenv("STAGES_MAX_WORKERS", "2")
    pids = run_jobs(_pid, [0, 1, 2, 3], {}, workers=4)
    assert os.getpid() not in pids and len(set(pids)) <= 2
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv("STAGES_MAX_WORKERS", bad)
        with pytest.raises(ValueError, match="STAGES_MAX_WORKERS"):
            run_jobs(_pid, [0, 1], {}, workers=2)


def test_lane_cap_applies_to_a_stages_torch_threads(monkeypatch):
    """STAGES_MAX_WORKERS also caps a stage's ``torch_threads`` (make repro's lanes: cores // lanes), as the runner
    hands the config to the stage; unset, or above the paper's own value, the config is unchanged; a config
    without ``torch_threads`` is untouched."""
    from pydantic import Field

    from stages.common.config import StageConfig
    from stages.common.runner import lane_capped, load_config

    class Threads(StageConfig):
        torch_threads: int = Field(3, ge=1)
        lr: float = 0.25

    class NoThreads(StageConfig):
        lr: float = 0.25

    monkeypatch.delenv("STAGES_MAX_WORKERS", raising=False)
    cfg = Threads()
    assert lane_capped(cfg) is cfg
    monkeypatch.setenv("STAGES_MAX_WORKERS", "2")
    capped = lane_capped(cfg)
    assert capped.torch_threads == 2 and capped.lr == 0.25 and cfg.torch_threads == 3
    monkeypatch.setenv("STAGES_MAX_WORKERS", "4")
    assert lane_capped(cfg).torch_threads == 3
    monkeypatch.setenv("STAGES_MAX_WORKERS", "1")
    plain = NoThreads()
    assert lane_capped(plain) is plain
    _, star, _ = load_config("star_kv", "train", "default")      # a paper whose default runs 2 intra-op threads
    assert star.torch_threads == 2 and lane_capped(star).torch_threads == 1
