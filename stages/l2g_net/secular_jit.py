"""Compiled (numba) loops of L2G's rank-one eigen-update: the secular-equation roots, the Gu-Eisenstat z
and the Cauchy column scales, one root / row at a time in O(m) work each, as LAPACK's dlaed4/dlaed3 do.

They compute what ``gft``'s vectorized numpy versions compute (kept there as the references the tests
compare with; README: on n = 3000 graphs the numpy secular solver was ~77% of L2G's time, mostly
temporaries of m x ROW_BLOCK arrays). Differences are rounding only: ``fastmath={"reassoc"}`` (no other fast-math
flag, so NaN/inf compare as usual) lets the compiler split each sum and product into vectorized partial ones,
where numpy sums pairwise; the pole distances (d_i - d_o) - tau stay two subtractions. Single-threaded (no ``parallel``), so CPU timings stay those of one thread; compiled
once per machine (``cache=True`` writes next to this file) and warmed by ``warm_up`` before timings. The loops are
written as plain functions and compiled below, so that mutation testing can mutate them (it skips decorated
functions) and run them as Python (``NUMBA_DISABLE_JIT=1``, tests/l2g_net/mutation.json).
"""
from __future__ import annotations

import math

import numba
import numpy as np

EPS = float(np.finfo(np.float64).eps)
_JIT = dict(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc"})   # numpy semantics: x/0 -> inf/nan, no exception


def _secular_roots(d, z2, rho, max_iter, origin, tau):
    """# ALGO: secular equation f(lam) = 1/rho + sum_i z_i^2/(d_i - lam) = 0, root j in (d_j, d_{j+1}),
    last root in (d_m, d_m + rho |z|^2); lam~_j = d[origin_j] + tau_j with origin the nearer pole.
    Per root: the two-pole rational model (Bunch-Nielsen-Sorensen fixed weights) matched in value and
    slope, safeguarded by the sign bracket (bisection when the model step leaves it). Fills origin, tau."""
    m = d.size
    inv_rho = 1.0 / rho
    z2_sum = 0.0
    for i in range(m):
        z2_sum += z2[i]
    for j in range(m):
        last = j == m - 1
        p = m - 2 if last else j                  # the two-pole model uses d_p, d_{p+1}
        o = j
        lo = 0.0
        if last:
            hi = rho * z2_sum
        else:
            gap = d[j + 1] - d[j]
            f_mid = 0.0                           # the sign of f at the midpoint says which pole is nearer
            for i in range(m):
                f_mid += z2[i] / ((d[i] - d[j]) - 0.5 * gap)
            if inv_rho + f_mid < 0:               # root in the upper half -> measure from d_{j+1}
                o = j + 1
                lo, hi = -0.5 * gap, 0.0
            else:
                hi = 0.5 * gap
        t = 0.5 * (lo + hi)
        do = d[o]
        for _ in range(max_iter):
            psi = 0.0
            phi = 0.0
            dpsi = 0.0
            dphi = 0.0
            for i in range(p + 1):                # psi: poles i <= p (terms <= 0), summed apart from phi
                delta = (d[i] - do) - t
                ti = z2[i] / delta
                psi += ti
                dpsi += ti / delta
            for i in range(p + 1, m):             # phi: poles i > p (terms >= 0)
                delta = (d[i] - do) - t
                ti = z2[i] / delta
                phi += ti
                dphi += ti / delta
            f = (inv_rho + psi) + phi             # the one cancelling addition comes last
            err = inv_rho + abs(phi) + abs(psi)   # sum of |terms|: the rounding scale of f
            dp = (d[p] - do) - t
            dq = (d[p + 1] - do) - t
            if f < 0:                             # bracket from the sign of the increasing f
                lo = t
            if f > 0:
                hi = t
            if abs(f) <= 4 * EPS * err or hi - lo <= 2 * EPS * max(abs(lo), abs(hi)):
                break
            # ALGO: rational model f ~ C + b/(dp - eta) + e/(dq - eta), b = dp^2 psi', e = dq^2 phi'
            C = f - dp * dpsi - dq * dphi
            B = C * (dp + dq) + dp * dp * dpsi + dq * dq * dphi
            c0 = dp * dq * f
            disc = B * B - 4.0 * C * c0
            q = 0.5 * (B + math.copysign(math.sqrt(max(disc, 0.0)), B))
            eta1 = q / C if C != 0 else np.nan
            eta2 = c0 / q if q != 0 else np.nan
            cand1 = t + eta1
            cand2 = t + eta2
            in1 = cand1 > lo and cand1 < hi and disc >= 0
            in2 = cand2 > lo and cand2 < hi and disc >= 0
            if in2 and (not in1 or abs(eta2) < abs(eta1)):
                t = cand2
            elif in1:
                t = cand1
            else:
                t = 0.5 * (lo + hi)               # safeguard: bisection
        origin[j] = o
        tau[j] = t


def _gu_eisenstat_z(d, z, rho, origin, tau):
    """# ALGO: Gu-Eisenstat: z^_i^2 = prod_j (lam~_j - d_i) / (rho prod_{j != i} (d_j - d_i)), as a product of
    ratios in (0, 1]: (lam~_j - d_i)/(d_j - d_i) for j < i, (lam~_j - d_i)/(d_{j+1} - d_i) for i <= j < m-1,
    (lam~_m - d_i)/rho for the last root."""
    m = d.size
    zhat = np.empty(m)
    for i in range(m):
        prod = 1.0
        for j in range(m):
            num = -((d[i] - d[origin[j]]) - tau[j])
            if j == m - 1:
                den = rho
            elif j < i:
                den = d[j] - d[i]
            else:
                den = d[j + 1] - d[i]
            prod *= num / den
        zhat[i] = math.copysign(math.sqrt(prod), z[i])
    return zhat


def _column_scales(d, zhat, origin, tau):
    """a_j = 1 / || z^ / (d - lam~_j) ||: makes each Cauchy column a unit eigenvector."""
    m = d.size
    a = np.empty(m)
    for j in range(m):
        s = 0.0
        do = d[origin[j]]
        for i in range(m):
            v = zhat[i] / ((d[i] - do) - tau[j])
            s += v * v
        a[j] = 1.0 / math.sqrt(s)
    return a


secular_roots = numba.njit(**_JIT)(_secular_roots)
gu_eisenstat_z = numba.njit(**_JIT)(_gu_eisenstat_z)
column_scales = numba.njit(**_JIT)(_column_scales)


def warm_up() -> None:
    """Compile (or load from the cache) every loop above, so that no timed call pays for it."""
    d = np.array([0.5, 1.25, 2.0])
    z = np.array([0.3, -0.7, 0.6])
    origin, tau = np.empty(3, dtype=np.int64), np.empty(3)
    secular_roots(d, z * z, 1.5, 200, origin, tau)
    zhat = gu_eisenstat_z(d, z, 1.5, origin, tau)
    column_scales(d, zhat, origin, tau)
