"""What the engine takes and gives: its settings, a request, a finished generation, counters.

Plain data, no vLLM import: :class:`EngineConfig` (how to start the engine), :class:`SamplingConfig`
(how to sample a completion), :class:`GenerationRequest`, :class:`Generation`,
:class:`EngineStats`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from pydantic import Field, field_validator

from ub.errors import UbError
from ub.settings import Section

# vLLM only accepts these values for max_lora_rank (vllm.config.lora.MaxLoRARanks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass(frozen=True)
class EngineConfig:
    """How to start the engine. Changing any field means a new engine (a new vLLM start).

    Attributes:
        model: local model directory (config.json, safetensors, tokenizer files), or a hub id on a
            machine that can download it.
        dtype: weight and activation dtype; ``"auto"`` is float32 on the CPU and bfloat16 on CUDA.
            Any vLLM dtype name (``"float32"``, ``"bfloat16"``, ``"float16"``) is passed through.
        max_model_len: longest prompt + completion, in tokens.
        max_num_seqs: most sequences vLLM runs in one batch.
        enable_lora: serve LoRA adapters (needed for any request with ``adapter`` set).
        max_lora_rank: largest adapter rank the engine accepts; one of 1, 8, 16, 32, 64, ...
        max_loras: adapters resident at once (one batch mixes up to this many); more are swapped
            in least-recently-used order.
        kv_cache_gib: KV cache size on the CPU, in GiB (unused on GPU).
        gpu_memory_utilization: fraction of GPU memory vLLM may use (unused on CPU).
        sleep_mode: on a GPU, start vLLM with sleep mode, so that :meth:`VLLMEngine.sleep`
            can hand its memory to a learner in the same process (unused on CPU).
        seed: the engine's global seed (requests carry their own sampling seeds).
    """

    model: str
    dtype: str = "auto"
    max_model_len: int = 2048
    max_num_seqs: int = 256
    enable_lora: bool = True
    max_lora_rank: int = 16
    max_loras: int = 4
    kv_cache_gib: float = 1.0
    gpu_memory_utilization: float = 0.85
    sleep_mode: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "model", str(self.model))  # a Path is welcome too
        if self.max_lora_rank not in VLLM_LORA_RANKS:
            raise UbError(
                f"engine.max_lora_rank {self.max_lora_rank} is not supported by vLLM: "
                f"use one of {', '.join(map(str, VLLM_LORA_RANKS))}"
            )
        for name in ("max_model_len", "max_num_seqs", "max_loras"):
            if getattr(self, name) < 1:
                raise UbError(f"engine.{name} must be >= 1, got {getattr(self, name)}")
        if self.kv_cache_gib <= 0:
            raise UbError(f"engine.kv_cache_gib must be > 0, got {self.kv_cache_gib}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise UbError(
                "engine.gpu_memory_utilization must be in (0, 1], "
                f"got {self.gpu_memory_utilization}"
            )


class SamplingConfig(Section):
    """How rollouts sample (the ``sampling:`` section), and what the engine takes per request:
    a completion cut at ``max_tokens`` finishes with ``"length"``; one that meets a ``stop``
    string keeps the token that completed it, and its text contains the string."""

    key: ClassVar[str] = "sampling"

    temperature: float = Field(1.0, ge=0, description="Sampling temperature of training games "
                               "(the learner scores at it too); 0: greedy.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling (keep 1: the learner "
                         "does not model top-p).")
    max_tokens: int = Field(32, ge=1, description="Most tokens per completion (also the "
                            "learner's default length_normalizer).")
    # A tuple, so that the config is hashable; YAML's list is accepted (strict=False), and a
    # bare string is one stop string, not its characters.
    stop: tuple[Annotated[str, Field(min_length=1)], ...] = Field(
        (), strict=False, description="Strings that end a completion, kept in it (e.g. "
        "[']'] ends a bracketed move).")

    @field_validator("stop", mode="before")
    @classmethod
    def _one_string(cls, value: Any) -> Any:
        return (value,) if isinstance(value, str) else value


@dataclass(frozen=True)
class GenerationRequest:
    """One completion to generate.

    Attributes:
        request_id: unique among the requests in flight; the result carries it back.
        prompt_token_ids: the prompt, tokenized (and templated) by the caller.
        seed: sampling seed: the same seed, prompt and adapter give the same completion. Any int
            (taken modulo 2**63, vLLM's range).
        adapter: path of a PEFT LoRA adapter directory, or ``None`` for the base model.
        sampling: overrides the engine's default :class:`SamplingConfig` for this request.
        stop_token_ids: tokens that end the completion besides the model's EOS (e.g. the
            prompt format's end of turn), kept in it like EOS.
    """

    request_id: str
    prompt_token_ids: list[int]
    seed: int
    adapter: str | None = None
    sampling: SamplingConfig | None = None
    stop_token_ids: tuple[int, ...] = ()


@dataclass
class Generation:
    """A finished completion.

    Attributes:
        request_id: the request's id.
        prompt_token_ids: the prompt as sent.
        completion_token_ids: the sampled tokens (an end-of-sequence token included if sampled).
        completion_logprobs: one per completion token: its logprob under the sampling
            distribution (after temperature and top-p).
        text: the completion decoded (special tokens skipped).
        finish_reason: ``"stop"`` (end-of-sequence token or stop string) or ``"length"``.
        stop_reason: the stop string or stop token id that ended it, ``None`` for eos or length.
        adapter: the adapter path used (``None`` = base model).
        lora_id: vLLM's integer id for that adapter (0 = base model).
        seed: the sampling seed used.
        latency_s: seconds from submit to finish.
    """

    request_id: str
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    completion_logprobs: list[float]
    text: str
    finish_reason: str
    stop_reason: int | str | None = None
    adapter: str | None = None
    lora_id: int = 0
    seed: int = 0
    latency_s: float = 0.0

    @property
    def sum_logprob(self) -> float:
        """Log-probability of the whole completion under the sampling distribution."""
        return math.fsum(self.completion_logprobs)


@dataclass
class EngineStats:
    """Counters for throughput reporting (since the engine started or the last :meth:`reset`)."""

    requests: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    engine_seconds: float = 0.0  # time spent inside vLLM steps
    steps: int = 0

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens per second of engine time."""
        return self.generated_tokens / self.engine_seconds if self.engine_seconds > 0 else 0.0

    def reset(self) -> None:
        """Zero all counters."""
        self.requests = self.prompt_tokens = self.generated_tokens = self.steps = 0
        self.engine_seconds = 0.0

