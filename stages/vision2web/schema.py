"""The public task-folder and site-folder formats (see stages/vision2web/README.md), validated.

Every field is checked by pydantic (unknown keys rejected, types strict, ranges bounded); a problem
raises :class:`TaskFormatError` with ONE line naming the file and the field path.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

DEVICES = ("desktop", "tablet", "mobile")
PROTO_EXTS = (".png", ".jpg", ".jpeg")      # official tasks ship .jpg prototypes
MAX_PROTO_PIXELS = 40_000_000
MAX_JSON_BYTES = 5 * 2 ** 20
LEVELS = ("L1", "L2", "L3")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class TaskFormatError(ValueError):
    """A task or site folder does not follow the documented format (one line, names the field)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


Selector = Annotated[str, Field(min_length=1, max_length=500)]
Text = Annotated[str, Field(max_length=2000)]


# ---- actions (what the GUI verifier does) ----
class Goto(_Strict):
    op: Literal["goto"]
    path: Annotated[str, Field(pattern=r"^/", max_length=500)]  # relative to the site root URL


class Click(_Strict):
    op: Literal["click"]
    selector: Selector


class Fill(_Strict):
    op: Literal["fill"]
    selector: Selector
    value: Text


class Press(_Strict):
    op: Literal["press"]
    selector: Selector
    key: Annotated[str, Field(min_length=1, max_length=40)]


class Reload(_Strict):
    op: Literal["reload"]


class NaturalLanguage(_Strict):
    """A step written in prose (the official tasks' form): only an LLM GUI agent can execute it; the
    deterministic verifier marks its case Blocked."""
    op: Literal["nl"]
    text: Annotated[str, Field(min_length=1, max_length=2000)]


Action = Annotated[Union[Goto, Click, Fill, Press, Reload, NaturalLanguage], Field(discriminator="op")]


# ---- validations (what must then hold) ----
class Visible(_Strict):
    op: Literal["visible"]
    selector: Selector


class Hidden(_Strict):
    op: Literal["hidden"]
    selector: Selector


class TextContains(_Strict):
    op: Literal["text_contains"]
    selector: Selector
    value: Annotated[str, Field(min_length=1, max_length=2000)]


class TextEquals(_Strict):
    op: Literal["text_equals"]
    selector: Selector
    value: Text


class Count(_Strict):
    op: Literal["count"]
    selector: Selector
    equals: Annotated[int, Field(ge=0, le=10_000)]


class UrlContains(_Strict):
    op: Literal["url_contains"]
    value: Annotated[str, Field(min_length=1, max_length=500)]


Validation = Annotated[Union[Visible, Hidden, TextContains, TextEquals, Count, UrlContains, NaturalLanguage],
                       Field(discriminator="op")]


class Case(_Strict):
    objective: Annotated[str, Field(min_length=1, max_length=2000)]
    actions: Annotated[list[Action], Field(max_length=50)] = []
    validations: Annotated[list[Validation], Field(max_length=50)] = []  # empty: not counted in FS


class Resolution(_Strict):
    width: Annotated[int, Field(ge=200, le=4000)] = 1024
    height: Annotated[int, Field(ge=200, le=4000)] = 768


class ProtoNode(_Strict):
    idx: Annotated[int, Field(ge=0, le=50)]   # 0 = before case 0; N = after case N-1
    fullpage: bool = True


class Workflow(_Strict):
    summary: Annotated[str, Field(min_length=1, max_length=2000)]
    resolution: Resolution = Resolution()
    prototype: dict[str, ProtoNode] = {}
    content: Annotated[list[Case], Field(max_length=50)] = []

    @field_validator("prototype")
    @classmethod
    def _names(cls, v: dict[str, ProtoNode]) -> dict[str, ProtoNode]:
        for name in v:
            if not NAME_RE.match(name):
                raise ValueError(f"prototype name {name!r} must match {NAME_RE.pattern}")
        return v

    @model_validator(mode="after")
    def _idx_in_range(self):
        for name, node in self.prototype.items():
            if node.idx > len(self.content):
                raise ValueError(f"prototype.{name}.idx={node.idx} exceeds the {len(self.content)} cases")
        return self


class TaskMeta(_Strict):
    level: Literal["L1", "L2", "L3"] = "L1"
    category: Annotated[str, Field(max_length=64)] = "unknown"
    action_timeout_ms: Annotated[int, Field(ge=100, le=10_000)] = 3000      # official: <= 3 s per step
    validation_timeout_ms: Annotated[int, Field(ge=100, le=10_000)] = 1500
    navigation_timeout_ms: Annotated[int, Field(ge=500, le=60_000)] = 10_000


class Component(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=128)]
    bbox: Annotated[list[Annotated[int, Field(ge=0, le=100_000)]], Field(min_length=4, max_length=4)]

    @field_validator("bbox")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if v[2] <= 0 or v[3] <= 0:
            raise ValueError("bbox [x, y, w, h] needs w > 0 and h > 0")
        return v


class StartSpec(_Strict):
    command: Annotated[list[Annotated[str, Field(min_length=1, max_length=1000)]], Field(min_length=1, max_length=50)]
    ready_timeout_s: Annotated[float, Field(gt=0, le=600)] = 15.0
    ready_path: Annotated[str, Field(pattern=r"^/", max_length=500)] = "/"


class Task(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)
    root: Path
    meta: TaskMeta
    workflows: list[Workflow]
    prototypes: dict[str, Path]                     # name -> PNG/JPEG
    components: dict[str, list[Component] | None]   # name -> list, None = whole image one component

    def n_counted_cases(self) -> int:
        return sum(1 for w in self.workflows for c in w.content if c.validations)


def _where(err: ValidationError) -> str:
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e["loc"] if not (isinstance(p, str) and p in (
        "goto", "click", "fill", "press", "reload", "visible", "hidden", "text_contains", "text_equals",
        "count", "url_contains", "nl")))
    msg = e["msg"]
    return f"{loc or '<root>'}: {msg}"


def _no_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def load_json_file(path: Path):
    """A task's JSON file, bounded: size checked before reading; invalid UTF-8/JSON, NaN/Infinity, an
    integer literal too long to convert and too-deep nesting are one-line TaskFormatErrors."""
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            raise TaskFormatError(f"{path}: larger than {MAX_JSON_BYTES} bytes")
        return json.loads(path.read_text(encoding="utf-8"), parse_constant=_no_constant)
    except FileNotFoundError:
        raise TaskFormatError(f"{path}: missing") from None
    except OSError as err:
        raise TaskFormatError(f"{path}: cannot read ({err.strerror or err})") from None
    except RecursionError:
        raise TaskFormatError(f"{path}: nested too deeply") from None
    except TaskFormatError:
        raise
    except ValueError as err:  # UnicodeDecodeError, JSONDecodeError, NaN, a 5,000-digit integer
        raise TaskFormatError(f"{path}: not valid JSON ({str(err).splitlines()[0][:120]})") from None



def check_image(path: Path) -> tuple[int, int]:
    """(width, height) of a prototype image after checking it decodes; one-line TaskFormatError if not."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            w, h = im.size
            if w * h > MAX_PROTO_PIXELS or w < 1 or h < 1:
                raise TaskFormatError(f"{path}: image of {w}x{h} pixels (at most {MAX_PROTO_PIXELS})")
            if im.format not in ("PNG", "JPEG"):
                raise TaskFormatError(f"{path}: not a PNG or JPEG image ({im.format})")
            im.verify()
    except TaskFormatError:
        raise
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise TaskFormatError(f"{path}: not a readable PNG/JPEG image ({type(err).__name__})") from None
    return w, h


def find_prototype(root: Path, name: str) -> Path | None:
    for ext in PROTO_EXTS:
        if (root / "prototypes" / f"{name}{ext}").is_file():
            return root / "prototypes" / f"{name}{ext}"
    return None


def device_of(name: str) -> str | None:
    """Device column of a prototype: its name, or the token after its last '_', if a device."""
    tail = name.rsplit("_", 1)[-1]
    return tail if tail in DEVICES else None


def load_task(root: Path | str, check_images: bool = True) -> Task:
    root = Path(root)
    if not root.is_dir():
        raise TaskFormatError(f"{root}: task folder does not exist")
    wf_path = root / "workflow.json"
    raw = load_json_file(wf_path)
    if not isinstance(raw, list) or not raw:
        raise TaskFormatError(f"{wf_path}: must be a non-empty JSON list of workflows")
    if len(raw) > 50:
        raise TaskFormatError(f"{wf_path}: at most 50 workflows (got {len(raw)})")
    workflows = []
    for i, item in enumerate(raw):
        try:
            workflows.append(Workflow.model_validate(item))
        except ValidationError as err:
            raise TaskFormatError(f"{wf_path}: [{i}].{_where(err)}") from None
    meta = TaskMeta()
    if (root / "task.json").exists():
        try:
            meta = TaskMeta.model_validate(load_json_file(root / "task.json"))
        except ValidationError as err:
            raise TaskFormatError(f"{root / 'task.json'}: {_where(err)}") from None
    prototypes: dict[str, Path] = {}
    components: dict[str, list[Component] | None] = {}
    for i, w in enumerate(workflows):
        for name in w.prototype:
            if name in prototypes:
                raise TaskFormatError(f"{wf_path}: [{i}].prototype.{name}: name used twice")
            png = find_prototype(root, name)
            if png is None:
                raise TaskFormatError(f"{wf_path}: [{i}].prototype.{name}: file prototypes/{name}.png missing")
            if check_images:
                check_image(png)
            prototypes[name] = png
            comp_path = root / "prototypes" / f"{name}.components.json"
            if comp_path.exists():
                raw_c = load_json_file(comp_path)
                if not isinstance(raw_c, list) or len(raw_c) > 256:
                    raise TaskFormatError(f"{comp_path}: must be a JSON list of at most 256 components")
                try:
                    components[name] = [Component.model_validate(c) for c in raw_c]
                except ValidationError as err:
                    raise TaskFormatError(f"{comp_path}: {_where(err)}") from None
            else:
                components[name] = None
    return Task(root=root, meta=meta, workflows=workflows, prototypes=prototypes, components=components)


def load_start(site: Path) -> StartSpec | None:
    """start.json of a site folder, or None (then the folder is served as static files)."""
    path = site / "start.json"
    if not path.exists():
        if not (site / "index.html").is_file():
            raise TaskFormatError(f"{site}: no start.json and no index.html to serve")
        return None
    try:
        return StartSpec.model_validate(load_json_file(path))
    except ValidationError as err:
        raise TaskFormatError(f"{path}: {_where(err)}") from None
