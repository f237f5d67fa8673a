"""The worker's hand-over of GPU memory around a learner update (issue 43, item 1, the part a
CPU can check): the engine sleeps, the learner's budget becomes what the GPU has free, the
learner updates, its cached device memory is freed, and only then does the engine wake, also
when the update fails; awake, the engine's share bounds the learner.

No GPU here: the one thing faked is the device's memory as ``torch.cuda`` reports it (and the
engine's sleep and wake, which move it); the learner is a real one."""

from __future__ import annotations

import contextlib

import pytest
import torch

from ub.learner import LearnerConfig
from ub.learner.memory import device_budget
from ub.learner.testing import build_qwen3
from ub.model.lora import LoraSettings
from ub.run.processes.worker import Worker

GIB = 2**30
CUDA = torch.device("cuda", 0)


class _Gpu:
    """An 80 GiB GPU as ``torch.cuda`` reports it: the driver's free memory, and what the
    learner's caching allocator holds (``reserved``) and uses (``allocated``)."""

    total = 80 * GIB

    def __init__(self, events: list[str], learner_holds: int, engine_holds: int) -> None:
        self.events = events
        self.reserved = self.allocated = learner_holds
        self.engine_holds = engine_holds

    def mem_get_info(self, device=None) -> tuple[int, int]:
        return self.total - self.reserved - self.engine_holds, self.total

    def memory_reserved(self, device=None) -> int:
        return self.reserved

    def memory_allocated(self, device=None) -> int:
        return self.allocated

    def empty_cache(self) -> None:
        self.events.append("free")
        self.reserved = self.allocated

    def learner_peak(self, activations: int) -> None:
        """An update's activations, freed by autograd but kept in the allocator's cache."""
        self.reserved = self.allocated + activations


class _Engine:
    """A vLLM engine with sleep mode on a GPU: asleep it keeps 2 GiB of its 48 (0.6 of the GPU);
    waking, it needs the rest free, or runs out of memory as vLLM's wake would."""

    closed = False
    share, kept = 48 * GIB, 2 * GIB

    def __init__(self, gpu: _Gpu) -> None:
        self.gpu = gpu

    def sleep(self) -> bool:
        self.gpu.events.append("sleep")
        self.gpu.engine_holds = self.kept
        return True

    def wake_up(self) -> None:
        free, _ = self.gpu.mem_get_info()
        if free < self.share - self.kept:
            raise torch.OutOfMemoryError("the waking engine found the learner's cache")
        self.gpu.events.append("wake")
        self.gpu.engine_holds = self.share

    def close(self) -> None:
        self.closed = True


@pytest.fixture(scope="module")
def learner_config(tmp_path_factory: pytest.TempPathFactory) -> LearnerConfig:
    model = build_qwen3(tmp_path_factory.mktemp("qwen3"), vocab_size=500)
    # As a run sets it for a learner beside its engine: 1 - engine.gpu_memory_utilization.
    return LearnerConfig(base_model=str(model), lora=LoraSettings(rank=4, alpha=8),
                         device_share=0.4)


@pytest.mark.parametrize("fails", [False, True])
def test_asleep_the_learner_has_what_the_gpu_has_free_and_frees_it_before_the_engine_wakes(
        learner_config: LearnerConfig, fails: bool) -> None:
    events: list[str] = []
    own = 4 * GIB  # the learner's weights and optimizer state
    gpu = _Gpu(events, learner_holds=own, engine_holds=46 * GIB)  # (of its 48: 2 unused yet)
    worker = Worker(device_memory=gpu)
    worker._engine = _Engine(gpu)  # type: ignore[assignment]  # (no GPU engine on a CPU)

    def budget() -> float:  # what the learner the worker hands out sizes its micro-batch by
        share = worker.learner(learner_config).config.device_share
        return device_budget(CUDA, own, share, memory=gpu)[0]

    try:
        # Awake, the engine's share bounds the learner (0.4 of 80 GiB less what it holds),
        # though the driver has 30 GiB free.
        assert gpu.mem_get_info()[0] == 30 * GIB
        assert budget() == 0.4 * 80 * GIB - own
        expected = pytest.raises(RuntimeError) if fails else contextlib.nullcontext()
        with expected, worker.engine_asleep():
            # Asleep: everything free, the learner's own cached blocks included.
            assert budget() == 80 * GIB - 2 * GIB - own
            events.append("update")
            gpu.learner_peak(60 * GIB)
            assert budget() == 74 * GIB  # (the cache is the learner's to reuse)
            if fails:
                raise RuntimeError("the update failed")
        assert events == ["sleep", "update", "free", "wake"]
        assert budget() == 0.4 * 80 * GIB - own  # awake again
    finally:
        worker.close()
