"""What every figure of a report shares: sizes, labels and the axes it draws on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ub.actors.names import checkpoint_update

SIZE = (8, 4.5)
"""A plot's size in inches (at 100 dpi: 800 x 450 pixels)."""
SIZES = {"match_matrix": (8, 7), "learner": (10, 6)}
"""The plots that need more room: square matrix cells, a 2 x 3 grid of learner panels."""

Tables = dict[str, list[dict[str, Any]]]
"""A run's (or a folder of runs') views as rows (:mod:`ub.run.folder.views`)."""


def short_name(name: str) -> str:
    """A readable label: ``ckpt-000004`` -> ``ckpt 4``; other names as they are, cut."""
    update = checkpoint_update(name)
    return f"ckpt {update}" if update is not None else (name if len(name) <= 14
                                                        else name[:13] + "…")


def pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def integer_ticks() -> Any:
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True, min_n_ticks=1)  # (one point: one tick, not 0.015s)


ROUND_AXIS = "round (0-based, as in SQL)"
"""The label of every axis of rounds: the data count rounds from 0 (``ub train``'s lines say
"round 1" for round 0)."""


def round_axis(ax: Any, **more: Any) -> None:
    """Label ``ax``'s x axis as rounds (:data:`ROUND_AXIS`), ticked at whole rounds only."""
    ax.set(xlabel=ROUND_AXIS, **more)
    ax.xaxis.set_major_locator(integer_ticks())


def note_coinciding(ax: Any) -> None:
    """Say under ``ax`` which of its labelled lines coincide (the same points): one drawn over
    another hides it, as two arms that learned alike, or two opponents never beaten, do."""
    same: dict[tuple, list[str]] = {}
    for line in ax.get_lines():
        label = line.get_label()
        if label.startswith("_") or len(line.get_xdata()) == 0:
            continue
        key = (tuple(line.get_xdata()), tuple(line.get_ydata()))
        same.setdefault(key, []).append(label)
    groups = [labels for labels in same.values() if len(labels) > 1]
    if groups:
        ax.text(0.01, 0.01, "lines on top of each other: " + "; ".join(" = ".join(g)
                                                                    for g in groups),
                transform=ax.transAxes, fontsize=6, va="bottom", ha="left", color="dimgray")


def colormap(name: str) -> Any:
    import matplotlib

    return matplotlib.colormaps[name]


def panels(fig: Any, count: int, columns: int = 3, sharey: bool = True) -> list[Any]:
    """``count`` panels side by side (up to ``columns`` a row), by default sharing the y axis:
    the same rate reads the same height in every panel."""
    rows = -(-count // columns)
    axes = fig.subplots(rows, min(count, columns), squeeze=False, sharey=sharey)
    flat = [ax for row in axes for ax in row]
    for spare in flat[count:]:
        spare.set_visible(False)
    return flat[:count]


def spread(values: Sequence[int], most: int) -> list[int]:
    """At most ``most`` of the sorted ``values``, evenly spread, the first and last kept."""
    values = sorted(values)
    if len(values) <= most:
        return values
    step = (len(values) - 1) / (most - 1)
    return sorted({values[round(i * step)] for i in range(most)})


def ranges(updates: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2, 5``."""
    out: list[str] = []
    for u in sorted(updates):
        if out and (last := out[-1].split("-")[-1]) and int(last) == u - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{u}"
        else:
            out.append(str(u))
    return ", ".join(out)


def line_style(i: int) -> dict[str, Any]:
    """The ``i``-th line's look on a shared axis: two envs with the same rate (2 tokens per
    move each) draw one on the other, so each later line is dashed with hollow markers."""
    return {"ls": ("-", "--", ":", "-.")[i % 4], "marker": ("o", "x", "s", "^")[i % 4],
            "markersize": 4 + 2 * (i % 4 > 0), "fillstyle": "full" if i % 4 == 0 else "none"}
