"""The learner's settings: one typed, documented, JSON/YAML-able dataclass."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ub.errors import UbError, settings_from_mapping
from ub.model.lora import LoraSettings

DTYPES = ("auto", "float32", "bfloat16", "float16")
ATTENTION = ("auto", "sdpa", "eager", "flash_attention_2")


@dataclass
class LearnerConfig:
    """How the learner trains. Every field is plain data (YAML/JSON-able via :meth:`to_dict`).

    Model (fixed for the life of a :class:`~ub.learner.Learner`; a change loads a new one):

    :param base_model: the base model: a local directory or a hub id. Checkpoints record it
        (path and a fingerprint of its ``config.json``) and refuse to load on another model.
    :param dtype: base model weights: ``auto`` = bfloat16 on a GPU, float32 on the CPU. The
        LoRA weights, optimizer and logprobs are always float32.
    :param attn_implementation: ``auto`` = ``flash_attention_2`` on a GPU with a 16-bit dtype
        when the ``flash_attn`` package is installed, else ``sdpa``.
    :param device: ``auto`` = ``cuda`` if available, else ``cpu``; or a torch device string.
    :param lora: LoRA rank, alpha, dropout and target modules (:class:`LoraSettings`). Rank,
        alpha and targets must match those of the checkpoint being resumed.

    Start:

    :param init_adapter: a PEFT LoRA adapter directory to start from when there is no
        checkpoint to resume (a "game-tuned" LoRA); ``None``: a fresh adapter (PEFT's
        initialisation, B = 0, so the first policy is the base model).
    :param seed: seeds the fresh adapter and the learner's RNG streams (LoRA dropout, the
        algorithm's ``rng``); a resumed run takes the RNG state from the checkpoint instead.

    Algorithm:

    :param algorithm: a registered algorithm name (``reinforce``, ``ppo``, ...).
    :param algorithm_params: keyword arguments of the algorithm (e.g. ``{"clip_eps": 0.2}``).
    :param length_normalizer: ``L`` of the Dr. GRPO normalizer ``B * L``: a constant, usually
        the rollout's ``max_tokens``; it scales the loss (so the effective learning rate) but
        never depends on a sequence's length.
    :param temperature: the sampling temperature of the rollouts: the learner scores tokens
        with ``log_softmax(logits / temperature)``, the distribution they were sampled from, so
        that importance ratios are 1 on on-policy data. (Top-p is not modelled: use top_p 1.)

    Optimizer (AdamW, constant learning rate):

    :param learning_rate: AdamW step size.
    :param weight_decay: AdamW decoupled weight decay on the LoRA weights.
    :param betas: AdamW moment decay rates.
    :param adam_eps: AdamW denominator epsilon.
    :param max_grad_norm: clip the global gradient norm to this (``None``: no clipping). The
        norm before clipping is reported as ``grad_norm``.
    :param minibatches: optimizer steps per pass over an update's batch: the batch is shuffled
        (by the learner's saved RNG) and cut into this many near-equal minibatches. With more
        than one, later steps are off-policy: use ``ppo``, whose ratio corrects for it.
    :param epochs: passes over the batch per update; an update makes ``minibatches * epochs``
        optimizer steps and writes one checkpoint.
    :param warmup_steps: optimizer steps over which the learning rate rises linearly to
        ``learning_rate`` (counted from the cold start, so a resumed run continues the ramp).
        Adam's first steps move every weight by about the learning rate whatever the gradient's
        size (``m / sqrt(v)`` is +-1 on step one), so a fresh adapter's first steps at full rate
        are mostly noise; 0: no warm-up.

    Compute:

    :param micro_batch_tokens: most tokens per micro-batch, padding included (rows x longest
        row); bounds activation memory (and more, smaller micro-batches waste less on
        padding; on a CPU 2048-4096 is also the fastest, as tensors stay in cache). ``None``:
        no token limit.
    :param micro_batch_size: most rows per micro-batch; ``None``: no row limit.
    :param gradient_checkpointing: recompute activations in the backward pass (less memory,
        about a third more compute).
    :param num_threads: torch CPU threads; ``None`` leaves torch's setting. (In a process that
        also runs an in-process vLLM engine, vLLM pins the threads and ignores this.)
    """

    base_model: str = ""
    dtype: str = "auto"
    attn_implementation: str = "auto"
    device: str = "auto"
    lora: LoraSettings = field(default_factory=LoraSettings)

    init_adapter: str | None = None
    seed: int = 0

    algorithm: str = "reinforce"
    algorithm_params: dict[str, Any] = field(default_factory=dict)
    length_normalizer: int = 32
    temperature: float = 1.0

    learning_rate: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    max_grad_norm: float | None = 0.2
    minibatches: int = 1
    epochs: int = 1
    warmup_steps: int = 0

    micro_batch_tokens: int | None = 4096
    micro_batch_size: int | None = None
    gradient_checkpointing: bool = False
    num_threads: int | None = None

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
        """A validated config from a mapping (unknown keys are an error)."""
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
        _positive_int("length_normalizer", self.length_normalizer)
        _positive_number("temperature", self.temperature)
        _positive_number("learning_rate", self.learning_rate)
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise UbError(f"weight_decay must be >= 0, got {self.weight_decay!r}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise UbError(f"betas must be two numbers in [0, 1), got {list(self.betas)!r}")
        _positive_number("adam_eps", self.adam_eps)
        if self.max_grad_norm is not None:
            _positive_number("max_grad_norm", self.max_grad_norm)
        _positive_int("minibatches", self.minibatches)
        _positive_int("epochs", self.epochs)
        if not isinstance(self.warmup_steps, int) or isinstance(self.warmup_steps, bool) \
                or self.warmup_steps < 0:
            raise UbError(f"warmup_steps must be an integer >= 0, got {self.warmup_steps!r}")
        for key in ("micro_batch_tokens", "micro_batch_size", "num_threads"):
            if getattr(self, key) is not None:
                _positive_int(key, getattr(self, key))
        if not isinstance(self.seed, int):
            raise UbError(f"seed must be an integer, got {self.seed!r}")


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


def _positive_int(key: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UbError(f"{key} must be a positive integer, got {value!r}")


def _positive_number(key: str, value: Any) -> None:
    if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise UbError(f"{key} must be a positive number, got {value!r}")
