"""What decides a tiny-model build: :class:`TinyModelConfig` and :data:`RECIPE_VERSION` (both in
the cache key, with the seed and the textarena version)."""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import Field, field_validator, model_validator

from ub.model.builder import Qwen3Shape
from ub.model.transcripts import DEFAULT_ENV_IDS, check_transcript_env
from ub.settings import Section

# Bump whenever the recipe changes what gets built (code, not config): it is part of the cache
# key, so old cached models are never mistaken for new ones.
RECIPE_VERSION = 2


class TinyModelConfig(Section):
    """Everything that decides what `ub model tiny` builds (all of it is in the cache key).

    Each setting is one ``ub model tiny --set NAME=VALUE`` (the value read as YAML, as every
    ``--set`` is; ``env_ids`` also takes comma-separated ids). A build with settings of its own
    has its own cache key; train on it with ``model.base=DIR`` (``model.base: tiny`` is always
    the default). A number is checked against what it feeds (the model's shape, AdamW, the
    schedule, the check), so a bad one is refused here and not minutes into a build.
    """

    # --- data ---
    env_ids: tuple[str, ...] = Field(
        DEFAULT_ENV_IDS, min_length=1, description="TextArena ids whose random-play "
        "transcripts the model is pre-trained on (comma-separated on the command line).")
    positions_per_env: int = Field(2000, ge=1, description="Decisions taken from each game's "
                                   "transcripts (the training set is this times the games).")

    # --- tokenizer ---
    # (the default games' text runs out of merges first, ~1.3k tokens, so this only bites with
    # many more games)
    vocab_size: int = Field(4096, ge=1, description="Upper bound for the BPE vocabulary.")

    # --- model (its Qwen3 shape: :attr:`shape`) ---
    hidden_size: int = Field(256, ge=1, description="Width of the residual stream "
                             "(num_heads * head_dim).")
    # (4, with intermediate_size 768 and 1400 steps, until issue 42: twice the CPU time, and it
    # learned TicTacToe no better and Nim worse; docs/learning-log.md)
    num_layers: int = Field(3, ge=1, description="Transformer blocks.")
    num_heads: int = Field(4, ge=1, description="Query heads per block.")
    num_kv_heads: int = Field(2, ge=1, description="Key/value heads per block (grouped-query "
                              "attention, as in Qwen3; num_heads is a multiple of it).")
    head_dim: int = Field(64, ge=1, description="Width of each attention head.")
    intermediate_size: int = Field(384, ge=1, description="Width of the SwiGLU MLP.")
    max_position_embeddings: int = Field(2048, ge=1, description="Longest sequence the model "
                                         "is configured for (prompts here are ~50-150 tokens).")
    rope_theta: float = Field(10_000.0, gt=0, description="RoPE base (1e4 suits a 2k context; "
                              "Qwen3's 1e6 is for 32k+).")

    # --- pre-training ---
    # train_steps: ~0.14 s each on 2 AMD EPYC AVX2 cores at the default sizes (2m15s). The
    # 4-layer model of before needed 1400 for 100% greedy legal moves on 1,000 fresh TicTacToe
    # positions (98.5% after 1000); this one is checked by test_default_model_plays_legal_moves
    # (docs/learning-log.md).
    train_steps: int = Field(1000, ge=1, description="Optimizer steps of pre-training.")
    # (small batches and more steps learned faster per CPU second than 2k or 4k-token batches)
    batch_tokens: int = Field(1024, ge=1, description="Token budget per batch, padding "
                              "included (batches are bucketed by length).")
    learning_rate: float = Field(3e-3, gt=0, description="Peak AdamW learning rate (after "
                                 "warm-up; cosine decay to min_lr_ratio of it).")
    warmup_steps: int = Field(30, ge=0, description="Linear warm-up steps.")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Final learning rate as a "
                                "fraction of the peak.")
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay (matrices only; "
                                "not norms).")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")
    # Predicting the listed moves from the board trains the same attend-and-copy skill the move
    # needs; it lifted TicTacToe/SimpleTak legality by ~10-25 points at equal compute.
    prompt_loss_weight: float = Field(0.5, ge=0, description="Weight of the plain LM loss on "
                                      "prompt tokens, relative to the completion loss.")
    num_threads: int = Field(2, ge=1, description="Torch CPU threads (fixed: float sums, and "
                             "so the bytes, depend on it).")

    # --- legality check after training ---
    eval_positions_per_env: int = Field(100, ge=0, description="Fresh positions per game for "
                                        "the greedy and the sampled legality check (0 skips "
                                        "it).")
    eval_max_new_tokens: int = Field(12, ge=1, description="Generation budget per move in the "
                                     "check (the longest move is ~6 tokens plus EOS).")

    @field_validator("env_ids", mode="before")
    @classmethod
    def _ids(cls, value: Any) -> Any:
        """Ids as a tuple: from a list (YAML) or comma-separated text (``--set``)."""
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return tuple(value) if isinstance(value, list) else value

    @model_validator(mode="after")
    def _heads_fit(self) -> TinyModelConfig:
        if self.hidden_size != self.num_heads * self.head_dim:
            # Qwen3 allows it, but vLLM's CPU attention and this recipe are only checked for it.
            raise ValueError(f"hidden_size must equal num_heads * head_dim, got "
                             f"{self.hidden_size} != {self.num_heads} * {self.head_dim}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads must be a multiple of num_kv_heads, got "
                             f"{self.num_heads} and {self.num_kv_heads}")
        return self

    def check_games(self) -> None:
        """Every game of ``env_ids`` can be played for transcripts (random legal moves, two
        seats), before a build starts (it plays them first)."""

        for env_id in self.env_ids:
            check_transcript_env(env_id)

    @property
    def shape(self) -> Qwen3Shape:
        """The model's Qwen3 shape: the settings of that name (the rest, initial weights at the
        default scale and the vocabulary rounded up to a multiple of 64, are its defaults)."""
        return Qwen3Shape(**{field.name: getattr(self, field.name)
                             for field in dataclasses.fields(Qwen3Shape)
                             if field.name in type(self).model_fields})


DEFAULT_CONFIG = TinyModelConfig()
"""The CPU default's config (what ``ub model tiny`` builds)."""
