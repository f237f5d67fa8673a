"""How a batch is cut into micro-batches.

Micro-batches (:func:`plan_micro_batches`): the rows are sorted by length, longest first, and
taken in that order while ``rows x longest row`` stays within a token budget (and the row count
within a cap). Each micro-batch is trimmed to its own longest row, so rows of similar length
share a micro-batch and little compute goes to padding.

Shapes that repeat (``learner.pad_to_multiple``): a micro-batch's width may be padded up so
that the model sees a sequence length that is a multiple of ``m`` (:func:`padded_width`, and
the plan counts the padded width against the budget). Rows are right-padded and attention is
causal, so a real token never sees the padding, and the padded positions are not scored: the
scores are the same up to float summation order.

Shared prefixes (``learner.pack_prefixes``, :mod:`ub.learner.packing`): the plan is the same,
``rows x padded width`` against the budget. That bounds the rows' layout, which the packed
hidden states are gathered back into, and what the body would compute unpacked; packed, it
computes fewer positions where rows share prefixes (0.55 of them on a tiny-cpu round's
micro-batches), and at worst, where they share nothing, about twice the real tokens (packed
rows padded to the widest, plus one packed row): memory stays bounded as before, to that
factor. Grouping rows by shared prefix rather than by length would share a little more
(measured on a round's minibatches: tries 1.77x smaller than the real tokens, against 1.68x),
with widths that mix.
"""

from __future__ import annotations

import torch

AUTO_PAD_TO_MULTIPLE = 128
"""``pad_to_multiple: auto`` on CUDA: with cuDNN's attention, whose plans are per shape, the
fastest measured on an H200 (docs/scaling.md; padding 7-15% of the positions)."""


def resolve_pad_to_multiple(setting: int | str, device: torch.device) -> int:
    """The multiple ``learner.pad_to_multiple`` = ``setting`` means on ``device`` (``auto``:
    :data:`AUTO_PAD_TO_MULTIPLE` on CUDA, else 1: no padding)."""
    if setting == "auto":
        return AUTO_PAD_TO_MULTIPLE if device.type == "cuda" else 1
    assert isinstance(setting, int) and setting >= 1, setting
    return setting


def padded_width(width: int, multiple: int) -> int:
    """A micro-batch's width (tokens per row, the row's last token included) padded so that
    the model's input, one token shorter, is a multiple of ``multiple`` tokens (``1``: as
    is)."""
    if multiple <= 1 or width <= 1:
        return width
    return -(-(width - 1) // multiple) * multiple + 1


def pad_right(input_ids: torch.Tensor, scored: torch.Tensor, multiple: int
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids`` (b, L) and ``scored`` (b, L - 1) right-padded to
    :func:`padded_width` (the padding: token 0, never scored); as they are when no padding
    is due."""
    width = padded_width(input_ids.shape[1], multiple)
    extra = width - input_ids.shape[1]
    if extra <= 0:
        return input_ids, scored
    return (torch.nn.functional.pad(input_ids, (0, extra)),
            torch.nn.functional.pad(scored, (0, extra), value=False))


def plan_micro_batches(lengths: list[int], token_budget: int | None,
                       max_rows: int | None, multiple: int = 1) -> list[list[int]]:
    """Group row indices into micro-batches of similar length.

    :param lengths: real tokens of each row to plan (rows not listed are not trained on).
    :param token_budget: most ``rows x longest row`` tokens per micro-batch (padding included);
        a row longer than the budget gets a micro-batch of its own (rows are never split: the
        learner refuses, before planning, a row longer than its memory holds, and a budget
        halved after running out of memory may leave a row alone). ``None``: no token limit.
    :param max_rows: most rows per micro-batch; ``None``: no row limit.
    :param multiple: widths are counted padded to it (:func:`padded_width`).
    :returns: lists of indices into ``lengths``, longest rows first. Deterministic: ties keep
        the input order.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # stable: ties keep order
    groups: list[list[int]] = []
    current: list[int] = []
    for i in order:
        # Sorted longest first, so the group's first row sets its width.
        width = padded_width(lengths[current[0]] if current else lengths[i], multiple)
        fits_tokens = token_budget is None or (len(current) + 1) * width <= token_budget
        fits_rows = max_rows is None or len(current) < max_rows
        if current and not (fits_tokens and fits_rows):
            groups.append(current)
            current = []
        current.append(i)
    if current:
        groups.append(current)
    return groups
