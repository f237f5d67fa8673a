"""Evaluation: one actor against fixed opponents on a set of games, seats balanced.

Each (env, opponent) pair plays ``games`` games, the evaluated actor taking every seat equally
often. The games are ordinary ``steps``/``games`` shards (under the run's ``eval/`` root), so they
are as queryable as training games; :func:`summarize` turns them into win/draw/loss rates with
95% Wilson confidence intervals, and invalid-move and format rates.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

import pyarrow as pa

from ub.actors.base import Actor
from ub.actors.spec import parse_actor
from ub.games.specs import GameSpec
from ub.rollout import GameAssignment, play_games
from ub.seeding import derive_seed


def wilson_interval(successes: int, trials: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95% by default).

    Unlike the normal approximation it stays inside [0, 1] and behaves at 0 and n successes.
    ``trials == 0`` gives the uninformative (0, 1).
    """
    if trials <= 0:
        return 0.0, 1.0
    p = successes / trials
    denom = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def eval_assignments(actor: Actor, opponents: list[Actor], specs: list[GameSpec],
                     games: int, seed: int) -> list[GameAssignment]:
    """``games`` games per (env, opponent); the actor sits in seat ``i % num_players`` of game
    ``i``, the opponent in every other seat. Env seeds derive from (seed, game index) only,
    so every checkpoint is measured on the same starting positions; the games are numbered
    opponent by opponent, so an opponent added to the list leaves the others' games as they
    were."""
    out = []
    index = 0
    for opponent in opponents:
        for spec in specs:
            for i in range(games):
                seat = i % spec.num_players
                seated = [opponent] * spec.num_players
                seated[seat] = actor
                env_seed = derive_seed(seed, index, "eval")
                out.append(GameAssignment(spec, index, env_seed, tuple(seated)))
                index += 1
    return out


@dataclass(frozen=True)
class EvalRow:
    """One (env, opponent) line of an evaluation."""

    actor: str
    env_id: str
    opponent: str
    games: int
    wins: int
    draws: int
    losses: int
    errors: int
    win_rate: float
    win_low: float
    win_high: float
    invalid_move_rate: float
    format_rate: float
    baseline_win_rate: float | None = None
    """The random player's win rate in the actor's seats on the same seeds (``None``: not
    measured, e.g. against a model or hosted opponent). The bar a checkpoint has to clear."""
    baseline_low: float | None = None
    baseline_high: float | None = None
    legal_moves: str | None = None
    """The legal-move mode the actor played under (``mask``, ``free``; ``None``: not
    recorded, a shard written before data schema 4)."""

    def to_dict(self) -> dict:
        return asdict(self)


def seat_result(game: Mapping[str, Any], seats: list[int]) -> str:
    """``"wins"``, ``"draws"``, ``"losses"`` or ``"errors"`` for the player in ``seats`` of a
    games-table row: a decisive game is a win when one of its seats has the highest reward."""
    if game["outcome"] == "error" or game["rewards"] is None:
        return "errors"
    if game["outcome"] == "draw":
        return "draws"
    mine = max(game["rewards"][s] for s in seats)
    theirs = max(r for i, r in enumerate(game["rewards"]) if i not in seats)
    return "wins" if mine > theirs else "losses"


def random_baseline(assignments: list[GameAssignment], actor: str, base_seed: int
                    ) -> dict[tuple[str, str], tuple[int, int]]:
    """``(wins, decided games)`` per (env, opponent) of the random player in ``actor``'s seats of
    ``assignments``, on the same seeds as an evaluation: random against the same opponents,
    whose moves draw from the same per-seat streams. Only for scripted opponents (no engine,
    no endpoint): a fraction of a second for hundreds of games."""
    stand_in = parse_actor("random")
    seats, swapped = {}, []
    for a in assignments:
        seats[a.game_index] = [i for i, x in enumerate(a.actors) if x.name == actor]
        swapped.append(replace(a, actors=tuple(stand_in if x.name == actor else x
                                               for x in a.actors)))
    games = play_games(swapped, base_seed=base_seed, seed_round="eval").games.to_pylist()
    out: dict[tuple[str, str], list[int]] = {}
    for a, g in zip(swapped, games, strict=True):
        mine = seats[a.game_index]
        opponent = ",".join(sorted({x.name for i, x in enumerate(a.actors) if i not in mine}))
        counts = out.setdefault((g["env_id"], opponent), [0, 0])
        result = seat_result(g, mine)
        if result != "errors":
            counts[1] += 1
            counts[0] += result == "wins"
    return {key: (wins, decided) for key, (wins, decided) in out.items()}


def with_baseline(rows: list[EvalRow], baseline: dict[tuple[str, str], tuple[int, int]]
                  ) -> list[EvalRow]:
    """``rows`` with the random baseline of their (env, opponent) filled in, where measured."""
    out = []
    for row in rows:
        wins, decided = baseline.get((row.env_id, row.opponent), (0, 0))
        if decided:
            low, high = wilson_interval(wins, decided)
            row = replace(row, baseline_win_rate=wins / decided, baseline_low=low,
                          baseline_high=high)
        out.append(row)
    return out


def summarize(games: pa.Table, steps: pa.Table, actor: str) -> list[EvalRow]:
    """Win/draw/loss of ``actor`` per (env, opponent) from eval ``games`` and ``steps`` tables
    (``steps``: ``game_id``, ``env_id``, ``actor``, ``invalid_move``, ``format_ok`` and, from
    data schema 4, ``legal_moves_mode``).

    A decisive game is a win when the actor's seat has the highest reward; errored games count
    in ``errors`` and in neither rate's denominator.
    """
    per: dict[tuple[str, str], dict[str, int]] = {}
    for g in games.to_pylist():
        seats = [i for i, name in enumerate(g["actors"]) if name == actor]
        others = sorted({name for name in g["actors"] if name != actor})
        if not seats or not others:
            continue
        key = (g["env_id"], ",".join(others))
        c = per.setdefault(key, {"games": 0, "wins": 0, "draws": 0, "losses": 0, "errors": 0})
        c["games"] += 1
        c[seat_result(g, seats)] += 1
    moves: dict[tuple[str, str], list[int]] = {}
    opponent_of = {g["game_id"]: ",".join(sorted({a for a in g["actors"] if a != actor}))
                   for g in games.to_pylist()}
    modes: dict[tuple[str, str], set[str]] = {}
    for s in steps.to_pylist():
        if s["actor"] != actor:
            continue
        key = (s["env_id"], opponent_of.get(s["game_id"], ""))
        m = moves.setdefault(key, [0, 0, 0])
        m[0] += 1
        m[1] += bool(s["invalid_move"])
        m[2] += bool(s["format_ok"])
        if s.get("legal_moves_mode") is not None:
            modes.setdefault(key, set()).add(s["legal_moves_mode"])
    rows = []
    for (env_id, opponent), c in sorted(per.items()):
        decided = c["games"] - c["errors"]
        low, high = wilson_interval(c["wins"], decided)
        m = moves.get((env_id, opponent), [0, 0, 0])
        rows.append(EvalRow(
            actor=actor, env_id=env_id, opponent=opponent, games=c["games"], wins=c["wins"],
            draws=c["draws"], losses=c["losses"], errors=c["errors"],
            win_rate=c["wins"] / decided if decided else 0.0, win_low=low, win_high=high,
            invalid_move_rate=m[1] / m[0] if m[0] else 0.0,
            format_rate=m[2] / m[0] if m[0] else 0.0,
            legal_moves=",".join(sorted(modes.get((env_id, opponent), ()))) or None,
        ))
    return rows
