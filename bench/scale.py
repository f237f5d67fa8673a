"""Round time on a Ray cluster with 1 vs 2 rollout workers (this machine's cores, on loopback),
the learner's update time with 1 vs 2 data-parallel ranks, and the component rates the
multi-GPU projection rests on.

Not a test. ``.venv/bin/python bench/scale.py [--rounds 4] [--games 64] [--cpus 2]
[--part rollout|learner|components|all]``

Starts ``ray start --head`` with ``--cpus`` CPUs on 127.0.0.1, then runs ``ub train tiny-cpu``
twice on it with ``rollout.shards=2``: once with one rollout worker holding every CPU (one
engine on all cores), once with one worker per half (two engines, one shard each, in
parallel). The learner shares the CPUs between rounds (``cluster.learner.num_cpus=0``). Each
run's committed manifests give the steady-state split of a round (``rollout`` / ``learner`` /
``other``: orchestration, Parquet, DuckDB, checkpoint I/O); the first round (engine and model
start) is reported apart. Stops the cluster at the end.

The learner part runs ``--updates`` updates of the tiny-cpu model on synthetic batches of
``--rows`` rows, once as one process with ``--cpus`` threads, once as ``--cpus`` ranks of one
thread joined by gloo (``ub.distributed``), and reports the steady update time.

The components part measures, in one process: the time an engine takes to hot-load a new LoRA
adapter (the first request with a new adapter path, minus the same request once it is loaded)
for adapters of two sizes; the rate at which a rollout worker writes a Parquet shard of real
tiny-model games; and the time to publish a shard and a checkpoint to, and fetch a checkpoint
from, a run store (``file://`` here, the code path of every fsspec store).

Prints one JSON object.
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

from faults.runs import free_port, ray_head  # noqa: E402


def _run(root: Path, address: str, workers: int, cpus: int, args: argparse.Namespace) -> dict:
    from ub.run.folder.layout import RunPaths, read_json

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


def _learner(world: int, threads: int, root: Path, args: argparse.Namespace) -> dict:
    from ub.model.tiny import build_tiny_model

    out = root / f"learner-{world}"
    out.mkdir()
    address = f"127.0.0.1:{free_port()}"
    code = ("import sys; from ub.learner.testing import data_parallel_updates as run; "
            "run(*[int(a) if a.isdigit() else a for a in sys.argv[1:]])")
    settings = [address, str(build_tiny_model()), str(out), "1024", str(args.updates),
                str(args.rows), str(threads)]
    ranks = [subprocess.Popen([sys.executable, "-c", code, str(rank), str(world), *settings])
             for rank in range(world)]
    if any(rank.wait() for rank in ranks):
        raise SystemExit("a learner rank failed")
    updates = json.loads((out / "metrics-0.json").read_text())[1:]  # the first warms up
    return {"ranks": world, "threads_per_rank": threads,
            "update_seconds": round(statistics.fmean(m["seconds"] for m in updates), 3),
            "micro_batches": updates[0]["micro_batches"], "tokens": updates[0]["tokens"]}


def _components(root: Path) -> dict:
    """Adapter hot-load, shard write and run-store rates, in this process."""
    from ub.inference.types import EngineConfig, GenerationRequest, SamplingConfig
    from ub.run.processes.worker import Worker
    from ub.vllm_environment import configure_vllm_environment

    configure_vllm_environment()
    from ub.actors.spec import parse_actor
    from ub.data.shards import ShardId, write_shard
    from ub.games.specs import GameSpec
    from ub.learner.checkpoint import CheckpointState
    from ub.learner.checkpoint_writer import write_checkpoint
    from ub.model.lora import LoraSettings, new_adapter
    from ub.model.tiny import build_tiny_model
    from ub.rollout import assign_games, play_games
    from ub.run.folder.layout import RunPaths
    from ub.run.folder.store import RunStore, fetch_checkpoint, publish, publish_checkpoint

    model = build_tiny_model()
    config = EngineConfig(model=str(model), max_lora_rank=64, max_loras=2)
    worker = Worker()  # this process's engine, shared by the two measurements below
    engine = worker.engine(config, SamplingConfig(temperature=1.0, max_tokens=1))
    prompt = engine.tokenizer.encode("ub")

    def one_request(adapter: Path) -> float:
        started = time.perf_counter()
        engine.generate([GenerationRequest(f"r-{time.perf_counter_ns()}", prompt, 0,
                                           str(adapter))])
        return time.perf_counter() - started

    adapters = []
    for rank in (8, 64):
        loads = []
        for i in range(4):  # new paths: each is a new LoRA id, loaded from disk
            adapter = new_adapter(model, root / f"adapter-r{rank}-{i}", LoraSettings(rank=rank),
                                  seed=i, init_std=0.02)
            cold = one_request(adapter)
            loads.append(cold - statistics.median(one_request(adapter) for _ in range(3)))
        size = sum(f.stat().st_size for f in adapter.iterdir())
        adapters.append({"rank": rank, "adapter_mb": round(size / 1e6, 2),
                         "load_ms": round(1000 * statistics.median(loads[1:]), 1)})

    # A shard of 64 real games of the tiny model with an adapter, written 5 times.
    engine = worker.engine(config, SamplingConfig(temperature=1.0, max_tokens=16))
    actor = parse_actor(f"model:{root / 'adapter-r8-0'}")
    rollout = play_games(assign_games(GameSpec("TicTacToe-v0-train"), [actor, actor], 64,
                                      base_seed=0), engine=engine, run="bench")
    paths = RunPaths(root / "run", f"file://{root}/store/run")
    writes, files = [], ()
    for shard in range(5):
        started = time.perf_counter()
        files = write_shard(paths.train_data, ShardId(0, shard), "bench", rollout.steps,
                            rollout.games)
        writes.append(time.perf_counter() - started)
    shard_mb = sum(f.stat().st_size for f in files) / 1e6
    write_s = statistics.median(writes)

    # Publishing the shard and a rank-64 checkpoint, and fetching the checkpoint elsewhere.
    def adapter_files(into: Path) -> None:
        for f in (root / "adapter-r64-0").iterdir():
            (into / f.name).write_bytes(f.read_bytes())

    checkpoint = write_checkpoint(paths.checkpoint(1), CheckpointState(
        1, {"path": str(model), "fingerprint": "bench"}, LoraSettings(rank=64)), adapter_files)
    checkpoint_mb = sum(f.stat().st_size for f in checkpoint.iterdir()) / 1e6
    started = time.perf_counter()
    publish(paths, *files)
    publish_shard_s = time.perf_counter() - started
    started = time.perf_counter()
    publish_checkpoint(paths, checkpoint)
    publish_checkpoint_s = time.perf_counter() - started
    elsewhere = RunPaths(root / "elsewhere", paths.store)
    started = time.perf_counter()
    fetch_checkpoint(elsewhere, elsewhere.checkpoint(1))
    fetch_s = time.perf_counter() - started
    assert RunStore(paths.store).files("checkpoints")  # published for real
    return {
        "adapter_hot_load": adapters,
        "shard": {"games": rollout.games.num_rows, "decisions": rollout.steps.num_rows,
                  "mb": round(shard_mb, 3), "write_seconds": round(write_s, 4),
                  "decisions_per_second": round(rollout.steps.num_rows / write_s),
                  "mb_per_second": round(shard_mb / write_s, 1)},
        "store_file": {"shard_publish_seconds": round(publish_shard_s, 4),
                       "checkpoint_mb": round(checkpoint_mb, 2),
                       "checkpoint_publish_seconds": round(publish_checkpoint_s, 4),
                       "checkpoint_fetch_seconds": round(fetch_s, 4)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--games", type=int, default=64, help="games per round")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs the Ray head offers")
    parser.add_argument("--part", default="all",
                        choices=("rollout", "learner", "components", "all"))
    parser.add_argument("--rows", type=int, default=96, help="learner batch rows")
    parser.add_argument("--updates", type=int, default=5, help="learner updates per setting")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="ub-bench-scale-"))
    report: dict = {"cluster_cpus": args.cpus, "root": str(root)}
    if args.part in ("rollout", "all"):
        from ub.flows.prefect_env import configure_prefect

        configure_prefect(root / ".prefect")
        with ray_head(args.cpus) as address:
            results = [_run(root, address, workers, args.cpus, args) for workers in (1, 2)]
        one, two = results
        report.update({
            "games_per_round": args.games, "rounds": args.rounds, "runs": results,
            "speedup_steady_round": round(
                one["steady_round_seconds"] / two["steady_round_seconds"], 2)})
    if args.part in ("learner", "all"):
        one, many = _learner(1, args.cpus, root, args), _learner(args.cpus, 1, root, args)
        report["learner"] = {"rows": args.rows, "runs": [one, many], "speedup": round(
            one["update_seconds"] / many["update_seconds"], 2)}
    if args.part in ("components", "all"):
        report["components"] = _components(root)
    report["load_average"] = os.getloadavg()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
