"""Dynamic branching: several moves from one position, each judged against the others.

A game's outcome credits every move of a seat alike, and ub's play rarely puts two different
moves in the same late position, so nothing compares the move that won there with the moves
that could have been played in its place. With ``rollout.branch.k`` set, a training game is
copied at chosen decisions of the round's learning checkpoint (its *branch points*): the copy
starts from the same position (the env and its randomness deep-copied), samples the model's
move anew, and plays on to its own end against the same seats. A point holds ``k`` moves: the
game's own and its ``k - 1`` copies'. Its decisions share a ``branch_group`` in ``steps``, and
the batch compares them (``state_baseline`` or ``position_advantage`` with ``key: branch``:
docs/rewards.md), so a move's credit is its own game's return against those of the moves
sampled in its place.

Which decisions become points (``select``), read after the game has ended:

- ``random``: uniformly among the learning checkpoint's decisions;
- ``surprisal``: where the sampled move was least likely (``-sum(completion_logprobs)``, a
  one-sample estimate of the policy's entropy there): where the policy is least sure;
- ``spread``: where the returns seen in the previous :data:`SPREAD_ROUNDS` rounds are least
  certain (the standard error of the mean ``env_reward`` of the model's decisions in that
  position; a position seen fewer than twice is the least certain of all): the seeds'
  "least return confidence". It needs the games' position keys (ub.games.positions).

Ties are broken in a random order drawn from the game's own seed; copies sample from seeds
derived from the parent's sampling seed at the point, so a resumed run and a replay make the
same copies. A copy is a game of its own in ``games`` (``parent_game_id``, ``branch_turn``),
whose ``steps`` rows start at the point. Copies do not branch again, and ratings and the
per-round collection metrics count only the games that are not copies (their outcomes are
the policy's alternatives, not its play).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, field_validator

from ub.errors import UbError
from ub.games.loop import Game
from ub.games.specs import GameSpec
from ub.settings import Section

SPREAD_ROUNDS = 4
"""How many previous rounds' returns ``select: spread`` reads."""

BranchSelect = Literal["random", "surprisal", "spread"]


class BranchConfig(Section):
    """Dynamic branching (docs/branching.md): at chosen decisions of the round's learning
    checkpoint the game is copied, and each copy samples its move anew and plays to its end."""

    k: int = Field(0, ge=0, le=32, description="Moves per branch point: the game's own and "
                   "k - 1 copies' (0: off; 1 would be no branching).")
    points: int = Field(1, ge=1, le=16, description="Branch points per game: the learning "
                        "checkpoint's decisions that select ranks first (all of them in a game "
                        "with fewer).")
    select: BranchSelect = Field("random", description="Which decisions become branch points: "
                                 "random; surprisal (where the sampled move was least likely); "
                                 "spread (where the previous rounds' returns in that position "
                                 "are least certain; needs position keys).")

    key = "rollout.branch"

    @field_validator("k")
    @classmethod
    def _not_one(cls, value: int) -> int:
        if value == 1:
            raise ValueError("1 is one move per branch point, which is no branching: give 0 "
                             "(off) or 2 or more")
        return value

    @property
    def on(self) -> bool:
        return self.k >= 2


@dataclass(frozen=True)
class Candidate:
    """A decision of the learning checkpoint that could become a branch point."""

    turn: int
    surprisal: float
    """``-sum(completion_logprobs)`` of the move it sampled."""
    position: str | None


def choose_points(candidates: Sequence[Candidate], config: BranchConfig, seed: int,
                  spread: Mapping[str, float] | None = None) -> list[int]:
    """The turns of ``candidates`` to branch at (ascending): the first ``config.points`` in
    ``config.select``'s order, ties in a random order drawn from ``seed``. ``spread``: the
    standard error of the returns seen in each position (:func:`spread_score`)."""
    order = list(candidates)
    random.Random(seed).shuffle(order)
    if config.select == "surprisal":
        order.sort(key=lambda c: -c.surprisal)  # (stable: ties keep the random order)
    elif config.select == "spread":
        order.sort(key=lambda c: -spread_score(spread or {}, c.position))
    return sorted(c.turn for c in order[:config.points])


def spread_score(spread: Mapping[str, float], position: str | None) -> float:
    """How uncertain the return of ``position`` is: its standard error in ``spread``;
    infinite for a position not in it (seen fewer than twice), 0 for no position."""
    if position is None:
        return 0.0
    return spread.get(position, math.inf)


def spread_sql(first_round: int, last_round: int) -> str:
    """The standard error of the mean return of each (env, position) seen at least twice in
    rounds ``first_round`` to ``last_round`` (the model's decisions in every game, copies
    included), over the ``steps`` view."""
    return f"""SELECT env_id, position, stddev_samp(env_reward) / sqrt(count(*)) AS spread
FROM steps
WHERE actor_kind = 'model' AND position IS NOT NULL AND env_reward IS NOT NULL
  AND round BETWEEN {int(first_round)} AND {int(last_round)}
GROUP BY env_id, position HAVING count(*) >= 2"""


def read_spread(root: Path, first_round: int, last_round: int) -> dict[str, dict[str, float]]:
    """:func:`spread_sql` over the training data under ``root``, by env id then position;
    only the shards of rounds ``first_round`` to ``last_round`` are opened, so a round's cost
    does not grow with the run."""
    from ub.data.shards import committed_shards, shard_path
    from ub.data.sql import query_tables, table_dataset

    files = [shard_path(root, "steps", sid) for sid in committed_shards(root)
             if first_round <= sid.round <= last_round]
    steps = table_dataset(root, "steps", files)
    spread: dict[str, dict[str, float]] = {}
    for row in query_tables({"steps": steps}, spread_sql(first_round, last_round)).to_pylist():
        spread.setdefault(row["env_id"], {})[row["position"]] = row["spread"]
    return spread


def group_id(parent_game_id: str, turn: int) -> str:
    """The ``branch_group`` of the decisions taken at ``turn`` of ``parent_game_id`` and its
    copies (copies' game ids begin with it)."""
    return f"{parent_game_id}-t{turn:03d}"


def copy_game_id(group: str, copy: int) -> str:
    """The game id of copy ``copy`` (1 to k - 1) of a branch point."""
    return f"{group}-c{copy}"


def played_games(files: Sequence[str | Path], columns: Sequence[str]) -> pa.Table:
    """``columns`` of the games in ``files`` (``games`` shards of any schema version) less the
    copies made at branch points: their outcomes are the policy's alternatives from one
    position, not games it chose to play, so ratings and the dashboard's records leave them
    out (a shard older than schema 5 reads ``parent_game_id`` as NULL: no copies)."""
    from ub.data.sql import shards_dataset

    return shards_dataset("games", [str(f) for f in files]).to_table(
        columns=list(columns), filter=pc.field("parent_game_id").is_null())


def check_copyable(spec: GameSpec) -> None:
    """Refuse a game whose state cannot be copied for dynamic branching (ub.branching): a copy
    of a fresh game's state must take a move as the game itself does (same observation after
    it), and copying must not raise."""
    game = Game(spec, 0, "copy-check")
    try:
        if game.done:
            raise RuntimeError(game.final.error or "the game ended at its start")
        copy = game.copy(game.snapshot(), "copy-check-c1")
        move = (game.legal_moves or ["[0]"])[0]
        for g in (game, copy):
            g.apply(move)
        same = (game.done, game.observation) == (copy.done, copy.observation)
    except Exception as exc:
        raise UbError(f"{spec.env_id}'s state cannot be copied for rollout.branch "
                      f"({type(exc).__name__}: {exc}): set rollout.branch.k to 0") from None
    if not same:
        raise UbError(f"{spec.env_id}'s state cannot be copied for rollout.branch (a copy "
                      "plays on differently from the game: it keeps state outside the env "
                      "or Python's random): set rollout.branch.k to 0")
