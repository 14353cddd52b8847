"""The worked example on scikit-learn's bundled diabetes data (the real source: ships with the package),
checked against an independent per-fold recomputation with numpy and scikit-learn."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import norm
from sklearn.linear_model import Lasso

from stages.cv_stability.real_data import load_diabetes_xy, worked_example
from stages.cv_stability.simulate import fold_bounds


@pytest.mark.real_source
def test_diabetes_worked_example():
    X, y = load_diabetes_xy()
    assert X.shape == (442, 10) and y.shape == (442,)
    assert np.allclose(X.mean(0), 0, atol=1e-12) and np.allclose(X.std(0), 1) and np.isclose(y.std(), 1)
    k, c, level, seed = 7, 1.5, 0.9, 11                 # non-default k, penalty constant and level
    ex = worked_example(X, y, k=k, lasso_scale=c, level=level, partitions=3, seed=seed)
    # independent recomputation of the example partition: numpy lstsq / scikit-learn Lasso per fold
    perm = np.random.default_rng(seed).permutation(442)
    Xp, yp = X[perm], y[perm]
    alpha = c / np.sqrt(442)
    assert ex["lasso_alpha"] == pytest.approx(alpha)
    loss = {"ols": np.empty(442), "lasso": np.empty(442)}
    for a, b in fold_bounds(442, k):
        tr = np.r_[0:a, b:442]
        beta_ols = np.linalg.lstsq(Xp[tr], yp[tr], rcond=None)[0]
        beta_lasso = Lasso(alpha=alpha, fit_intercept=False, tol=1e-12, max_iter=100_000).fit(Xp[tr], yp[tr]).coef_
        loss["ols"][a:b] = (yp[a:b] - Xp[a:b] @ beta_ols) ** 2
        loss["lasso"][a:b] = (yp[a:b] - Xp[a:b] @ beta_lasso) ** 2
    z = norm.ppf(0.5 + level / 2)
    rows = {(r["contrast"], r["estimator"], r["method"]): r for r in ex["example"]}
    for name, h in (("ols", loss["ols"]), ("lasso", loss["lasso"]), ("lasso_vs_ols", loss["lasso"] - loss["ols"])):
        r = rows[(name, "out", "cv")]
        half = z * h.std() / np.sqrt(442)                 # σ̂_out: the all-pairs (population) s.d.
        assert r["rhat"] == pytest.approx(h.mean(), abs=1e-9)
        assert (r["ci_low"], r["ci_high"]) == pytest.approx((h.mean() - half, h.mean() + half), abs=1e-9)
    # the valid fallback: [L_A − U_B, U_A − L_B] at level 1 − α/2 per model, centred on R̂_A − R̂_B
    zb = norm.ppf(1 - (1 - level) / 4)
    hw = zb * (loss["lasso"].std() + loss["ols"].std()) / np.sqrt(442)
    b = rows[("lasso_vs_ols", "out", "bonferroni")]
    d = loss["lasso"].mean() - loss["ols"].mean()
    assert (b["ci_low"], b["ci_high"]) == pytest.approx((d - hw, d + hw), abs=1e-9)
    assert b["excludes_0"] == (b["ci_low"] > 0 or b["ci_high"] < 0)
    assert len(ex["partitions"]) == len(ex["example"]) and all(p["partitions"] == 3 for p in ex["partitions"])
    assert all(p["rhat_min"] <= p["rhat_max"] for p in ex["partitions"])


def test_worked_example_rejects_bad_folds():
    X, y = np.random.default_rng(0).normal(size=(30, 3)), np.random.default_rng(1).normal(size=30)
    with pytest.raises(ValueError, match="k: 16 folds for 30 points"):
        worked_example(X, y, k=16, lasso_scale=1.0, level=0.95, partitions=0, seed=0)
