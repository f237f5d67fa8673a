"""ub's component logs in Prefect's run logs, however the flow was started, and a
:class:`~ub.errors.UbError` in them as one line.

``ub train`` sets ``PREFECT_LOGGING_EXTRA_LOGGERS=ub`` before Prefect starts, but a deployment
run is started by a worker (``python -m prefect.engine``) that never saw that setting, so ub's
``ub.*`` records reached ``RUN/logs`` and not the flow run's logs. The flows attach Prefect's
API log handler to the ``ub`` logger themselves, for as long as they run.

A UbError is an expected failure that says what to do in its message (a config typo in a
deployment's overrides, say), yet Prefect logs every exception with its traceback, and the
one that ends a deployment run three times: the flow engine's "Encountered exception during
execution", then the same exception re-raised on its way out by ``run_flow`` ("Engine
execution exited with unexpected exception") and by ``python -m prefect.engine``'s signal
handler ("Execution of flow run ... exited with unexpected exception"): ~90 lines in the
worker's output for one line of news. :class:`UbErrorLines` makes the first of them the
error's message alone and drops the repeats; the flow run still ends Failed with it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from prefect.exceptions import MissingContextError
from prefect.logging.handlers import APILogHandler

from ub.errors import UbError


class RunLogHandler(APILogHandler):
    """Prefect's API log handler, quiet about records from outside any run (a background
    thread without Prefect's context): those stay in ``RUN/logs`` only, without a warning."""

    def handleError(self, record: logging.LogRecord) -> None:
        if isinstance(sys.exc_info()[1], MissingContextError):
            return
        super().handleError(record)


@contextmanager
def ub_logs_to_prefect() -> Iterator[None]:
    """Send the ``ub`` logger's records (INFO and up) to the current flow run's logs during
    the block, unless Prefect's extra-loggers setting does already (no duplicate lines)."""
    logger = logging.getLogger("ub")
    if any(isinstance(h, APILogHandler) for h in logger.handlers):
        yield
        return
    handler = RunLogHandler()
    handler.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


PREFECT_RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs", "prefect.engine")
"""The loggers Prefect logs a run's exceptions on (a filter sees only a logger's own records,
not its children's)."""


class UbErrorLines(logging.Filter):
    """A Prefect record carrying a UbError: the first becomes the error's message, with no
    traceback; later ones with the same exception (Prefect re-raising it) are dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, UbError):
            return True
        if getattr(error, "_ub_logged", False):
            return False
        error._ub_logged = True  # type: ignore[attr-defined]
        record.msg, record.args = "%s", (str(error),)
        record.exc_info = record.exc_text = None
        return True


def ub_errors_in_one_line() -> None:
    """Install :class:`UbErrorLines` on Prefect's run loggers (once per process: it stays,
    since Prefect's last re-raise is logged after the flow has returned)."""
    for name in PREFECT_RUN_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, UbErrorLines) for f in logger.filters):
            logger.addFilter(UbErrorLines())


# The flows import this module: a deployment run's process (``python -m prefect.engine``) loads
# the flow's module after Prefect configured its logging and before the flow runs.
ub_errors_in_one_line()
