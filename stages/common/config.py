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
import math
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from stages.common.paths import ROOT

PROFILES = ("smoke", "default", "full")
STAGES = ("prepare", "train", "evaluate", "report")
TOP_LEVEL_KEYS = ("profile", "papers", "schedules")

# Shared field types: use them in every stage Config.
def _distinct(values: list[Any]) -> list[Any]:
    seen = set()
    for v in values:
        if repr(v) in seen:
            raise ValueError(f"duplicate entry {v!r}")
        seen.add(repr(v))
    return values


Distinct = AfterValidator(_distinct)  # `x: Annotated[list[T], Distinct]`: entries must differ (the error names x)
Seed = Annotated[int, Field(ge=0, lt=2**32)]            # a seed: [0, 2^32)
Seeds = Annotated[list[Seed], Field(min_length=1), Distinct]  # one or more distinct seeds
PositiveInt = Annotated[int, Field(gt=0)]
Probability = Annotated[float, Field(ge=0.0, le=1.0)]
Fraction = Annotated[float, Field(gt=0.0, lt=1.0)]       # open interval (0, 1)
MaybeInf = Annotated[float, Field(allow_inf_nan=True)]   # the only float type that may be ±inf/NaN
# papers.<slug>.report.claims: claim name (or glob pattern) -> {threshold: number}; every min effect,
# band, tolerance, bound and constant a claim reads (stages.common.claims.bind checks names and keys)
ClaimThresholds = dict[str, dict[str, Annotated[float, Field(allow_inf_nan=False)] | int]]


def unique_items(values: list[Any], key: str) -> list[Any]:
    """For a field_validator: entries that must be distinct (seeds, regimes, sizes)."""
    seen = set()
    for v in values:
        h = repr(v)
        if h in seen:
            raise ValueError(f"duplicate entry {v!r} in {key}")
        seen.add(h)
    return values


def at_most(limit: int | float, what: str = "use the full profile on a bigger machine"):
    """Field(le=...) with a message that says what to do instead of running for hours."""
    return Field(le=limit, description=f"upper bound {limit}: {what}")


class ConfigError(ValueError):
    """A user-facing configuration problem; its message names the offending key."""


class StageConfig(BaseModel):
    """Base of every stage config: unknown keys and wrong types are errors, values are frozen."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class ReportConfig(StageConfig):
    """Base of every report stage's Config: the claims' thresholds, fixed in params before the run."""
    claims: ClaimThresholds = Field(default_factory=dict)


class TransformerShape(StageConfig):
    """Width, depth and heads of the shared tiny transformer (stages.common.tiny_transformer); a
    paper's ``model:`` block subclasses it to add its own keys (e.g. seq_len)."""
    d_model: int = Field(64, ge=4, le=2048)
    n_layers: int = Field(2, ge=1, le=48)
    n_heads: int = Field(4, ge=1, le=64)

    @model_validator(mode="after")
    def _even_heads(self):
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError(f"n_heads: {self.n_heads} must divide d_model {self.d_model} into even head dims "
                             "(RoPE rotates pairs)")
        return self


class _StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # C parser when libyaml is there
    """SafeLoader that refuses duplicate mapping keys (YAML's default: the last one silently wins)."""


def _mapping_no_duplicates(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False):
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:
            continue
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first at line {seen[key] + 1})", key_node.start_mark)
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_no_duplicates)


MAX_PARAMS_BYTES = 2_000_000   # params.yaml is ~60 kB; a bigger file is a mistake or an attack
MAX_YAML_ALIASES = 64          # anchors/aliases: a "billion laughs" file expands exponentially
MAX_YAML_DEPTH = 32


def _yaml_depth_ok(doc: Any, path: Path) -> None:
    from stages.common.paths import structure_problem

    problem = structure_problem(doc, MAX_YAML_DEPTH)
    if problem:
        raise ConfigError(f"{path}: {problem}")


def load_yaml(path: Path) -> Any:
    """Strict YAML: duplicate keys and syntax errors are one line, file:line:col, what. Bounded before
    anything is built: file size, number of aliases (an alias bomb is refused at once), nesting depth
    and integer size (a 5,000-digit number is one line, not a traceback)."""
    path = Path(path)
    size = path.stat().st_size
    if size > MAX_PARAMS_BYTES:
        raise ConfigError(f"{path}: {size:,} bytes (limit {MAX_PARAMS_BYTES:,})")
    text = path.read_text()
    try:
        aliases = 0
        for tok in yaml.scan(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
            if isinstance(tok, yaml.AliasToken):
                aliases += 1
                if aliases > MAX_YAML_ALIASES:
                    raise ConfigError(f"{path}:{tok.start_mark.line + 1}: more than {MAX_YAML_ALIASES} YAML aliases "
                                      "(refused: aliases can expand exponentially)")
        doc = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (SafeLoader subclass)
    except ConfigError:
        raise
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        raise ConfigError(f"{where}: {err.problem}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
    except (ValueError, RecursionError) as err:  # e.g. an integer too long to convert
        raise ConfigError(f"{path}: unreadable value ({type(err).__name__}: {str(err).splitlines()[0][:100]})") from None
    _yaml_depth_ok(doc, path)
    return doc


C = TypeVar("C", bound=StageConfig)


def read_params(path: Path | None = None) -> dict[str, Any]:
    path = Path(path) if path is not None else ROOT / "params.yaml"
    if not path.exists():
        raise ConfigError(f"{path}: params file not found")
    try:
        data = load_yaml(path) or {}
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    if not isinstance(data, dict) or not isinstance(data.get("papers"), dict):
        raise ConfigError(f"{path}: expected a mapping with a 'papers' mapping of slug -> stages")
    unknown = [k for k in data if k not in TOP_LEVEL_KEYS]
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown top-level key in params.yaml (keys: {', '.join(TOP_LEVEL_KEYS)})")
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


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def format_validation_error(err: ValidationError, where: str) -> str:
    """One line: the first problem, naming the key and the value (never the whole block)."""
    lines = []
    for item in err.errors():
        key = ".".join(str(p) for p in item["loc"])
        msg = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            msg = "unknown key"
        if item["type"] == "finite_number":
            msg = "must be a finite number"
        got = item.get("input")
        detail = "" if item["type"] in ("extra_forbidden", "missing") or isinstance(got, dict) \
            else f" (got {_short(got)})"
        lines.append(f"{where}.{key}: {msg}{detail}" if key else f"{where}: {msg}{detail}")
    more = f" (+{len(lines) - 1} more)" if len(lines) > 1 else ""
    return lines[0] + more


def validate(model: type[C], block: dict[str, Any], where: str) -> C:
    try:
        return model.model_validate(block)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, where)) from None


def load_stage_config(slug: str, stage: str, model: type[C], profile: str | None = None,
                      params_path: Path | None = None) -> C:
    """Validate papers.<slug>.<stage> under every profile (a bad key under `full` fails even when
    smoke runs), then return the active profile's config."""
    return validate_all_profiles(read_params(params_path), slug, stage, model, profile)


def validate_all_profiles(params: dict[str, Any], slug: str, stage: str, model: type[C],
                          profile: str | None = None) -> C:
    """load_stage_config on an already-read params mapping."""
    prof = active_profile(params, profile)
    where = f"papers.{slug}.{stage}"
    configs = {}
    for name in ("default", *(p for p in PROFILES if p != "default")):  # the base block's errors first
        block = stage_block(params, slug, stage, name)
        label = where if name == "default" else f"{where} (profile {name})"
        configs[name] = validate(model, block, label)
    return configs[prof]
