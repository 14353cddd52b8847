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

A stage selects its real source with a ``source:`` block (``SourceConfig``) in params:

    class Config(StageConfig):
        source: SourceConfig = SourceConfig()            # kind: toy (default) | hf | file
    # params.yaml (only the full profile may leave toy; every other profile is refused at config load)
    #   train: {profiles: {full: {source: {kind: hf, model: Qwen/Qwen2.5-0.5B, revision: <commit>}}}}

``kind: hf`` is a Hugging Face model (hub name or local checkpoint folder; ``model`` required) with an
optional tokenizer and dataset; ``kind: file`` is a local file/folder in the paper's real format
(``dataset`` or ``model`` required, no hub). ``resolve_ref`` turns a name into a local path or refuses a
hub name with one line naming the key when the hub is unreachable (HF_HUB_OFFLINE=1 in tests), so
nothing downloads in tests. Loaders raise ``SourceError`` (a ``ConfigError``: one line, exit 2).
"""
from __future__ import annotations

import importlib
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from stages.common.config import PROFILES, ConfigError, StageConfig, stage_block, validate
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


# ----------------------------------------------------------------------------------------------
# the `source:` block of a stage config, and where a name resolves to
# ----------------------------------------------------------------------------------------------
class SourceError(ConfigError):
    """A real source that cannot be used (missing file, wrong schema, hub unreachable): one line
    naming the params key; ``python -m stages`` prints it and exits 2."""


def _ref(what: str):
    return Field(None, min_length=1, max_length=1000, description=what)


class SourceConfig(StageConfig):
    """Where a stage's model/data come from. ``toy`` (default): the paper's own generator and tiny
    model; ``hf``: a Hugging Face model (hub name ``org/name`` or a local checkpoint folder) with an
    optional tokenizer (default: the model's) and dataset (hub name, local jsonl/parquet file or
    ``save_to_disk`` folder); ``file``: local files in the paper's real format (no hub).
    Anything but ``toy`` is allowed only under the ``full`` profile (``check_source_profiles``)."""
    kind: Literal["toy", "hf", "file"] = "toy"
    model: str | None = _ref("hub name (org/name) or local checkpoint folder / file")
    tokenizer: str | None = _ref("hub name or local tokenizer folder / tokenizer.json (default: the model's)")
    dataset: str | None = _ref("hub dataset name, or a local file/folder in the real format")
    split: str = Field("train", min_length=1, max_length=200, description="dataset split to read")
    revision: str | None = Field(None, min_length=1, max_length=200,
                                 description="hub revision (a commit hash pins the exact weights/data)")
    dtype: Literal["float32", "bfloat16", "float16", "float64"] = "float32"

    @model_validator(mode="after")
    def _kind_rules(self):
        refs = {k: getattr(self, k) for k in ("model", "tokenizer", "dataset", "revision")}
        if self.kind == "toy":
            for k, v in refs.items():
                if v is not None:
                    raise ValueError(f"{k}: only read when kind is hf or file (kind is toy; got {v!r})")
        elif self.kind == "hf" and self.model is None:
            raise ValueError("model: kind hf needs a model (a hub name such as Qwen/Qwen2.5-0.5B, or a local "
                             "checkpoint folder)")
        elif self.kind == "file":
            if self.model is None and self.dataset is None:
                raise ValueError("dataset: kind file needs a dataset (or model) path in the paper's real format")
            if self.revision is not None:
                raise ValueError("revision: kind file reads local files (no hub revision)")
        return self


def _sources_in(cfg: BaseModel, path: str = "") -> list[tuple[str, SourceConfig]]:
    """Every SourceConfig inside a (nested) config, with its dotted key."""
    found = []
    if isinstance(cfg, SourceConfig):
        return [(path, cfg)]
    for name in type(cfg).model_fields:
        value = getattr(cfg, name)
        key = f"{path}.{name}" if path else name
        if isinstance(value, BaseModel):
            found += _sources_in(value, key)
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                if isinstance(item, BaseModel):
                    found += _sources_in(item, f"{key}.{i}")
        elif isinstance(value, dict):
            for k, item in value.items():
                if isinstance(item, BaseModel):
                    found += _sources_in(item, f"{key}.{k}")
    return found


def check_source_profiles(params: dict[str, Any], slug: str, stage: str, model: type[StageConfig]) -> None:
    """A real source (kind hf/file) takes effect only at the ``full`` profile: under smoke/default
    every ``source:`` must be toy, so tests and ``dvc repro`` never touch a hub or a real file."""
    for profile in ("default", *(p for p in PROFILES if p not in ("default", "full"))):   # base block first
        where = f"papers.{slug}.{stage}" + ("" if profile == "default" else f" (profile {profile})")
        cfg = validate(model, stage_block(params, slug, stage, profile), where)
        for key, src in _sources_in(cfg):
            if src.kind != "toy":
                raise ConfigError(f"{where}.{key}.kind: {src.kind} sources run only at the full profile "
                                  f"(set it under profiles.full; {profile} uses the toy source)")


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def hub_offline() -> bool:
    """HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE / HF_DATASETS_OFFLINE set (tests set all three)."""
    return any(_truthy(v) for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"))


def hub_reachable(host: str = "huggingface.co", port: int = 443, timeout: float = 3.0) -> bool:
    """One TCP connect to the hub (never attempted when hub_offline())."""
    if hub_offline():
        return False
    endpoint = os.environ.get("HF_ENDPOINT", "")
    if endpoint:
        from urllib.parse import urlparse
        u = urlparse(endpoint)
        host, port = u.hostname or host, u.port or (443 if u.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


_PATH_SUFFIXES = (".json", ".jsonl", ".parquet", ".csv", ".arrow", ".hdf5", ".h5", ".npz", ".npy",
                  ".safetensors", ".bin", ".pt", ".step", ".stp", ".txt")


def looks_like_path(ref: str) -> bool:
    """A name that can only be a local path (absolute, ./, ../, ~, a file suffix, or 3+ parts)."""
    return (ref.startswith(("/", "./", "../", "~")) or ref.lower().endswith(_PATH_SUFFIXES)
            or ref.count("/") >= 2 or os.sep != "/" and os.sep in ref)


@dataclass(frozen=True)
class Resolved:
    ref: str                 # a local path, or the hub name to load (only when online)
    local: bool              # True: load with local_files_only / from disk, nothing is downloaded
    hub_name: str | None     # the hub repo id when the ref came from the hub (cached or to download)


def resolve_ref(ref: str, key: str, *, repo_type: Literal["model", "dataset"] = "model",
                revision: str | None = None, allow_download: bool = True) -> Resolved:
    """A local path as is; a hub name from the local HF cache when it is there (no network needed);
    otherwise the hub name to download, which is refused with one line naming ``key`` when the hub is
    offline/unreachable or ``allow_download`` is False."""
    path = Path(ref).expanduser()
    if path.exists():
        return Resolved(str(path), True, None)
    if looks_like_path(ref):
        raise SourceError(f"{key}: {ref} does not exist (a local path; hub names look like org/name)")
    try:
        from huggingface_hub import snapshot_download
        cached = snapshot_download(ref, repo_type=repo_type, revision=revision, local_files_only=True)
        return Resolved(cached, True, ref)
    except Exception:  # noqa: BLE001 - not in the cache (or not a valid repo id): decide below
        pass
    if not allow_download:
        raise SourceError(f"{key}: {ref!r} is neither a local path nor in the local Hugging Face cache, "
                          "and downloads are not allowed here")
    if hub_offline() or not hub_reachable():
        why = "HF_HUB_OFFLINE is set" if hub_offline() else "the hub is unreachable"
        raise SourceError(f"{key}: {ref!r} is a hub {repo_type} name, not a local path or cached, and {why}; "
                          f"download it on a machine with network (huggingface-cli download "
                          f"{'--repo-type dataset ' if repo_type == 'dataset' else ''}{ref}) or point {key} "
                          "at a local copy")
    return Resolved(ref, False, ref)


def real_prepare_meta(ctx, kind: str, need: str) -> dict:
    """prepare's meta.json for a stage on a real source, refusing (one line naming the params key) when
    prepare ran on the toy generator (its meta ``kind`` is not ``kind``); ``need`` says what was expected."""
    from stages.common.paths import read_json

    meta = read_json(ctx.input("prepare") / "meta.json")
    if meta.get("kind") != kind:
        raise SourceError(f"papers.{ctx.slug}.{ctx.stage}.source: {need} (papers.{ctx.slug}.prepare.source is toy)")
    return meta
