"""Pool speed: sample 10,000 opponents and rate 10,000 games with a pool of 200 members.

Not a test. ``.venv/bin/python bench/pool.py [--members 200] [--n 10000]``

The pool holds ``--members - 10`` learner checkpoints (with spread-out ratings) and 10 fixed
opponents. Sampling is timed per mode (and for an 80/20 mirror/lagged mixture); rating plays
random decisive and drawn games between random members. Prints one JSON object. Sampling should
never show up in a round's time profile (a tiny-cpu round takes ~20 s).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=200)
    parser.add_argument("--n", type=int, default=10_000)
    args = parser.parse_args()

    from ub.pool import MODES, OpponentConfig, PoolView, RatingTable, sample_opponents

    rng = random.Random(0)
    table = RatingTable()
    checkpoints = tuple(f"ckpt-{i:06d}" for i in range(args.members - 10))
    fixed = tuple(f"fixed-{i}" for i in range(10))
    for i, name in enumerate(checkpoints):
        member = table.add_checkpoint(name)
        member.mu, member.games = 15 + 20 * i / len(checkpoints), rng.randrange(100)
    for name in fixed:
        table.add_fixed(name)
    view = PoolView(current=checkpoints[-1], checkpoints=checkpoints, fixed=fixed, ratings=table)

    sampling = {}
    configs = {mode: [{"mode": mode}] for mode in MODES}
    configs["mirror 0.8 + lagged 0.2"] = [{"mode": "mirror", "weight": 0.8},
                                          {"mode": "lagged", "weight": 0.2}]
    for label, config in configs.items():
        parsed = OpponentConfig.from_dict(config)
        started = time.perf_counter()
        sample_opponents(parsed, view, args.n, seed=1)
        sampling[label] = round(time.perf_counter() - started, 4)

    members = [*checkpoints, *fixed]
    games = []
    for _ in range(args.n):
        a, b = rng.sample(members, 2)
        draw = rng.random() < 0.1
        games.append({"actors": [a, b], "rewards": [0.0, 0.0] if draw else [1.0, -1.0],
                      "outcome": "draw" if draw else "decisive"})
    started = time.perf_counter()
    table.rate_games(games)
    rating_seconds = time.perf_counter() - started

    print(json.dumps({
        "members": args.members, "samples": args.n, "games": args.n,
        "sampling_seconds": sampling,
        "rating_seconds": round(rating_seconds, 3),
        "rating_games_per_second": round(args.n / rating_seconds),
    }, indent=1))


if __name__ == "__main__":
    main()
