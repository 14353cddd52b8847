"""stages/unembed_rank/geometry.py on decisive small cases: the zero matrix, exact zero singular values,
spectra whose sum is below 1, the σ² variant through erank_pct, the metric dict of geometry() against
hand-computed values, and a clear error for an unknown spectrum kind."""
from __future__ import annotations

import math

import pytest
import torch

from stages.unembed_rank.geometry import erank, erank_pct, geometry, isotropy


def _exp_entropy(*p):
    return math.exp(-sum(x * math.log(x) for x in p))


def test_zero_matrix_has_effective_rank_zero():
    assert erank(torch.zeros(4, 3)) == 0.0
    assert erank(torch.zeros(4, 3), "sigma2") == 0.0


def test_exact_zero_singular_values_are_dropped_not_nan():
    w = torch.diag(torch.tensor([2.0, 0.0, 0.0], dtype=torch.float64))
    assert erank(w) == 1.0 and erank(w, "sigma2") == 1.0


def test_small_spectra_are_not_treated_as_empty():
    # σ = (0.3, 0.1), sum 0.4 < 1: same distribution as (3, 1)
    w = torch.diag(torch.tensor([0.3, 0.1], dtype=torch.float64))
    assert erank(w) == pytest.approx(_exp_entropy(0.75, 0.25), rel=1e-12)


def test_erank_pct_passes_the_kind_through():
    w = torch.tensor([[3.0, 0.0], [0.0, 1.0], [0.0, 0.0]], dtype=torch.float64)   # V=3, C=2: max rank 2
    assert erank_pct(w) == pytest.approx(50.0 * _exp_entropy(0.75, 0.25), rel=1e-12)
    assert erank_pct(w, "sigma2") == pytest.approx(50.0 * _exp_entropy(0.9, 0.1), rel=1e-12)


@pytest.mark.parametrize("bad", ["SIGMA", "sigma_sq", None])
def test_unknown_kind_is_an_error(bad):
    with pytest.raises(ValueError, match=r"kind: must be 'sigma' or 'sigma2'"):
        erank(torch.eye(2), bad)


def test_geometry_dict_by_hand():
    w = torch.tensor([[3.0, 0.0], [0.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    h = torch.tensor([[1.0, 1.0], [1.0, -1.0], [2.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
    g = geometry(w)
    assert sorted(g) == ["cosine", "erank", "erank_sq", "isotropy"]
    # rows (3,0), (0,1), (0,0): normalize() maps the zero row to 0, so the 6 ordered pairs all have cosine 0
    assert g["cosine"] == 0.0
    assert g["erank"] == pytest.approx(50.0 * _exp_entropy(0.75, 0.25))
    assert g["erank_sq"] == pytest.approx(50.0 * _exp_entropy(0.9, 0.1))
    assert g["isotropy"] == pytest.approx(isotropy(w))
    gh = geometry(w, h)
    assert sorted(gh) == sorted(list(g) + ["h_cosine", "h_erank", "h_erank_sq", "h_isotropy"])
    # h: HᵀH = 6·I, σ = (√6, √6): flat spectrum, full rank 2 (100%) for both kinds
    assert gh["h_erank"] == pytest.approx(100.0) and gh["h_erank_sq"] == pytest.approx(100.0)
    # unit rows u1=(1,1)/√2, u2=(1,-1)/√2, u3=(1,0), u4=(0,1); unordered pair cosines u1u2 0, u1u3 √½,
    # u1u4 √½, u2u3 √½, u2u4 -√½, u3u4 0 sum to 2√½; the 12 ordered pairs sum to 4√½
    assert gh["h_cosine"] == pytest.approx(4 * math.sqrt(0.5) / 12)
    assert gh["h_isotropy"] == pytest.approx(isotropy(h))
