"""What goes into a training batch: :class:`BatchConfig`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ub.errors import UbError, settings_from_mapping
from ub.rewards import FinalRewardChain, InvalidMovePenalty, build_transforms


def _default_final() -> list[str | dict[str, Any]]:
    return [{"name": "win_draw_loss"}, {"name": "role_advantage", "ema": 0.95}]


def _default_sampling() -> list[str | dict[str, Any]]:
    return [{"name": "normalize_per_env"}]


@dataclass
class BatchConfig:
    """What goes into a training batch. Every field is plain data (YAML/JSON-able).

    :param batch_size: decisions to sample (fewer if the pool is smaller: see ``stats.size``).
    :param first_round: first round of the window, inclusive; ``None``: the first committed round.
    :param last_round: last round of the window, inclusive; ``None``: the last committed round.
    :param actors: keep only decisions whose ``steps.actor`` is one of these; ``None``: any model.
    :param checkpoints: keep only decisions whose ``steps.checkpoint`` is one of these (e.g. the
        learner's current checkpoint, for on-policy training); ``None``: any.
    :param final: final-stage transforms, in order (names or ``{"name": ..., **params}``).
    :param step: step-stage transforms (per-decision shaping), in order.
    :param sampling: sampling-stage transforms (on the sampled rows), in order.
    :param drop_zero_advantage: drop decisions whose reward after the final and step stages is
        zero (``|reward| <= 1e-9``) *before* sampling: they carry no policy gradient. Note: this
        is the pre-normalization reward; a mean-centering sampling transform is applied later.
    :param max_train_len: keep the first ``max_train_len`` tokens of prompt + completion (the
        original UnstableBaselines rule); longer sequences are truncated and counted in the stats.
        ``None``: no limit.
    :param seed: the sampling seed. The sample is the ``batch_size`` rows with the smallest
        ``md5(f"{seed}/{game_id}/{turn}")``: pass a different seed per round (e.g.
        ``derive_seed(run_seed, round, "batch")``), or overlapping windows re-pick the same rows.
    :param pad_token_id: the id that pads ``input_ids`` on the right.
    """

    batch_size: int = 384
    first_round: int | None = None
    last_round: int | None = None
    actors: list[str] | None = None
    checkpoints: list[str] | None = None
    final: list[str | dict[str, Any]] = field(default_factory=_default_final)
    step: list[str | dict[str, Any]] = field(default_factory=list)
    sampling: list[str | dict[str, Any]] = field(default_factory=_default_sampling)
    drop_zero_advantage: bool = False
    max_train_len: int | None = None
    seed: int = 0
    pad_token_id: int = 0

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BatchConfig:
        """A validated config from a mapping (unknown keys are an error)."""
        return settings_from_mapping(cls, data, "batch")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self) -> None:
        """Raise :class:`UbError` for any bad setting, before any data is read."""
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise UbError(f"batch_size must be a positive integer, got {self.batch_size!r}")
        for key in ("first_round", "last_round"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise UbError(f"{key} must be a round number >= 0 or null, got {value!r}")
        if (self.first_round is not None and self.last_round is not None
                and self.first_round > self.last_round):
            raise UbError(f"the rounds window is empty: first_round {self.first_round} > "
                          f"last_round {self.last_round}")
        if self.max_train_len is not None and (
                not isinstance(self.max_train_len, int) or self.max_train_len < 1):
            raise UbError(f"max_train_len must be a positive integer or null, "
                          f"got {self.max_train_len!r}")
        for key in ("actors", "checkpoints"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, str) or not all(
                    isinstance(v, str) for v in value) or not value):
                raise UbError(f"{key} must be a non-empty list of names or null, got {value!r}")
        if not isinstance(self.seed, int):
            raise UbError(f"seed must be an integer, got {self.seed!r}")
        if not isinstance(self.pad_token_id, int) or self.pad_token_id < 0:
            raise UbError(f"pad_token_id must be an integer >= 0, got {self.pad_token_id!r}")
        FinalRewardChain(self.final)
        steps = [t.name for t in build_transforms("step", self.step)]
        if InvalidMovePenalty.name in steps[:-1]:
            raise UbError(f"step transforms {steps}: list {InvalidMovePenalty.name} last, so "
                          "that no later transform lifts an invalid move above a valid one")
        build_transforms("sampling", self.sampling)

