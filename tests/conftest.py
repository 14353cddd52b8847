"""Session-wide test set-up.

- TRITON_INTERPRET=1 before anything imports triton, so every kernel's Triton path runs on the CPU.
- Hugging Face hub and datasets offline (HF_HUB_OFFLINE=1 ...): nothing downloads.
- W&B disabled unless a test opts in (tests/common/test_tracking.py runs it offline).
- One session-wide Prefect test harness with a temporary PREFECT_HOME (fixture ``prefect_harness``).
- ``smoke_run``: run a paper's stages at the smoke profile into a temporary root.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("TRITON_INTERPRET", "1")  # a GPU run may set 0 (tests/common/test_gpu_smoke.py)
os.environ.setdefault("WANDB_MODE", "disabled")
# nothing is downloaded in tests: Hugging Face hub/datasets offline (stages.common.sources.resolve_ref refuses
# a hub name that is not cached with one line naming the key)
for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_var, "1")
os.environ["WANDB_SILENT"] = "true"
if "PREFECT_HOME" not in os.environ:
    os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="prefect-home-")
    atexit.register(shutil.rmtree, os.environ["PREFECT_HOME"], ignore_errors=True)
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["DVC_NO_ANALYTICS"] = "1"
os.environ["PYTHONDONTWRITEBYTECODE"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)  # tiny models: one thread is faster and steadier than two on 2 shared cores


@pytest.fixture(scope="session")
def prefect_harness():
    """One ephemeral Prefect API for the whole session (its first start takes ~20 s)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture
def smoke_run(tmp_path):
    """smoke_run(slug, stages=...) -> {stage: output dir} under a temporary root."""
    from stages.common.runner import run_pipeline

    def run(slug: str, stages=("prepare", "train", "evaluate", "report")):
        return run_pipeline(slug, root=tmp_path, profile="smoke", stages=tuple(stages))

    run.root = tmp_path
    return run


def pytest_collection_modifyitems(config, items):
    """`make test` runs two pytest-xdist workers with ``--dist loadgroup`` (one per core: every test is single-
    threaded). Each test file is one group, so a file's module/session fixtures are built once; every test under
    tests/flows shares one group, so the session-wide Prefect harness and repo template are started on one worker
    only (one Prefect server per run). Files whose tests share no fixtures beyond one test (the per-paper
    determinism runs, ~19 smoke pipelines twice) are spread test by test. Without xdist the marker is inert."""
    per_test = {"tests/common/test_determinism.py"}
    for item in items:
        rel = item.nodeid.split("::", 1)[0]
        group = "flows" if rel.startswith("tests/flows/") else item.nodeid if rel in per_test else rel
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture
def run_stage(tmp_path):
    """run_stage(slug, stage, **config) -> the output folder: one stage's ``run`` with that Config (profile default)
    into a fresh folder under tmp_path, as the runner would call it (inputs read from tmp_path's data/)."""
    from stages.common.runner import StageContext, stage_module

    def run(slug: str, stage: str, **config):
        module = stage_module(slug, stage)
        out = tmp_path / f"{slug}-{stage}"
        out.mkdir()
        module.run(module.Config(**config),
                   StageContext(slug=slug, stage=stage, profile="default", out=out, root=tmp_path))
        return out

    run.root = tmp_path
    return run
