"""What decides a tiny-model build: :class:`TinyModelConfig` and :data:`RECIPE_VERSION` (both in
the cache key, with the seed and the textarena version)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ub.errors import UbError
from ub.model.builder import Qwen3Shape
from ub.model.transcripts import DEFAULT_ENV_IDS
from ub.numbers import NumberError, parse_float, parse_int

# Bump whenever the recipe changes what gets built (code, not config): it is part of the cache
# key, so old cached models are never mistaken for new ones.
RECIPE_VERSION = 2


@dataclass(frozen=True)
class TinyModelConfig:
    """Everything that decides what `ub model tiny` builds (all of it is in the cache key)."""

    # --- data ---
    env_ids: tuple[str, ...] = DEFAULT_ENV_IDS
    """TextArena ids whose random-play transcripts the model is pre-trained on."""
    positions_per_env: int = 2000
    """Decisions taken from each game's transcripts (training set size is this times #envs)."""

    # --- tokenizer ---
    vocab_size: int = 4096
    """Upper bound for the BPE vocabulary; the default games' text runs out of merges first
    (~1.3k tokens), so this only bites with many more games."""

    # --- model (Qwen3 shape) ---
    hidden_size: int = 256
    """Width of the residual stream."""
    num_layers: int = 3
    """Transformer blocks (4, with ``intermediate_size`` 768 and 1400 steps, until issue 42:
    twice the CPU time, and it learned TicTacToe no better and Nim worse; docs/learning.md)."""
    num_heads: int = 4
    """Query heads per block."""
    num_kv_heads: int = 2
    """Key/value heads per block (grouped-query attention, as in Qwen3)."""
    head_dim: int = 64
    """Width of each attention head."""
    intermediate_size: int = 384
    """Width of the SwiGLU MLP."""
    max_position_embeddings: int = 2048
    """Longest sequence the model is configured for (prompts here are ~50-150 tokens)."""
    rope_theta: float = 10_000.0
    """RoPE base; 1e4 suits a 2k context (Qwen3's 1e6 is for 32k+)."""

    # --- pre-training ---
    train_steps: int = 1000
    """Optimizer steps (~0.14 s each on 2 AMD EPYC AVX2 cores at the default sizes: 2m15s).
    The 4-layer model of before needed 1400 for 100% greedy legal moves on 1,000 fresh
    TicTacToe positions (98.5% after 1000); this one is checked by
    ``test_default_model_plays_legal_moves`` (docs/learning.md)."""
    batch_tokens: int = 1024
    """Token budget per batch, padding included (batches are bucketed by length). Small batches
    and more steps learned faster per CPU second than 2k or 4k-token batches."""
    learning_rate: float = 3e-3
    """Peak AdamW learning rate (after warm-up; cosine decay to ``min_lr_ratio`` of it)."""
    warmup_steps: int = 30
    """Linear warm-up steps."""
    min_lr_ratio: float = 0.1
    """Final learning rate as a fraction of the peak."""
    weight_decay: float = 0.01
    """AdamW weight decay (matrices only; not norms)."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm."""
    prompt_loss_weight: float = 0.5
    """Weight of the plain LM loss on prompt tokens, relative to the completion loss. Predicting
    the listed moves from the board trains the same attend-and-copy skill the move needs; it
    lifted TicTacToe/SimpleTak legality by ~10-25 points at equal compute."""
    num_threads: int = 2
    """Torch CPU threads; fixed because float sums (and so the bytes) depend on it."""

    # --- legality check after training ---
    eval_positions_per_env: int = 100
    """Fresh positions per game for the greedy and the sampled legality check (0 skips it)."""
    eval_max_new_tokens: int = 12
    """Generation budget per move in the check (the longest move is ~6 tokens plus EOS)."""

    def __post_init__(self) -> None:
        if not self.env_ids:
            raise UbError("TinyModelConfig.env_ids is empty: name at least one game")
        # Each number against what it feeds (the model's shape, AdamW, the schedule, the
        # check), so a bad one is refused here and not as a traceback minutes into a build.
        for names, low, above in ((_SIZES, 1, False), (_COUNTS, 0, False),
                                  (_POSITIVE, 0.0, True), (_NON_NEGATIVE, 0.0, False)):
            for name in names:
                value = getattr(self, name)
                if not math.isfinite(value) or value < low or (above and value == low):
                    raise UbError(f"TinyModelConfig.{name} must be {'>' if above else '>='} "
                                  f"{low}, got {value}")
        if self.min_lr_ratio > 1:
            raise UbError(f"TinyModelConfig.min_lr_ratio must be <= 1, got {self.min_lr_ratio}")
        if self.hidden_size != self.num_heads * self.head_dim:
            # Qwen3 allows it, but vLLM's CPU attention and this recipe are only checked for it.
            raise UbError("TinyModelConfig: hidden_size must equal num_heads * head_dim")
        if self.num_heads % self.num_kv_heads:
            raise UbError("TinyModelConfig: num_heads must be a multiple of num_kv_heads")

    def check_games(self) -> None:
        """Every game of ``env_ids`` can be played for transcripts (random legal moves, two
        seats), before a build starts (it plays them first)."""
        from ub.model.transcripts import check_transcript_env

        for env_id in self.env_ids:
            check_transcript_env(env_id)

    @property
    def shape(self) -> Qwen3Shape:
        """The model's Qwen3 shape (initial weights at the default scale, vocabulary rounded up
        to a multiple of 64)."""
        return Qwen3Shape(
            hidden_size=self.hidden_size,
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            intermediate_size=self.intermediate_size,
            max_position_embeddings=self.max_position_embeddings,
            rope_theta=self.rope_theta,
        )


_SIZES = ("positions_per_env", "vocab_size", "hidden_size", "num_layers", "num_heads",
          "num_kv_heads", "head_dim", "intermediate_size", "max_position_embeddings",
          "train_steps", "batch_tokens", "num_threads", "eval_max_new_tokens")
_COUNTS = ("warmup_steps", "eval_positions_per_env")
_POSITIVE = ("rope_theta", "learning_rate", "max_grad_norm")
_NON_NEGATIVE = ("min_lr_ratio", "weight_decay", "prompt_loss_weight")

DEFAULT_CONFIG = TinyModelConfig()
"""The CPU default's config (what ``ub model tiny`` builds)."""


def config_with_overrides(
    overrides: Sequence[str], base: TinyModelConfig = DEFAULT_CONFIG
) -> TinyModelConfig:
    """``base`` with ``name=value`` overrides (``ub model tiny --set``), each value read as its
    field's type (``env_ids``: comma-separated ids). A build with overrides has its own cache
    key; train on it with ``model.base=DIR`` (``model.base: tiny`` is always the default)."""
    changes: dict[str, Any] = {}  # each converted to its field's type
    names = [field.name for field in dataclasses.fields(TinyModelConfig)]
    for item in overrides:
        name, sep, text = (part.strip() for part in item.partition("="))
        if not sep or not name:
            raise UbError(f"--set {item!r}: expected name=value, e.g. --set num_layers=6")
        if name not in names:
            raise UbError(f"--set {item!r}: the tiny model has no setting {name!r}; settings: "
                          + ", ".join(names))
        current = getattr(base, name)
        try:
            if isinstance(current, tuple):
                changes[name] = tuple(part.strip() for part in text.split(",") if part.strip())
            else:
                changes[name] = (parse_int if isinstance(current, int) else parse_float)(text)
        except NumberError:
            kind = "a whole number" if isinstance(current, int) else "a finite number"
            raise UbError(f"--set {item!r}: {name} takes {kind} (default {current!r})") from None
    return dataclasses.replace(base, **changes)
