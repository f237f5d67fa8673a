"""The watch on vLLM's separate engine process (:mod:`ub.inference.watch`), on a real child
process: its death, or a call it leaves unanswered, wakes the waiter within a bounded time (the
engine wires the wake to vLLM's output queue; ``tests/faults`` kills a real engine mid-run)."""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import time

from ub.inference.watch import EngineDied, EngineWatch


def _child() -> multiprocessing.Process:
    process = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(60,),
                                                           name="EngineCore", daemon=True)
    process.start()
    return process


def test_a_dead_or_silent_engine_process_wakes_the_waiter_within_a_bounded_time() -> None:
    dead = _child()
    woken: queue.Queue[EngineDied] = queue.Queue()
    watch = EngineWatch([dead], woken.put, stall_seconds=60)
    os.kill(dead.pid, signal.SIGKILL)
    error = woken.get(timeout=10)  # (what a step blocked on vLLM's output queue would get)
    assert str(error) == watch.dead == (f"the vLLM engine process EngineCore (pid {dead.pid}) "
                                        f"exited with code {-signal.SIGKILL}")
    assert watch.exited() == watch.dead  # (asked directly, as when vLLM noticed first)

    silent = _child()
    os.kill(silent.pid, signal.SIGSTOP)  # alive, answering nothing
    try:
        watch = EngineWatch([silent], woken.put, stall_seconds=0.5)
        time.sleep(1.5)
        assert woken.empty() and watch.dead is None  # (nothing in flight: idle is no stall)
        started = time.monotonic()
        with watch.busy():
            error = woken.get(timeout=10)
        assert time.monotonic() - started < 3
        assert str(error) == "the vLLM engine process did not answer for 0.5 s"
        watch.stop()  # (and a stopped watch declares nothing when the process ends on purpose)
    finally:
        silent.kill()
        silent.join()
