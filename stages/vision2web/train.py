"""train: the agents under test build their sites (offline).

* ``oracle``: the reference implementation (reads the hidden spec; ≈ 100 by construction).
* ``openai``: OpenAICompatibleAgent against ``endpoint`` — an http(s) URL of any OpenAI-compatible
  server (a real model; key from the environment variable ``api_key_env``), or ``local:synth`` /
  ``local:template``: a loopback server (model_server.py) around the program-synthesis agent
  (synth.py), which sees only the HTTP messages (prompt, workflow, prototype images).
* bug sites (the verifier's recall): for every task of ``bug_sites.functional_seeds`` of a level
  with functional bugs, one oracle site per functional bug of that level (exactly one bug per site:
  no masking); for the first task of ``bug_sites.visual_levels`` of ``bug_sites.visual_seeds``, one site
  per visual bug (each applies at every viewport; ``layout_<viewport>`` at one viewport each: equal
  exposure across viewports).
"""
from __future__ import annotations

import contextlib
import json
import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from stages.common.config import StageConfig, unique_items
from stages.vision2web.agents import BugInjectingAgent, OpenAICompatibleAgent, OracleAgent, TaskInputs
from stages.vision2web.sitegen import BUG_AFFECTS, VISUAL_BUGS


class AgentSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    name: str = Field(min_length=1, max_length=40, pattern=r"^[a-z0-9_]+$")
    kind: Literal["oracle", "openai"]
    endpoint: str = Field("local:synth", pattern=r"^(local:(synth|template)|https?://\S+)$")
    model: str = Field("v2w-synth", min_length=1, max_length=200)
    api_key_env: str = Field("", max_length=100, pattern=r"^[A-Z0-9_]*$")
    timeout_s: float = Field(600.0, gt=0, le=7200)
    seeds: list[int] | None = Field(None, max_length=100)   # task seeds this agent builds (None: all)


class BugSites(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    functional_seeds: list[int] = Field(default_factory=lambda: [0], max_length=50)
    visual_seeds: list[int] = Field(default_factory=lambda: [0], max_length=50)
    visual_levels: list[Literal["L1", "L2", "L3"]] = Field(default_factory=lambda: ["L1"], min_length=1, max_length=3)
    functional_bugs: list[str] | None = Field(None, min_length=1, max_length=50)   # None: the whole catalogue
    visual_bugs: list[str] | None = Field(None, min_length=1, max_length=50)

    @field_validator("functional_bugs")
    @classmethod
    def _known_f(cls, v):
        known = {b for bugs in BUG_AFFECTS.values() for b in bugs}
        for b in v or []:
            if b not in known:
                raise ValueError(f"unknown functional bug {b!r} (known: {', '.join(sorted(known))})")
        return v

    @field_validator("visual_bugs")
    @classmethod
    def _known_v(cls, v):
        for b in v or []:
            if b not in VISUAL_BUGS:
                raise ValueError(f"unknown visual bug {b!r} (known: {', '.join(VISUAL_BUGS)})")
        return v


class Config(StageConfig):
    agents: list[AgentSpec] = Field(default_factory=lambda: [
        AgentSpec(name="oracle", kind="oracle"), AgentSpec(name="synth", kind="openai", endpoint="local:synth"),
        AgentSpec(name="template", kind="openai", endpoint="local:template")], min_length=1, max_length=10)
    bug_sites: BugSites = BugSites()

    @field_validator("agents")
    @classmethod
    def _distinct(cls, v):
        unique_items([a.name for a in v], "agents[].name")
        if not any(a.kind == "oracle" for a in v):
            raise ValueError("agents: an oracle agent is required (false-alarm rate, oracle check)")
        if any(a.name == "bugs" for a in v):
            raise ValueError("agents: the name 'bugs' is reserved for the bug sites")
        return v

    @model_validator(mode="after")
    def _oracle_builds_the_visual_sites_tasks(self):
        """evaluate scores each visual bug site against the oracle's site of the same task: the oracle must build
        the tasks of bug_sites.visual_seeds (a raw KeyError in evaluate otherwise)."""
        built = [a.seeds for a in self.agents if a.name == "oracle"]
        if built and built[0] is not None:
            missing = sorted(set(self.bug_sites.visual_seeds) - set(built[0]))
            if missing:
                raise ValueError(f"bug_sites.visual_seeds: {missing} not among the oracle agent's seeds {built[0]} "
                                 "(each visual bug site is scored against the oracle's site of its task)")
        return self


def run(cfg: Config, ctx) -> None:
    from stages.vision2web.model_server import serve_model
    from stages.vision2web.synth import SynthesisModel

    prep = ctx.input("prepare")
    index = json.loads((prep / "index.json").read_text())
    manifest = []
    with contextlib.ExitStack() as stack:
        local = {mode: stack.enter_context(serve_model(SynthesisModel("infer" if mode == "synth" else "template"), f"v2w-{mode}"))
                 for mode in ("synth", "template") if any(a.endpoint == f"local:{mode}" for a in cfg.agents)}
        for a in cfg.agents:
            for t in index:
                if a.seeds is not None and t["seed"] not in a.seeds:
                    continue
                spec_path = prep / "specs" / f"{t['task']}.json"
                spec = json.loads(spec_path.read_text()) if spec_path.exists() else None
                out = ctx.out / "sites" / a.name / t["task"]
                if a.kind == "oracle":
                    if spec is None:
                        continue   # official tasks have no reference implementation
                    info = OracleAgent().build(TaskInputs(prep / "tasks" / t["task"], spec), out)
                else:
                    url = local[a.endpoint.split(":", 1)[1]] if a.endpoint.startswith("local:") else a.endpoint
                    agent = OpenAICompatibleAgent(url, a.model, os.environ.get(a.api_key_env, "") if a.api_key_env else "",
                                                  a.timeout_s, name=a.name)
                    info = agent.build(TaskInputs(prep / "tasks" / t["task"]), out)
                manifest.append({"agent": a.name, "kind": a.kind, **t, **info})
    # one bug per site: the verifier's recall without masking; visual bugs at every level (equal exposure)
    for t in index:
        spec_path = prep / "specs" / f"{t['task']}.json"
        if not spec_path.exists() or int(t["task"].rsplit("_", 1)[1]) != 0:
            continue   # the first task of each level of the chosen seeds
        spec = json.loads(spec_path.read_text())
        bugs = []
        bs = cfg.bug_sites
        if t["seed"] in bs.functional_seeds:
            bugs += [(b, "functional") for b in BUG_AFFECTS.get(t["level"], {})
                     if bs.functional_bugs is None or b in bs.functional_bugs]
        if t["seed"] in bs.visual_seeds and t["level"] in bs.visual_levels:
            bugs += [(b, "visual") for b in VISUAL_BUGS if bs.visual_bugs is None or b in bs.visual_bugs]
        for bug, family in bugs:
            out = ctx.out / "sites" / "bugs" / f"{t['task']}__{bug}"
            info = BugInjectingAgent([bug]).build(TaskInputs(prep / "tasks" / t["task"], spec), out)
            manifest.append({"agent": "bugs", "kind": "bug_site", "family": family, "site": out.name, **t, **info})
    (ctx.out / "manifest.json").write_text(json.dumps(manifest, indent=1))
