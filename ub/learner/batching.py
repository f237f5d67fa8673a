"""What the learner trains on, and how a batch is cut into micro-batches.

A :class:`TrainBatch` is the tensor part of :class:`ub.batch.Batch`: right-padded token ids of
prompt + completion exactly as sampled, a mask of the completion tokens, the sampler's logprob of
each completion token, and one advantage per sequence.

Micro-batches (:func:`plan_micro_batches`): the rows are sorted by length, longest first, and
taken in that order while ``rows x longest row`` stays within a token budget (and the row count
within a cap). Each micro-batch is trimmed to its own longest row, so rows of similar length
share a micro-batch and little compute goes to padding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ub.errors import UbError


@dataclass
class TrainBatch:
    """Training tensors (``B`` rows, ``T`` columns, right-padded).

    :param input_ids: (B, T) int64, prompt then completion token ids, then padding.
    :param completion_mask: (B, T) float, 1 on completion tokens (the only ones trained on).
    :param behaviour_logprobs: (B, T) float, at a completion position ``t`` the sampler's
        logprob of token ``input_ids[b, t]``; 0 elsewhere.
    :param advantages: (B,) float, one per sequence.
    :param lengths: (B,) int64, real (non-padding) tokens per row.
    :param old_logprobs: (B, T) float or ``None``: like ``behaviour_logprobs``, the learner's
        own logprobs at the weights an update of several steps started from (the learner
        fills them in; the algorithms' importance weights and trust region use them).
    """

    input_ids: torch.Tensor
    completion_mask: torch.Tensor
    behaviour_logprobs: torch.Tensor
    advantages: torch.Tensor
    lengths: torch.Tensor
    old_logprobs: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @classmethod
    def from_batch(cls, batch: Any) -> TrainBatch:
        """The tensors of a :class:`ub.batch.Batch` (or any object with the same fields)."""
        if isinstance(batch, TrainBatch):
            return batch
        return cls(input_ids=batch.input_ids, completion_mask=batch.completion_mask,
                   behaviour_logprobs=batch.behaviour_logprobs, advantages=batch.advantages,
                   lengths=batch.lengths)

    def validate(self) -> None:
        """Raise :class:`UbError` for an empty batch or tensors of inconsistent shapes."""
        rows = len(self)
        if rows == 0:
            raise UbError("the training batch is empty: there are no decisions to train on")
        shape = tuple(self.input_ids.shape)
        for name in ("completion_mask", "behaviour_logprobs"):
            if tuple(getattr(self, name).shape) != shape:
                raise UbError(f"batch {name} has shape {tuple(getattr(self, name).shape)}, "
                              f"input_ids has {shape}: the batch is inconsistent")
        for name in ("advantages", "lengths"):
            if tuple(getattr(self, name).shape) != (rows,):
                raise UbError(f"batch {name} has shape {tuple(getattr(self, name).shape)}, "
                              f"expected ({rows},): one value per row")
        if float(self.completion_mask.sum()) == 0:
            raise UbError(f"the training batch ({rows} rows) has no completion tokens: every "
                          "completion was cut by max_train_len? raise it")
        if bool(self.completion_mask[:, 0].any()):
            # Token t is scored by the logits at t - 1: a completion needs a prompt before it.
            raise UbError("a batch row starts with a completion token: every row needs at "
                          "least one prompt token")

    def select(self, rows: list[int]) -> TrainBatch:
        """The given rows, in that order, trimmed to their longest row."""
        index = torch.tensor(rows, dtype=torch.int64)
        width = int(self.lengths[index].max())
        return TrainBatch(
            input_ids=self.input_ids[index, :width],
            completion_mask=self.completion_mask[index, :width],
            behaviour_logprobs=self.behaviour_logprobs[index, :width],
            advantages=self.advantages[index],
            lengths=self.lengths[index],
            old_logprobs=None if self.old_logprobs is None else self.old_logprobs[index, :width],
        )


def plan_micro_batches(lengths: list[int], token_budget: int | None,
                       max_rows: int | None) -> list[list[int]]:
    """Group row indices into micro-batches of similar length.

    :param lengths: real tokens of each row to plan (rows not listed are not trained on).
    :param token_budget: most ``rows x longest row`` tokens per micro-batch (padding included);
        a row longer than the budget gets a micro-batch of its own (rows are never split: the
        learner refuses, before planning, a row longer than its memory holds, and a budget
        halved after running out of memory may leave a row alone). ``None``: no token limit.
    :param max_rows: most rows per micro-batch; ``None``: no row limit.
    :returns: lists of indices into ``lengths``, longest rows first. Deterministic: ties keep
        the input order.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # stable: ties keep order
    groups: list[list[int]] = []
    current: list[int] = []
    for i in order:
        # Sorted longest first, so the group's first row sets its width.
        width = lengths[current[0]] if current else lengths[i]
        fits_tokens = token_budget is None or (len(current) + 1) * width <= token_budget
        fits_rows = max_rows is None or len(current) < max_rows
        if current and not (fits_tokens and fits_rows):
            groups.append(current)
            current = []
        current.append(i)
    if current:
        groups.append(current)
    return groups
