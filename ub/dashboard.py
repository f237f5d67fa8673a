"""``ub dashboard RUN``: a live terminal view of a run, read from its directory only.

:func:`ub.dashboard_state.gather` reads the run (round manifests, the last rating snapshot, the
per-round metrics Parquet) into a plain :class:`~ub.dashboard_state.DashboardState`;
:func:`render` turns that into Rich panels. Nothing scans the decisions themselves: per-round
figures come from ``metrics/`` (written by the flow), so a refresh costs the same on a run of a
thousand decisions or a million. The dashboard works from any machine that sees the run
directory, and on a finished run it shows how it ended.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ub.dashboard_state import DashboardState, gather
from ub.display import printable, shown

SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float | None], width: int = 40,
              bounds: tuple[float, float | None] | None = None, min_span: float = 0.1) -> str:
    """Unicode bars (missing values are spaces) on ``bounds`` (a rate: ``(0, 1)``; a count:
    ``(0, None)``, up to the series' maximum), or else on the series' own range widened to at
    least ``min_span`` of its magnitude, centred: a 1.000 -> 0.998 dip must not fill the whole
    height."""
    values = values[-width:]
    present = [v for v in values if v is not None]
    if not present:
        return ""
    if bounds is not None:
        low, high = bounds[0], bounds[1] if bounds[1] is not None else max(max(present), 1.0)
    else:
        low, high = min(present), max(present)
        floor = min_span * max(abs(low), abs(high)) or 1.0
        if high - low < floor:
            middle = (high + low) / 2
            low, high = middle - floor / 2, middle + floor / 2
    span = high - low
    top = len(SPARKS) - 1
    return "".join(" " if v is None else SPARKS[min(top, max(0, round((v - low) / span * top)))]
                   for v in values)


MATRIX_CHECKPOINTS = 5
"""Checkpoints in the dashboard's match matrix (the newest; fixed opponents always): W/D/L
cells stay readable in 80 columns."""


def matrix_members(matches: dict[str, dict[str, list[int]]]) -> list[str]:
    """The match matrix's rows and columns: the newest checkpoints, then the fixed opponents."""
    from ub.actors.names import checkpoint_update

    names = set(matches) | {b for row in matches.values() for b in row}
    checkpoints = sorted((u, n) for n in names if (u := checkpoint_update(n)) is not None)
    return ([n for _, n in checkpoints[-MATRIX_CHECKPOINTS:]]
            + sorted(n for n in names if checkpoint_update(n) is None))


def _short(name: str) -> str:
    """``ckpt-000012`` -> ``c12``; other names cut to 8 characters."""
    from ub.actors.names import checkpoint_update

    update = checkpoint_update(name)
    return f"c{update}" if update is not None else name[:8]


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def render(state: DashboardState) -> Group:
    """The dashboard as Rich renderables."""
    total = state.rounds_total if state.rounds_total is not None else "?"
    head = Text(printable(f"{state.name}  round {state.rounds_done}/{total}  [{state.phase}]  "
                          f"{state.root}"), style="bold")
    throughput = "  ".join(f"{k}: {v:.1f}" for k, v in state.throughput.items()) or "-"
    host = "  ".join(f"{k}: {v:.1f}" for k, v in state.host.items())

    ladder = Table(box=None, expand=False)
    for column in ("member", "mu", "sigma", "mu-3σ", "games", "W", "D", "L", ""):
        ladder.add_column(column)
    top = max((m["mu"] + m["sigma"] for m in state.ladder), default=1.0) or 1.0
    for m in state.ladder[:12]:
        bar = "█" * max(1, int(20 * max(m["mu"], 0) / top))
        ladder.add_row(shown(m["name"]), f"{m['mu']:.2f}", f"{m['sigma']:.2f}",
                       f"{m['conservative']:.2f}", str(m["games"]), str(m["wins"]),
                       str(m["draws"]), str(m["losses"]), bar)

    names = matrix_members(state.matches)
    matrix = Table(box=None)
    matrix.add_column("vs")
    for name in names:
        matrix.add_column(shown(_short(name)), no_wrap=True)
    most = max((sum(c) for row in state.matches.values() for c in row.values()), default=1)
    for a in names:
        cells = []
        for b in names:
            wdl = state.matches.get(a, {}).get(b)
            if not wdl:
                cells.append("·")
                continue
            heat = ("grey50", "yellow", "orange1", "red")[min(3, int(4 * sum(wdl) / most))]
            cells.append(f"[{heat}]{wdl[0]}/{wdl[1]}/{wdl[2]}[/{heat}]")
        matrix.add_row(shown(_short(a)), *cells)

    trends = Table(box=None)
    for column in ("series", "last", "over rounds"):
        trends.add_column(column)
    for s in state.series:
        trends.add_row(s.label, _fmt(s.last), sparkline(s.values, bounds=s.bounds))

    parts: list[Any] = [head]
    if state.activity:
        now = "now" if state.phase.startswith("running") else "last log"
        parts.append(Text(printable(f"{now}: {state.activity}"), style="dim", overflow="ellipsis",
                          no_wrap=True))
    parts += [
        Panel(throughput, title="throughput (last round)"),
        Panel(ladder if state.ladder else Text("no ratings yet"), title="TrueSkill ladder"),
        Panel(matrix if names else Text("no rated matches yet"),
              title="match matrix (W/D/L of row vs column; cN = ckpt-N)"),
        Panel(trends, title="trends"),
        Panel(host, title="host"),
    ]
    if state.warnings:
        parts.append(Text(printable("\n".join(state.warnings)), style="yellow"))
    parts.append(Text("q quits", style="dim"))
    return Group(*parts)


def run_dashboard(root: Path, *, once: bool = False, refresh: float = 2.0) -> None:
    """Show the dashboard; refresh every ``refresh`` seconds until ``q`` (or Ctrl-C)."""
    import select
    import sys
    import termios
    import tty

    from rich.live import Live

    console = Console()
    cache: dict = {}
    state = gather(root, cache)
    if once:
        console.print(render(state))
        return
    interactive = sys.stdin.isatty()
    saved = termios.tcgetattr(sys.stdin) if interactive else None
    try:
        if interactive:
            tty.setcbreak(sys.stdin.fileno())  # single keys, no echo
        with Live(render(state), console=console, screen=True, auto_refresh=False) as live:
            next_refresh = time.monotonic() + refresh
            while True:
                timeout = max(0.0, next_refresh - time.monotonic())
                if interactive:
                    ready, _, _ = select.select([sys.stdin], [], [], timeout)
                    if ready and sys.stdin.read(1).lower() == "q":
                        return
                else:
                    time.sleep(timeout)
                if time.monotonic() >= next_refresh:
                    live.update(render(gather(root, cache)), refresh=True)
                    next_refresh = time.monotonic() + refresh
    except KeyboardInterrupt:
        return
    finally:
        if saved is not None:
            termios.tcsetattr(sys.stdin, termios.TCSADRAIN, saved)
