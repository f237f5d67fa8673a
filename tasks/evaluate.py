"""Evaluate: a checkpoint against the fixed eval opponents, seats balanced."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NONE

from ub.run.processes.cluster import on_worker
from ub.run.processes.worker import process_worker
from ub.run.steps.evaluate import evaluate_checkpoint
from ub.run.steps.rounds import Run


@task(name="evaluate", retries=1, retry_delay_seconds=2, cache_policy=NONE,
      task_run_name="evaluate ckpt {update}")
def evaluate(run: Run, update: int) -> dict[str, Any]:
    return on_worker(run, "rollout", 0, evaluate_checkpoint, run, update, worker=process_worker())
