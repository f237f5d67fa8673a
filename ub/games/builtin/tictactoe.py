"""TicTacToe: all ub knows of it. Legal moves, position keys, perfect play (memoized minimax
over the 3^9 boards) for the ``expert`` and ``perfect`` players, and its tree for the
exploitability solver; and the board helpers that grade recorded games (``bench/``).

TextArena's Player 0 is ``O`` and moves first; Player 1 is ``X`` (``TicTacToeEnv.step``).
"""

from __future__ import annotations

import functools
import random
import re
from typing import Any

from ub.errors import UbError
from ub.games.builtin.boards import cell_moves, rows
from ub.games.rules import GameRules, TreeRules, one_root

LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
"""The eight lines of three cells (cells numbered row-major, 0 to 8)."""
TICTACTOE_MARKS = "OX"
"""The marks by seat: TextArena's Player 0 is 'O' and moves first."""


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
    """The best cell for ``me`` (``"X"`` or ``"O"``) on ``cells`` (9 chars, ``"."`` empty):
    among equally good moves the faster win or slower loss, then the lowest cell."""
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
    (the players themselves read the game state)."""
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


def _sign(value: float) -> int:
    return (value > 0) - (value < 0)


def _cells_and_mark(core: Any) -> tuple[str, str]:
    """The board as nine cells (``.`` empty) and the mark of the player to move."""
    state = core.state
    cells = "".join(c or "." for row in state.game_state["board"] for c in row)
    return cells, "X" if state.current_player_id == 1 else "O"


class TicTacToeRules(GameRules):
    """TicTacToe: a cell ``[i]`` (0 to 8, row-major); the key is the rows (``.`` empty) and
    the mark to move (``X.O/.O./... X``); perfect play."""

    name = "TicTacToe"
    entry_point = "textarena.envs.TicTacToe.env:TicTacToeEnv"
    tree = TreeRules("TicTacToe", "game", -1.0, one_root)

    def legal_moves(self, core: Any) -> list[str]:
        """Every empty cell."""
        return cell_moves(core.state.game_state["board"], empty="")

    def position(self, core: Any, seat: int) -> str:
        """The rows and the mark of ``seat`` (seat 1 is ``X``)."""
        return f"{rows(core.state.game_state['board'], {''})} {'X' if seat == 1 else 'O'}"

    def expert_move(self, core: Any, rng: random.Random) -> str:
        """The best cell (:func:`tictactoe_move`); it draws nothing from ``rng``."""
        return f"[{tictactoe_move(*_cells_and_mark(core))}]"

    def perfect_distribution(self, core: Any) -> dict[str, float]:
        """Uniform over the cells whose minimax result (win, draw or loss) is the best there;
        from the empty board that is every cell (each draws)."""
        values = tictactoe_move_values(*_cells_and_mark(core))
        best = max(_sign(v) for v in values.values())
        moves = [f"[{i}]" for i, v in sorted(values.items()) if _sign(v) == best]
        return {m: 1 / len(moves) for m in moves}
