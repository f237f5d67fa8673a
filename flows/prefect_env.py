"""Prefect settings for offline use, set before Prefect is imported.

Only defaults: a variable the user set wins. With no ``PREFECT_API_URL`` a flow starts a
temporary local server whose SQLite database lives in ``PREFECT_HOME``; ub puts that home next to
the runs (``RUNS_ROOT/.prefect``) instead of ``~/.prefect``, turns analytics off, the server's and
the client's (they need the network, and the client's printed a notice), and gives the server
time to start on a busy 2-core machine.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ub.errors import UbError


def configure_prefect(home: Path, *, console_level: str = "CRITICAL") -> None:
    """Set Prefect's environment defaults (call before ``import prefect``)."""
    home = home.expanduser().absolute()
    defaults = {
        "PREFECT_HOME": str(home),
        "PREFECT_MEMO_STORE_PATH": str(home / "memo_store.toml"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        # The client's telemetry is another switch: `import prefect` on a terminal, with a new
        # home (ub's is), printed a "collects anonymous usage data" notice and queued usage
        # events. Prefect reads DO_NOT_TRACK at import, so it is set here, not with vLLM's
        # variables (which come later); the server process ub starts inherits it.
        "DO_NOT_TRACK": "1",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
        # ub prints its own progress and a one-line error for expected failures; Prefect's
        # task-run chatter and failure tracebacks stay in its UI and database (an unexpected
        # exception still prints its traceback when it reaches the command).
        "PREFECT_LOGGING_LEVEL": console_level,
        # ub's component loggers (ub.run.folder.logs) also go to Prefect's run logs, not the
        # console.
        "PREFECT_LOGGING_EXTRA_LOGGERS": "ub",
        "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": console_level,
    }
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    # Prefect creates its home at import without parents: under a --root that does not exist
    # yet it warned, and its temporary server could not start (it only timed out).
    home = Path(os.environ["PREFECT_HOME"]).expanduser()
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UbError(f"cannot create the Prefect home {home}: {exc.strerror or exc}") from None


_tied_server_url: str | None = None


def current_api_url() -> str | None:
    """The Prefect API this process reports to: ``PREFECT_API_URL``, else the temporary server
    :func:`start_tied_server` started (``None``: neither, Prefect starts its own on demand)."""
    from prefect.settings import PREFECT_API_URL

    return str(PREFECT_API_URL.value() or "") or _tied_server_url


def start_tied_server() -> str | None:
    """Start Prefect's temporary API server now, from this (main) thread, so that it dies with
    this process; returns its URL (``None`` when ``PREFECT_API_URL`` names a server already).
    Call it after :func:`configure_prefect` (which creates the server's home).

    Prefect starts the server as a plain child process and stops it at exit, which a SIGKILL
    (the OOM killer) skips: the server was re-parented to pid 1 and kept running, and the next
    run started another. Here the child asks the kernel (``PR_SET_PDEATHSIG``) for SIGTERM the
    moment its parent dies, in a process group of its own (out of reach of a terminal's Ctrl-C,
    which ``ub train`` answers itself). Prefect's clients then find this server running (the
    temporary server is one instance per process) and use it. Linux only; elsewhere Prefect's
    own start.
    """
    if os.environ.get("PREFECT_API_URL"):
        return None
    if not sys.platform.startswith("linux"):
        return None
    import ctypes
    import signal
    import subprocess

    from prefect.server.api import server as prefect_server

    libc = ctypes.CDLL(None, use_errno=True)  # loaded before fork: the child only calls it
    parent = os.getpid()

    def tie_to_parent() -> None:  # runs in the child between fork and exec
        # A terminal's Ctrl-C goes to its whole foreground process group: the server, in a
        # group of its own, stays up while the interrupted run tells it how its flow run ended
        # (killed with it, the run's client retried a dead server for a minute, in tracebacks).
        os.setpgrp()
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the line above took effect
            os._exit(1)

    class _Subprocess:
        """``subprocess`` as Prefect's server module sees it, with the tie added to Popen."""

        def __getattr__(self, name: str) -> object:
            return getattr(subprocess, name)

        @staticmethod
        def Popen(*args: object, **kwargs: object) -> subprocess.Popen:
            return subprocess.Popen(*args, preexec_fn=tie_to_parent, **kwargs)  # type: ignore[call-overload]

    class _TiedServer(prefect_server.SubprocessASGIServer):
        def _run_uvicorn_command(self) -> subprocess.Popen:
            module_subprocess = prefect_server.subprocess
            prefect_server.subprocess = _Subprocess()
            try:
                return super()._run_uvicorn_command()
            finally:
                prefect_server.subprocess = module_subprocess

    global _tied_server_url
    server = _TiedServer()  # registered as the process's temporary server (port None)
    if isinstance(server, _TiedServer):  # (else Prefect's own started first: leave it be)
        try:
            server.start()
        except RuntimeError as exc:
            raise UbError(f"the temporary Prefect server did not start ({exc}); set "
                          "PREFECT_API_URL to a running `prefect server start` to use that "
                          "instead") from None
    _tied_server_url = server.api_url
    return server.api_url


_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
