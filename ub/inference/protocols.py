"""What the rest of ub may call on an engine: :class:`InferenceEngine`.

Rollouts and evaluation drive an engine through this interface only, so a
:class:`~ub.inference.engine.VLLMEngine`, a caller's
:class:`~ub.inference.handle.EngineHandle` on a shared one, or a test double all fit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ub.inference.engine import VLLMEngine
    from ub.inference.handle import EngineHandle
    from ub.inference.types import EngineConfig, EngineStats, Generation, GenerationRequest


@runtime_checkable
class InferenceEngine(Protocol):
    """An engine fed request by request (continuous batching), from one thread.

    ``submit`` queues a request; each ``step`` advances every request in flight and returns the
    ones that finished; ``abort`` drops requests in flight; ``generate`` runs a list of requests
    to the end. ``tokenizer`` builds the prompts' token ids (a Hugging Face tokenizer).
    """

    @property
    def config(self) -> EngineConfig: ...

    @property
    def tokenizer(self) -> Any: ...

    @property
    def stats(self) -> EngineStats: ...

    def lora_request(self, adapter: str | None) -> Any: ...

    def submit(self, request: GenerationRequest) -> None: ...

    def step(self) -> list[Generation]: ...

    def abort(self, request_ids: list[str]) -> None: ...

    def has_unfinished(self) -> bool: ...

    def generate(self, requests: list[GenerationRequest]) -> list[Generation]: ...


if TYPE_CHECKING:

    def _fit(engine: VLLMEngine, handle: EngineHandle) -> list[InferenceEngine]:
        """(mypy checks that both implement the interface.)"""
        return [engine, handle]
