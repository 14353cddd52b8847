"""Reliability: strict YAML, every profile validated, a schema-driven fuzzer over every registered
paper's stage Configs (each mutation must be an early ConfigError naming its key), interruption by
SIGTERM/SIGKILL leaving no output behind, and normal output permissions."""
from __future__ import annotations

import copy
import math
import os
import signal
import subprocess
import sys
import time
import types
import typing
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from stages.common.config import STAGES, ConfigError, read_params, registered_papers, validate_all_profiles
from stages.common.paths import ROOT, atomic_dir, atomic_write_text, remove_stale_temps
from stages.common.runner import load_config, stage_module

REAL = read_params(ROOT / "params.yaml")


def write_params(tmp_path: Path, params: dict) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


# --- strict YAML and the top level ----------------------------------------------------------------
def test_duplicate_keys_are_errors_with_line(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("profile: default\npapers:\n  a: {}\npapers:\n  b: {}\n")
    with pytest.raises(ConfigError, match=r"params.yaml:4:1: duplicate key 'papers' \(first at line 2\)"):
        read_params(path)


def test_yaml_syntax_error_is_one_line(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("profile: default\npapers:\n  a: [1, 2\n")
    with pytest.raises(ConfigError) as err:
        read_params(path)
    assert "\n" not in str(err.value) and "params.yaml:" in str(err.value)


def test_unknown_top_level_key(tmp_path):
    params = copy.deepcopy(REAL)
    params["profle"] = "smoke"
    with pytest.raises(ConfigError, match="profle: unknown top-level key"):
        read_params(write_params(tmp_path, params))


def test_bad_key_under_full_fails_even_in_smoke(tmp_path):
    slug = registered_papers(REAL)[0]
    params = copy.deepcopy(REAL)
    block = params["papers"][slug]["prepare"]
    block.setdefault("profiles", {}).setdefault("full", {})["no_such_key"] = 1
    with pytest.raises(ConfigError, match=rf"papers\.{slug}\.prepare \(profile full\)\.no_such_key: unknown key"):
        load_config(slug, "prepare", "smoke", write_params(tmp_path, params))


# --- the fuzzer: mutations generated from each Config schema --------------------------------------
def _unwrap(ann):
    """(base type, Literal choices or None, allows None)."""
    origin = typing.get_origin(ann)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(ann)[0])
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        base, lit, _ = _unwrap(args[0]) if len(args) == 1 else (None, None, False)
        return base, lit, True
    if origin is typing.Literal:
        return str, typing.get_args(ann), False
    if origin in (list, tuple):
        return list, None, False
    return ann, None, False


def _allows_inf(field) -> bool:
    return any(getattr(m, "allow_inf_nan", None) for m in field.metadata)


def _lower_bound(field):
    for m in field.metadata:
        for attr in ("ge", "gt"):
            if getattr(m, attr, None) is not None:
                return attr, getattr(m, attr)
    return None


def mutations(model: type[BaseModel], block: dict, prefix: str):
    """(label, mutated block, key that the error must name) for every field of model."""
    yield "unknown key", {**block, "zz_typo_key": 1}, f"{prefix}.zz_typo_key"
    for name, field in model.model_fields.items():
        base, choices, nullable = _unwrap(field.annotation)
        key = f"{prefix}.{name}"
        if isinstance(base, type) and issubclass(base, BaseModel):
            sub = block.get(name)
            if not isinstance(sub, dict):
                if any(f.is_required() for f in base.model_fields.values()):
                    continue  # an optional block switched off here (null): nothing to mutate inside it
                sub = {}
            for label, mutated, k in mutations(base, sub, key):
                yield f"{name}: {label}", {**block, name: mutated}, k
            continue
        if choices is not None:
            yield f"{name}: not a choice", {**block, name: "zz_not_a_choice"}, key
        elif base is bool:
            yield f"{name}: string for bool", {**block, name: "yes please"}, key
        elif base is int:
            yield f"{name}: string for int", {**block, name: "12x"}, key
            yield f"{name}: float for int", {**block, name: 2.5}, key
            bound = _lower_bound(field)
            if bound is not None and not math.isinf(bound[1]):
                below = bound[1] - 1 if bound[0] == "ge" else bound[1]
                yield f"{name}: below its bound", {**block, name: int(math.floor(below))}, key
        elif base is float:
            yield f"{name}: string for float", {**block, name: "0.1x"}, key
            if not _allows_inf(field):
                yield f"{name}: NaN", {**block, name: float("nan")}, key
                yield f"{name}: inf", {**block, name: float("inf")}, key
        elif base is list:
            yield f"{name}: scalar for list", {**block, name: "not-a-list"}, key


def _cases():
    cases = []
    for slug in registered_papers(REAL):
        for stage in STAGES:
            try:
                module = stage_module(slug, stage)
            except ConfigError as err:  # registered without its stage module: one failing case
                cases.append(pytest.param(slug, stage, None, str(err), id=f"{slug}.{stage}.missing-module"))
                continue
            raw = copy.deepcopy(REAL["papers"][slug].get(stage) or {})
            raw.pop("profiles", None)
            for label, mutated, key in mutations(module.Config, raw, f"papers.{slug}.{stage}"):
                cases.append(pytest.param(slug, stage, mutated, key, id=f"{slug}.{stage}.{label}"))
    return cases


CASES = _cases()


def test_fuzzer_covers_every_paper():
    assert {c.values[0] for c in CASES} == set(registered_papers(REAL))
    assert len(CASES) >= 20 * len(registered_papers(REAL))


@pytest.mark.parametrize("slug, stage, mutated, key", CASES)
def test_fuzzed_param_is_an_early_error_naming_the_key(slug, stage, mutated, key):
    assert mutated is not None, key
    params = copy.deepcopy(REAL)
    profiles = params["papers"][slug].get(stage, {}) or {}
    profiles = profiles.get("profiles") if isinstance(profiles, dict) else None
    params["papers"][slug][stage] = {**mutated, **({"profiles": profiles} if profiles else {})}
    with pytest.raises(ConfigError) as err:  # the same validation load_config runs after reading the file
        validate_all_profiles(params, slug, stage, stage_module(slug, stage).Config, "default")
    msg = str(err.value)
    assert key in msg, f"error does not name {key}: {msg}"
    assert "\n" not in msg and len(msg) < 600


# --- interruption, stale temp dirs, permissions -----------------------------------------------------
def test_stale_temp_of_dead_process_is_removed(tmp_path):
    final = tmp_path / "out"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".out.tmp-{dead.pid}-abc"
    stale.mkdir()
    mine = tmp_path / f".out.tmp-{os.getpid()}-live"
    mine.mkdir()
    assert remove_stale_temps(final) == [stale]
    assert mine.exists() and not stale.exists()


def test_outputs_have_normal_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        with atomic_dir(tmp_path / "out") as tmp:
            atomic_write_text(tmp / "a.txt", "x")
        assert (tmp_path / "out").stat().st_mode & 0o777 == 0o755
        assert (tmp_path / "out" / "a.txt").stat().st_mode & 0o777 == 0o644
    finally:
        os.umask(old)


def _slow_stage_env(tmp_path: Path) -> dict:
    """A temporary root whose reversal_curse prepare ran (default profile, seconds) and whose train
    (default profile) runs long enough to be interrupted."""
    from stages.common.runner import run_stage

    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    run_stage("reversal_curse", "prepare", "default", root=tmp_path, params_path=tmp_path / "params.yaml")
    return {**os.environ, "PAPERS_ROOT": str(tmp_path), "WANDB_MODE": "disabled"}


def _start_and_wait_for_temp(tmp_path: Path, env: dict) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "stages", "train", "reversal_curse", "--profile", "default"],
                            cwd=ROOT, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    parent = tmp_path / "data" / "reversal_curse"
    deadline = time.monotonic() + 180
    while not list(parent.glob(f".train.tmp-{proc.pid}-*")):
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "train never created its temp dir"
        time.sleep(0.2)
    time.sleep(1.0)
    return proc


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_ends_stage_cleanly(tmp_path, sig, code):
    env = _slow_stage_env(tmp_path)
    proc = _start_and_wait_for_temp(tmp_path, env)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    last = [line for line in err.splitlines() if line.strip()][-1]
    assert last.startswith("train@reversal_curse: interrupted by") and "nothing was written" in last
    parent = tmp_path / "data" / "reversal_curse"
    assert not list(parent.glob(".train.tmp-*")) and not (parent / "train").exists()


def test_sigkill_temp_is_removed_by_next_run(tmp_path):
    env = _slow_stage_env(tmp_path)
    proc = _start_and_wait_for_temp(tmp_path, env)
    proc.kill()
    proc.wait(timeout=30)
    parent = tmp_path / "data" / "reversal_curse"
    left = list(parent.glob(".train.tmp-*"))
    assert left, "SIGKILL should leave the temp dir behind"
    again = _start_and_wait_for_temp(tmp_path, env)  # the next run of the stage, once it has started:
    assert [p.name for p in parent.glob(".train.tmp-*")] == \
        [p.name for p in parent.glob(f".train.tmp-{again.pid}-*")]  # only its own temp dir is left
    again.send_signal(signal.SIGTERM)
    again.communicate(timeout=60)
    assert not list(parent.glob(".train.tmp-*"))


def test_a_stage_that_writes_into_its_input_is_refused(tmp_path, monkeypatch):
    """Issue 57: the runner fingerprints the upstream outputs and fails a stage that changed them
    (e.g. HF datasets cache files written into data/<slug>/prepare), leaving no output behind."""
    import importlib

    from stages.common.runner import InputModifiedError, run_stage

    run_stage("ftrl_potential", "prepare", profile="smoke", root=tmp_path)
    prep = tmp_path / "data" / "ftrl_potential" / "prepare"
    train_mod = importlib.import_module("stages.ftrl_potential.train")

    def writes_into_input(cfg, ctx):
        (ctx.input("prepare") / "cache-0001.arrow").write_bytes(b"x")

    monkeypatch.setattr(train_mod, "run", writes_into_input)
    with pytest.raises(InputModifiedError, match=r"train@ftrl_potential: added data/ftrl_potential/prepare/"
                                                 r"cache-0001.arrow inside an upstream stage's output"):
        run_stage("ftrl_potential", "train", profile="smoke", root=tmp_path)
    assert not (tmp_path / "data" / "ftrl_potential" / "train").exists()
    assert (prep / "cache-0001.arrow").exists()  # (the guard reports; it does not undo)


def test_missing_upstream_is_refused_before_any_tracking(tmp_path, monkeypatch):
    from stages.common import tracking
    from stages.common.runner import MissingInputError, run_stage

    opened = []
    monkeypatch.setattr(tracking, "stage_run", lambda *a, **k: opened.append(a))
    with pytest.raises(MissingInputError, match="evaluate@ftrl_potential: input data/ftrl_potential/prepare"):
        run_stage("ftrl_potential", "evaluate", profile="smoke", root=tmp_path)
    assert opened == []  # no (empty, failed) W&B run for a stage that did no work
