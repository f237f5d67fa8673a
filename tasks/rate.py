"""Rate: the TrueSkill ratings after a round, from the previous snapshot and the round's games."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NONE

from ub.run.steps.rate import rate_round
from ub.run.steps.rounds import Run


@task(name="rate", cache_policy=NONE, task_run_name="rate r{round_}")
def rate(run: Run, round_: int, evaluated: list[int]) -> list[dict[str, Any]]:
    return rate_round(run, round_, evaluated)
