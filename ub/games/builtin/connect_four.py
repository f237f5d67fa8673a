"""ConnectFour: legal moves and position keys."""

from __future__ import annotations

from typing import Any

from ub.games.builtin.boards import board_and_seat
from ub.games.rules import GameRules


class ConnectFourRules(GameRules):
    """ConnectFour: an open column ``[col c]``; the key is the six rows of seven and the seat
    to move."""

    name = "ConnectFour"
    entry_point = "textarena.envs.ConnectFour.env:ConnectFourEnv"

    def legal_moves(self, core: Any) -> list[str]:
        """Every column whose top cell is empty, as ``[col c]`` (the format the prompt
        teaches)."""
        top_row: list[str] = core.state.game_state["board"][0]
        return [f"[col {c}]" for c, cell in enumerate(top_row) if cell == "."]

    def position(self, core: Any, seat: int) -> str:
        """The rows (``.`` empty) and the seat to move."""
        return board_and_seat(core, seat)
