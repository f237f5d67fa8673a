"""Legal moves: every action string the current player may submit, read from the game's own state.

Scripted players (and anything else that needs to know what is allowed, e.g. a legal-move mask or
an expert) ask :func:`legal_actions`. Legality is derived from the core TextArena env's ``state``
(board, piles, betting tree, ...), never by parsing observation text, because observation wording
differs between the default, ``-train`` and ``-raw`` variants while the state does not.

Each game's moves are its rules' :meth:`~ub.games.rules.GameRules.legal_moves`, found in the
registry by the core env's class (:mod:`ub.games.registry`), so every registered variant of a
game (``-train``, ``-raw``, ``-medium``, ``-blind``, ...) is covered without parsing env-id
suffixes.
"""

from __future__ import annotations

from typing import Any

from ub.errors import UbError
from ub.games.registry import GUIDE, games_with, rules_for, rules_of
from ub.games.rules import unwrap


def supports_legal_actions(env_id: str) -> bool:
    """True if ``env_id`` is a registered TextArena id whose game's rules have legal moves."""
    rules = rules_for(env_id)
    return rules is not None and rules.provides("legal_moves")


def legal_actions(env: Any) -> list[str]:
    """Every legal action for the player to move in ``env`` (wrapped or not), in a fixed order.

    Each string is in the exact format the game accepts (``"[4]"``, ``"[0 3]"``, ``"[check]"``,
    ``"[A C]"``, ``"[col 3]"``); submitting any of them is never an invalid move. The order depends
    only on the game state, so a seeded chooser is reproducible.

    :raises UbError: the game has no legal-move function.
    :raises RuntimeError: the env was not reset, or the game is already over.
    """
    core = unwrap(env)
    rules = rules_of(core)
    if rules is None or not rules.provides("legal_moves"):
        what = getattr(core, "env_id", None) or type(core).__name__
        raise UbError(f"no legal-move function for {what}; scripted players support: "
                      f"{', '.join(games_with('legal_moves'))} (a game of one's own: give its "
                      f"rules legal_moves, {GUIDE})")
    state = getattr(core, "state", None)
    if state is None:
        raise RuntimeError(
            f"{type(core).__name__} has no state yet: call env.reset() before asking for moves"
        )
    if state.done:
        raise RuntimeError(f"the {rules.name} game is over: there are no legal actions")
    return rules.legal_moves(core)
