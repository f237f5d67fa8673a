"""The ``perfect`` scripted player: optimal play, uniform over the optimal moves.

Where ``expert`` picks one best move (the fastest win, the lowest cell), ``perfect`` draws
uniformly among every move that keeps the position's game-theoretic value, so a policy is
measured against all of optimal play rather than one line of it:

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
from functools import reduce
from operator import xor
from typing import Any

from ub.actors.expert import EXPERT_GAMES, game_name, kuhn_policy, tictactoe_move_values
from ub.errors import UbError
from ub.games.legal import legal_actions, unwrap
from ub.games.positions import kuhn_history

PERFECT_GAMES = EXPERT_GAMES


def _sign(value: float) -> int:
    return (value > 0) - (value < 0)


def perfect_distribution(env: Any) -> dict[str, float]:
    """The perfect player's probability of each legal move for the player to move in ``env``.

    :raises UbError: a game it cannot play.
    """
    core = unwrap(env)
    game, state = game_name(core), core.state
    if game == "TicTacToe":
        cells = "".join(c or "." for row in state.game_state["board"] for c in row)
        values = tictactoe_move_values(cells, "X" if state.current_player_id == 1 else "O")
        best = max(_sign(v) for v in values.values())
        moves = [f"[{i}]" for i, v in sorted(values.items()) if _sign(v) == best]
    elif game == "Nim":
        piles = list(state.game_state["piles"])
        total = reduce(xor, piles, 0)
        moves = [m for m in legal_actions(env)
                 if total and _nim_after(piles, m) == 0] or legal_actions(env)
    elif game == "KuhnPoker":
        card = state.game_state["player_cards"][state.current_player_id]
        probs = kuhn_policy(card, kuhn_history(core))
        return {f"[{move}]": p for move, p in sorted(probs.items())}
    else:
        raise UbError(f"the perfect player cannot play {game}: it supports "
                      f"{', '.join(PERFECT_GAMES)} (use random, or another opponent)")
    return {m: 1 / len(moves) for m in moves}


def _nim_after(piles: list[int], move: str) -> int:
    pile, quantity = (int(x) for x in move.strip("[]").split())
    left = list(piles)
    left[pile] -= quantity
    return reduce(xor, left, 0)


class PerfectPlayer:
    """Optimal play, uniform over the optimal moves (see the module docstring)."""

    name = "perfect"
    games = PERFECT_GAMES

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._rng = random.Random(seed)

    def act(self, env: Any) -> str:
        probs = perfect_distribution(env)
        moves = list(probs)
        return self._rng.choices(moves, weights=[probs[m] for m in moves])[0]

    def __repr__(self) -> str:
        return f"PerfectPlayer(seed={self.seed})"
