"""The ``expert`` scripted player: strong play where a game allows it cheaply.

- **TicTacToe**: perfect play (memoized minimax over the 3^9 boards); among equally good moves
  it prefers faster wins and slower losses, then the lowest cell.
- **Nim** (normal play: taking the last object wins): the nim-sum strategy. From a position with
  a non-zero nim-sum it moves to zero, which wins; from a zero position it takes one object from
  the largest pile and waits for a mistake.
- **KuhnPoker**: a Nash equilibrium (Kuhn, 1950) with ``alpha = 1/6``. First to act: bet a J
  with probability alpha (a bluff), check a Q, bet a K with probability 3 alpha; after
  check-bet: fold a J, call a Q with probability alpha + 1/3, call a K. Second to act: facing a
  bet, fold a J, call a Q with probability 1/3, call a K; after a check, bet a J with
  probability 1/3 (a bluff), check a Q, bet a K. No strategy wins chips from it on average over
  both seats (the first seat's value is -1/18 chip per hand).

Other games raise a clear error when the expert is seated
(:func:`ub.actors.scripted.check_scripted_supports`).
Like every scripted player it reads the game state, never the observation, and draws its
randomness from its own seeded generator.
"""

from __future__ import annotations

import functools
import random
import re
from typing import Any

from ub.errors import UbError
from ub.games.legal import unwrap
from ub.games.positions import kuhn_history

KUHN_ALPHA = 1 / 6
EXPERT_GAMES = ("KuhnPoker", "Nim", "TicTacToe")

LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
TICTACTOE_MARKS = "OX"  # by seat: TextArena's Player 0 is 'O' and moves first


# --------------------------------------------------------------------------------------------
# TicTacToe
# --------------------------------------------------------------------------------------------


def opponent_mark(mark: str) -> str:
    """The other TicTacToe mark: ``"O"`` for ``"X"`` and ``"X"`` for ``"O"``."""
    return "O" if mark == "X" else "X"


def tictactoe_winner(cells: str) -> str | None:
    """The mark (``"X"`` or ``"O"``) with three in a line on ``cells``, if any."""
    for a, b, c in LINES:
        if cells[a] != "." and cells[a] == cells[b] == cells[c]:
            return cells[a]
    return None


@functools.cache
def _value(cells: str, me: str, to_move: str) -> int:
    """Minimax value for ``me``: +(10 - plies) win, 0 draw, -(10 - plies) loss."""
    won = tictactoe_winner(cells)
    plies = 9 - cells.count(".")
    if won is not None:
        return (10 - plies) if won == me else -(10 - plies)
    if "." not in cells:
        return 0
    values = [_value(cells[:i] + to_move + cells[i + 1:], me, opponent_mark(to_move))
              for i, c in enumerate(cells) if c == "."]
    return max(values) if to_move == me else min(values)


def tictactoe_move(cells: str, me: str) -> int:
    """The best cell for ``me`` (``"X"`` or ``"O"``) on ``cells`` (9 chars, ``"."`` empty)."""
    values = tictactoe_move_values(cells, me)
    if not values:
        raise RuntimeError("no empty cell: is the game over?")
    return max(values, key=lambda i: (values[i], -i))


def tictactoe_move_values(cells: str, me: str) -> dict[int, int]:
    """The minimax value for ``me`` of each empty cell (higher is better; equal to the best
    value: an optimal move). ``bench/learning.py`` grades a model's moves with it."""
    return {i: _value(cells[:i] + me + cells[i + 1:], me, opponent_mark(me))
            for i, c in enumerate(cells) if c == "."}


def tictactoe_board(observation: str) -> tuple[str, str]:
    """``(cells, me)`` from a TicTacToe observation's last board: nine characters of ``X``,
    ``O`` or ``.``, and the symbol of the player it was shown to. For grading recorded games
    (the player itself reads the game state)."""
    board = observation.rsplit("Current Board:", 1)[-1].split("Available Moves")[0]
    cells = "".join(c.strip() or "." for line in board.splitlines() if "|" in line
                    for c in line.split("|"))
    me = re.search(r"you will be '(\w)'", observation)
    if len(cells) != 9 or me is None:
        raise UbError(f"not a TicTacToe observation with a board: {observation[-200:]!r}")
    return re.sub(r"\d", ".", cells), me.group(1)


def completing_cells(cells: str, who: str) -> set[int]:
    """The empty cells that would complete a line of ``who`` at once."""
    return {i for line in LINES for i in line
            if cells[i] == "." and sum(cells[j] == who for j in line) == 2}


# --------------------------------------------------------------------------------------------
# Nim
# --------------------------------------------------------------------------------------------


def nim_move(piles: list[int]) -> tuple[int, int]:
    """``(pile, quantity)``: to a zero nim-sum when possible, else one from the largest pile."""
    total = 0
    for p in piles:
        total ^= p
    if total:
        for i, p in enumerate(piles):
            if p ^ total < p:
                return i, p - (p ^ total)
    largest = max(range(len(piles)), key=lambda i: (piles[i], -i))
    if piles[largest] == 0:
        raise RuntimeError("every pile is empty: is the game over?")
    return largest, 1


# --------------------------------------------------------------------------------------------
# KuhnPoker
# --------------------------------------------------------------------------------------------


def kuhn_policy(card: int, history: str, alpha: float = KUHN_ALPHA) -> dict[str, float]:
    """Equilibrium move probabilities for ``card`` (0 = J, 1 = Q, 2 = K) after ``history``
    (``""``: first to act; ``"check"``/``"bet"``: second to act; ``"check bet"``: first to
    act facing a bet)."""
    if history == "":
        bet = (alpha, 0.0, 3 * alpha)[card]
        return {"bet": bet, "check": 1 - bet}
    if history == "check":
        bet = (1 / 3, 0.0, 1.0)[card]
        return {"bet": bet, "check": 1 - bet}
    if history == "bet":
        call = (0.0, 1 / 3, 1.0)[card]
        return {"call": call, "fold": 1 - call}
    if history == "check bet":
        call = (0.0, alpha + 1 / 3, 1.0)[card]
        return {"call": call, "fold": 1 - call}
    raise ValueError(f"not a Kuhn poker decision point: {history!r}")


# --------------------------------------------------------------------------------------------
# The player
# --------------------------------------------------------------------------------------------


def game_name(core: Any) -> str:
    """The TextArena game of a core env (``TicTacToe`` for ``textarena.envs.TicTacToe.env``)."""
    module = type(core).__module__  # textarena.envs.<Game>.env
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["textarena", "envs"] else module


class ExpertPlayer:
    """Strong scripted play for TicTacToe, Nim and KuhnPoker (see the module docstring)."""

    name = "expert"
    games = EXPERT_GAMES

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._rng = random.Random(seed)

    def act(self, env: Any) -> str:
        core = unwrap(env)
        game = game_name(core)
        state = core.state
        if game == "TicTacToe":
            board = state.game_state["board"]
            cells = "".join(c or "." for row in board for c in row)
            return f"[{tictactoe_move(cells, 'X' if state.current_player_id == 1 else 'O')}]"
        if game == "Nim":
            pile, quantity = nim_move(list(state.game_state["piles"]))
            return f"[{pile} {quantity}]"
        if game == "KuhnPoker":
            card = state.game_state["player_cards"][state.current_player_id]
            probs = kuhn_policy(card, kuhn_history(core))
            moves = sorted(probs)
            return f"[{self._rng.choices(moves, weights=[probs[m] for m in moves])[0]}]"
        raise UbError(f"the expert player cannot play {game}: it supports "
                      f"{', '.join(EXPERT_GAMES)}")

    def __repr__(self) -> str:
        return f"ExpertPlayer(seed={self.seed})"
