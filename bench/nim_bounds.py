"""What win rate against the random player a Nim policy can have: the bounds a checkpoint sits
between.

Not a test. ``.venv/bin/python bench/nim_bounds.py [--piles 3,4,5] [--games 20000] [--seed 0]``

Exact, by expectimax over every position (piles and the player to move) of Nim-v0's game (take
1..all objects from one pile; whoever takes the last object wins), against the uniformly
random legal player that ub's ``random`` actor is, in each seat and with the seats balanced
as the evaluation plays them:

- **random**: the random player's own win rate in that seat (the bar a checkpoint must clear);
- **take the last pile**: random, except that it takes the whole pile when one pile is left
  (the one skill bench/nim_last_pile.py probes);
- **perfect play**: the nim-sum strategy (leave a position of nim-sum 0 where it can, else a
  random move): optimal against any opponent;
- **best response**: the most any policy wins against the random player.

A sampled check (``--games`` per seat, the same rules) prints beside the exact figures.
"""

from __future__ import annotations

import argparse
import functools
import random
from collections.abc import Callable
from functools import reduce
from operator import xor

Piles = tuple[int, ...]
Policy = Callable[[Piles], list[Piles]]  # the positions it may leave, chosen among uniformly


def moves(piles: Piles) -> list[Piles]:
    """Every position one legal move leaves, in the order of ub's legal actions (pile, then
    quantity): a uniform choice among them is the random player."""
    return [(*piles[:p], size - q, *piles[p + 1:])
            for p, size in enumerate(piles) for q in range(1, size + 1)]


def random_policy(piles: Piles) -> list[Piles]:
    return moves(piles)


def take_last_pile(piles: Piles) -> list[Piles]:
    if sum(size > 0 for size in piles) == 1:
        return [tuple(0 for _ in piles)]
    return moves(piles)


def perfect(piles: Piles) -> list[Piles]:
    zero = [after for after in moves(piles) if reduce(xor, after) == 0]
    return zero or moves(piles)


POLICIES: dict[str, Policy] = {
    "random": random_policy, "take the last pile": take_last_pile, "perfect play": perfect,
}


@functools.cache
def win_probability(piles: Piles, to_move: int, seat: int, policy: str) -> float:
    """P(the player in ``seat``, playing ``policy``, wins) from ``piles`` with ``to_move`` to
    move, against the random player (``policy == "best"``: its best response)."""
    options = moves(piles)
    mine = to_move == seat
    if mine and policy != "best":
        options = POLICIES[policy](piles)
    values = [float(mine) if not any(after) else
              win_probability(after, 1 - to_move, seat, policy) for after in options]
    if mine and policy == "best":
        return max(values)
    return sum(values) / len(values)


def sampled(piles: Piles, seat: int, policy: Policy, games: int, rng: random.Random) -> float:
    wins = 0
    for _ in range(games):
        position, to_move = piles, 0
        while True:
            position = rng.choice(policy(position) if to_move == seat else moves(position))
            if not any(position):
                wins += to_move == seat
                break
            to_move = 1 - to_move
    return wins / games


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--piles", default="3,4,5", help="Nim-v0's piles (default 3,4,5)")
    parser.add_argument("--games", type=int, default=20000, help="sampled games per seat")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    piles = tuple(int(p) for p in args.piles.split(","))
    rng = random.Random(args.seed)
    print(f"Nim {list(piles)} against the random player (exact; sampled in brackets)")
    print(f"{'policy':<22} {'first seat':>17} {'second seat':>17} {'seats balanced':>15}")
    for name in [*POLICIES, "best"]:
        exact = [win_probability(piles, 0, seat, name) for seat in (0, 1)]
        cells = [f"{e:.1%}" + (f" [{sampled(piles, seat, POLICIES[name], args.games, rng):.1%}]"
                               if name in POLICIES else "") for seat, e in enumerate(exact)]
        label = "best response" if name == "best" else name
        print(f"{label:<22} {cells[0]:>17} {cells[1]:>17} {sum(exact) / 2:>15.1%}")


if __name__ == "__main__":
    main()
