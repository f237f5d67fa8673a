"""Legal moves: every action string the current player may submit, read from the game's own state.

Scripted players (and anything else that needs to know what is allowed, e.g. a legal-move mask or
an expert) ask :func:`legal_actions`. Legality is derived from the core TextArena env's ``state``
(board, piles, betting tree, ...), never by parsing observation text, because observation wording
differs between the default, ``-train`` and ``-raw`` variants while the state does not.

The functions are dispatched on the core env's class (``module:Class``, exactly how TextArena's
registry names an entry point), so every registered variant of a supported game (``-train``,
``-raw``, ``-medium``, ``-blind``, ...) is covered without parsing env-id suffixes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ub.errors import UbError

# How many `.env` hops `unwrap` follows before deciding the chain is cyclic (TextArena stacks 2-3).
_MAX_WRAPPER_DEPTH = 64


def unwrap(env: Any) -> Any:
    """Return the core TextArena env under any stack of wrappers.

    Wrappers (TextArena's and any of ours) keep the wrapped env in ``.env``; the core env has none.
    """
    for _ in range(_MAX_WRAPPER_DEPTH):
        inner = getattr(env, "env", None)
        if inner is None:
            return env
        env = inner
    raise RuntimeError(f"env wrapper chain deeper than {_MAX_WRAPPER_DEPTH}: is it cyclic?")


def _cell_actions(board: list[list[str]], empty: str) -> list[str]:
    """``[i]`` for every empty cell of a square board, numbered row-major (TicTacToe, SimpleTak)."""
    size = len(board[0])
    return [
        f"[{r * size + c}]"
        for r, row in enumerate(board)
        for c, cell in enumerate(row)
        if cell == empty
    ]


def _tictactoe(core: Any) -> list[str]:
    return _cell_actions(core.state.game_state["board"], empty="")


def _simple_tak(core: Any) -> list[str]:
    return _cell_actions(core.state.game_state["board"], empty="")


def _nim(core: Any) -> list[str]:
    # "[pile quantity]": any pile, 1..all of its objects.
    piles: list[int] = core.state.game_state["piles"]
    return [f"[{p} {q}]" for p, size in enumerate(piles) for q in range(1, size + 1)]


def _kuhn_poker(core: Any) -> list[str]:
    # The env walks a betting tree; its current node's keys are exactly the allowed moves
    # (check/bet at the start, fold/call facing a bet). Leaves are strings ("showdown"/"loser"), but
    # the env deals the next round before returning, so the current node is always a dict mid-game.
    node = core.state.game_state["current_legal_action_tree"]
    if not isinstance(node, dict):
        return []
    return [f"[{move}]" for move in node]


def _tower_of_hanoi(core: Any) -> list[str]:
    # A disk may go onto an empty tower or a larger disk. "[X X]" (same tower) is accepted by
    # TextArena as a no-op that burns a turn; it is not a real move, so it is not listed.
    towers: dict[str, list[int]] = core.state.game_state["towers"]
    actions = []
    for source, source_disks in towers.items():
        if not source_disks:
            continue
        for target, target_disks in towers.items():
            if target != source and (not target_disks or target_disks[-1] > source_disks[-1]):
                actions.append(f"[{source} {target}]")
    return actions


def _guess_the_number(core: Any) -> list[str]:
    # Any number in range is a legal guess, except one already guessed (the env rejects repeats).
    guessed: set[int] = core.guessed_numbers
    return [f"[{n}]" for n in range(core.min_number, core.max_number + 1) if n not in guessed]


def _connect_four(core: Any) -> list[str]:
    # A column is open while its top cell is empty; "[col c]" is the format the prompt teaches.
    top_row: list[str] = core.state.game_state["board"][0]
    return [f"[col {c}]" for c, cell in enumerate(top_row) if cell == "."]


# Keyed by the core env's "module:Class", the same string TextArena's registry uses as entry point.
_LEGAL_BY_ENTRY_POINT: dict[str, tuple[str, Callable[[Any], list[str]]]] = {
    "textarena.envs.ConnectFour.env:ConnectFourEnv": ("ConnectFour", _connect_four),
    "textarena.envs.GuessTheNumber.env:GuessTheNumberEnv": ("GuessTheNumber", _guess_the_number),
    "textarena.envs.KuhnPoker.env:KuhnPokerEnv": ("KuhnPoker", _kuhn_poker),
    "textarena.envs.Nim.env:NimEnv": ("Nim", _nim),
    "textarena.envs.SimpleTak.env:SimpleTakEnv": ("SimpleTak", _simple_tak),
    "textarena.envs.TicTacToe.env:TicTacToeEnv": ("TicTacToe", _tictactoe),
    "textarena.envs.TowerOfHanoi.env:TowerOfHanoiEnv": ("TowerOfHanoi", _tower_of_hanoi),
}

SUPPORTED_GAMES: tuple[str, ...] = tuple(sorted(game for game, _ in _LEGAL_BY_ENTRY_POINT.values()))


def _unsupported(what: str) -> UbError:
    return UbError(
        f"no legal-move function for {what}; scripted players support: {', '.join(SUPPORTED_GAMES)}"
    )


def entry_point(env_id: str) -> str | None:
    """The registered ``module:Class`` of ``env_id``, or None if TextArena does not know the id."""
    from textarena.envs.registration import ENV_REGISTRY  # importing textarena registers all envs

    spec = ENV_REGISTRY.get(env_id)
    if spec is None:
        return None
    entry = spec.entry_point
    if isinstance(entry, str):
        return entry
    return f"{entry.__module__}:{entry.__qualname__}"


def supports_legal_actions(env_id: str) -> bool:
    """True if ``env_id`` is a registered TextArena id whose game has a legal-move function."""
    return entry_point(env_id) in _LEGAL_BY_ENTRY_POINT


def legal_actions(env: Any) -> list[str]:
    """Every legal action for the player to move in ``env`` (wrapped or not), in a fixed order.

    Each string is in the exact format the game accepts (``"[4]"``, ``"[0 3]"``, ``"[check]"``,
    ``"[A C]"``, ``"[col 3]"``); submitting any of them is never an invalid move. The order depends
    only on the game state, so a seeded chooser is reproducible.

    :raises UbError: the game has no legal-move function.
    :raises RuntimeError: the env was not reset, or the game is already over.
    """
    core = unwrap(env)
    cls = type(core)
    entry = _LEGAL_BY_ENTRY_POINT.get(f"{cls.__module__}:{cls.__qualname__}")
    if entry is None:
        raise _unsupported(getattr(core, "env_id", None) or cls.__name__)
    state = getattr(core, "state", None)
    if state is None:
        raise RuntimeError(
            f"{cls.__name__} has no state yet: call env.reset() before asking for moves"
        )
    if state.done:
        raise RuntimeError(f"the {entry[0]} game is over: there are no legal actions")
    return entry[1](core)
