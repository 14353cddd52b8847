"""Growth fits of hitting times with a cap: a run that hit the cap counts as T = cap (a lower bound)."""
from __future__ import annotations

import math

import numpy as np


def censored(hits: list[int], cap: int) -> tuple[list[float], list[bool]]:
    """Hitting times with -1 (no ε-NE by the cap) replaced by the cap; and which ones were capped."""
    return [float(cap if h < 0 else h) for h in hits], [h < 0 for h in hits]


def log_slope(xs: list[float], ts: list[float]) -> float:
    """Least-squares slope of log T against x. With capped values at the largest x (T = cap is a
    lower bound there), the slope is a lower bound on the slope of the true times: the LS slope
    increases with every y at an x above the mean x."""
    x = np.asarray(xs, dtype=float)
    y = np.log(np.asarray(ts, dtype=float))
    if len(x) < 2:
        return math.nan
    return float(np.polyfit(x, y, 1)[0])


def increments(ts: list[float]) -> list[float]:
    """Successive differences of log T (growth factor per unit size, in log)."""
    y = np.log(np.asarray(ts, dtype=float))
    return [float(v) for v in np.diff(y)]


def fmt_hit(h: int, cap: int) -> str:
    return f">= {cap}" if h < 0 else str(h)
