"""What one process holds across a run's steps: at most one vLLM engine and one learner.

Starting vLLM or loading a base model costs seconds and a lot of memory, so a process keeps
them between rounds: new checkpoints arrive as new LoRA adapters, and the learner swaps only its
small LoRA and optimizer state. A :class:`Worker` is that keeping, made explicit: the steps that
need an engine or a learner take a worker as a parameter. Each process that runs steps owns one
worker: a Ray actor its own (:class:`ub.run.processes.cluster.RoundWorker`), the Prefect tasks of
a flow the one of the flow's process, :func:`process_worker`, which only the orchestration
edges (tasks, flows, CLI commands, tests) reach for.

Sampling is never a property of the shared engine: :meth:`Worker.engine` returns a handle with
the caller's own default sampling, so one caller never changes another's.
"""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from ub.errors import UbError

if TYPE_CHECKING:
    from ub.inference.engine import VLLMEngine
    from ub.inference.handle import EngineHandle
    from ub.inference.types import EngineConfig, SamplingConfig
    from ub.learner.config import LearnerConfig
    from ub.learner.entry import KeptLearner
    from ub.learner.learner import Learner

log = logging.getLogger("ub.rollout")  # (the engine serves rollouts; its log file)


class DeviceMemory(Protocol):
    """The caching allocator of the learner's device (``torch.cuda``)."""

    def empty_cache(self) -> None: ...


class Worker:
    """A process's engine and learner: each built on first use, reused while its settings
    stay the same, replaced when they change, and released by :meth:`close`.

    Args:
        device_memory: the learner's device allocator, emptied before a sleeping engine
            wakes; ``None``: ``torch.cuda`` where a GPU is present (tests pass a fake).
    """

    def __init__(self, device_memory: DeviceMemory | None = None) -> None:
        self._engine: VLLMEngine | None = None
        self._learner: KeptLearner | None = None  # (ub.learner loads torch: on first use)
        self._device_memory = device_memory
        self._engine_asleep = False  # (in engine_asleep's block, once the engine slept)

    def engine(self, config: EngineConfig, sampling: SamplingConfig) -> EngineHandle:
        """The engine for ``config`` (started once, reused while ``config`` stays the same), as
        a handle whose requests sample with ``sampling`` unless they carry their own.

        A different ``config`` shuts the old engine down (it must have no requests in flight)
        and starts a new one; handles on the old engine then refuse further use.
        """
        from ub.inference.engine import VLLMEngine
        from ub.inference.handle import EngineHandle

        engine = self._engine
        if engine is not None and engine.death is not None:
            # A dead engine is replaced, never waited on: its requests died with it (their
            # callers replay them: ub.run.steps.play.play_shard).
            log.warning("replacing the vLLM engine: %s", engine.death)
            self.close_engine()
            engine = None
        if engine is None or engine.config != config or engine.closed:
            if engine is not None:
                if engine.has_unfinished():
                    raise UbError(
                        "cannot switch the vLLM engine to a new model/config while requests "
                        "are in flight: finish or drop them first")
                self.close_engine()
            # vLLM starts only if its share of the GPU is free: what the learner's allocator
            # cached from its last update goes back to the device first.
            self._free_learner_cache()
            engine = self._engine = VLLMEngine(config)  # (its start freezes the heap)
        return EngineHandle(engine, sampling)

    def learner(self, config: LearnerConfig) -> Learner:
        """The learner for ``config``: the base model is loaded on first use and kept while the
        model fields of ``config`` stay the same (the others are applied with
        :meth:`~ub.learner.learner.Learner.configure`): a :class:`ub.learner.entry.KeptLearner`.

        Inside :meth:`engine_asleep`, once the engine slept, the learner gets no
        ``device_share``: its budget is then what the GPU has free, not the share an awake
        engine leaves it (:func:`ub.learner.memory.learner_budget_bytes`); it measures it again
        whenever that changes.
        """
        if self._learner is None:
            from ub.learner.entry import KeptLearner

            self._learner = KeptLearner()
        if self._engine_asleep and config.device_share is not None:
            config = config.replace(device_share=None)
        return self._learner.learner(config)

    @contextlib.contextmanager
    def engine_asleep(self) -> Iterator[None]:
        """The block runs with the engine asleep (:meth:`VLLMEngine.sleep`: on a GPU its
        memory goes to the learner, whose budget is then what the GPU has free: see
        :meth:`learner`), and wakes it after, once the learner's cached memory is freed. A
        no-op without an engine, or on the CPU."""
        engine = self._engine
        slept = engine is not None and not engine.closed and engine.sleep()
        self._engine_asleep = slept
        try:
            yield
        finally:
            self._engine_asleep = False
            if slept:
                assert engine is not None
                # The learner's allocator keeps what the update reserved (its peak: a long
                # row's activations); the waking engine allocates outside it, so that memory
                # goes back to the device first, or vLLM's wake runs out of it.
                self._free_learner_cache()
                engine.wake_up()

    def _free_learner_cache(self) -> None:
        memory = self._device_memory
        if memory is None:
            import torch

            if not torch.cuda.is_available():
                return
            memory = torch.cuda
        memory.empty_cache()

    def close_engine(self) -> None:
        """Shut the engine down and free its memory (the next :meth:`engine` starts one)."""
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.close()

    def close_learner(self) -> None:
        """Drop the learner and free its memory."""
        self._learner = None  # (the kept learner with it)
        gc.unfreeze()  # (frozen cycles are never collected)
        gc.collect()

    def close(self) -> None:
        """Release the engine and the learner."""
        self.close_engine()
        self.close_learner()


_PROCESS_WORKER = Worker()


def process_worker() -> Worker:
    """The worker of this process, for the orchestration edges only: the Prefect tasks (which
    run in the flow's process), the CLI commands and the tests. Library functions take a
    :class:`Worker` and never call this."""
    return _PROCESS_WORKER
