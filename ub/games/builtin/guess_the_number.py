"""GuessTheNumber: legal moves."""

from __future__ import annotations

from typing import Any

from ub.games.rules import GameRules


class GuessTheNumberRules(GameRules):
    """GuessTheNumber (one player): ``[n]`` for a number in range; no position key (the
    hidden target is the whole state)."""

    name = "GuessTheNumber"
    entry_point = "textarena.envs.GuessTheNumber.env:GuessTheNumberEnv"

    def legal_moves(self, core: Any) -> list[str]:
        """Any number in range, except one already guessed (the env rejects repeats)."""
        guessed: set[int] = core.guessed_numbers
        return [f"[{n}]" for n in range(core.min_number, core.max_number + 1) if n not in guessed]
