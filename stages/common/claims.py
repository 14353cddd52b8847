"""Claims as data: a name, the paper's statement, a kind, and a check over measured metrics.

Every claim has a **kind**: ``"finding"`` (a statement of the paper, tested) or ``"check"`` (sanity,
machinery, a control, a property of the data or format, a baseline's sanity). Scoreboards count
findings; checks are shown apart.

Every **threshold** a claim reads (min effect, band, tolerance, bound, reference level, a constant in
an expression) lives in ``params.yaml`` under ``papers.<slug>.report.claims.<claim name>`` — never in
code, never computed from the results. In code a threshold field is left unset (or names a measured
metric); ``bind`` fills it from params, and a number written in code is an error:

    # stages/<slug>/report.py
    Better("opus_beats_random", "OPUS reaches lower target loss than random", kind="finding",
           a="arms.opus.val_loss", b="arms.random.val_loss", higher_is_better=False)
    Within("matches_gft", "within a small R² band of the full GFT", kind="finding", a="r2.l2g", b="r2.gft")
    Bound("sublinear", "regret exponent below the bound", kind="finding", value="fit.regret_slope")
    Near("coverage", "coverage near nominal", kind="check", value="cov.single", ref="cov.nominal")
    Claim("overhead_small", "scoring costs a small fraction of a step", "overhead.flops <= param.max",
          kind="finding")
    # params.yaml: papers.<slug>.report.claims
    #   opus_beats_random: {min_effect: 0.01}      # nats; the smallest gain that matters
    #   matches_gft: {delta: 0.02}
    #   sublinear: {below: 0.9}
    #   coverage: {tol: 0.02}
    #   overhead_small: {max: 0.10}                # read in the expression as param.max
    #   "sciql_beats_cbc_*": {min_effect: 0.05}    # a glob pattern covers generated claim names

**The verdict rule** (``gap_verdict``; ``Within``/``Bound``/``Near`` use the same bounds). With per-seed
differences d (positive supports the claim), n seeds, se the standard error of mean(d) and L/U its
one-sided 95% t-bounds (t quantile with the design's degrees of freedom, n − 1 without item noise):
**holds** iff L > min_effect and the claim wins (d > 0; for a non-inferiority claim, min_effect < 0,
d > min_effect) on a strict majority of seeds; **fails** iff
U < min_effect (the reverse is supported, or the gain is surely below the smallest gain that
matters); **inconclusive** otherwise, and always with n < 3 or a non-finite value.

**Test-item noise.** A per-seed metric may be a list of per-item values (one list per seed: 0/1
correctness per test prompt, return per episode); the seed's value is their mean and its item-level
variance enters the verdict: se² = s²_seeds / n + mean_s(v_s), where v_s is the variance of seed s's
mean difference over items (paired per item when both arms list the same items: the paired test),
not divided by n because the same test items are shared by every seed (``items_shared=False`` when
each seed draws its own items: then mean_s(v_s) / n). For rates without per-item lists,
``n_items`` (a number or a metric) gives the binomial v_s = p(1 − p)/m per arm. Degrees of freedom
then follow Welch–Satterthwaite (item part with m − 1).

**Power.** Every seed-aware result carries ``detectable``: the smallest true gap the design detects
with 80% power at 5%, min_effect + (t₀.₉₅ + t₀.₈₀)·se (same df), so an inconclusive finding shows
whether more seeds would help.
"""
from __future__ import annotations

import ast
import dataclasses
import fnmatch
import math
import operator
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Literal, Mapping

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.Pow: operator.pow}
_CMPOPS = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
           ast.Eq: operator.eq, ast.NotEq: operator.ne}
_FUNCS = {"abs": abs, "min": min, "max": max}

KINDS = ("finding", "check")
Kind = Literal["finding", "check"]
MIN_SEEDS = 3
ALPHA = 0.05   # one-sided level of every t-bound
POWER = 0.80   # power of the `detectable` gap
PARAM_PREFIX = "param."  # a Claim expression reads its thresholds as param.<key>
ALLOWED_LITERALS = (0, 1)  # the only numbers an expression may write (everything else is a param)


class ClaimError(ValueError):
    """A claim is malformed, reads a metric that was not measured, or lacks its params."""


def t_quantile(p: float, df: float) -> float:
    """Student-t quantile (scipy); df may be fractional (Welch–Satterthwaite)."""
    from scipy.stats import t

    return float(t.ppf(p, df))


def _check_kind(claim) -> None:
    if claim.kind not in KINDS:
        raise ClaimError(f"claim {claim.name!r}: kind must be 'finding' or 'check' (got {claim.kind!r})")


class Param(float):
    """A threshold read from another params key (a field of the claim's own stage config), marked with
    where it lives: ``Bound(..., below=Param(cfg.ppl_budget, "evaluate.ppl_budget"))``. The result's
    ``params`` records the key. Prefer ``papers.<slug>.report.claims``; use this only where the stage
    that measures the quantity owns the number."""

    key: str

    def __new__(cls, value: float, key: str):
        obj = float.__new__(cls, value)
        obj.key = key
        return obj


def _no_number_in_code(claim, *fields: str) -> None:
    """Thresholds come from params (bind): a number written in code is an error naming where it goes."""
    if claim._bound:
        return
    for f in fields:
        value = getattr(claim, f)
        if isinstance(value, (int, float)) and not isinstance(value, (bool, Param)):
            raise ClaimError(f"claim {claim.name!r}: {f}={value!r} is a threshold written in code; declare it in "
                             f"params.yaml under papers.<slug>.report.claims.{claim.name}.{f}")


# --- the verdict rule -----------------------------------------------------------------------------
def seed_stats(diffs: list[float]) -> dict[str, float]:
    """Mean, standard error (sample sd / sqrt n) and win/loss fractions of per-seed differences."""
    n = len(diffs)
    mean = sum(diffs) / n
    var = sum((d - mean) ** 2 for d in diffs) / (n - 1) if n > 1 else math.inf
    return {"n": n, "mean": mean, "se": math.sqrt(var / n) if n > 1 else math.inf,
            "wins": sum(d > 0 for d in diffs) / n, "losses": sum(d < 0 for d in diffs) / n}


def t_bounds(diffs: list[float], within_var: list[float] | None = None, items_df: float | None = None,
             items_shared: bool = True) -> dict[str, float]:
    """seed_stats plus the total se (seeds + test items), its df and the one-sided 95% t-bounds."""
    st = seed_stats(diffs)
    n = st["n"]
    a = st["se"] ** 2                                       # between-seed part: s² / n
    b = 0.0
    if within_var:
        b = sum(within_var) / len(within_var)               # mean within-seed (item) variance
        if not items_shared:
            b /= n
    se = math.sqrt(a + b)
    df = float(n - 1)
    if b > 0 and items_df and a + b > 0:                    # Welch–Satterthwaite
        df = (a + b) ** 2 / (a ** 2 / (n - 1) + b ** 2 / items_df)
    t = t_quantile(1 - ALPHA, df)
    return {**st, "se_seeds": st["se"], "se_items": math.sqrt(b), "se": se, "df": df, "t": t,
            "lower": st["mean"] - t * se, "upper": st["mean"] + t * se}


def gap_verdict(diffs: list[float], min_effect: float = 0.0, *, within_var: list[float] | None = None,
                items_df: float | None = None, items_shared: bool = True) -> tuple[str, dict[str, float]]:
    """(verdict, stats). diffs > 0 support the claim. holds: lower t-bound > min_effect and d > 0 (d >
    min_effect when min_effect < 0: non-inferiority) on a strict majority of seeds; fails: upper t-bound < min_effect; else inconclusive (always with fewer
    than 3 seeds or a non-finite value). stats: n, mean (raw, min_effect not subtracted), se (total),
    se_seeds, se_items, df, t, lower, upper, min_effect, wins, losses, detectable."""
    if (not diffs or len(diffs) < MIN_SEEDS or any(not math.isfinite(d) for d in diffs)
            or not math.isfinite(min_effect) or any(not math.isfinite(v) for v in within_var or [])):
        return "inconclusive", {"n": len(diffs), "min_effect": min_effect}
    st = t_bounds(diffs, within_var, items_df, items_shared)
    st["min_effect"] = min_effect
    if min_effect < 0:   # non-inferiority ("at least b − margin"): a seed wins when it is within the margin
        st["wins"] = sum(d > min_effect for d in diffs) / len(diffs)
        st["losses"] = 1.0 - st["wins"]
    st["detectable"] = min_effect + (st["t"] + t_quantile(POWER, st["df"])) * st["se"]
    if st["lower"] > min_effect and st["wins"] > 0.5:
        return "holds", st
    if st["upper"] < min_effect:
        return "fails", st
    return "inconclusive", st


# --- per-seed operands, with optional per-item lists ----------------------------------------------
@dataclass
class _Operand:
    values: list[float]                 # one per seed
    item_var: list[float] | None = None  # variance of each seed's mean over its items
    items: list[list[float]] | None = None
    m: list[int] | None = None           # items per seed

    def shown(self) -> list[float]:
        return self.values


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _num_or_nan(v: Any) -> bool:
    """A measured value: a number, or None (a non-finite value written as JSON null) read as NaN."""
    return v is None or _is_num(v)


def _var(xs: list[float]) -> float:
    if len(xs) < 2:
        return math.inf
    mu = sum(xs) / len(xs)
    return sum((x - mu) ** 2 for x in xs) / (len(xs) - 1)


def _seed_operand(env: Mapping[str, Any], key: str, claim: str) -> _Operand:
    if key not in env:
        raise ClaimError(f"claim {claim!r}: metric {key!r} was not measured")
    value = env[key]
    if value is None:
        return _Operand([math.nan])
    if _is_num(value):
        return _Operand([float(value)])
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (list, tuple)) for v in value):
        if not all(v and all(_num_or_nan(x) for x in v) for v in value):
            raise ClaimError(f"claim {claim!r}: metric {key!r} is not a per-seed list of per-item numbers")
        items = [[math.nan if x is None else float(x) for x in v] for v in value]
        return _Operand([sum(v) / len(v) for v in items], [_var(v) / len(v) for v in items], items,
                        [len(v) for v in items])
    if not isinstance(value, (list, tuple)) or not all(_num_or_nan(v) for v in value):
        raise ClaimError(f"claim {claim!r}: metric {key!r} is not a per-seed list of numbers ({str(value)[:80]})")
    return _Operand([math.nan if v is None else float(v) for v in value])


def _seed_values(env: Mapping[str, Any], key: str, claim: str) -> list[float]:
    return _seed_operand(env, key, claim).values


def _operand(env: Mapping[str, Any], ref: float | str, n: int, claim: str) -> _Operand:
    """A per-seed operand, or a number / scalar metric broadcast to n seeds."""
    if _is_num(ref):
        return _Operand([float(ref)] * n)
    op = _seed_operand(env, ref, claim)
    if len(op.values) == 1 and op.items is None:
        return _Operand(op.values * n)
    if len(op.values) != n:
        raise ClaimError(f"claim {claim!r}: {ref!r} has {len(op.values)} seeds, expected {n} (paired)")
    return op


def _binomial(op: _Operand, m: float | None) -> _Operand:
    if m is None or op.items is not None:
        return op
    if not m >= 2:   # 0 or 1 items (or NaN): the item variance is undefined, as in _var -> inconclusive
        return dataclasses.replace(op, item_var=[math.inf] * len(op.values), m=[0] * len(op.values))
    var = [min(max(p, 0.0), 1.0) * (1 - min(max(p, 0.0), 1.0)) / m for p in op.values]
    return dataclasses.replace(op, item_var=var, m=[int(m)] * len(op.values))


def _diff_noise(a: _Operand, b: _Operand, paired: bool) -> tuple[list[float] | None, float | None]:
    """Within-seed variance of (a − b) per seed, and the item df, from whichever side has items."""
    if a.item_var is None and b.item_var is None:
        return None, None
    n = len(a.values)
    if (paired and a.items is not None and b.items is not None
            and all(len(x) == len(y) for x, y in zip(a.items, b.items))):
        var = [_var([x - y for x, y in zip(xa, xb)]) / len(xa) for xa, xb in zip(a.items, b.items)]  # paired
        return var, float(min(a.m) - 1)
    va = a.item_var or [0.0] * n
    vb = b.item_var or [0.0] * n
    ms = [m for op in (a, b) if op.m for m in op.m]
    return [x + y for x, y in zip(va, vb)], float(min(ms) - 1)


def paired_item_gap(a: list[list[float]], b: list[list[float]]) -> dict[str, float]:
    """t_bounds of the per-seed gap a − b of paired per-item lists (seeds × items), exactly as ``Better`` computes
    it (seeds and items in the variance, Welch–Satterthwaite df): for tables that show a gap without a verdict."""
    oa, ob = _seed_operand({"a": a}, "a", "paired_item_gap"), _seed_operand({"b": b}, "b", "paired_item_gap")
    if len(oa.values) != len(ob.values):
        raise ClaimError(f"paired_item_gap: {len(oa.values)} seeds against {len(ob.values)}")
    var, df = _diff_noise(oa, ob, paired=True)
    return t_bounds([x - y for x, y in zip(oa.values, ob.values)], var, df)


def _named(values: dict[str, Any], ref: float | str, resolved: _Operand) -> dict[str, Any]:
    """values plus the reference operand when it is a metric (a constant is already in `check`)."""
    return {**values, ref: resolved.values} if isinstance(ref, str) else values


def _result(claim, verdict: str, values: dict[str, Any], stats: dict[str, float], check: str) -> dict[str, Any]:
    return {"name": claim.name, "statement": claim.statement, "kind": claim.kind, "check": check,
            "holds": verdict == "holds", "verdict": verdict, "values": values,
            "stats": {k: float(v) for k, v in stats.items()}, "params": claim.params_used(),
            "refuted_by": claim.refuted_by, "wallclock": claim.wallclock}


def _m(env: Mapping[str, Any], n_items: float | str | None, claim: str) -> float | None:
    """The item count of a binomial rate: the smallest over seeds (a NaN count counts as the smallest)."""
    if n_items is None or _is_num(n_items):
        return n_items
    return min(_seed_values(env, n_items, claim), key=lambda c: c if c == c else -math.inf)


class _Base:
    PARAMS: tuple[str, ...] = ()        # threshold fields bind() may fill from params
    REQUIRED: tuple[str, ...] = ()      # ... of which these must be there

    def params_used(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in self.PARAMS:
            v = getattr(self, f, None)
            if _is_num(v):
                out[f] = float(v)
                if isinstance(v, Param):
                    out[f + "_from"] = v.key
        return out


@dataclass(frozen=True)
class Better(_Base):
    """A beats B per seed by more than min_effect: a − b (higher_is_better) or b − a (lower is better)."""
    name: str
    statement: str
    _: KW_ONLY
    kind: Kind
    a: str
    b: float | str | None = None
    higher_is_better: bool = True
    min_effect: float | None = None
    refuted_by: str = ""
    wallclock: bool = False
    n_items: float | str | None = None   # binomial item noise for rates without per-item lists
    paired_items: bool = True
    items_shared: bool = True
    _bound: bool = field(default=False, repr=False, compare=False)
    PARAMS = ("b", "min_effect")
    REQUIRED = ("min_effect",)

    def __post_init__(self):
        _check_kind(self)
        _no_number_in_code(self, "b", "min_effect")

    def evaluate(self, env: Mapping[str, Any]) -> dict[str, Any]:
        if self.b is None or self.min_effect is None:
            raise ClaimError(f"claim {self.name!r}: needs b and min_effect (min_effect from params)")
        m = _m(env, self.n_items, self.name)
        a = _binomial(_seed_operand(env, self.a, self.name), m)
        b = _binomial(_operand(env, self.b, len(a.values), self.name), m if isinstance(self.b, str) else None)
        sign = 1.0 if self.higher_is_better else -1.0
        diffs = [sign * (x - y) for x, y in zip(a.values, b.values)]  # > 0 supports the claim
        var, df = _diff_noise(a, b, self.paired_items)
        verdict, st = gap_verdict(diffs, float(self.min_effect), within_var=var, items_df=df,
                                  items_shared=self.items_shared)
        op = ">" if self.higher_is_better else "<"
        check = f"{self.a} {op} {self.b} by more than {self.min_effect:g} (per seed, t-bound)"
        return _result(self, verdict, _named({self.a: a.values}, self.b, b), st, check)


@dataclass(frozen=True)
class Within(_Base):
    """|a − b| < delta: holds when both one-sided 95% t-bounds of the mean gap lie inside (−delta, delta)
    (two one-sided tests) and most seeds are inside; fails when a t-bound lies wholly outside."""
    name: str
    statement: str
    _: KW_ONLY
    kind: Kind
    a: str
    b: float | str | None = None
    delta: float | None = None
    refuted_by: str = ""
    wallclock: bool = False
    n_items: float | str | None = None
    paired_items: bool = True
    items_shared: bool = True
    _bound: bool = field(default=False, repr=False, compare=False)
    PARAMS = ("b", "delta")
    REQUIRED = ("delta",)

    def __post_init__(self):
        _check_kind(self)
        _no_number_in_code(self, "b", "delta")

    def _check_text(self) -> str:
        return f"|{self.a} - {self.b}| < {self.delta:g} (per seed, t-bounds)"

    def evaluate(self, env: Mapping[str, Any]) -> dict[str, Any]:
        if self.b is None or self.delta is None:
            raise ClaimError(f"claim {self.name!r}: needs b and delta (delta from params)")
        m = _m(env, self.n_items, self.name)
        a = _binomial(_seed_operand(env, self.a, self.name), m)
        b = _binomial(_operand(env, self.b, len(a.values), self.name), m if isinstance(self.b, str) else None)
        gaps = [x - y for x, y in zip(a.values, b.values)]
        values = _named({self.a: a.values}, self.b, b)
        var, df = _diff_noise(a, b, self.paired_items)
        delta = float(self.delta)
        if (len(gaps) < MIN_SEEDS or any(not math.isfinite(g) for g in gaps) or not math.isfinite(delta)
                or any(not math.isfinite(v) for v in var or [])):
            return _result(self, "inconclusive", values, {"n": len(gaps), "delta": delta}, self._check_text())
        st = t_bounds(gaps, var, df, self.items_shared)
        st["delta"] = delta
        inside = sum(abs(g) < delta for g in gaps) / len(gaps)
        # power: the band half-width the design could confirm with 80% power at a true gap of 0
        st["detectable"] = (st["t"] + t_quantile(0.5 + POWER / 2, st["df"])) * st["se"]
        if -delta < st["lower"] and st["upper"] < delta and inside > 0.5:
            verdict = "holds"
        elif st["lower"] > delta or st["upper"] < -delta:
            verdict = "fails"
        else:
            verdict = "inconclusive"
        return _result(self, verdict, values, {**st, "inside": inside}, self._check_text())


@dataclass(frozen=True)
class Bound(_Base):
    """A per-seed quantity (slope, exponent, rate) is below or above a bound (exactly one of the two:
    a number from params, or the name of a measured metric)."""
    name: str
    statement: str
    _: KW_ONLY
    kind: Kind
    value: str
    below: float | str | None = None
    above: float | str | None = None
    refuted_by: str = ""
    wallclock: bool = False
    n_items: float | str | None = None
    items_shared: bool = True
    _bound: bool = field(default=False, repr=False, compare=False)
    PARAMS = ("below", "above")
    REQUIRED = ()

    def __post_init__(self):
        _check_kind(self)
        _no_number_in_code(self, "below", "above")

    def evaluate(self, env: Mapping[str, Any]) -> dict[str, Any]:
        if (self.below is None) == (self.above is None):
            raise ClaimError(f"claim {self.name!r}: Bound needs exactly one of below= / above= (a metric, "
                             "or a number in params)")
        v = _binomial(_seed_operand(env, self.value, self.name), _m(env, self.n_items, self.name))
        ref = self.below if self.below is not None else self.above
        r = _operand(env, ref, len(v.values), self.name)
        if self.below is not None:
            diffs = [y - x for x, y in zip(v.values, r.values)]
        else:
            diffs = [x - y for x, y in zip(v.values, r.values)]
        var, df = _diff_noise(v, r, paired=True)
        verdict, st = gap_verdict(diffs, 0.0, within_var=var, items_df=df, items_shared=self.items_shared)
        check = f"{self.value} {'<' if self.below is not None else '>'} {ref} (per seed, t-bound)"
        return _result(self, verdict, _named({self.value: v.values}, ref, r), st, check)


@dataclass(frozen=True)
class Near(_Base):
    """A per-seed rate is within tol of a reference value (Within against a number or metric)."""
    name: str
    statement: str
    _: KW_ONLY
    kind: Kind
    value: str
    ref: float | str | None = None
    tol: float | None = None
    refuted_by: str = ""
    wallclock: bool = False
    n_items: float | str | None = None
    items_shared: bool = True
    _bound: bool = field(default=False, repr=False, compare=False)
    PARAMS = ("ref", "tol")
    REQUIRED = ("tol",)

    def __post_init__(self):
        _check_kind(self)
        _no_number_in_code(self, "ref", "tol")

    def evaluate(self, env: Mapping[str, Any]) -> dict[str, Any]:
        if self.ref is None or self.tol is None:
            raise ClaimError(f"claim {self.name!r}: needs ref and tol (tol from params)")
        inner = Within(self.name, self.statement, kind=self.kind, a=self.value, b=self.ref, delta=self.tol,
                       refuted_by=self.refuted_by, wallclock=self.wallclock, n_items=self.n_items,
                       items_shared=self.items_shared, _bound=True)
        out = inner.evaluate(env)
        out["check"] = f"{self.value} within {self.tol:g} of {self.ref} (per seed, t-bounds)"
        out["params"] = self.params_used()
        return out


@dataclass(frozen=True)
class Claim(_Base):
    """A deterministic check expression (not seed-aware): holds / fails, inconclusive when a value it
    reads is not finite. Thresholds are read as ``param.<key>``; the only literals allowed are 0 and 1."""
    name: str
    statement: str
    check: str
    _: KW_ONLY
    kind: Kind
    refuted_by: str = ""
    wallclock: bool = False
    thresholds: Mapping[str, Any] = field(default_factory=dict)
    _bound: bool = field(default=False, repr=False, compare=False)

    def __post_init__(self):
        _check_kind(self)
        for k, v in self.thresholds.items():
            if not self._bound and not isinstance(v, Param):
                raise ClaimError(f"claim {self.name!r}: threshold {k}={v!r} is written in code; declare it in "
                                 f"params.yaml under papers.<slug>.report.claims.{self.name}.{k} (or pass a Param)")
        tree = _parse(self.check, self.name)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and _is_num(node.value)
                    and node.value not in ALLOWED_LITERALS):
                raise ClaimError(f"claim {self.name!r}: the number {node.value!r} in its check is a threshold "
                                 f"written in code; name it param.<key> and declare it in params.yaml under "
                                 f"papers.<slug>.report.claims.{self.name}.<key>")

    @property
    def PARAMS(self) -> tuple[str, ...]:  # noqa: N802 (same interface as the shapes' class constant)
        return tuple(n[len(PARAM_PREFIX):] for n in self.names() if n.startswith(PARAM_PREFIX))

    @property
    def REQUIRED(self) -> tuple[str, ...]:  # noqa: N802
        return self.PARAMS

    def params_used(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in self.thresholds.items():
            out[k] = float(v)
            if isinstance(v, Param):
                out[k + "_from"] = v.key
        return out

    def names(self) -> list[str]:
        return _dotted_names(_parse(self.check, self.name))

    def evaluate(self, env: Mapping[str, Any]) -> dict[str, Any]:
        env = {**env, **{PARAM_PREFIX + k: v for k, v in self.thresholds.items()}}
        tree = _parse(self.check, self.name)
        holds = bool(_eval(tree, env, self.name))
        values = {}
        finite = True
        for key in _dotted_names(tree):
            if key.startswith(PARAM_PREFIX):
                continue
            value = math.nan if env[key] is None else env[key]
            values[key] = float(value) if not isinstance(value, bool) else value
            if isinstance(values[key], float) and not math.isfinite(values[key]):
                finite = False
        verdict = ("holds" if holds else "fails") if finite else "inconclusive"
        return {"name": self.name, "statement": self.statement, "kind": self.kind, "check": self.check,
                "holds": verdict == "holds", "verdict": verdict, "values": values,
                "params": self.params_used(), "refuted_by": self.refuted_by, "wallclock": self.wallclock}


@dataclass(frozen=True)
class Estimate(_Base):
    """One estimate that carries its own standard error and degrees of freedom (a regression slope or a
    fitted exponent, whose se comes from the fit's residuals) is below or above a bound (exactly one of
    the two: a number from params, or a measured metric). ``value``, ``se`` and ``df`` name scalar
    metrics; ``points`` optionally names how many points the fit used (shown in the report).
    Same rule as the seed-aware shapes, with the estimate's own t-bounds (t quantile with ``df``):
    holds iff its one-sided 95% t-bound lies on the claimed side of the bound; fails iff the opposite
    t-bound lies on the wrong side; inconclusive otherwise, and with df < 1 or a non-finite value."""
    name: str
    statement: str
    _: KW_ONLY
    kind: Kind
    value: str
    se: str
    df: str
    points: str | None = None
    below: float | str | None = None
    above: float | str | None = None
    refuted_by: str = ""
    wallclock: bool = False
    _bound: bool = field(default=False, repr=False, compare=False)
    PARAMS = ("below", "above")
    REQUIRED = ()

    def __post_init__(self):
        _check_kind(self)
        _no_number_in_code(self, "below", "above")

    def _scalar(self, env: Mapping[str, Any], key: str) -> float:
        if key not in env:
            raise ClaimError(f"claim {self.name!r}: metric {key!r} was not measured")
        v = env[key]
        if not _is_num(v):
            raise ClaimError(f"claim {self.name!r}: metric {key!r} is not a number ({v!r:.80})")
        return float(v)

    def evaluate(self, env: Mapping[str, Any]) -> dict[str, Any]:
        if (self.below is None) == (self.above is None):
            raise ClaimError(f"claim {self.name!r}: Estimate needs exactly one of below= / above= (a metric, "
                             "or a number in params)")
        est, se, df = (self._scalar(env, k) for k in (self.value, self.se, self.df))
        ref = self.below if self.below is not None else self.above
        bound = self._scalar(env, ref) if isinstance(ref, str) else float(ref)
        values: dict[str, Any] = {self.value: est, self.se: se, self.df: df}
        if isinstance(ref, str):
            values[ref] = bound
        op = "<" if self.below is not None else ">"
        check = f"{self.value} {op} {ref} (one-sided 95% t-bound, se {self.se}, df {self.df})"
        gap = bound - est if self.below is not None else est - bound       # > 0 supports the claim
        if not all(math.isfinite(v) for v in (est, se, df, bound)) or df < 1 or se < 0:
            return _result(self, "inconclusive", values, {"n": 0.0}, check)
        t = t_quantile(1 - ALPHA, df)
        st = {"mean": gap, "se": se, "df": df, "t": t, "lower": gap - t * se, "upper": gap + t * se,
              "min_effect": 0.0, "detectable": (t + t_quantile(POWER, df)) * se,
              "n": float(self._scalar(env, self.points)) if self.points else df + 2.0}
        verdict = "holds" if st["lower"] > 0 else ("fails" if st["upper"] < 0 else "inconclusive")
        return _result(self, verdict, values, st, check)


AnyClaim = Claim | Better | Within | Bound | Near | Estimate
Thresholds = Mapping[str, Mapping[str, Any]]


def _thresholds_for(name: str, thresholds: Thresholds, where: str) -> tuple[str | None, Mapping[str, Any]]:
    if name in thresholds:
        return name, thresholds[name]
    hits = [k for k in thresholds if any(ch in k for ch in "*?[") and fnmatch.fnmatchcase(name, k)]
    if len(hits) > 1:
        raise ClaimError(f"{where}.claims: claim {name!r} matches several patterns ({', '.join(hits)})")
    return (hits[0], thresholds[hits[0]]) if hits else (None, {})


def bind(claims: list[AnyClaim], thresholds: Thresholds | None, where: str = "papers.<slug>.report",
         strict_unused: bool = False) -> list[AnyClaim]:
    """Claims with their thresholds filled from params (``papers.<slug>.report.claims``). Errors name the
    claim and key: a required threshold missing, a key the claim does not read, a non-number, both
    below= and above= for a Bound. strict_unused: also refuse params entries that match no claim."""
    thresholds = thresholds or {}
    if not isinstance(thresholds, Mapping):
        raise ClaimError(f"{where}.claims: expected a mapping of claim name -> thresholds")
    names = [c.name for c in claims]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ClaimError(f"claim {dup[0]!r}: declared twice")
    used: set[str] = set()
    out: list[AnyClaim] = []
    for c in claims:
        key, given = _thresholds_for(c.name, thresholds, where)
        if key is not None:
            used.add(key)
        if not isinstance(given, Mapping):
            raise ClaimError(f"{where}.claims.{key}: expected a mapping of threshold -> number")
        allowed = set(c.PARAMS)
        for k, v in given.items():
            if k not in allowed:
                raise ClaimError(f"{where}.claims.{key}.{k}: claim {c.name!r} reads no threshold {k!r} "
                                 f"(it reads: {', '.join(sorted(allowed)) or 'none'})")
            if not _is_num(v) or not math.isfinite(float(v)):
                raise ClaimError(f"{where}.claims.{key}.{k}: must be a finite number (got {v!r})")
            if isinstance(getattr(c, k, None), str):
                raise ClaimError(f"{where}.claims.{key}.{k}: claim {c.name!r} already compares against the "
                                 f"metric {getattr(c, k)!r}")
        have = c.thresholds if isinstance(c, Claim) else {}
        missing = [r for r in c.REQUIRED if r not in given and r not in have and getattr(c, r, None) is None]
        if missing:
            raise ClaimError(f"{where}.claims.{c.name}.{missing[0]}: missing (claim {c.name!r} reads this "
                             "threshold; fix it in params.yaml before the run)")
        if isinstance(c, Claim):
            out.append(dataclasses.replace(c, thresholds={**c.thresholds, **{k: float(v) for k, v in given.items()}},
                                           _bound=True))
        else:
            if isinstance(c, Bound) and (("below" in given or c.below is not None)
                                         and ("above" in given or c.above is not None)):
                raise ClaimError(f"{where}.claims.{c.name}: a Bound takes below or above, not both")
            out.append(dataclasses.replace(c, **{k: float(v) for k, v in given.items()}, _bound=True))
    if strict_unused:
        extra = [k for k in thresholds if k not in used]
        if extra:
            raise ClaimError(f"{where}.claims.{extra[0]}: no claim of this paper is named (or matches) "
                             f"{extra[0]!r}")
    return out


def findings_summary(verdicts: list[Mapping[str, Any]]) -> dict[str, int]:
    """Counts per kind and verdict: findings_holds/_fails/_inconclusive, checks_pass/_total."""
    find = [v["verdict"] for v in verdicts if v.get("kind", "finding") == "finding"]
    chk = [v["verdict"] for v in verdicts if v.get("kind") == "check"]
    return {"findings": len(find), "findings_holds": find.count("holds"), "findings_fails": find.count("fails"),
            "findings_inconclusive": find.count("inconclusive"), "checks": len(chk),
            "checks_pass": chk.count("holds")}


def findings_line(verdicts: list[Mapping[str, Any]]) -> str:
    """'findings: 3 hold, 1 fails, 2 inconclusive; checks: 5/5 pass'."""
    s = findings_summary(verdicts)
    return (f"findings: {s['findings_holds']} hold, {s['findings_fails']} fail"
            f"{'s' if s['findings_fails'] == 1 else ''}, {s['findings_inconclusive']} inconclusive; "
            f"checks: {s['checks_pass']}/{s['checks']} pass")


def flatten(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists are left as values."""
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        full = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, full + "."))
        else:
            out[full] = value
    return out


def _parse(expr: str, name: str) -> ast.Expression:
    try:
        return ast.parse(expr, mode="eval")
    except SyntaxError as err:
        raise ClaimError(f"claim {name!r}: check is not a valid expression ({err.msg})") from None


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _dotted_names(tree: ast.AST) -> list[str]:
    names: list[str] = []

    def visit(node: ast.AST) -> None:
        dotted = _dotted(node)
        if dotted is not None and dotted not in _FUNCS:
            if dotted not in names:
                names.append(dotted)
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return names


def _eval(node: ast.AST, env: Mapping[str, Any], name: str) -> Any:
    if isinstance(node, ast.Expression):
        return _eval(node.body, env, name)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, bool)):
        return node.value
    dotted = _dotted(node)
    if dotted is not None:
        if dotted not in env:
            raise ClaimError(f"claim {name!r}: metric {dotted!r} was not measured")
        value = math.nan if env[dotted] is None else env[dotted]  # JSON null: a non-finite measurement
        if not isinstance(value, (int, float, bool)):
            raise ClaimError(f"claim {name!r}: metric {dotted!r} is not a number ({value!r})")
        return value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](_eval(node.left, env, name), _eval(node.right, env, name))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Not)):
        value = _eval(node.operand, env, name)
        return -value if isinstance(node.op, ast.USub) else not value
    if isinstance(node, ast.BoolOp):
        values = [bool(_eval(v, env, name)) for v in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env, name)
        for op, comp in zip(node.ops, node.comparators):
            if type(op) not in _CMPOPS:
                break
            right = _eval(comp, env, name)
            if not _CMPOPS[type(op)](left, right):
                return False
            left = right
        else:
            return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS:
        return _FUNCS[node.func.id](*[_eval(a, env, name) for a in node.args])
    raise ClaimError(f"claim {name!r}: unsupported expression {ast.unparse(node)!r}")


def evaluate_claims(claims: list[AnyClaim], metrics: Mapping[str, Any], thresholds: Thresholds | None = None,
                    where: str = "papers.<slug>.report") -> list[dict[str, Any]]:
    """Verdicts in the metrics.json schema: name, statement, kind, check, holds, verdict, values
    (per-seed lists for the seed-aware shapes, with their stats), params (the thresholds read),
    refuted_by, wallclock. ``thresholds`` (papers.<slug>.report.claims) is bound first."""
    env = flatten(metrics)
    bound = bind(claims, thresholds, where)
    return [claim.evaluate(env) for claim in bound]
