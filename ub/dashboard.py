"""``ub dashboard RUN``: a live terminal view of a run, read from its directory only.

:func:`gather` reads the run (round manifests, the last rating snapshot, the per-round metrics
Parquet) into a plain :class:`DashboardState`; :func:`render` turns that into Rich panels. Nothing
scans the decisions themselves: per-round figures come from ``metrics/`` (written by the flow), so
a refresh costs the same on a run of a thousand decisions or a million. The dashboard works
from any machine that sees the run directory, and on a finished run it shows how it ended.
"""

from __future__ import annotations

import os
import socket
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ub.errors import UbError
from ub.run.lock import holder
from ub.run.views import RunViews, is_run

SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float | None], width: int = 40) -> str:
    """Unicode bars scaled to the series' own range (missing values are spaces)."""
    values = values[-width:]
    present = [v for v in values if v is not None]
    if not present:
        return ""
    low, high = min(present), max(present)
    span = (high - low) or 1.0
    return "".join(" " if v is None else SPARKS[int((v - low) / span * (len(SPARKS) - 1))]
                   for v in values)


@dataclass
class Series:
    label: str
    values: list[float | None]

    @property
    def last(self) -> float | None:
        return next((v for v in reversed(self.values) if v is not None), None)


@dataclass
class DashboardState:
    """Everything the dashboard shows, as plain data."""

    name: str
    root: str
    phase: str
    rounds_done: int
    rounds_total: int | None
    throughput: dict[str, float] = field(default_factory=dict)
    ladder: list[dict[str, Any]] = field(default_factory=list)
    matches: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    series: list[Series] = field(default_factory=list)
    host: dict[str, float] = field(default_factory=dict)
    activity: str = ""
    warnings: list[str] = field(default_factory=list)


def run_phase(root: Path) -> str:
    """``running`` while a live process holds the run's lock (``running on HOST`` for another
    machine sharing the directory), else ``idle``; read without taking the lock."""
    held = holder(root / "run.lock")
    if held is None:
        return "idle"
    host = held.get("host")
    return f"running on {host}" if host and host != socket.gethostname() else "running"


def latest_activity(root: Path) -> str:
    """The newest line of the run's component logs (``RUN/logs/*.log``): what it is doing now."""
    newest = ""
    for log in (root / "logs").glob("*.log"):
        try:
            with log.open("rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
                lines = f.read().decode("utf-8", "replace").splitlines()
        except OSError:
            continue
        last = next((line for line in reversed(lines) if line[:4].isdigit()), "")
        newest = max(newest, last)  # lines start with a sortable timestamp
    return newest


def gather(root: Path, cache: dict | None = None) -> DashboardState:
    """Read the run at ``root`` into a :class:`DashboardState`; pass the same ``cache`` dict on
    every refresh to parse only the files written since the last one."""
    import psutil
    import pyarrow.compute as pc
    import yaml

    root = Path(root)
    if not root.is_dir() or not is_run(root):
        raise UbError(f"{root} is not a ub run (no config.yaml or rounds/): give a run "
                      "directory, e.g. runs/demo")
    try:
        total = int((yaml.safe_load((root / "config.yaml").read_text()) or {}).get("rounds"))
    except (OSError, ValueError, TypeError, yaml.YAMLError):
        total = None
    views = RunViews(root, cache)
    rounds = views.rounds().to_pylist()
    learner = views.learner().to_pylist()
    evals = views.evals().to_pylist()
    metrics = views.metrics()
    collection = metrics.filter(pc.starts_with(metrics["metric"], "collection/")).to_pylist()
    phase = run_phase(root)
    if phase == "idle":
        phase = "finished" if total is not None and len(rounds) >= total else (
            "waiting for the first round" if not rounds else "stopped")
    state = DashboardState(root.name, str(root), phase, len(rounds), total)
    if phase.startswith("running"):
        state.activity = latest_activity(root)

    if rounds:
        last = rounds[-1]
        play = last["rollout_seconds"] or 0.0
        state.throughput = {
            "games/s": last["games"] / play if play else 0.0,
            "generated tokens/s": last["generated_tokens"] / play if play else 0.0,
            "learner tokens/s": (learner[-1]["tokens_per_second"] or 0.0) if learner else 0.0,
            "round seconds": last["round_seconds"] or 0.0,
        }
    snapshot = views.last_ratings()
    state.ladder = sorted(
        ({**m, "conservative": m["mu"] - 3 * m["sigma"]} for m in snapshot.get("members", [])),
        key=lambda m: (-m["conservative"], m["name"]))
    state.matches = snapshot.get("matches", {})

    n = len(rounds)
    by_round: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for m in collection:
        parts = m["metric"].split("/")
        if len(parts) == 3:
            by_round[parts[2]][m["round"]].append(m["value"])

    def mean_series(key: str) -> list[float | None]:
        return [sum(v) / len(v) if (v := by_round[key].get(r)) else None for r in range(n)]

    curves: dict[str, list[float | None]] = {}
    for e in evals:
        label = f"win vs {e['opponent']} ({e['env_id']})"
        curves.setdefault(label, [None] * n)
        if e["round"] < n:
            curves[label][e["round"]] = e["win_rate"]
    state.series = [Series(label, values) for label, values in sorted(curves.items())]
    state.series += [
        Series("invalid-move rate", mean_series("invalid_move_rate")),
        Series("format success", mean_series("format_rate")),
        Series("response tokens", mean_series("response_tokens")),
        Series("truncated sequences", [r["truncated"] for r in learner]),
        Series("learner loss", [r["loss"] for r in learner]),
        Series("gradient norm", [r["grad_norm"] for r in learner]),
    ]
    memory = psutil.virtual_memory()
    state.host = {"cpu %": psutil.cpu_percent(interval=None), "memory %": memory.percent,
                  "memory used GB": memory.used / 1e9}
    try:
        import pynvml  # only where NVIDIA's library is installed

        pynvml.nvmlInit()
        for i in range(pynvml.nvmlDeviceGetCount()):
            util = pynvml.nvmlDeviceGetUtilizationRates(pynvml.nvmlDeviceGetHandleByIndex(i))
            state.host[f"gpu{i} %"] = float(util.gpu)
    except Exception:  # no GPU, no driver or no pynvml: nothing to show
        pass
    state.warnings = views.warnings
    return state


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def render(state: DashboardState) -> Group:
    """The dashboard as Rich renderables."""
    total = state.rounds_total if state.rounds_total is not None else "?"
    head = Text(f"{state.name}  round {state.rounds_done}/{total}  [{state.phase}]  "
                f"{state.root}", style="bold")
    throughput = "  ".join(f"{k}: {v:.1f}" for k, v in state.throughput.items()) or "-"
    host = "  ".join(f"{k}: {v:.1f}" for k, v in state.host.items())

    ladder = Table(box=None, expand=False)
    for column in ("member", "mu", "sigma", "mu-3σ", "games", "W", "D", "L", ""):
        ladder.add_column(column)
    top = max((m["mu"] + m["sigma"] for m in state.ladder), default=1.0) or 1.0
    for m in state.ladder[:12]:
        bar = "█" * max(1, int(20 * max(m["mu"], 0) / top))
        ladder.add_row(m["name"], f"{m['mu']:.2f}", f"{m['sigma']:.2f}",
                       f"{m['conservative']:.2f}", str(m["games"]), str(m["wins"]),
                       str(m["draws"]), str(m["losses"]), bar)

    names = sorted(state.matches)
    matrix = Table(box=None)
    matrix.add_column("vs")
    for name in names:
        matrix.add_column(name[-6:] if name.startswith("ckpt-") else name[:8])
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
        matrix.add_row(a, *cells)

    trends = Table(box=None)
    for column in ("series", "last", "over rounds"):
        trends.add_column(column)
    for s in state.series:
        trends.add_row(s.label, _fmt(s.last), sparkline(s.values))

    parts: list[Any] = [head]
    if state.activity:
        parts.append(Text(f"now: {state.activity}", style="dim", overflow="ellipsis",
                          no_wrap=True))
    parts += [
        Panel(throughput, title="throughput (last round)"),
        Panel(ladder if state.ladder else Text("no ratings yet"), title="TrueSkill ladder"),
        Panel(matrix if names else Text("no rated matches yet"),
              title="match matrix (W/D/L of row vs column)"),
        Panel(trends, title="trends"),
        Panel(host, title="host"),
    ]
    if state.warnings:
        parts.append(Text("\n".join(state.warnings), style="yellow"))
    parts.append(Text("q quits", style="dim"))
    return Group(*parts)


def run_dashboard(root: Path, *, once: bool = False, refresh: float = 2.0) -> None:
    """Show the dashboard; refresh every ``refresh`` seconds until ``q`` (or Ctrl-C)."""
    import select
    import sys
    import termios
    import tty

    from rich.console import Console
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
