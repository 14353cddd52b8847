"""train: the agents under test build their sites (reference agents of graded skill, offline)."""
from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from stages.common.config import Probability, StageConfig, unique_items
from stages.vision2web.agents import BugInjectingAgent, OracleAgent, TaskInputs, TemplateAgent


class AgentSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    name: str = Field(min_length=1, max_length=40, pattern=r"^[a-z0-9_]+$")
    kind: Literal["oracle", "buggy", "template"]
    rate: Probability = 0.0   # per-bug-site injection probability (buggy only)


class Config(StageConfig):
    agents: list[AgentSpec] = Field(default_factory=lambda: [
        AgentSpec(name="oracle", kind="oracle"), AgentSpec(name="buggy_low", kind="buggy", rate=0.15),
        AgentSpec(name="buggy_high", kind="buggy", rate=0.4), AgentSpec(name="template", kind="template")],
        min_length=1, max_length=10)

    @field_validator("agents")
    @classmethod
    def _distinct(cls, v):
        unique_items([a.name for a in v], "agents[].name")
        if not any(a.kind == "oracle" for a in v):
            raise ValueError("agents: an oracle agent is required (false-alarm rate, claim 3)")
        return v


def make_agent(a: AgentSpec, seed: int):
    if a.kind == "oracle":
        return OracleAgent()
    if a.kind == "template":
        return TemplateAgent()
    return BugInjectingAgent(a.rate, seed, name=a.name)


def run(cfg: Config, ctx) -> None:
    prep = ctx.input("prepare")
    index = json.loads((prep / "index.json").read_text())
    manifest = []
    for a in cfg.agents:
        for t in index:
            spec = json.loads((prep / "specs" / f"{t['task']}.json").read_text())
            agent = make_agent(a, t["seed"])
            out = ctx.out / "sites" / a.name / t["task"]
            info = agent.build(TaskInputs(prep / "tasks" / t["task"], spec), out)
            manifest.append({"agent": a.name, "kind": a.kind, "rate": a.rate, **t, **info})
    (ctx.out / "manifest.json").write_text(json.dumps(manifest, indent=1))
