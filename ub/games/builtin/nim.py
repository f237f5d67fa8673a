"""Nim (normal play: taking the last object wins): legal moves, position keys, the nim-sum
strategy for the ``expert`` and ``perfect`` players, and its tree for the exploitability
solver."""

from __future__ import annotations

import random
from functools import reduce
from operator import xor
from typing import Any

from ub.games.rules import GameRules, TreeRules, one_root


def nim_move(piles: list[int]) -> tuple[int, int]:
    """``(pile, quantity)``: to a zero nim-sum when possible, else one from the largest pile."""
    total = 0
    for p in piles:
        total ^= p
    if total:
        for i, p in enumerate(piles):
            if p ^ total < p:
                return i, p - (p ^ total)
    largest = max(range(len(piles)), key=lambda i: (piles[i], -i))
    if piles[largest] == 0:
        raise RuntimeError("every pile is empty: is the game over?")
    return largest, 1


def _nim_sum_after(piles: list[int], move: str) -> int:
    pile, quantity = (int(x) for x in move.strip("[]").split())
    left = list(piles)
    left[pile] -= quantity
    return reduce(xor, left, 0)


class NimRules(GameRules):
    """Nim: ``[pile quantity]``; the key is the pile sizes and the seat to move
    (``0,2,5 p1``); the nim-sum strategy."""

    name = "Nim"
    entry_point = "textarena.envs.Nim.env:NimEnv"
    tree = TreeRules("Nim", "game", -1.0, one_root)

    def legal_moves(self, core: Any) -> list[str]:
        """Any pile, 1 to all of its objects."""
        piles: list[int] = core.state.game_state["piles"]
        return [f"[{p} {q}]" for p, size in enumerate(piles) for q in range(1, size + 1)]

    def position(self, core: Any, seat: int) -> str:
        """The pile sizes and the seat to move."""
        return f"{','.join(str(p) for p in core.state.game_state['piles'])} p{seat}"

    def expert_move(self, core: Any, rng: random.Random) -> str:
        """From a non-zero nim-sum, the move to zero (which wins); from a zero position, one
        object from the largest pile, waiting for a mistake. It draws nothing from ``rng``."""
        pile, quantity = nim_move(list(core.state.game_state["piles"]))
        return f"[{pile} {quantity}]"

    def perfect_distribution(self, core: Any) -> dict[str, float]:
        """Uniform over the moves to a zero nim-sum (each wins); from a zero position every
        move loses against perfect play, and it draws among all of them."""
        piles = list(core.state.game_state["piles"])
        total = reduce(xor, piles, 0)
        legal = self.legal_moves(core)
        moves = [m for m in legal if total and _nim_sum_after(piles, m) == 0] or legal
        return {m: 1 / len(moves) for m in moves}
