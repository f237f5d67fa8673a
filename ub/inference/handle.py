"""A caller's handle on a shared engine: the engine, plus that caller's default sampling.

A process keeps one vLLM engine across rounds (:class:`ub.run.processes.worker.Worker`), and its
callers sample differently (training games, greedy evaluation, ``ub play``). Each gets an
:class:`EngineHandle` carrying its own default, filled into the requests that carry none; the
shared engine has no default of its own, so one caller's sampling never leaks into another's.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ub.inference.engine import VLLMEngine
    from ub.inference.types import (
        EngineConfig,
        EngineStats,
        Generation,
        GenerationRequest,
        SamplingConfig,
    )


class EngineHandle:
    """``engine`` with ``sampling`` as the default of the requests submitted through it (an
    :class:`~ub.inference.protocols.InferenceEngine`)."""

    def __init__(self, engine: VLLMEngine, sampling: SamplingConfig) -> None:
        self.engine = engine
        self.sampling = sampling

    @property
    def config(self) -> EngineConfig:
        return self.engine.config

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def stats(self) -> EngineStats:
        return self.engine.stats

    @property
    def resident_adapters(self) -> int:
        return self.engine.resident_adapters

    def lora_request(self, adapter: str | None) -> Any:
        return self.engine.lora_request(adapter)

    def _with_default(self, request: GenerationRequest) -> GenerationRequest:
        if request.sampling is not None:
            return request
        return dataclasses.replace(request, sampling=self.sampling)

    def submit(self, request: GenerationRequest) -> None:
        self.engine.submit(self._with_default(request))

    def step(self) -> list[Generation]:
        return self.engine.step()

    def abort(self, request_ids: list[str]) -> None:
        self.engine.abort(request_ids)

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished()

    def generate(self, requests: list[GenerationRequest]) -> list[Generation]:
        return self.engine.generate([self._with_default(r) for r in requests])
