"""The pool's figures: TrueSkill ratings and the match matrix, with what each leaves out."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ub.actors.names import checkpoint_update
from ub.report.common import Tables, colormap, ranges, round_axis, short_name, spread

MAX_LINES = 6
"""Checkpoints drawn in "mu over rounds" (evenly spread, the first and the newest kept)."""
MAX_MATRIX = 16
"""Members shown in the match matrix: the fixed opponents and the newest checkpoints."""


def ratings(t: Tables, fig: Any) -> bool:
    """Left: each checkpoint's latest mu ± sigma by update (the newest is the rightmost point,
    never hidden), fixed opponents as horizontal lines. Right: mu over rounds of at most
    :data:`MAX_LINES` checkpoints, each labelled, and of the fixed opponents."""
    members: dict[str, list[dict]] = defaultdict(list)
    for row in t["ratings"]:
        members[row["name"]].append(row)
    if not members:
        return False
    latest, over_time = fig.subplots(1, 2)
    checkpoints = sorted((update, n) for n in members
                         if (update := checkpoint_update(n)) is not None)
    fixed = sorted(n for n in members if checkpoint_update(n) is None)
    last = {n: max(rows, key=lambda r: r["round"]) for n, rows in members.items()}
    if checkpoints:
        x = [u for u, _ in checkpoints]
        latest.errorbar(x, [last[n]["mu"] for _, n in checkpoints],
                        yerr=[last[n]["sigma"] for _, n in checkpoints], fmt="o-", capsize=3,
                        color="tab:blue", label="checkpoint mu ± sigma")
    for i, name in enumerate(fixed):
        latest.axhline(last[name]["mu"], ls="--", color=f"C{(i + 1) % 10}",
                       label=f"{short_name(name)} (fixed)")
    latest.set(xlabel="checkpoint (update)", ylabel="TrueSkill mu",
               title="Latest rating of each checkpoint")
    latest.legend(fontsize=7, loc="best")
    drawn = spread([u for u, _ in checkpoints], MAX_LINES)
    cmap = colormap("viridis")
    top = max(drawn, default=1) or 1
    name_of = dict(checkpoints)
    for update in drawn:
        rows = sorted(members[name_of[update]], key=lambda r: r["round"])
        over_time.plot([r["round"] for r in rows], [r["mu"] for r in rows], marker=".",
                       color=cmap(0.9 * update / top), label=f"ckpt {update}")
    for i, name in enumerate(fixed):
        rows = sorted(members[name], key=lambda r: r["round"])
        over_time.plot([r["round"] for r in rows], [r["mu"] for r in rows], ls="--",
                       color=f"C{(i + 1) % 10}", label=short_name(name))
    left = len(checkpoints) - len(drawn)
    round_axis(over_time, ylabel="TrueSkill mu",
                  title="mu over rounds" + (f" ({len(drawn)} of {len(checkpoints)} "
                                            "checkpoints, evenly spread)" if left else ""))
    over_time.title.set_fontsize(9)
    over_time.legend(fontsize=7, loc="best", ncols=2)
    return True


def match_matrix(matches: dict[str, dict[str, list[int]]], fig: Any) -> bool:
    """Score of row against column (win 1, draw ½) over every rated game, for the fixed
    opponents and the newest checkpoints (at most :data:`MAX_MATRIX` members; the caption
    names the checkpoints left out)."""
    names = sorted(set(matches) | {b for row in matches.values() for b in row},
                   key=lambda n: (checkpoint_update(n) is None, checkpoint_update(n) or 0, n))
    if not names:
        return False
    checkpoints = [n for n in names if checkpoint_update(n) is not None]
    fixed = [n for n in names if checkpoint_update(n) is None]
    kept = checkpoints[-max(1, MAX_MATRIX - len(fixed)):]
    left_out = [u for n in checkpoints if n not in kept
                if (u := checkpoint_update(n)) is not None]
    names = kept + fixed
    ax = fig.subplots()
    score = [[float("nan")] * len(names) for _ in names]
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            w, d, lost = matches.get(a, {}).get(b, [0, 0, 0])
            if w + d + lost:
                score[i][j] = (w + d / 2) / (w + d + lost)
    image = ax.imshow(score, cmap="RdYlGn", vmin=0, vmax=1)
    labels = [short_name(n) for n in names]
    size = 9 if len(names) <= 8 else 8
    ax.set_xticks(range(len(names)), labels, rotation=45, ha="right", fontsize=size)
    ax.set_yticks(range(len(names)), labels, fontsize=size)
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            w, d, lost = matches.get(a, {}).get(b, [0, 0, 0])
            if w + d + lost:
                text = (f"{100 * score[i][j]:.0f}%\n{w + d + lost}" if len(names) <= 10
                        else f"{100 * score[i][j]:.0f}")
                ax.text(j, i, text, ha="center", va="center", fontsize=size - 1,
                        color="black")
    fig.colorbar(image, ax=ax, label="score of row vs column (win 1, draw ½)")
    cell = "score %, games" if len(names) <= 10 else "score %"
    ax.set(xlabel="opponent" + (f"\n(left out: checkpoints {ranges(left_out)}; the newest "
                                f"{len(kept)} shown)" if left_out else ""),
           ylabel="member", title=f"Match matrix: score of row vs column (cell: {cell})")
    return True
