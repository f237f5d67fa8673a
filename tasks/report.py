"""Report: the run's HTML page (``ub report``), its head shown in the Prefect UI, its figures in
W&B."""

from __future__ import annotations

import logging

from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NONE

from ub.errors import UbError
from ub.run.steps.rounds import Run
from ub.run.steps.tracking import log_wandb_figures
from ub.tasks.track import artifact_key

log = logging.getLogger("ub.flow")


@task(name="report", cache_policy=NONE)
def report(run: Run, rounds_committed: int) -> str | None:
    """Write the run's HTML report (``ub report``) once per flow run that committed rounds, or
    when the page is missing; show its head (numbers and the main figures, inline) as a
    Markdown artifact, and log its figures to W&B. Returns the page's path.

    A report that cannot be written (an unusual run, a plotting failure) is a warning: the
    run's data is committed and ``ub report`` can retry; no artifact is made.
    """
    from ub.report.page import artifact_markdown, build_report

    page = run.paths.root / "report" / "report.html"
    if not rounds_committed and page.exists():
        return str(page)
    try:
        written = build_report(run.paths.root, page.parent)
    except UbError as exc:
        log.warning("report of %s not written (%s)", run.name, exc)
        return None
    except Exception:  # a plotting bug must not fail a run whose rounds are committed
        log.warning("report of %s not written; retry with `%s`", run.name,
                    run.paths.command("report"), exc_info=True)
        return None
    create_markdown_artifact(key=artifact_key(run, "report"), markdown=artifact_markdown(written),
                             description=f"{run.name}: the report's numbers and main figures "
                             "(every figure: report.html, as `ub report` makes it)")
    log_wandb_figures(run, {f.name: f.path for f in written.figures})
    return str(written.page)
