"""How a run is going, round by round: move quality, entropy, response length, the learner's
own figures and where the time goes. A falling entropy or a climbing KL is read here first."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ub.report.common import (
    Tables,
    integer_ticks,
    line_style,
    note_coinciding,
    panels,
    round_axis,
)

METRIC_LABELS = {"invalid_move_rate": "invalid moves", "format_rate": "format ok",
                 "response_tokens": "tokens"}


def _collection(t: Tables, keys: tuple[str, ...], ax: Any, ylabel: str) -> bool:
    series: dict[str, dict[int, float]] = defaultdict(dict)
    for row in t["metrics"]:
        parts = row["metric"].split("/")
        if parts[0] == "collection" and len(parts) == 3 and parts[2] in keys:
            series[f"{METRIC_LABELS.get(parts[2], parts[2])} ({parts[1]})"][row["round"]] = (
                row["value"])
    for i, (label, points) in enumerate(sorted(series.items())):
        rounds = sorted(points)
        ax.plot(rounds, [points[r] for r in rounds], label=label, **line_style(i))
    round_axis(ax, ylabel=ylabel)
    note_coinciding(ax)
    return bool(series)



def _learner_points(t: Tables, key: str, transform: Any = None) -> list[tuple[int, float]]:
    return [(r["round"], r[key] if transform is None else transform(r[key]))
            for r in t["learner"] if r.get(key) is not None]


def move_quality(t: Tables, fig: Any) -> bool:
    """One panel per env (equal rates of two envs must not hide one line under the other): the
    share of the model's training decisions that were invalid moves and that were well formed;
    the learner's probability off the legal moves where a mask ran (its batch, all envs)."""
    series: dict[str, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for row in t["metrics"]:
        parts = row["metric"].split("/")
        if parts[0] == "collection" and len(parts) == 3 and parts[2] in (
                "invalid_move_rate", "format_rate"):
            series[parts[1]][METRIC_LABELS[parts[2]]][row["round"]] = row["value"]
    off = _learner_points(t, "legal_mass", lambda mass: 1 - mass)
    if not series and not off:
        return False
    envs = sorted(series) or ["all envs"]
    for ax, env in zip(panels(fig, len(envs)), envs, strict=True):
        for label, points in sorted(series.get(env, {}).items()):
            rounds = sorted(points)
            ax.plot(rounds, [points[r] for r in rounds], marker=".", label=label,
                    color="tab:red" if label == "invalid moves" else "tab:green")
        if off:  # (the mask's: what a free policy would still put on moves the game refuses)
            ax.plot(*zip(*off, strict=True), ls="--", color="black", alpha=0.6,
                    label="probability off the legal moves (learner's batch, all envs)")
        round_axis(ax, title=env, ylim=(-0.02, 1.02))
        ax.legend(fontsize=7, loc="center right")
        note_coinciding(ax)
    fig.axes[0].set_ylabel("rate of model decisions")
    fig.suptitle("Invalid-move and format rates (training games)")
    return True


def entropy(t: Tables, fig: Any) -> bool:
    """Per env, the sampler's entropy in the training games; the learner's over its batch. A
    fall towards 0 is a policy collapsing onto one move (docs/learning-log.md)."""
    ax = fig.subplots()
    drawn = _collection(t, ("entropy",), ax, "nats per completion token")
    points = _learner_points(t, "entropy_mean")
    if points:
        ax.plot(*zip(*points, strict=True), ls="--", color="black", alpha=0.6,
                label="learner (batch, all envs)")
    ax.set(ylim=(0, None), title="Policy entropy (sampled in training games, per env)")
    return drawn or bool(points)


def response_length(t: Tables, fig: Any) -> bool:
    """Tokens on the left axis, the count of truncated training sequences on its own right."""
    ax = fig.subplots()
    drawn = _collection(t, ("response_tokens",), ax, "completion tokens per decision")
    points = _learner_points(t, "truncated")
    if points:
        twin = ax.twinx()
        twin.bar(*zip(*points, strict=True), width=0.4, alpha=0.3, color="tab:red",
                 label="truncated sequences (batch)")
        twin.set_ylabel("truncated sequences in the batch (count)", color="tab:red")
        twin.set_ylim(bottom=0, top=max(1, max(v for _, v in points)) * 1.2)
        twin.yaxis.set_major_locator(integer_ticks())
        twin.legend(fontsize=7, loc="upper right")
    # From 0 (a 3.00 -> 3.12 wiggle must not look like a doubling), with room for the legends.
    ax.set_ylim(bottom=0, top=max(ax.get_ylim()[1], 1) * 1.3)
    if drawn:
        ax.legend(fontsize=7, loc="upper left")
    ax.set(title="Response length and truncation")
    return drawn or bool(points)


LEARNER_PANELS = (
    ("loss", (("loss", "loss"),)),
    ("gradient norm", (("grad_norm", "before clipping"),)),
    ("clip fraction", (("clip_fraction", "clip fraction"),)),
    ("KL (nats per token)", (("approx_kl", "to the sampler"), ("kl_to_base", "to the base"))),
    ("learning rate", (("learning_rate", "learning rate"),)),
    ("reward (batch mean)", (("reward_mean", "reward"),)),
)
"""The learner's panels: a y label and the ``learner`` view's columns drawn on it."""


def learner(t: Tables, fig: Any) -> bool:
    """A panel per figure of the update (each on its own axis: they differ by orders of
    magnitude), by round; a figure the run's algorithm does not report says so."""
    if not t["learner"]:
        return False
    axes = fig.subplots(2, 3).flat
    for ax, (label, columns) in zip(axes, LEARNER_PANELS, strict=True):
        drawn = False
        for key, name in columns:
            if points := _learner_points(t, key):
                ax.plot(*zip(*points, strict=True), marker=".", label=name)
                drawn = True
        if not drawn:
            ax.text(0.5, 0.5, f"no {label}\n(not reported by\nthis run's algorithm)",
                    ha="center", va="center", transform=ax.transAxes, fontsize=8)
        elif len(columns) > 1:
            ax.legend(fontsize=7, loc="best")
        round_axis(ax, ylabel=label)
        ax.set_title(label, pad=14)  # (above the axis's 1e-3: they overlapped)
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    fig.suptitle("Learner, per update")
    return True


def throughput(t: Tables, fig: Any) -> bool:
    rows = t["rounds"]
    if not rows:
        return False
    ax = fig.subplots()
    x = [r["round"] for r in rows]
    bottom = [0.0] * len(rows)
    for key in ("rollout_seconds", "eval_seconds", "learner_seconds", "other_seconds"):
        values = [r[key] or 0.0 for r in rows]
        ax.bar(x, values, bottom=bottom, label=key.replace("_seconds", ""))
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    round_axis(ax, ylabel="seconds", title="Time per round")
    twin = ax.twinx()
    twin.plot(x, [r["generated_tokens"] / r["rollout_seconds"] if r["rollout_seconds"] else 0
                  for r in rows], color="black", marker=".", label="generated tokens/s")
    twin.set_ylabel("generated tokens/s")
    # Headroom above both for the two legends, one in each upper corner.
    twin.set_ylim(bottom=0, top=twin.get_ylim()[1] * 1.3)
    twin.legend(fontsize=7, loc="upper right")
    ax.set_ylim(top=ax.get_ylim()[1] * 1.3)
    ax.legend(fontsize=7, loc="upper left", ncols=4)
    return True
