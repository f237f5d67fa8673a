"""Benchmarks: a checkpoint on the run's reasoning benchmarks (``eval.benchmarks``)."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NONE

from ub.run.processes.cluster import on_worker
from ub.run.processes.worker import process_worker
from ub.run.steps.benchmarks import score_round_benchmarks
from ub.run.steps.rounds import Run


@task(name="benchmarks", retries=1, retry_delay_seconds=2, cache_policy=NONE,
      task_run_name="benchmarks ckpt {update}")
def benchmarks(run: Run, update: int) -> dict[str, Any]:
    # On the engine the evaluation games use (a rollout worker's on a cluster): one engine.
    return on_worker(run, "rollout", 0, score_round_benchmarks, run, update,
                     worker=process_worker())
