"""The report's table of a committed study's two RL findings (report.rl_study): values read from the study's
files, bad folders named."""
from __future__ import annotations

import pytest


def test_report_rl_study_section(tmp_path):
    """The report's table of a committed study's RL findings: values from the study's files, bad folders named."""
    from stages.common.paths import write_json
    from stages.common.runner import MissingInputError
    from stages.futurecad.report import rl_study_section

    from stages.futurecad.report import CLAIMS

    def claim(name, rl, sft, verdict):
        st = {"n": 2.0, "mean": 0.03, "se": 0.004, "se_items": 0.003, "se_seeds": 0.002, "lower": 0.0234,
              "upper": 0.0366, "min_effect": 0.02, "detectable": 0.031}
        spec = next(c for c in CLAIMS if c.name == name)
        return {"name": name, "verdict": verdict, "stats": st,
                "values": dict(sorted({spec.a: rl, spec.b: sft}.items()))}     # as claims.json stores them: sorted
    write_json(tmp_path / "claims.json", {"claims": [claim("rl_beats_sft_equal_compute", [0.5, 0.7], [0.25, 0.35], "holds"),
                                                     claim("rl_raises_executability", [0.9, 0.8], [0.6, 0.9], "fails"),
                                                     claim("rl_improves_sft_checkpoint", [0.5, 0.7], [0.5, 0.5],
                                                           "inconclusive"),
                                                     claim("sft_only_beats_constant_script", [0.25, 0.35], [0.8, 0.8],
                                                           "fails")]})
    write_json(tmp_path / "study.json", {"slug": "futurecad", "overrides": ["prepare.n_test_parts=7"],
                                         "command": "python -m stages.common.study futurecad --out reports/studies/x "
                                                    "--set prepare.n_test_parts=7"})
    here = {"sft_lr": 0.003, "rl_lr": 3e-5, "n_seeds": 3, "grpo": {"group_size": 8}}
    study_cfg = dict(here, n_seeds=5)                       # a study changes the seed count, nothing else
    write_json(tmp_path / "metrics.json", {"metrics": {"program": {"n_test": 1234, "config": study_cfg,
                                                                   "selected_checkpoints": {
        "0": {"rl_step": 0, "sft_more_step": 60}, "1": {"rl_step": 24, "sft_more_step": 30}}}}})
    prose, table = rl_study_section(tmp_path, "3 program seeds × 60 descriptions", here)
    rows = table.to_dicts()
    assert [r["verdict"] for r in rows] == ["holds", "fails", "inconclusive", "fails"]   # a check it has, after them
    assert rows[0]["value"] == "0.6000" and rows[0]["baseline value"] == "0.3000" and rows[1]["baseline value"] == "0.7500"
    assert [r["baseline"] for r in rows] == ["SFT-only", "SFT-only", "its SFT checkpoint", "one script for all"]
    assert rows[2]["baseline value"] == "0.5000" and rows[3]["model"] == "SFT-only" and rows[3]["value"] == "0.3000"
    assert rows[0]["95% t-bounds"] == "[+0.0234, +0.0366]" and rows[0]["seeds"] == 2
    assert "seed 0: 0 / 60, seed 1: 24 / 30." in prose
    assert "1234 held-out descriptions" in prose and "`prepare.n_test_parts=7`" in prose and f"[`{tmp_path}`]" in prose
    # another design (an lr, a nested GRPO value) or no recorded params: an error naming what differs
    for other, match in ((dict(here, rl_lr=1e-4), r"other program-model params than this run \(rl_lr\)"),
                         (dict(here, grpo={"group_size": 4}), r"\(grpo\)"),
                         ({k: v for k, v in here.items() if k != "sft_lr"}, r"\(sft_lr\)")):
        with pytest.raises(MissingInputError, match=match):
            rl_study_section(tmp_path, "", other)
    write_json(tmp_path / "metrics.json", {"metrics": {"program": {"n_test": 1234}}})
    with pytest.raises(MissingInputError, match="does not record its program-model params"):
        rl_study_section(tmp_path, "", here)
    (tmp_path / "metrics.json").unlink()
    with pytest.raises(MissingInputError, match="has no metrics.json"):
        rl_study_section(tmp_path, "", here)
    write_json(tmp_path / "metrics.json", {"metrics": {"program": {"config": here}}})
    assert "— held-out descriptions" in rl_study_section(tmp_path, "", here)[0]
    write_json(tmp_path / "study.json", {"slug": "plantain", "overrides": [], "command": "x --out y"})
    with pytest.raises(MissingInputError, match="not a futurecad study"):
        rl_study_section(tmp_path, "", here)
    (tmp_path / "claims.json").unlink()
    with pytest.raises(MissingInputError, match="has no claims.json"):
        rl_study_section(tmp_path, "", here)


def test_fidelity_table_rows_and_paired_gaps():
    """Per-arm means over seeds of per-description means; the gap rows' mean is the mean per-seed paired gap, inside
    its own bounds; below 3 seeds no bounds are claimed."""
    from stages.futurecad.report import FIDELITY_SHOWN, fidelity_table, paired_gap

    rl = [[1, 0, 1, 1], [1, 1, 0, 1], [0, 1, 1, 1]]           # per-seed means 0.75, 0.75, 0.75
    only = [[0, 0, 1, 0], [1, 0, 0, 0], [0, 0, 1, 1]]         # 0.25, 0.25, 0.5 -> gaps 0.5, 0.5, 0.25
    got = paired_gap(rl, only)
    mean, lo, hi = float(got.split()[0]), *map(float, got.split("[")[1].rstrip("]").split(","))
    assert mean == pytest.approx(5 / 12, abs=5e-4) and lo < mean < hi
    assert paired_gap(rl[:2], only[:2]) == "—"
    fid = {arm: {k: v for k in FIDELITY_SHOWN} for arm, v in (("sft", only), ("sft_more", only), ("rl", rl))}
    t = fidelity_table(fid)
    assert t["model"].to_list() == ["SFT checkpoint", "SFT-only (≥ equal compute)", "SFT + RL (GSPO)",
                                    "SFT + RL − SFT-only (≥ equal compute) (paired)",
                                    "SFT + RL − SFT checkpoint (paired)"]
    assert t.row(2, named=True)["edit"] == "0.750 ± 0.000" and t.row(3, named=True)["op"] == got
