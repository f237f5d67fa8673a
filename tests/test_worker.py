"""The worker's hand-over of GPU memory around a learner update (issue 43, item 1, the part a
CPU can check): the engine sleeps, the learner updates, the learner's cached device memory is
freed, and only then does the engine wake, also when the update fails."""

from __future__ import annotations

import contextlib

import pytest

from ub.run.worker import Worker


class _Recorder:
    """A sleeping engine and a device allocator (what a GPU would have), recording calls."""

    closed = False

    def __init__(self, events: list[str]) -> None:
        self.events = events

    def sleep(self) -> bool:
        self.events.append("sleep")
        return True

    def wake_up(self) -> None:
        self.events.append("wake")

    def empty_cache(self) -> None:
        self.events.append("free")


@pytest.mark.parametrize("fails", [False, True])
def test_the_learners_cache_is_freed_before_the_engine_wakes(fails: bool) -> None:
    events: list[str] = []
    recorder = _Recorder(events)
    worker = Worker(device_memory=recorder)
    worker._engine = recorder  # type: ignore[assignment]  # (no GPU engine sleeps on a CPU)
    expected = pytest.raises(RuntimeError) if fails else contextlib.nullcontext()
    with expected, worker.engine_asleep():
        events.append("update")
        if fails:
            raise RuntimeError("out of memory")
    assert events == ["sleep", "update", "free", "wake"]
