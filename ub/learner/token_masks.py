"""The legal-move mask on the learner's side: per scored token, the tokens that were allowed
when it was sampled, so that the learner's logprob is the log-softmax over those tokens, the
distribution the engine sampled from (:mod:`ub.games.move_mask`, :mod:`ub.inference.move_mask`).

A micro-batch's masks are built once per forward (:func:`token_masks`) by walking each masked
row's constraint over its completion tokens, exactly as the engine walked it while sampling;
the output layer asks for them a chunk of tokens at a time (:meth:`TokenMasks.allowed`) as a
``(tokens x vocabulary)`` boolean, so no mask of the whole micro-batch is ever materialized.
Rows sampled free get no mask, and a micro-batch with none scores exactly as without masks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ub.errors import UbError
from ub.games.move_mask import MoveConstraint

if TYPE_CHECKING:
    from ub.batch import Batch


@dataclass
class TokenMasks:
    """What was allowed at each scored token of a micro-batch (flattened in row-major order,
    as :meth:`ub.learner.policy.Policy.score` flattens them).

    Attributes:
        offsets: (N + 1,) a token ``i`` allowed only ``ids[offsets[i]:offsets[i + 1]]`` (none:
            not that kind of step).
        ids: (M,) those token ids.
        free: (N,) for a step of text before a move, the row of ``banned`` that applies; -1
            otherwise.
        banned: (R, V) the tokens each free-text constraint excludes (``None``: no such step).
    """

    offsets: torch.Tensor
    ids: torch.Tensor
    free: torch.Tensor
    banned: torch.Tensor | None

    def allowed(self, start: int, end: int, vocab_size: int) -> torch.Tensor | None:
        """(end - start, vocab) bool of the tokens allowed at scored tokens ``start:end``;
        ``None`` where all of them were free to be anything."""
        counts = self.offsets[start + 1:end + 1] - self.offsets[start:end]
        free = self.free[start:end]
        only, in_text = counts > 0, free >= 0
        if not (bool(only.any()) or bool(in_text.any())):
            return None
        n = end - start
        out = torch.ones(n, vocab_size, dtype=torch.bool, device=self.ids.device)
        if self.banned is not None and bool(in_text.any()):
            out[in_text] = ~self.banned[free[in_text]]
        out[only] = False
        rows = torch.repeat_interleave(torch.arange(n, device=out.device), counts)
        out[rows, self.ids[self.offsets[start]:self.offsets[end]]] = True
        return out


def token_masks(batch: Batch, scored: torch.Tensor, vocab_size: int,
                constraint_of: Callable[[str, tuple[str, ...]], MoveConstraint],
                device: torch.device) -> TokenMasks | None:
    """The masks of ``batch``'s scored tokens (``scored``: (b, L - 1), position ``j`` scores
    token ``j + 1``); ``None`` when no row was sampled under the mask.

    ``constraint_of(template, legal_moves)`` gives a row's constraint (the learner's tokenizer
    builds it as the engine's did).

    :raises UbError: a row's tokens were not allowed by its constraint (the data and the
        tokenizer disagree).
    """
    if batch.masked_moves is None or not any(batch.masked_moves):
        return None
    scored = scored.cpu()
    targets = batch.input_ids[:, 1:]
    offsets: list[int] = [0]  # (CSR of the allow-lists, one entry per scored token)
    ids: list[int] = []
    free: list[int] = []
    banned_rows: dict[MoveConstraint, int] = {}
    for row, moves in enumerate(batch.masked_moves):
        tokens = targets[row][scored[row]].tolist()
        if moves is None:
            offsets.extend([offsets[-1]] * len(tokens))
            free.extend([-1] * len(tokens))
            continue
        constraint = constraint_of(*moves)
        try:
            steps = constraint.allowed_steps(tokens)
        except ValueError as exc:
            raise UbError(f"batch row {row} was sampled under the legal-move mask, but its "
                          f"tokens break it ({exc}): was the data sampled by another "
                          "tokenizer than the learner's base model's?") from None
        for allowed in steps:
            if allowed is None:
                free.append(banned_rows.setdefault(constraint, len(banned_rows)))
                offsets.append(offsets[-1])
            else:
                free.append(-1)
                ids.extend(allowed)
                offsets.append(offsets[-1] + len(allowed))
    banned = None
    if banned_rows:
        banned = torch.zeros(len(banned_rows), vocab_size, dtype=torch.bool)
        for constraint, index in banned_rows.items():
            excluded = [t for t in constraint.banned if t < vocab_size]
            banned[index, excluded] = True
        banned = banned.to(device)
    return TokenMasks(torch.tensor(offsets, dtype=torch.long, device=device),
                      torch.tensor(ids, dtype=torch.long, device=device),
                      torch.tensor(free, dtype=torch.long, device=device), banned)
