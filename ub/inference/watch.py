"""Watching vLLM's separate engine process: a death or a stall becomes an error, never a hang.

With ``VLLM_ENABLE_V1_MULTIPROCESSING=1`` (vLLM's default, and every GPU run's) the engine core
runs in a child process and this process waits for its answers on a queue (engine steps) or a
future (utility calls such as listing LoRA adapters). When that process dies, vLLM 0.32 marks
the client dead and stops its reader thread, but wakes neither: a step or call in flight waits
forever. :class:`EngineWatch` waits on the processes instead and, when one exits or a call has
had no answer for ``stall_seconds``, records why and calls ``wake`` with an
:class:`EngineDied` (the engine puts it where the waiter waits). The engine is then closed and
replaced (:class:`ub.run.processes.worker.Worker`); the shard it was playing is replayed
(:func:`ub.run.steps.play.play_shard`), with the same seeds, so nothing is lost or played twice.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from multiprocessing import connection
from typing import Any

from ub.errors import UbError

STALL_SECONDS = 300.0
"""How long one engine step or call may go unanswered before the engine is declared dead. A
step is milliseconds to seconds (vLLM compiles and captures CUDA graphs at its start, not in a
step), so five minutes without an answer means a process that is stuck, not slow."""


class EngineDied(UbError):
    """The engine's process died or stopped answering: close the engine and start another."""


class EngineWatch:
    """A daemon thread watching ``processes`` (objects with ``sentinel``, ``name`` and
    ``exitcode``, e.g. :class:`multiprocessing.Process`) and the calls made inside
    :meth:`busy`; see the module docstring."""

    def __init__(self, processes: Sequence[Any], wake: Callable[[EngineDied], None],
                 stall_seconds: float = STALL_SECONDS) -> None:
        self.dead: str | None = None
        """Why the engine is dead (one line), or ``None`` while it lives."""
        self._processes = list(processes)
        self._wake = wake
        self._stall = stall_seconds
        self._busy_since: float | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="ub-engine-watch", daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """Mark a call to the engine in flight: unanswered for ``stall_seconds``, it is woken
        with :class:`EngineDied`."""
        self._busy_since = time.monotonic()
        try:
            yield
        finally:
            self._busy_since = None

    def exited(self) -> str | None:
        """Why the engine is dead if one of its processes has exited by now (asked directly:
        vLLM's own monitor may notice before this watch's thread does), else ``None``."""
        ended = connection.wait([p.sentinel for p in self._processes], timeout=0)
        for process in self._processes:
            if process.sentinel in ended:  # (the sentinel says so whoever reaped it)
                process.join(timeout=1.0)
                return _exit_line(process)
        return None

    def stop(self) -> None:
        """Stop watching (the engine is being shut down on purpose)."""
        self._stopped.set()

    def _watch(self) -> None:
        by_sentinel = {p.sentinel: p for p in self._processes}
        while not self._stopped.is_set():
            # (a one-second tick: the stall check's resolution; waiting costs no CPU)
            ended = connection.wait(list(by_sentinel), timeout=1.0)
            if self._stopped.is_set():
                return
            if ended:
                process = by_sentinel[ended[0]]
                process.join(timeout=1.0)  # (sets its exit code)
                self._declare(_exit_line(process))
                return
            since = self._busy_since
            if since is not None and time.monotonic() - since > self._stall:
                self._declare(f"the vLLM engine process did not answer for {self._stall:g} s")
                return

    def _declare(self, reason: str) -> None:
        self.dead = reason
        with contextlib.suppress(Exception):  # (waking is best effort; `dead` is the record)
            self._wake(EngineDied(reason))


def _exit_line(process: Any) -> str:
    code = process.exitcode  # (None where another waiter reaped it first)
    return (f"the vLLM engine process {process.name} (pid {process.pid}) exited"
            + (f" with code {code}" if code is not None else ""))
