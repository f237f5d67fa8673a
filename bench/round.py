"""Per-round time breakdown of a real ``ub train`` run on ``tiny-cpu``.

Not a test. ``.venv/bin/python bench/round.py [--rounds 5] [--games 128] [--set KEY=VALUE ...]``

Runs the real flow (Prefect's temporary server, the vLLM engine, the learner) for ``--rounds``
rounds with evaluation off, then reads each round's manifest: ``rollout`` is the time inside
the rollout loop (engine generation and game stepping), ``learner`` the update's compute
(micro-batched forward/backward and the optimizer step); everything else, orchestration, task
bookkeeping, Parquet writes, the DuckDB batch query and checkpoint I/O, is ``other``. The first
round also loads the learner's base model and starts the engine, so it is reported apart and
left out of the steady-state figures. Target: ``other`` <= 10% of a round. The learner's
tokens/s is its update's (real tokens over the update's seconds), the steady rounds' mean.
``--set`` changes a setting of the preset, e.g. ``--set learner.pack_prefixes=false`` (the
learner's rows as they are: compare with the default, prefix-tree packing on the CPU).

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--games", type=int, default=128, help="games per round")
    parser.add_argument("--root", help="runs folder (default: a temporary one)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting of the tiny-cpu preset to change (repeatable)")
    args = parser.parse_args()

    root = Path(args.root or tempfile.mkdtemp(prefix="ub-bench-round-"))
    from ub.flows.prefect_env import configure_prefect

    configure_prefect(root / ".prefect")
    from ub.flows.selfplay import selfplay
    from ub.run.folder.layout import RunPaths, read_json

    started = time.perf_counter()
    selfplay(run_name="bench", config="tiny-cpu", root=str(root), rounds=args.rounds,
             overrides=[f"rollout.games_per_round={args.games}", "eval.every=0", *args.set],
             quiet=True)
    wall = time.perf_counter() - started
    paths = RunPaths.of(root, "bench")
    rounds = [read_json(paths.manifest(r)) for r in paths.committed_rounds()]
    steady = rounds[1:] or rounds

    def mean(key: str) -> float:
        return statistics.fmean(m["timings"][key] for m in steady)

    round_s = mean("round")
    print(json.dumps({
        "rounds": len(rounds), "games_per_round": args.games,
        "first_round_seconds": rounds[0]["timings"],
        "steady_round_seconds": round(round_s, 3),
        "rollout_seconds": round(mean("rollout"), 3),
        "learner_seconds": round(mean("learner"), 3),
        "learner_tokens_per_second": round(statistics.fmean(
            m["learner"]["tokens_per_second"] for m in steady), 1),
        "settings": args.set,
        "other_seconds": round(mean("other"), 3),
        "other_fraction": round(mean("other") / round_s, 4),
        "target_other_fraction": 0.10,
        "wall_seconds_including_startup": round(wall, 1),
        "load_average": os.getloadavg(),
        "root": str(root),
    }, indent=1))


if __name__ == "__main__":
    main()
