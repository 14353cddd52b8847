"""vision2web train params that the stages cannot honour are config errors before any work."""
from __future__ import annotations

import pytest

from stages.common.config import ConfigError, validate
from stages.vision2web.train import Config

AGENTS = [{"name": "oracle", "kind": "oracle", "seeds": [0, 2]}, {"name": "synth", "kind": "openai"}]


@pytest.mark.parametrize("visual, ok", [([0], True), ([0, 2], True), ([5], False), ([2, 3], False)])
def test_visual_bug_sites_need_the_oracles_site_of_their_task(visual, ok):
    block = {"agents": AGENTS, "bug_sites": {"visual_seeds": visual}}
    if ok:
        assert validate(Config, block, "papers.vision2web.train").bug_sites.visual_seeds == visual
        return
    with pytest.raises(ConfigError) as err:
        validate(Config, block, "papers.vision2web.train")
    missing = sorted(set(visual) - {0, 2})
    assert f"bug_sites.visual_seeds: {missing} not among the oracle agent's seeds [0, 2]" in str(err.value)
    assert str(err.value).startswith("papers.vision2web.train")


def test_an_oracle_on_every_seed_builds_every_task():
    agents = [{"name": "oracle", "kind": "oracle"}]
    assert validate(Config, {"agents": agents, "bug_sites": {"visual_seeds": [7]}}, "t").bug_sites.visual_seeds == [7]
