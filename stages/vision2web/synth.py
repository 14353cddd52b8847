"""A program-synthesis agent that builds a site from the task's messages only.

It is served behind the OpenAI-compatible adapter (model_server.py), so it sees exactly what a model
sees: the prompt (copy, pages), the workflow (selectors it must honour, expected behaviour) and the
prototype images. It never sees the generator's spec, the oracle's HTML, the prototypes' component
boxes or the bug catalogue. What it knows in advance is generic front-end craft: the archetypes of
a landing page (header, hero band, card grid, footer), a single-page shop with a cart, and an
auth + CRUD notes app; typical sans-serif font metrics; CSS box model.

How it builds a page (``mode="infer"``): for every prototype it measures the page with numpy —
horizontal colour bands down the left edge (header, hero, body, footer), the text lines inside each
band (ink rows clustered; height -> font size through generic font metrics; left/top -> paddings and
margins), card boxes (runs of the card border), swatch colours, button boxes, input widths — and
writes its own HTML/CSS (one media query per prototype width) and JS. Functionality is synthesised
from the workflow: the data-testid values, the routes asserted by ``url_contains``, the counts and
texts the validations expect; the L3 backend is its own stdlib HTTP + SQLite server with cookie
sessions. ``mode="template"`` ignores the images and uses one generic responsive style (the
retrieval/template baseline); the functional code is the same.

Its errors are real inference errors (font sizes from antialiased ink, line metrics it assumes,
wrapped lines it misreads, boxes it mis-detects), not injected ones.
"""
from __future__ import annotations

import base64
import io
import json
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# ---------------------------------------------------------------- the request
VIEW_ORDER = ("desktop", "tablet", "mobile")
ASC_CHARS = set("ABCDEFGHIJKLMNOPQRSTUVWXYZbdfhklt0123456789()$!?'\"ij&%")
DESC_CHARS = set("gjpqy")
# generic sans metrics the agent assumes (em units): ascent of the font box, ink tops, descender
ASCENT, DESCENT, NORMAL_LH = 0.93, 0.24, 1.16
TOP_ASC, TOP_X, BOT_DESC, BOT_PAREN = 0.76, 0.55, 0.24, 0.13


@dataclass
class Request:
    prompt: str
    workflow: list[dict[str, Any]]
    images: dict[str, np.ndarray]
    copy: dict[str, Any] = field(default_factory=dict)


def _decode(url: str) -> np.ndarray:
    from PIL import Image

    data = base64.b64decode(url.split(",", 1)[1])
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB"), dtype=np.uint8)


def parse_request(messages: list[dict[str, Any]]) -> Request:
    """Prompt text, workflow JSON and named prototype images from chat messages (adapter format)."""
    texts, images, pending = [], {}, None
    for msg in messages:
        content = msg.get("content")
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else (content or [])
        for part in parts:
            if part.get("type") == "text":
                m = re.match(r"^prototype (\S+):$", part["text"].strip())
                if m:
                    pending = m.group(1)
                else:
                    texts.append(part["text"])
            elif part.get("type") == "image_url" and pending is not None:
                images[pending] = _decode(part["image_url"]["url"])
                pending = None
    text = "\n".join(texts)
    m = re.search(r"workflow\.json:\s*```json\s*(.*?)```", text, re.S)
    workflow = json.loads(m.group(1)) if m else []
    req = Request(prompt=text, workflow=workflow, images=images)
    req.copy = parse_copy(text)
    return req


def parse_copy(text: str) -> dict[str, Any]:
    copy: dict[str, Any] = {"items": [], "ui": [], "nav": []}
    for line in text.splitlines():
        m = re.match(r"^- ([a-z ]+): (.*)$", line.strip())
        if not m:
            continue
        key, value = m.group(1).strip(), m.group(2).strip()
        if key == "item":
            name, _, price = value.partition(" | ")
            copy["items"].append({"name": name.strip(), "price": price.strip()})
        elif key == "ui text":
            copy["ui"] = [v.strip() for v in value.split("|")]
        elif key == "navigation":
            copy["nav"] = [v.strip() for v in value.split(",")]
        else:
            copy[key.replace(" ", "_")] = value
    return copy


# ---------------------------------------------------------------- measuring a prototype
Color = tuple[int, int, int]


def hexc(c: Color) -> str:
    return "#%02x%02x%02x" % tuple(int(x) for x in c)


def _runs(line: np.ndarray, min_len: int = 1) -> list[tuple[int, int, Color]]:
    """Runs of identical colour along a (N, 3) line: (start, end, colour)."""
    if len(line) == 0:
        return []
    change = np.any(line[1:] != line[:-1], axis=1)
    edges = [0, *(np.nonzero(change)[0] + 1).tolist(), len(line)]
    out = [(a, b, tuple(int(v) for v in line[a])) for a, b in zip(edges[:-1], edges[1:]) if b - a >= min_len]
    return out


def _ink(region: np.ndarray, bg: Color, thr: int = 48) -> np.ndarray:
    return np.abs(region.astype(np.int16) - np.array(bg, dtype=np.int16)).max(axis=2) > thr


def _clusters(mask_1d: np.ndarray, gap: int) -> list[tuple[int, int]]:
    idx = np.nonzero(mask_1d)[0]
    if len(idx) == 0:
        return []
    out, start, prev = [], idx[0], idx[0]
    for i in idx[1:]:
        if i - prev - 1 > gap:
            out.append((int(start), int(prev) + 1))
            start = i
        prev = i
    out.append((int(start), int(prev) + 1))
    return out


@dataclass
class Line:
    top: int
    bottom: int
    left: int
    right: int
    color: Color
    boxy: bool = False      # its first and last ink columns span its height: a box (input, button), not text

    @property
    def h(self) -> int:
        return self.bottom - self.top


def text_lines(img: np.ndarray, y0: int, y1: int, x0: int, x1: int, bg: Color, gap: int = 0) -> list[Line]:
    """Ink lines (row clusters split at blank rows; fragments such as i-dots joined to the line below)
    of a region, each with its bbox, its dominant ink colour and whether it is a box."""
    reg = img[y0:y1, x0:x1]
    if reg.size == 0:
        return []
    mask = _ink(reg, bg)
    spans = _clusters(mask.any(axis=1), gap)
    merged: list[tuple[int, int]] = []
    for a, b in spans:
        if merged and merged[-1][1] - merged[-1][0] < 0.3 * (b - a) and a - merged[-1][1] <= 2:
            merged[-1] = (merged[-1][0], b)     # a dot row above the line
        else:
            merged.append((a, b))
    out = []
    for a, b in merged:
        cols = np.nonzero(mask[a:b].any(axis=0))[0]
        pix = reg[a:b][mask[a:b]]
        dist = np.abs(pix.astype(np.int16) - np.array(bg, dtype=np.int16)).max(axis=1)
        strong = pix[dist >= np.percentile(dist, 80)]
        vals, counts = np.unique(strong, axis=0, return_counts=True)
        edge = min(mask[a:b, cols[0]].mean(), mask[a:b, cols[-1]].mean())
        out.append(Line(y0 + a, y0 + b, x0 + int(cols[0]), x0 + int(cols[-1]) + 1,
                        tuple(int(v) for v in vals[counts.argmax()]), boxy=bool(edge >= 0.8 and b - a >= 12)))
    return out


def segments(img: np.ndarray, line: Line, bg: Color, gap: int = 24) -> list[Line]:
    """Split a line into pieces separated by more than ``gap`` blank columns (brand | nav links)."""
    mask = _ink(img[line.top:line.bottom, line.left:line.right], bg)
    out = []
    for a, b in _clusters(mask.any(axis=0), gap):
        rows = np.nonzero(mask[:, a:b].any(axis=1))[0]
        out.append(Line(line.top + int(rows[0]), line.top + int(rows[-1]) + 1, line.left + a, line.left + b, line.color))
    return out


def font_px(line_h: int, text: str) -> int:
    """Font size from the ink height of one line of ``text`` (generic sans metrics)."""
    top = TOP_ASC if any(c in ASC_CHARS for c in text) else TOP_X
    bot = BOT_DESC if any(c in DESC_CHARS for c in text) else (BOT_PAREN if any(c in "()$,;" for c in text) else 0.0)
    return max(8, int(round(line_h / (top + bot))))


def ink_offset(px: int, text: str, lh: float) -> float:
    """Distance from a line box's top to the first ink row, for font size px and line height lh."""
    top = TOP_ASC if any(c in ASC_CHARS for c in text) else TOP_X
    return (lh - (ASCENT + DESCENT) * px) / 2 + (ASCENT - top) * px


@dataclass
class Band:
    top: int
    bottom: int
    color: Color


def bands(img: np.ndarray) -> list[Band]:
    """Colour bands down the left edge (x = 1), runs shorter than 3 px merged into neighbours."""
    runs = _runs(img[:, 1], min_len=3)
    out: list[Band] = []
    for a, b, c in runs:
        if out and out[-1].color == c:
            out[-1].bottom = b
        elif out and a > out[-1].bottom:   # a skipped short run: extend the previous band
            out[-1].bottom = a
            out.append(Band(a, b, c))
        else:
            out.append(Band(a, b, c))
    return out


def _dark(c: Color) -> bool:
    return sum(c) < 200


@dataclass
class PageMeasure:
    width: int
    height: int
    header: Band
    header_lines: list[Line]
    body_bg: Color
    hero: Band | None
    hero_lines: list[Line]
    footer: Band | None
    footer_lines: list[Line]
    content_top: int
    content_bottom: int


def measure_page(img: np.ndarray, with_hero: bool) -> PageMeasure:
    h, w = img.shape[:2]
    bs = bands(img)
    header = bs[0]
    rest = bs[1:]
    hero = rest[0] if with_hero and len(rest) >= 3 else None
    after = rest[1:] if hero else rest
    footer = next((b for b in reversed(after) if _dark(b.color) and b.bottom - b.top >= 16), None)
    body_bg = after[0].color if after else (250, 250, 250)
    content_top = hero.bottom if hero else header.bottom
    content_bottom = footer.top if footer else h
    return PageMeasure(
        w, h, header, text_lines(img, header.top, header.bottom, 0, w, header.color), body_bg, hero,
        text_lines(img, hero.top, hero.bottom, 0, w, hero.color) if hero else [], footer,
        text_lines(img, footer.top, footer.bottom, 0, w, footer.color) if footer else [], content_top, content_bottom)


@dataclass
class Card:
    left: int
    right: int
    top: int
    bottom: int
    border: Color
    fill: Color
    swatch: Color | None
    swatch_top: int
    swatch_h: int
    lines: list[Line]


def find_cards(img: np.ndarray, y0: int, y1: int, bg: Color) -> list[Card]:
    """Bordered boxes in [y0, y1): rows of boxes found from the first ink row, box by box."""
    cards: list[Card] = []
    y = y0
    while y < y1 - 12:
        hits = np.nonzero(_ink(img[y:y1], bg, thr=6).any(axis=1))[0]
        if len(hits) == 0:
            break
        top = y + int(hits[0])
        probe = min(top + 12, y1 - 1)                     # below a rounded corner
        xs = [(a, b) for a, b in _clusters(_ink(img[probe][None], bg, thr=6)[0], 0) if b - a > 20]
        if not xs:
            break
        bottom = top + 1
        for a, b in xs:
            border = tuple(int(v) for v in img[probe, a])
            col = _ink(img[top:y1, min(a + 12, b - 1)][None], bg, thr=6)[0]
            bot = top + (int(np.argmin(col)) if not col.all() else len(col))
            bottom = max(bottom, bot)
            fill = tuple(int(v) for v in img[probe, min(a + 3, b - 1)])
            col_in = _runs(img[top + 1:bot, (a + b) // 2])
            sw = next(((s, e, cc) for s, e, cc in col_in if cc != fill and cc != border and e - s >= 12), None)
            swatch, st, sh = (sw[2], top + 1 + sw[0], sw[1] - sw[0]) if sw else (None, top, 0)
            lines = text_lines(img, (st + sh) if sw else top + 2, bot - 2, a + 2, b - 2, fill)
            cards.append(Card(a, b, top, bot, border, fill, swatch, st, sh, lines))
        y = bottom + 1
    return cards


def _gaps(cards: list[Card]) -> tuple[int, int, int]:
    """(columns, column gap, row gap) of a card grid."""
    first_top = cards[0].top
    row0 = [c for c in cards if c.top == first_top]
    cols = len(row0)
    gap = row0[1].left - row0[0].right if cols > 1 else 20
    tops = sorted({c.top for c in cards})
    rgap = tops[1] - max(c.bottom for c in cards if c.top == tops[0]) if len(tops) > 1 else gap
    return cols, gap, rgap


# ---------------------------------------------------------------- styles per viewport
Rules = dict[str, dict[str, str]]          # selector -> {property: value}
GENERIC = {"primary": (47, 62, 92), "accent": (238, 241, 246), "bg": (255, 255, 255), "footer": (34, 34, 34),
           "footer_fg": (238, 238, 238), "border": (221, 221, 221), "card": (255, 255, 255), "muted": (118, 118, 118)}


def _px(x: float) -> str:
    return f"{int(round(x))}px"


def _lh(px: int) -> int:
    return int(round(1.2 * px))


def _merge_wrapped(lines: list[Line]) -> list[list[Line]]:
    """Group consecutive lines of one colour whose vertical gap is small (a wrapped paragraph)."""
    groups: list[list[Line]] = []
    for ln in lines:
        if groups:
            prev = groups[-1][-1]
            if (ln.color == prev.color and not ln.boxy and not prev.boxy and ln.top - prev.bottom <= max(3, 0.3 * prev.h)
                    and abs(ln.h - prev.h) <= 0.35 * max(ln.h, prev.h) + 2):
                groups[-1].append(ln)
                continue
        groups.append([ln])
    return groups


def _text_rule(group: list[Line], text: str, y_ref: float, x_ref: float, bold: bool = False) -> tuple[dict[str, str], float]:
    """CSS for a text block placed at a measured group of ink lines; returns (rule, bottom of its box)."""
    first = group[0]
    px = font_px(first.h, text if len(group) == 1 else text[: max(1, len(text) // len(group))])
    lh = (group[1].top - group[0].top) if len(group) > 1 else _lh(px)
    top = first.top - ink_offset(px, text, lh)
    rule = {"font-size": _px(px), "line-height": _px(lh), "margin": f"{_px(top - y_ref)} 0 0 {_px(first.left - 1 - x_ref)}",
            "color": hexc(first.color), "font-weight": "bold" if bold else "normal"}
    return rule, top + lh * len(group)


class StyleBook:
    """Per-viewport CSS rules; emitted as one media range per prototype width."""

    def __init__(self, widths: dict[str, int]):
        self.widths = widths
        self.rules: dict[str, Rules] = {v: {} for v in widths}

    def add(self, view: str, sel: str, **props: str) -> None:
        self.rules[view].setdefault(sel, {}).update({k.replace("_", "-"): v for k, v in props.items()})

    def css(self) -> str:
        order = sorted(self.widths, key=lambda v: self.widths[v])
        ws = [self.widths[v] for v in order]
        bounds = [(ws[i - 1] + ws[i]) // 2 if i else 0 for i in range(len(ws))]
        out = []
        for i, v in enumerate(order):
            lo = bounds[i]
            hi = bounds[i + 1] - 1 if i + 1 < len(order) else None
            q = " and ".join(([f"(min-width:{lo}px)"] if lo else []) + ([f"(max-width:{hi}px)"] if hi else []))
            body = "".join(f"{sel}{{{';'.join(f'{k}:{val}' for k, val in props.items())}}}"
                           for sel, props in self.rules[v].items())
            out.append(f"@media {q}{{{body}}}" if q else body)
        return "\n".join(out)


def _views(req: Request, page: str) -> dict[str, np.ndarray]:
    return {v: req.images[f"{page}_{v}"] for v in VIEW_ORDER if f"{page}_{v}" in req.images}


def style_chrome(book: StyleBook, view: str, img: np.ndarray, pm: PageMeasure, copy: dict[str, Any]) -> None:
    """Header and footer of one viewport."""
    w = pm.width
    hdr = pm.header
    book.add(view, ".top", height=_px(hdr.bottom - hdr.top), background=hexc(hdr.color))
    rows = pm.header_lines
    brand = copy.get("site_name", "")
    nav_text = " ".join(copy.get("nav", []))
    if len(rows) >= 2:          # stacked: brand line above the nav line
        b, n = rows[0], rows[1]
        pb = font_px(b.h, brand)
        pn = font_px(n.h, nav_text)
        tb = b.top - ink_offset(pb, brand, _lh(pb))
        tn = n.top - ink_offset(pn, nav_text, _lh(pn))
        book.add(view, ".top", display="block", padding=f"{_px(tb)} 0 0 {_px(b.left - 2)}")
        book.add(view, ".brand", font_size=_px(pb), line_height=_px(_lh(pb)), color=hexc(b.color))
        book.add(view, ".nav", margin_top=_px(tn - tb - _lh(pb)), font_size=_px(pn), line_height=_px(_lh(pn)))
        book.add(view, ".nav a", margin="0 14px 0 0", color=hexc(n.color))
    elif rows:
        segs = segments(img, rows[0], hdr.color)
        b, n = segs[0], segs[-1] if len(segs) > 1 else None
        pb = font_px(b.h, brand)
        book.add(view, ".top", display="flex", align_items="center", justify_content="space-between",
                 padding=f"0 {_px(w - n.right - 1) if n else '16px'} 0 {_px(b.left - 2)}")
        book.add(view, ".brand", font_size=_px(pb), line_height=_px(_lh(pb)), color=hexc(b.color))
        if n is not None:
            pn = font_px(n.h, nav_text)
            k = max(1, len(copy.get("nav", [])))
            # spacing between links from the nav's ink width (an estimate: 0.55 em per glyph)
            est = 0.55 * pn * len(nav_text.replace(" ", ""))
            gap = max(4, (n.right - n.left - est) / max(1, k - 1)) if k > 1 else 0
            book.add(view, ".nav", font_size=_px(pn), line_height=_px(_lh(pn)))
            book.add(view, ".nav a", margin=f"0 0 0 {_px(gap)}", color=hexc(n.color))
            book.add(view, ".nav a:first-child", margin="0")
    if pm.footer is not None:
        f = pm.footer
        book.add(view, "footer", height=_px(f.bottom - f.top), background=hexc(f.color), display="flex", align_items="center")
        if pm.footer_lines:
            ln = pm.footer_lines[0]
            pf = font_px(ln.h, copy.get("footer", ""))
            book.add(view, "footer", padding=f"0 0 0 {_px(ln.left - 1)}", font_size=_px(pf), line_height=_px(_lh(pf)),
                     color=hexc(ln.color))
    book.add(view, "body", background=hexc(pm.body_bg))


def style_hero_grid(book: StyleBook, view: str, img: np.ndarray, pm: PageMeasure, copy: dict[str, Any]) -> None:
    if pm.hero is not None:
        hero = pm.hero
        book.add(view, ".hero", height=_px(hero.bottom - hero.top), background=hexc(hero.color), padding="0",
                 overflow="hidden")
        groups = _merge_wrapped(pm.hero_lines)
        y = float(hero.top)
        for sel, text, group, bold in zip((".hero h1", ".hero p"), (copy.get("hero_title", ""), copy.get("hero_text", "")),
                                          groups, (True, False)):
            rule, y = _text_rule(group, text, y, 0, bold)
            book.add(view, sel, **{k.replace("-", "_"): v for k, v in rule.items()})
    cards = find_cards(img, pm.content_top, pm.content_bottom, pm.body_bg)
    if not cards:
        return
    cols, gap, rgap = _gaps(cards)
    c0 = cards[0]
    last = max(c.bottom for c in cards)
    book.add(view, ".grid", display="grid", grid_template_columns=f"repeat({cols},1fr)", column_gap=_px(gap),
             row_gap=_px(rgap), padding=f"{_px(c0.top - pm.content_top)} {_px(pm.width - max(c.right for c in cards))} "
                                         f"{_px(pm.content_bottom - last)} {_px(c0.left)}")
    # corner radius: how far along the top edge the border colour starts
    edge = img[c0.top, c0.left:c0.left + 20]
    radius = next((i for i in range(len(edge)) if tuple(int(v) for v in edge[i]) == c0.border), 0)
    book.add(view, ".card", height=_px(c0.bottom - c0.top), border=f"1px solid {hexc(c0.border)}",
             border_radius=_px(radius * 1.7), background=hexc(c0.fill), padding=f"{_px(c0.swatch_top - c0.top - 1)} "
             f"{_px(c0.swatch_top - c0.top - 1)}", box_sizing="border-box")
    book.add(view, ".sw", height=_px(c0.swatch_h), border_radius=_px(radius * 1.7))
    y = float(c0.swatch_top + c0.swatch_h)
    names = copy.get("items") or [{"name": "Item", "price": "$1.00"}]
    texts = [names[0]["name"], names[0]["price"], "Add to cart"]
    for sel, text, ln, bold in zip((".card h3", ".card .pr", ".card button"), texts, c0.lines, (True, True, False)):
        if sel == ".card button":
            inner = text_lines(img, ln.top + 2, ln.bottom - 2, ln.left + 2, ln.right - 2, ln.color)
            pf = font_px(inner[0].h, text) if inner else 13
            book.add(view, sel, width=_px(ln.right - ln.left), height=_px(ln.bottom - ln.top), background=hexc(ln.color),
                     color="#fff", border="0", font_size=_px(pf), margin=f"{_px(ln.top - y)} 0 0 0", padding="0",
                     border_radius=_px(radius * 1.7), display="block")
            y = ln.bottom
            continue
        rule, y = _text_rule([ln], text, y, c0.swatch_top - c0.top - 1 + c0.left + 1, bold)
        book.add(view, sel, **{k.replace("-", "_"): v for k, v in rule.items()})
    for i, c in enumerate(cards):
        if c.swatch is not None:
            book.add(view, f".c{i} .sw", background=hexc(c.swatch))


def _row_like(g: list[Line], left: int, width: int) -> bool:
    return g[0].right - g[0].left >= 0.8 * (width - 2 * left) and len(g) == 1


def style_panel(book: StyleBook, view: str, img: np.ndarray, pm: PageMeasure, page: str,
                kinds: list[tuple[str, str, str]]) -> None:
    """A content page as a vertical list of measured blocks: (selector, kind text|box|button|rows, text).
    ``rows`` consumes every consecutive full-width group (list rows); its selector is "first|next"."""
    lines = text_lines(img, pm.content_top, pm.content_bottom, 0, pm.width, pm.body_bg)
    groups = _merge_wrapped(lines)
    y = float(pm.content_top)
    left = min((g[0].left for g in groups), default=16)
    book.add(view, f".pg-{page}", padding=f"0 {_px(left)}", min_height=_px(pm.content_bottom - pm.content_top),
             box_sizing="border-box", overflow="hidden")
    gi = 0
    for sel, kind, text in kinds:
        if gi >= len(groups):
            break
        group = groups[gi]
        ln = group[0]
        gi += 1
        full = f".pg-{page} {sel}"
        if kind == "text":
            rule, y = _text_rule(group, text, y, left, bold=sel.startswith("h"))
            book.add(view, full, **{k.replace("-", "_"): v for k, v in rule.items()})
        elif kind in ("box", "button"):
            extra = {"background": hexc(ln.color), "color": "#fff", "border": "0"} if kind == "button" else {
                "border": f"1px solid {hexc(ln.color)}"}
            inner = text_lines(img, ln.top + 2, ln.bottom - 2, ln.left + 2, ln.right - 2, ln.color) if kind == "button" else []
            pf = font_px(inner[0].h, text) if inner else 15
            book.add(view, full, display="block", box_sizing="border-box", width=_px(ln.right - ln.left),
                     height=_px(ln.bottom - ln.top), margin=f"{_px(ln.top - y)} 0 0 {_px(ln.left - left)}", padding="0 6px",
                     font_size=_px(pf), border_radius=_px(4 if kind == "button" else 0), **extra)
            y = ln.bottom
        elif kind == "rows":
            first_sel, next_sel = sel.split("|")
            rows = [group]
            while gi < len(groups) and _row_like(groups[gi], left, pm.width) and _row_like(group, left, pm.width):
                rows.append(groups[gi])
                gi += 1
            h = ln.bottom - ln.top
            book.add(view, f".pg-{page} {first_sel}", margin_top=_px(ln.top - y))
            if len(rows) > 1:
                book.add(view, f".pg-{page} {next_sel}", margin_top=_px(rows[1][0].top - ln.bottom))
            book.add(view, f".pg-{page} .row", min_height=_px(h), display="flex", justify_content="space-between",
                     align_items="center", border_bottom=f"1px solid {hexc(GENERIC['border'])}", box_sizing="border-box")
            book.add(view, f".pg-{page} .row button", background=hexc(ln.color), color="#fff", border="0",
                     padding="8px 14px", border_radius="4px", font_size="15px")
            y = rows[-1][0].bottom


# ---------------------------------------------------------------- generic (template) style
def style_generic(book: StyleBook, pages: list[str]) -> None:
    g = GENERIC
    for view, w in book.widths.items():
        small, mid = w < 600, w < 1000
        pad = 16 if small else 24
        book.add(view, "body", background=hexc(g["bg"]))
        book.add(view, ".top", background=hexc(g["primary"]), display="block" if small else "flex",
                 justify_content="space-between", align_items="center", padding=f"14px {pad}px")
        book.add(view, ".brand", font_size="24px", line_height="30px", color="#fff", font_weight="bold")
        book.add(view, ".nav", font_size="16px", line_height="22px")
        book.add(view, ".nav a", margin="0 0 0 16px", color="#fff")
        book.add(view, ".hero", background=hexc(g["accent"]), padding=f"40px {pad}px")
        book.add(view, ".hero h1", font_size="28px" if small else "36px", line_height="1.2", margin="0 0 8px",
                 color=hexc(g["primary"]), font_weight="bold")
        book.add(view, ".hero p", font_size="16px", margin="0", color="#222")
        book.add(view, ".grid", display="grid", grid_template_columns=f"repeat({1 if small else 2 if mid else 3},1fr)",
                 gap="20px", padding=f"{pad}px")
        book.add(view, ".card", border=f"1px solid {hexc(g['border'])}", border_radius="6px", padding="14px",
                 background="#fff")
        book.add(view, ".sw", height="80px", border_radius="6px", background="#ccd")
        book.add(view, ".card h3", font_size="18px", margin="10px 0 4px", font_weight="bold")
        book.add(view, ".card .pr", font_size="16px", color=hexc(g["primary"]), font_weight="bold")
        book.add(view, ".card button", margin_top="8px", background=hexc(g["primary"]), color="#fff", border="0",
                 padding="8px 14px", border_radius="6px", font_size="15px")
        book.add(view, "footer", background=hexc(g["footer"]), color=hexc(g["footer_fg"]), padding=f"20px {pad}px",
                 font_size="14px")
        for p in pages:
            book.add(view, f".pg-{p}", padding=f"{pad}px")
            book.add(view, f".pg-{p} h2", font_size="24px", margin="0 0 12px")
            book.add(view, f".pg-{p} input", display="block", margin="6px 0", padding="6px", width="240px")
            book.add(view, f".pg-{p} button", background=hexc(g["primary"]), color="#fff", border="0",
                     padding="8px 14px", border_radius="6px", margin="6px 0")
            book.add(view, f".pg-{p} .row", display="flex", justify_content="space-between", padding="10px 0",
                     border_bottom=f"1px solid {hexc(g['border'])}")


# ---------------------------------------------------------------- reading the workflow
def testids(workflow: list[dict[str, Any]]) -> list[str]:
    found: list[str] = []
    for wf in workflow:
        for case in wf.get("content", []):
            for step in case.get("actions", []) + case.get("validations", []):
                for t in re.findall(r"data-testid=\"?([A-Za-z0-9_-]+)", str(step.get("selector", ""))):
                    if t not in found:
                        found.append(t)
    return found


def pick(ids: list[str], *words: str, default: str) -> str:
    """The first test id containing every word (the workflow's name for a role), else the default."""
    return next((t for t in ids if all(w in t for w in words)), default)


def routes(workflow: list[dict[str, Any]]) -> dict[str, str]:
    """nav test id -> hash route, from 'click nav-x' followed by a url_contains validation."""
    out: dict[str, str] = {}
    for wf in workflow:
        for case in wf.get("content", []):
            clicks = [re.findall(r"data-testid=\"?([A-Za-z0-9_-]+)", a.get("selector", "")) for a in case.get("actions", [])
                      if a.get("op") == "click"]
            urls = [v["value"] for v in case.get("validations", []) if v.get("op") == "url_contains"]
            if clicks and clicks[-1] and urls:
                out[clicks[-1][0]] = urls[0]
    return out


def _esc(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


BASE_CSS = ("*{box-sizing:border-box}body{margin:0;font-family:sans-serif;color:#222}h1,h2,h3,p{margin:0}"
            "a{text-decoration:none;color:inherit}.brand{font-weight:bold}button{cursor:pointer}"
            ".hero,.card,[class^=pg-]{display:flow-root}[hidden]{display:none!important}")


def _page_html(title: str, css: str, nav: str, main: str, footer: str, script: str = "") -> str:
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,'
            f' initial-scale=1"><title>{_esc(title)}</title><style>{BASE_CSS}\n{css}</style></head><body>'
            f'<header class="top"><div class="brand">{_esc(title)}</div><nav class="nav">{nav}</nav></header>'
            f'<main id="view">{main}</main><footer>{_esc(footer)}</footer><script>{script}</script></body></html>\n')


def _hero_grid_html(copy: dict[str, Any], add_prefix: str | None) -> str:
    cards = []
    for i, it in enumerate(copy.get("items", [])):
        btn = (f'<button data-testid="{add_prefix}-{i}" onclick="addItem({i})">Add to cart</button>' if add_prefix else "")
        cards.append(f'<div class="card c{i}"><div class="sw"></div><h3>{_esc(it["name"])}</h3>'
                     f'<div class="pr">{_esc(it["price"])}</div>{btn}</div>')
    return (f'<section class="hero"><h1>{_esc(copy.get("hero_title", ""))}</h1><p>{_esc(copy.get("hero_text", ""))}</p>'
            f'</section><div class="grid">{"".join(cards)}</div>')


# ---------------------------------------------------------------- the three archetypes
def _book(req: Request, pages: dict[str, tuple[bool, list[tuple[str, str, str]] | None]], infer: bool) -> StyleBook:
    """Styles for every page: pages = name -> (has hero + grid, panel kinds or None)."""
    first = next(iter(pages))
    widths = {v: img.shape[1] for v, img in _views(req, first).items()} or {"desktop": 1280}
    book = StyleBook(widths)
    if not infer:
        style_generic(book, [p for p, (_, kinds) in pages.items() if kinds])
        return book
    for page, (hero, kinds) in pages.items():
        for view, img in _views(req, page).items():
            if view not in widths:
                continue
            try:
                pm = measure_page(img, with_hero=hero)
                if page == first:
                    style_chrome(book, view, img, pm, req.copy)
                if hero:
                    style_hero_grid(book, view, img, pm, req.copy)
                elif kinds:
                    style_panel(book, view, img, pm, page, kinds)
            except (IndexError, ValueError, ZeroDivisionError):   # a measurement failed: keep what was set
                continue
    return book


def build_l1(req: Request, infer: bool) -> dict[str, str]:
    nav = "".join(f'<a href="#">{_esc(t)}</a>' for t in req.copy.get("nav", ["Home"]))
    book = _book(req, {"home": (True, None)}, infer)
    html = _page_html(req.copy.get("site_name", "Site"), book.css(), nav, _hero_grid_html(req.copy, None),
                      req.copy.get("footer", ""))
    return {"index.html": html}


def build_l2(req: Request, infer: bool) -> dict[str, str]:
    ids = testids(req.workflow)
    rt = routes(req.workflow)
    n_home, n_about, n_cart = (pick(ids, "nav", k, default=f"nav-{k}") for k in ("home", "about", "cart"))
    count = pick(ids, "count", default="cart-count")
    add = pick(ids, "add", default="add-0").rsplit("-", 1)[0]
    remove = pick(ids, "remove", default="remove-0").rsplit("-", 1)[0]
    row, total = pick(ids, "row", default="cart-row"), pick(ids, "total", default="cart-total")
    about_t = pick(ids, "about", "title", default="about-title")
    r_about = rt.get(n_about, "#/about")
    r_cart = rt.get(n_cart, "#/cart")
    labels = req.copy.get("nav") or ["Home", "About", "Cart"]
    nav = (f'<a data-testid="{n_home}" href="#/">{_esc(labels[0])}</a><a data-testid="{n_about}" href="{r_about}">'
           f'{_esc(labels[1] if len(labels) > 1 else "About")}</a><a data-testid="{n_cart}" href="{r_cart}">Cart '
           f'(<span data-testid="{count}">0</span>)</a>')
    panels = {"home": (True, None),
              "about": (False, [("h2", "text", req.copy.get("about_title", "")), ("p", "text", req.copy.get("about_text", ""))]),
              "cart": (False, [("h2", "text", "Your cart"), ("h2 + .row|.row + .row", "rows", ""),
                               ("p.total", "text", "Total: $0.00")])}
    book = _book(req, panels, infer)
    items = [{"name": it["name"], "price": float(it["price"].lstrip("$") or 0)} for it in req.copy.get("items", [])]
    home = json.dumps(_hero_grid_html(req.copy, add))
    about = json.dumps(f'<section class="pg-about"><h2 data-testid="{about_t}">{_esc(req.copy.get("about_title", ""))}</h2>'
                       f'<p>{_esc(req.copy.get("about_text", ""))}</p></section>')
    script = f"""
const ITEMS={json.dumps(items)}; const cart=[];
const money=v=>'$'+(Math.round(v*100)/100).toFixed(2);
function addItem(i){{cart.push(i); show();}}
function removeItem(i){{const k=cart.indexOf(i); if(k>=0) cart.splice(k,1); show();}}
function cartView(){{
  const rows=cart.map(i=>'<div class="row" data-testid="{row}"><span>'+ITEMS[i].name+'</span><span>'+money(ITEMS[i].price)+
    '</span><button data-testid="{remove}-'+i+'" onclick="removeItem('+i+')">Remove</button></div>').join('');
  const sum=cart.reduce((s,i)=>s+ITEMS[i].price,0);
  return '<section class="pg-cart"><h2>Your cart</h2>'+rows+'<p class="total" data-testid="{total}">Total: '+money(sum)+'</p></section>';
}}
function show(){{
  document.querySelector('[data-testid={count}]').textContent=String(cart.length);
  const h=location.hash||'#/'; const v=document.getElementById('view');
  if(h==={json.dumps(r_about)}) v.innerHTML={about};
  else if(h==={json.dumps(r_cart)}) v.innerHTML=cartView();
  else v.innerHTML={home};
}}
window.addEventListener('hashchange',show); show();
"""
    html = _page_html(req.copy.get("site_name", "Shop"), book.css(), nav, "", req.copy.get("footer", ""), script)
    return {"index.html": html}


SERVER = r'''"""Notes app backend (written by the synthesis agent): stdlib HTTP + SQLite, cookie sessions."""
import argparse, hashlib, http.cookies, json, os, secrets, sqlite3, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ap = argparse.ArgumentParser()
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--db", required=True)
a = ap.parse_args()
HERE = os.path.dirname(os.path.abspath(__file__))
con = sqlite3.connect(a.db, check_same_thread=False)
con.executescript("create table if not exists account(name text primary key, salt text, hash text);"
                  "create table if not exists session(sid text primary key, name text);"
                  "create table if not exists note(id integer primary key autoincrement, owner text, title text);")
mutex = threading.Lock()


def digest(salt, pw):
    return hashlib.pbkdf2_hmac("sha256", pw.encode(), salt.encode(), 1000).hex()


class App(BaseHTTPRequestHandler):
    def log_message(self, *x):
        pass

    def reply(self, code, obj=None, cookie=None, body=None, ctype="application/json"):
        data = body if body is not None else json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        if cookie is not None:
            self.send_header("Set-Cookie", cookie)
        self.end_headers()
        self.wfile.write(data)

    def who(self):
        c = http.cookies.SimpleCookie(self.headers.get("Cookie", ""))
        sid = c["sid"].value if "sid" in c else ""
        row = con.execute("select name from session where sid=?", (sid,)).fetchone()
        return (row[0] if row else None), sid

    def payload(self):
        n = int(self.headers.get("Content-Length") or 0)
        try:
            return json.loads(self.rfile.read(n) or b"{}")
        except ValueError:
            return {}

    def login(self, name):
        sid = secrets.token_urlsafe(18)
        con.execute("insert into session values(?,?)", (sid, name))
        con.commit()
        return self.reply(200, {"user": name}, cookie=f"sid={sid}; Path=/; HttpOnly; SameSite=Lax")

    def do_GET(self):
        with mutex:
            user, _ = self.who()
            if self.path == "/api/me":
                return self.reply(200, {"user": user}) if user else self.reply(401, {"error": "anonymous"})
            if self.path == "/api/notes":
                if not user:
                    return self.reply(401, {"error": "anonymous"})
                rows = con.execute("select id, title from note where owner=? order by id", (user,)).fetchall()
                return self.reply(200, [{"id": i, "title": t} for i, t in rows])
        if self.path in ("/", "/index.html"):
            with open(os.path.join(HERE, "index.html"), "rb") as fh:
                return self.reply(200, body=fh.read(), ctype="text/html; charset=utf-8")
        return self.reply(404, {"error": "not found"})

    def do_POST(self):
        data = self.payload()
        with mutex:
            if self.path in ("/api/register", "/api/login"):
                name, pw = str(data.get("user", "")).strip(), str(data.get("password", ""))
                if not name or not pw:
                    return self.reply(400, {"error": "user and password required"})
                row = con.execute("select salt, hash from account where name=?", (name,)).fetchone()
                if self.path == "/api/register":
                    if row:
                        return self.reply(409, {"error": "taken"})
                    salt = secrets.token_hex(8)
                    con.execute("insert into account values(?,?,?)", (name, salt, digest(salt, pw)))
                    return self.login(name)
                if not row or digest(row[0], pw) != row[1]:
                    return self.reply(401, {"error": "wrong user or password"})
                return self.login(name)
            user, sid = self.who()
            if self.path == "/api/logout":
                con.execute("delete from session where sid=?", (sid,))
                con.commit()
                return self.reply(200, {"ok": True}, cookie="sid=; Path=/; Max-Age=0")
            if self.path == "/api/notes" and user:
                con.execute("insert into note(owner, title) values(?,?)", (user, str(data.get("title", ""))[:500]))
                con.commit()
                return self.reply(201, {"ok": True})
        return self.reply(401 if self.path == "/api/notes" else 404, {"error": "no"})

    def do_DELETE(self):
        with mutex:
            user, _ = self.who()
            tail = self.path.rsplit("/", 1)[-1]
            if user and self.path.startswith("/api/notes/") and tail.isdigit():
                con.execute("delete from note where id=? and owner=?", (int(tail), user))
                con.commit()
                return self.reply(200, {"ok": True})
        return self.reply(404, {"error": "no"})


ThreadingHTTPServer(("127.0.0.1", a.port), App).serve_forever()
'''


def build_l3(req: Request, infer: bool) -> dict[str, str]:
    ids = testids(req.workflow)
    t = {k: pick(ids, *k.split("-"), default=k) for k in (
        "register-user", "register-pass", "register-submit", "login-user", "login-pass", "login-submit", "welcome",
        "new-title", "new-submit", "items", "item-row", "delete", "logout", "login-form", "auth-error")}
    t["items"] = next((x for x in ids if x == "items"), "items")
    login_kinds = [("h2.t1", "text", "Create an account"), ("input.u1", "box", ""), ("input.p1", "box", ""),
                   ("button.b1", "button", "Register"), ("h2.t2", "text", "Log in"), ("input.u2", "box", ""),
                   ("input.p2", "box", ""), ("button.b2", "button", "Log in")]
    board_kinds = [("h2", "text", "Welcome, user"), ("p", "text", req.copy.get("hero_text", "")),
                   ("input", "box", ""), ("button.add", "button", "Add note"),
                   (".items .row:first-child|.items .row + .row", "rows", ""), ("button.out", "button", "Log out")]
    book = _book(req, {"login": (False, login_kinds), "board": (False, board_kinds)}, infer)
    nav = "".join(f'<a href="#">{_esc(x)}</a>' for x in req.copy.get("nav", ["Notes"]))
    main = (f'<section class="pg-login" id="auth" data-testid="{t["login-form"]}">'
            f'<h2 class="t1">Create an account</h2><form id="reg"><input class="u1" data-testid="{t["register-user"]}" '
            f'placeholder="user"><input class="p1" data-testid="{t["register-pass"]}" type="password" placeholder="password">'
            f'<button class="b1" data-testid="{t["register-submit"]}">Register</button></form>'
            f'<h2 class="t2">Log in</h2><form id="log"><input class="u2" data-testid="{t["login-user"]}" placeholder="user">'
            f'<input class="p2" data-testid="{t["login-pass"]}" type="password" placeholder="password">'
            f'<button class="b2" data-testid="{t["login-submit"]}">Log in</button></form>'
            f'<p class="err" data-testid="{t["auth-error"]}"></p></section>'
            f'<section class="pg-board" id="board" hidden><h2 data-testid="{t["welcome"]}"></h2>'
            f'<p>{_esc(req.copy.get("hero_text", ""))}</p><form id="new"><input data-testid="{t["new-title"]}" '
            f'placeholder="new note"><button class="add" data-testid="{t["new-submit"]}">Add note</button></form>'
            f'<div class="items" data-testid="{t["items"]}"></div>'
            f'<button class="out" data-testid="{t["logout"]}">Log out</button></section>')
    script = f"""
const $=s=>document.querySelector(s);
const esc=s=>s.replace(/[&<>"]/g,c=>({{'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}}[c]));
async function call(method,path,body){{
  const r=await fetch(path,{{method,headers:{{'Content-Type':'application/json'}},body:body?JSON.stringify(body):undefined}});
  const d=await r.json().catch(()=>({{}})); if(!r.ok) throw new Error(d.error||r.status); return d;}}
async function enter(user){{$('#auth').hidden=true; $('#board').hidden=false;
  $('[data-testid={t["welcome"]}]').textContent='Welcome, '+user; await load();}}
async function load(){{let notes=[]; try{{notes=await call('GET','/api/notes');}}catch(e){{}}
  $('[data-testid={t["items"]}]').innerHTML=notes.map(n=>'<div class="row" data-testid="{t["item-row"]}"><span>'+esc(n.title)+
  '</span><button data-testid="{t["delete"]}" data-id="'+n.id+'">Delete</button></div>').join('');}}
async function auth(kind,u,p){{try{{const d=await call('POST','/api/'+kind,{{user:$(u).value,password:$(p).value}});
  $('.err').textContent=''; await enter(d.user);}}catch(e){{$('.err').textContent=String(e.message);}}}}
$('#reg').addEventListener('submit',e=>{{e.preventDefault(); auth('register','.u1','.p1');}});
$('#log').addEventListener('submit',e=>{{e.preventDefault(); auth('login','.u2','.p2');}});
$('#new').addEventListener('submit',async e=>{{e.preventDefault(); const i=$('[data-testid={t["new-title"]}]');
  try{{await call('POST','/api/notes',{{title:i.value}});}}catch(err){{}} i.value=''; await load();}});
$('[data-testid={t["items"]}]').addEventListener('click',async e=>{{const id=e.target.dataset.id; if(!id) return;
  try{{await call('DELETE','/api/notes/'+id);}}catch(err){{}} await load();}});
$('[data-testid={t["logout"]}]').addEventListener('click',async()=>{{try{{await call('POST','/api/logout');}}catch(e){{}}
  $('#board').hidden=true; $('#auth').hidden=false;}});
call('GET','/api/me').then(d=>enter(d.user)).catch(()=>{{}});
"""
    html = _page_html(req.copy.get("site_name", "Notes"), book.css(), nav, main, req.copy.get("footer", ""), script)
    start = {"command": ["{python}", "server.py", "--port", "{port}", "--db", "{tmp}/notes.db"], "ready_timeout_s": 15,
             "ready_path": "/"}
    return {"index.html": html, "server.py": SERVER, "start.json": json.dumps(start, indent=1)}


def archetype(req: Request) -> str:
    ids = testids(req.workflow)
    if any("register" in t or "login" in t for t in ids) or "registration" in req.prompt.lower():
        return "L3"
    if not ids:
        return "L1"
    return "L2"


class SynthesisModel:
    """messages -> reply with ```file:``` blocks (the model behind the loopback OpenAI endpoint)."""

    def __init__(self, mode: str = "infer"):
        if mode not in ("infer", "template"):
            raise ValueError("mode must be infer or template")
        self.mode = mode

    def __call__(self, messages: list[dict[str, Any]]) -> str:
        req = parse_request(messages)
        kind = archetype(req)
        files = {"L1": build_l1, "L2": build_l2, "L3": build_l3}[kind](req, self.mode == "infer")
        return "".join(f"```file:{name}\n{body}```\n" for name, body in files.items())
