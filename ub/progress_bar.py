"""A progress bar for anything long: a round's games, an evaluation, the tiny model's
training. It imports nothing of ub and nothing heavy, so every layer may use it.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, TextIO

from rich.console import Console

_SHOW_BARS = True
"""Whether :func:`progress_bar` shows anything (``ub train --quiet`` turns it off)."""


def duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``1h02m``."""
    whole = round(seconds)
    if whole >= 3600:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
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
        eta = (f", ETA {duration((self.total - self.done) / rate)}"
               if rate > 0 and self.done < self.total else "")
        took = (f" in {duration(time.perf_counter() - self.started)}"
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
