"""The learner's settings: the ``learner:`` section of a run's config (:class:`LearnerSection`)
and what a learner runs with (:class:`LearnerConfig`: the section plus what the run supplies)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

from ub.errors import UbError
from ub.inference.types import Dtype, SamplingConfig
from ub.model.lora import LoraSettings
from ub.numbers import first_non_finite
from ub.seeding import DEFAULT_SEED
from ub.settings import EXECUTION, Section, names_components

__all__ = ["RUN_GIVEN", "AdapterCompute", "Attention", "AttentionKernel", "Kernels",
           "LearnerConfig", "LearnerSection", "run_given", "with_run_given"]

Attention = Literal["auto", "sdpa", "eager", "flash_attention_2"]
Kernels = Literal["auto", "liger", "none"]
AdapterCompute = Literal["auto", "model", "float32"]
AttentionKernel = Literal["auto", "torch", "flash", "cudnn"]

# The three settings the section may leave to the run, with their ranges (one declaration,
# read by both classes below).
Seed = Annotated[int, Field(ge=-2**63, lt=2**64)]  # what torch's generators take
Temperature = Annotated[float, Field(gt=0)]
LengthNormalizer = Annotated[int, Field(ge=1)]


def _finite(value: Any) -> Any:
    """A free-form value (an algorithm's parameter) with no nan or inf inside: refused here,
    naming it, before the algorithm reads it (the typed fields refuse them themselves)."""
    found = first_non_finite(value)
    if found:
        where, number = found
        problem = f"expected a finite number, got {number}"
        raise ValueError(problem if where == "(top level)" else f"{where}: {problem}")
    return value


class LearnerSection(Section):
    """How the learner trains (``ub learn`` and every ``ub train`` round); see
    docs/algorithms.md.

    Notes beyond the one line of each field:

    - The model fields (``dtype``, ``attn_implementation``, ``device``, ``lora``, and the
      :class:`LearnerConfig`'s ``base_model``) are fixed for the life of a
      :class:`~ub.learner.Learner`; a change loads a new one.
    - ``temperature``: the learner scores tokens with ``log_softmax(logits / temperature)``, the
      distribution they were sampled from, so importance ratios are 1 on on-policy data.
    - ``length_normalizer`` scales the loss (so the effective learning rate) but never depends
      on a sequence's length.
    - ``warmup_steps`` count from the cold start, so a resumed run continues the ramp: Adam's
      first steps move every weight by about the learning rate whatever the gradient's size.
      ``decay_steps`` count the same way: a run extended past them goes on at the final rate.
    - ``micro_batch_tokens`` bounds activation memory; on a CPU 2048-4096 is also the fastest.
      ``auto`` sizes it from a probe of the model's activations and the memory the learner has
      (:mod:`ub.learner.memory`); an out-of-memory error halves it and retries the update.
    - ``kernels``: :mod:`ub.learner.kernels`; ``attention_kernel`` and ``pad_to_multiple``:
      shapes that repeat, :mod:`ub.learner.kernels` and :mod:`ub.learner.batching`;
      ``pack_prefixes``: :mod:`ub.learner.packing`.
    - ``adapter_compute``: :mod:`ub.learner.precision`.
    - ``target_kl`` (PPO's early stop): before each optimizer step after the first, the step's
      forward pass measures ``approx_kl`` of the current policy to the one the update started
      from (k3 over the step's completion tokens); past ``target_kl`` the update ends there,
      with the steps it took (``early_stopped`` and ``optimizer_steps`` say so).
    - ``entropy_coef``: a bonus on the entropy of the distribution each completion token was
      sampled from, with its exact gradient (not the sampled-token estimate): under the
      legal-move mask the softmax over the tokens the mask allowed there (the distribution the
      sampler plays), else the whole vocabulary's. It is the regularizer that keeps self-play
      moving (docs/algorithms.md#the-entropy-bonus).
    - ``legal_mass_coef``: under the legal-move mask, the tokens never sampled are never scored
      and their mass drifts up, so the policy played free plays illegal moves; this term
      keeps the mass on what the mask allowed as a whole (its gradient is q - p, the masked
      softmax less the whole one: it favours no legal move over another).
    """

    dtype: Dtype = Field("auto", description="Base weights' dtype; auto: bfloat16 on "
                                   "a GPU, float32 on the CPU.")
    attn_implementation: Attention = Field(
        "auto", description="auto: flash_attention_2 on a GPU with a 16-bit dtype when "
        "installed, else sdpa.", json_schema_extra=EXECUTION)
    device: str = Field("auto", description="auto: cuda if available, else cpu; or a torch "
                        "device string.")
    lora: LoraSettings = Field(default_factory=LoraSettings, description="The LoRA adapter.")
    init_adapter: str | None = Field(None, description="PEFT LoRA adapter directory to start "
                                     "from; null: a fresh adapter (B = 0).")
    seed: Seed | None = Field(None, description="Seeds the fresh adapter and the learner's RNG "
                              "(torch's range: [-2**63, 2**64)); null: the run's seed.")
    algorithm: str = Field("reinforce", description="The loss: a registered algorithm's name, or "
                           "package.module:Class, a subclass of ub.learner.Algorithm "
                           "(docs/algorithms.md).", json_schema_extra=names_components("algorithm"))
    algorithm_params: dict[str, Annotated[Any, AfterValidator(_finite)]] = Field(
        default_factory=dict, description="The algorithm's parameters, e.g. {clip_eps: 0.2}, "
        "kept as written (the unset ones take their defaults): a registered algorithm's are "
        "its section learner.algorithm_params (NAME) below, with their types and ranges; for "
        "an algorithm of one's own, its Params section or its __init__'s keyword arguments "
        "(docs/algorithms.md).")
    kl_coef: float = Field(0.0, ge=0, description="Weight of a KL penalty to the base model (the "
                           "adapter switched off), per completion token (0: none).")
    entropy_coef: float = Field(0.0, ge=0, description="Weight of an entropy bonus: the loss "
                                "subtracts it times the entropy of each completion token's "
                                "sampling distribution (over the tokens the legal-move mask "
                                "allowed, where it was sampled under one; else the whole "
                                "vocabulary) (0: none).")
    legal_mass_coef: float = Field(0.0, ge=0, description="Weight of a term that keeps the "
                                   "whole vocabulary's probability on the tokens the "
                                   "legal-move mask allowed, at each masked completion token: "
                                   "the loss adds it times -log(that mass) (0: none; "
                                   "docs/training.md).")
    target_kl: float | None = Field(None, gt=0, description="Stop an update of several "
                                    "optimizer steps before the step whose approx_kl (to the "
                                    "policy the update started from) passes this; null: never.")
    length_normalizer: LengthNormalizer | None = Field(
        None, description="L of Dr. GRPO's B * L loss normaliser; null: "
        "sampling.max_tokens.")
    temperature: Temperature | None = Field(None, description="Temperature the learner scores "
                                            "tokens at; null: sampling.temperature.")
    learning_rate: float = Field(1e-5, gt=0, description="AdamW step size.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay.")
    betas: list[Annotated[float, Field(ge=0, lt=1)]] = Field(
        default_factory=lambda: [0.9, 0.999], min_length=2, max_length=2,
        description="AdamW moment decay rates (beta1, beta2).")
    adam_eps: float = Field(1e-8, gt=0, description="AdamW denominator epsilon.")
    max_grad_norm: float | None = Field(0.2, gt=0, description="Clip the global gradient norm "
                                        "to this; null: no clipping.")
    minibatches: int = Field(1, ge=1, description="Optimizer steps per pass over the batch "
                             "(> 1 is off-policy: use ppo).")
    epochs: int = Field(1, ge=1, description="Passes over the batch per update.")
    warmup_steps: int = Field(0, ge=0, description="Optimizer steps of linear learning-rate "
                              "warm-up (0: none).")
    decay_steps: int = Field(0, ge=0, description="After the warm-up, the learning rate falls "
                             "linearly until this optimizer step (counted like warmup_steps, "
                             "larger than it) to final_lr_fraction of itself, then stays (0: "
                             "constant).")
    final_lr_fraction: float = Field(0.1, ge=0, le=1, description="decay_steps only: the "
                                     "learning rate at and after step decay_steps, as a "
                                     "fraction.")
    kernels: Kernels = Field("auto", description="GPU kernels of the transformer body: liger "
                             "(Liger Kernel's RoPE, RMSNorm, SwiGLU; CUDA, the gpu extra), none, "
                             "or auto: liger where it runs, else none.",
                             json_schema_extra=EXECUTION)
    micro_batch_tokens: int | Literal["auto"] | None = Field(
        "auto", description="Most tokens per micro-batch, padding included (positive); auto: "
        "sized from the memory the learner has (on a GPU what is free while the engine sleeps, "
        "else 1 - engine.gpu_memory_utilization of it; at most 4096 on the CPU), and a longer "
        "row than that memory holds is refused before the update; null: no limit. An update "
        "that runs out of memory is retried at half the size.", json_schema_extra=EXECUTION)
    micro_batch_size: int | None = Field(None, ge=1, description="Most rows per micro-batch; "
                                         "null: no limit.", json_schema_extra=EXECUTION)
    adapter_compute: AdapterCompute = Field(
        "auto", description="The LoRA adapter's matmuls: model (in the base weights' dtype, "
        "e.g. bfloat16; the adapter's weights, gradients and AdamW state stay float32) or "
        "float32 (PEFT's: each input cast up); auto: model on CUDA, else float32.")
    attention_kernel: AttentionKernel = Field(
        "auto", description="SDPA's kernel: cudnn (cuDNN's first), flash (FlashAttention: no "
        "plan per shape) or torch (torch's choice); auto: cudnn on CUDA, else torch.",
        json_schema_extra=EXECUTION)
    pad_to_multiple: int | Literal["auto"] = Field(
        "auto", description="Pad each micro-batch's width up to a multiple of this many "
        "tokens, so that shapes repeat (1: no padding); auto: 128 on CUDA, else 1.",
        json_schema_extra=EXECUTION)
    pack_prefixes: bool | Literal["auto"] = Field(
        "auto", description="Run the transformer body once per shared token prefix of a "
        "micro-batch's rows (a prefix tree, with an attention mask; the same scores up to float "
        "summation order); needs sdpa or eager attention, and a model whose output layer ub "
        "runs in chunks (Qwen2/3, Llama, ...; others score unpacked); auto: on the CPU, off "
        "on a GPU.", json_schema_extra=EXECUTION)
    gradient_checkpointing: bool = Field(False, description="Recompute activations in the "
                                         "backward pass (less memory, ~1/3 more compute).",
                                         json_schema_extra=EXECUTION)
    num_threads: int | None = Field(None, ge=1, description="torch CPU threads; null: torch's "
                                    "setting.", json_schema_extra=EXECUTION)

    key = "learner"

    @field_validator("micro_batch_tokens")
    @classmethod
    def _positive_tokens(cls, value: int | str | None) -> int | str | None:
        # (Not a bound on the field: pydantic would report it once per member of the union.)
        if isinstance(value, int) and value < 1:
            raise ValueError(f"must be a positive integer, auto or null, got {value!r}")
        return value

    @field_validator("pad_to_multiple")
    @classmethod
    def _positive_multiple(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError(f"must be a positive integer or auto, got {value!r}")
        return value

    @field_validator("algorithm_params")
    @classmethod
    def _algorithm_params_valid(cls, params: dict[str, Any], info: ValidationInfo
                                ) -> dict[str, Any]:
        # Checked as the algorithm's Params section, here rather than in the check below, so
        # that pydantic names a bad one by its path (learner.algorithm_params.clip_eps). The
        # mapping is kept as written: config.yaml and a checkpoint's record stay as given.
        from ub.learner.algorithms import algorithm_class, algorithm_settings

        name = info.data.get("algorithm")
        try:
            algorithm_class(name) if name is not None else None
        except UbError:
            return params  # (an unknown algorithm: the check below says so)
        if name is not None:
            algorithm_settings(name, params)  # (its ValidationError carries the parameters' path)
        return params

    @model_validator(mode="after")
    def _algorithm_exists(self) -> LearnerSection:
        # A registered name or an importable class, which builds with its parameters: refused
        # here, before a model is loaded or a round is played. (Deferred: torch.)
        from ub.learner.algorithms import make_algorithm

        try:
            make_algorithm(self.algorithm, self.algorithm_params)
        except UbError as exc:
            raise ValueError(str(exc)) from None
        return self

    @property
    def steps_per_update(self) -> int:
        """Optimizer steps one update takes: ``minibatches * epochs``."""
        return self.minibatches * self.epochs

    @model_validator(mode="after")
    def _decay_after_warmup(self) -> LearnerSection:
        if self.decay_steps and self.decay_steps <= self.warmup_steps:
            raise ValueError(f"decay_steps ({self.decay_steps}) must be larger than "
                             f"warmup_steps ({self.warmup_steps}): the decay starts where the "
                             "warm-up ends")
        return self


RUN_GIVEN = ("seed", "temperature", "length_normalizer")
"""What :class:`LearnerSection` may leave null for the run to give (:func:`run_given`)."""


def run_given(seed: int = DEFAULT_SEED, sampling: SamplingConfig | None = None
              ) -> dict[str, Any]:
    """What a learner takes from its run where its ``learner:`` section says null
    (:data:`RUN_GIVEN`): the run's ``seed``, its ``sampling.temperature``, and
    ``sampling.max_tokens`` as the loss's length normalizer. Without a run (the arguments'
    defaults), a default run's: :data:`~ub.seeding.DEFAULT_SEED` and
    :class:`~ub.inference.SamplingConfig`'s defaults.

    :param seed: the run's seed.
    :param sampling: the run's ``sampling:`` section (``None``: its defaults).
    """
    sampling = SamplingConfig() if sampling is None else sampling
    return {"seed": seed, "temperature": sampling.temperature,
            "length_normalizer": sampling.max_tokens}


def with_run_given(learner: Mapping[str, Any], run: Mapping[str, Any]) -> dict[str, Any]:
    """A learner section's settings ``learner`` with each of :data:`RUN_GIVEN` that it leaves
    null or out taken from ``run`` (:func:`run_given`): the one place where "null means the
    run's" is resolved, for a run's learner (:meth:`ub.run.config.schema.TrainConfig.
    learner_config`), ``ub learn`` and a :class:`LearnerConfig` built without a run alike.

    :param learner: the section's settings (a mapping, as written or as validated).
    :param run: what the run gives, :func:`run_given`'s mapping.
    """
    out = dict(learner)
    for key in RUN_GIVEN:
        if out.get(key) is None:
            out[key] = run[key]
    return out


class LearnerConfig(LearnerSection):
    """What a learner runs with: the ``learner:`` section plus what the run supplies.

    It exists because the section alone does not say everything a learner needs: the base
    model (a run's ``model.base``, a command's ``--base-model``) and the GPU share beside the
    engine are the run's, not the section's, and the section's ``seed``, ``temperature`` and
    ``length_normalizer`` may be null, meaning the run's ``seed``, ``sampling.temperature`` and
    ``sampling.max_tokens`` (:meth:`ub.run.config.schema.TrainConfig.learner_config` fills
    them). Here they are never null: given as null or not at all, they take a default run's
    (:func:`run_given` without a run: :data:`~ub.seeding.DEFAULT_SEED`, and
    :class:`~ub.inference.SamplingConfig`'s ``temperature`` and ``max_tokens``), so a learner
    built without a run trains as a default run's would. A checkpoint records :meth:`to_dict`
    (with the base model's portable name).

    ``device_share``: a run sets it to ``1 - engine.gpu_memory_utilization``; ``None``: what is
    free (no engine beside the learner, or one asleep: the process's
    :class:`ub.run.processes.worker.Worker` then drops the share). It sizes
    ``micro_batch_tokens: auto`` and the longest row the learner trains (:mod:`ub.learner.memory`).
    """

    base_model: str = Field("", validate_default=True, description="A local model directory or "
                            "a hub id; checkpoints record its path and a fingerprint of its "
                            "config.json, and refuse to load on another model.")
    device_share: float | None = Field(None, ge=0, le=1, description="The fraction of its GPU's "
                                       "memory the learner may use beside an awake vLLM engine "
                                       "in its process; null: what is free.")
    # The section's three run-given settings, narrowed to never null (declared, described and
    # bounded in LearnerSection; _run_given fills them before validation). The defaults are
    # run_given()'s, named for the type checker: a value left out never reaches them.
    seed: Seed = run_given()["seed"]
    temperature: Temperature = run_given()["temperature"]
    length_normalizer: LengthNormalizer = run_given()["length_normalizer"]

    @model_validator(mode="before")
    @classmethod
    def _run_given(cls, data: Any) -> Any:
        # null means "the run's", and without a run that is a default run's.
        return with_run_given(data, run_given()) if isinstance(data, Mapping) else data

    @field_validator("base_model")
    @classmethod
    def _base_model_given(cls, value: str) -> str:
        if not value:
            raise ValueError("is not set: give a model directory or hub id")
        return value
