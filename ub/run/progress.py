"""What ``ub train`` prints: a line per round and, at the end, the learning curve; and a
progress bar for anything long (a round's games, an evaluation, the tiny model's training).

Everything shown is read back from the round manifests, so a resumed run's summary covers the
rounds of earlier processes too. This module imports nothing heavy: :mod:`ub.model.tiny` and
:mod:`ub.run.play` use :func:`progress_bar` too.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

from rich.console import Console
from rich.table import Table

from ub.run.layout import read_json

if TYPE_CHECKING:
    from ub.run.rounds import Run

_SHOW_BARS = True
"""Whether :func:`progress_bar` shows anything (``ub train --quiet`` turns it off)."""


def _duration(seconds: float) -> str:
    whole = round(seconds)
    return f"{whole // 60}m{whole % 60:02d}s" if whole >= 60 else f"{whole}s"


class ProgressBar:
    """``(done, total)`` callback for a long loop: a Rich bar (done/total, rate, ETA) on a
    terminal; elsewhere (CI, logs, Ray workers) a plain line every ``every`` seconds and one at
    the end, so a 400-game evaluation is never minutes of silence. With a ``logger`` the plain
    lines also go to it in both cases (the run's log files, which the dashboard shows).

    It closes itself when ``done`` reaches ``total``; use it as a context manager where the loop
    may stop early (an exception), so a terminal is left clean.
    """

    def __init__(self, label: str, total: int, unit: str, *, stream: TextIO | None = None,
                 every: float = 30.0, logger: logging.Logger | None = None,
                 enabled: bool = True) -> None:
        self.label, self.total, self.unit = label, total, unit
        self.every, self.logger = every, logger
        self.stream = stream if stream is not None else sys.stderr
        self.started = time.perf_counter()
        self.last_line = self.started
        self.done = 0
        self._bar: Any = None
        self._task: Any = None
        self.closed = not (enabled and _SHOW_BARS) or total <= 0
        if not self.closed and self.stream.isatty():
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TaskProgressColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            console = Console(file=self.stream)
            self._bar = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn(unit), TaskProgressColumn(),
                TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TextColumn("ETA"),
                TimeRemainingColumn(), console=console, transient=True)
            self._task = self._bar.add_task(label, total=total, rate="")
            self._bar.start()

    def rate(self) -> float:
        elapsed = time.perf_counter() - self.started
        return self.done / elapsed if elapsed > 0 else 0.0

    def line(self) -> str:
        """The plain-text state: ``label: 120/400 games (3.1 games/s, ETA 1m30s)``."""
        rate = self.rate()
        eta = (f", ETA {_duration((self.total - self.done) / rate)}"
               if rate > 0 and self.done < self.total else "")
        took = (f" in {_duration(time.perf_counter() - self.started)}"
                if self.done >= self.total else "")
        return (f"{self.label}: {self.done}/{self.total} {self.unit} ({rate:.1f} {self.unit}/s"
                f"{eta}){took}")

    def __call__(self, done: int, total: int | None = None) -> None:
        if self.closed:
            return
        self.done = done
        if total is not None:
            self.total = total
        if self._bar is not None:
            self._bar.update(self._task, completed=done, total=self.total,
                             rate=f"{self.rate():.1f} {self.unit}/s")
        now = time.perf_counter()
        if now - self.last_line >= self.every and done < self.total:
            self.last_line = now
            self._plain(self.line())
        if done >= self.total:
            self.close()

    def _plain(self, text: str) -> None:
        if self.logger is not None:
            self.logger.info("%s", text)
        if self._bar is None:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        """Take the bar off the terminal (a plain stream gets the final line)."""
        if self.closed:
            return
        self.closed = True
        if self._bar is not None:
            self._bar.stop()
        if self.done >= self.total:
            self._plain(self.line())

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress_bar(label: str, total: int, unit: str = "games", **kwargs: Any) -> ProgressBar:
    """A :class:`ProgressBar` for ``total`` ``unit`` (nothing shown under ``--quiet``)."""
    return ProgressBar(label, total, unit, **kwargs)


def show_progress_bars(show: bool) -> None:
    """Turn :func:`progress_bar` on or off for this process (``ub train --quiet``: off)."""
    global _SHOW_BARS
    _SHOW_BARS = show


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def eval_cell(row: dict[str, Any]) -> str:
    return f"{_pct(row['win_rate'])} [{_pct(row['win_low'])}, {_pct(row['win_high'])}]"


def baseline_cell(row: dict[str, Any]) -> str:
    """The random player's win rate in the same seats on the same seeds, or ``-``."""
    if row.get("baseline_win_rate") is None:
        return "-"
    return (f"{_pct(row['baseline_win_rate'])} [{_pct(row['baseline_low'])}, "
            f"{_pct(row['baseline_high'])}]")


class Progress:
    """Round-by-round console output of one ``selfplay`` call."""

    def __init__(self, run: Run, quiet: bool = False) -> None:
        self.run = run
        self.console = Console(quiet=quiet, highlight=False)
        show_progress_bars(not quiet)
        if not self.console.is_terminal:  # logs and CI: rich would wrap at 80 columns
            self.console.width = max(self.console.width, 120)
        self.started = time.perf_counter()

    def note(self, text: str) -> None:
        self.console.print(f"[dim]{text}[/dim]")

    def start(self, first_round: int) -> None:
        c = self.run.config
        what = "starting" if first_round == 0 else f"resuming at round {first_round}"
        self.console.print(
            f"[bold]ub train[/bold] run [cyan]{self.run.name}[/cyan] ({what}; "
            f"{c.rounds} rounds of {c.rollout.games_per_round} games on "
            f"{', '.join(e.env_id for e in c.envs)}) -> {self.run.paths.location}")

    def round_done(self, round_: int, m: dict[str, Any]) -> None:
        t = m["timings"]
        play = t["rollout"]
        rate = (f"{m['games'] / play:.1f} games/s, {m['generated_tokens'] / play:.0f} tok/s"
                if play > 0 else "reused")
        invalid = m["invalid_moves"] / m["model_decisions"] if m["model_decisions"] else 0.0
        learner = m["learner"]
        line = (f"round {round_ + 1}/{self.run.config.rounds}  {m['games']} games ({rate})  "
                f"invalid {_pct(invalid)}  loss {learner.get('loss', 0.0):+.4f}  "
                f"grad {learner.get('grad_norm', 0.0):.3f}")
        for update, rows in sorted(m["evals"].items(), key=lambda kv: int(kv[0])):
            for row in rows:
                line += (f"\n    eval ckpt {int(update)} vs {row['opponent']} on "
                         f"{row['env_id']}: win {eval_cell(row)}, "
                         f"invalid {_pct(row['invalid_move_rate'])}")
        self.console.print(f"{line}  [dim]({t['round']:.0f} s)[/dim]")

    def finish(self) -> dict[str, Any]:
        """Print the learning curve over every committed round; return the run's summary."""
        curve = learning_curve(self.run)
        table = Table(title=f"learning curve of {self.run.name}")
        for column in ("checkpoint", "env", "opponent", "games", "win rate [95% CI]",
                       "random in its seats", "draws", "invalid moves"):
            table.add_column(column)
        for update, row in curve:
            table.add_row(str(update), row["env_id"], row["opponent"], str(row["games"]),
                          eval_cell(row), baseline_cell(row), str(row["draws"]),
                          _pct(row["invalid_move_rate"]))
        if curve:
            self.console.print(table)
        paths = self.run.paths
        where = paths.location
        runs_root = f" --root {where.rsplit('/', 1)[0]}" if paths.store else ""
        self.console.print(
            f"run data: {where}  (query it: ub sql {where} \"SELECT ...\"; "
            f"resume or extend: ub train --resume {self.run.name}{runs_root} --rounds N)  "
            f"[dim]{time.perf_counter() - self.started:.0f} s[/dim]")
        last = paths.committed_rounds()
        return {"run": self.run.name, "root": str(paths.root), "store": paths.store,
                "rounds": len(last), "evals": [{"update": u, **row} for u, row in curve]}


def round_summary_markdown(run: Run, round_: int, m: dict[str, Any]) -> str:
    """A short markdown summary of a round (for the Prefect UI)."""
    t = m["timings"]
    invalid = m["invalid_moves"] / m["model_decisions"] if m["model_decisions"] else 0.0
    lines = [f"# {run.name}: round {round_ + 1} of {run.config.rounds}", "",
             f"- {m['games']} games, {m['model_decisions']} model decisions, invalid moves "
             f"{_pct(invalid)}",
             f"- learner: loss {m['learner'].get('loss', 0.0):+.4f}, grad norm "
             f"{m['learner'].get('grad_norm', 0.0):.3f}, {m['learner'].get('tokens', 0)} tokens",
             f"- time: {t['round']:.1f} s (rollout {t['rollout']:.1f}, eval {t['eval']:.1f}, "
             f"learner {t['learner']:.1f}, other {t['other']:.1f})"]
    for update, rows in sorted(m["evals"].items(), key=lambda kv: int(kv[0])):
        for row in rows:
            lines.append(f"- eval checkpoint {update} vs {row['opponent']} on {row['env_id']}: "
                         f"win {eval_cell(row)}")
    where = run.paths.location
    lines += ["", f"Data: `{where}`; query it with `ub sql {where}`."]
    return "\n".join(lines)


def learning_curve(run: Run) -> list[tuple[int, dict[str, Any]]]:
    """Every evaluation of the run, in checkpoint order: ``(update, row)``."""
    out: list[tuple[int, dict[str, Any]]] = []
    for round_ in run.paths.committed_rounds():
        manifest = read_json(run.paths.manifest(round_))
        for update, rows in sorted(manifest.get("evals", {}).items(), key=lambda kv: int(kv[0])):
            out.extend((int(update), row) for row in rows)
    return out
