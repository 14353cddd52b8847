"""The SCM specification format (public interface) and its compilation into exact bandit worlds.

An SCM file is one JSON object describing the *standard fairness model* (Plecko & Bareinboim):
a binary-valued protected attribute A, a binary confounder Z (child of A, the code's "w"), a
binary mediator W (child of A and Z, the code's "m"), and a decision D chosen by the learner from a
fixed set of arms, with a Bernoulli outcome Y ~ Bernoulli(σ(θ*ᵀ f([a, z, w, d]))).

Format ``fair_bandits.scm/v1`` (every key; defaults in brackets; anything else is an error):

    format                  "fair_bandits.scm/v1"                               (required)
    name                    short identifier, [A-Za-z0-9_.-]+                    (required)
    description             free text                                            [""]
    variables               {name: role} with exactly the four roles "protected", "confounder",
                            "mediator", "decision", one variable each            (required)
    protected_values        [a0, a1]: the two numeric values A takes, distinct, used as the first
                            feature coordinate                                   [[-1, 1]]
    p_protected             [P(A=a0), P(A=a1)], each in (0, 1], summing to 1. Every effect is
                            conditional on A (P(z|a) = P(a,z)/P(a)): a protected value with zero
                            mass makes that ratio undefined and is rejected.    [[0.5, 0.5]]
    p_confounder            [P(Z=1|A=a0), P(Z=1|A=a1)], each in [0, 1]          (required)
    p_mediator              [[P(W=1|a0,Z=0), P(W=1|a0,Z=1)], [P(W=1|a1,Z=0), P(W=1|a1,Z=1)]],
                            each in [0, 1]                                       (required)
    arms                    list of K >= 2 arm feature vectors d (each a list of m >= 1 finite
                            numbers, all the same length, pairwise distinct)    (required)
    theta_star              the true reward parameter, length 3 + m, ‖θ*‖ <= norm_bound (required)
    norm_bound              S > 0, the known bound on ‖θ‖ (the estimator projects onto it) [1.0]
    feature_map             "normalize": f(v) = v/‖v‖ (the official code), or "identity"
                            ["normalize"]; under "normalize" no feature vector may be zero.
    tau                     fairness threshold τ >= 0: an arm is fair in a round iff
                            |DE|, |IE| and |SE| are all < τ (strict, as the official code) [0.157]
    counterfactual_feature  how the counterfactual feature's protected coordinate is formed:
                            "other" (the other protected value, a' = the value ≠ a) or
                            "one_minus_a" (1 − a, the official code's quirk: its probabilities use
                            −a but its features 1 − a)                           ["other"]
    context_sampling        "balanced_blocks": contexts (a, z, w) in shuffled blocks covering all 8
                            combinations (the official code), or "scm": i.i.d. from
                            P(a) P(z|a) P(w|a,z)                                 ["balanced_blocks"]
    resample_infeasible     true: a context none of whose arms is truly fair is redrawn (the
                            official code's rejection loop). When no context has a fair arm
                            (e.g. τ = 0) nothing can be redrawn: contexts are kept and the
                            comparator becomes the least-unfair arm (see below) [true]
    effect_cells            "all": the effects sum over the four (z, w) cells (the definitions
                            below); "official_quirk": only the (z = 0, w = 0) cell, exactly what
                            the official code computes (its cell match compares NORMALISED
                            features with the raw 0/1 values, so only z = w = 0 ever matches; in
                            bandit.py _true_effects, OFU_MLogB.select_arm and simulation.py)
                            ["all"]
    tau_mode                "value": τ is `tau`, an arm is fair iff every |effect| < τ (strict, as
                            the official code). "boundary" (no Slater point): `tau` is ignored,
                            τ := the least-unfair arm's max|effect| at protected value
                            `boundary_protected`, and an arm is fair iff every |effect| <= τ, so
                            that context has a fair arm but none strictly inside ["value"]
    boundary_protected      0 or 1: the protected-value index of "boundary" mode  [0]

Effects (official code, x0 = factual a, x1 = counterfactual a'; μ(a,z,w,d) = σ(θᵀ f([a,z,w,d])),
probabilities always use the other protected value a* for the counterfactual):

    DE(a, d) = Σ_{z,w} [μ(a',z,w,d) − μ(a,z,w,d)] P(w|a,z) P(z|a)                 # ALGO: Ctf-DE
    IE(a, d) = Σ_{z,w} μ(a',z,w,d) [P(w|a,z) − P(w|a*,z)] P(z|a)                  # ALGO: Ctf-IE
    SE(a, d) = Σ_{z,w} μ(a',z,w,d) P(w|a*,z) [P(z|a) − P(z|a*)]                   # ALGO: Ctf-SE

a' = a* under "other"; a' = 1 − a under "one_minus_a". Under effect_cells "official_quirk" each sum
keeps only its (z, w) = (0, 0) term. The effects depend on the round's context only through a. Comparator of a round: its best truly fair arm; if it has none, the arm with the
smallest max|effect| (ties: higher reward).

    scm = load_scm("stages/fair_bandits/examples/official.json")      # SCMError on bad input
    world = compile_world(scm, device)                                  # exact tensors
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from stages.common.paths import json_text_depth

FORMAT = "fair_bandits.scm/v1"
ROLES = ("protected", "confounder", "mediator", "decision")
EFFECTS = ("DE", "IE", "SE")
EXAMPLES = Path(__file__).resolve().parent / "examples"
MAX_ARMS = 256
MAX_ARM_DIM = 64
MAX_ABS = 1e6          # bound on |arm entries| and |protected values|: features stay finite under "normalize"
MAX_FILE_BYTES = 1_000_000   # an SCM is a few hundred bytes; refuse anything larger before reading it
MAX_DEPTH = 8          # JSON nesting of a valid SCM is 3; refuse deeper nesting before parsing


class SCMError(ValueError):
    """A malformed SCM file; the message is one line naming the file and field."""




class SCM(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)

    format: Literal["fair_bandits.scm/v1"]
    name: str = Field(min_length=1, max_length=100)
    description: str = ""
    variables: dict[str, Literal["protected", "confounder", "mediator", "decision"]]
    protected_values: list[float] = Field(default=[-1.0, 1.0], min_length=2, max_length=2)
    p_protected: list[float] = Field(default=[0.5, 0.5], min_length=2, max_length=2)
    p_confounder: list[float] = Field(min_length=2, max_length=2)
    p_mediator: list[list[float]] = Field(min_length=2, max_length=2)
    arms: list[list[float]] = Field(min_length=2, max_length=MAX_ARMS)
    theta_star: list[float] = Field(min_length=4)
    norm_bound: float = Field(1.0, gt=0, le=1e3)
    feature_map: Literal["normalize", "identity"] = "normalize"
    tau: float = Field(0.157, ge=0.0, le=10.0)
    counterfactual_feature: Literal["other", "one_minus_a"] = "other"
    context_sampling: Literal["balanced_blocks", "scm"] = "balanced_blocks"
    resample_infeasible: bool = True
    effect_cells: Literal["all", "official_quirk"] = "all"
    tau_mode: Literal["value", "boundary"] = "value"
    boundary_protected: int = Field(0, ge=0, le=1)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", v):
            raise ValueError(f"must match [A-Za-z0-9_.-]+ (got {v!r})")
        return v

    @field_validator("variables")
    @classmethod
    def _roles(cls, v: dict[str, str]) -> dict[str, str]:
        roles = sorted(v.values())
        if roles != sorted(ROLES):
            raise ValueError("the standard fairness model needs exactly one variable per role "
                             f"{', '.join(ROLES)} (got roles {roles})")
        return v

    @field_validator("p_protected")
    @classmethod
    def _p_protected(cls, v: list[float]) -> list[float]:
        for i, p in enumerate(v):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"entry {i} = {p} is not a probability in [0, 1]")
            if p == 0.0:
                raise ValueError(f"entry {i} is 0: P(z|a) = P(a,z)/P(a) is a ratio over a protected value "
                                 "with zero mass (undefined); give every protected value positive mass")
        if abs(sum(v) - 1.0) > 1e-9:
            raise ValueError(f"must sum to 1 (got {sum(v)})")
        return v

    @field_validator("p_confounder")
    @classmethod
    def _p_conf(cls, v: list[float]) -> list[float]:
        for i, p in enumerate(v):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"entry {i} = {p} is not a probability in [0, 1]")
        return v

    @field_validator("p_mediator")
    @classmethod
    def _p_med(cls, v: list[list[float]]) -> list[list[float]]:
        for i, row in enumerate(v):
            if len(row) != 2:
                raise ValueError(f"row {i}: expected [P(W=1|a,Z=0), P(W=1|a,Z=1)] (2 entries, got {len(row)})")
            for j, p in enumerate(row):
                if not 0.0 <= p <= 1.0:
                    raise ValueError(f"[{i}][{j}] = {p} is not a probability in [0, 1]")
        return v

    @field_validator("protected_values")
    @classmethod
    def _bounded_a(cls, v: list[float]) -> list[float]:
        for i, x in enumerate(v):
            if abs(x) > MAX_ABS:
                raise ValueError(f"entry {i} = {x:g} exceeds {MAX_ABS:g} in magnitude (features must stay finite)")
        return v

    @field_validator("arms")
    @classmethod
    def _bounded_arms(cls, v: list[list[float]]) -> list[list[float]]:
        for i, arm in enumerate(v):
            for j, x in enumerate(arm):
                if abs(x) > MAX_ABS:
                    raise ValueError(f"[{i}][{j}] = {x:g} exceeds {MAX_ABS:g} in magnitude (‖v‖ would overflow "
                                     "or swamp the context under 'normalize'; rescale the arms)")
        return v

    @model_validator(mode="after")
    def _shapes(self):
        a0, a1 = self.protected_values
        if a0 == a1:
            raise ValueError(f"protected_values: the two values must differ (got {self.protected_values})")
        m = len(self.arms[0])
        if m < 1 or m > MAX_ARM_DIM:
            raise ValueError(f"arms: each arm needs 1..{MAX_ARM_DIM} features (got {m})")
        for i, arm in enumerate(self.arms):
            if len(arm) != m:
                raise ValueError(f"arms[{i}]: has {len(arm)} features, arms[0] has {m}; all arms need the same length")
        seen = {}
        for i, arm in enumerate(self.arms):
            if tuple(arm) in seen:
                raise ValueError(f"arms[{i}]: duplicates arms[{seen[tuple(arm)]}]")
            seen[tuple(arm)] = i
        if len(self.theta_star) != 3 + m:
            raise ValueError(f"theta_star: needs 3 + {m} = {3 + m} entries (for [a, z, w, d]), got {len(self.theta_star)}")
        norm = math.sqrt(sum(t * t for t in self.theta_star))
        if norm > self.norm_bound + 1e-9:
            raise ValueError(f"theta_star: norm {norm:.4g} exceeds norm_bound {self.norm_bound}")
        if self.feature_map == "normalize":
            cf = [1.0 - a0, 1.0 - a1] if self.counterfactual_feature == "one_minus_a" else []
            for a in [a0, a1, *cf]:
                for i, arm in enumerate(self.arms):
                    if a == 0.0 and all(x == 0.0 for x in arm):
                        raise ValueError(f"arms[{i}]: the feature [a={a}, z=0, w=0, d] is the zero vector, "
                                         "which feature_map 'normalize' cannot scale")
        return self


def _one_line(err: ValidationError) -> str:
    item = err.errors()[0]
    key = ".".join(str(p) for p in item["loc"])
    msg = item["msg"].removeprefix("Value error, ")
    if item["type"] == "extra_forbidden":
        msg = "unknown key (see stages/fair_bandits/scm.py for the format)"
    elif item["type"] == "missing":
        msg = "required key is missing"
    elif item["type"] == "finite_number":
        msg = "must be a finite number"
    elif item["type"] == "literal_error":
        msg = msg.replace("Input should be", "must be")
    return f"{key}: {msg}" if key else msg


def parse_scm(data: object, where: str = "SCM") -> SCM:
    """Validate a decoded JSON object; SCMError names `where` and the field."""
    if not isinstance(data, dict):
        raise SCMError(f"{where}: expected a JSON object (the fair_bandits.scm/v1 format)")
    if data.get("format") != FORMAT:
        raise SCMError(f"{where}: format: must be {FORMAT!r} (got {data.get('format')!r})")
    # ints are numbers in JSON: accept them for float fields without relaxing other checks
    data = _ints_to_floats(data, skip=("format", "name", "description", "variables", "feature_map",
                                       "counterfactual_feature", "context_sampling", "resample_infeasible",
                                       "effect_cells", "tau_mode", "boundary_protected"))
    try:
        return SCM.model_validate(data)
    except ValidationError as err:
        raise SCMError(f"{where}: {_one_line(err)}") from None


def _ints_to_floats(data: dict, skip: tuple[str, ...]) -> dict:
    def conv(v):
        if isinstance(v, bool):
            return v
        if isinstance(v, int):
            return float(v)
        if isinstance(v, list):
            return [conv(x) for x in v]
        return v

    return {k: (v if k in skip else conv(v)) for k, v in data.items()}


def load_scm(path: str | Path) -> SCM:
    path = Path(path)
    if not path.exists():
        raise SCMError(f"{path}: SCM file not found")
    if path.is_dir():
        raise SCMError(f"{path}: is a directory, expected an SCM JSON file")
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise SCMError(f"{path}: {size} bytes exceeds the {MAX_FILE_BYTES}-byte limit of an SCM file")
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise SCMError(f"{path}: not UTF-8 text") from None
    depth = json_text_depth(text)
    if depth > MAX_DEPTH:
        raise SCMError(f"{path}: JSON nesting depth {depth} exceeds {MAX_DEPTH} (a valid SCM nests 3 deep)")

    def reject_constant(name: str):
        raise SCMError(f"{path}: {name} is not a finite number (JSON allows none)")

    try:
        data = json.loads(text, parse_constant=reject_constant)
    except json.JSONDecodeError as err:
        raise SCMError(f"{path}:{err.lineno}:{err.colno}: not valid JSON ({err.msg})") from None
    except SCMError:
        raise
    except ValueError as err:  # an integer literal too long to convert
        raise SCMError(f"{path}: not valid JSON ({str(err).splitlines()[0][:100]})") from None
    return parse_scm(data, str(path))


def scm_to_json(scm: SCM) -> str:
    return json.dumps(scm.model_dump(mode="json"), indent=2) + "\n"


# ----------------------------------------------------------------------------------------------
# compiled worlds: every quantity the simulator needs, as exact (float64) tensors
# ----------------------------------------------------------------------------------------------
# Context index c = 4·i_a + 2·z + w  (i_a: index of a in protected_values), 8 contexts.
CELLS = [(ia, z, w) for ia in (0, 1) for z in (0, 1) for w in (0, 1)]


def feature_map(v: torch.Tensor, kind: str) -> torch.Tensor:
    """f(v) = v/‖v‖ over the last axis ("normalize", the official map) or v ("identity")."""
    return v / v.norm(dim=-1, keepdim=True) if kind == "normalize" else v


class World:
    """Exact tensors of one SCM (float64 on ``device``).

    x_play (8, K, p)        feature of arm k played in context c
    f_fac, f_ctf (2, 4, K, p)  factual / counterfactual features for factual a-index, cell (z,w)
    p_zw_fac (2, 4) = P(z|a) ; p_w_fac (2, 4) = P(w|a,z) ; p_zw_alt, p_w_alt: same at a* (other value)
    mu (8, K)               true reward probabilities
    effects (2, 3, K)       true DE/IE/SE per factual a-index and arm
    """

    def __init__(self, scm: SCM, device: torch.device | str = "cpu"):
        dev = torch.device(device)
        f64 = torch.float64
        self.scm, self.device = scm, dev
        self.K, self.m = len(scm.arms), len(scm.arms[0])
        self.p = 3 + self.m
        self.tau = scm.tau
        self.S = scm.norm_bound
        arms = torch.tensor(scm.arms, dtype=f64, device=dev)  # (K, m)
        avals = scm.protected_values
        cf = [1.0 - avals[0], 1.0 - avals[1]] if scm.counterfactual_feature == "one_minus_a" else [avals[1], avals[0]]

        def feats(a: float, z: int, w: int) -> torch.Tensor:
            head = torch.tensor([a, float(z), float(w)], dtype=f64, device=dev).expand(self.K, 3)
            return feature_map(torch.cat([head, arms], 1), scm.feature_map)  # (K, p)

        self.x_play = torch.stack([feats(avals[ia], z, w) for ia, z, w in CELLS])  # (8, K, p)
        zw = [(z, w) for z in (0, 1) for w in (0, 1)]
        self.f_fac = torch.stack([torch.stack([feats(avals[ia], z, w) for z, w in zw]) for ia in (0, 1)])
        self.f_ctf = torch.stack([torch.stack([feats(cf[ia], z, w) for z, w in zw]) for ia in (0, 1)])
        pz1 = scm.p_confounder
        pw1 = scm.p_mediator

        def pz(ia, z):
            return pz1[ia] if z == 1 else 1.0 - pz1[ia]

        def pw(ia, z, w):
            return pw1[ia][z] if w == 1 else 1.0 - pw1[ia][z]

        t = lambda rows: torch.tensor(rows, dtype=f64, device=dev)  # noqa: E731
        self.p_zw_fac = t([[pz(ia, z) for z, w in zw] for ia in (0, 1)])        # P(z|a)
        self.p_w_fac = t([[pw(ia, z, w) for z, w in zw] for ia in (0, 1)])      # P(w|a,z)
        self.p_zw_alt = t([[pz(1 - ia, z) for z, w in zw] for ia in (0, 1)])    # P(z|a*)
        self.p_w_alt = t([[pw(1 - ia, z, w) for z, w in zw] for ia in (0, 1)])  # P(w|a*,z)
        self.p_context = t([scm.p_protected[ia] * pz(ia, z) * pw(ia, z, w) for ia, z, w in CELLS])
        # which (z, w) cells the effect sums keep: all four, or the official code's single (0, 0) match
        self.cell_mask = t([1.0, 1.0, 1.0, 1.0] if scm.effect_cells == "all" else [1.0, 0.0, 0.0, 0.0])
        self.theta_star = t(scm.theta_star)
        self.mu = torch.sigmoid(self.x_play @ self.theta_star)  # (8, K)
        self.effects = effects_from_mu(torch.sigmoid(self.f_fac @ self.theta_star),
                                       torch.sigmoid(self.f_ctf @ self.theta_star), self)  # (2, 3, K)
        self.fair_leq = scm.tau_mode == "boundary"   # fairness |effect| <= τ (boundary) or < τ (official)
        if self.fair_leq:  # τ := the least-unfair arm's max|effect| at the boundary protected value
            self.tau = float(self.effects[scm.boundary_protected].abs().amax(0).min())
            self.boundary_arm = int(self.effects[scm.boundary_protected].abs().amax(0).argmin())

    def feasible(self, tau: torch.Tensor) -> torch.Tensor:
        """(n_tau, 2, K) truly fair arms: all |effect| < τ (strict; <= τ in boundary mode)."""
        cmp = torch.le if self.fair_leq else torch.lt
        return cmp(self.effects.abs()[None], tau[:, None, None, None]).all(2)

    def comparator(self, tau: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per τ and context: (best fair arm (n_tau, 8), has_fair (n_tau, 8)); without a fair arm the
        least-unfair arm (smallest max|effect|, ties -> higher reward)."""
        feas = self.feasible(tau)                               # (n, 2, K)
        a_of_c = torch.tensor([ia for ia, _, _ in CELLS], device=self.device)
        feas_c = feas[:, a_of_c]                                # (n, 8, K)
        mu = self.mu[None].expand_as(feas_c)
        best_fair = torch.where(feas_c, mu, -torch.inf).argmax(-1)
        worst = self.effects.abs().amax(1)[a_of_c]              # (8, K) max|effect|
        least_mask = worst == worst.min(-1, keepdim=True).values
        least = torch.where(least_mask, self.mu, -torch.inf).argmax(-1)[None].expand_as(best_fair)
        has = feas_c.any(-1)
        return torch.where(has, best_fair, least), has


def effects_from_mu(mu_fac: torch.Tensor, mu_ctf: torch.Tensor, world: World,
                    a_idx: torch.Tensor | None = None, cell: torch.Tensor | None = None) -> torch.Tensor:
    """DE/IE/SE from factual/counterfactual mean rewards over the 4 (z, w) cells.

    mu_fac, mu_ctf: (..., 4, K) for factual a-index a_idx (shape ...) or, with a_idx None,
    (2, 4, K) for both a-indices. cell: which cells the sums keep, (4, 1) or per instance
    (B, 4, 1) (default: the world's effect_cells). Returns (..., 3, K).
    """
    if a_idx is None:
        p_zw, p_w, p_zw_alt, p_w_alt = world.p_zw_fac, world.p_w_fac, world.p_zw_alt, world.p_w_alt
    else:
        p_zw, p_w, p_zw_alt, p_w_alt = (world.p_zw_fac[a_idx], world.p_w_fac[a_idx],
                                        world.p_zw_alt[a_idx], world.p_w_alt[a_idx])
    p_zw, p_w, p_zw_alt, p_w_alt = (x[..., :, None] for x in (p_zw, p_w, p_zw_alt, p_w_alt))
    cell = world.cell_mask[:, None] if cell is None else cell   # (4, 1): 1 for the cells the sums keep
    de = ((mu_ctf - mu_fac) * p_w * p_zw * cell).sum(-2)       # ALGO: Ctf-DE (official bandit.py)
    ie = (mu_ctf * (p_w - p_w_alt) * p_zw * cell).sum(-2)      # ALGO: Ctf-IE
    se = (mu_ctf * p_w_alt * (p_zw - p_zw_alt) * cell).sum(-2) # ALGO: Ctf-SE
    return torch.stack([de, ie, se], -2)


def compile_world(scm: SCM, device: torch.device | str = "cpu") -> World:
    return World(scm, device)
