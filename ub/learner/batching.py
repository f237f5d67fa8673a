"""How a batch is cut into micro-batches.

Micro-batches (:func:`plan_micro_batches`): the rows are sorted by length, longest first, and
taken in that order while ``rows x longest row`` stays within a token budget (and the row count
within a cap). Each micro-batch is trimmed to its own longest row, so rows of similar length
share a micro-batch and little compute goes to padding.
"""

from __future__ import annotations


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
