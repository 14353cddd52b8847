"""Figure hygiene shared by every report: a legend never hides data.

``clear_legends(fig)`` draws the figure once, and for each axes whose legend box overlaps what the axes
draws (bars, points along lines, scatter markers, filled areas, error bars), re-creates that legend outside
the axes to the right (same handles, labels, title and columns). ``Report.figure`` calls it before saving,
with ``bbox_inches="tight"`` so the moved legend is kept in the image.
"""
from __future__ import annotations

import numpy as np

_LINE_SAMPLES = 24      # points per line segment checked against the legend box (a line may cross it between data)


def _data_shapes(ax, renderer) -> list[tuple[str, np.ndarray]]:
    """What the axes draws, in display space: ("box", [[x0, y0], [x1, y1]]) or ("points", (n, 2))."""
    from matplotlib.collections import Collection
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    out: list[tuple[str, np.ndarray]] = []
    for artist in ax.get_children():
        if not artist.get_visible() or artist is ax.patch or artist is ax.get_legend():
            continue
        if isinstance(artist, Line2D):
            xy = np.asarray(artist.get_xydata(), float)
            xy = xy[np.isfinite(xy).all(axis=1)]
            if len(xy) == 0:
                continue
            if len(xy) > 1 and artist.get_linestyle() not in ("None", "", " ", "none"):
                t = np.linspace(0.0, 1.0, _LINE_SAMPLES)[:, None, None]
                xy = (xy[:-1][None] * (1 - t) + xy[1:][None] * t).reshape(-1, 2)
            out.append(("points", artist.get_transform().transform(xy)))
        elif isinstance(artist, Patch):
            bb = artist.get_window_extent(renderer)
            if bb.width > 0 or bb.height > 0:
                out.append(("box", np.array([[bb.x0, bb.y0], [bb.x1, bb.y1]])))
        elif isinstance(artist, Collection):
            offsets = np.asarray(artist.get_offsets(), float)
            if offsets.size and len(artist.get_paths()) <= 1:           # scatter: markers at offsets
                pts = artist.get_offset_transform().transform(offsets)
                out.append(("points", pts[np.isfinite(pts).all(axis=1)]))
            else:                                                         # fill_between, error bars, bar collections
                for path in artist.get_paths():
                    verts = artist.get_transform().transform(path.vertices)
                    verts = verts[np.isfinite(verts).all(axis=1)]
                    if len(verts):
                        lo, hi = verts.min(axis=0), verts.max(axis=0)   # a filled shape: its bounding box
                        out.append(("box", np.array([lo, hi])))
    return out


def _overlaps(box, shapes: list[tuple[str, np.ndarray]]) -> bool:
    x0, y0, x1, y1 = box.x0, box.y0, box.x1, box.y1
    for kind, s in shapes:
        if kind == "box":
            (a0, b0), (a1, b1) = s                                         # rectangle intersection
            if a0 < x1 and a1 > x0 and b0 < y1 and b1 > y0:
                return True
        elif ((s[:, 0] > x0) & (s[:, 0] < x1) & (s[:, 1] > y0) & (s[:, 1] < y1)).any():
            return True
    return False


def legend_hides_data(ax, renderer=None) -> bool:
    """True when the axes' legend box overlaps anything the axes draws."""
    legend = ax.get_legend()
    if legend is None or not legend.get_visible():
        return False
    renderer = renderer or ax.figure.canvas.get_renderer()
    return _overlaps(legend.get_window_extent(renderer), _data_shapes(ax, renderer))


def clear_legends(fig) -> int:
    """Move every legend that hides data outside its axes (right side, top-aligned). Returns how many moved."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    moved = 0
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is None or not legend_hides_data(ax, renderer):
            continue
        handles, texts = legend.legend_handles, [t.get_text() for t in legend.get_texts()]
        title = legend.get_title().get_text() or None
        size = texts and legend.get_texts()[0].get_fontsize()
        ax.legend(handles, texts, title=title, ncols=legend._ncols, fontsize=size or None,
                  loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, frameon=legend.get_frame_on())
        moved += 1
    return moved
