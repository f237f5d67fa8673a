"""What ``ub dashboard`` shows, read from a run's directory only: :func:`gather` reads the round
manifests, the last rating snapshot, the per-round metrics Parquet, the run's lock and its logs
into a plain :class:`DashboardState` (:mod:`ub.dashboard` renders it). Every file but the lock
(opened with ``O_NOFOLLOW``) is read through :class:`RunViews`, which follows no link inside
the run."""

from __future__ import annotations

import os
import socket
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ub.errors import UbError
from ub.run.config.schema import TrackingSection
from ub.run.folder.layout import is_run
from ub.run.folder.lock import holder
from ub.run.folder.views import RunViews
from ub.run.steps.health import env_alerts


@dataclass
class Series:
    label: str
    values: list[float | None]
    bounds: tuple[float, float | None] | None = None
    """The sparkline's fixed range (rates: 0..1; counts: 0..max); ``None``: its own range."""

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


LIVE_LOG_SECONDS = 300.0
"""A run whose logs were written this recently is running, lock or not: a deployment's worker
drives it from a process (or machine) whose lock this one may not see."""

STEPS = {"ub.rollout": "playing games", "ub.learner": "learning", "ub.eval": "evaluating",
         "ub.pool": "rating", "ub.flow": "between steps", "vllm": "starting the engine"}
"""The step of a round that each component's newest log line means."""


def run_phase(root: Path) -> str:
    """``running`` while a live process holds the run's lock (``running on HOST`` for another
    machine sharing the directory), else ``idle``; read without taking the lock."""
    held = holder(root / "run.lock")
    if held is None:
        return "idle"
    host = held.get("host")
    return f"running on {host}" if host and host != socket.gethostname() else "running"


def latest_activity(views: RunViews) -> str:
    """The newest line of the run's component logs (``RUN/logs/*.log``): what it is doing now."""
    newest = ""
    for log in views.files(views.root / "logs", "*.log"):
        try:
            with log.open("rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
                lines = f.read().decode("utf-8", "replace").splitlines()
        except OSError:
            continue
        last = next((line for line in reversed(lines) if line[:4].isdigit()), "")
        newest = max(newest, last)  # lines start with a sortable timestamp
    return newest


def log_age(line: str) -> float | None:
    """Seconds since a log line (``2026-11-24 09:00:00,123 INFO ...``, local time) was written;
    ``None`` if it has no timestamp."""
    from datetime import datetime

    try:
        stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    except ValueError:
        return None
    return (datetime.now() - stamp).total_seconds()


def log_step(line: str) -> str:
    """The step a log line is about (``playing games``, ``learning``, ...), from its logger."""
    parts = line.split()
    name = parts[3] if len(parts) > 3 else ""
    return next((step for prefix, step in STEPS.items()
                 if name == prefix or name.startswith(prefix + ".")), "")


def gather(root: Path, cache: dict | None = None) -> DashboardState:
    """Read the run at ``root`` into a :class:`DashboardState`; pass the same ``cache`` dict on
    every refresh to parse only the files written since the last one."""
    import pyarrow.compute as pc

    root = Path(root)
    if not root.is_dir() or not is_run(root):
        raise UbError(f"{root} is not a ub run (no config.yaml or rounds/): give a run "
                      "directory, e.g. runs/demo")
    views = RunViews(root, cache)
    config = views.config() or {}
    total = config.get("rounds")
    rounds = views.rounds().to_pylist()
    learner = views.learner().to_pylist()
    evals = views.evals().to_pylist()
    metrics = views.metrics()
    collection = metrics.filter(pc.starts_with(metrics["metric"], "collection/")).to_pylist()
    activity = latest_activity(views)
    state = DashboardState(root.name, str(root), _phase(root, activity, len(rounds), total),
                           len(rounds), total)
    state.activity = activity

    if rounds:
        state.throughput = _throughput(rounds[-1], learner)
    snapshot = views.last_ratings()
    mirrors = mirror_records(views, len(rounds), cache)
    state.ladder, state.matches = _ladder(snapshot, mirrors)
    state.series = _series(rounds, learner, evals, collection)
    state.host = _host_load()
    state.warnings = _alerts(config, collection) + views.warnings
    return state


def _alerts(config: dict[str, Any], collection: list[dict[str, Any]]) -> list[str]:
    """The last round's collapse warnings (:func:`ub.run.steps.health.env_alerts`), at the run's
    thresholds (the defaults where its config does not say)."""
    if not collection:
        return []
    last = max(m["round"] for m in collection)
    tracking = config.get("tracking")
    if not isinstance(tracking, dict):
        tracking = {}
    try:
        settings = TrackingSection(**{k: v for k, v in tracking.items() if k.startswith("alert_")})
    except ValueError:
        settings = TrackingSection()
    alerts = env_alerts({m["metric"]: m["value"] for m in collection if m["round"] == last},
                        settings.alert_invalid_move_rate, settings.alert_entropy)
    return [f"round {last + 1}: {alert}" for alert in alerts]


def _phase(root: Path, activity: str, done: int, total: int | None) -> str:
    """What the run is doing: running (and its step), finished, stopped or waiting."""
    age = log_age(activity)
    phase = run_phase(root)
    if phase == "idle":
        if total is not None and done >= total:
            phase = "finished"
        elif age is not None and age < LIVE_LOG_SECONDS:
            # No lock visible here, but its logs move: a deployment's worker drives it.
            phase = f"running (log {age:.0f} s ago)"
        else:
            phase = "waiting for the first round" if not done else "stopped"
    if phase.startswith("running") and log_step(activity):
        phase += f": {log_step(activity)}"
    return phase


def _throughput(last: dict[str, Any], learner: list[dict[str, Any]]) -> dict[str, float]:
    """The last round's rates (``last``: its round manifest row)."""
    play = last["rollout_seconds"] or 0.0
    return {
        "games/s": last["games"] / play if play else 0.0,
        "generated tokens/s": last["generated_tokens"] / play if play else 0.0,
        "learner tokens/s": (learner[-1]["tokens_per_second"] or 0.0) if learner else 0.0,
        "round seconds": last["round_seconds"] or 0.0,
    }


def _ladder(snapshot: dict[str, Any], mirrors: dict[str, list[int]]
            ) -> tuple[list[dict[str, Any]], dict[str, dict[str, list[int]]]]:
    """The leaderboard (best conservative rating first) and the match matrix, mirror games
    included."""
    members = []
    for m in snapshot.get("members", []):
        m = {**m, "conservative": m["mu"] - 3 * m["sigma"]}
        # The snapshot leaves mirror games (unrated) out of W/D/L: count each seat's result.
        for i, key in enumerate(("wins", "draws", "losses")):
            m[key] = m[key] + mirrors.get(m["name"], [0, 0, 0])[i]
        members.append(m)
    ladder = sorted(members, key=lambda m: (-m["conservative"], m["name"]))
    matches = {a: dict(row) for a, row in snapshot.get("matches", {}).items()}
    for name, wdl in mirrors.items():
        matches.setdefault(name, {})[name] = wdl
    return ladder, matches


def _series(rounds: list[dict[str, Any]], learner: list[dict[str, Any]],
            evals: list[dict[str, Any]], collection: list[dict[str, Any]]) -> list[Series]:
    """The curves, one value a round: win rates per eval opponent, then the collection and
    learner figures."""
    n = len(rounds)
    by_round: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for m in sorted(collection, key=lambda m: m["metric"]):  # (envs in one order per key)
        parts = m["metric"].split("/")
        if len(parts) == 3:
            by_round[parts[2]][m["round"]].append(m["value"])

    def mean_series(key: str) -> list[float | None]:
        """The round's per-env values weighted by each env's decisions (as the progress line
        and SQL over the decisions weigh them); equal weights for runs that predate the
        ``decisions`` metric."""
        out: list[float | None] = []
        for r in range(n):
            values, weights = by_round[key].get(r), by_round["decisions"].get(r)
            if not values:
                out.append(None)
            elif weights and len(weights) == len(values) and sum(weights) > 0:
                out.append(sum(v * w for v, w in zip(values, weights, strict=True))
                           / sum(weights))
            else:
                out.append(sum(values) / len(values))
        return out

    def per_decision(key: str) -> list[float | None]:
        """A round's total of ``key`` over its model decisions (round manifests)."""
        return [r[key] / r["model_decisions"] if r.get(key) is not None
                and r.get("model_decisions") else None for r in rounds]

    curves: dict[str, list[float | None]] = {}
    for e in evals:
        label = f"win vs {e['opponent']} ({e['env_id']})"
        curves.setdefault(label, [None] * n)
        if e["round"] < n:
            curves[label][e["round"]] = e["win_rate"]
    rate = (0.0, 1.0)
    series = [Series(label, values, rate) for label, values in sorted(curves.items())]
    series += [
        Series("invalid-move rate", per_decision("invalid_moves"), rate),
        Series("format success", mean_series("format_rate"), rate),
        Series("response tokens", per_decision("generated_tokens")),
        Series("truncated sequences", [r["truncated"] for r in learner], (0.0, None)),
        Series("learner loss", [r["loss"] for r in learner]),
        Series("gradient norm", [r["grad_norm"] for r in learner]),
    ]
    return series


def _host_load() -> dict[str, float]:
    """This machine's CPU, memory and (where NVIDIA's library is installed) GPU load."""
    import psutil

    memory = psutil.virtual_memory()
    host = {"cpu %": psutil.cpu_percent(interval=None), "memory %": memory.percent,
            "memory used GB": memory.used / 1e9}
    try:
        import pynvml  # only where NVIDIA's library is installed

        pynvml.nvmlInit()
        for i in range(pynvml.nvmlDeviceGetCount()):
            util = pynvml.nvmlDeviceGetUtilizationRates(pynvml.nvmlDeviceGetHandleByIndex(i))
            host[f"gpu{i} %"] = float(util.gpu)
    except Exception:  # no GPU, no driver or no pynvml: nothing to show
        pass
    return host


def mirror_records(views: RunViews, rounds: int, cache: dict | None = None
                   ) -> dict[str, list[int]]:
    """``[wins, draws, losses]`` of each actor in its mirror games (every seat the same actor)
    of the first ``rounds`` rounds, counted per seat: a self-play game is one win and one loss
    (or two draws) for the checkpoint. Reads only the ``games`` shards' ``actors`` and
    ``results`` columns (and which games are copies, ub.branching: those are not counted), each
    file once per ``cache``."""
    from ub.branching import played_games
    from ub.data.shards import shard_path

    seen: dict[str, dict[str, list[int]]] = ({} if cache is None
                                             else cache.setdefault("mirrors", {}))
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for sid in views.committed_shards():
        if sid.round >= rounds:
            continue  # a round in progress: not in the ratings snapshot either
        path = shard_path(views.root, "games", sid)
        key = f"{path}:{path.stat().st_mtime_ns}"
        if key not in seen:
            counts: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
            try:
                games = played_games([path], ["actors", "results"]).to_pylist()
            except (OSError, ValueError):
                games = []  # a damaged shard: `ub doctor` names it
            for g in games:
                actors, results = g["actors"] or [], g["results"] or []
                if len(set(actors)) == 1 and len(actors) > 1 and len(results) == len(actors):
                    for result in results:
                        if result in ("win", "draw", "loss"):
                            counts[actors[0]][("win", "draw", "loss").index(result)] += 1
            seen[key] = dict(counts)
        for name, wdl in seen[key].items():
            totals[name] = [a + b for a, b in zip(totals[name], wdl, strict=True)]
    return dict(totals)
