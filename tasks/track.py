"""Track: the round's metrics to Parquet (and W&B), and Prefect artifacts for the UI."""

from __future__ import annotations

import re
from typing import Any

from prefect import task
from prefect.artifacts import (
    create_link_artifact,
    create_markdown_artifact,
    create_table_artifact,
)
from prefect.cache_policies import NONE

from ub.run.progress import round_summary_markdown
from ub.run.rounds import Run
from ub.run.tracking import log_wandb, round_metrics, write_metrics


def _key(run: Run, what: str) -> str:
    # Artifact keys allow lowercase letters, digits and dashes only.
    return re.sub(r"[^a-z0-9-]+", "-", f"ub-{run.name}-{what}".lower())


@task(name="track", cache_policy=NONE, task_run_name="track r{round_}")
def track(run: Run, round_: int, manifest: dict[str, Any]) -> str:
    metrics = round_metrics(run, round_, manifest, manifest["leaderboard"])
    path = write_metrics(run, round_, metrics)
    log_wandb(run, round_, metrics)
    create_table_artifact(
        key=_key(run, "leaderboard"), table=[
            {k: m[k] for k in ("name", "mu", "sigma", "conservative", "games", "wins", "draws",
                               "losses")} for m in manifest["leaderboard"]],
        description=f"TrueSkill ladder of {run.name} after round {round_}")
    create_markdown_artifact(key=_key(run, "round"),
                             markdown=round_summary_markdown(run, round_, manifest),
                             description=f"{run.name}: round {round_}")
    report = run.paths.root / "report" / "report.html"
    create_link_artifact(key=_key(run, "report"), link=report.as_uri(),
                         link_text=f"report of {run.name} (make it with `ub report {run.name}`)")
    return str(path)
