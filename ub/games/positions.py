"""The position a decision is taken in: the game's state as the player to move faces it.

A position key is a short canonical string read from the game's own state (TextArena's
``state.game_state`` and the seat to move), never from the prompt: the prompt holds the whole
move history, so two decisions in the same position almost never share one. Decisions that
share a key were taken in the same situation, which is what a per-position comparison of
their outcomes needs (``position_advantage``, ``state_baseline`` with ``key: position``:
docs/rewards.md). In a game of hidden information a key holds only what the mover can see
(in Kuhn Poker its own card and the betting so far, never the opponent's card).

A game's key is its rules' :meth:`~ub.games.rules.GameRules.position` (:mod:`ub.games.registry`,
by the core env's class, so every registered variant of a game has one):

==============  ==========================================  =====================================
game            key                                         example
==============  ==========================================  =====================================
TicTacToe       rows (``.`` empty) and the mark to move     ``X.O/.O./... X``
Nim             pile sizes and the seat to move             ``0,2,5 p1``
KuhnPoker       own card, round, chips (mover:other),       ``K r1/3 -1:-1 check``
                the round's betting (``-`` for none)
SimpleTak       rows (``.`` empty) and the seat to move     ``O.../.X../..../.... p1``
ConnectFour     rows (``.`` empty) and the seat to move     six rows of seven, then ``p0``
TowerOfHanoi    each tower's disks, bottom first           ``A:3,2 B: C:1``
==============  ==========================================  =====================================

Any other game gets ``None`` (a NULL ``position``). A game spec's ``position`` setting names a
function of one's own, ``package.module:function`` taking ``(env, seat)`` (the core env,
unwrapped) and returning the key or ``None``: it overrides the key alone (the game's rules
keep the rest), giving a key to a game whose rules have none or replacing one (docs/data.md);
a game of one's own gives its key in its rules instead (docs/games.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ub.components import load_function
from ub.games.registry import rules_for
from ub.games.rules import unwrap

PositionFunction = Callable[[Any, int], "str | None"]
"""``(core env, seat to move) -> position key`` (``None``: no key for this state)."""


def position_function(env_id: str, own: str | None = None) -> PositionFunction | None:
    """The function that keys ``env_id``'s positions: ``own`` (an import path,
    ``package.module:function``) when given, else its game's rules' position, else ``None``.

    :raises UbError: ``own`` does not import or is not callable (one line saying what to do).
    """
    if own is not None:
        return load_function(own, "position function", "docs/data.md")
    rules = rules_for(env_id)
    return rules.position if rules is not None and rules.provides("position") else None


def position_key(function: PositionFunction | None, env: Any, seat: int) -> str | None:
    """The key of the position ``seat`` is to move in, in ``env`` (wrapped or not)."""
    if function is None:
        return None
    key = function(unwrap(env), seat)
    if key is not None and not isinstance(key, str):
        raise TypeError(f"a position function returned {type(key).__name__}, not str or None")
    return key
