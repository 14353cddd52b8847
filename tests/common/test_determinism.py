"""Same params, same metrics: every registered paper's smoke pipeline, run twice into two fresh
roots, gives identical metrics.json (apart from runtime fields), dvc_metrics.json and plot CSVs."""
from __future__ import annotations

import json
import re

import pytest

from stages.common.config import registered_papers
from stages.common.reporting import is_wallclock_key
from stages.common.runner import run_pipeline

pytestmark = pytest.mark.slow


def _strip(doc: dict) -> str:
    """metrics.json without what is measured in wall-clock time: runtime_s, the subtrees the paper
    declared (`wallclock`), time-named keys, and the claims that read them. Canonical JSON text, so
    that NaN equals NaN."""
    wallclock = tuple(doc.get("wallclock", ()))

    def clean(obj, path=""):
        if isinstance(obj, dict):
            return {k: clean(v, f"{path}.{k}" if path else k) for k, v in obj.items()
                    if not is_wallclock_key(f"{path}.{k}" if path else k, wallclock)}
        if isinstance(obj, list):
            return [clean(v, path) for v in obj]
        return obj

    kept = {k: v for k, v in doc.items() if k != "runtime_s"}
    kept["claims"] = [c for c in doc["claims"] if not c.get("wallclock")]
    kept.pop("findings", None)  # verdict counts include the wall-clock claims; the kept claims carry their verdicts
    kept["metrics"] = clean(doc.get("metrics", {}))
    return json.dumps(kept, sort_keys=True)


# a plot whose title says it draws a measured time (its columns carry display names, not metric keys)
_TIMED_TITLE = re.compile(r"CPU time|CPU s\b|wall[- ]clock|runtime|\((?:s|ms|us)\b|\bseconds\b", re.I)


@pytest.mark.parametrize("slug", registered_papers())
def test_smoke_pipeline_twice_gives_identical_metrics(tmp_path, slug):
    outs = []
    for run in ("a", "b"):
        root = tmp_path / run
        (root).mkdir()
        (root / "params.yaml").write_text((__import__("stages.common.paths", fromlist=["ROOT"]).ROOT
                                           / "params.yaml").read_text())
        run_pipeline(slug, root=root, profile="smoke")
        outs.append(root / "reports" / slug)
    a, b = outs
    assert _strip(json.loads((a / "metrics.json").read_text())) == _strip(json.loads((b / "metrics.json").read_text()))
    flat_a, flat_b = (json.loads((d / "dvc_metrics.json").read_text()) for d in (a, b))
    timed = {c["name"] for c in json.loads((a / "metrics.json").read_text())["claims"] if c.get("wallclock")}
    bare = lambda k: k.removeprefix(f"{slug}.")  # noqa: E731  (dvc_metrics keys are <slug>.<claim>... / <slug>.claim.<name>)
    counts = {"findings", "checks"}  # verdict counts include the wall-clock claims; claim.<name> keys are compared
    untimed = lambda flat: {k: v for k, v in flat.items() if bare(k).split(".")[0] not in timed | counts  # noqa: E731
                            and not (bare(k).startswith("claim.") and bare(k).split(".")[1] in timed)}
    assert untimed(flat_a) == untimed(flat_b)
    csv_a = sorted(p.name for p in (a / "plots").iterdir())
    assert csv_a == sorted(p.name for p in (b / "plots").iterdir())
    specs = json.loads((a / "plots" / "_specs.json").read_text()) if (a / "plots" / "_specs.json").exists() else {}
    for name in csv_a:
        spec = specs.get(name.removesuffix(".csv"), {})
        if (any(is_wallclock_key(c) for c in [spec.get("x", ""), *spec.get("y", [])])
                or _TIMED_TITLE.search(spec.get("title", ""))):
            continue  # a plot of measured (wall-clock or CPU) times
        assert (a / "plots" / name).read_bytes() == (b / "plots" / name).read_bytes(), name
