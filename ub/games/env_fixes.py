"""Fixes to TextArena games whose env does not play by the rules its own prompt states.

Applied to the game's env class when ub first makes one of its envs
(:func:`ub.games.specs.make_env`): in the class, so that a copied env (a branch point, the
exploitability solver's tree) plays by the same rules, and training, evaluation and the solver
(:mod:`ub.games.game_tree`) play one game.

- **KuhnPoker**: the prompt says ``[bet]`` and ``[call]`` add a chip to the pot, but the env
  never adds them (its pot stays at the two antes), so every hand is won or lost by one chip
  whatever was bet, a fold costs what a lost showdown does, and betting means nothing. Fixed:
  a bet and a call take the chip from the player and put it in the pot, as in Kuhn (1950).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

from ub.games.legal import entry_point

_KUHN_MOVE = re.compile(r"\[(Check|Bet|Fold|Call)\]", re.IGNORECASE)  # the env's own reading
_FIXED = "_ub_fixed"


def _kuhn_poker() -> None:
    from textarena.envs.KuhnPoker.env import KuhnPokerEnv

    step = KuhnPokerEnv.step

    @functools.wraps(step)
    def step_with_stakes(self: Any, action: str) -> Any:
        state = self.state
        match = _KUHN_MOVE.search(action.strip())
        move = match.group(1).lower() if match else None
        node = state.game_state.get("current_legal_action_tree")
        if move in ("bet", "call") and isinstance(node, dict) and move in node:
            state.game_state["pot"] += 1
            state.game_state["player_chips"][state.current_player_id] -= 1
        return step(self, action)

    setattr(step_with_stakes, _FIXED, True)
    KuhnPokerEnv.step = step_with_stakes


_FIXES: dict[str, Callable[[], None]] = {
    "textarena.envs.KuhnPoker.env:KuhnPokerEnv": _kuhn_poker,
}
_applied: set[str] = set()


def fix_game(env_id: str) -> None:
    """Fix ``env_id``'s game class, once a process, if it has a fix."""
    entry = entry_point(env_id) or ""
    if entry in _FIXES and entry not in _applied:
        _FIXES[entry]()
        _applied.add(entry)
