"""What goes into a training batch: :class:`BatchConfig`, the ``batch:`` section of a run's
config (and of ``ub batch --config``)."""

from __future__ import annotations

from functools import cached_property
from typing import Any, ClassVar, Self

from pydantic import Field, model_validator

from ub.data.schema import int_column_range
from ub.errors import UbError
from ub.numbers import first_non_finite
from ub.rewards import STAGES, InvalidMovePenalty, RewardTransforms
from ub.settings import Section, names_components

TransformSpec = str | dict[str, Any]
"""A transform's entry in the config: its name, or ``{name: ..., **params}``."""

LARGEST_TOKEN_ID = int_column_range("steps", "prompt_token_ids")[1]
"""The largest token id the data's token columns hold (what ``pad_token_id`` may be: it pads
the stored ids)."""


def _specs(*specs: TransformSpec) -> list[TransformSpec]:
    """A fresh list of transform specs (a default factory's value)."""
    return list(specs)


class BatchConfig(Section):
    """What goes into a training batch (``ub batch`` and every ``ub train`` round).

    Every field is plain data (YAML/JSON-able); the reward transforms its ``final``, ``step``
    and ``sampling`` entries name are built once, when the config is, as :attr:`transforms`
    (frozen, so that they always match the entries; :meth:`replace` builds them anew).

    Notes beyond the one line of each field (docs/config.md):

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

    key: ClassVar[str] = "batch"
    renamed: ClassVar[dict[str, str]] = {"drop_zero_advantage": "drop_zero_reward"}

    batch_size: int = Field(384, ge=1, description="Decisions to sample (fewer if the pool is "
                            "smaller).")
    first_round: int | None = Field(None, ge=0, description="First round of the window, "
                                    "inclusive; null: the first committed round (ub train: the "
                                    "round).")
    last_round: int | None = Field(None, ge=0, description="Last round of the window, "
                                   "inclusive; null: the last committed round (ub train: the "
                                   "round).")
    actors: list[str] | None = Field(None, min_length=1, description="Keep only decisions of "
                                     "these actors; null: any model.")
    checkpoints: list[str] | None = Field(None, min_length=1, description="Keep only decisions "
                                          "of these checkpoints; null: any (ub train: the "
                                          "behaviour policy's).")
    final: list[TransformSpec] = Field(
        default_factory=lambda: _specs({"name": "win_draw_loss"},
                                       {"name": "role_advantage", "ema": 0.95}),
        description="Final-stage reward transforms, in order: each a name or {name, **params}, "
                    "the name a registered transform's or package.module:Class, a dataclass "
                    "subclass of ub.rewards.FinalTransform (docs/rewards.md).",
        json_schema_extra=names_components("final"))
    step: list[TransformSpec] = Field(
        default_factory=list, description="Step-stage reward transforms (per-decision "
        "shaping), in order; your own: a subclass of ub.rewards.StepTransform.",
        json_schema_extra=names_components("step"))
    sampling: list[TransformSpec] = Field(
        default_factory=lambda: _specs({"name": "normalize_per_env"}),
        description="Sampling-stage transforms (on the sampled rows), in order; your own: a "
                    "subclass of ub.rewards.SamplingTransform.",
        json_schema_extra=names_components("sampling"))
    drop_zero_reward: bool = Field(False, description="Drop decisions whose reward after the "
                                   "final and step stages is 0 (|r| <= 1e-9) before sampling "
                                   "(old name: drop_zero_advantage).")
    max_train_len: int | None = Field(None, ge=1, description="Keep the first N tokens of "
                                      "prompt + completion; null: no limit. A row longer than "
                                      "the learner's memory holds in one micro-batch "
                                      "(learner.micro_batch_tokens auto) is refused before the "
                                      "update.")
    seed: int = Field(0, description="Sampling seed (ub train: derived from the run's seed per "
                      "round).")
    pad_token_id: int = Field(0, ge=0, le=LARGEST_TOKEN_ID, description="The id that "
                              "right-pads input_ids (a token id the data's token columns hold).")

    @cached_property
    def transforms(self) -> RewardTransforms:
        """The reward transforms of the three stages, built from the entries when the config is
        and kept: what the final stage folds and the batch query's SQL is made of. (Not a
        field: ``to_dict``, equality and the run's config.yaml leave it out.)"""
        return RewardTransforms.build(self.final, self.step, self.sampling)

    @model_validator(mode="after")
    def _window_not_empty(self) -> Self:
        if (self.first_round is not None and self.last_round is not None
                and self.first_round > self.last_round):
            raise ValueError(f"the rounds window is empty: first_round {self.first_round} > "
                             f"last_round {self.last_round}")
        return self

    @model_validator(mode="after")
    def _transforms_build(self) -> Self:
        # A parameter's nan or inf by its key (the transform's own check could not name it).
        found = first_non_finite({stage: getattr(self, stage) for stage in STAGES})
        if found:
            raise ValueError(f"{found[0]}: expected a finite number, got {found[1]}")
        # Built here, once: a bad entry is refused with the config, before any data is read.
        try:
            transforms = self.transforms
        except UbError as exc:  # the registry's words: an unknown name, parameter or value
            raise ValueError(str(exc)) from None
        steps = [t.config_name() for t in transforms.step]
        if InvalidMovePenalty.name in steps[:-1]:
            raise ValueError(f"step transforms {steps}: list {InvalidMovePenalty.name} last, so "
                             "that no later transform lifts an invalid move above a valid one")
        return self
