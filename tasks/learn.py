"""Learn: assemble round r's batch with DuckDB and update checkpoint r into r+1."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NONE

from ub.run.processes.cluster import on_learners, on_worker
from ub.run.processes.worker import process_worker
from ub.run.steps.learn import initial_checkpoint, learn_round
from ub.run.steps.rounds import Run


@task(name="start-checkpoint", cache_policy=NONE)
def start_checkpoint(run: Run) -> str:
    return on_worker(run, "learner", 0, initial_checkpoint, run, worker=process_worker())


# No retries: a failed update (NaN loss, a bad batch) fails the same way again; the previous
# checkpoint stays the latest and the error says what to change.
@task(name="learn", cache_policy=NONE, task_run_name="learn r{round_}")
def learn(run: Run, round_: int) -> dict[str, Any]:
    return on_learners(run, learn_round, run, round_, worker=process_worker())
