"""Round time on a Ray cluster with 1 vs 2 rollout workers (this machine's cores, on loopback).

Not a test. ``.venv/bin/python bench/scale.py [--rounds 4] [--games 64] [--cpus 2]``

Starts ``ray start --head`` with ``--cpus`` CPUs on 127.0.0.1, then runs ``ub train tiny-cpu``
twice on it with ``rollout.shards=2``: once with one rollout worker holding every CPU (one
engine on all cores), once with one worker per half (two engines, one shard each, in
parallel). The learner shares the CPUs between rounds (``cluster.learner.num_cpus=0``). Each
run's committed manifests give the steady-state split of a round (``rollout`` / ``learner`` /
``other``: orchestration, Parquet, DuckDB, checkpoint I/O); the first round (engine and model
start) is reported apart. Stops the cluster at the end. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
BIN = Path(sys.executable).parent

from faults.runs import ray_head  # noqa: E402


def _run(root: Path, address: str, workers: int, cpus: int, args: argparse.Namespace) -> dict:
    from ub.run.layout import RunPaths, read_json

    name = f"workers-{workers}"
    overrides = [f"rollout.games_per_round={args.games}", "rollout.shards=2", "eval.every=0",
                 f"cluster.rollout_workers={workers}",
                 f"cluster.rollout.num_cpus={cpus // workers}", "cluster.learner.num_cpus=0"]
    command = [str(BIN / "ub"), "train", "tiny-cpu", "--run", name, "--root", str(root),
               "--rounds", str(args.rounds), "--ray", address, "--quiet"]
    for item in overrides:
        command += ["--set", item]
    started = time.perf_counter()
    subprocess.run(command, check=True)
    wall = time.perf_counter() - started
    paths = RunPaths.of(root, name)
    rounds = [read_json(paths.manifest(r)) for r in paths.committed_rounds()]
    steady = rounds[1:] or rounds

    def mean(key: str) -> float:
        return round(statistics.fmean(m["timings"][key] for m in steady), 3)

    return {"rollout_workers": workers, "cores_per_engine": cpus // workers,
            "first_round_seconds": rounds[0]["timings"]["round"],
            "steady_round_seconds": mean("round"), "rollout_seconds": mean("rollout"),
            "learner_seconds": mean("learner"), "other_seconds": mean("other"),
            "games_per_second": round(args.games / mean("round"), 2),
            "wall_seconds_including_startup": round(wall, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--games", type=int, default=64, help="games per round")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs the Ray head offers")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="ub-bench-scale-"))
    from ub.run.prefect_env import configure_prefect

    configure_prefect(root / ".prefect")
    with ray_head(args.cpus) as address:
        results = [_run(root, address, workers, args.cpus, args) for workers in (1, 2)]
    one, two = results
    print(json.dumps({
        "games_per_round": args.games, "rounds": args.rounds, "cluster_cpus": args.cpus,
        "runs": results,
        "speedup_steady_round": round(one["steady_round_seconds"] / two["steady_round_seconds"],
                                      2),
        "load_average": os.getloadavg(), "root": str(root),
    }, indent=1))


if __name__ == "__main__":
    main()
