"""Scripted players: non-learning opponents and data generators that always play legal moves.

A scripted player is any object with a ``name`` and an ``act(env) -> str`` method that returns the
action for the player to move in a (possibly wrapped) TextArena env. It reads the game state through
:func:`ub.games.legal.legal_actions`, so it does not consume the player's observation: the caller
still calls ``env.get_observation()`` each turn as usual, and the observation stream stays the same
whoever plays the seat.

TextArena games draw from Python's *global* ``random`` module (``State.__init__`` calls
``random.seed(seed)``; KuhnPoker shuffles and GuessTheNumber picks its target with it). Scripted
players therefore use their own ``random.Random`` and never touch the global one: adding or removing
a scripted player never changes the cards or targets a game deals.

New players slot in as another class with the same ``__init__(seed)`` and ``act(env)``,
registered in :data:`SCRIPTED_PLAYERS`, like ``expert`` (:mod:`ub.actors.expert`) and
``perfect`` (:mod:`ub.actors.perfect`); one that plays only the games whose rules provide
something (:class:`ub.games.rules.GameRules`: legal moves, an expert move, ...) names it in
:data:`SCRIPTED_GAMES`, which :func:`check_scripted_supports` reads.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, Protocol

from ub.actors.base import Actor, Move, MoveFailed, Turn
from ub.actors.expert import ExpertPlayer
from ub.actors.perfect import PerfectPlayer
from ub.errors import UbError
from ub.games.legal import legal_actions
from ub.games.registry import GUIDE, games_with, rules_for
from ub.games.rules import Capability


class ScriptedPlayer(Protocol):
    """What the rollout needs from a scripted player."""

    name: str

    def act(self, env: Any) -> str:
        """Return the action string for the player to move in ``env``."""
        ...


def random_action(env: Any, rng: random.Random) -> str:
    """A uniformly random legal action for the player to move, drawn from ``rng`` only."""
    actions = legal_actions(env)
    if not actions:
        raise RuntimeError("no legal actions in this position: is the game over?")
    return actions[rng.randrange(len(actions))]


class RandomPlayer:
    """Plays a uniformly random legal action, reproducibly from its own seed."""

    name = "random"

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._rng = random.Random(seed)

    def act(self, env: Any) -> str:
        """Return a uniformly random legal action for the player to move in ``env``."""
        return random_action(env, self._rng)

    def __repr__(self) -> str:
        return f"RandomPlayer(seed={self.seed})"


# name -> factory taking the seed; a class with __init__(seed) is such a factory.
SCRIPTED_PLAYERS: dict[str, Callable[[int], ScriptedPlayer]] = {
    RandomPlayer.name: RandomPlayer,
    ExpertPlayer.name: ExpertPlayer,
    PerfectPlayer.name: PerfectPlayer,
}
# What a game's rules must provide for a scripted player to play it, where it cannot play them
# all (random plays any game with legal moves), by the player's name.
SCRIPTED_GAMES: dict[str, Capability] = {
    ExpertPlayer.name: ExpertPlayer.needs,
    PerfectPlayer.name: PerfectPlayer.needs,
}


def check_scripted_supports(names: list[str], env_id: str) -> None:
    """Raise :class:`UbError` unless each scripted player of ``names`` can play ``env_id``:
    its game's rules provide what the player needs (:data:`SCRIPTED_GAMES`; other names
    pass)."""
    for name in names:
        needed = SCRIPTED_GAMES.get(name)
        if needed is None:
            continue
        rules = rules_for(env_id)
        if rules is None or not rules.provides(needed):
            raise UbError(f"the {name} player cannot play {env_id}: it supports "
                          f"{', '.join(games_with(needed))} (use random, or another opponent; "
                          f"a game of one's own: rules with {needed}, {GUIDE})")


def make_scripted_player(name: str, seed: int) -> ScriptedPlayer:
    """Build the scripted player called ``name`` with its own RNG seeded by ``seed``.

    :raises UbError: ``name`` is not a known scripted player.
    """
    try:
        factory = SCRIPTED_PLAYERS[name]
    except KeyError:
        valid = ", ".join(sorted(SCRIPTED_PLAYERS))
        raise UbError(f"unknown scripted player {name!r}; choose one of: {valid}") from None
    return factory(seed)


class ScriptedActor(Actor):
    """A scripted player in a seat (``random``, ``expert``, ``perfect``): a fresh player per
    game, seeded with the seat's seed, moves at once."""

    kind = "scripted"

    def check_game(self, env_id: str) -> None:
        check_scripted_supports([self.name], env_id)

    def take_turn(self, turn: Turn) -> Move:
        if "player" not in turn.memory:
            turn.memory["player"] = make_scripted_player(self.name, turn.seat_seed)
        try:
            return Move(turn.game.act_with(turn.memory["player"].act))
        except Exception as exc:  # a broken scripted player must not stop the rollout
            raise MoveFailed(exc) from exc
