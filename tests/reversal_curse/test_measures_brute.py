"""stages/reversal_curse/measures.py edge cases: device placement, scale invariance of the asymmetry at
small scale, non-finite and misclassified weights, and the convex reference's solver handling."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from stages.reversal_curse.measures import margins, min_nuclear_norm, nuclear_at_margin, offdiag_asymmetry


def test_margins_stay_on_the_inputs_device():
    w = torch.zeros(5, 5, device="meta")
    idx = [torch.tensor(v, device="meta") for v in ([0, 1], [2, 2], [3, 4])]
    assert margins(w, *idx).device.type == "meta"


def test_asymmetry_is_scale_free_down_to_tiny_weights():
    # u = W[a,b] = (0.3, -0.1), v = W[b,a] = (0.0, 0.2): ||u - v|| = sqrt(0.09 + 0.09) = 0.4243,
    # sqrt(||u||^2 + ||v||^2) = sqrt(0.1 + 0.04) = 0.3742 -> 1.1339
    w = torch.zeros(4, 4, dtype=torch.float64)
    w[0, 1], w[2, 3], w[1, 0], w[3, 2] = 0.3, -0.1, 0.0, 0.2
    a, b = torch.tensor([0, 2]), torch.tensor([1, 3])
    expected = math.sqrt(0.18) / math.sqrt(0.14)
    for scale in (1.0, 1e-3, 1e-9):
        assert offdiag_asymmetry(w * scale, a, b) == pytest.approx(expected, rel=1e-9)
    assert offdiag_asymmetry(torch.zeros(4, 4, dtype=torch.float64), a, b) == 0.0


def test_nuclear_at_margin_nan_when_diverged_and_inf_when_misclassified():
    e, r, t = torch.tensor([0]), torch.tensor([1]), torch.tensor([2])
    w = torch.eye(3, dtype=torch.float64) * 2.5
    w[2, 0] = float("inf")
    assert math.isnan(nuclear_at_margin(w, e, r, t))
    w = torch.zeros(3, 3, dtype=torch.float64)                 # every logit 0: margin 0 -> not yet separated
    assert nuclear_at_margin(w, e, r, t) == float("inf")


def test_min_nuclear_norm_honours_the_solver_and_reports_infeasible_problems():
    e, r, t = np.array([0, 1]), np.array([2, 2]), np.array([3, 4])
    with pytest.raises(Exception, match="NOPE"):
        min_nuclear_norm(5, e, r, t, solver="NOPE")
    # the same prompt [0, 2] with two different targets cannot have both margins >= 1
    with pytest.raises(RuntimeError, match="min-nuclear-norm problem: solver status infeasible"):
        min_nuclear_norm(5, np.array([0, 0]), np.array([2, 2]), np.array([3, 4]))
