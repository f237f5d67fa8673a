"""Fixes to TextArena games whose env does not play by the rules its own prompt states.

Applied to every env ub plays (:func:`ub.games.specs.make_env`: rollouts, evaluation, the
exploitability solver of :mod:`ub.games.game_tree`), by giving the env the fixed class: a
copy of it (a branch point, the solver's tree) plays by the same rules. The fixed class keeps
the game's module and name, so everything ub dispatches on a game's class (legal moves,
position keys, the solver) knows it. ``textarena.make`` itself is left alone: the tiny
model's pre-training transcripts (:mod:`ub.model.transcripts`) are TextArena's own.

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

from ub.games.legal import entry_point, unwrap

_KUHN_MOVE = re.compile(r"\[(Check|Bet|Fold|Call)\]", re.IGNORECASE)  # the env's own reading


@functools.cache
def _fixed_kuhn_poker() -> type:
    from textarena.envs.KuhnPoker.env import KuhnPokerEnv

    def step(self: Any, action: str) -> Any:
        state = self.state
        match = _KUHN_MOVE.search(action.strip())
        move = match.group(1).lower() if match else None
        node = state.game_state.get("current_legal_action_tree")
        if move in ("bet", "call") and isinstance(node, dict) and move in node:
            state.game_state["pot"] += 1
            state.game_state["player_chips"][state.current_player_id] -= 1
        return KuhnPokerEnv.step(self, action)

    return type(KuhnPokerEnv.__name__, (KuhnPokerEnv,), {
        "step": step, "__module__": KuhnPokerEnv.__module__,
        "__qualname__": KuhnPokerEnv.__qualname__,
        "__doc__": "TextArena's KuhnPoker, a bet and a call paid into the pot (ub)."})


_FIXES: dict[str, Callable[[], type]] = {
    "textarena.envs.KuhnPoker.env:KuhnPokerEnv": _fixed_kuhn_poker,
}


def fix_env(env: Any, env_id: str) -> Any:
    """``env`` (just made) playing by its game's fixed class, if its game has a fix."""
    fixed = _FIXES.get(entry_point(env_id) or "")
    if fixed is not None:
        unwrap(env).__class__ = fixed()
    return env
