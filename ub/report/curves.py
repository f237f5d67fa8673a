"""How well a run plays, over its checkpoints and rounds: the learning curve (evaluation games),
the training games' results by kind of opponent, exploitability and reasoning benchmarks."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ub.actors.names import checkpoint_update
from ub.evaluation import wilson_interval
from ub.report.common import (
    ROUND_AXIS,
    Tables,
    integer_ticks,
    line_style,
    note_coinciding,
    panels,
    ranges,
    round_axis,
    short_name,
)

MIRROR = "itself"
"""The opponent kind of a mirror self-play game: the learner in every seat."""
PAST = "past checkpoints"
"""The opponent kind of a game against the run's own older checkpoints (the pool)."""


def eval_label(row: dict[str, Any]) -> str:
    """An evaluation's line: its opponent, and ``masked`` when it played under the mask."""
    return row["opponent"] + (", masked" if row.get("legal_moves") == "mask" else "")


def learning_curve(t: Tables, fig: Any) -> bool:
    """One panel per env: the win rate against each fixed opponent by checkpoint with its 95%
    Wilson band, the draw rate where there were draws, and the random player's own win rate in
    the same seats of the same games (the bar to clear)."""
    by_env: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for row in t["evals"]:
        by_env[row["env_id"]][eval_label(row)].append(row)
    if not by_env:
        return False
    for ax, (env, lines) in zip(panels(fig, len(by_env)), sorted(by_env.items()), strict=True):
        evaluated: set[int] = set()
        for i, (label, rows) in enumerate(sorted(lines.items())):
            rows.sort(key=lambda r: r["update"])
            x = [r["update"] for r in rows]
            evaluated.update(x)
            color = f"C{i % 10}"
            ax.plot(x, [r["win_rate"] for r in rows], marker="o", color=color,
                    label=f"win vs {label}")
            ax.fill_between(x, [r["win_low"] for r in rows], [r["win_high"] for r in rows],
                            alpha=0.2, color=color)
            if any(r["draws"] for r in rows):
                ax.plot(x, [r["draws"] / max(r["games"], 1) for r in rows], ls=":",
                        color=color, label=f"draw vs {label}")
            bar = [(r["update"], r["baseline_win_rate"]) for r in rows
                   if r.get("baseline_win_rate") is not None]
            if bar:
                ax.plot(*zip(*bar, strict=True), ls="-.", lw=1, marker="x", color=color,
                        alpha=0.6, label=f"random player's win vs {label}")
        ax.set(title=env, ylim=(0, 1),
               xlabel=f"checkpoint (evaluated: {ranges(sorted(evaluated))})")
        ax.xaxis.set_major_locator(integer_ticks())
        ax.legend(fontsize=7, loc="best")
        note_coinciding(ax)
    fig.axes[0].set_ylabel("rate of eval games")
    fig.suptitle("Learning curve: win rate in evaluation games (95% Wilson band)")
    return True


def training_results(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The learner's results in its training games, by round, env and kind of opponent.

    ``rows``: the ``games`` view grouped by ``(round, env_id, actors, results)`` with a
    ``games`` count. The learner in a round is the newest checkpoint seated in it (the
    behaviour policy: the pool holds only older ones). An opponent kind is :data:`PAST` for
    the run's older checkpoints, a fixed opponent's name, or :data:`MIRROR` when the learner
    sits every seat. Each learner seat counts once: a mirror game is one win and one loss.
    """
    newest: dict[int, int] = {}
    for row in rows:
        for actor in row["actors"]:
            if (update := checkpoint_update(actor)) is not None:
                newest[row["round"]] = max(newest.get(row["round"], -1), update)
    counts: dict[tuple[int, str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    for row in rows:
        learner = newest.get(row["round"])
        seats = [i for i, a in enumerate(row["actors"]) if checkpoint_update(a) == learner]
        if learner is None or not seats:
            continue
        others = [a for a in row["actors"] if checkpoint_update(a) != learner]
        fixed = sorted({a for a in others if checkpoint_update(a) is None})
        kind = MIRROR if not others else " + ".join(fixed) if fixed else PAST
        tally = counts[(row["round"], row["env_id"], kind)]
        for seat in seats:
            result = row["results"][seat]
            tally[0 if result == "win" else 1 if result == "draw" else 2] += row["games"]
    out = []
    for (round_, env, kind), (wins, draws, losses) in sorted(counts.items()):
        played = wins + draws + losses
        low, high = wilson_interval(wins, played)
        out.append({"round": round_, "env_id": env, "opponent": kind, "seats": played,
                    "wins": wins, "draws": draws, "losses": losses, "win_rate": wins / played,
                    "win_low": low, "win_high": high})
    return out


POINTS = 16
"""At most this many points per line of the training figure: rounds are pooled in equal
blocks past it (a round's ~20 games against one kind swing by ±20%)."""


def training_by_opponent(t: Tables, fig: Any) -> bool:
    """One panel per env: the learner's win rate in its training games against each kind of
    opponent, by round, rounds pooled into at most :data:`POINTS` blocks (mirror games left
    out: each is a win and a loss)."""
    rows = [r for r in t["training"] if r["opponent"] != MIRROR]
    envs = sorted({r["env_id"] for r in rows})
    if not envs:
        return False
    last = max(r["round"] for r in rows)
    block = -(-(last + 1) // POINTS)
    for ax, env in zip(panels(fig, len(envs)), envs, strict=True):
        mine = [r for r in rows if r["env_id"] == env]
        for i, kind in enumerate(sorted({r["opponent"] for r in mine})):
            pooled: dict[int, list[int]] = defaultdict(lambda: [0, 0])
            for r in mine:
                if r["opponent"] == kind:  # (a block is drawn at its last round)
                    point = pooled[min((r["round"] // block + 1) * block - 1, last)]
                    point[0] += r["wins"]
                    point[1] += r["seats"]
            x = sorted(pooled)
            bands = [wilson_interval(pooled[u][0], pooled[u][1]) for u in x]
            name = kind if len(kind) <= 24 else short_name(kind)
            ax.plot(x, [pooled[u][0] / pooled[u][1] for u in x], marker=".",
                    color=f"C{i % 10}",
                    label=f"vs {name} ({sum(pooled[u][1] for u in x)} seats)")
            ax.fill_between(x, [b[0] for b in bands], [b[1] for b in bands], alpha=0.12,
                            color=f"C{i % 10}")
        round_axis(ax, title=env, ylim=(0, 1))
        if block > 1:
            ax.set_xlabel(f"{ROUND_AXIS}, in blocks of {block}")
        ax.legend(fontsize=7, loc="best")
    fig.axes[0].set_ylabel("learner's win rate (training games)")
    fig.suptitle("Training games: the learner's win rate by opponent (95% Wilson band; "
                 "mirror games left out)", fontsize=10)
    return True


def exploitability(t: Tables, fig: Any) -> bool:
    """NashConv by checkpoint, one panel per env, a line per way of playing, the uniformly
    random policy's beside it (0: no best response wins anything)."""
    rows = t["exploitability"]
    envs = sorted({r["env_id"] for r in rows})
    if not envs:
        return False
    axes = fig.subplots(1, len(envs), squeeze=False)[0]
    for ax, env in zip(axes, envs, strict=True):
        mine = [r for r in rows if r["env_id"] == env]
        ways = sorted({(r["policy"], r["legal_moves"]) for r in mine})
        for i, (policy, mode) in enumerate(ways):
            line = sorted((r for r in mine if (r["policy"], r["legal_moves"]) == (policy, mode)),
                          key=lambda r: r["update"])
            x = [r["update"] for r in line]
            # (mask and free often measure the same: the later one, hollow, shows both)
            drawn, = ax.plot(x, [r["nash_conv"] for r in line], label=f"{policy}, {mode}",
                             zorder=2 + i, **line_style(i))
            if not all(r["exact"] for r in line):
                ax.fill_between(x, [r["nash_conv_low"] for r in line],
                                [r["nash_conv_high"] for r in line], alpha=0.2,
                                color=drawn.get_color())
        ax.axhline(mine[0]["random_nash_conv"], color="grey", ls=":", zorder=1,
                   label=f"random policy ({mine[0]['random_nash_conv']:.3f})")
        worst = 2 * (2.0 if mine[0]["unit"] == "chips" else 1.0)
        ax.set(xlabel="checkpoint (update)", ylim=(-0.05 * worst, 1.05 * worst),
               title=f"{env} ({mine[0]['unit']})")
        ax.xaxis.set_major_locator(integer_ticks())
        note_coinciding(ax)
        # Free play loses to a best response through illegal moves too: how much of its
        # play is off the legal moves, on an axis of its own.
        free = [way for way in ways if way[1] == "free"]
        if free:
            share = ax.twinx()
            for policy, mode in free:
                line = sorted((r for r in mine if (r["policy"], r["legal_moves"]) ==
                               (policy, mode)), key=lambda r: r["update"])
                share.plot([r["update"] for r in line], [r["illegal"] for r in line],
                           ls="--", lw=1, marker="x", color="tab:red", alpha=0.7,
                           label=f"illegal share, {policy} free")
            share.set(ylim=(-0.05, 1.05), ylabel="share of free play off the legal moves")
            handles, labels = ax.get_legend_handles_labels()
            more, more_labels = share.get_legend_handles_labels()
            ax.legend(handles + more, labels + more_labels, fontsize=7, loc="best")
        else:
            ax.legend(fontsize=7, loc="best")
    axes[0].set_ylabel("NashConv (best responses' sum)")
    return True


def benchmarks(t: Tables, fig: Any) -> bool:
    """One panel per benchmark asked for (a group's aggregate, not its tasks): each metric by
    checkpoint, with its standard error."""
    series: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for row in t["benchmarks"]:
        if row["task"] == row["benchmark"]:
            label = row["metric"] + (f" ({row['filter']})" if row["filter"] else "")
            series[row["benchmark"]][label].append(row)
    if not series:
        return False
    axes = fig.subplots(1, len(series), squeeze=False)[0]
    for ax, (benchmark, metrics) in zip(axes, sorted(series.items()), strict=True):
        for label, rows in sorted(metrics.items()):
            rows.sort(key=lambda r: r["checkpoint"])
            ax.errorbar([r["checkpoint"] for r in rows], [r["value"] for r in rows],
                        yerr=[r["stderr"] or 0.0 for r in rows], marker="o", capsize=3,
                        label=label)
        n = max(r["n"] for rows in metrics.values() for r in rows)
        ax.set(xlabel="checkpoint (0: the base model)", ylabel="score",
               title=f"{benchmark} (n {n})")
        ax.xaxis.set_major_locator(integer_ticks())
    return True
