"""Which games a rollout plays: an env, a seed and who sits where."""

from __future__ import annotations

from dataclasses import dataclass

from ub.actors.base import Actor
from ub.errors import UbError
from ub.games.specs import GameSpec
from ub.seeding import env_seed


@dataclass(frozen=True)
class GameAssignment:
    """One game to play: which env, which seed, who sits where."""

    spec: GameSpec
    game_index: int
    seed: int
    actors: tuple[Actor, ...]

    def __post_init__(self) -> None:
        if len(self.actors) != self.spec.num_players:
            raise UbError(
                f"{self.spec.env_id} has {self.spec.num_players} seat(s) but "
                f"{len(self.actors)} actor(s) were given"
            )


def assign_games(
    spec: GameSpec, actors: list[Actor], num_games: int, base_seed: int, round_: int = 0,
    first_index: int = 0, rotate_seats: bool = True,
) -> list[GameAssignment]:
    """``num_games`` games of ``spec``; with ``rotate_seats`` the actors take turns in each seat."""
    out = []
    for i in range(first_index, first_index + num_games):
        shift = i % len(actors) if rotate_seats else 0
        seated = tuple(actors[shift:] + actors[:shift])
        out.append(GameAssignment(spec, i, env_seed(base_seed, round_, i), seated))
    return out
