"""``ub report RUN``: static plots of a run (PNG) and one self-contained HTML page.

Plots, each from the run's tables (:mod:`ub.run.views`): the learning curve against each fixed
opponent with 95% Wilson bands; TrueSkill mu ± sigma of each checkpoint over rounds; the match
matrix; invalid-move and format rates; response length and truncation; the learner's loss,
gradient norm and clip fraction; throughput and the time breakdown per round. A plot with no
data yet (e.g. no evaluation) is left out.
"""

from __future__ import annotations

import base64
import html
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ub.errors import UbError
from ub.run.views import RunViews, is_run


def _figure():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(8, 4.5), dpi=100)


def _learning_curve(t: dict[str, list[dict]], ax) -> bool:
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for row in t["evals"]:
        groups[(row["env_id"], row["opponent"])].append(row)
    for (env, opponent), rows in sorted(groups.items()):
        rows.sort(key=lambda r: r["update"])
        x = [r["update"] for r in rows]
        ax.plot(x, [r["win_rate"] for r in rows], marker="o", label=f"win vs {opponent} ({env})")
        ax.fill_between(x, [r["win_low"] for r in rows], [r["win_high"] for r in rows], alpha=0.2)
        ax.plot(x, [r["draws"] / max(r["games"], 1) for r in rows], ls="--",
                label=f"draw vs {opponent}")
        ax.plot(x, [r["losses"] / max(r["games"], 1) for r in rows], ls=":",
                label=f"loss vs {opponent}")
    ax.set(xlabel="checkpoint (update)", ylabel="rate", ylim=(0, 1),
           title="Learning curve (95% Wilson band on the win rate)")
    return bool(groups)


def _ratings(t: dict[str, list[dict]], ax) -> bool:
    members: dict[str, list[dict]] = defaultdict(list)
    for row in t["ratings"]:
        members[row["name"]].append(row)
    for name, rows in sorted(members.items()):
        rows.sort(key=lambda r: r["round"])
        x = [r["round"] for r in rows]
        mu = [r["mu"] for r in rows]
        ax.plot(x, mu, label=name if len(members) <= 12 else None)
        ax.fill_between(x, [m - r["sigma"] for m, r in zip(mu, rows, strict=True)],
                        [m + r["sigma"] for m, r in zip(mu, rows, strict=True)], alpha=0.1)
    ax.set(xlabel="round", ylabel="TrueSkill mu ± sigma", title="Ratings over rounds")
    return bool(members)


def _match_matrix(matches: dict[str, dict[str, list[int]]], ax) -> bool:
    names = sorted(matches)
    if not names:
        return False
    counts = [[sum(matches.get(a, {}).get(b, [0, 0, 0])) for b in names] for a in names]
    image = ax.imshow(counts, cmap="viridis")
    ax.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=7)
    ax.set_yticks(range(len(names)), names, fontsize=7)
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            wdl = matches.get(a, {}).get(b)
            if wdl:
                ax.text(j, i, "/".join(map(str, wdl)), ha="center", va="center", fontsize=6,
                        color="white")
    ax.figure.colorbar(image, ax=ax, label="games")
    ax.set_title("Match matrix (W/D/L of row vs column)")
    return True


def _collection(t: dict[str, list[dict]], keys: tuple[str, ...], ax, title: str,
                ylabel: str) -> bool:
    series: dict[str, dict[int, float]] = defaultdict(dict)
    for row in t["metrics"]:
        parts = row["metric"].split("/")
        if parts[0] == "collection" and len(parts) == 3 and parts[2] in keys:
            series[f"{parts[2]} ({parts[1]})"][row["round"]] = row["value"]
    for label, points in sorted(series.items()):
        rounds = sorted(points)
        ax.plot(rounds, [points[r] for r in rounds], marker=".", label=label)
    ax.set(xlabel="round", ylabel=ylabel, title=title)
    return bool(series)


def _lines(rows: list[dict], keys: tuple[str, ...], ax, title: str) -> bool:
    plotted = False
    for key in keys:
        points = [(r["round"], r[key]) for r in rows if r.get(key) is not None]
        if points:
            ax.plot(*zip(*points, strict=True), marker=".", label=key)
            plotted = True
    ax.set(xlabel="round", title=title)
    return plotted


def _throughput(t: dict[str, list[dict]], ax) -> bool:
    rows = t["rounds"]
    if not rows:
        return False
    x = [r["round"] for r in rows]
    bottom = [0.0] * len(rows)
    for key in ("rollout_seconds", "eval_seconds", "learner_seconds", "other_seconds"):
        values = [r[key] or 0.0 for r in rows]
        ax.bar(x, values, bottom=bottom, label=key.replace("_seconds", ""))
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set(xlabel="round", ylabel="seconds", title="Time per round")
    twin = ax.twinx()
    twin.plot(x, [r["generated_tokens"] / r["rollout_seconds"] if r["rollout_seconds"] else 0
                  for r in rows], color="black", marker=".", label="generated tokens/s")
    twin.set_ylabel("generated tokens/s")
    return True


def write_report(root: Path, out: Path) -> Path:
    """Write the plots and ``report.html`` into ``out``; return the HTML's path."""
    import matplotlib.pyplot as plt

    root = Path(root)
    if not is_run(root):
        raise UbError(f"{root} is not a ub run (no config.yaml or rounds/)")
    views = RunViews(root)
    t = {name: table.to_pylist() for name, table in views.tables().items()}
    if not t["rounds"]:
        raise UbError(f"run {root.name} has no committed round yet: nothing to plot")
    matches = views.last_ratings().get("matches", {})

    plots: list[tuple[str, str, Callable[[Any], bool]]] = [
        ("learning_curve", "Learning curve", lambda ax: _learning_curve(t, ax)),
        ("ratings", "TrueSkill ratings", lambda ax: _ratings(t, ax)),
        ("match_matrix", "Match matrix", lambda ax: _match_matrix(matches, ax)),
        ("move_quality", "Invalid moves and format", lambda ax: _collection(
            t, ("invalid_move_rate", "format_rate"), ax, "Invalid-move and format rates",
            "rate")),
        ("response_length", "Response length and truncation", lambda ax: _collection(
            t, ("response_tokens",), ax, "Response length", "completion tokens")
            | _lines(t["learner"], ("truncated",), ax, "Response length and truncation")),
        ("learner", "Learner", lambda ax: _lines(
            t["learner"], ("loss", "grad_norm", "clip_fraction"), ax, "Learner")),
        ("throughput", "Throughput and time", lambda ax: _throughput(t, ax)),
    ]
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UbError(f"output folder {out} is not writable ({exc.strerror or exc})") from None
    sections = []
    for name, title, draw in plots:
        fig, ax = _figure()
        try:
            if not draw(ax):
                continue
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7, loc="best")
            fig.tight_layout()
            path = out / f"{name}.png"
            fig.savefig(path)
        finally:
            plt.close(fig)
        encoded = base64.b64encode(path.read_bytes()).decode()
        sections.append(f"<h2>{html.escape(title)}</h2>\n"
                        f'<img alt="{html.escape(title)}" src="data:image/png;base64,{encoded}">')
    page = out / "report.html"
    warnings = "".join(f"<p class=warn>{html.escape(w)}</p>" for w in views.warnings)
    page.write_text(
        "<!doctype html><meta charset=utf-8>"
        f"<title>ub report: {html.escape(root.name)}</title>"
        "<style>body{font-family:sans-serif;max-width:900px;margin:auto}"
        "img{max-width:100%}.warn{color:#a60}</style>"
        f"<h1>ub report: {html.escape(root.name)}</h1>"
        f"<p>{len(t['rounds'])} committed rounds; data in <code>{html.escape(str(root))}</code>"
        f"</p>{warnings}\n" + "\n".join(sections) + "\n")
    return page
