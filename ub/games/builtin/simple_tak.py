"""SimpleTak: legal moves and position keys."""

from __future__ import annotations

from typing import Any

from ub.games.builtin.boards import board_and_seat, cell_moves
from ub.games.rules import GameRules


class SimpleTakRules(GameRules):
    """SimpleTak: a cell ``[i]`` of the square board; the key is its rows and the seat to move
    (``O.../.X../..../.... p1``)."""

    name = "SimpleTak"
    entry_point = "textarena.envs.SimpleTak.env:SimpleTakEnv"

    def legal_moves(self, core: Any) -> list[str]:
        """Every empty cell."""
        return cell_moves(core.state.game_state["board"], empty="")

    def position(self, core: Any, seat: int) -> str:
        """The rows (``.`` empty) and the seat to move."""
        return board_and_seat(core, seat)
