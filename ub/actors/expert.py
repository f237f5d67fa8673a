"""The ``expert`` scripted player: strong play where a game allows it cheaply.

It plays its game's rules' :meth:`~ub.games.rules.GameRules.expert_move`
(:mod:`ub.games.registry`); the built-in strategies live with their games
(:mod:`ub.games.builtin`):

- **TicTacToe**: perfect play (memoized minimax over the 3^9 boards); among equally good moves
  it prefers faster wins and slower losses, then the lowest cell.
- **Nim** (normal play: taking the last object wins): the nim-sum strategy. From a position with
  a non-zero nim-sum it moves to zero, which wins; from a zero position it takes one object from
  the largest pile and waits for a mistake.
- **KuhnPoker**: a Nash equilibrium (Kuhn, 1950) with ``alpha = 1/6``
  (:mod:`ub.games.builtin.kuhn_poker`): no strategy wins chips from it on average over both
  seats (the first seat's value is -1/18 chip per hand).

A game of one's own gets an expert by giving its rules an ``expert_move`` (docs/games.md).
Other games raise a clear error when the expert is seated
(:func:`ub.actors.scripted.check_scripted_supports`).
Like every scripted player it reads the game state, never the observation, and draws its
randomness from its own seeded generator.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from ub.errors import UbError
from ub.games.registry import games_with, rules_of
from ub.games.rules import Capability, unwrap


class ExpertPlayer:
    """Strong scripted play: each game's rules' expert move (see the module docstring)."""

    name = "expert"
    needs: ClassVar[Capability] = "expert_move"
    """What a game's rules must provide for it to play (:meth:`GameRules.provides`)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._rng = random.Random(seed)

    def act(self, env: Any) -> str:
        """The expert move for the player to move in ``env``.

        :raises UbError: the game's rules have no expert move.
        """
        core = unwrap(env)
        rules = rules_of(core)
        if rules is None or not rules.provides("expert_move"):
            game = rules.name if rules is not None else type(core).__name__
            raise UbError(f"the expert player cannot play {game}: it supports "
                          f"{', '.join(games_with('expert_move'))}")
        return rules.expert_move(core, self._rng)

    def __repr__(self) -> str:
        return f"ExpertPlayer(seed={self.seed})"
