"""Rollout: play one shard of a round's games with the checkpoints the pool chose."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NONE

from ub.run.processes.cluster import on_worker, rollout_worker
from ub.run.processes.worker import process_worker
from ub.run.steps.plan import PlannedGame
from ub.run.steps.play import ShardResult, rollout_shard
from ub.run.steps.rounds import Run


# A retry helps when the engine failed mid-shard: the shard was not committed, and the same
# seeds replay the same games (an engine whose process died is replaced and the shard replayed
# within the call already: ub.run.steps.play.play_shard).
@task(name="rollout", retries=1, retry_delay_seconds=2, cache_policy=NONE,
      task_run_name="rollout r{round_}-s{shard}")
def rollout(run: Run, round_: int, shard: int, games: list[PlannedGame],
            shards: int | None = None) -> ShardResult:
    return on_worker(run, "rollout", rollout_worker(run, shard), rollout_shard, run, round_,
                     shard, games, shards, worker=process_worker())
