"""kernels/cauchy_apply: Triton (interpreter, fp64) vs dense torch reference, values and gradients."""
from __future__ import annotations

import pytest
import torch

from kernels.cauchy_apply import cauchy_apply, cauchy_apply_reference, cauchy_matrix, random_factor
from kernels.dispatch import interpreting
from kernels.testing import check_parity


def test_interpreter_is_on():
    assert interpreting()


@pytest.mark.parametrize("m, c", [(1, 1), (7, 3), (33, 1), (61, 37), (97, 5)])
@pytest.mark.parametrize("transpose", [True, False])
def test_parity_fp64_values_and_grads(m, c, transpose):
    z, d, org, tau, a, X = random_factor(m, c, seed=1000 * m + c)  # fresh factor per shape
    kern = lambda X: cauchy_apply(z, d, org, tau, a, X, transpose=transpose, backend="triton")  # noqa: E731
    ref = lambda X: cauchy_apply_reference(z, d, org, tau, a, X, transpose=transpose)  # noqa: E731
    check_parity(kern, ref, [X], atol=1e-12, rtol=1e-10, grads=True)
    Y, R = kern(X), ref(X)
    assert float((Y - R).norm() / R.norm()) <= 1e-10


def test_factor_is_orthogonal_and_inverts():
    z, d, org, tau, a, X = random_factor(80, 4, seed=7)
    C = cauchy_matrix(z, d, org, tau, a)
    assert float((C.T @ C - torch.eye(80, dtype=torch.float64)).abs().max()) < 1e-12
    Y = cauchy_apply(z, d, org, tau, a, X, transpose=True, backend="triton")
    back = cauchy_apply(z, d, org, tau, a, Y, transpose=False, backend="triton")
    torch.testing.assert_close(back, X, atol=1e-12, rtol=1e-12)


def test_non_contiguous_input():
    z, d, org, tau, a, X = random_factor(45, 6, seed=3)
    Xt = X.T.contiguous().T  # same values, column-major strides
    torch.testing.assert_close(cauchy_apply(z, d, org, tau, a, Xt, backend="triton"),
                               cauchy_apply_reference(z, d, org, tau, a, X), atol=1e-12, rtol=1e-10)


def test_shape_errors():
    z, d, org, tau, a, X = random_factor(10, 2, seed=0)
    with pytest.raises(ValueError, match="X must have shape"):
        cauchy_apply(z, d, org, tau, a, X[:5])
    with pytest.raises(ValueError, match="tau must have shape"):
        cauchy_apply(z, d, org, tau[:3], a, X)


def test_kernel_module_imports_nothing_from_stages():
    import ast
    import inspect

    import kernels.cauchy_apply as mod

    tree = ast.parse(inspect.getsource(mod))
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [m for m in names if m.split(".")[0] == "stages"], names


def test_random_factor_roots_match_eigh():
    """The benchmark's own inputs: roots of the secular equation are the eigenvalues of diag(d) + rho z z^T."""
    import numpy as np

    from kernels.cauchy_apply import _secular_roots

    rng = np.random.default_rng(5)
    d = np.sort(rng.uniform(0, 3, 23)) + np.arange(23) * 1e-2
    z = rng.normal(size=23)
    z /= np.linalg.norm(z)
    origin, tau = _secular_roots(d, z * z, 1.3)
    np.testing.assert_allclose(d[origin] + tau, np.linalg.eigvalsh(np.diag(d) + 1.3 * np.outer(z, z)), atol=1e-13)
