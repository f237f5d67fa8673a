"""What goes into a training batch: :class:`BatchConfig`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from ub.data.schema import int_column_range
from ub.errors import UbError, settings_from_mapping
from ub.rewards import InvalidMovePenalty, RewardTransforms
from ub.run.sections import BatchSection, check_types, default_of, renamed_keys


def _schema(name: str) -> Callable[[], Any]:
    """The default of the schema's field ``name``, as a dataclass default factory."""
    return lambda: default_of(BatchSection, name)


@dataclass(frozen=True)
class BatchConfig:
    """What goes into a training batch. Every field is plain data (YAML/JSON-able); the reward
    transforms its ``final``, ``step`` and ``sampling`` entries name are built once, as
    :attr:`transforms` (frozen, so that they always match the entries).

    The fields, their defaults and meanings are :class:`ub.run.sections.BatchSection`'s (listed
    in docs/config.md). Notes beyond the one line there:

    - ``drop_zero_reward`` drops on the reward *before* the sampling stage: a decision it keeps
      may still get a zero advantage after a mean-centering sampling transform.
    - ``max_train_len`` is the original UnstableBaselines rule: longer sequences are truncated
      (the completion first) and counted in the stats.
    - ``seed``: the sample is the ``batch_size`` rows with the smallest
      ``md5(f"{seed}/{game_key}/{turn}")`` (``game_key``: the game id less the run name it
      begins with, so the sample depends on the seed, never on the run's name): pass a
      different seed per round (e.g. ``derive_seed(run_seed, round, "batch")``), or
      overlapping windows re-pick the same rows.
    """

    batch_size: int = field(default_factory=_schema("batch_size"))
    first_round: int | None = field(default_factory=_schema("first_round"))
    last_round: int | None = field(default_factory=_schema("last_round"))
    actors: list[str] | None = field(default_factory=_schema("actors"))
    checkpoints: list[str] | None = field(default_factory=_schema("checkpoints"))
    final: list[str | dict[str, Any]] = field(default_factory=_schema("final"))
    step: list[str | dict[str, Any]] = field(default_factory=_schema("step"))
    sampling: list[str | dict[str, Any]] = field(default_factory=_schema("sampling"))
    drop_zero_reward: bool = field(default_factory=_schema("drop_zero_reward"))
    max_train_len: int | None = field(default_factory=_schema("max_train_len"))
    seed: int = field(default_factory=_schema("seed"))
    pad_token_id: int = field(default_factory=_schema("pad_token_id"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BatchConfig:
        """A validated config from a mapping (unknown keys are an error; a renamed key is read
        under its new name, with a log line)."""
        try:
            data = renamed_keys(dict(data), "batch")
        except ValueError as exc:
            raise UbError(str(exc)) from None
        check_types(BatchSection, data, "batch")
        return settings_from_mapping(cls, data, "batch")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @cached_property
    def transforms(self) -> RewardTransforms:
        """The reward transforms of the three stages, built from the entries on first use and
        kept: what the final stage folds and the batch query's SQL is made of."""
        return RewardTransforms.build(self.final, self.step, self.sampling)

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
        largest = int_column_range("steps", "prompt_token_ids")[1]
        if self.pad_token_id > largest:  # (it pads the stored token ids)
            raise UbError(f"pad_token_id must be a token id (<= {largest}, what the data's "
                          f"token columns hold), got {self.pad_token_id}")
        steps = [t.config_name() for t in self.transforms.step]
        if InvalidMovePenalty.name in steps[:-1]:
            raise UbError(f"step transforms {steps}: list {InvalidMovePenalty.name} last, so "
                          "that no later transform lifts an invalid move above a valid one")

