"""Benchmark: one refresh of ``ub dashboard`` (:func:`ub.dashboard_state.gather` + render)
on a long run.

Not a test. Run it with ``.venv/bin/python bench/dashboard.py`` (``--help`` for options).

The dashboard reads a run's round manifests, its newest rating snapshot and its per-round metrics
Parquet, never the decisions (``steps``), so its cost grows with rounds and pool size, not with
games played. This builds a synthetic run of ``--rounds`` rounds (default 500) in the layout and
formats the flow writes: round r's manifest carries the leaderboard of its r + 2 pool members,
evaluations every 4 rounds, and a metrics file of the same metric names a real round has
(collection, eval, learner, batch, inference, time, and four per pool member). It then times,
warm, the median of several first frames (nothing parsed yet) and of several refreshes (the live
dashboard keeps parsed files and re-reads only new or changed ones) and prints one JSON object.
Target: <= 0.5 s per refresh, so a 2 s refresh interval leaves the machine to the run.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ub.dashboard import render
from ub.dashboard_state import gather
from ub.run.folder.views import METRICS_SCHEMA

ENV = "TicTacToe-v0-train"
ROUND_METRICS = (
    [f"batch/{k}" for k in ("advantage_std", "mean_sequence_tokens", "reward_mean", "size",
                             "total_tokens", "truncated")]
    + [f"collection/{ENV}/{k}" for k in (
        "actions_per_state", "draw_rate", "format_rate", "game_turns", "invalid_move_rate",
        "loss_rate", "response_tokens", "reward", "seconds_per_char", "seconds_per_game",
        "seconds_per_turn", "win_rate")]
    + [f"learner/{k}" for k in ("assemble_seconds", "entropy_mean", "grad_norm", "logprob_mean",
                                 "loss", "seconds", "tokens", "tokens_per_second", "update")]
    + ["inference/games_per_second", "inference/generated_tokens_per_second"]
    + [f"time/{k}" for k in ("eval", "learner", "other", "rollout", "round")]
)


def _member(name: str, rng: random.Random) -> dict:
    mu, sigma = rng.uniform(15, 35), rng.uniform(0.8, 8.3)
    wins, draws, losses = rng.randrange(200), rng.randrange(20), rng.randrange(200)
    return {"name": name, "kind": "fixed" if name == "random" else "checkpoint",
            "parent": None, "mu": mu, "sigma": sigma, "conservative": mu - 3 * sigma,
            "games": wins + draws + losses, "rated_games": wins + draws + losses,
            "wins": wins, "draws": draws, "losses": losses}


def build_run(root: Path, rounds: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    for folder in ("rounds", "ratings", "metrics"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    (root / "config.yaml").write_text(yaml.safe_dump({"rounds": rounds}))
    for r in range(rounds):
        members = [_member("random", rng)] + [_member(f"ckpt-{u:06d}", rng) for u in range(r + 2)]
        evals = {}
        if (r + 1) % 4 == 0:
            wins = rng.randrange(400)
            evals[str(r + 1)] = [{"actor": f"ckpt-{r + 1:06d}", "env_id": ENV,
                                  "opponent": "random", "games": 400, "wins": wins, "draws": 0,
                                  "losses": 400 - wins, "errors": 0, "win_rate": wins / 400,
                                  "win_low": 0.0, "win_high": 1.0, "invalid_move_rate": 0.1,
                                  "format_rate": 1.0}]
        manifest = {
            "round": r, "games": 64, "decisions": 2000, "model_decisions": 1000,
            "invalid_moves": 100, "generated_tokens": 4000, "outcomes": {"decisive": 64},
            "shards": [f"games/round={r:06d}/shard-0000.parquet"],
            "timings": {"round": 20.0, "rollout": 16.0, "eval": 0.0, "learner": 4.0,
                        "other": 0.3},
            "batch": {"size": 384, "total_tokens": 30000, "truncated": 0, "reward_mean": 0.1,
                      "advantage_std": 1.0},
            "learner": {"loss": rng.uniform(-0.1, 0.1), "grad_norm": rng.uniform(0, 1),
                        "tokens": 30000, "tokens_per_second": 6000.0, "seconds": 4.0},
            "evals": evals, "leaderboard": members,
        }
        (root / "rounds" / f"round-{r:06d}.json").write_text(json.dumps(manifest))
        (root / "ratings" / f"round-{r:06d}.json").write_text(
            json.dumps({"members": members, "matches": {}}))
        names = ROUND_METRICS + [f"pool/{m['name']}/{k}" for m in members
                                 for k in ("conservative", "games", "mu", "sigma")]
        pq.write_table(pa.table({"round": [r] * len(names), "metric": names,
                                 "value": [rng.random() for _ in names]}, schema=METRICS_SCHEMA),
                       root / "metrics" / f"round-{r:06d}.parquet")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--target", type=float, default=0.5, help="seconds per refresh")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder) / "long"
        build_run(root, args.rounds)
        gather(root)  # warm the page cache and imports

        def frame(cache: dict) -> float:
            start = time.perf_counter()
            state = gather(root, cache)
            render(state)
            assert state.rounds_done == args.rounds and len(state.ladder) == args.rounds + 2
            return time.perf_counter() - start

        first = statistics.median(frame({}) for _ in range(args.repeats))
        cache: dict = {}
        frame(cache)
        refresh = statistics.median(frame(cache) for _ in range(args.repeats))
        print(json.dumps({"rounds": args.rounds, "pool_members": args.rounds + 2,
                          "first_frame_seconds": round(first, 3),
                          "refresh_seconds": round(refresh, 3), "target_seconds": args.target,
                          "met": refresh <= args.target}))


if __name__ == "__main__":
    main()
