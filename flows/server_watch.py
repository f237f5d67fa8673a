"""The Prefect server a run reports to: refused at the start when it does not answer, watched
while the run goes on.

A run's data never depends on the server (every round commits to the run folder, and every write
is atomic), but its Prefect client does: with the server gone, each API call retries for about a
minute before it fails the flow, and Prefect's background threads print a screen of errors
per event meanwhile. So ``ub train`` checks ``PREFECT_API_URL`` before it writes anything
(:func:`require_server`), and the ``selfplay`` flow watches the server while it runs
(:class:`ServerWatch`): an outage shorter than the grace (``UB_PREFECT_GRACE_S``, 30 s) is
ridden out quietly, the Prefect client's retries carry the run over it; a longer one ends the
process with one line that names the server and the command that resumes the run. It ends it as
a SIGKILL would (every write survives one: the round in progress is played again on resume),
since any orderly exit goes through Prefect's API calls and their minute of retries.

A server that takes the connection but does not answer in time is busy, not gone: on two cores
beside CPU-bound runs a Prefect server was seen silent for over 30 s, and the watch stopped two
healthy runs of a sweep at once. Such silence gets :data:`BUSY_S` (5 min) before the run stops;
a refused, reset or unreachable connection gets the grace.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import NamedTuple

from ub.errors import UbError

log = logging.getLogger("ub.flow")

GRACE_ENV = "UB_PREFECT_GRACE_S"
DEFAULT_GRACE_S = 30.0
POLL_S = 5.0  # between health checks
ANSWER_S = 10.0  # how long a health check waits for an answer
BUSY_S = 300.0
"""How long a server that takes the connection but does not answer may stay so before the run
stops (at least the grace): busy beside CPU-bound processes, or hung. The Prefect client's own
calls wait for it meanwhile (their timeout is a minute, then retried)."""
EXIT_CODE = 2  # ub's code for an expected failure with its one line (ub.cli.parser.run)


class Silence(NamedTuple):
    """Why a health check got no answer: ``problem``, and whether the server took the
    connection and let the check time out (``busy``) rather than refusing or dropping it."""

    problem: str
    busy: bool


def check_server(api_url: str, timeout: float = ANSWER_S) -> Silence | None:
    """``None`` when the Prefect API at ``api_url`` answers its health check, else why not.

    Any answer below 500 counts (a hosted API may want its key even there: it is up); a 5xx is
    what a proxy in front of a dead server says. urllib raises a connection's failure (refused,
    unreachable, a connect that timed out) as ``URLError``, and a read that timed out after the
    connection was taken as a bare ``TimeoutError``: the server's process is there, busy."""
    url = f"{api_url.rstrip('/')}/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout):
            return None
    except urllib.error.HTTPError as exc:
        return None if exc.code < 500 else Silence(f"HTTP {exc.code} from {url}", busy=False)
    except urllib.error.URLError as exc:
        reason = exc.reason
        return Silence(str(getattr(reason, "strerror", None) or reason), busy=False)
    except TimeoutError:
        return Silence(f"no answer in {timeout:g} s", busy=True)
    except (OSError, ValueError) as exc:  # a reset connection, a malformed URL
        return Silence(str(exc) or type(exc).__name__, busy=False)


def require_server(attempts: int = 2, wait_s: float = 2.0) -> None:
    """Refuse, in one line, a ``PREFECT_API_URL`` that nothing answers at (a server that is
    still starting gets ``attempts`` tries, ``wait_s`` apart; a busy one is there, and the
    run's :class:`ServerWatch` waits for it). Without the variable ub starts a temporary server
    of its own, and there is nothing to check."""
    api_url = os.environ.get("PREFECT_API_URL")
    if not api_url:
        return
    problem = ""
    for attempt in range(attempts):
        silence = check_server(api_url)
        if silence is None or silence.busy:
            return
        problem = silence.problem
        if attempt + 1 < attempts:
            time.sleep(wait_s)
    raise UbError(f"PREFECT_API_URL is {api_url}, and no Prefect server answers there "
                  f"({problem}): start that server (`prefect server start`), or unset "
                  "PREFECT_API_URL to let ub start a temporary server of its own for the run")


def grace_seconds() -> float:
    """How long the server may stay silent before the run stops (``UB_PREFECT_GRACE_S``)."""
    raw = os.environ.get(GRACE_ENV)
    if raw is None:
        return DEFAULT_GRACE_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise UbError(f"{GRACE_ENV}={raw!r}: give the seconds the Prefect server may stay "
                      f"silent before the run stops, a number above 0 (default "
                      f"{DEFAULT_GRACE_S:g})")
    return value


class ServerWatch:
    """Checks the server every ``poll_s`` seconds from a daemon thread, each check waiting
    ``answer_s`` for its answer; once the server has not answered for ``grace_s`` (``busy_s``,
    at least the grace, while its last check found it busy: :class:`Silence`), calls
    ``on_lost(seconds_silent, problem, stderr)`` (once; ``stderr`` is a file descriptor of the
    terminal's stderr as it was when the watch began) and stops.

    While the server is silent, Prefect's own reports of the failed calls are held back (its
    internal logger, and the "--- Error logging to API ---" lines that the standard library's
    ``logging.raiseExceptions`` lets through); they come back when it answers again.
    """

    def __init__(self, api_url: str, grace_s: float, on_lost: Callable[[float, str, int], None],
                 poll_s: float = POLL_S, answer_s: float = ANSWER_S,
                 busy_s: float = BUSY_S) -> None:
        self.api_url, self.grace_s, self.poll_s, self.on_lost = api_url, grace_s, poll_s, on_lost
        self.answer_s, self.busy_s = answer_s, max(busy_s, grace_s)
        self._stopped = threading.Event()
        # The terminal's stderr, kept now: fd 2 may be held elsewhere when the line is due
        # (ub.inference.noise holds it while an engine starts).
        self._stderr = os.dup(2)
        # In the flow run's context (made here, in the flow), so that what it logs reaches
        # the flow run's logs as the flow's own lines do.
        self._thread = threading.Thread(target=contextvars.copy_context().run,
                                        args=(self._watch,), name="ub-prefect-watch",
                                        daemon=True)

    def __enter__(self) -> ServerWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopped.set()  # (not joined: a health check in flight may take ANSWER_S)

    def _watch(self) -> None:
        quiet = _QuietPrefect()
        try:
            self._check_until_lost(quiet)
        finally:
            if quiet.on:
                quiet.off()
            os.close(self._stderr)

    def _check_until_lost(self, quiet: _QuietPrefect) -> None:
        answered = time.monotonic()
        while not self._stopped.wait(self.poll_s):
            silence = check_server(self.api_url, timeout=self.answer_s)
            now = time.monotonic()
            if silence is None:
                if quiet.on:
                    log.warning("the Prefect server at %s answers again after %.0f s",
                                self.api_url, now - answered)
                    quiet.off()
                answered = now
                continue
            limit = self.busy_s if silence.busy else self.grace_s
            if not quiet.on:
                log.warning("the Prefect server at %s does not answer (%s); the run stops if it "
                            "stays silent for %.0f s", self.api_url, silence.problem, limit)
                quiet.on_()
            if now - answered >= limit and not self._stopped.is_set():
                self.on_lost(now - answered, silence.problem, self._stderr)
                return


class _QuietPrefect(logging.Filter):
    """Prefect's error output about calls to a server that is gone, switched off and on: a
    filter on its internal logger's handlers, and the standard library's switch for the lines
    a failing handler prints."""

    def __init__(self) -> None:
        super().__init__()
        self.on = False
        self._raise = logging.raiseExceptions
        self._handlers: list[logging.Handler] = []

    def filter(self, record: logging.LogRecord) -> bool:
        return False

    def on_(self) -> None:
        self._handlers = list(logging.getLogger("prefect._internal").handlers)
        for handler in self._handlers:
            handler.addFilter(self)
        self._raise, logging.raiseExceptions = logging.raiseExceptions, False
        self.on = True

    def off(self) -> None:
        for handler in self._handlers:
            handler.removeFilter(self)
        logging.raiseExceptions = self._raise
        self.on = False


def stop_process(line: str, stderr: int = 2) -> None:
    """End this process now with ``line`` on ``stderr`` (a file descriptor) and in the run's
    log: as a SIGKILL would, skipping Prefect's exit calls to a server that is gone. The log
    handlers are flushed first; the processes ub started die with it (each is tied to this
    one)."""
    log.error("%s", line)
    for handler in logging.getLogger().handlers + logging.getLogger("ub").handlers:
        with contextlib.suppress(Exception):  # nothing may keep the process from ending
            handler.flush()
    try:
        sys.stdout.flush()
        data = f"ub: error: {line}\n".encode()
        while data:
            data = data[os.write(stderr, data):]
    finally:
        os._exit(EXIT_CODE)
