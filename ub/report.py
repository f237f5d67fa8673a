"""``ub report RUN``: static plots of a run (PNG) and one self-contained HTML page.

Plots, each from the run's tables (:mod:`ub.run.folder.views`): the learning curve against each
fixed opponent with 95% Wilson bands and the random player's own rate in the same games; the
exploitability (NashConv) by checkpoint with the random policy's; TrueSkill ratings (each
checkpoint's latest mu ± sigma, and mu over rounds); the match matrix (score of row vs column);
invalid-move and format rates and the policy's entropy, per env; response length and truncation;
the learner's loss, gradient norm and clip fraction (one panel each: they differ by orders of
magnitude); throughput and the time breakdown per round; each reasoning benchmark's score by
checkpoint (checkpoint 0, the base model, first). A plot with no data yet (e.g. no evaluation)
is left out. The page also has the numbers: the learning curve as a table (win rate with its 95%
interval per checkpoint) and the run's settings.
"""

from __future__ import annotations

import base64
import html
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ub.actors.names import checkpoint_update
from ub.errors import UbError
from ub.run.folder.layout import is_run
from ub.run.folder.views import RunViews

SIZE = (8, 4.5)
"""A plot's size in inches (at 100 dpi: 800 x 450 pixels)."""
MATRIX_SIZE = (8, 7)
"""The match matrix's: square cells with readable numbers."""


def _short(name: str) -> str:
    """A readable axis label: ``ckpt-000004`` -> ``ckpt 4``; other names as they are, cut."""
    update = checkpoint_update(name)
    return f"ckpt {update}" if update is not None else (name if len(name) <= 14
                                                        else name[:13] + "…")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _learning_curve(t: dict[str, list[dict]], fig) -> bool:
    ax = fig.subplots()
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for row in t["evals"]:  # (an env played under the legal-move mask says so)
        mask = " masked" if row.get("legal_moves") == "mask" else ""
        groups[(row["env_id"] + mask, row["opponent"])].append(row)
    for (env, opponent), rows in sorted(groups.items()):
        rows.sort(key=lambda r: r["update"])
        x = [r["update"] for r in rows]
        line, = ax.plot(x, [r["win_rate"] for r in rows], marker="o",
                        label=f"win vs {opponent} ({env})")
        ax.fill_between(x, [r["win_low"] for r in rows], [r["win_high"] for r in rows],
                        alpha=0.2, color=line.get_color())
        ax.plot(x, [r["draws"] / max(r["games"], 1) for r in rows], ls="--",
                color=line.get_color(), alpha=0.7, label=f"draw vs {opponent} ({env})")
        ax.plot(x, [r["losses"] / max(r["games"], 1) for r in rows], ls=":",
                color=line.get_color(), alpha=0.7, label=f"loss vs {opponent} ({env})")
        bar = [(u, r["baseline_win_rate"]) for u, r in zip(x, rows, strict=True)
               if r.get("baseline_win_rate") is not None]
        if bar:  # the random player's own win rate in the same seats of the same games
            ax.plot([u for u, _ in bar], [b for _, b in bar], ls="-.", lw=1, marker="x",
                    color=line.get_color(), alpha=0.5,
                    label=f"random player's win vs {opponent} ({env})")
    ax.set(xlabel="checkpoint (update)", ylabel="rate of eval games", ylim=(0, 1),
           title="Learning curve (95% Wilson band on the win rate)")
    return bool(groups)


def _exploitability(t: dict[str, list[dict]], fig) -> bool:
    """NashConv by checkpoint, one panel per env, a line per way of playing, the uniformly
    random policy's beside it (0: no best response wins anything)."""
    rows = t["exploitability"]
    envs = sorted({r["env_id"] for r in rows})
    if not envs:
        return False
    axes = fig.subplots(1, len(envs), squeeze=False)[0]
    for ax, env in zip(axes, envs, strict=True):
        mine = [r for r in rows if r["env_id"] == env]
        for (policy, mode) in sorted({(r["policy"], r["legal_moves"]) for r in mine}):
            line = sorted((r for r in mine if (r["policy"], r["legal_moves"]) == (policy, mode)),
                          key=lambda r: r["update"])
            x = [r["update"] for r in line]
            drawn, = ax.plot(x, [r["nash_conv"] for r in line], marker="o",
                             ls="-" if mode == "mask" else "--", label=f"{policy}, {mode}")
            if not all(r["exact"] for r in line):
                ax.fill_between(x, [r["nash_conv_low"] for r in line],
                                [r["nash_conv_high"] for r in line], alpha=0.2,
                                color=drawn.get_color())
        ax.axhline(mine[0]["random_nash_conv"], color="grey", ls=":", label="random policy")
        worst = 2 * (2.0 if mine[0]["unit"] == "chips" else 1.0)
        ax.set(xlabel="checkpoint (update)", ylim=(-0.05 * worst, 1.05 * worst),
               title=f"{env} ({mine[0]['unit']})")
        ax.xaxis.set_major_locator(_integer_ticks())
    axes[0].set_ylabel("NashConv (best responses' sum)")
    return True


def _benchmarks(t: dict[str, list[dict]], fig) -> bool:
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
        ax.xaxis.set_major_locator(_integer_ticks())
    return True


def _ratings(t: dict[str, list[dict]], fig) -> bool:
    """Left: each checkpoint's latest mu ± sigma by update (the newest is the rightmost point,
    never hidden), fixed opponents as horizontal lines. Right: mu over rounds, no bands."""
    members: dict[str, list[dict]] = defaultdict(list)
    for row in t["ratings"]:
        members[row["name"]].append(row)
    if not members:
        return False
    latest, over_time = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1]})
    checkpoints = sorted((update, n) for n in members
                         if (update := checkpoint_update(n)) is not None)
    fixed = sorted(n for n in members if checkpoint_update(n) is None)
    last = {n: max(rows, key=lambda r: r["round"]) for n, rows in members.items()}
    if checkpoints:
        x = [u for u, _ in checkpoints]
        mu = [last[n]["mu"] for _, n in checkpoints]
        sigma = [last[n]["sigma"] for _, n in checkpoints]
        latest.errorbar(x, mu, yerr=sigma, fmt="o-", capsize=3, color="tab:blue",
                        label="checkpoint mu ± sigma")
        newest_update, newest = checkpoints[-1]
        latest.annotate(f"{_short(newest)}: {last[newest]['mu']:.1f}",
                        (newest_update, last[newest]["mu"]), textcoords="offset points",
                        xytext=(-10, 10), ha="right", fontsize=8, color="tab:blue")
    for i, name in enumerate(fixed):
        latest.axhline(last[name]["mu"], ls="--", color=f"C{(i + 1) % 10}",
                       label=f"{_short(name)} (fixed)")
    latest.set(xlabel="checkpoint (update)", ylabel="TrueSkill mu",
               title="Latest rating of each checkpoint")
    latest.legend(fontsize=7, loc="best")
    cmap = _colormap("viridis")
    top = max((u for u, _ in checkpoints), default=1) or 1
    for update, name in checkpoints:
        rows = sorted(members[name], key=lambda r: r["round"])
        is_newest = name == checkpoints[-1][1]  # (often one point: made by the last round)
        over_time.plot([r["round"] for r in rows], [r["mu"] for r in rows],
                       marker="o" if is_newest else ".", markersize=8 if is_newest else 4,
                       color=cmap(update / top), lw=2.5 if is_newest else 1,
                       label=_short(name) if is_newest else None)
    for i, name in enumerate(fixed):
        rows = sorted(members[name], key=lambda r: r["round"])
        over_time.plot([r["round"] for r in rows], [r["mu"] for r in rows], ls="--",
                       color=f"C{(i + 1) % 10}", label=_short(name))
    over_time.set(xlabel="round", ylabel="TrueSkill mu",
                  title="mu over rounds (dark: older checkpoints)")
    over_time.legend(fontsize=7, loc="best")
    return True


def _integer_ticks():
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def _colormap(name: str):
    import matplotlib

    return matplotlib.colormaps[name]


MAX_MATRIX = 16
"""Members shown in the match matrix: the fixed opponents and the newest checkpoints."""


def _match_matrix(matches: dict[str, dict[str, list[int]]], fig) -> bool:
    names = sorted(set(matches) | {b for row in matches.values() for b in row},
                   key=lambda n: (checkpoint_update(n) is None, checkpoint_update(n) or 0, n))
    if not names:
        return False
    checkpoints = [n for n in names if checkpoint_update(n) is not None]
    fixed = [n for n in names if checkpoint_update(n) is None]
    names = checkpoints[-max(1, MAX_MATRIX - len(fixed)):] + fixed
    ax = fig.subplots()
    score = [[float("nan")] * len(names) for _ in names]
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            w, d, lost = matches.get(a, {}).get(b, [0, 0, 0])
            if w + d + lost:
                score[i][j] = (w + d / 2) / (w + d + lost)
    image = ax.imshow(score, cmap="RdYlGn", vmin=0, vmax=1)
    labels = [_short(n) for n in names]
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
    ax.set(xlabel="opponent", ylabel="member",
           title=f"Match matrix: score of row vs column (cell: {cell})")
    return True


METRIC_LABELS = {"invalid_move_rate": "invalid moves", "format_rate": "format ok",
                 "response_tokens": "tokens"}


def _collection(t: dict[str, list[dict]], keys: tuple[str, ...], ax, ylabel: str) -> bool:
    series: dict[str, dict[int, float]] = defaultdict(dict)
    for row in t["metrics"]:
        parts = row["metric"].split("/")
        if parts[0] == "collection" and len(parts) == 3 and parts[2] in keys:
            series[f"{METRIC_LABELS.get(parts[2], parts[2])} ({parts[1]})"][row["round"]] = (
                row["value"])
    for label, points in sorted(series.items()):
        rounds = sorted(points)
        ax.plot(rounds, [points[r] for r in rounds], marker=".", label=label)
    ax.set(xlabel="round", ylabel=ylabel)
    return bool(series)


def _move_quality(t: dict[str, list[dict]], fig) -> bool:
    ax = fig.subplots()
    drawn = _collection(t, ("invalid_move_rate", "format_rate"), ax, "rate of model decisions")
    ax.set(ylim=(0, 1.02), title="Invalid-move and format rates (training games)")
    return drawn


def _entropy(t: dict[str, list[dict]], fig) -> bool:
    """Per env, the sampler's entropy in the training games; the learner's over its batch. A
    fall towards 0 is a policy collapsing onto one move (docs/learning-log.md)."""
    ax = fig.subplots()
    drawn = _collection(t, ("entropy",), ax, "nats per completion token")
    points = [(r["round"], r["entropy_mean"]) for r in t["learner"]
              if r.get("entropy_mean") is not None]
    if points:
        ax.plot(*zip(*points, strict=True), ls="--", color="black", alpha=0.6,
                label="learner (batch, all envs)")
    ax.set(ylim=(0, None), title="Policy entropy (sampled in training games, per env)")
    return drawn or bool(points)


def _response_length(t: dict[str, list[dict]], fig) -> bool:
    """Tokens on the left axis, the count of truncated training sequences on its own right."""
    ax = fig.subplots()
    drawn = _collection(t, ("response_tokens",), ax, "completion tokens per decision")
    points = [(r["round"], r["truncated"]) for r in t["learner"] if r.get("truncated") is not None]
    if points:
        twin = ax.twinx()
        twin.bar(*zip(*points, strict=True), width=0.4, alpha=0.3, color="tab:red",
                 label="truncated sequences (batch)")
        twin.set_ylabel("truncated sequences in the batch (count)", color="tab:red")
        twin.set_ylim(bottom=0, top=max(1, max(v for _, v in points)) * 1.2)
        twin.yaxis.set_major_locator(_integer_ticks())
        twin.legend(fontsize=7, loc="upper right")
    # From 0 (a 3.00 -> 3.12 wiggle must not look like a doubling), with room for the legends.
    ax.set_ylim(bottom=0, top=max(ax.get_ylim()[1], 1) * 1.3)
    if drawn:
        ax.legend(fontsize=7, loc="upper left")
    ax.set(title="Response length and truncation")
    return drawn or bool(points)


LEARNER_PANELS = (("loss", "loss"), ("grad_norm", "gradient norm"),
                  ("clip_fraction", "clip fraction"))


def _learner(t: dict[str, list[dict]], fig) -> bool:
    """One panel per figure (loss, gradient norm, clip fraction), each on its own axis."""
    rows = t["learner"]
    if not rows:
        return False
    axes = fig.subplots(1, len(LEARNER_PANELS))
    for ax, (key, label) in zip(axes, LEARNER_PANELS, strict=True):
        points = [(r["round"], r[key]) for r in rows if r.get(key) is not None]
        if points:
            ax.plot(*zip(*points, strict=True), marker="o")
        else:
            ax.text(0.5, 0.5, f"no {label}\n(not reported by\nthis algorithm)",
                    ha="center", va="center", transform=ax.transAxes, fontsize=8)
        ax.set(xlabel="round", ylabel=label, title=label)
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    fig.suptitle("Learner, per update")
    return True


def _throughput(t: dict[str, list[dict]], fig) -> bool:
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
    ax.set(xlabel="round", ylabel="seconds", title="Time per round")
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


def _curve_table(evals: list[dict]) -> str:
    """The learning curve as numbers: one row per (checkpoint, env, opponent)."""
    if not evals:
        return "<p>No evaluation yet.</p>"
    head = ("checkpoint", "env", "opponent", "moves", "games", "win rate [95% CI]", "draws",
            "losses", "invalid moves")
    rows = []
    for r in sorted(evals, key=lambda r: (r["env_id"], r["opponent"], r["update"])):
        cells = (r["update"], r["env_id"], r["opponent"], r.get("legal_moves") or "-", r["games"],
                 f"{_pct(r['win_rate'])} [{_pct(r['win_low'])}, {_pct(r['win_high'])}]",
                 r["draws"], r["losses"], _pct(r["invalid_move_rate"]))
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    return ("<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"
            + "".join(rows) + "</table>")


def _flatten(data: Any, prefix: str = "") -> list[tuple[str, str]]:
    if isinstance(data, dict):
        return [item for key, value in data.items()
                for item in _flatten(value, f"{prefix}.{key}" if prefix else str(key))]
    if isinstance(data, list) and any(isinstance(v, dict) for v in data):
        return [item for i, value in enumerate(data) for item in _flatten(value, f"{prefix}[{i}]")]
    return [(prefix, "null" if data is None else str(data))]


def _settings_table(root: Path) -> str:
    """The run's resolved config (``config.yaml``), one setting a row."""
    import yaml

    try:
        data = yaml.safe_load((root / "config.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        return f"<p class=warn>config.yaml is unreadable: {html.escape(str(exc))}</p>"
    rows = "".join(f"<tr><td><code>{html.escape(k)}</code></td><td>{html.escape(v)}</td></tr>"
                   for k, v in _flatten(data))
    return f"<table><tr><th>setting</th><th>value</th></tr>{rows}</table>"


def _totals(t: dict[str, list[dict]]) -> str:
    rounds = t["rounds"]
    games = sum(r["games"] or 0 for r in rounds)
    decisions = sum(r["model_decisions"] or 0 for r in rounds)
    invalid = sum(r["invalid_moves"] or 0 for r in rounds)
    seconds = sum(r["round_seconds"] or 0.0 for r in rounds)
    return (f"{len(rounds)} committed rounds, {games} training games, {decisions} model "
            f"decisions ({_pct(invalid / decisions) if decisions else '-'} invalid), "
            f"{seconds / 60:.1f} minutes of rounds")


def write_report(root: Path, out: Path) -> Path:
    """Write the plots and ``report.html`` into ``out``; return the HTML's path."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    root = Path(root)
    if not is_run(root):
        raise UbError(f"{root} is not a ub run (no config.yaml or rounds/)")
    views = RunViews(root)
    t = {name: table.to_pylist() for name, table in views.tables().items()}
    if not t["rounds"] and not t["benchmarks"]:
        raise UbError(f"run {root.name} has no committed round yet (and no benchmark "
                      "scores): nothing to plot")
    matches = views.last_ratings().get("matches", {})

    plots: list[tuple[str, str, Callable[[Any], bool]]] = [
        ("learning_curve", "Learning curve", lambda fig: _learning_curve(t, fig)),
        ("exploitability", "Exploitability (NashConv: what best responses win)",
         lambda fig: _exploitability(t, fig)),
        ("ratings", "TrueSkill ratings", lambda fig: _ratings(t, fig)),
        ("match_matrix", "Match matrix", lambda fig: _match_matrix(matches, fig)),
        ("move_quality", "Invalid moves and format", lambda fig: _move_quality(t, fig)),
        ("entropy", "Policy entropy per env", lambda fig: _entropy(t, fig)),
        ("response_length", "Response length and truncation",
         lambda fig: _response_length(t, fig)),
        ("learner", "Learner: loss, gradient norm, clip fraction", lambda fig: _learner(t, fig)),
        ("throughput", "Throughput and time", lambda fig: _throughput(t, fig)),
        ("benchmarks", "Reasoning benchmarks", lambda fig: _benchmarks(t, fig)),
    ]
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UbError(f"output folder {out} is not writable ({exc.strerror or exc})") from None
    sections = []
    # Names are text, not TeX: a rating member named `$\frac{$` made mathtext raise.
    with plt.rc_context({"text.parse_math": False}):
        for name, title, draw in plots:
            fig = plt.figure(figsize=MATRIX_SIZE if name == "match_matrix" else SIZE, dpi=100)
            try:
                if not draw(fig):
                    continue
                for ax in fig.axes:
                    handles, _ = ax.get_legend_handles_labels()
                    if handles and ax.get_legend() is None:
                        ax.legend(fontsize=7, loc="best")
                fig.tight_layout()
                path = out / f"{name}.png"
                fig.savefig(path)
            finally:
                plt.close(fig)
            encoded = base64.b64encode(path.read_bytes()).decode()
            sections.append(f"<h2>{html.escape(title)}</h2>\n<img alt=\"{html.escape(title)}\" "
                            f'src="data:image/png;base64,{encoded}">')
    page = out / "report.html"
    warnings = "".join(f"<p class=warn>{html.escape(w)}</p>" for w in views.warnings)
    page.write_text(
        "<!doctype html><meta charset=utf-8>"
        f"<title>ub report: {html.escape(root.name)}</title>"
        "<style>body{font-family:sans-serif;max-width:900px;margin:auto}"
        "img{max-width:100%}.warn{color:#a60}table{border-collapse:collapse;font-size:90%}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}</style>"
        f"<h1>ub report: {html.escape(root.name)}</h1>"
        f"<p>{html.escape(_totals(t))}; data in <code>{html.escape(str(root))}</code></p>"
        f"{warnings}\n<h2>Learning curve (numbers)</h2>\n{_curve_table(t['evals'])}\n"
        + "\n".join(sections)
        + f"\n<h2>Settings</h2>\n<details open><summary>config.yaml</summary>"
          f"{_settings_table(root)}</details>\n")
    return page
