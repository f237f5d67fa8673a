"""The learner's settings: one typed, documented, JSON/YAML-able dataclass."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ub.errors import UbError, settings_from_mapping
from ub.inference.types import SamplingConfig
from ub.model.lora import LoraSettings
from ub.run.sections import (
    ATTENTION,
    DEFAULT_SEED,
    DTYPES,
    KERNELS,
    LearnerSection,
    check_types,
    default_of,
)


def _schema(name: str) -> Callable[[], Any]:
    """The default of the schema's field ``name``, as a dataclass default factory."""
    return lambda: default_of(LearnerSection, name)


@dataclass
class LearnerConfig:
    """How the learner trains. Every field is plain data (YAML/JSON-able via :meth:`to_dict`).

    The fields, their defaults and meanings are :class:`ub.run.sections.LearnerSection`'s (listed
    in docs/config.md), plus ``base_model``: a local directory or a hub id, which checkpoints
    record (path and a fingerprint of its ``config.json``) and refuse to load on another model.
    ``seed``, ``temperature`` and ``length_normalizer`` default to the run's defaults (``seed``,
    ``sampling.temperature``, ``sampling.max_tokens``). Notes beyond the one line there:

    - The model fields (``base_model``, ``dtype``, ``attn_implementation``, ``device``, ``lora``)
      are fixed for the life of a :class:`~ub.learner.Learner`; a change loads a new one.
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
    - ``kernels``: :mod:`ub.learner.kernels`.
    - ``target_kl`` (PPO's early stop): before each optimizer step after the first, the step's
      forward pass measures ``approx_kl`` of the current policy to the one the update started
      from (k3 over the step's completion tokens); past ``target_kl`` the update ends there,
      with the steps it took (``early_stopped`` and ``optimizer_steps`` say so).
    - ``entropy_coef``: a bonus on the policy's entropy over the whole vocabulary at each
      completion token, with its exact gradient (not the sampled-token estimate).
    """

    base_model: str = ""
    dtype: str = field(default_factory=_schema("dtype"))
    attn_implementation: str = field(default_factory=_schema("attn_implementation"))
    device: str = field(default_factory=_schema("device"))
    lora: LoraSettings = field(default_factory=LoraSettings)

    init_adapter: str | None = field(default_factory=_schema("init_adapter"))
    seed: int = DEFAULT_SEED

    algorithm: str = field(default_factory=_schema("algorithm"))
    algorithm_params: dict[str, Any] = field(default_factory=_schema("algorithm_params"))
    kl_coef: float = field(default_factory=_schema("kl_coef"))
    entropy_coef: float = field(default_factory=_schema("entropy_coef"))
    target_kl: float | None = field(default_factory=_schema("target_kl"))
    length_normalizer: int = field(
        default_factory=lambda: default_of(SamplingConfig, "max_tokens"))
    temperature: float = field(default_factory=lambda: default_of(SamplingConfig, "temperature"))

    learning_rate: float = field(default_factory=_schema("learning_rate"))
    weight_decay: float = field(default_factory=_schema("weight_decay"))
    betas: tuple[float, float] = field(default_factory=lambda: tuple(default_of(LearnerSection,
                                                                                "betas")))
    adam_eps: float = field(default_factory=_schema("adam_eps"))
    max_grad_norm: float | None = field(default_factory=_schema("max_grad_norm"))
    minibatches: int = field(default_factory=_schema("minibatches"))
    epochs: int = field(default_factory=_schema("epochs"))
    warmup_steps: int = field(default_factory=_schema("warmup_steps"))
    decay_steps: int = field(default_factory=_schema("decay_steps"))
    final_lr_fraction: float = field(default_factory=_schema("final_lr_fraction"))

    kernels: str = field(default_factory=_schema("kernels"))
    micro_batch_tokens: int | str | None = field(default_factory=_schema("micro_batch_tokens"))
    micro_batch_size: int | None = field(default_factory=_schema("micro_batch_size"))
    gradient_checkpointing: bool = field(default_factory=_schema("gradient_checkpointing"))
    num_threads: int | None = field(default_factory=_schema("num_threads"))
    device_share: float | None = None
    """The fraction of its GPU's memory the learner may use beside an awake vLLM engine in its
    process (a run sets it: ``1 - engine.gpu_memory_utilization``); ``None``: what is free (no
    engine beside it, or one asleep: the process's :class:`ub.run.worker.Worker` then drops
    the share). Sizes ``micro_batch_tokens: auto`` and the longest row it trains
    (:mod:`ub.learner.memory`)."""

    def __post_init__(self) -> None:
        # Accept the shapes YAML/JSON give: a mapping for lora, lists for tuples.
        if isinstance(self.lora, Mapping):
            self.lora = lora_from_dict(self.lora)
        self.betas = tuple(self.betas)  # type: ignore[assignment]
        self.base_model = str(self.base_model)
        if self.init_adapter is not None:
            self.init_adapter = str(self.init_adapter)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LearnerConfig:
        """A validated config from a mapping (unknown keys are an error; types are the
        schema's, strictly)."""
        check_types(LearnerSection, data, "learner")
        return settings_from_mapping(cls, data, "learner")

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["lora"] = lora_to_dict(self.lora)
        out["betas"] = list(self.betas)
        return out

    def validate(self) -> None:
        """Raise :class:`UbError` for any bad setting, before a model is loaded."""
        from ub.learner.algorithms import make_algorithm

        if not self.base_model:
            raise UbError("learner.base_model is not set: give a model directory or hub id")
        _choice("dtype", self.dtype, DTYPES)
        _choice("attn_implementation", self.attn_implementation, ATTENTION)
        _choice("kernels", self.kernels, KERNELS)
        lora = self.lora
        if not isinstance(lora.rank, int) or lora.rank < 1:
            raise UbError(f"lora.rank must be a positive integer, got {lora.rank!r}")
        if not lora.alpha > 0:
            raise UbError(f"lora.alpha must be > 0, got {lora.alpha!r}")
        if not 0 <= lora.dropout < 1:
            raise UbError(f"lora.dropout must be in [0, 1), got {lora.dropout!r}")
        if not lora.target_modules:
            raise UbError("lora.target_modules is empty: name the modules to adapt")
        make_algorithm(self.algorithm, self.algorithm_params)
        _non_negative_number("kl_coef", self.kl_coef)
        _non_negative_number("entropy_coef", self.entropy_coef)
        if self.target_kl is not None:
            _positive_number("target_kl", self.target_kl)
        _positive_int("length_normalizer", self.length_normalizer)
        _positive_number("temperature", self.temperature)
        _positive_number("learning_rate", self.learning_rate)
        _non_negative_number("weight_decay", self.weight_decay)
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise UbError(f"betas must be two numbers in [0, 1), got {list(self.betas)!r}")
        _positive_number("adam_eps", self.adam_eps)
        if self.max_grad_norm is not None:
            _positive_number("max_grad_norm", self.max_grad_norm)
        _positive_int("minibatches", self.minibatches)
        _positive_int("epochs", self.epochs)
        for key in ("warmup_steps", "decay_steps"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise UbError(f"{key} must be an integer >= 0, got {value!r}")
        if self.decay_steps and self.decay_steps <= self.warmup_steps:
            raise UbError(f"decay_steps ({self.decay_steps}) must be larger than warmup_steps "
                          f"({self.warmup_steps}): the decay starts where the warm-up ends")
        if not (isinstance(self.final_lr_fraction, int | float)
                and 0 <= self.final_lr_fraction <= 1):
            raise UbError(f"final_lr_fraction must be in [0, 1], got {self.final_lr_fraction!r}")
        if self.micro_batch_tokens not in ("auto", None):
            _positive_int("micro_batch_tokens", self.micro_batch_tokens,
                          "a positive integer, auto or null")
        for key in ("micro_batch_size", "num_threads"):
            if getattr(self, key) is not None:
                _positive_int(key, getattr(self, key))
        if self.device_share is not None and not (
                isinstance(self.device_share, int | float) and 0 <= self.device_share <= 1):
            raise UbError(f"device_share must be in [0, 1], got {self.device_share!r}")
        # (torch's generators take seeds in [-2**63, 2**64))
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) \
                or not -2**63 <= self.seed < 2**64:
            raise UbError(f"seed must be an integer in [-2**63, 2**64), got {self.seed!r}")


def lora_to_dict(lora: LoraSettings) -> dict[str, Any]:
    return {"rank": lora.rank, "alpha": lora.alpha, "dropout": lora.dropout,
            "target_modules": list(lora.target_modules)}


def lora_from_dict(data: Mapping[str, Any]) -> LoraSettings:
    names = {f.name for f in dataclasses.fields(LoraSettings)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise UbError(f"unknown lora setting(s) {', '.join(unknown)}; "
                      f"valid: {', '.join(sorted(names))}")
    values = dict(data)
    if "target_modules" in values:
        values["target_modules"] = tuple(values["target_modules"])
    return LoraSettings(**values)


def _choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise UbError(f"{key} must be one of {', '.join(choices)}, got {value!r}")


def _positive_int(key: str, value: Any, what: str = "a positive integer") -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UbError(f"{key} must be {what}, got {value!r}")


def _non_negative_number(key: str, value: Any) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) \
            or value < 0:
        raise UbError(f"{key} must be a number >= 0, got {value!r}")


def _positive_number(key: str, value: Any) -> None:
    if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise UbError(f"{key} must be a positive number, got {value!r}")
