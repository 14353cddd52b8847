"""Fixtures for the flow tests (helpers live in flowkit.py and flowkit_cluster.py)."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from flowkit import SLUG, copy_repo


@pytest.fixture(scope="session")
def repo_template(tmp_path_factory) -> Path:
    """One smoke-profile copy per session; tests copy it again (cheap) before mutating."""
    return copy_repo(tmp_path_factory.mktemp("repo-template") / "repo")


@pytest.fixture(scope="session")
def smoke_flow(prefect_harness, tmp_path_factory, repo_template):
    """(state, repo): the paper flow run once, in-process, on a smoke copy (later tests reuse it)."""
    from flows.paper_flow import paper_flow

    repo = tmp_path_factory.mktemp("smoke-flow") / "repo"
    shutil.copytree(repo_template, repo, symlinks=True)
    return paper_flow(SLUG, root=str(repo), sync=False, return_state=True), repo


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    """One real `prefect server start` on loopback for the session (UI off), plus worker control."""
    from flowkit_cluster import Cluster

    cl = Cluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield cl
    finally:
        cl.close()


@pytest.fixture
def paper_repo(repo_template, tmp_path) -> Path:
    dst = tmp_path / "repo"
    shutil.copytree(repo_template, dst, symlinks=True)
    return dst


@pytest.fixture
def tool_path(monkeypatch):
    """This interpreter's bin dir first on PATH (DVC's stage cmds call `python`)."""
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    monkeypatch.delenv("PAPERS_ROOT", raising=False)
