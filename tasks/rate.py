"""Plan, rate and commit: the pool's side of a round."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NONE

from ub.run.rounds import PlannedGame, Run, commit_round, plan_round, rate_round


@task(name="plan", cache_policy=NONE, task_run_name="plan r{round_}")
def plan(run: Run, round_: int) -> list[list[PlannedGame]]:
    return plan_round(run, round_)


@task(name="rate", cache_policy=NONE, task_run_name="rate r{round_}")
def rate(run: Run, round_: int, evaluated: list[int]) -> list[dict[str, Any]]:
    return rate_round(run, round_, evaluated)


@task(name="commit", cache_policy=NONE, task_run_name="commit r{round_}")
def commit(run: Run, round_: int, manifest: dict[str, Any]) -> Path:
    return commit_round(run, round_, manifest)
