"""Report: the run's HTML page (``ub report``), linked from the Prefect UI."""

from __future__ import annotations

import logging

from prefect import task
from prefect.artifacts import create_link_artifact
from prefect.cache_policies import NONE

from ub.errors import UbError
from ub.run.steps.rounds import Run
from ub.tasks.track import artifact_key

log = logging.getLogger("ub.flow")


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
