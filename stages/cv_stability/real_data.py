"""A worked example on real data: CV inference for Lasso vs OLS on scikit-learn's diabetes data.

The paper is a simulation study; this module shows what its interval gives a practitioner on a real
regression problem. The data ship with scikit-learn (``sklearn.datasets.load_diabetes``: 442 patients,
10 baseline variables, a disease-progression score one year later), so nothing is downloaded.

    X, y = load_diabetes_xy()                      # columns z-scored, y z-scored (loss in units of var(y))
    ex = worked_example(X, y, k=10, lasso_scale=1.0, level=0.95, partitions=50, seed=3)

The same estimators as the simulation (stages.cv_stability.cv_inference): k-fold out-of-fold squared
errors h_i of OLS and of the Lasso (α_n = c/√n, scikit-learn scaling, through kernels.batched_lasso),
and of their difference; R̂ ± z σ̂/√n with σ̂_out and σ̂_in; the conservative Bonferroni interval
for the difference. The fold assignment is one random partition (``seed``); ``partitions`` further
random partitions show how much the interval moves with the partition alone. Unlike the simulation,
the target (the k-fold test error) is unknown here, so coverage cannot be measured: the example reports
intervals, not verdicts.
"""
from __future__ import annotations

import numpy as np
import torch

from stages.cv_stability.cv_inference import bonferroni_difference, cv_estimates, out_of_fold_losses, z_quantile
from stages.cv_stability.models import fit_models
from stages.cv_stability.simulate import fold_bounds

SOURCE = "sklearn.datasets.load_diabetes (ships with scikit-learn; no download)"


def load_diabetes_xy(scaled: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The diabetes data as float64 (442, 10) and (442,). scaled: z-score every column and y (the loss is
    then in units of var(y), and the Lasso penalty α_n = c/√n has the simulation's scale)."""
    from sklearn.datasets import load_diabetes

    X, y = load_diabetes(return_X_y=True, scaled=False)
    X, y = np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if X.ndim != 2 or y.shape != (X.shape[0],) or not np.isfinite(X).all() or not np.isfinite(y).all():
        raise ValueError(f"{SOURCE}: unexpected data (X {X.shape}, y {y.shape}, or non-finite values)")
    if scaled:
        X = (X - X.mean(0)) / X.std(0)
        y = (y - y.mean()) / y.std()
    return X, y


def _fold_fits(X: torch.Tensor, y: torch.Tensor, bounds, lasso_alpha: float, tol: float, max_iter: int,
               backend: str) -> dict[str, torch.Tensor]:
    """OLS and Lasso fitted without each fold, for a batch of R partitions: X (R, n, d), y (R, n).
    Returns {model: (R, k, d)}. No intercept, as in the simulation (the data are z-scored overall)."""
    gram_f = torch.stack([X[:, a:b].transpose(1, 2) @ X[:, a:b] for a, b in bounds], 1)
    xty_f = torch.stack([(X[:, a:b].transpose(1, 2) @ y[:, a:b, None])[..., 0] for a, b in bounds], 1)
    gram, xty = gram_f.sum(1, keepdim=True) - gram_f, xty_f.sum(1, keepdim=True) - xty_f
    n = X.shape[1]
    sizes = torch.tensor([n - (b - a) for a, b in bounds], dtype=X.dtype)
    lam = {"lasso": lasso_alpha, "st_low": 0.0, "st_high": 0.0}
    coefs, _ = fit_models(gram, xty, sizes.expand(gram.shape[:2]), lam, tol, max_iter, backend)
    return {"ols": coefs["ols"], "lasso": coefs["lasso"]}


def worked_example(X: np.ndarray, y: np.ndarray, *, k: int, lasso_scale: float, level: float, partitions: int,
                   seed: int, tol: float = 1e-10, max_iter: int = 10_000, backend: str = "auto") -> dict:
    """CV intervals for OLS, Lasso and Lasso − OLS on one random k-fold partition (the example), and
    the same intervals over ``partitions`` further random partitions (how much they move)."""
    n, d = X.shape
    if not 2 <= k <= n // 2:
        raise ValueError(f"k: {k} folds for {n} points (need 2 <= k <= n/2)")
    rng = np.random.default_rng(seed)
    perms = np.stack([rng.permutation(n) for _ in range(partitions + 1)])            # (R, n); row 0: the example
    Xp = torch.as_tensor(X[perms])                                                   # (R, n, d)
    yp = torch.as_tensor(y[perms])                                                   # (R, n)
    bounds = fold_bounds(n, k)
    alpha = lasso_scale / np.sqrt(n)
    coefs = _fold_fits(Xp, yp, bounds, alpha, tol, max_iter, backend)
    loss = {m: out_of_fold_losses(Xp, yp, c, bounds) for m, c in coefs.items()}       # (R, n)
    z = z_quantile(level)
    est = {"ols": cv_estimates(loss["ols"], bounds), "lasso": cv_estimates(loss["lasso"], bounds),
           "lasso_vs_ols": cv_estimates(loss["lasso"] - loss["ols"], bounds)}
    rows = []
    for name, e in est.items():
        for var_name in ("out", "in"):
            half = z * e[f"var_{var_name}"].sqrt() / np.sqrt(n)
            rows.append({"contrast": name, "estimator": var_name, "method": "cv", "rhat": e["rhat"],
                         "lo": e["rhat"] - half, "hi": e["rhat"] + half})
            if name == "lasso_vs_ols":
                lo, hi = bonferroni_difference(est["lasso"]["rhat"], est["lasso"][f"var_{var_name}"],
                                               est["ols"]["rhat"], est["ols"][f"var_{var_name}"], n, level)
                rows.append({"contrast": name, "estimator": var_name, "method": "bonferroni", "rhat": e["rhat"],
                             "lo": lo, "hi": hi})
    example, spread = [], []
    for r in rows:
        lo, hi, rhat = r["lo"].numpy(), r["hi"].numpy(), r["rhat"].numpy()
        excl = (lo > 0) | (hi < 0)
        base = {k_: r[k_] for k_ in ("contrast", "estimator", "method")}
        example.append({**base, "rhat": float(rhat[0]), "ci_low": float(lo[0]), "ci_high": float(hi[0]),
                        "half_width": float((hi[0] - lo[0]) / 2), "excludes_0": bool(excl[0])})
        if partitions:
            spread.append({**base, "partitions": partitions, "rhat_min": float(rhat[1:].min()),
                           "rhat_max": float(rhat[1:].max()), "rhat_sd": float(rhat[1:].std(ddof=1)),
                           "mean_half_width": float(((hi[1:] - lo[1:]) / 2).mean()),
                           "share_excluding_0": float(excl[1:].mean())})
    support = (coefs["lasso"][0] != 0).sum(-1)                                       # per fold, the example
    return {"n": n, "d": d, "k": k, "level": level, "lasso_alpha": float(alpha), "seed": seed,
            "example": example, "partitions": spread, "lasso_support_per_fold": support.tolist(),
            "source": SOURCE}
