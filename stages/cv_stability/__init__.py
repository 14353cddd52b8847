"""cv_stability — cross-validation inference needs *relative* stability (miniature reproduction).

Linear model Y = Xᵀβ* + ε with X, ε Gaussian; k-fold CV confidence intervals (Bayle et al. 2020)
for the test error of single models (OLS, soft-thresholded OLS, Lasso) and for comparisons between
them; exact conditional test errors (1 + ‖β̂ − β*‖²) make the coverage exact; a Monte-Carlo
estimator of the relative stability r(h_n) = n·γ(h_n)/σ²(h_n).

    python -m stages prepare cv_stability     # the design (seeds, n, folds); data are regenerated from seeds
    python -m stages train cv_stability       # fit every model on every (rep, fold)
    python -m stages evaluate cv_stability    # CV CIs, coverage, Monte-Carlo r(h_n)
    python -m stages report cv_stability      # report.md, figures, claims

Modules: simulate (data model, exact test error), models (OLS / ST / Lasso from Gram statistics,
Lasso through kernels.batched_lasso), cv_inference (the CV CI and its target), stability (r(h_n)),
real_data (the worked example on scikit-learn's diabetes data).
"""
from stages.common.sources import Source

SOURCES = [Source(
    real="scikit-learn's bundled diabetes data (442 patients x 10 variables; sklearn.datasets.load_diabetes, "
         "ships with the package, no download): a worked example of CV inference for Lasso vs OLS",
    params_key="papers.cv_stability.evaluate.real_example",
    loader="stages.cv_stability.real_data:load_diabetes_xy",
    fixture_test="tests/cv_stability/test_real_data.py::test_diabetes_worked_example",
    note="the paper is a simulation study (its claims run on the Gaussian linear model at every profile); the "
         "real data enter as a worked example, run at every profile because the data ship with scikit-learn",
)]
