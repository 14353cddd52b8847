"""Agents under test: a pluggable interface, an OpenAI-compatible adapter, reference agents.

    agent.build(task, out_dir)   # writes a site folder (index.html, or start.json + files)

``TaskInputs`` is what a real agent sees: the task folder (prototypes, prompt.txt/prd.md,
workflow.json). The reference agents additionally receive the generator's hidden ``spec``: the
oracle (the reference implementation, ≈ 100 by construction) and the bug injector (the oracle with
exactly the named bugs: the ground truth of the verifier's recall). They calibrate the benchmark;
they are not solvers. Solvers go through ``OpenAICompatibleAgent``: any /v1/chat/completions
endpoint — a real model, or the loopback server of model_server.py around the program-synthesis
agent (synth.py), which therefore sees exactly the HTTP messages and nothing of the oracle.
"""
from __future__ import annotations

import base64
import json
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from stages.vision2web.schema import PROTO_EXTS
from stages.vision2web.sitegen import render_site

MAX_FILES = 50
MAX_FILE_BYTES = 2 * 2 ** 20
MAX_TOTAL_BYTES = 8 * 2 ** 20


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
    """The oracle with exactly the given bugs (one per site in the recall experiment: no masking)."""

    def __init__(self, bugs: list[str], name: str = "bugs"):
        self.bugs, self.name = sorted(bugs), name

    def build(self, task: TaskInputs, out: Path) -> dict[str, Any]:
        render_site(task.spec, out, set(self.bugs))
        return {"bugs": self.bugs}


FILE_BLOCK = re.compile(r"```file:([^\n`]+)\n(.*?)```", re.S)
SAFE_PATH = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*$")


class AgentError(RuntimeError):
    """The endpoint failed or answered something unusable (one line)."""


class OpenAICompatibleAgent:
    """Adapter for any OpenAI-compatible /v1/chat/completions endpoint.

    Sends the prompt (prompt.txt / prd.md), the full workflow.json (the test plan; its data-testid
    selectors are the interface contract) and every prototype image (base64 data URL); expects the
    reply to contain files as fenced blocks ```file:<relative path>\\n...```. Paths are confined to
    the output folder (no absolute paths, no '..', no dotfiles), at most 50 files / 8 MB."""

    def __init__(self, base_url: str, model: str, api_key: str = "", timeout_s: float = 600.0,
                 name: str = "openai", max_tokens: int | None = None):
        self.base_url, self.model, self.api_key = base_url.rstrip("/"), model, api_key
        self.timeout_s, self.name, self.max_tokens = timeout_s, name, max_tokens

    def messages(self, task: TaskInputs) -> list[dict[str, Any]]:
        d = task.task_dir
        text = "\n".join((d / f).read_text() for f in ("prompt.txt", "prd.md") if (d / f).exists())
        wf = json.loads((d / "workflow.json").read_text())
        content: list[dict[str, Any]] = [{"type": "text", "text": (
            text + "\nThe site will be tested with this workflow (Playwright selectors; cases run in order, one "
            "browser session, no resets):\nworkflow.json:\n```json\n" + json.dumps(wf) + "\n```\n"
            "Reply with every file as ```file:<path>\\n<content>```; a static site needs index.html, a site with "
            "a backend needs start.json ({\"command\": [...]} with {python}, {port}, {tmp} placeholders).")}]
        protos = sorted(p for p in (d / "prototypes").iterdir() if p.suffix.lower() in PROTO_EXTS)
        for img in protos:
            mime = "image/png" if img.suffix.lower() == ".png" else "image/jpeg"
            url = f"data:{mime};base64," + base64.b64encode(img.read_bytes()).decode()
            content.append({"type": "text", "text": f"prototype {img.stem}:"})
            content.append({"type": "image_url", "image_url": {"url": url}})
        return [{"role": "user", "content": content}]

    @staticmethod
    def write_files(reply: str, out: Path) -> list[str]:
        out.mkdir(parents=True, exist_ok=True)
        written, total = [], 0
        for rel, body in FILE_BLOCK.findall(reply):
            rel = rel.strip()
            if not SAFE_PATH.match(rel) or len(written) >= MAX_FILES:
                continue   # refuse paths outside the site folder, dotfiles, too many files
            data = body.encode()
            if len(data) > MAX_FILE_BYTES or total + len(data) > MAX_TOTAL_BYTES:
                continue
            target = (out / rel).resolve()
            if out.resolve() not in target.parents:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            written.append(rel)
            total += len(data)
        return written

    def complete(self, messages: list[dict[str, Any]]) -> str:
        payload: dict[str, Any] = {"model": self.model, "messages": messages}
        if self.max_tokens:
            payload["max_tokens"] = self.max_tokens
        req = urllib.request.Request(f"{self.base_url}/chat/completions", data=json.dumps(payload).encode(), headers={
            "Content-Type": "application/json", **({"Authorization": f"Bearer {self.api_key}"} if self.api_key else {})})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                reply = json.loads(resp.read())
        except urllib.error.HTTPError as err:
            raise AgentError(f"{self.base_url}: HTTP {err.code}") from None
        except (urllib.error.URLError, TimeoutError, OSError) as err:
            raise AgentError(f"{self.base_url}: {type(err).__name__}: {getattr(err, 'reason', err)}") from None
        except ValueError:
            raise AgentError(f"{self.base_url}: reply is not JSON") from None
        try:
            content = reply["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise AgentError(f"{self.base_url}: reply has no choices[0].message.content") from None
        if not isinstance(content, str):
            raise AgentError(f"{self.base_url}: message content is not text")
        return content

    def build(self, task: TaskInputs, out: Path) -> dict[str, Any]:
        out.mkdir(parents=True, exist_ok=True)
        try:
            reply = self.complete(self.messages(task))
        except AgentError as err:
            return {"bugs": [], "files": [], "error": str(err)}
        return {"bugs": [], "files": self.write_files(reply, out)}
