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
