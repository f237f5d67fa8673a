"""The report's files: each figure as a PNG, one self-contained HTML page (images inline, the
numbers beside them), and the same page's head in Markdown for Prefect's UI."""

from __future__ import annotations

import base64
import functools
import html
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ub.data.atomic import write_atomic
from ub.errors import UbError
from ub.report import curves, health, pool, sweep
from ub.report.common import SIZE, SIZES, Tables, pct
from ub.run.folder.layout import RunPaths, is_run
from ub.run.folder.sweep import flat_settings, sweep_tables
from ub.run.folder.views import RunViews

TRAINING_SQL = """
    SELECT round, env_id, actors, results, count(*) AS games FROM games
    WHERE outcome <> 'error' AND parent_game_id IS NULL GROUP BY ALL"""
"""The training games as :func:`ub.report.curves.training_results` reads them (branch copies
left out: a copy replays its parent's opening, so it is not a game the learner chose to)."""


@dataclass(frozen=True)
class Figure:
    """A drawn figure: its file name's stem, its heading and the PNG."""

    name: str
    title: str
    path: Path


Draw = Callable[[Any], bool]


def draw_figures(plots: list[tuple[str, str, Draw]], out: Path) -> list[Figure]:
    """Draw each plot that has data into ``out/NAME.png``; a plot with none leaves no file
    (a stale one from an earlier report is removed)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UbError(f"output folder {out} is not writable ({exc.strerror or exc})") from None
    drawn = []
    # Names are text, not TeX: a rating member named `$\frac{$` made mathtext raise.
    with plt.rc_context({"text.parse_math": False}):
        for name, title, draw in plots:
            path = out / f"{name}.png"
            fig = plt.figure(figsize=SIZES.get(name, SIZE), dpi=100)
            try:
                if not draw(fig):
                    path.unlink(missing_ok=True)
                    continue
                for ax in fig.axes:
                    handles, _ = ax.get_legend_handles_labels()
                    if handles and ax.get_legend() is None:
                        ax.legend(fontsize=7, loc="best")
                fig.tight_layout()
                # (atomic: a link put where the figure goes is replaced, not written through)
                write_atomic(path, functools.partial(fig.savefig, format="png"))
            finally:
                plt.close(fig)
            drawn.append(Figure(name, title, path))
    return drawn


def training_rows(views: RunViews) -> list[dict[str, Any]]:
    """The learner's training results by round, env and opponent kind (none before a game),
    from the run's games shards as ``views`` reads them."""
    from ub.data.sql import query_tables, table_dataset

    try:
        games = table_dataset(views.root, "games", views.shard_files("games"))
        return curves.training_results(query_tables({"games": games}, TRAINING_SQL).to_pylist())
    except UbError:  # (no shard yet, or none readable: the other figures still draw)
        return []


def run_plots(t: Tables, matches: dict[str, Any]) -> list[tuple[str, str, Draw]]:
    """A run's figures, in the page's order."""
    return [
        ("learning_curve", "Learning curve", lambda fig: curves.learning_curve(t, fig)),
        ("training_by_opponent", "Training games by opponent",
         lambda fig: curves.training_by_opponent(t, fig)),
        ("exploitability", "Exploitability (NashConv: what best responses win)",
         lambda fig: curves.exploitability(t, fig)),
        ("ratings", "TrueSkill ratings", lambda fig: pool.ratings(t, fig)),
        ("match_matrix", "Match matrix", lambda fig: pool.match_matrix(matches, fig)),
        ("move_quality", "Invalid moves and format", lambda fig: health.move_quality(t, fig)),
        ("entropy", "Policy entropy per env", lambda fig: health.entropy(t, fig)),
        ("response_length", "Response length and truncation",
         lambda fig: health.response_length(t, fig)),
        ("learner", "Learner: loss, gradient norm, clip fraction, KL, learning rate, reward",
         lambda fig: health.learner(t, fig)),
        ("throughput", "Throughput and time", lambda fig: health.throughput(t, fig)),
        ("benchmarks", "Reasoning benchmarks", lambda fig: curves.benchmarks(t, fig)),
    ]


@dataclass(frozen=True)
class RunReport:
    """What :func:`build_report` wrote: the page, its figures, and the run's name, totals and
    learning curve rows (for the Markdown of :func:`artifact_markdown`)."""

    run: str
    again: str  # the command that writes it again, as it works where it is printed
    page: Path
    figures: list[Figure]
    totals: str
    evals: list[dict[str, Any]]


def write_report(root: Path, out: Path) -> Path:
    """Write a run's figures and ``report.html`` into ``out``; return the HTML's path."""
    return build_report(root, out).page


def build_report(root: Path, out: Path) -> RunReport:
    """Write a run's figures and ``report.html`` into ``out``."""
    root = Path(root)
    if not is_run(root):
        raise UbError(f"{root} is not a ub run (no config.yaml or rounds/)")
    views = RunViews(root)
    t = {name: table.to_pylist() for name, table in views.tables().items()}
    if not t["rounds"] and not t["benchmarks"]:
        raise UbError(f"run {root.name} has no committed round yet (and no benchmark "
                      "scores): nothing to plot"
                      + "".join(f"; {warning}" for warning in views.warnings))
    t["training"] = training_rows(views)
    figures = draw_figures(run_plots(t, views.last_ratings().get("matches", {})), out)
    page = out / "report.html"
    summary = totals(t)
    settings = _settings_table(views.config())  # (before the warnings: it may add one)
    _write_page(page, _page(
        f"ub report: {root.name}",
        f"<p>{html.escape(summary)}; data in <code>{html.escape(str(root))}</code></p>"
        + _warnings(views.warnings)
        + f"\n<h2>Learning curve (numbers)</h2>\n{curve_table(t['evals'])}\n",
        figures,
        f"\n<h2>Settings</h2>\n<details open><summary>config.yaml</summary>"
        f"{settings}</details>\n"))
    again = RunPaths(root).command("report") + ("" if out == root / "report" else
                                                f" --out {shlex.quote(str(out))}")
    return RunReport(root.name, again, page, figures, summary, t["evals"])


SHOWN_IN_UI = ("learning_curve", "training_by_opponent", "exploitability")
"""The figures Prefect's artifact shows inline (the page has them all): how well it plays."""


def artifact_markdown(report: RunReport) -> str:
    """The report's head as Markdown for Prefect's UI: the totals, the learning curve's numbers
    and the figures of :data:`SHOWN_IN_UI` as inline images (a browser opens no ``file://``
    link from a served page, so the artifact carries them), then where the whole page is."""
    images = [f"![{f.title}]({data_uri(f.path)})" for f in report.figures
              if f.name in SHOWN_IN_UI]
    return "\n\n".join([
        f"# Report of {report.run}", report.totals + ".",
        curve_markdown(report.evals) if report.evals else "No evaluation yet.", *images,
        f"Every figure and the settings: `{report.page}` (`{report.again}` writes it "
        "again)."])


def write_sweep_report(folder: Path, out: Path) -> Path:
    """Write a folder of runs' overlaid figures and ``report.html`` (with ``ub compare``'s
    table at the latest checkpoint every run evaluated) into ``out``; return the page."""
    from ub.compare import (
        arm_letters,
        arm_names,
        arm_settings,
        compare,
        latest_common_checkpoint,
        measured,
    )

    tables, warnings = sweep_tables(Path(folder))
    t = {name: table.to_pylist() for name, table in tables.items()
         if name in ("runs", "evals", "metrics", "exploitability")}
    if not t["runs"]:
        raise UbError(f"{folder} holds no run" + "".join(f"; {w}" for w in warnings))
    # A run without settings (its config did not read: warned) is in no arm.
    runs = [r for r in t["runs"] if r["settings"] is not None]
    arms = arm_names(runs)
    settings = arm_settings(runs)
    letters = arm_letters(arms.values(), settings)
    lettered = {run: letters[arm] for run, arm in arms.items()}
    figures = draw_figures([
        ("sweep_learning_curves", "Learning curves, every run and each arm's mean",
         lambda fig: sweep.learning_curves(t, lettered, fig)),
        ("sweep_health", "Invalid moves and entropy, each arm's mean",
         lambda fig: sweep.health(t, lettered, fig)),
    ], out)
    checkpoint = latest_common_checkpoint(t["evals"], arms)
    table = "<p>No checkpoint every run evaluated.</p>"
    if checkpoint is not None:
        summaries, _ = compare(measured(t["runs"], t["evals"], t["exploitability"], checkpoint))
        table = _compare_table(summaries, letters, checkpoint)
    legend = _table(("arm", "settings", "runs"), [
        (letter, settings[arm], ", ".join(f"{run} (seed {seed})" for run, seed in
                                ((r["run"], r["seed"]) for r in runs) if arms[run] == arm))
        for arm, letter in letters.items()])
    page = out / "report.html"
    _write_page(page, _page(
        f"ub report: {Path(folder).name} ({len(arms)} runs)",
        f"<p>Data in <code>{html.escape(str(folder))}</code>; <code>ub compare</code> has each "
        "arm's paired differences.</p>" + _warnings(warnings) + f"\n<h2>Arms</h2>\n{legend}"
        f"\n<h2>Arms at checkpoint {checkpoint}</h2>\n{table}\n", figures, ""))
    return page


def _compare_table(summaries: list[Any], letters: dict[str, str], checkpoint: int) -> str:
    head = ("figure", "arm", "seeds", f"mean at checkpoint {checkpoint} [95% t-interval]",
            "seeds above the random player")
    rows = [(s.figure, letters[s.arm], s.seeds,
             f"{s.mean:.3f} [{s.low:.3f}, {s.high:.3f}]",
             f"{s.clears} of {s.barred}" if s.barred else "-") for s in summaries]
    return _table(head, rows)


def _table(head: tuple[str, ...], rows: list[tuple[Any, ...]]) -> str:
    return ("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row)
                      + "</tr>" for row in rows) + "</table>")


def curve_rows(evals: list[dict]) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
    """The learning curve as numbers: its header and one row per (checkpoint, env, opponent),
    by env, opponent and checkpoint (the page's table and the Prefect artifact's)."""
    head = ("checkpoint", "env", "opponent", "moves", "games", "win rate [95% CI]",
            "random player's win", "draws", "losses", "invalid moves")
    return head, [
        (r["update"], r["env_id"], r["opponent"], r.get("legal_moves") or "-", r["games"],
         f"{pct(r['win_rate'])} [{pct(r['win_low'])}, {pct(r['win_high'])}]",
         pct(r.get("baseline_win_rate")), r["draws"], r["losses"], pct(r["invalid_move_rate"]))
        for r in sorted(evals, key=lambda r: (r["env_id"], r["opponent"], r["update"]))]


def curve_table(evals: list[dict]) -> str:
    """:func:`curve_rows` as HTML."""
    if not evals:
        return "<p>No evaluation yet.</p>"
    return _table(*curve_rows(evals))


def curve_markdown(evals: list[dict]) -> str:
    """:func:`curve_rows` in Markdown, for Prefect's UI (``|`` in a name escaped)."""
    head, rows = curve_rows(evals)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _settings_table(config: dict[str, Any] | None) -> str:
    """The run's resolved config (``config.yaml``), one setting a row, keyed as ``--set`` and
    ``ub sweep --arm`` take it (a list one value, in YAML's flow style); ``None``: it did not
    read (the page's warnings say why)."""
    if config is None:
        return "<p class=warn>config.yaml is unreadable (see the warnings above)</p>"
    rows = "".join(f"<tr><td><code>{html.escape(k)}</code></td><td>{html.escape(v)}</td></tr>"
                   for k, v in flat_settings(config).items())
    return f"<table><tr><th>setting</th><th>value</th></tr>{rows}</table>"


def totals(t: Tables) -> str:
    rounds = t["rounds"]
    games = sum(r["games"] or 0 for r in rounds)
    decisions = sum(r["model_decisions"] or 0 for r in rounds)
    invalid = sum(r["invalid_moves"] or 0 for r in rounds)
    seconds = sum(r["round_seconds"] or 0.0 for r in rounds)
    return (f"{len(rounds)} committed rounds, {games} training games, {decisions} model "
            f"decisions ({pct(invalid / decisions) if decisions else '-'} invalid), "
            f"{seconds / 60:.1f} minutes of rounds")


def _warnings(warnings: list[str]) -> str:
    return "".join(f"<p class=warn>{html.escape(w)}</p>" for w in warnings)


def data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def _page(title: str, head: str, figures: list[Figure], tail: str) -> str:
    sections = "\n".join(
        f"<h2>{html.escape(f.title)}</h2>\n<img alt=\"{html.escape(f.title)}\" "
        f'src="{data_uri(f.path)}">' for f in figures)
    return ("<!doctype html><meta charset=utf-8>"
            f"<title>{html.escape(title)}</title>"
            "<style>body{font-family:sans-serif;max-width:1000px;margin:auto}"
            "img{max-width:100%}.warn{color:#a60}table{border-collapse:collapse;font-size:90%}"
            "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}</style>"
            f"<h1>{html.escape(title)}</h1>{head}\n{sections}{tail}")


def _write_page(page: Path, text: str) -> None:
    """The HTML page, atomically: a link put at its name is replaced, not written through."""
    write_atomic(page, lambda handle: handle.write(text.encode("utf-8")))
