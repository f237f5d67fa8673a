"""Ctrl-C and SIGTERM stop ``ub train`` wherever they land (flows/stopping.py). The whole run's
stop is checked with real processes in test_prefect_outage; here, the places where Python drops
an exception: a signal landing in a garbage collector's callback was lost, and the run went on
for its remaining rounds (issue 69)."""

from __future__ import annotations

import gc
import os
import signal
import sys
import time

import pytest
from prefect.exceptions import TerminationSignal
from prefect.utilities.engine import _prefect_sigterm_handler

from ub.flows import stopping


@pytest.fixture(autouse=True)
def no_stop_yet(monkeypatch):
    monkeypatch.setattr(stopping, "_asked", [])


@pytest.fixture(autouse=True)
def signals_as_a_terminal_gives_them():
    """SIGINT and SIGTERM at their defaults, as `ub train` starts with them: a pytest-xdist
    worker ignores SIGINT, and stop_on_signals leaves an ignored signal ignored."""
    previous = {sig: signal.signal(sig, handler) for sig, handler in (
        (signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL))}
    yield
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def _lands_in_a_collection(sig: signal.Signals):
    """A gc callback that sends ``sig`` and runs on, so the handler raises inside it (dropped)."""
    sent: list[bool] = []

    def callback(phase: str, info: dict) -> None:
        if phase == "start" and not sent:
            sent.append(True)
            os.kill(os.getpid(), sig)
            for _ in range(100_000):  # the handler runs here, at a loop's back edge
                pass

    gc.callbacks.append(callback)
    return callback


def _collect_then_wait(seconds: float = 5.0) -> None:
    gc.collect()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_dropped_in_a_garbage_collection_still_stops_within_a_second(sig, capfd):
    callback = _lands_in_a_collection(sig)
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt), stopping.stop_on_signals():
            _collect_then_wait()
    finally:
        gc.callbacks.remove(callback)
    assert time.monotonic() - started < 1.0
    assert stopping.stopped()
    assert "Exception ignored" not in capfd.readouterr().err  # one stop, no noise


def test_prefects_sigterm_dropped_in_a_collection_is_its_termination_signal_again(capfd):
    """While Prefect's flow engine runs, SIGTERM takes Prefect's handler: the CI failure of
    test_prefect_outage (exit 0, the run played on after `Exception ignored in: GcClock`)."""
    callback = _lands_in_a_collection(signal.SIGTERM)
    try:
        with stopping.stop_on_signals():
            previous = signal.signal(signal.SIGTERM, _prefect_sigterm_handler)
            try:
                with pytest.raises(TerminationSignal):
                    _collect_then_wait()
            finally:
                signal.signal(signal.SIGTERM, previous)
    finally:
        gc.callbacks.remove(callback)
    assert stopping.stopped()
    assert "Exception ignored" not in capfd.readouterr().err


def test_other_unraisable_errors_are_reported_as_before(monkeypatch):
    class Finalized:
        def __del__(self) -> None:
            raise RuntimeError("a finalizer's own error")

    reported: list[BaseException] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda dropped: reported.append(dropped.exc_value))
    with stopping.stop_on_signals():
        Finalized()
    assert [str(error) for error in reported] == ["a finalizer's own error"]
    assert not stopping.stopped()
