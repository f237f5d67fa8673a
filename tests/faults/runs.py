"""Helpers of the reliability suite (also used by ``bench/faults.py``): a small training config,
``ub train`` as a child process, and every way two runs of the same seed must agree."""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow.parquet as pq
from warm import run_ub

# Two envs, two rounds, a lagged opponent next to mirror self-play (so rating and older
# adapters are exercised), evaluation of checkpoints 0 and 2; two shards a round (the Ray
# module's two engine workers play one each, and compare with this run in one process); each
# game branches once (a copy from one of the learner's positions: killed, resumed and on Ray,
# the copies must come out the same).
CONFIG = {
    "seed": 11,
    "rounds": 2,
    "model": {"base": "tiny"},
    "sampling": {"temperature": 1.0, "max_tokens": 12},
    "envs": [{"env_id": "TicTacToe-v0-train", "weight": 3}, {"env_id": "Nim-v0-train"}],
    "rollout": {"games_per_round": 12, "concurrency": 16, "shards": 2, "branch": {"k": 2}},
    "opponents": [{"mode": "mirror", "weight": 0.7}, {"mode": "random", "weight": 0.3}],
    "batch": {"batch_size": 48},
    "learner": {"learning_rate": 1e-3, "lora": {"rank": 8, "alpha": 16}},
    "eval": {"every": 2, "games": 8, "opponents": ["random"], "envs": ["TicTacToe-v0-train"]},
}

# Where the process can be cut: mid-rollout, mid-shard-write, between the two files of a shard,
# mid-update, mid-checkpoint-write, mid-rating, just before the commit.
KILL_POINTS = ("rollout.step", "env.step", "atomic.before-rename", "shard.between-files",
               "learn.mid-update", "learn.after-state", "checkpoint.before-rename",
               "rate.before-snapshot", "round.before-commit")


def plan_faults(census: dict[str, int], rng: random.Random, count: int) -> list[str]:
    """``count`` fault specs ``POINT:N`` with N within what one process reaches."""
    points = [p for p in KILL_POINTS if census.get(p)]
    return [f"{p}:{rng.randint(1, min(census[p], 4))}"
            for p in (rng.choice(points) for _ in range(count))]

# Wall-clock figures differ between any two runs; everything else must not.
TIMING_COLUMNS = {"seconds", "gen_seconds", "env_seconds"}


def train(config: Path, root: Path | str, api_url: str, *, name: str = "run",
          env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``ub train CONFIG --run NAME --root ROOT`` in a process of its own (forked warm, see
    tests/warm.py), sharing a Prefect API."""
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("UB_FAULT")}
    child_env.update({"PREFECT_API_URL": api_url, **(env or {})})
    return run_ub(["train", str(config), "--run", name, "--root", str(root), "--quiet"],
                  env=child_env)


def free_port() -> int:
    """A loopback TCP port nobody listens on (at the time of asking)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def ray_head(cpus: int = 2) -> Iterator[str]:
    """A real Ray cluster on loopback (``ray start --head``, ``cpus`` CPUs, no GPU); yields its
    address and stops it (removing its files) after."""
    ray = Path(sys.executable).parent / "ray"
    temp = Path(tempfile.mkdtemp(prefix="ubray-", dir="/tmp"))  # Ray's socket paths stay short
    port = free_port()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    start = subprocess.run(
        [str(ray), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
         f"--num-cpus={cpus}", "--num-gpus=0", "--include-dashboard=false",
         "--disable-usage-stats", f"--temp-dir={temp}"],
        env=env, capture_output=True, text=True, timeout=180)
    try:
        if start.returncode != 0:
            raise RuntimeError(f"ray start failed: {start.stderr[-3000:]}")
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([str(ray), "stop", "--force"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(temp, ignore_errors=True)


def table_rows(root: Path, table: str, pattern: str = "shard-*.parquet") -> list[dict]:
    rows = []
    for file in sorted((root / table).rglob(pattern)):
        data = pq.read_table(file)
        keep = [c for c in data.column_names if c not in TIMING_COLUMNS]
        rows += data.select(keep).to_pylist()
    return rows


def differences(run: Path, reference: Path) -> list[str]:
    """How the run at ``run`` differs from ``reference`` (same name, seed and config) in what
    a reader or a resume relies on; empty when it is whole and identical."""
    from ub.learner.checkpoint import read_adapter, read_checkpoint
    from ub.run.checks.doctor import examine
    from ub.run.folder.layout import RunPaths
    from ub.run.steps.rate import rebuild_ratings
    from ub.run.steps.rounds import Run, resolve_run_config

    found = []
    paths, ref = RunPaths(run), RunPaths(reference)
    if paths.committed_rounds() != ref.committed_rounds():
        return [f"committed rounds {paths.committed_rounds()} != {ref.committed_rounds()}"]
    found += [f"doctor: {f.line(run)}" for f in examine(run).findings]
    for table in ("games", "steps", "eval/games", "eval/steps"):
        # (only the run's own eval shard 0: a reference may have ad-hoc `ub eval` shards)
        pattern = "shard-0000.parquet" if table.startswith("eval") else "shard-*.parquet"
        if table_rows(run, table, pattern) != table_rows(reference, table, pattern):
            found.append(f"{table} rows differ")
    last = paths.committed_rounds()[-1]
    for round_ in range(last + 1):
        if (json.loads(paths.ratings(round_).read_text())
                != json.loads(ref.ratings(round_).read_text())):
            found.append(f"ratings after round {round_} differ")
    rebuilt = rebuild_ratings(Run(paths, resolve_run_config(paths, None)[0], "check"), last)
    if rebuilt.snapshot() != json.loads(paths.ratings(last).read_text()):
        found.append("ratings differ from a rebuild from the games")
    for update in range(last + 2):
        folder = paths.checkpoint(update)
        read_checkpoint(folder)
        read_adapter(folder)
        for name in sorted({p.name for p in folder.iterdir()} | {p.name for p in
                                                                ref.checkpoint(update).iterdir()}):
            mine, theirs = (f / name for f in (folder, ref.checkpoint(update)))
            if not (mine.is_file() and theirs.is_file()):
                found.append(f"{folder.name}/{name} is missing from one run")
            elif name in TIMED_FILES:
                if TIMED_FILES[name](mine) != TIMED_FILES[name](theirs):
                    found.append(f"{folder.name}/{name} differs beyond its timing fields")
            elif mine.read_bytes() != theirs.read_bytes():
                found.append(f"{folder.name}/{name} differs")
    return found


def _untimed_metrics(path: Path) -> dict:
    """A checkpoint's metrics.json without what measures time or memory (or names a folder)."""
    metrics = json.loads(path.read_text())
    for key in ("seconds", "tokens_per_second", "peak_rss_mb", "from_checkpoint"):
        metrics.pop(key, None)
    for key in ("seconds", "timings"):
        metrics.get("batch", {}).pop(key, None)
    return metrics


def _untimed_manifest(path: Path) -> dict:
    """A checkpoint manifest without metrics.json's hash (that file holds timings)."""
    manifest = json.loads(path.read_text())
    manifest["files"].pop("metrics.json", None)
    return manifest


# A checkpoint's files that hold timings: compared with those fields left out, the rest byte
# for byte.
TIMED_FILES = {"metrics.json": _untimed_metrics, "ub_checkpoint.json": _untimed_manifest}
