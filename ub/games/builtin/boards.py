"""What the board games share: a board is TextArena's list of rows of cells."""

from __future__ import annotations

from typing import Any


def cell_moves(board: list[list[str]], empty: str) -> list[str]:
    """``[i]`` for every empty cell of a square board, numbered row-major (TicTacToe,
    SimpleTak)."""
    size = len(board[0])
    return [
        f"[{r * size + c}]"
        for r, row in enumerate(board)
        for c, cell in enumerate(row)
        if cell == empty
    ]


def rows(board: list[list[str]], empty: set[str]) -> str:
    """The board's rows joined by ``/``, each cell its mark (``.`` for one of ``empty``)."""
    return "/".join("".join("." if cell in empty else str(cell) for cell in row) for row in board)


def board_and_seat(core: Any, seat: int) -> str:
    """A position key of the board (``.`` empty) and the seat to move (``... p1``)."""
    return f"{rows(core.state.game_state['board'], {'', '.'})} p{seat}"
