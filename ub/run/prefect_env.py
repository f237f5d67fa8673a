"""Prefect settings for offline use, set before Prefect is imported.

Only defaults: a variable the user set wins. With no ``PREFECT_API_URL`` a flow starts a
temporary local server whose SQLite database lives in ``PREFECT_HOME``; ub puts that home next to
the runs (``RUNS_ROOT/.prefect``) instead of ``~/.prefect``, turns analytics off (they need the
network), and gives the server time to start on a busy 2-core machine.
"""

from __future__ import annotations

import os
from pathlib import Path


def configure_prefect(home: Path, *, console_level: str = "CRITICAL") -> None:
    """Set Prefect's environment defaults (call before ``import prefect``)."""
    home = home.expanduser().absolute()
    defaults = {
        "PREFECT_HOME": str(home),
        "PREFECT_MEMO_STORE_PATH": str(home / "memo_store.toml"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
        # ub prints its own progress and a one-line error for expected failures; Prefect's
        # task-run chatter and failure tracebacks stay in its UI and database (an unexpected
        # exception still prints its traceback when it reaches the command).
        "PREFECT_LOGGING_LEVEL": console_level,
        # ub's component loggers (ub.run.logs) also go to Prefect's run logs, not the console.
        "PREFECT_LOGGING_EXTRA_LOGGERS": "ub",
        "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": console_level,
    }
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
