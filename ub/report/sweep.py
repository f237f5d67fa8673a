"""A folder of runs overlaid (``ub report FOLDER``): every run's line in its arm's colour, the
arm's mean over its seeds drawn bold, so a sweep's arms read apart at a glance. Arms are named
by their letters (:func:`ub.compare.arm_letters`); the page says each one's settings."""

from __future__ import annotations

from collections import defaultdict
from statistics import mean
from typing import Any

from ub.report.common import Tables, integer_ticks, note_coinciding, panels, round_axis
from ub.report.curves import eval_label


def arm_colors(arms: dict[str, str]) -> dict[str, str]:
    """An arm's colour, the same in every figure (arms sorted by name)."""
    return {arm: f"C{i % 10}" for i, arm in enumerate(sorted(set(arms.values())))}


def _fit(fig: Any, count: int, columns: int) -> None:
    """Room for ``count`` panels, ``columns`` a row: 3.3 inches a panel row."""
    fig.set_size_inches(10, 1.0 + 3.3 * -(-count // columns))


def learning_curves(t: Tables, arms: dict[str, str], fig: Any) -> bool:
    """One panel per (env, opponent, mode): each run's win rate by checkpoint (thin), its arm's
    mean at the checkpoints all of the arm's runs evaluated (bold; dashed, its rate of games
    not lost, where any were drawn), and the random player's win rate in the same seats (grey,
    the mean over runs)."""
    lines: dict[tuple[str, str], dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for row in t["evals"]:
        if row["run"] in arms:
            lines[(row["env_id"], eval_label(row))][row["run"]].append(row)
    if not lines:
        return False
    colors = arm_colors(arms)
    _fit(fig, len(lines), 3)
    for ax, ((env, label), runs) in zip(panels(fig, len(lines)), sorted(lines.items()),
                                        strict=True):
        by_arm: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
        no_loss: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
        bar: dict[int, list[float]] = defaultdict(list)
        for run, rows in sorted(runs.items()):
            rows.sort(key=lambda r: r["update"])
            ax.plot([r["update"] for r in rows], [r["win_rate"] for r in rows], lw=0.8,
                    alpha=0.35, color=colors[arms[run]])
            for r in rows:
                by_arm[arms[run]][r["update"]].append(r["win_rate"])
                no_loss[arms[run]][r["update"]].append((r["wins"] + r["draws"]) / r["games"])
                if r.get("baseline_win_rate") is not None:
                    bar[r["update"]].append(r["baseline_win_rate"])
        for arm, points in sorted(by_arm.items()):
            seeds = max(len(v) for v in points.values())
            x = sorted(u for u, v in points.items() if len(v) == seeds)
            ax.plot(x, [mean(points[u]) for u in x], lw=2.2, marker="o", color=colors[arm],
                    label=f"arm {arm} (mean of {seeds})")
            if any(r["draws"] for rows in runs.values() for r in rows):  # (vs a perfect player)
                ax.plot(x, [mean(no_loss[arm][u]) for u in x], lw=1.5, ls="--",
                        color=colors[arm], label=f"arm {arm}: no-loss rate")
        if bar:
            x = sorted(bar)
            ax.plot(x, [mean(bar[u]) for u in x], ls="-.", marker="x", color="grey",
                    label="random player's win")
        ax.set(title=f"{env} vs {label}", xlabel="checkpoint", ylim=(0, 1))
        ax.title.set_fontsize(9)
        ax.xaxis.set_major_locator(integer_ticks())
        ax.legend(fontsize=7, loc="best")
        note_coinciding(ax)
    fig.axes[0].set_ylabel("win rate (eval games)")
    fig.suptitle("Learning curves of every run (thin) and each arm's mean (bold)")
    return True


HEALTH = (("invalid_move_rate", "invalid-move rate"), ("entropy", "entropy (nats/token)"))
"""The training-game figures overlaid per arm: what a collapse shows first."""


def health(t: Tables, arms: dict[str, str], fig: Any) -> bool:
    """Per env and figure of :data:`HEALTH`, each arm's mean over its runs by round."""
    series: dict[tuple[str, str], dict[str, dict[int, list[float]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list)))
    keys = dict(HEALTH)
    for row in t["metrics"]:
        parts = row["metric"].split("/")
        if (row["run"] in arms and parts[0] == "collection" and len(parts) == 3
                and parts[2] in keys):
            series[(parts[1], parts[2])][arms[row["run"]]][row["round"]].append(row["value"])
    if not series:
        return False
    colors = arm_colors(arms)
    order = sorted(series, key=lambda k: (list(keys).index(k[1]), k[0]))
    columns = max(len({env for env, _ in order}), 2)
    _fit(fig, len(order), columns)
    axes = panels(fig, len(order), columns=columns, sharey=False)
    for ax, (env, key) in zip(axes, order, strict=True):
        for arm, points in sorted(series[(env, key)].items()):
            x = sorted(points)
            ax.plot(x, [mean(points[r]) for r in x], color=colors[arm], marker=".",
                    label=f"arm {arm}")
        round_axis(ax, title=f"{keys[key]}: {env}", ylim=(0, None))
        ax.title.set_fontsize(9)
        ax.legend(fontsize=7, loc="best")
        note_coinciding(ax)
    fig.suptitle("Training games, each arm's mean over its runs")
    return True
