"""Arms against arms over paired seeds, from the runs' own data (``ub compare``).

A sweep is a folder of runs (:mod:`ub.run.folder.sweep`); its runs differ in some settings
(the ``runs`` view's ``settings``) and in their seed. An **arm** is the runs that share their
settings, shown by the name ``ub sweep`` gave it where that is known (:func:`arm_names`); the
first arm by name is the reference unless one is named. For every
figure the runs evaluated at one checkpoint (the latest that every run evaluated, unless one is
named): a checkpoint's win rate against each opponent on each env, as each run played those
games (masked or free: arms that differ in it pair; the table says which), its rate of games
not lost, where any run drew one, and its exploitability
(NashConv, under each way it was measured), each arm's mean over its seeds with a 95%
t-interval, how many of its seeds' own intervals clear the random player's (the bar: the random
player's win rate in the same seats on the same games), and for every other arm its paired
difference from the reference on the seeds both ran: the mean, its standard error and how many
seeds went up. docs/learning.md's tables are these.

Every seed counts once (:func:`comparable_runs`): a run whose config did not read (no settings
or no seed in the ``runs`` view) is in no arm, and a run that repeats an arm's seed (two arms
whose settings resolve alike, a copied run) is left out, the first of them by name counting;
each left out with a line saying why.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# Student's t at 0.975 for 1..30 degrees of freedom (beyond: the normal's 1.96).
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


@dataclass(frozen=True)
class Measured:
    """One run's figure: ``clears`` is whether its interval is above the random player's
    (``None``: no bar, as for NashConv or an opponent the random player was not measured
    against)."""

    run: str
    arm: str
    seed: int
    figure: str
    value: float
    clears: bool | None
    moves: str | None = None  # how its games were played: "mask", "free" (None: not games)


@dataclass(frozen=True)
class ArmFigure:
    """An arm's figure over its seeds: mean, 95% t-interval (equal to the mean for one seed;
    cut at 0, and at 1 for a rate) and how many seeds' intervals clear the random player's
    (of those with a bar)."""

    figure: str
    arm: str
    seeds: int
    mean: float
    low: float
    high: float
    clears: int
    barred: int
    moves: str = ""  # how its seeds' games were played ("mask", "free"; "": not games)


@dataclass(frozen=True)
class Paired:
    """An arm less the reference arm, seed by seed, on the seeds both ran."""

    figure: str
    arm: str
    reference: str
    seeds: int
    mean: float
    se: float | None
    up: int


def arm_label(settings: Iterable[tuple[str, str]]) -> str:
    """An arm's settings as ``key=value``, comma-separated (``(base)``: none): what makes it
    an arm, and its name where the sweep's is not known (:func:`arm_names`)."""
    text = ", ".join(f"{key}={value}" for key, value in sorted(settings))
    return text or "(base)"


def arm_names(runs: list[dict[str, Any]]) -> dict[str, str]:
    """Each run's arm, by run (rows of the ``runs`` view with settings): the name ``ub sweep``
    gave it (the view's ``arm``) where every run of those settings carries that one name and no
    run of other settings does; else its settings (:func:`arm_label`). The settings decide what
    an arm is; the name only shows it."""
    labels = {r["run"]: arm_label(r["settings"]) for r in runs if r["settings"] is not None}
    given: dict[str, set[str | None]] = {}  # label: the names its runs carry
    for r in runs:
        if r["run"] in labels:
            given.setdefault(labels[r["run"]], set()).add(r.get("arm"))
    users: dict[str | None, int] = {}  # name: how many labels' runs carry it
    for names in given.values():
        for name in names:
            users[name] = users.get(name, 0) + 1
    named = {label: next(iter(names)) for label, names in given.items()
             if len(names) == 1 and None not in names and users[next(iter(names))] == 1}
    return {run: named.get(label) or label for run, label in labels.items()}


def arm_settings(runs: list[dict[str, Any]]) -> dict[str, str]:
    """Each arm (:func:`arm_names`) and its settings (:func:`arm_label`), for a legend."""
    names = arm_names(runs)
    return {names[r["run"]]: arm_label(r["settings"]) for r in runs if r["run"] in names}


def arm_letters(arms: Iterable[str], settings: dict[str, str] | None = None) -> dict[str, str]:
    """A short name for each arm: its own where it has one (an arm whose name in ``settings``,
    :func:`arm_settings`, is not its settings), else by order A, B, ..., Z, AA, AB, ... (a
    letter no named arm has); a table or a figure names arms so, and a legend says each one's
    settings once."""
    named = {arm for arm, label in (settings or {}).items() if arm != label}
    letters = (letter for letter in map(_letter, range(10**6)) if letter not in named)
    return {arm: arm if arm in named else next(letters) for arm in sorted(set(arms))}


def _letter(index: int) -> str:
    return (_letter(index // 26 - 1) if index >= 26 else "") + chr(ord("A") + index % 26)


def latest_common_checkpoint(evals: list[dict[str, Any]], runs: Iterable[str]) -> int | None:
    """The latest checkpoint every run of ``runs`` evaluated (``None``: there is none)."""
    updates = [{r["update"] for r in evals if r["run"] == run} for run in runs]
    common = set.intersection(*updates) if updates else set()
    return max(common) if common else None


def comparable_runs(runs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows of the ``runs`` view a comparison counts, by name, and a line for each run it
    leaves out, saying why: one without settings or without a seed (its config did not read:
    it has no arm, or nothing to pair it by), and one that repeats a seed of its arm (two arms
    whose settings resolve alike, or a copied run: the same seed again is no more evidence),
    of which the first by name counts."""
    counted: list[dict[str, Any]] = []
    left_out: list[str] = []
    first: dict[tuple[str, int], str] = {}  # (arm, seed): the run that counts
    for r in sorted(runs, key=lambda r: r["run"]):
        if r["settings"] is None:
            left_out.append(f"{r['run']} has no settings (its config does not read as a "
                            "run's): in no arm, left out")
            continue
        if r["seed"] is None:
            left_out.append(f"{r['run']} has no seed (its config's is no whole number): "
                            "nothing to pair it by, left out")
            continue
        arm = arm_label(r["settings"])
        counts = first.setdefault((arm, r["seed"]), r["run"])
        if counts != r["run"]:
            left_out.append(f"{r['run']} repeats seed {r['seed']} of arm {arm} (run {counts}, "
                            "the first by name, counts it): left out")
            continue
        counted.append(r)
    return counted, left_out


def measured(runs: list[dict[str, Any]], evals: list[dict[str, Any]],
             exploitability: list[dict[str, Any]], checkpoint: int) -> list[Measured]:
    """Every run's figures at ``checkpoint`` (rows of the ``runs``, ``evals`` and
    ``exploitability`` views of a folder of runs), of the runs :func:`comparable_runs`
    counts."""
    runs, _ = comparable_runs(runs)
    arms = arm_names(runs)
    seeds = {r["run"]: r["seed"] for r in runs}
    out = []
    rows = [r for r in evals if r["update"] == checkpoint and r["run"] in arms]
    drawn = {(r["env_id"], r["opponent"]) for r in rows if r["draws"]}
    # Arms compare as each plays its games (a masked arm with a free one: docs/learning.md's
    # first table); the legal-move mode names a figure only where a run evaluated the same
    # pair both ways, which are then two figures.
    modes: dict[tuple[str, str, str], set[str]] = {}
    for r in rows:
        modes.setdefault((r["run"], r["env_id"], r["opponent"]), set()).add(
            r.get("legal_moves") or "")
    both_ways = {(env, opponent) for (_, env, opponent), m in modes.items() if len(m) > 1}
    for r in rows:
        moves = r.get("legal_moves") or None
        mode = f", {moves}" if moves and (r["env_id"], r["opponent"]) in both_ways else ""
        bar = r.get("baseline_high")
        name = f"{r['env_id']} vs {r['opponent']}{mode}"
        out.append(Measured(r["run"], arms[r["run"]], seeds[r["run"]], f"{name}: win rate",
                            r["win_rate"], None if bar is None else r["win_low"] > bar, moves))
        if (r["env_id"], r["opponent"]) in drawn:  # (against a perfect player: a draw is all)
            out.append(Measured(r["run"], arms[r["run"]], seeds[r["run"]],
                                f"{name}: no-loss rate", (r["wins"] + r["draws"]) / r["games"],
                                None, moves))
    for r in exploitability:
        if r["update"] != checkpoint or r["run"] not in arms:
            continue
        out.append(Measured(r["run"], arms[r["run"]], seeds[r["run"]],
                            f"{r['env_id']} {r['policy']}, {r['legal_moves']}: NashConv",
                            r["nash_conv"], None))
    return out


def compare(figures: list[Measured], reference: str | None = None
            ) -> tuple[list[ArmFigure], list[Paired]]:
    """Each arm's figures and each arm's paired differences from ``reference`` (default: the
    first arm by name). An arm has one value of a figure per seed, the first given (a repeat
    would count as one more seed, and shrink the interval, without one more seed's evidence;
    :func:`measured` gives one run per arm and seed)."""
    arms = sorted({m.arm for m in figures})
    if reference is None and arms:
        reference = arms[0]
    by: dict[tuple[str, str], dict[int, Measured]] = {}  # (figure, arm): seed's figure
    for m in figures:
        by.setdefault((m.figure, m.arm), {}).setdefault(m.seed, m)
    summaries, pairs = [], []
    for figure in sorted({m.figure for m in figures}):
        for arm in arms:
            mine = list(by.get((figure, arm), {}).values())
            if not mine:
                continue
            mean, half = _mean_interval([m.value for m in mine])
            # Every figure is at least 0 and a rate at most 1: a t-interval over two or three
            # seeds reaches past both, which no seed could.
            low, high = max(0.0, mean - half), mean + half
            if figure.endswith(" rate"):
                high = min(1.0, high)
            barred = [m for m in mine if m.clears is not None]
            summaries.append(ArmFigure(figure, arm, len(mine), mean, low, high,
                                       sum(bool(m.clears) for m in barred), len(barred),
                                       ", ".join(sorted({m.moves for m in mine if m.moves}))))
            if arm == reference:
                continue
            theirs = by.get((figure, reference or ""), {})
            diffs = [m.value - theirs[m.seed].value for m in mine if m.seed in theirs]
            if diffs:
                se = _sd(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else None
                pairs.append(Paired(figure, arm, reference or "", len(diffs),
                                    sum(diffs) / len(diffs), se,
                                    sum(d > 0 for d in diffs)))
    return summaries, pairs


def _sd(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _mean_interval(values: list[float]) -> tuple[float, float]:
    """The mean and the half-width of its 95% t-interval (0 for one value)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    t = T_975[len(values) - 2] if len(values) - 1 <= len(T_975) else 1.959964
    return mean, t * _sd(values) / math.sqrt(len(values))
