"""The position a decision is taken in: the game's state as the player to move faces it.

A position key is a short canonical string read from the game's own state (TextArena's
``state.game_state`` and the seat to move), never from the prompt: the prompt holds the whole
move history, so two decisions in the same position almost never share one. Decisions that
share a key were taken in the same situation, which is what a per-position comparison of
their outcomes needs (``position_advantage``, ``state_baseline`` with ``key: position``:
docs/rewards.md). In a game of hidden information a key holds only what the mover can see
(in Kuhn Poker its own card and the betting so far, never the opponent's card).

The built-in keys are dispatched on the core env's class, like :mod:`ub.games.legal`, so every
registered variant of a game (``-train``, ``-raw``, ``-medium``, ...) has one:

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
unwrapped) and returning the key or ``None``: that gives a key to another game or replaces a
built-in one (docs/data.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ub.components import load_function
from ub.games.legal import entry_point, unwrap

PositionFunction = Callable[[Any, int], "str | None"]
"""``(core env, seat to move) -> position key`` (``None``: no key for this state)."""


def _rows(board: list[list[str]], empty: set[str]) -> str:
    return "/".join("".join("." if cell in empty else str(cell) for cell in row) for row in board)


def _tictactoe(core: Any, seat: int) -> str:
    # TextArena's TicTacToe gives seat 1 'X' and seat 0 'O' (TicTacToeEnv.step).
    return f"{_rows(core.state.game_state['board'], {''})} {'X' if seat == 1 else 'O'}"


def _nim(core: Any, seat: int) -> str:
    return f"{','.join(str(p) for p in core.state.game_state['piles'])} p{seat}"


_KUHN_CARDS = "JQK"


def kuhn_history(core: Any) -> str:
    """The betting so far in Kuhn Poker's current round, as the player to move faces it:
    ``""`` (it opens), ``"check"``, ``"bet"`` or ``"check bet"``, read from the betting tree's
    current node and whether the mover opened the round (each node is reached two ways)."""
    state = core.state
    node = state.game_state["current_legal_action_tree"]
    if "check" in node:
        # The opening node's "check" leads to another decision; after a check it ends the hand.
        return "" if isinstance(node["check"], dict) else "check"
    first_to_act = state.current_player_id == state.game_state["starting_player"]
    return "check bet" if first_to_act else "bet"


def _kuhn_poker(core: Any, seat: int) -> str | None:
    game = core.state.game_state
    if not isinstance(game["current_legal_action_tree"], dict):
        return None
    chips = game["player_chips"]
    betting = kuhn_history(core).replace(" ", ",") or "-"
    return (f"{_KUHN_CARDS[game['player_cards'][seat]]} r{game['current_round']}/"
            f"{core.max_rounds} {chips[seat]}:{chips[1 - seat]} {betting}")


def _board_and_seat(core: Any, seat: int) -> str:
    return f"{_rows(core.state.game_state['board'], {'', '.'})} p{seat}"


def _tower_of_hanoi(core: Any, seat: int) -> str:
    towers: dict[str, list[int]] = core.state.game_state["towers"]
    return " ".join(f"{name}:{','.join(map(str, disks))}" for name, disks in towers.items())


# Keyed by the core env's "module:Class", the string TextArena's registry uses as entry point.
BUILT_IN: dict[str, PositionFunction] = {
    "textarena.envs.ConnectFour.env:ConnectFourEnv": _board_and_seat,
    "textarena.envs.KuhnPoker.env:KuhnPokerEnv": _kuhn_poker,
    "textarena.envs.Nim.env:NimEnv": _nim,
    "textarena.envs.SimpleTak.env:SimpleTakEnv": _board_and_seat,
    "textarena.envs.TicTacToe.env:TicTacToeEnv": _tictactoe,
    "textarena.envs.TowerOfHanoi.env:TowerOfHanoiEnv": _tower_of_hanoi,
}


def position_function(env_id: str, own: str | None = None) -> PositionFunction | None:
    """The function that keys ``env_id``'s positions: ``own`` (an import path,
    ``package.module:function``) when given, else the built-in one of its game, else ``None``.

    :raises UbError: ``own`` does not import or is not callable (one line saying what to do).
    """
    if own is not None:
        return load_function(own, "position function", "docs/data.md")
    return BUILT_IN.get(entry_point(env_id) or "")


def position_key(function: PositionFunction | None, env: Any, seat: int) -> str | None:
    """The key of the position ``seat`` is to move in, in ``env`` (wrapped or not)."""
    if function is None:
        return None
    key = function(unwrap(env), seat)
    if key is not None and not isinstance(key, str):
        raise TypeError(f"a position function returned {type(key).__name__}, not str or None")
    return key
