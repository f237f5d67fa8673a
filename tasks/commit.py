"""Commit: write the round manifest, last: the round's commit point (in its store too)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NONE

from ub.run.steps.rounds import Run, commit_round


@task(name="commit", cache_policy=NONE, task_run_name="commit r{round_}")
def commit(run: Run, round_: int, manifest: dict[str, Any]) -> Path:
    return commit_round(run, round_, manifest)
