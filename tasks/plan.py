"""Plan: the pool picks each game of a round (env, seats, opponents), split into shards."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NONE

from ub.run.steps.plan import PlannedGame, plan_round
from ub.run.steps.rounds import Run


@task(name="plan", cache_policy=NONE, task_run_name="plan r{round_}")
def plan(run: Run, round_: int) -> list[list[PlannedGame]]:
    return plan_round(run, round_)
