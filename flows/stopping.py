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

Python drops an exception raised where nothing can take it: a garbage collector's callback (the
round's :class:`~ub.run.steps.manifest.GcClock`), a ``__del__``, a weakref's callback. A signal
landing there would be lost (the run went on for its remaining rounds), so the block's
:data:`sys.unraisablehook` sends a dropped interrupt's signal again, a moment later, until it
lands where it can stop the run.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

_asked: list[str] = []  # the signals received while :func:`stop_on_signals` held them
_holding: list[bool] = []  # whether :func:`stop_on_signals` holds them now


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
    unraisable = sys.unraisablehook
    sys.unraisablehook = _resend_dropped_stops(unraisable)
    _holding.append(True)
    try:
        yield
    finally:
        _holding.pop()
        sys.unraisablehook = unraisable
        for sig, handler in previous.items():
            signal.signal(sig, handler)


RESEND_AFTER_S = 0.05  # out of the collection (or finalizer) that dropped it, almost surely


def _resend_dropped_stops(otherwise: Callable[[Any], object]) -> Callable[[Any], None]:
    """An unraisable hook: a stop Python dropped (a :class:`KeyboardInterrupt`, or Prefect's
    ``TerminationSignal`` from its SIGTERM handler) is sent again from a thread, so the main
    thread's handler raises it anew at its next step; anything else goes to ``otherwise``."""
    from prefect.exceptions import TerminationSignal

    def hook(dropped: Any) -> None:  # sys.UnraisableHookArgs
        error = dropped.exc_value
        if isinstance(error, TerminationSignal):  # Prefect's handler does not note it
            sig = signal.Signals(error.signal)
            _asked.append(sig.name)
        elif isinstance(error, KeyboardInterrupt):
            sig = signal.Signals[_asked[-1]] if _asked else signal.SIGINT
        else:
            otherwise(dropped)
            return
        threading.Timer(RESEND_AFTER_S, _resend, (sig,)).start()

    return hook


def _resend(sig: signal.Signals) -> None:
    if _holding:  # not once the block has given the signals back (SIGTERM would kill)
        os.kill(os.getpid(), sig)
