"""Agents under test: a pluggable interface, an OpenAI-compatible adapter, graded reference agents.

    agent.build(task, out_dir)   # writes a site folder (index.html, or start.json + files)

``TaskInputs`` is what a real agent sees: the task folder (prototypes, prompt.txt/prd.md,
workflow.json). Reference agents additionally receive the generator's hidden ``spec``: they
calibrate the benchmark (oracle ≈ 100; controlled bugs), they are not solvers.
"""
from __future__ import annotations

import base64
import json
import random
import re
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from stages.vision2web.sitegen import BUG_AFFECTS, VISUAL_BUGS, render_site


@dataclass
class TaskInputs:
    task_dir: Path
    spec: dict[str, Any] | None = None   # hidden generator spec (reference agents only)


class Agent(Protocol):
    name: str

    def build(self, task: TaskInputs, out: Path) -> dict[str, Any]:
        """Write the site into ``out``; return a manifest (e.g. injected bugs)."""


class OracleAgent:
    name = "oracle"

    def build(self, task: TaskInputs, out: Path) -> dict[str, Any]:
        render_site(task.spec, out)
        return {"bugs": []}


class BugInjectingAgent:
    """The oracle with bugs injected independently at a controlled rate per bug site: functional
    bugs of the task's level (broken handlers, missing pages, broken API routes, a start command
    that fails) and visual bugs (colour shift, missing footer, dropped media queries, spacing)."""

    def __init__(self, rate: float, seed: int, name: str | None = None):
        self.rate, self.seed = rate, seed
        self.name = name or f"buggy_{rate:g}"

    def build(self, task: TaskInputs, out: Path) -> dict[str, Any]:
        spec = task.spec
        rng = random.Random(f"{self.name}-{self.seed}-{spec['level']}-{spec['index']}")
        sites = sorted(BUG_AFFECTS.get(spec["level"], {})) + list(VISUAL_BUGS)
        bugs = {b for b in sites if rng.random() < self.rate}
        render_site(spec, out, bugs)
        return {"bugs": sorted(bugs)}


class TemplateAgent:
    """Retrieval/template agent: the spec's texts and items dropped into one generic desktop-first
    template (its own palette, 3 fixed columns, no media queries), no cart page, no backend."""

    name = "template"

    def build(self, task: TaskInputs, out: Path) -> dict[str, Any]:
        render_site(task.spec, out, template=True)
        return {"bugs": []}


FILE_BLOCK = re.compile(r"```file:([^\n`]+)\n(.*?)```", re.S)


class OpenAICompatibleAgent:
    """Adapter for any OpenAI-compatible /v1/chat/completions endpoint (unused offline).

    Sends the prompt (prompt.txt / prd.md), the workflow objectives and the prototypes (PNG, base64
    data URLs); expects the reply to contain files as fenced blocks ```file:<relative path>\\n...```.
    Paths are confined to the output folder."""

    def __init__(self, base_url: str, model: str, api_key: str = "", timeout_s: float = 600.0,
                 name: str = "openai"):
        self.base_url, self.model, self.api_key, self.timeout_s, self.name = base_url.rstrip("/"), model, api_key, timeout_s, name

    def messages(self, task: TaskInputs) -> list[dict[str, Any]]:
        d = task.task_dir
        text = "\n".join((d / f).read_text() for f in ("prompt.txt", "prd.md") if (d / f).exists())
        wf = json.loads((d / "workflow.json").read_text())
        objectives = [c["objective"] for w in wf for c in w.get("content", [])]
        content: list[dict[str, Any]] = [{"type": "text", "text": (
            text + "\nThe site will be tested on: " + "; ".join(dict.fromkeys(objectives)) +
            "\nReply with every file as ```file:<path>\\n<content>```; include start.json for a backend.")}]
        for png in sorted((d / "prototypes").glob("*.png")):
            url = "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode()
            content.append({"type": "text", "text": f"prototype {png.stem}:"})
            content.append({"type": "image_url", "image_url": {"url": url}})
        return [{"role": "user", "content": content}]

    @staticmethod
    def write_files(reply: str, out: Path) -> list[str]:
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for rel, body in FILE_BLOCK.findall(reply):
            target = (out / rel.strip()).resolve()
            if out.resolve() not in target.parents:
                continue   # refuse paths outside the site folder
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(body)
            written.append(rel.strip())
        return written

    def build(self, task: TaskInputs, out: Path) -> dict[str, Any]:
        body = json.dumps({"model": self.model, "messages": self.messages(task)}).encode()
        req = urllib.request.Request(f"{self.base_url}/chat/completions", data=body, headers={
            "Content-Type": "application/json", **({"Authorization": f"Bearer {self.api_key}"} if self.api_key else {})})
        with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
            reply = json.loads(resp.read())["choices"][0]["message"]["content"]
        return {"bugs": [], "files": self.write_files(reply, out)}
