"""What win rate against the random player each TicTacToe skill is worth.

Not a test. ``.venv/bin/python bench/tictactoe_bounds.py [--games 20000] [--seed 0]
[--complete P [--block Q] [--centre C]]``

Plays simple rule-based policies against the uniformly random player, in each seat, and prints
their win rates next to the best possible (an exact expectimax against the random player). It
says which skills a checkpoint needs for issue 15's 75% (seats balanced, as the evaluation):
completing its own lines alone is worth about two thirds; the centre or blocking on top of it
about four fifths.

``--complete P --block Q --centre C`` adds a row for a policy that uses each skill only with
that probability where it applies (else the next rule, finally a random move): what a
checkpoint's measured rates (``bench/learning.py``) are worth.
"""

from __future__ import annotations

import argparse
import functools
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ub.games.builtin.tictactoe import (
    TICTACTOE_MARKS,
    completing_cells,
    opponent_mark,
    tictactoe_winner,
)

# name: probability of (completing its own line, blocking the opponent's, taking the centre)
# where the skill applies
Skills = tuple[float, float, float]
POLICIES: dict[str, Skills] = {
    "random": (0.0, 0.0, 0.0),
    "complete": (1.0, 0.0, 0.0),
    "complete, centre": (1.0, 0.0, 1.0),
    "complete, block": (1.0, 1.0, 0.0),
    "complete, block, centre": (1.0, 1.0, 1.0),
}


def _place(cells: str, cell: int, mark: str) -> str:
    return cells[:cell] + mark + cells[cell + 1:]


def _uses(probability: float, rng: random.Random) -> bool:
    # Draws only for a real probability, so the all-or-nothing rows keep their random streams.
    return probability >= 1.0 or (probability > 0.0 and rng.random() < probability)


def rule_move(cells: str, me: str, rules: Skills, rng: random.Random) -> int:
    complete, block, centre = rules
    if complete and (mine := completing_cells(cells, me)) and _uses(complete, rng):
        return rng.choice(sorted(mine))
    if block and (theirs := completing_cells(cells, opponent_mark(me))) and _uses(block, rng):
        return rng.choice(sorted(theirs))
    if centre and cells[4] == "." and _uses(centre, rng):
        return 4
    return rng.choice([i for i, c in enumerate(cells) if c == "."])


def play(seat: int, rules: Skills, rng: random.Random) -> bool:
    """One game against the random player; True if the policy in ``seat`` won."""
    cells = "." * 9
    for turn in range(9):
        mark = TICTACTOE_MARKS[turn % 2]
        empty = [i for i, c in enumerate(cells) if c == "."]
        move = rule_move(cells, mark, rules, rng) if turn % 2 == seat else rng.choice(empty)
        cells = _place(cells, move, mark)
        if tictactoe_winner(cells) == mark:
            return turn % 2 == seat
    return False


@functools.cache
def best_win_probability(cells: str, turn: int, seat: int) -> float:
    """P(the player in ``seat`` wins) with its best play against the random player."""
    mark = TICTACTOE_MARKS[turn % 2]
    empty = [i for i, c in enumerate(cells) if c == "."]
    if not empty:
        return 0.0
    values = []
    for cell in empty:
        after = _place(cells, cell, mark)
        values.append(float(turn % 2 == seat) if tictactoe_winner(after) == mark
                      else best_win_probability(after, turn + 1, seat))
    return max(values) if turn % 2 == seat else sum(values) / len(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--games", type=int, default=20000, help="games per policy and seat")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--complete", type=float, help="P(complete its own line when it can)")
    parser.add_argument("--block", type=float, default=0.0,
                        help="P(stop the opponent's line when it must), with --complete")
    parser.add_argument("--centre", type=float, default=0.0,
                        help="P(take the free centre otherwise), with --complete")
    args = parser.parse_args()
    policies = dict(POLICIES)
    if args.complete is None and (args.block or args.centre):
        parser.error("--block and --centre describe a player with --complete: give it too")
    if args.complete is not None:
        for name in ("complete", "block", "centre"):
            if not 0.0 <= getattr(args, name) <= 1.0:
                parser.error(f"--{name} is a probability: give a number from 0 to 1")
        policies[f"{args.complete:.0%} / {args.block:.0%} / {args.centre:.0%}"] = (
            args.complete, args.block, args.centre)
    print(f"{'policy vs random':<26} {'first seat':>10} {'second':>8} {'both':>7}")
    for name, rules in policies.items():
        rng = random.Random(args.seed)
        rates = [sum(play(seat, rules, rng) for _ in range(args.games)) / args.games
                 for seat in (0, 1)]
        print(f"{name:<26} {rates[0]:>10.1%} {rates[1]:>8.1%} {sum(rates) / 2:>7.1%}")
    best = [best_win_probability("." * 9, 0, seat) for seat in (0, 1)]
    print(f"{'best possible (exact)':<26} {best[0]:>10.1%} {best[1]:>8.1%} {sum(best) / 2:>7.1%}")


if __name__ == "__main__":
    main()
