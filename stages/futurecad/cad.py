"""Real B-Rep geometry for futurecad: a sandboxed CadQuery-script interpreter, procedural parts,
per-primitive export (faces on a UV grid, edges as sampled curves), geometric target predicates,
natural-language queries from templates, surface point clouds and volume IoU.

Scripts are CadQuery-like Python *expressions*, e.g.

    cq.Workplane("XY").box(40, 30, 8).faces(">Z").workplane().center(10, 0).hole(6)
      .edges(Query("the vertical straight edges on the sides")).fillet(1)

``parse_script`` turns the text into a list of whitelisted calls (Python's ``ast``: only a chain of
the calls in ``WHITELIST`` with literal arguments; nothing is ``exec``-ed); ``run_script`` replays
them on CadQuery. A fillet/chamfer's operands come from ``edges(Query("..."))`` — grounded on the
current B-Rep B_{i-1} by a grounder callback (BRepGround-mini, a rule, or the oracle) — or from
``edges(Index(3, 7))``, ids in CadQuery's own enumeration order (``Shape.Edges()``).
"""
from __future__ import annotations

import ast
import contextlib
import os
import re
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

UV = 5          # face UV grid is UV × UV
CURVE = 8       # samples per edge
FACE_CH = 7     # xyz, normal xyz, inside-trim mask
EDGE_CH = 6     # xyz, tangent xyz
FACE_TYPES = ("PLANE", "CYLINDER", "OTHER")
EDGE_TYPES = ("LINE", "CIRCLE", "OTHER")


class ScriptError(ValueError):
    """A script that cannot run: parse error, call outside the whitelist, bad argument, kernel failure."""


# ----------------------------------------------------------------------------------------------
# sandboxed interpreter
# ----------------------------------------------------------------------------------------------
NUM = "num"
STR = "str"
SEL = "sel"          # Query("text") or Index(i, ...)
WHITELIST: dict[str, tuple[str, ...]] = {
    "Workplane": (STR,), "box": (NUM, NUM, NUM), "faces": (STR,), "workplane": (), "center": (NUM, NUM),
    "hole": (NUM,), "circle": (NUM,), "rect": (NUM, NUM), "slot2D": (NUM, NUM), "extrude": (NUM,),
    "cutBlind": (NUM,), "edges": (SEL,), "fillet": (NUM,), "chamfer": (NUM,),
}
FACE_SELECTORS = (">Z", "<Z")
MAX_ABS = 500.0
MAX_CALLS = 24


@dataclass(frozen=True)
class Call:
    name: str
    args: tuple


def _literal(node: ast.AST, kind: str, name: str):
    if kind == NUM:
        sign = 1.0
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            sign, node = -1.0, node.operand
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            v = sign * float(node.value)
            if not abs(v) <= MAX_ABS:
                raise ScriptError(f"{name}(): argument {v} outside ±{MAX_ABS}")
            return v
        raise ScriptError(f"{name}(): expected a number literal")
    if kind == STR:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value.replace(" ", "")
        raise ScriptError(f"{name}(): expected a string literal")
    # selector: Query("text") | Index(int, ...)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        if node.func.id == "Query" and len(node.args) == 1 and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            text = " ".join(node.args[0].value.split())
            if not text:
                raise ScriptError(f"{name}(Query(...)): empty query")
            return ("query", text)
        if node.func.id == "Index" and node.args and all(
                isinstance(a, ast.Constant) and type(a.value) is int and a.value >= 0 for a in node.args):
            return ("index", tuple(a.value for a in node.args))
    raise ScriptError(f"{name}(): expected Query(\"text\") or Index(i, ...)")


def parse_script(text: str) -> list[Call]:
    """Script text -> whitelisted calls; any other construct is a ScriptError (never executed)."""
    if not isinstance(text, str) or not text.strip():
        raise ScriptError("empty script")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as err:
        raise ScriptError(f"syntax error: {err.msg}") from None
    calls: list[Call] = []
    node = tree.body
    while True:
        if not isinstance(node, ast.Call) or node.keywords:
            raise ScriptError("script must be a chain of calls without keywords")
        func = node.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):   # cq.Workplane(...)
            if func.value.id != "cq" or func.attr != "Workplane":
                raise ScriptError(f"call outside the whitelist: {func.value.id}.{func.attr}")
            name, nxt = "Workplane", None
        elif isinstance(func, ast.Attribute):
            name, nxt = func.attr, func.value
        elif isinstance(func, ast.Name):
            raise ScriptError(f"call outside the whitelist: {func.id}")
        else:
            raise ScriptError("call outside the whitelist")
        if name not in WHITELIST:
            raise ScriptError(f"call outside the whitelist: {name}")
        spec = WHITELIST[name]
        if len(node.args) != len(spec):
            raise ScriptError(f"{name}(): expected {len(spec)} arguments, got {len(node.args)}")
        args = tuple(_literal(a, k, name) for a, k in zip(node.args, spec))
        if name == "faces" and args[0] not in FACE_SELECTORS:
            raise ScriptError(f"faces(): selector {args[0]!r} not in {FACE_SELECTORS}")
        if name == "Workplane" and args[0] != "XY":
            raise ScriptError("Workplane(): only \"XY\"")
        calls.append(Call(name, args))
        if len(calls) > MAX_CALLS:
            raise ScriptError(f"more than {MAX_CALLS} calls")
        if nxt is None:
            break
        node = nxt
    calls.reverse()
    if calls[0].name != "Workplane" or any(c.name == "Workplane" for c in calls[1:]):
        raise ScriptError("script must start with cq.Workplane(\"XY\") and contain it once")
    return calls


Grounder = Callable[[object, str], list[int]]   # (solid, query) -> edge ids in CadQuery order


@dataclass
class RunResult:
    solid: object
    selections: list[dict] = field(default_factory=list)   # per fillet/chamfer: before-solid, ids, query


_WP_CLASS = None


def _workplane_class():
    """cq.Workplane whose ``newObject`` copies the plane without first building a default one (CadQuery's
    builds ``Plane.named("XY")`` for every call of the chain and throws it away): the same state, less time."""
    global _WP_CLASS
    if _WP_CLASS is None:
        from copy import copy

        import cadquery as cq

        class FastWorkplane(cq.Workplane):
            def newObject(self, objlist):
                ns = object.__new__(type(self))
                ns.plane = copy(self.plane)
                ns.parent = self
                ns.objects = list(objlist)
                ns.ctx = self.ctx
                ns._tag = None
                return ns

        _WP_CLASS = FastWorkplane
    return _WP_CLASS


def _fork(wp):
    """A workplane with wp's state and its own copy of the chain context (pending wires/edges, tags), so
    that later calls of one script cannot leak into another script that reuses the cached prefix."""
    from copy import copy

    ns = wp.newObject(wp.objects)
    ctx = copy(wp.ctx)
    ctx.pendingWires, ctx.pendingEdges, ctx.tags = list(wp.ctx.pendingWires), list(wp.ctx.pendingEdges), dict(wp.ctx.tags)
    ns.ctx = ctx
    return ns


def run_script(text: str, grounder: Grounder | None = None, record: bool = False,
               cache: dict | None = None) -> RunResult:
    """Execute a whitelisted script on CadQuery; ScriptError on any failure.

    ``cache`` (a dict the caller keeps, e.g. an LRU in the sandbox worker) memoises the workplane after the
    calls before the first ``edges(...)`` and each grounded selection on it: scripts that share their part
    (the usual case in RL rollouts) build the part and ground a query once. Results are identical."""
    calls = parse_script(text)
    wp = None
    sels: list[dict] = []
    pending = None
    first_sel = next((i for i, c in enumerate(calls) if c.name == "edges"), len(calls))
    prefix = tuple(calls[:first_sel])
    start = 0
    if cache is not None and ("wp", prefix) in cache:
        wp, start = _fork(cache[("wp", prefix)]), first_sel
    for k, c in enumerate(calls):
        if k < start:
            continue
        if cache is not None and k == first_sel and k > 0 and ("wp", prefix) not in cache:
            cache[("wp", prefix)] = _fork(wp)
        try:
            if c.name == "Workplane":
                wp = _workplane_class()("XY")
            elif c.name == "edges":
                solid = wp.findSolid()
                edges = solid.Edges()
                kind, val = c.args[0]
                if kind == "query":
                    if grounder is None:
                        raise ScriptError("Query(...) needs a grounder")
                    gkey = ("ground", tuple(calls[:k]), val)
                    if cache is not None and gkey in cache:
                        ids = cache[gkey]
                    else:
                        ids = sorted(set(int(i) for i in grounder(solid, val)))
                        if cache is not None:
                            cache[gkey] = ids
                else:
                    ids = sorted(set(val))
                if not ids:
                    raise ScriptError(f"edges(): selection is empty ({kind} {val!r})")
                if ids[-1] >= len(edges):
                    raise ScriptError(f"edges(): index {ids[-1]} out of range ({len(edges)} edges)")
                pending = {"before": solid, "ids": ids, "kind": kind, "value": val}
                wp = wp.newObject([edges[i] for i in ids])
            elif c.name in ("fillet", "chamfer"):
                if pending is None:
                    raise ScriptError(f"{c.name}() needs a preceding edges(...) selection")
                if c.args[0] <= 0:
                    raise ScriptError(f"{c.name}(): size must be positive")
                wp = getattr(wp, c.name)(c.args[0])
                sels.append(dict(pending, op=c.name, size=c.args[0]))
                pending = None
            else:
                wp = getattr(wp, c.name)(*c.args)
        except ScriptError:
            raise
        except Exception as err:  # the kernel refused (bad fillet radius, nothing to cut, ...)
            raise ScriptError(f"{c.name}() failed in the CAD kernel: {type(err).__name__}") from None
    if cache is not None and first_sel == len(calls) and ("wp", prefix) not in cache:
        cache[("wp", prefix)] = _fork(wp)                 # a script without selections is itself a prefix
    try:
        solid = wp.findSolid()
    except Exception:
        raise ScriptError("script produced no solid") from None
    if solid is None or not solid.isValid() or solid.Volume() <= 1e-6:
        raise ScriptError("script produced an invalid or empty solid")
    return RunResult(solid, sels if record else [])


# ----------------------------------------------------------------------------------------------
# procedural parts
# ----------------------------------------------------------------------------------------------
FAMILIES = ("plate", "block", "cylinder", "boss", "slotted")
# the features a family's part can carry: the first is always kinds[0], a second (if any) any of kinds (a second
# boss becomes a hole)
FEATURE_KINDS = {"plate": ("hole", "slot"), "block": ("hole", "step", "slot"), "cylinder": ("hole", "boss"),
                 "boss": ("boss",), "slotted": ("slot", "hole")}


def _second_feature(first: str, kind: str) -> str:
    return "hole" if kind == "boss" and first == "boss" else kind


# every (family, feature mix) random_part can draw: the strata of the validation split (prepare)
STRATA: tuple[tuple[str, tuple[str, ...]], ...] = tuple(
    (fam, mix) for fam in FAMILIES for mix in dict.fromkeys(
        [(FEATURE_KINDS[fam][0],)] + [(FEATURE_KINDS[fam][0], _second_feature(FEATURE_KINDS[fam][0], k))
                                      for k in FEATURE_KINDS[fam]]))


def stratum(part: dict) -> tuple[str, tuple[str, ...]]:
    """(family, feature mix) of a random_part draw."""
    return part["family"], tuple(part["features"])


def stratum_name(s: tuple[str, tuple[str, ...]]) -> str:
    return f"{s[0]}:{'+'.join(s[1])}"


def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def call_text(name: str, *args) -> str:
    if name == "Workplane":
        return 'cq.Workplane("XY")'
    return f".{name}({', '.join(_fmt(a) if not isinstance(a, str) else a for a in args)})"


def random_part(rng: np.random.Generator) -> dict:
    """One procedural part: family, base script (no fillet), feature list and a description."""
    fam = FAMILIES[int(rng.integers(len(FAMILIES)))]
    parts = [call_text("Workplane")]
    desc: list[str] = []
    segments: list[str] = []
    feats: list[str] = []
    if fam == "cylinder":
        R, H = int(rng.integers(8, 16)), int(rng.integers(6, 20))
        parts += [".circle(%d)" % R, ".extrude(%d)" % H]
        desc.append(f"a cylinder radius {R} height {H}")
        size = (2 * R, 2 * R, H)
    else:
        L, W = int(rng.integers(24, 50)), int(rng.integers(16, 36))
        H = int(rng.integers(3, 6)) if fam == "plate" else int(rng.integers(8, 20))
        parts.append(f".box({L}, {W}, {H})")
        desc.append(f"a {'plate' if fam == 'plate' else 'block'} {L} by {W} by {H}")
        size = (L, W, H)
    L, W, H = size
    n_feat = int(rng.integers(1, 3))
    kinds = FEATURE_KINDS[fam]
    used_boss = False
    for k in range(n_feat):
        kind = kinds[0] if k == 0 else kinds[int(rng.integers(len(kinds)))]
        if kind == "boss" and used_boss:
            kind = "hole"
        top = '.faces(">Z").workplane()'
        if kind == "hole":
            d = int(rng.integers(2, 5)) * 2
            cx = int(rng.integers(-1, 2)) * max(0, int(L / 2 - d - 3))
            cx = 0 if fam == "cylinder" else cx
            parts.append(f"{top}.center({cx}, 0).hole({d})")
            desc.append(f"a hole diameter {d} at {cx}")
        elif kind == "slot":
            sl, sw, dep = int(rng.integers(8, 14)), int(rng.integers(2, 4)) * 2, max(1, H // 2)
            cy = int(rng.integers(-1, 2)) * max(0, int(W / 2 - sw - 2))
            parts.append(f"{top}.center(0, {cy}).slot2D({sl}, {sw}).cutBlind(-{dep})")
            desc.append(f"a slot {sl} by {sw} deep {dep} at {cy}")
        elif kind == "step":
            a, dep = int(rng.integers(6, max(7, L // 3))), max(2, H // 2)
            parts.append(f"{top}.center({int(L / 2 - a / 2)}, 0).rect({a}, {W + 2}).cutBlind(-{dep})")
            desc.append(f"a step {a} wide deep {dep}")
        elif kind == "boss":
            r, h = int(rng.integers(3, 6)), int(rng.integers(3, 8))
            parts.append(f"{top}.circle({r}).extrude({h})")
            desc.append(f"a boss radius {r} height {h}")
            used_boss = True
        feats.append(kind)
        segments.append(parts[-1])
    base = "".join(parts[: len(parts) - len(segments)])
    return {"family": fam, "script": "".join(parts), "description": " with ".join(desc), "features": feats,
            "base": base, "segments": segments}


# ----------------------------------------------------------------------------------------------
# primitive export (UV grids, curves) and attributes
# ----------------------------------------------------------------------------------------------
def bbox_of(solid) -> tuple[np.ndarray, np.ndarray]:
    """Exact bounding box from the B-Rep geometry only (never from a triangulation the solid may carry:
    meshing a solid for surface points must not change its later export)."""
    from OCP.Bnd import Bnd_Box
    from OCP.BRepBndLib import BRepBndLib

    box = Bnd_Box()
    BRepBndLib.AddOptimal_s(solid.wrapped, box, False, False)
    x0, y0, z0, x1, y1, z1 = box.Get()
    return np.array([x0, y0, z0]), np.array([x1, y1, z1])


def frame_of(solid) -> tuple[np.ndarray, np.ndarray]:
    """Centre and per-axis half extents: points are mapped to [-1, 1]^3 (the part's bounding box)."""
    lo, hi = bbox_of(solid)
    return (lo + hi) / 2, np.maximum((hi - lo) / 2, 1e-9)


def diag_of(solid) -> float:
    lo, hi = bbox_of(solid)
    return float(np.linalg.norm(hi - lo))


def face_grid(face, center: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """(UV·UV, 7) points, unit normals (outward, orientation-aware) and trim mask on a UV grid."""
    from OCP.BRepAdaptor import BRepAdaptor_Surface
    from OCP.BRepTools import BRepTools
    from OCP.BRepTopAdaptor import BRepTopAdaptor_FClass2d
    from OCP.gp import gp_Pnt, gp_Pnt2d, gp_Vec
    from OCP.TopAbs import TopAbs_IN, TopAbs_ON, TopAbs_REVERSED

    ad = BRepAdaptor_Surface(face.wrapped)
    umin, umax, vmin, vmax = BRepTools.UVBounds_s(face.wrapped)
    flip = -1.0 if face.wrapped.Orientation() == TopAbs_REVERSED else 1.0
    cls = BRepTopAdaptor_FClass2d(face.wrapped, 1e-7)      # same states as BRepClass_FaceClassifier, faster
    P, DU, DV = gp_Pnt(), gp_Vec(), gp_Vec()
    raw = []
    for i in range(UV):
        for j in range(UV):
            u = umin + (umax - umin) * (i + 0.5) / UV
            v = vmin + (vmax - vmin) * (j + 0.5) / UV
            ad.D1(u, v, P, DU, DV)
            n = DU.Crossed(DV)
            nn = n.Magnitude()
            inside = cls.Perform(gp_Pnt2d(u, v)) in (TopAbs_IN, TopAbs_ON)
            k = flip / nn if nn > 1e-12 else 0.0
            raw.append((P.X(), P.Y(), P.Z(), n.X() * k, n.Y() * k, n.Z() * k, 1.0 if inside else 0.0))
    out = np.array(raw, dtype=np.float64)
    out[:, :3] = (out[:, :3] - center) / scale
    return out.astype(np.float32)


def edge_curve(edge, center: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """(CURVE, 6) points and unit tangents along the edge's parameter range."""
    from OCP.BRepAdaptor import BRepAdaptor_Curve
    from OCP.gp import gp_Pnt, gp_Vec

    ad = BRepAdaptor_Curve(edge.wrapped)
    a, b = ad.FirstParameter(), ad.LastParameter()
    P, V = gp_Pnt(), gp_Vec()
    out = np.zeros((CURVE, EDGE_CH), dtype=np.float32)
    for k in range(CURVE):
        ad.D1(a + (b - a) * k / (CURVE - 1), P, V)
        m = V.Magnitude()
        out[k, :3] = (np.array([P.X(), P.Y(), P.Z()]) - center) / scale
        out[k, 3:] = np.array([V.X(), V.Y(), V.Z()]) / m if m > 1e-12 else 0.0
    return out


@dataclass
class Primitives:
    """Every face and edge of one solid, in CadQuery's enumeration order (Faces(), Edges())."""
    faces: np.ndarray          # (F, UV·UV, 7)
    edges: np.ndarray          # (E, CURVE, 6)
    face_type: list[str]
    edge_type: list[str]
    face_attr: list[dict]
    edge_attr: list[dict]
    center: np.ndarray | None = None   # the frame the points are normalised with (part units)
    scale: np.ndarray | None = None

    def edge_points(self) -> np.ndarray:
        """(E, CURVE, 3) edge samples back in part units."""
        return self.edges[..., :3] * self.scale + self.center


def _type(name: str, allowed: tuple[str, ...]) -> str:
    return name if name in allowed else "OTHER"


def export_primitives(solid) -> Primitives:
    from OCP.BRep import BRep_Tool

    lo, hi = bbox_of(solid)
    center, scale = (lo + hi) / 2, np.maximum((hi - lo) / 2, 1e-9)      # = frame_of(solid)
    tol = 1e-4 * float(scale.max())
    fs, es = solid.Faces(), solid.Edges()
    fg = np.stack([face_grid(f, center, scale) for f in fs]) if fs else np.zeros((0, UV * UV, FACE_CH), np.float32)
    ec = np.stack([edge_curve(e, center, scale) for e in es]) if es else np.zeros((0, CURVE, EDGE_CH), np.float32)
    ftype = [_type(f.geomType(), FACE_TYPES) for f in fs]
    etype = [_type(e.geomType(), EDGE_TYPES) for e in es]

    def level(zlo, zhi):
        if abs(zhi - zlo) > tol:
            return "span"
        z = (zlo + zhi) / 2
        return "top" if abs(z - hi[2]) < tol else "bottom" if abs(z - lo[2]) < tol else "middle"

    eattr = []
    for e, t, c in zip(es, etype, ec):
        pts = c[:, :3] * scale + center
        zl = level(pts[:, 2].min(), pts[:, 2].max())
        vertical = t == "LINE" and abs(float(c[0, 5])) > 0.999
        if vertical:   # a cylinder's seam line is not a real edge of the part (nothing to fillet)
            vertical = not any(BRep_Tool.IsClosed_s(e.wrapped, f.wrapped) for f in fs)
        outer = bool(np.all((np.abs(pts[:, 0] - lo[0]) < tol) | (np.abs(pts[:, 0] - hi[0]) < tol)
                            | (np.abs(pts[:, 1] - lo[1]) < tol) | (np.abs(pts[:, 1] - hi[1]) < tol)))
        radius = e.radius() if t == "CIRCLE" else 0.0
        eattr.append({"type": t, "level": zl, "vertical": vertical, "outer": outer, "radius": round(radius, 4),
                      "length": round(float(e.Length()), 4)})
    fattr = []
    for f, t, g in zip(fs, ftype, fg):
        inside = g[:, 6] > 0.5
        pts = g[inside if inside.any() else slice(None), :3] * scale + center
        nz = float(np.mean(g[inside if inside.any() else slice(None), 5]))
        zl = level(pts[:, 2].min(), pts[:, 2].max())
        facing = "up" if nz > 0.99 else "down" if nz < -0.99 else "side"
        fattr.append({"type": t, "level": zl, "facing": facing, "radius": round(_face_radius(f, t), 4),
                      "area": round(float(f.Area()), 4)})
    return Primitives(fg, ec, ftype, etype, fattr, eattr, center, scale)


def _face_radius(face, ftype: str) -> float:
    if ftype != "CYLINDER":
        return 0.0
    from OCP.BRepAdaptor import BRepAdaptor_Surface

    return float(BRepAdaptor_Surface(face.wrapped).Cylinder().Radius())


# ----------------------------------------------------------------------------------------------
# targets (geometric predicates) and queries (templates)
# ----------------------------------------------------------------------------------------------
# A target spec: (prim, type word, place, size). Its members are computed by a predicate on the
# primitives' attributes (ground truth from geometry, never from the model).
EDGE_SPECS = [
    ("edges", "vertical straight", "sides", ""),
    ("edges", "straight", "top", ""),
    ("edges", "straight", "bottom", ""),
    ("edges", "circular", "top", ""),
    ("edges", "circular", "bottom", ""),
    ("edges", "circular", "top", "largest"),
    ("edges", "circular", "top", "smallest"),
    ("edges", "circular", "bottom", "largest"),
    ("edges", "circular", "bottom", "smallest"),
    ("edges", "straight", "top", "longest"),
    ("edges", "straight", "top", "shortest"),
    ("edges", "straight", "step level", ""),
    ("edges", "circular", "step level", ""),
]
FACE_SPECS = [
    ("faces", "planar", "top", ""),
    ("faces", "planar", "bottom", ""),
    ("faces", "planar", "step level", ""),
    ("faces", "cylindrical", "sides", ""),
    ("faces", "cylindrical", "sides", "largest"),
    ("faces", "cylindrical", "sides", "smallest"),
]
SPECS = EDGE_SPECS + FACE_SPECS
PLACE_LEVEL = {"top": "top", "bottom": "bottom", "step level": "middle"}
SIZE_WORDS = ("largest", "smallest", "longest", "shortest")   # superlatives: extreme radius (circles,
#   cylinders) or length (straight edges) among the members of the unqualified set; ties keep all


def size_matters(prims: Primitives, spec) -> bool:
    """A superlative spec whose set is a proper subset of the unqualified one (≥ 2 distinct sizes)."""
    if not spec[3]:
        return False
    ids = target_ids(prims, spec)
    return bool(ids) and len(ids) < len(target_ids(prims, spec[:3] + ("",)))


def spec_name(spec) -> str:
    return " ".join(w for w in spec if w)


def target_ids(prims: Primitives, spec: tuple[str, str, str, str]) -> list[int]:
    """Ground-truth member ids (within faces or within edges) of a spec on these primitives. A size word keeps
    the members of extreme size (ties keep all: with a single size it keeps the whole set)."""
    prim, tword, place, size = spec
    if prim == "edges":
        ids = []
        for i, a in enumerate(prims.edge_attr):
            if tword == "vertical straight":
                ok = a["type"] == "LINE" and a["vertical"] and a["outer"]
            else:
                want = "LINE" if tword == "straight" else "CIRCLE"
                ok = a["type"] == want and a["level"] == PLACE_LEVEL[place]
            if ok:
                ids.append(i)
        attrs = prims.edge_attr
    else:
        ids = []
        for i, a in enumerate(prims.face_attr):
            if tword == "cylindrical":
                ok = a["type"] == "CYLINDER"
            else:
                facing = "down" if place == "bottom" else "up"
                ok = a["type"] == "PLANE" and a["facing"] == facing and a["level"] == PLACE_LEVEL[place]
            if ok:
                ids.append(i)
        attrs = prims.face_attr
    if size and ids:
        key = "length" if size in ("longest", "shortest") else "radius"
        vals = sorted({attrs[i][key] for i in ids})
        pick = vals[-1] if size in ("largest", "longest") else vals[0]
        ids = [i for i in ids if attrs[i][key] == pick]
    return ids


OPS = {"edges": ("fillet", "chamfer"), "faces": ("select", "shell")}
SEEN_TEMPLATES = (
    "{op} the {size} {type} {prim} on the {place}",
    "{op} every {size} {type} {prim} located at the {place}",
    "on the {place} , {op} the {size} {type} {prim}",
    "{type} {prim} on the {place} that are {size} : {op} them",
    "please {op} all {size} {type} {prim} at the {place}",
    "at the {place} there are {size} {type} {prim} ; {op} them",
)
HELDOUT_TEMPLATES = (
    "{op} {size} {type} {prim} found at the {place} of the model",
    "the {place} has {size} {type} {prim} ; please {op} those",
)


# Paraphrases (the paper's queries are LLM paraphrases): each attribute word has synonyms, drawn at
# random for every query of every split; the first entry is the canonical word.
SYNONYMS = {
    "top": ("top", "upper side", "uppermost level"), "bottom": ("bottom", "underside", "lowest level"),
    "sides": ("sides", "outside", "perimeter"), "step level": ("step level", "intermediate level", "recessed floor"),
    "straight": ("straight", "linear"), "vertical straight": ("vertical straight", "upright"),
    "circular": ("circular", "round", "curved"), "planar": ("planar", "flat"), "cylindrical": ("cylindrical", "curved"),
    "largest": ("largest", "biggest", "widest"), "smallest": ("smallest", "tiniest", "narrowest"),
    "longest": ("longest", "long"), "shortest": ("shortest", "short"),
    "edges": ("edges",), "faces": ("faces", "surfaces"), "": ("",),
}


def render_query(template: str, spec, op: str, rng: np.random.Generator | None = None) -> str:
    """A query for a target spec; with ``rng`` each attribute word is a random paraphrase."""
    def word(w):
        syn = SYNONYMS[w]
        return syn[0] if rng is None else syn[int(rng.integers(len(syn)))]

    prim, tword, place, size = spec
    text = template.format(op=op, size=word(size), type=word(tword), prim=word(prim), place=word(place))
    text = text.replace("that are  :", ":")
    return " ".join(text.split())


def tokenize_query(text: str) -> list[str]:
    return re.findall(r"[a-z]+|[;:,]", text.lower())


# ----------------------------------------------------------------------------------------------
# scripts with a fillet/chamfer step
# ----------------------------------------------------------------------------------------------
def fillet_script(base: str, spec, op: str, size: float, selector: str) -> str:
    """base + ``.edges(<selector>).<op>(size)``; selector is Query("...") or Index(...)."""
    return f"{base}.edges({selector}).{op}({_fmt(size)})"


def query_text(spec, op: str) -> str:
    """The query a program carries for a fillet/chamfer step (the first seen template)."""
    return render_query(SEEN_TEMPLATES[0], spec, op)


def query_selector(spec, op: str) -> str:
    return f'Query("{query_text(spec, op)}")'


def index_selector(ids: list[int]) -> str:
    return f"Index({', '.join(str(i) for i in ids)})"


SCRIPT_TOKEN = re.compile(r'"[^"\s]*"|[A-Za-z_][A-Za-z0-9_]*|\d+(?:\.\d+)?|[^\sA-Za-z0-9_]')


def script_tokens(text: str) -> list[str]:
    return SCRIPT_TOKEN.findall(text)


def detokenize_script(tokens: list[str]) -> str:
    """Inverse of script_tokens up to whitespace: tokens joined by spaces still parse (string
    arguments are whitespace-normalised by the interpreter)."""
    return " ".join(tokens)


# ----------------------------------------------------------------------------------------------
# point clouds, volume IoU, STEP
# ----------------------------------------------------------------------------------------------
def tessellate(solid, tolerance: float, angular: float) -> tuple[np.ndarray, np.ndarray]:
    """(V, 3) vertices and (T, 3) triangles: CadQuery's ``Shape.tessellate`` (same mesh, same order) without
    building a Vector per vertex."""
    from OCP.BRep import BRep_Tool
    from OCP.TopAbs import TopAbs_REVERSED
    from OCP.TopLoc import TopLoc_Location

    solid.mesh(tolerance, angular)
    verts, tris, offset = [], [], 0
    for f in solid.Faces():
        loc = TopLoc_Location()
        poly = BRep_Tool.Triangulation_s(f.wrapped, loc)
        if poly is None:
            continue
        trsf = loc.Transformation()
        for i in range(1, poly.NbNodes() + 1):
            v = poly.Node(i).Transformed(trsf)
            verts.append((v.X(), v.Y(), v.Z()))
        rev = f.wrapped.Orientation() == TopAbs_REVERSED
        for i in range(1, poly.NbTriangles() + 1):
            t = poly.Triangle(i)
            a, b, c = t.Value(1), t.Value(2), t.Value(3)
            tris.append((a + offset - 1, c + offset - 1, b + offset - 1) if rev else
                        (a + offset - 1, b + offset - 1, c + offset - 1))
        offset += poly.NbNodes()
    return np.array(verts, dtype=np.float64).reshape(-1, 3), np.array(tris, dtype=np.int64).reshape(-1, 3)


def surface_points(solid, n: int, seed: int = 0, diag: float | None = None) -> np.ndarray:
    """n points sampled area-weighted on the tessellated surface (fixed seed: same solid, same points)."""
    V, T = tessellate(solid, 5e-3 * (diag_of(solid) if diag is None else diag), 0.3)
    a, b, c = V[T[:, 0]], V[T[:, 1]], V[T[:, 2]]
    area = 0.5 * np.linalg.norm(np.cross(b - a, c - a), axis=1)
    rng = np.random.default_rng(seed)
    k = rng.choice(len(T), size=n, p=area / area.sum())
    r1, r2 = rng.random(n), rng.random(n)
    s = np.sqrt(r1)
    pts = (1 - s)[:, None] * a[k] + (s * (1 - r2))[:, None] * b[k] + (s * r2)[:, None] * c[k]
    return pts.astype(np.float32)


def volume_iou(a, b) -> float:
    """Exact volume IoU from B-Rep booleans: vol(A ∩ B) / vol(A ∪ B)."""
    try:
        inter = a.intersect(b).Volume()
        union = a.fuse(b).Volume()
    except Exception:
        return 0.0
    return float(inter / union) if union > 1e-9 else 0.0


_EXPORT_MEMO: list[tuple[list, "Primitives"]] = []


def export_cached(solid) -> "Primitives":
    """export_primitives with a small memo over the last solids (matched by their sub-solids, isSame): a
    chain's ``findSolid`` wraps the same solid in a fresh compound on every call."""
    subs = solid.Solids()
    for key, prims in _EXPORT_MEMO:
        if len(key) == len(subs) and all(a.isSame(b) for a, b in zip(key, subs)):
            return prims
    prims = export_primitives(solid)
    _EXPORT_MEMO.insert(0, (subs, prims))
    del _EXPORT_MEMO[8:]
    return prims


class StepError(ValueError):
    pass


@contextlib.contextmanager
def _quiet_fd(fd: int = 1):
    """OCCT's STEP reader prints parse errors to the C-level stdout: keep it off the terminal."""
    saved = os.dup(fd)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), fd)
        try:
            yield
        finally:
            os.dup2(saved, fd)
            os.close(saved)


def load_step(path) -> object:
    """One solid from a STEP file (the largest by volume); StepError with a one-line reason."""
    import cadquery as cq

    try:
        with _quiet_fd(1):
            shape = cq.importers.importStep(str(path))
        solids = [s for obj in shape.vals() for s in (obj.Solids() if hasattr(obj, "Solids") else [])]
    except Exception as err:
        raise StepError(f"{path}: not a readable STEP file ({str(err).splitlines()[0] if str(err) else type(err).__name__})") from None
    if not solids:
        raise StepError(f"{path}: STEP file holds no solid")
    return max(solids, key=lambda s: s.Volume())


def write_step(solid, path) -> None:
    import cadquery as cq

    with _quiet_fd(1):
        cq.exporters.export(cq.Workplane("XY").newObject([solid]), str(path), exportType="STEP")
    # the writer stamps the wall-clock time into FILE_NAME: fix it so reruns are byte-identical
    text = open(path, encoding="utf-8").read()
    text = re.sub(r"(FILE_NAME\('[^']*',)'[^']*'", r"\1'1970-01-01T00:00:00'", text, count=1)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


# ----------------------------------------------------------------------------------------------
# STEP directory with labelled queries (the BRepGround row schema)
# ----------------------------------------------------------------------------------------------
STEP_QUERIES = "queries.jsonl"
MAX_STEP_BYTES = 50_000_000
MAX_QUERY_LINES = 1_000_000


def load_step_dir(path) -> list[dict]:
    """A directory of STEP files plus ``queries.jsonl``, one grounding row per line in the schema of the
    paper's BRepGround data (HF jhlee11/BRepGround): ``{"id": str, "step": "<file>.step", "queries": [str, ...],
    "face_labels": [0/1, ...], "edge_labels": [0/1, ...]}`` — multi-hot labels over the faces / edges of the
    STEP's solid in CadQuery's enumeration order (``Shape.Faces()``, ``Shape.Edges()``); all-zero labels mean
    "no such feature". Returns one dict per row with the loaded solid and its exported primitives
    (faces on UV grids, edges as sampled curves). StepError with a one-line reason on any schema problem."""
    import json as _json
    from pathlib import Path

    root = Path(path)
    qfile = root / STEP_QUERIES
    if not root.is_dir():
        raise StepError(f"{root}: not a directory")
    if not qfile.is_file():
        raise StepError(f"{root}: no {STEP_QUERIES}")
    if qfile.stat().st_size > MAX_STEP_BYTES:
        raise StepError(f"{qfile}: larger than {MAX_STEP_BYTES} bytes")
    cache: dict[str, tuple] = {}
    rows = []
    with open(qfile, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if n > MAX_QUERY_LINES:
                raise StepError(f"{qfile}: more than {MAX_QUERY_LINES} rows")
            if not line.strip():
                continue
            where = f"{qfile}:{n}"
            try:
                row = _json.loads(line)
            except ValueError:
                raise StepError(f"{where}: not a JSON object") from None
            if not isinstance(row, dict):
                raise StepError(f"{where}: not a JSON object")
            for key, kind in (("id", str), ("step", str), ("queries", list), ("face_labels", list),
                              ("edge_labels", list)):
                if not isinstance(row.get(key), kind):
                    raise StepError(f"{where}: field {key!r} missing or not a {kind.__name__}")
            if not row["queries"] or not all(isinstance(q, str) and q.strip() for q in row["queries"]):
                raise StepError(f"{where}: 'queries' must be non-empty strings")
            name = row["step"]
            step = (root / name).resolve()
            if step.parent != root.resolve() or not step.is_file():
                raise StepError(f"{where}: step {name!r} is not a file in {root}")
            if name not in cache:
                if step.stat().st_size > MAX_STEP_BYTES:
                    raise StepError(f"{step}: larger than {MAX_STEP_BYTES} bytes")
                solid = load_step(step)
                cache[name] = (solid, export_primitives(solid))
            solid, prims = cache[name]
            for key, count in (("face_labels", len(prims.face_attr)), ("edge_labels", len(prims.edge_attr))):
                lab = row[key]
                if len(lab) != count or any(v not in (0, 1) or isinstance(v, bool) for v in lab):
                    raise StepError(f"{where}: {key} must be {count} values of 0/1 for {name} "
                                    f"(got {len(lab)})")
            rows.append({"id": row["id"], "step": name, "queries": [" ".join(q.split()) for q in row["queries"]],
                         "face_labels": row["face_labels"], "edge_labels": row["edge_labels"],
                         "solid": solid, "prims": prims})
    if not rows:
        raise StepError(f"{qfile}: no rows")
    return rows


def match_edges(a: Primitives, b: Primitives, ids_a: list[int], ids_b: list[int], tol: float = 1e-4) -> bool:
    """Do two id sets name the same geometric edges (same curves in part units, as sets)?"""
    if len(ids_a) != len(ids_b):
        return False
    pa, pb = a.edge_points(), b.edge_points()
    tol = tol * max(float(np.max(np.abs(pa))) if len(pa) else 1.0, 1.0)
    free = set(ids_b)
    for i in ids_a:
        hit = next((j for j in free if np.allclose(pa[i], pb[j], atol=tol)
                    or np.allclose(pa[i], pb[j][::-1], atol=tol)), None)
        if hit is None:
            return False
        free.discard(hit)
    return True
