"""Rollout throughput vs raw engine throughput (issue: foundation benchmark).

Plays ``--games`` concurrent TicTacToe games, every seat the tiny model with one LoRA adapter,
and measures generated tokens/s over the whole rollout (game logic, prompt rendering,
tokenization, action extraction included). Then sends the very same prompts, with the same
per-request seeds and sampling settings, straight to the engine with no game logic and measures
tokens/s again. Both runs use the same engine (``max_num_seqs`` = ``--games``), so the ratio is
what the game loop costs. Prints one JSON object.

    .venv/bin/python bench/rollout.py [--games 128] [--repeats 2]

Targets: rollout/raw >= 0.85; peak RSS of this process <= 3 GB.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.compute as pc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2, help="best of N for each measurement")
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()

    from ub.inference.types import EngineConfig, GenerationRequest, SamplingConfig
    from ub.run.processes.worker import Worker
    from ub.vllm_environment import configure_vllm_environment

    configure_vllm_environment()
    from ub.actors.spec import parse_actor
    from ub.games.specs import GameSpec
    from ub.model.lora import LoraSettings, new_adapter
    from ub.model.tiny import build_tiny_model
    from ub.rollout import assign_games, play_games

    model = build_tiny_model()
    adapter = new_adapter(model, Path(tempfile.mkdtemp()) / "adapter", LoraSettings(rank=16),
                          seed=1, init_std=0.02)
    engine = Worker().engine(
        EngineConfig(model=str(model), max_num_seqs=args.games, max_lora_rank=16),
        SamplingConfig(temperature=1.0, max_tokens=args.max_tokens),
    )
    actor = parse_actor(f"model:{adapter}")
    games = assign_games(GameSpec("TicTacToe-v0-train"), [actor, actor], args.games, base_seed=0)
    play_games(games[:8], engine=engine, concurrency=8)  # warm-up: adapter load, kernels

    rollout_runs = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        rollout = play_games(games, engine=engine, concurrency=args.games)
        seconds = time.perf_counter() - t0
        rollout_runs.append((rollout.stats.generated_tokens / seconds, rollout, seconds))
    rollout_tps, rollout, rollout_seconds = max(rollout_runs, key=lambda r: r[0])

    steps = rollout.steps.filter(pc.equal(rollout.steps["actor_kind"], "model"))
    requests = [
        GenerationRequest(f"raw-{i}", list(ids), seed, str(adapter))
        for i, (ids, seed) in enumerate(zip(steps.column("prompt_token_ids").to_pylist(),
                                            steps.column("sampling_seed").to_pylist(),
                                            strict=True))
    ]
    raw_runs = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        outputs = engine.generate(requests)
        seconds = time.perf_counter() - t0
        raw_runs.append(sum(len(o.completion_token_ids) for o in outputs) / seconds)
    raw_tps = max(raw_runs)

    peak_rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    print(json.dumps({
        "games": args.games,
        "decisions": steps.num_rows,
        "generated_tokens": rollout.stats.generated_tokens,
        "rollout_seconds": round(rollout_seconds, 2),
        "rollout_tokens_per_s": round(rollout_tps, 1),
        "raw_engine_tokens_per_s": round(raw_tps, 1),
        "ratio": round(rollout_tps / raw_tps, 3),
        "peak_rss_gb": round(peak_rss_gb, 2),
        "target": {"ratio": ">= 0.85", "peak_rss_gb": "<= 3"},
    }, indent=2))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
