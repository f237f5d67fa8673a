"""What the engine takes and gives: its settings, a request, a finished generation, counters.

Plain data, no vLLM import: :class:`EngineConfig` (how to start the engine), :class:`SamplingConfig`
(how to sample a completion), :class:`GenerationRequest`, :class:`Generation`,
:class:`EngineStats`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator

from ub.games.move_mask import MoveConstraint
from ub.settings import EXECUTION, Section

# vLLM only accepts these values for max_lora_rank (vllm.config.lora.MaxLoRARanks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


Dtype = Literal["auto", "float32", "bfloat16", "float16"]
"""The dtypes a config may name, for vLLM's weights (``engine.dtype``) and the learner's."""


class EngineSection(Section):
    """vLLM settings (the ``engine:`` section of a run's config)."""

    key: ClassVar[str] = "engine"

    dtype: Dtype = Field("auto", description="vLLM's weight and activation dtype; auto: float32 "
                         "on the CPU, bfloat16 on CUDA.")
    max_model_len: int = Field(2048, ge=16, description="Context length: prompt + completion.")
    max_num_seqs: int = Field(256, ge=1, description="Most sequences the engine batches at "
                              "once.", json_schema_extra=EXECUTION)
    max_lora_rank: int = Field(16, description="Largest LoRA rank the engine loads (one of "
                               "vLLM's ranks: 1, 8, 16, 32, 64, ...).",
                               json_schema_extra=EXECUTION)
    max_loras: int = Field(4, ge=1, description="LoRA adapters resident at once (pool "
                           "checkpoints beyond it are swapped, least recently used first).",
                           json_schema_extra=EXECUTION)
    kv_cache_gib: float = Field(1.0, gt=0, description="KV cache size on the CPU, GiB.",
                                json_schema_extra=EXECUTION)
    block_size: int | Literal["auto"] = Field(
        "auto", description="Tokens per KV-cache block: vLLM's prefix cache reuses whole blocks "
        "only, so a prompt shares the start of an earlier one (the game's rules) in blocks of "
        "this many tokens. auto: 32 on the CPU (vLLM's own 128 is longer than a game's prompt: "
        "no prefix was ever reused; the CPU attention kernel takes multiples of 32), vLLM's "
        "default on a GPU.", json_schema_extra=EXECUTION)
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1, description="Share of GPU memory "
                                          "vLLM may take.", json_schema_extra=EXECUTION)
    sleep_mode: bool = Field(True, description="On a GPU, when the learner shares the engine's "
                             "process and rounds are not pipelined: the engine releases its "
                             "memory (vLLM sleep mode, level 1) while the learner updates, "
                             "whose budget is then what the GPU has free (false, or "
                             "pipelined: 1 - gpu_memory_utilization of it). An engine that "
                             "never sleeps (a Ray worker's, a pipelined run's) starts without "
                             "sleep mode's allocator either way. Ignored on the CPU.",
                             json_schema_extra=EXECUTION)

    @field_validator("block_size")
    @classmethod
    def _whole_blocks(cls, size: int | str) -> int | str:
        if isinstance(size, int) and (isinstance(size, bool) or size < 16 or size % 16):
            raise ValueError(f"must be auto or a multiple of 16 tokens (32, 64, ... on the "
                             f"CPU), got {size}")
        return size

    @field_validator("max_lora_rank")
    @classmethod
    def _a_vllm_rank(cls, rank: int) -> int:
        if rank not in VLLM_LORA_RANKS:
            raise ValueError(f"{rank} is not supported by vLLM: use one of "
                             f"{', '.join(map(str, VLLM_LORA_RANKS))}")
        return rank


class EngineConfig(EngineSection):
    """How to start one engine: the ``engine:`` settings on a model, with what a run decides
    for it. Changing any field means a new engine (a new vLLM start).

    ``sleep_mode`` here says whether vLLM starts with sleep mode's allocator, so that
    :meth:`VLLMEngine.sleep` can hand its memory to a learner in the same process (a run sets it
    only where the engine actually sleeps).
    """

    model: str = Field(description="Local model directory (config.json, safetensors, tokenizer "
                       "files), or a hub id on a machine that can download it.")
    enable_lora: bool = Field(True, description="Serve LoRA adapters (needed for any request "
                              "with an adapter).")
    seed: int = Field(0, description="The engine's global seed (requests carry their own "
                      "sampling seeds).")

    @field_validator("model", mode="before")
    @classmethod
    def _path_as_text(cls, model: Any) -> Any:
        return str(model) if isinstance(model, os.PathLike) else model


SamplingTemperature = Annotated[float, Field(ge=0)]
"""A temperature the engine samples at (0: greedy): the range of ``sampling.temperature`` and
``eval.temperature``, declared once."""


class SamplingConfig(Section):
    """How rollouts sample (the ``sampling:`` section), and what the engine takes per request:
    a completion cut at ``max_tokens`` finishes with ``"length"``; one that meets a ``stop``
    string keeps the token that completed it, and its text contains the string."""

    key: ClassVar[str] = "sampling"

    temperature: SamplingTemperature = Field(1.0, description="Sampling temperature of training "
                                             "games (the learner scores at it too); 0: greedy.")
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
        move_mask: the legal-move mask to sample under (``envs[].legal_moves: mask``); its
            logprobs are then the constrained distribution's. ``None``: unconstrained.
    """

    request_id: str
    prompt_token_ids: list[int]
    seed: int
    adapter: str | None = None
    sampling: SamplingConfig | None = None
    stop_token_ids: tuple[int, ...] = ()
    move_mask: MoveConstraint | None = None


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

