"""Schedules and deployments (no server needed), the DVC remote checks, the API check."""
from __future__ import annotations

import pytest

from flows import remote as dvc_remote
from flows import serve

PARAMS = {"papers": {"a": {}, "b": {}}}


def test_schedules_come_from_params_then_cli():
    crons = serve.schedules_for({**PARAMS, "schedules": {"a": "0 3 * * *", "all": "0 5 * * 0"}}, ["a", "b"], "*/30 * * * *")
    assert crons == {"a": "0 3 * * *", "b": "*/30 * * * *", "all": "0 5 * * 0"}
    assert serve.schedules_for(PARAMS, ["a", "b"], None) == {"a": None, "b": None, "all": None}


@pytest.mark.parametrize("schedules, cli, message", [
    ({"a": "every day"}, None, "schedules.a: invalid cron string 'every day'"),
    ({"zz": "0 3 * * *"}, None, "schedules.zz: unknown paper"),
    ({}, "61 * * * *", "--cron: invalid cron string '61 * * * *'"),
])
def test_bad_schedules_name_the_key(schedules, cli, message):
    with pytest.raises(serve.ServeError, match=message.replace("*", r"\*")):
        serve.schedules_for({**PARAMS, "schedules": schedules}, ["a", "b"], cli)


def test_deployments_carry_cron_and_slug(repo_template):
    deps = serve.build_deployments(repo_template, cli_cron="0 4 * * *", papers=["reversal_curse"])
    (dep,) = deps
    assert (dep.flow_name, dep.name, dep.parameters) == ("paper", "reversal_curse", {"slug": "reversal_curse"})
    assert [s.schedule.cron for s in dep.schedules] == ["0 4 * * *"]
    names = [d.name for d in serve.build_deployments(repo_template)]
    assert names[-1] == "all" and "reversal_curse" in names
    with pytest.raises(serve.ServeError, match="papers.nope: unknown paper"):
        serve.build_deployments(repo_template, papers=["nope"])


def test_unreachable_api_fails_fast_naming_it(monkeypatch):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    url = f"http://127.0.0.1:{serve.free_port()}/api"
    with temporary_settings({PREFECT_API_URL: url}):
        with pytest.raises(serve.ServeError, match=f"Prefect API {url}: no answer within 2 s"):
            serve.check_api(timeout=2)


def test_missing_remote_folder_is_named_and_not_configured(paper_repo, tmp_path, tool_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(dvc_remote.RemoteError, match=f"folder {missing} does not exist"):
        dvc_remote.configure(str(missing), paper_repo)
    with pytest.raises(dvc_remote.RemoteError, match="no default DVC remote is configured"):
        dvc_remote.check(paper_repo)


def test_unsupported_url_is_named(paper_repo, tool_path):
    with pytest.raises(dvc_remote.RemoteError, match="DVC remote 'shared'.*(Unsupported URL|nosuch)"):
        dvc_remote.configure("nosuch://bucket/path", paper_repo, local=True)


def test_local_folder_remote_is_configured_and_checked(paper_repo, tmp_path, tool_path):
    store = tmp_path / "store"
    store.mkdir()
    assert dvc_remote.configure(str(store), paper_repo, local=True) == str(store)
    assert dvc_remote.check(paper_repo) == f"'shared' ({store})"
    store.rmdir()  # the folder disappears later (unmounted share): named before any transfer
    with pytest.raises(dvc_remote.RemoteError, match=f"DVC remote 'shared': folder {store} does not exist"):
        dvc_remote.check(paper_repo)


@pytest.mark.parametrize("argv", [["submit", "reversal_curse"], ["setup", "--repo", "/nowhere"]])
def test_pools_cli_unreachable_api_is_one_line(argv, capsys):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows import pools

    url = f"http://127.0.0.1:{serve.free_port()}/api"
    with temporary_settings({PREFECT_API_URL: url}):
        assert pools.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: Prefect API {url}: no answer") and "\n" not in err
