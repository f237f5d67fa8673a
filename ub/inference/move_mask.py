"""The legal-move mask inside vLLM: a logits processor that applies a request's
:class:`ub.games.move_mask.MoveConstraint` at every sampling step.

Registered on every engine ub starts (:data:`ub.inference.engine.MOVE_MASK_PROCESSOR`, by
import path, so vLLM's separate engine process loads it too); a request opts in with its
constraint in ``SamplingParams.extra_args[EXTRA_ARG]``, and any other request is left alone.
It runs before temperature and sampling (vLLM applies logits processors that can change the
argmax first), so the logprobs vLLM reports (``processed_logprobs``) are the constrained
distribution's, which is what the learner scores against. Greedy requests are constrained too.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

from ub.games.move_mask import MoveConstraint, MoveWalk

EXTRA_ARG = "ub_move_mask"
"""The key of a request's constraint (:meth:`MoveConstraint.to_args`) in its ``extra_args``."""


class _RequestMask:
    """One request's mask: its constraint walked along the request's sampled tokens, one step
    per call (:class:`MoveWalk`, as the learner walks the finished completion)."""

    def __init__(self, constraint: MoveConstraint) -> None:
        self.walk = MoveWalk(constraint)
        self.seen = 0  # output tokens already walked
        self._banned: torch.Tensor | None = None

    def __call__(self, output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        for token in output_ids[self.seen:]:
            self.walk.take(token)
        self.seen = len(output_ids)
        allowed = self.walk.allowed()
        if allowed is None:  # text before the move: everything but the banned tokens
            if self._banned is None:
                self._banned = torch.tensor(sorted(self.walk.constraint.banned),
                                            dtype=torch.long, device=logits.device)
            return logits.index_fill(0, self._banned, float("-inf"))
        keep = torch.tensor(allowed, dtype=torch.long, device=logits.device)
        out = torch.full_like(logits, float("-inf"))
        out[keep] = logits[keep]
        return out


class MoveMaskProcessor(AdapterLogitsProcessor):
    """vLLM's per-request adapter around :class:`_RequestMask`."""

    def is_argmax_invariant(self) -> bool:
        return False  # it changes the greedy choice too: run it for every request

    def new_req_logits_processor(self, params: Any) -> _RequestMask | None:
        args = (params.extra_args or {}).get(EXTRA_ARG)
        return None if args is None else _RequestMask(MoveConstraint.from_args(args))
