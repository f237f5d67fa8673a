"""Soak: a long ``ub train`` of ``tiny-cpu`` with small rounds, watched for leaks and slowdown.

Not a test. ``.venv/bin/python bench/soak.py [--rounds 300] [--games 8]`` (about 15 minutes on
2 cores at the defaults).

Runs the real CLI (``ub train``, its temporary Prefect server, the vLLM engine, the learner) as a
child process on a copy of ``tiny-cpu`` with ``--games`` games per round, a 20%-lagged opponent
mixture (so older checkpoints keep being loaded as LoRA adapters and evicted) and an evaluation
every 50 rounds. Each time a round commits, it samples the process tree: resident memory (the
``ub train`` process and all its children, Prefect's server included) and open file descriptors.
At the end it fits lines over the steady part (rounds from ``--warmup`` on) to memory and to each
round's ``other`` time (orchestration, bookkeeping, writes: the part that does not depend on how
long the policy's games are, which changes as it learns).

Then, in this process, it replays what a long run does to the engine's LoRA registry: one vLLM
engine with the run's settings serves one greedy request through each of the run's checkpoints in
turn (a new adapter per round, as the rollouts load them), sampling vLLM's resident adapters and
this process's memory.

It prints one JSON object: samples, the work done early and late, the slopes, and whether they
stay within the bounds: ``ub train`` memory growth <= 0.5 MB per round, open files growth <= 8,
``other`` growing by at most 10% per 100 rounds, resident adapters <= ``engine.max_loras``.

Where memory went before (memray, 80 rounds): ~3 MB a round in oneDNN matmul primitives that
vLLM's CPU GEMMs create per batch size, kept alive by oneDNN's global primitive cache; ub sets
``ONEDNN_PRIMITIVE_CACHE_CAPACITY=0`` (vLLM's per-layer cache of 32 stays).
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

import psutil
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ub.run.config.load import read_config_data
from ub.run.folder.layout import RunPaths, read_json


def _tree(pid: int) -> tuple[float, int]:
    """Resident MB and open file descriptors of a process and its descendants."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0, 0
    rss, fds = 0, 0
    for proc in procs:
        try:
            rss += proc.memory_info().rss
            fds += proc.num_fds()
        except psutil.NoSuchProcess:
            pass
    return rss / 2**20, fds


def _slope(xs: list[float], ys: list[float]) -> float:
    return statistics.linear_regression(xs, ys).slope if len(xs) > 1 else 0.0


def adapter_churn(root: Path, every: int = 10) -> dict:
    """One greedy request through each checkpoint of the soak run in turn, in this process."""
    from ub.inference.engine import VLLMEngine
    from ub.inference.types import GenerationRequest
    from ub.run.config.base_model import resolve_base_model
    from ub.run.steps.play import rollout_sampling, run_engine_config
    from ub.run.steps.rounds import Run, resolve_run_config
    from ub.vllm_environment import configure_vllm_environment

    paths = RunPaths.of(root, "soak")
    config, _ = resolve_run_config(paths, None)
    run = Run(paths, config, resolve_base_model(config))
    configure_vllm_environment()
    engine = VLLMEngine(run_engine_config(run), rollout_sampling(config, evaluation=True))
    prompt = engine.tokenizer.encode("[GAME] You are Player 0 in TicTacToe. Your move:")
    checkpoints = sorted((paths.root / "checkpoints").glob("ckpt-*"))
    samples = []
    try:
        for i, checkpoint in enumerate(checkpoints):
            engine.generate([GenerationRequest(f"r{i}", prompt, seed=i,
                                               adapter=str(checkpoint))])
            if i % every == 0 or i == len(checkpoints) - 1:
                samples.append({"adapters_loaded": i + 1,
                                "resident": engine.resident_adapters,
                                "rss_mb": round(_tree(os.getpid())[0], 1)})
    finally:
        engine.close()
    steady = samples[len(samples) // 4:]
    return {"checkpoints": len(checkpoints), "max_loras": config.engine.max_loras,
            "max_resident": max(s["resident"] for s in samples),
            "rss_mb_per_adapter": round(_slope([s["adapters_loaded"] for s in steady],
                                               [s["rss_mb"] for s in steady]), 3),
            "first": samples[0], "last": samples[-1]}


def soak_config(rounds: int, games: int) -> dict:
    """``tiny-cpu`` with small rounds, one optimizer step each, a lagged opponent and an
    evaluation every 50 rounds."""
    config = read_config_data("tiny-cpu")[0]
    config.update(rounds=rounds,
                  rollout={**config["rollout"], "games_per_round": games},
                  batch={**config["batch"], "batch_size": 8 * games},
                  # One optimizer step a round: four on rounds this small (16 rows a step)
                  # collapsed the policy to invalid moves by round ~100, and a policy whose
                  # games end at their first move no longer exercises the engine.
                  learner={**config["learner"], "minibatches": 1},
                  opponents=[{"mode": "mirror", "weight": 0.8},
                             {"mode": "lagged", "k": 8, "weight": 0.2}],
                  eval={**config["eval"], "every": 50, "games": 40})
    return config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--games", type=int, default=8, help="games per round")
    parser.add_argument("--warmup", type=int, default=20, help="rounds left out of the fits")
    parser.add_argument("--root", help="runs folder (default: a temporary one)")
    args = parser.parse_args()

    root = Path(args.root or tempfile.mkdtemp(prefix="ub-soak-"))
    config_file = root / "soak.yaml"
    root.mkdir(parents=True, exist_ok=True)
    config_file.write_text(yaml.safe_dump(soak_config(args.rounds, args.games)))
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    started = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-m", "ub.flows.cli", "train", str(config_file), "--run", "soak",
         "--root", str(root), "--quiet"], env=env, stdout=subprocess.DEVNULL,
        stderr=open(root / "soak.stderr", "w"))  # noqa: SIM115 (lives as long as the child)
    paths = RunPaths.of(root, "soak")
    samples: list[dict] = []
    while child.poll() is None:
        time.sleep(0.5)
        done = len(paths.committed_rounds())
        if done > len(samples):
            rss, fds = _tree(child.pid)
            samples.append({"round": done - 1, "rss_mb": round(rss, 1), "fds": fds})
    wall = time.perf_counter() - started
    if child.returncode != 0:
        sys.exit(f"ub train failed ({child.returncode}); see {root / 'soak.stderr'}")

    manifests = {r: read_json(paths.manifest(r)) for r in paths.committed_rounds()}
    steady = [s for s in samples if s["round"] >= args.warmup]
    rounds = [float(s["round"]) for s in steady]
    rss_slope = _slope(rounds, [s["rss_mb"] for s in steady])
    fds_growth = max(s["fds"] for s in steady) - steady[0]["fds"]
    # Round time follows the games the policy plays (shorter games, fewer decisions), so the
    # slowdown test is on the work-independent part: orchestration, bookkeeping, file writes.
    other = [manifests[int(r)]["timings"]["other"] for r in rounds]
    other_slope = _slope(rounds, other)
    mean_other = statistics.fmean(other)

    def at(r: int) -> dict:
        m = manifests[r]
        return {"round": r, "seconds": round(m["timings"]["round"], 2),
                "other_seconds": round(m["timings"]["other"], 3),
                "decisions": m["decisions"], "invalid_moves": m["invalid_moves"],
                "generated_tokens": m["generated_tokens"]}

    adapters = adapter_churn(root)
    print(json.dumps({
        "rounds": len(manifests), "games_per_round": args.games, "wall_seconds": round(wall),
        "first_sample": samples[0], "warm_sample": steady[0], "last_sample": samples[-1],
        "rss_mb_per_round": round(rss_slope, 3),
        "fds_growth_after_warmup": fds_growth,
        "work": [at(args.warmup), at(len(manifests) // 2), at(len(manifests) - 1)],
        "mean_other_seconds": round(mean_other, 3),
        "other_seconds_per_100_rounds": round(100 * other_slope, 4),
        "adapters": adapters,
        "bounded": rss_slope <= 0.5 and fds_growth <= 8
        and 100 * other_slope <= 0.10 * mean_other
        and adapters["max_resident"] <= adapters["max_loras"],
        "root": str(root),
    }, indent=1))


if __name__ == "__main__":
    main()
