"""clear_legends: a legend that covers data moves outside the axes; one that covers nothing stays put.
Overlap is judged independently here from the bars' and legend's pixel boxes."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from stages.common.figures import clear_legends, legend_hides_data  # noqa: E402


def _boxes_overlap(a, b) -> bool:
    return a.x0 < b.x1 and a.x1 > b.x0 and a.y0 < b.y1 and a.y1 > b.y0


def _bars_under_legend(ax) -> int:
    r = ax.figure.canvas.get_renderer()
    leg = ax.get_legend().get_window_extent(r)
    return sum(_boxes_overlap(p.get_window_extent(r), leg) for p in ax.patches)


def test_legend_over_tall_bars_moves_outside_with_its_labels_and_title():
    fig, ax = plt.subplots(figsize=(4, 3))
    x = np.arange(4)
    ax.bar(x - 0.2, [0.9, 0.95, 0.97, 0.99], width=0.4, label="dos")
    ax.bar(x + 0.2, [0.85, 0.9, 0.96, 0.98], width=0.4, label="poison")
    ax.legend(loc="upper right", title="method")
    fig.canvas.draw()
    assert _bars_under_legend(ax) > 0 and legend_hides_data(ax)
    assert clear_legends(fig) == 1
    fig.canvas.draw()
    leg = ax.get_legend()
    assert _bars_under_legend(ax) == 0 and not legend_hides_data(ax)
    assert [t.get_text() for t in leg.get_texts()] == ["dos", "poison"] and leg.get_title().get_text() == "method"
    r = fig.canvas.get_renderer()
    assert leg.get_window_extent(r).x0 >= ax.get_window_extent(r).x1           # right of the axes
    plt.close(fig)


def test_legend_crossed_by_a_line_between_its_points_moves():
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([0.0, 10.0], [0.0, 10.0], label="diagonal")     # two points, far from the corner; the segment crosses it
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 10)
    ax.legend(loc="center")
    assert clear_legends(fig) == 1
    plt.close(fig)


def test_clear_legend_stays_and_axes_without_legend_are_untouched():
    fig, (a, b) = plt.subplots(1, 2, figsize=(6, 3))
    a.plot(np.linspace(0, 1, 30), np.linspace(0, 0.2, 30) ** 2, label="low")    # data hugs the bottom
    a.set_ylim(0, 1)
    a.legend(loc="upper left")
    b.scatter([1.5, 2.5], [3.5, 2.5])
    before = a.get_legend()
    assert clear_legends(fig) == 0 and a.get_legend() is before and b.get_legend() is None
    plt.close(fig)


def test_scatter_points_under_the_legend_count():
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.scatter([9.5, 0.5], [9.5, 0.5], label="pts")
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 10)
    ax.legend(loc="upper right")
    assert legend_hides_data(ax)
    plt.close(fig)
