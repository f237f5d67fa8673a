"""The ``perfect`` scripted player: optimal play, uniform over the optimal moves.

Where ``expert`` picks one best move (the fastest win, the lowest cell), ``perfect`` draws
uniformly among every move that keeps the position's game-theoretic value, so a policy is
measured against all of optimal play rather than one line of it. It plays its game's rules'
:meth:`~ub.games.rules.GameRules.perfect_distribution` (:mod:`ub.games.registry`); the
built-in ones (:mod:`ub.games.builtin`):

- **TicTacToe**: the moves whose minimax result (win, draw or loss) is the best there; from the
  empty board that is every cell (each draws).
- **Nim**: the moves to a zero nim-sum (each wins); from a zero position every move loses
  against perfect play, and it draws among all of them.
- **KuhnPoker**: the equilibrium ``expert`` plays (alpha = 1/6; a game of hidden information
  has no "optimal move", only an optimal mix).

:func:`perfect_distribution` is the same play as probabilities, which the exploitability
solver (:mod:`ub.games.game_tree`) reads.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from ub.errors import UbError
from ub.games.registry import games_with, rules_of
from ub.games.rules import Capability, unwrap


def perfect_distribution(env: Any) -> dict[str, float]:
    """The perfect player's probability of each legal move for the player to move in ``env``.

    :raises UbError: a game it cannot play.
    """
    core = unwrap(env)
    rules = rules_of(core)
    if rules is None or not rules.provides("perfect_distribution"):
        game = rules.name if rules is not None else type(core).__name__
        raise UbError(f"the perfect player cannot play {game}: it supports "
                      f"{', '.join(games_with('perfect_distribution'))} (use random, or "
                      "another opponent)")
    return rules.perfect_distribution(core)


class PerfectPlayer:
    """Optimal play, uniform over the optimal moves (see the module docstring)."""

    name = "perfect"
    needs: ClassVar[Capability] = "perfect_distribution"
    """What a game's rules must provide for it to play (:meth:`GameRules.provides`)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._rng = random.Random(seed)

    def act(self, env: Any) -> str:
        """A move drawn from :func:`perfect_distribution` by the player's own generator."""
        probs = perfect_distribution(env)
        moves = list(probs)
        return self._rng.choices(moves, weights=[probs[m] for m in moves])[0]

    def __repr__(self) -> str:
        return f"PerfectPlayer(seed={self.seed})"
