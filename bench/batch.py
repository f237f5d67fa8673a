"""Benchmark: DuckDB batch assembly vs a plain-Python reference, on a store of 1M+ decisions.

Not a test. Run it with ``.venv/bin/python bench/batch.py`` (``--help`` for options). The first run
builds a synthetic store of model decisions in the real ``steps``/``games`` schemas (written with
:func:`ub.data.shards.write_shard`) and caches it (``--store``); later runs reuse it.

It then times, warm, the median of several runs of :func:`ub.batch.assemble_batch` for a
384-decision batch with per-env normalization, against the same batch built by loading the shards
into Python and looping (``reference_rows`` in ``tests/batch_reference.py``), checks that both
selected the same rows with the same advantages, and prints one JSON object with both figures
and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from batch_reference import reference_rows  # the plain-Python oracle the tests use too

from ub.batch import BatchConfig, assemble_batch, final_stage
from ub.data.schema import GAMES_SCHEMA, STEPS_SCHEMA
from ub.data.shards import ShardId, write_shard

ENVS = ("TicTacToe-v0-train", "Nim-v0-train", "KuhnPoker-v0-train")
STORE_VERSION = 2  # bump when the generator changes, so a cached store is rebuilt


def _lists(lengths: np.ndarray, values: np.ndarray, type_: pa.DataType) -> pa.ListArray:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=type_))


def synthetic_shard(
    round_: int, shard: int, games_per_shard: int, rng: np.random.Generator, run: str = "bench"
) -> tuple[pa.Table, pa.Table]:
    """One shard of synthetic games: 2 seats, 4-12 turns, model self-play plus some model vs random.

    Model rows carry prompt token ids (100-300), completion ids (2-30) and logprobs; scripted
    rows carry none, as in real data. 1% of games errored (rewards NULL). Text columns are short
    placeholders: batch assembly never reads them.
    """
    g = games_per_shard
    game_index = shard * g + np.arange(g)
    env = rng.integers(0, len(ENVS), g)
    turns = rng.integers(4, 13, g)
    vs_random = rng.random(g) < 0.15  # seat 1 is a scripted random player
    errored = rng.random(g) < 0.01
    winner = rng.integers(0, 2, g)
    draw = rng.random(g) < 0.2
    game_ids = [f"{run}-r{round_:06d}-g{i:06d}" for i in game_index]

    rewards, results, outcome = [], [], []
    for i in range(g):
        if errored[i]:
            rewards.append(None), results.append(None), outcome.append("error")
        elif draw[i]:
            rewards.append([0.0, 0.0]), results.append(["draw", "draw"]), outcome.append("draw")
        else:
            w = int(winner[i])
            rewards.append([1.0 if s == w else -1.0 for s in (0, 1)])
            results.append(["win" if s == w else "loss" for s in (0, 1)])
            outcome.append("decisive")
    games = pa.table({
        "run": [run] * g, "round": [round_] * g, "shard": [shard] * g, "game_id": game_ids,
        "game_index": game_index.astype(np.int32), "env_id": [ENVS[e] for e in env],
        "seed": game_index.astype(np.int64), "num_players": [2] * g,
        "actors": [["model", "random" if v else "model"] for v in vs_random],
        "roles": [["Player 0", "Player 1"]] * g, "rewards": rewards, "results": results,
        "invalid_moves": [[False, False]] * g, "outcome": outcome,
        "winner": [None if (errored[i] or draw[i]) else int(winner[i]) for i in range(g)],
        "num_turns": turns.astype(np.int32), "reason": ["bench"] * g, "error": [None] * g,
        "seconds": np.full(g, 0.1, dtype=np.float32),
    }, schema=GAMES_SCHEMA)

    # one row per decision, vectorized
    game_of = np.repeat(np.arange(g), turns)
    turn = np.concatenate([np.arange(t) for t in turns]).astype(np.int32)
    seat = (turn % 2).astype(np.int32)
    n = len(turn)
    model = ~(vs_random[game_of] & (seat == 1))
    final = np.array([
        np.nan if errored[k] else rewards[k][s] for k, s in zip(game_of, seat, strict=True)
    ])
    n_prompt = np.where(model, rng.integers(100, 301, n), 0)
    n_completion = np.where(model, rng.integers(2, 31, n), 0)
    # a fixed template prefix per env plus a random "board": compresses like real prompts do
    prefix = rng.integers(0, 4096, 64)
    prompt_values = rng.integers(0, 4096, int(n_prompt.sum())).astype(np.int32)
    starts = np.concatenate([[0], np.cumsum(n_prompt)[:-1]])
    for k in range(64):  # overwrite the first 64 tokens of every prompt with the prefix
        prompt_values[starts[model] + k] = prefix[k]
    completion_values = rng.integers(0, 4096, int(n_completion.sum())).astype(np.int32)
    logprob_values = -rng.exponential(0.5, int(n_completion.sum())).astype(np.float32)

    def nullable(arr: pa.ListArray) -> pa.Array:
        mask = pa.array(~model)
        return pc.if_else(mask, pa.nulls(n, arr.type), arr)

    steps = pa.table({
        "run": pa.array([run] * n), "round": np.full(n, round_, np.int32),
        "shard": np.full(n, shard, np.int32),
        "game_id": pa.array(game_ids).take(pa.array(game_of)),
        "env_id": pa.array([ENVS[e] for e in env]).take(pa.array(game_of)),
        "turn": turn, "seat": seat,
        "role": pa.array(["Player 0", "Player 1"]).take(pa.array(seat)),
        "actor": pa.array(np.where(model, "model", "random")),
        "actor_kind": pa.array(np.where(model, "model", "scripted")),
        "checkpoint": pa.array(np.where(model, f"ckpt-{round_:06d}", None)),
        "template": pa.array(np.where(model, "qwen3", None)),
        "observation": pa.array(["obs"] * n), "prompt": pa.array(["prompt"] * n),
        "completion": pa.array(["[3]"] * n),
        "prompt_token_ids": nullable(_lists(n_prompt, prompt_values, pa.int32())),
        "completion_token_ids": nullable(_lists(n_completion, completion_values, pa.int32())),
        "completion_logprobs": nullable(_lists(n_completion, logprob_values, pa.float32())),
        "num_prompt_tokens": pa.array(np.where(model, n_prompt, None)),
        "num_completion_tokens": pa.array(np.where(model, n_completion, None)),
        "action": pa.array(["[3]"] * n),
        "format_ok": rng.random(n) < 0.9, "invalid_move": rng.random(n) < 0.05,
        "step_reward": np.zeros(n, np.float32),
        "env_reward": pa.array(final, mask=np.isnan(final), type=pa.float32()),
        "finish_reason": pa.array(np.where(model, "stop", None)),
        "sampling_seed": pa.array(np.where(model, np.arange(n), None)),
        "gen_seconds": pa.nulls(n, pa.float32()), "env_seconds": np.zeros(n, np.float32),
    })
    return steps.cast(STEPS_SCHEMA), games


def build_store(path: Path, rounds: int, shards_per_round: int, games_per_shard: int) -> dict:
    """Write the synthetic store under ``path`` unless an identical one is cached there."""
    spec = {"version": STORE_VERSION, "rounds": rounds, "shards_per_round": shards_per_round,
            "games_per_shard": games_per_shard}
    marker = path / "bench-store.json"
    if marker.exists() and json.loads(marker.read_text()).get("spec") == spec:
        return json.loads(marker.read_text())
    if path.exists() and any(path.iterdir()) and not marker.exists():
        raise SystemExit(f"{path} exists and is not a bench store: pick another --store")
    import shutil

    shutil.rmtree(path / "steps", ignore_errors=True)
    shutil.rmtree(path / "games", ignore_errors=True)
    marker.unlink(missing_ok=True)
    started = time.perf_counter()
    decisions = 0
    for r in range(rounds):
        for s in range(shards_per_round):
            rng = np.random.default_rng([r, s])
            steps, games = synthetic_shard(r, s, games_per_shard, rng)
            write_shard(path, ShardId(r, s), "bench", steps, games)
            decisions += steps.num_rows
        print(f"  round {r + 1}/{rounds}: {decisions:,} decisions", file=sys.stderr, end="\r")
    info = {"spec": spec, "decisions": decisions, "shards": rounds * shards_per_round,
            "build_seconds": round(time.perf_counter() - started, 1)}
    marker.write_text(json.dumps(info))
    print(file=sys.stderr)
    return info


def python_collate(rows: list[dict], pad_token_id: int) -> dict[str, torch.Tensor]:
    """The reference's tensors: plain Python lists, padded in a loop."""
    seqs = [r["prompt_token_ids"] + r["completion_token_ids"] for r in rows]
    width = max(len(x) for x in seqs)
    ids, attention, completion, logprobs = [], [], [], []
    for r, seq in zip(rows, seqs, strict=True):
        pad = width - len(seq)
        n_prompt = len(r["prompt_token_ids"])
        ids.append(seq + [pad_token_id] * pad)
        attention.append([1] * len(seq) + [0] * pad)
        completion.append([0] * n_prompt + [1] * (len(seq) - n_prompt) + [0] * pad)
        logprobs.append([0.0] * n_prompt + list(r["completion_logprobs"]) + [0.0] * pad)
    return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(attention),
            "completion_mask": torch.tensor(completion, dtype=torch.float32),
            "behaviour_logprobs": torch.tensor(logprobs),
            "advantages": torch.tensor([r["advantage"] for r in rows])}


def python_batch(root: Path, config: BatchConfig, state: dict | None) -> list[dict]:
    rows = reference_rows(root, config, state)
    python_collate(rows, config.pad_token_id)
    return rows


def timed(fn, runs: int) -> tuple[float, list[float], float, object]:
    """Median wall seconds, every run's wall seconds, median CPU seconds (all threads), result.

    CPU time is reported because other work on the machine inflates wall time: on a busy
    machine it is the fairer figure of what the code costs.
    """
    times, cpu, out = [], [], None
    for _ in range(runs):
        started, cpu_started = time.perf_counter(), time.process_time()
        out = fn()
        times.append(time.perf_counter() - started)
        cpu.append(time.process_time() - cpu_started)
    return statistics.median(times), times, statistics.median(cpu), out


def same_rows(batch, rows: list[dict]) -> bool:
    got = batch.rows.to_pylist()
    return len(got) == len(rows) and all(
        (g["game_id"], g["turn"]) == (r["game_id"], r["turn"])
        and abs(g["advantage"] - r["advantage"]) <= 1e-6 for g, r in zip(got, rows, strict=True))


def scenario(root: Path, rounds: int, window: int | None, args: argparse.Namespace,
             python_runs: int, thread_options: tuple[int | None, ...] = (None, 1)) -> dict:
    """Time one window: DuckDB median of ``args.runs`` warm runs vs the Python reference."""
    last = rounds - 1
    first = 0 if window is None else max(0, rounds - window)
    config = BatchConfig(
        batch_size=args.batch_size, first_round=first, last_round=last, seed=args.seed,
        final=["win_draw_loss", {"name": "role_advantage", "ema": 0.95}],
        step=[{"name": "format_reward", "bonus": 0.1},
              {"name": "invalid_move_penalty", "penalty": -0.5}],
        sampling=["normalize_per_env"])
    # As the training flow calls it: the final-rewards state saved after the round before the
    # window (computed once, outside the timing). With the whole store as window: no state,
    # every game is replayed from round 0 inside the timing.
    state = None
    if first > 0:
        before = config.replace(first_round=first - 1, last_round=first - 1)
        state = final_stage(root, before, None)[2][first - 1]
    out = {
        "window_rounds": [first, last],
        "window_shards": len([1 for f in (root / "steps").glob("round*/shard-*.parquet")
                              if first <= int(f.parent.name[6:]) <= last]),
        "final_state_restored": state is not None,
    }
    batches = {}
    for threads in thread_options:  # None: DuckDB's default (one per core)
        label = "duckdb" if threads is None else "duckdb_1_thread"
        assemble_batch(root, config, state, threads=threads)  # warm-up: page cache, checks
        duck, duck_runs, duck_cpu, batch = timed(
            lambda threads=threads: assemble_batch(root, config, state, threads=threads),
            args.runs)
        batches[label] = batch
        out.update({
            f"{label}_seconds": round(duck, 4),
            f"{label}_runs": [round(t, 4) for t in duck_runs],
            f"{label}_cpu_seconds": round(duck_cpu, 4),
            f"{label}_phases": {k: round(v, 4) for k, v in batch.stats.timings.items()},
        })
    batch = batches["duckdb"]
    out["batch_size"] = batch.stats.size
    if "duckdb_1_thread" in batches:
        out["identical_across_thread_counts"] = (
            batch.rows.equals(batches["duckdb_1_thread"].rows)
            and torch.equal(batch.input_ids, batches["duckdb_1_thread"].input_ids))
    duck = out["duckdb_seconds"]
    if python_runs:
        py, py_runs, py_cpu, rows = timed(lambda: python_batch(root, config, state), python_runs)
        out.update(python_seconds=round(py, 3), python_runs=[round(t, 3) for t in py_runs],
                   python_cpu_seconds=round(py_cpu, 3), speedup=round(py / duck, 1),
                   same_rows_as_python=same_rows(batch, rows))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", type=Path, default=Path("/tmp/ub-bench-store"),
                        help="where the synthetic store is built and cached")
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--shards-per-round", type=int, default=5)
    parser.add_argument("--games-per-shard", type=int, default=500,
                        help="~8 decisions per game: 50 x 5 x 500 games = 1M decisions")
    parser.add_argument("--batch-size", type=int, default=384)
    parser.add_argument("--window", type=int, default=5,
                        help="rounds in the headline batch window (the latest ones)")
    parser.add_argument("--runs", type=int, default=7, help="timed DuckDB runs (median)")
    parser.add_argument("--python-runs", type=int, default=3,
                        help="timed Python-reference runs (median)")
    parser.add_argument("--full", action=argparse.BooleanOptionalAction, default=True,
                        help="also time a window covering the whole store")
    parser.add_argument("--scaling", default="1,2,10",
                        help="more window sizes (rounds) to time, DuckDB only; '' for none")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    info = build_store(args.store, args.rounds, args.shards_per_round, args.games_per_shard)
    headline = scenario(args.store, args.rounds, args.window, args, args.python_runs)
    report = {
        "store": {"path": str(args.store), "decisions": info["decisions"],
                  "shards": info["shards"], "rounds": args.rounds},
        "headline": headline,
        "targets": {"duckdb_seconds_max": 0.5, "speedup_min": 10,
                    "met": headline["duckdb_seconds"] <= 0.5 and headline.get("speedup", 0) >= 10},
        "machine": {"cpus": os.cpu_count(), "load_average_1m": round(os.getloadavg()[0], 2)},
    }
    scaling = [int(w) for w in args.scaling.split(",") if w.strip()]
    if scaling:
        report["scaling"] = {
            f"{w}_rounds": {k: v for k, v in scenario(args.store, args.rounds, w, args, 0, (None,))
                            .items() if k in ("window_shards", "duckdb_seconds", "duckdb_phases")}
            for w in scaling}
    if args.full:
        report["whole_store"] = scenario(args.store, args.rounds, None, args, 1)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
