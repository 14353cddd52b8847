"""Data sets regenerated from the seed (issue 29: prepare stores only the design) and the coverage-slope CI."""
from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch

from stages.cv_stability.report import coverage_slope
from stages.cv_stability.simulate import draw_datasets, rep_chunks

BETA = torch.tensor([3.0, 1.0, -5.0, 3.0, 0.0, 0.0], dtype=torch.float64)


def test_regeneration_is_independent_of_chunking():
    whole = draw_datasets(7, 50, range(0, 9), BETA, 1.7)
    parts = [draw_datasets(7, 50, part, BETA, 1.7) for part in (range(0, 2), range(2, 3), range(3, 9))]
    assert torch.equal(whole[0], torch.cat([p[0] for p in parts]))
    assert torch.equal(whole[1], torch.cat([p[1] for p in parts]))
    # a data set depends on (seed, n, rep) only: another seed or another n gives other data
    assert not torch.equal(whole[1][:, :40], draw_datasets(8, 50, range(0, 9), BETA, 1.7)[1][:, :40])
    assert not torch.equal(whole[1][:, :40], draw_datasets(7, 40, range(0, 9), BETA, 1.7)[1])


@pytest.mark.parametrize("reps,n,points", [(1000, 12800, 1_000_000), (7, 3, 5), (10, 1, 1), (5, 10**7, 1000)])
def test_rep_chunks_partition_the_replications(reps, n, points):
    chunks = rep_chunks(reps, n, points)
    assert [r for c in chunks for r in c] == list(range(reps))
    assert all(len(c) * n <= max(points, n) for c in chunks)


def test_regenerated_data_follow_the_model():
    sd = 1.7
    x, y = draw_datasets(3, 20_000, range(3), BETA, sd)
    resid = y - x @ BETA
    assert abs(float(resid.std()) - sd) < 0.02
    assert torch.allclose(x.reshape(-1, BETA.numel()).T.cov(), torch.eye(BETA.numel(), dtype=torch.float64),
                          atol=0.02)


def _rows(ns, cov, reps):
    return pl.DataFrame({"n": ns, "coverage": cov, "reps": reps})


def test_coverage_slope_two_points_closed_form():
    # two sizes a factor 8 apart: slope = Δp / 3 doublings; no residual df, so the binomial s.e. √(v1 + v2) / 3
    f = coverage_slope(_rows([100, 800], [0.8, 0.86], [400, 900]))
    v = 0.8 * 0.2 / 400 + 0.86 * 0.14 / 900
    assert f["slope"] == pytest.approx(0.02)
    assert f["se_binomial"] == pytest.approx(np.sqrt(v) / 3)
    assert f["se"] == pytest.approx(np.sqrt(v) / 3) and f["df"] == 0.0


def test_coverage_slope_matches_polyfit_and_binomial_simulation():
    ns = np.array([200, 800, 3200, 6400, 12800])
    p = np.array([0.87, 0.88, 0.885, 0.9, 0.89])
    reps = 700
    f = coverage_slope(_rows(ns.tolist(), p.tolist(), [reps] * len(ns)))
    assert f["slope"] == pytest.approx(np.polyfit(np.log2(ns), p, 1)[0])
    # brute force: the s.d. of the fitted slope over independent binomial coverages
    rng = np.random.default_rng(0)
    sims = rng.binomial(reps, p, size=(20_000, len(ns))) / reps
    slopes = np.polyfit(np.log2(ns), sims.T, 1)[0]
    assert f["se_binomial"] == pytest.approx(slopes.std(), rel=0.03)
