"""ub's component logs in Prefect's run logs, however the flow was started.

``ub train`` sets ``PREFECT_LOGGING_EXTRA_LOGGERS=ub`` before Prefect starts, but a deployment
run is started by a worker (``python -m prefect.engine``) that never saw that setting, so ub's
``ub.*`` records reached ``RUN/logs`` and not the flow run's logs. The flows attach Prefect's
API log handler to the ``ub`` logger themselves, for as long as they run.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from prefect.exceptions import MissingContextError
from prefect.logging.handlers import APILogHandler


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
