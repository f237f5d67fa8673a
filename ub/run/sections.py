"""The settings sections not yet declared in the package that uses them (being moved there:
:mod:`ub.settings` has the base and the rules)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal, get_args

from pydantic import BaseModel, Field, ValidationError

from ub.errors import UbError
from ub.seeding import DEFAULT_SEED
from ub.settings import (
    EXECUTION,
    Section,
    components_of,
    default_of,
    format_errors,
    is_execution,
    names_components,
)

__all__ = ["DEFAULT_SEED", "EXECUTION", "Section", "check_types", "components_of", "default_of",
           "format_errors", "is_execution", "names_components"]

Dtype = Literal["auto", "float32", "bfloat16", "float16"]
Attention = Literal["auto", "sdpa", "eager", "flash_attention_2"]
Kernels = Literal["auto", "liger", "none"]
DTYPES: tuple[str, ...] = get_args(Dtype)
ATTENTION: tuple[str, ...] = get_args(Attention)
KERNELS: tuple[str, ...] = get_args(Kernels)
ALL_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def check_types(section: type[BaseModel], data: Mapping[str, Any], name: str) -> None:
    """(Until the mirrors go.) Check the types of the settings in ``data`` that ``section``
    has."""
    known = {k: v for k, v in data.items() if k in section.model_fields and v is not None
             and not dataclasses.is_dataclass(v)}
    try:
        section.model_validate(known)
    except ValidationError as exc:
        raise UbError(format_errors(exc, name)) from None


class LoraSection(Section):
    """LoRA hyper-parameters (rank, alpha and targets must match a resumed checkpoint's)."""

    rank: int = Field(16, description="Adapter rank r (<= engine.max_lora_rank).")
    alpha: int | float = Field(32, description="Scaling numerator: the update is scaled by "
                               "alpha / r (> 0).")
    dropout: float = Field(0.0, description="Dropout on the adapter input in training, in "
                           "[0, 1).")
    target_modules: list[str] = Field(default_factory=lambda: list(ALL_PROJECTIONS),
                                      description="Module names that get adapters.")


class LearnerSection(Section):
    """How the learner trains (``ub learn`` and every ``ub train`` round); see
    docs/algorithms.md."""

    dtype: Dtype = Field("auto", description="Base weights' dtype; auto: bfloat16 on "
                                   "a GPU, float32 on the CPU.")
    attn_implementation: Attention = Field(
        "auto", description="auto: flash_attention_2 on a GPU with a 16-bit dtype when "
        "installed, else sdpa.", json_schema_extra=EXECUTION)
    device: str = Field("auto", description="auto: cuda if available, else cpu; or a torch "
                        "device string.")
    lora: LoraSection = Field(default_factory=LoraSection, description="The LoRA adapter.")
    init_adapter: str | None = Field(None, description="PEFT LoRA adapter directory to start "
                                     "from; null: a fresh adapter (B = 0).")
    seed: int | None = Field(None, description="Seeds the fresh adapter and the learner's RNG; "
                             "null: the run's seed.")
    algorithm: str = Field("reinforce", description="The loss: a registered algorithm's name, or "
                           "package.module:Class, a subclass of ub.learner.Algorithm "
                           "(docs/algorithms.md).", json_schema_extra=names_components("algorithm"))
    algorithm_params: dict[str, Any] = Field(default_factory=dict, description="Keyword "
                                             "arguments of the algorithm, e.g. {clip_eps: 0.2}.")
    kl_coef: float = Field(0.0, description="Weight of a KL penalty to the base model (the "
                           "adapter switched off), per completion token (>= 0; 0: none).")
    entropy_coef: float = Field(0.0, description="Weight of an entropy bonus: the loss "
                                "subtracts it times each completion token's policy entropy "
                                "(>= 0; 0: none).")
    target_kl: float | None = Field(None, description="Stop an update of several optimizer "
                                    "steps before the step whose approx_kl (to the policy the "
                                    "update started from) passes this (> 0); null: never.")
    length_normalizer: int | None = Field(None, description="L of Dr. GRPO's B * L loss "
                                          "normaliser; null: sampling.max_tokens.")
    temperature: float | None = Field(None, description="Temperature the learner scores tokens "
                                      "at; null: sampling.temperature.")
    learning_rate: float = Field(1e-5, description="AdamW step size (> 0).")
    weight_decay: float = Field(0.0, description="AdamW decoupled weight decay (>= 0).")
    betas: list[float] = Field(default_factory=lambda: [0.9, 0.999], description="AdamW moment "
                               "decay rates: two numbers in [0, 1).")
    adam_eps: float = Field(1e-8, description="AdamW denominator epsilon (> 0).")
    max_grad_norm: float | None = Field(0.2, description="Clip the global gradient norm to this "
                                        "(> 0); null: no clipping.")
    minibatches: int = Field(1, description="Optimizer steps per pass over the batch "
                             "(positive; > 1 is off-policy: use ppo).")
    epochs: int = Field(1, description="Passes over the batch per update (positive).")
    warmup_steps: int = Field(0, description="Optimizer steps of linear learning-rate warm-up "
                              "(>= 0; 0: none).")
    decay_steps: int = Field(0, description="After the warm-up, the learning rate falls linearly "
                             "until this optimizer step (counted like warmup_steps) to "
                             "final_lr_fraction of itself, then stays (0: constant).")
    final_lr_fraction: float = Field(0.1, description="decay_steps only: the learning rate at "
                                     "and after step decay_steps, as a fraction, in [0, 1].")
    kernels: Kernels = Field("auto", description="GPU kernels of the transformer body: liger "
                             "(Liger Kernel's RoPE, RMSNorm, SwiGLU; CUDA, the gpu extra), none, "
                             "or auto: liger where it runs, else none.",
                             json_schema_extra=EXECUTION)
    micro_batch_tokens: int | Literal["auto"] | None = Field(
        "auto", description="Most tokens per micro-batch, padding included; auto: sized from "
        "the memory the learner has (on a GPU what is free while the engine sleeps, else "
        "1 - engine.gpu_memory_utilization of it; at most 4096 on the CPU), and a longer row "
        "than that memory holds is refused before the update; null: no limit. An update that "
        "runs out of memory is retried at half the size.", json_schema_extra=EXECUTION)
    micro_batch_size: int | None = Field(None, description="Most rows per micro-batch; null: no "
                                         "limit.", json_schema_extra=EXECUTION)
    gradient_checkpointing: bool = Field(False, description="Recompute activations in the "
                                         "backward pass (less memory, ~1/3 more compute).",
                                         json_schema_extra=EXECUTION)
    num_threads: int | None = Field(None, description="torch CPU threads; null: torch's "
                                    "setting.", json_schema_extra=EXECUTION)
