"""Typed stage configs loaded from params.yaml, with profiles and early, named errors.

Every paper stage declares a ``Config(StageConfig)`` (pydantic, unknown keys forbidden, no silent
type coercion). Its values live in ``params.yaml`` under ``papers.<slug>.<stage>``; a stage block
may carry ``profiles: {smoke: {...}, full: {...}}`` with overrides that are deep-merged over the
defaults when that profile is active. The active profile is the top-level ``profile`` key (the one
knob: smoke | default | full), overridable with ``--profile``.

    cfg = load_stage_config("reversal_curse", "train", TrainConfig)

Any problem (unknown paper or stage, unknown key, wrong type, out-of-range value, bad profile)
raises :class:`ConfigError` with one line naming the key, before any work is done.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from stages.common.paths import ROOT

PROFILES = ("smoke", "default", "full")
STAGES = ("prepare", "train", "evaluate", "report")


class ConfigError(ValueError):
    """A user-facing configuration problem; its message names the offending key."""


class StageConfig(BaseModel):
    """Base of every stage config: unknown keys and wrong types are errors, values are frozen."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


C = TypeVar("C", bound=StageConfig)


def read_params(path: Path | None = None) -> dict[str, Any]:
    path = Path(path) if path is not None else ROOT / "params.yaml"
    if not path.exists():
        raise ConfigError(f"{path}: params file not found")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({err})") from None
    if not isinstance(data, dict) or not isinstance(data.get("papers"), dict):
        raise ConfigError(f"{path}: expected a mapping with a 'papers' mapping of slug -> stages")
    return data


def registered_papers(params: dict[str, Any] | None = None) -> list[str]:
    params = params if params is not None else read_params()
    return list(params["papers"].keys())


def active_profile(params: dict[str, Any], override: str | None = None) -> str:
    profile = override if override is not None else params.get("profile", "default")
    if profile not in PROFILES:
        raise ConfigError(f"profile: must be one of {', '.join(PROFILES)} (got {profile!r})")
    return profile


def deep_merge(base: dict[str, Any], override: dict[str, Any], where: str) -> dict[str, Any]:
    """Return base with override merged in; nested mappings merge, everything else replaces."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value, f"{where}.{key}")
        else:
            out[key] = copy.deepcopy(value)
    return out


def stage_block(params: dict[str, Any], slug: str, stage: str, profile: str) -> dict[str, Any]:
    """The raw mapping for papers.<slug>.<stage> with the profile's overrides applied."""
    papers = params["papers"]
    if slug not in papers:
        known = ", ".join(sorted(papers)) or "none"
        raise ConfigError(f"papers.{slug}: unknown paper (registered: {known})")
    paper = papers[slug] or {}
    if not isinstance(paper, dict):
        raise ConfigError(f"papers.{slug}: expected a mapping of stage -> params")
    unknown = sorted(set(paper) - set(STAGES))
    if unknown:
        raise ConfigError(f"papers.{slug}.{unknown[0]}: unknown stage (stages: {', '.join(STAGES)})")
    block = paper.get(stage) or {}
    where = f"papers.{slug}.{stage}"
    if not isinstance(block, dict):
        raise ConfigError(f"{where}: expected a mapping of parameters")
    block = copy.deepcopy(block)
    overrides = block.pop("profiles", None) or {}
    if not isinstance(overrides, dict):
        raise ConfigError(f"{where}.profiles: expected a mapping of profile -> overrides")
    for name, value in overrides.items():
        if name not in ("smoke", "full"):
            raise ConfigError(f"{where}.profiles.{name}: unknown profile (overrides exist for smoke and full)")
        if not isinstance(value, dict):
            raise ConfigError(f"{where}.profiles.{name}: expected a mapping of overrides")
    if profile != "default" and profile in overrides:
        block = deep_merge(block, overrides[profile], where)
    return block


def format_validation_error(err: ValidationError, where: str) -> str:
    lines = []
    for item in err.errors():
        key = ".".join(str(p) for p in item["loc"])
        msg = item["msg"]
        if item["type"] == "extra_forbidden":
            msg = "unknown key"
        got = item.get("input")
        detail = "" if item["type"] in ("extra_forbidden", "missing") else f" (got {got!r})"
        lines.append(f"{where}.{key}: {msg}{detail}" if key else f"{where}: {msg}{detail}")
    return "; ".join(lines)


def validate(model: type[C], block: dict[str, Any], where: str) -> C:
    try:
        return model.model_validate(block)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, where)) from None


def load_stage_config(slug: str, stage: str, model: type[C], profile: str | None = None,
                      params_path: Path | None = None) -> C:
    params = read_params(params_path)
    prof = active_profile(params, profile)
    block = stage_block(params, slug, stage, prof)
    return validate(model, block, f"papers.{slug}.{stage}")
