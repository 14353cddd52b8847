"""Outputs never hold NaN/Infinity tokens; user-supplied JSON is bounded before it can hang or traceback."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from stages.common.paths import InputError, load_json_bounded, read_json, write_json


def test_write_json_turns_non_finite_into_null(tmp_path):
    write_json(tmp_path / "a.json", {"x": math.nan, "y": [1.5, math.inf, -math.inf], "z": np.float64("nan"),
                                     "w": np.array([2.0, np.nan])})
    text = (tmp_path / "a.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert read_json(tmp_path / "a.json") == {"w": [2.0, None], "x": None, "y": [1.5, None, None], "z": None}


@pytest.mark.parametrize("content, needle", [
    ("[" * 100_000 + "]" * 100_000, "nests deeper"),
    ("[" * 70 + "]" * 70, "nests deeper than 64 levels"),
    ('{"a": ' + "9" * 5000 + "}", "not valid JSON"),
    ('{"a": 36893488147419103232}', "integer beyond 64 bits"),
    ('{"a": NaN}', "NaN is not valid JSON"),
    ('{"a": 1', "not valid JSON"),
])
def test_bounded_loader_one_line_errors(tmp_path, content, needle):
    f = tmp_path / "in.json"
    f.write_text(content)
    with pytest.raises(InputError, match=needle) as err:
        load_json_bounded(f)
    assert "\n" not in str(err.value) and str(f) in str(err.value)


def test_bounded_loader_size_and_missing(tmp_path):
    f = tmp_path / "big.json"
    f.write_text(json.dumps({"a": "x" * 2000}))
    with pytest.raises(InputError, match="limit 1,000"):
        load_json_bounded(f, max_bytes=1000)
    with pytest.raises(InputError, match="file not found"):
        load_json_bounded(tmp_path / "nope.json")
    assert load_json_bounded(f)["a"] == "x" * 2000


def _parsed_depth(doc) -> int:
    """Nesting depth of a parsed document by plain recursion (the independent reference)."""
    if isinstance(doc, dict):
        return 1 + max((_parsed_depth(v) for v in doc.values()), default=0)
    if isinstance(doc, list):
        return 1 + max((_parsed_depth(v) for v in doc), default=0)
    return 0


def test_json_text_depth_matches_the_parsed_depth_and_skips_brackets_in_strings():
    import json
    import random

    from stages.common.paths import json_text_depth

    rng = random.Random(7)

    def gen(d):
        r = rng.random()
        if d > 6 or r < 0.3:
            return rng.choice([1, -2.5, None, True, "a[{b", 'q"]}"', "\\\\[", ""])
        if r < 0.65:
            return [gen(d + 1) for _ in range(rng.randint(0, 3))]
        return {f"k{i}[": gen(d + 1) for i in range(rng.randint(0, 3))}

    for _ in range(300):
        doc = gen(0)
        text = json.dumps(doc, indent=rng.choice([None, 1]))
        assert json_text_depth(text) == _parsed_depth(doc) == json_text_depth(text.encode())
    assert json_text_depth("[" * 100_000 + "]" * 100_000) == 100_000
    assert json_text_depth('{"a": "[[[[", "b": [["\\"]]"]]}') == 3
