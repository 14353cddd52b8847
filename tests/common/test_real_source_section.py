"""The report's "Real source" tables (issue 41): at `full`, the runs a stage wrote under <stage>/hf/*.json
appear in report.md beside the miniature's claims; at smoke/default (no hf/ folder) nothing is added."""
from __future__ import annotations

import json
from types import SimpleNamespace

from stages.common.reporting import Report, real_runs_frame


def _report(tmp_path):
    ctx = SimpleNamespace(slug="opus", root=tmp_path, out=tmp_path / "out", tracker=None)
    return Report(ctx, "t", "c")


def test_hf_runs_become_a_table_with_the_source(tmp_path):
    hf = tmp_path / "data/opus/train/hf"
    hf.mkdir(parents=True)
    (hf / "kernels.json").write_text(json.dumps({"ghost_countsketch": {"calls": 3}}))
    (hf / "runs.json").write_text(json.dumps({
        "source": {"kind": "hf", "model": "/models/qwen", "dataset": "/data/fineweb.parquet"},
        "k": 8,
        "runs": [{"arm": "opus", "seed": 3, "final": {"val_loss": 2.75}, "curve": [3.5, 3.0, 2.75]},
                 {"arm": "random", "seed": 3, "final": {"val_loss": 3.25}, "curve": [3.5, 3.25]}]}))
    rep = _report(tmp_path)
    rep.real_source_sections()
    assert len(rep.parts) == 1                                    # kernels.json is not a results file
    text = rep.parts[0]
    assert "## Real source (train: runs.json)" in text
    assert "model = /models/qwen" in text and "dataset = /data/fineweb.parquet" in text
    assert "| arm | seed | final.val_loss | curve (last) |" in text
    assert "| opus | 3 | 2.75 | 2.75 |" in text and "| random | 3 | 3.25 | 3.25 |" in text


def test_no_hf_folder_adds_nothing(tmp_path):
    (tmp_path / "data/opus/train").mkdir(parents=True)
    rep = _report(tmp_path)
    rep.real_source_sections()
    assert rep.parts == []


def test_rows_flatten_mixed_types_and_cap_columns():
    rows = [{"a": 1, "b": {"c": 2.5, "d": [1, 2, 7]}, "e": "x", "f": [1, "y"]}, {"a": "n/a", "b": {"c": None}}]
    f = real_runs_frame(rows, max_cols=3)
    assert f.columns == ["a", "b.c", "b.d (last)"]                # lists of non-numbers are dropped
    assert f["a"].to_list() == ["1", "n/a"]                         # a mixed column is shown as text
    assert f["b.c"].to_list() == [2.5, None] and f["b.d (last)"].to_list() == [7.0, None]
    assert real_runs_frame([]).is_empty()


def test_summary_fields_and_unreadable_files(tmp_path):
    hf = tmp_path / "data/opus/evaluate/hf"
    hf.mkdir(parents=True)
    (hf / "checkpoints.json").write_text(json.dumps({"spearman": {"rho": -0.25, "p": 0.5}, "seq_len": 64,
                                                     "rows": [{"ckpt": "a", "erank": 12.5}]}))
    (hf / "broken.json").write_text("{not json")
    rep = _report(tmp_path)
    rep.real_source_sections()
    text = "\n".join(rep.parts)
    assert "`data/opus/evaluate/hf/broken.json` is unreadable (JSONDecodeError)" in text
    assert "spearman.rho = -0.25" in text and "seq_len = 64" in text and "| a | 12.5 |" in text
