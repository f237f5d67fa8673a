"""Ctrl-C and SIGTERM in ``ub train``: the run stops at once, as one interrupt, however the
signal met Prefect.

The signal raises :class:`KeyboardInterrupt` wherever the main thread is (SIGTERM, a
scheduler's stop: SLURM, Kubernetes, systemd, raises Prefect's ``TerminationSignal`` while
Prefect's flow engine holds it): mostly in a step's own code, whose task Prefect then records
as crashed, but now and then inside Prefect's own machinery, which may turn it into another
error (a task run that was being created raised ``ValueError: Task run is not set`` from its
crash handling). So the handler also notes that a stop was asked for, and the flow's body and
``ub train`` turn whatever ends the run after a stop (:func:`stopped`) back into the interrupt:
the flow run is recorded as crashed by an interrupt, and ``ub train`` prints its one line.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

_asked: list[str] = []  # the signals received while :func:`stop_on_signals` held them


def stopped(error: BaseException | None = None) -> bool:
    """Whether Ctrl-C or SIGTERM has asked this process to stop, or ``error`` arose from one."""
    from prefect.exceptions import TerminationSignal

    while error is not None:
        if isinstance(error, KeyboardInterrupt | TerminationSignal):
            return True
        error = error.__context__
    return bool(_asked)


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """For the block: SIGINT and SIGTERM raise :class:`KeyboardInterrupt` and are noted (a
    signal the process was started ignoring, as a shell starts a background job, stays so)."""

    def interrupt(signum: int, frame: object) -> None:
        _asked.append(signal.Signals(signum).name)
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)
                if signal.getsignal(sig) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
