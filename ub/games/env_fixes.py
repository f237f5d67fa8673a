"""Fixes to TextArena games whose env does not play by the rules its own prompt states.

Applied to every env ub plays (:func:`ub.games.specs.make_env`: rollouts, evaluation, the
exploitability solver of :mod:`ub.games.game_tree`), by giving the env the fixed class its
game's rules name (:meth:`ub.games.rules.GameRules.fixed_class`): a copy of it (a branch point,
the solver's tree) plays by the same rules. The fixed class keeps the game's module and name,
so everything ub dispatches on a game's class (its rules: :mod:`ub.games.registry`) knows it.
``textarena.make`` itself is left alone: the tiny model's pre-training transcripts
(:mod:`ub.model.transcripts`) are TextArena's own.

The built-in fix: KuhnPoker's bets and calls are paid into the pot (:mod:`ub.games.builtin.
kuhn_poker`).
"""

from __future__ import annotations

from typing import Any

from ub.games.registry import rules_for
from ub.games.rules import unwrap


def fix_env(env: Any, env_id: str) -> Any:
    """``env`` (just made) playing by its game's fixed class, if its game has a fix."""
    rules = rules_for(env_id)
    fixed = rules.fixed_class() if rules is not None else None
    if fixed is not None:
        unwrap(env).__class__ = fixed
    return env
