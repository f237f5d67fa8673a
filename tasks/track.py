"""Track: the round's metrics to Parquet (and W&B), and Prefect artifacts for the UI."""

from __future__ import annotations

import logging
import re
from typing import Any

from prefect import task
from prefect.artifacts import (
    create_link_artifact,
    create_markdown_artifact,
    create_table_artifact,
)
from prefect.cache_policies import NONE

from ub.errors import UbError
from ub.run.progress import round_summary_markdown
from ub.run.rounds import Run
from ub.run.tracking import log_wandb, round_metrics, write_metrics

log = logging.getLogger("ub.flow")


def artifact_key(run: Run, what: str) -> str:
    # Artifact keys allow lowercase letters, digits and dashes only.
    return re.sub(r"[^a-z0-9-]+", "-", f"ub-{run.name}-{what}".lower())


def round_descriptions(run: Run, round_: int) -> dict[str, str]:
    """The descriptions of round ``round_``'s artifacts. Rounds count from 1 wherever a person
    reads them (the progress lines, the markdown summary's title), from 0 in files and keys."""
    shown = f"round {round_ + 1} of {run.config.rounds}"
    return {"leaderboard": f"TrueSkill ladder of {run.name} after {shown}",
            "round": f"{run.name}: {shown}"}


@task(name="track", cache_policy=NONE, task_run_name="track r{round_}")
def track(run: Run, round_: int, manifest: dict[str, Any]) -> str:
    metrics = round_metrics(run, round_, manifest, manifest["leaderboard"])
    path = write_metrics(run, round_, metrics)
    log_wandb(run, round_, metrics, manifest.get("evals", {}))
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


@task(name="report", cache_policy=NONE)
def report(run: Run, rounds_committed: int) -> str | None:
    """Write the run's HTML report (``ub report``) and link it from the UI: once per flow run
    that committed rounds, or when the page is missing. Returns the page's path.

    A report that cannot be written (an unusual run, a plotting failure) is a warning: the
    run's data is committed and ``ub report NAME`` can retry; no link to a missing page is made.
    """
    from ub.report import write_report

    page = run.paths.root / "report" / "report.html"
    if rounds_committed or not page.exists():
        try:
            page = write_report(run.paths.root, page.parent)
        except UbError as exc:
            log.warning("report of %s not written (%s)", run.name, exc)
            return None
        except Exception:  # a plotting bug must not fail a run whose rounds are committed
            log.warning("report of %s not written; retry with `ub report %s`", run.name,
                        run.name, exc_info=True)
            return None
    create_link_artifact(key=artifact_key(run, "report"), link=page.as_uri(),
                         link_text=f"report of {run.name} (report.html)",
                         description=f"{run.name}: plots and tables, as `ub report` makes them")
    return str(page)
