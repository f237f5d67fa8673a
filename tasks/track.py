"""Track: the round's metrics to Parquet (and W&B), and its Prefect artifacts for the UI."""

from __future__ import annotations

import re
from typing import Any

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NONE

from ub.run.folder.layout import round_label
from ub.run.steps.progress import round_summary_markdown
from ub.run.steps.rounds import Run
from ub.run.steps.tracking import log_wandb, round_metrics, write_metrics


def artifact_key(run: Run, what: str) -> str:
    # Artifact keys allow lowercase letters, digits and dashes only.
    return re.sub(r"[^a-z0-9-]+", "-", f"ub-{run.name}-{what}".lower())


def round_descriptions(run: Run, round_: int) -> dict[str, str]:
    """The descriptions of round ``round_``'s artifacts. Rounds count from 1 wherever a person
    reads them (the progress lines, the markdown summary's title), from 0 in files and keys."""
    shown = f"{round_label(round_)} of {run.config.rounds}"
    return {"leaderboard": f"TrueSkill ladder of {run.name} after {shown}",
            "round": f"{run.name}: {shown}"}


@task(name="track", cache_policy=NONE, task_run_name="track r{round_}")
def track(run: Run, round_: int, manifest: dict[str, Any]) -> str:
    metrics = round_metrics(run, round_, manifest, manifest["leaderboard"])
    path = write_metrics(run, round_, metrics)
    log_wandb(run, round_, metrics, manifest.get("evals", {}), manifest.get("benchmarks", {}),
              manifest.get("exploitability", {}))
    descriptions = round_descriptions(run, round_)
    create_table_artifact(
        key=artifact_key(run, "leaderboard"), table=[
            {k: m[k] for k in ("name", "mu", "sigma", "conservative", "games", "wins", "draws",
                               "losses")} for m in manifest["leaderboard"]],
        description=descriptions["leaderboard"])
    create_markdown_artifact(key=artifact_key(run, "round"),
                             markdown=round_summary_markdown(run, round_, manifest),
                             description=descriptions["round"])
    return str(path)
