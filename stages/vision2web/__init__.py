"""vision2web: hierarchical visual website-development benchmark (L1 static, L2 interactive, L3 full stack)
with a real Chromium GUI verifier and a segmented visual judge. Task format: README.md beside this file."""
from stages.common.sources import Source

SOURCES = [
    Source(real="the official Vision2Web tasks (zai-org/Vision2Web datasets/{webpage,frontend,website}: prototypes, "
                "workflow.json, prompt.txt / prd.md)",
           params_key="papers.vision2web.prepare.source",
           loader="stages.vision2web.official:load_official",
           fixture_test="tests/vision2web/test_official.py::test_official_layout_fixture",
           note="`full` sets prepare.source {kind: file, dataset: <datasets/ folder>}; the agents under test are any OpenAI-compatible "
                "endpoint (train.agents[].endpoint), tested against a loopback stub"),
]
