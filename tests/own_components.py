"""A user's own algorithm, reward transforms and position key, outside the ub package: a config
names them by import path (``own_components:AsymmetricClip``), with this folder on
``PYTHONPATH``. None of them is registered: the path alone finds them
(tests/test_own_components.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ub.learner import Algorithm, TokenBatch
from ub.rewards import FinalTransform, SeatRows, StepTransform, sql_float


class AsymmetricClip(Algorithm):
    """PPO's clipped surrogate with DAPO's decoupled range: the ratio to the learner at the
    update's start is clipped to ``[1 - clip_low, 1 + clip_high]``; ``clip_high > clip_low``
    lets a token with a positive advantage that was unlikely grow faster ("clip higher")."""

    needs_old_logprobs = True

    def __init__(self, clip_low: float = 0.2, clip_high: float = 0.28) -> None:
        if not 0 < clip_low < 1 or not clip_high > 0:
            raise ValueError(f"need 0 < clip_low < 1 and clip_high > 0, got {clip_low}, "
                             f"{clip_high}")
        self.clip_low = clip_low
        self.clip_high = clip_high

    def loss(self, tokens: TokenBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        ratio = (tokens.logprobs - tokens.old()).exp()
        clipped = ratio.clamp(1 - self.clip_low, 1 + self.clip_high) * tokens.advantages
        loss = -torch.minimum(ratio * tokens.advantages, clipped).sum() / tokens.normalizer
        with torch.no_grad():
            stats = {"clip_low_fraction": (ratio < 1 - self.clip_low).float().sum(),
                     "clip_high_fraction": (ratio > 1 + self.clip_high).float().sum()}
        return loss, stats


@dataclass
class CountedScale(FinalTransform):
    """Scale every seat's reward by ``factor``, counting the games scaled (its state)."""

    factor: float = 0.5
    games: int = field(default=0, init=False)

    def apply(self, rewards: np.ndarray, seats: SeatRows) -> np.ndarray:
        self.games += seats.num_games
        return rewards * self.factor

    def state_dict(self) -> dict[str, Any]:
        return {"games": self.games}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.games = int(state["games"])


@dataclass
class LengthPenalty(StepTransform):
    """Subtract ``cost`` per completion token."""

    cost: float = 0.001

    def sql(self, reward: str) -> str:
        return f"({reward}) - {sql_float(self.cost)} * num_completion_tokens"


def tictactoe_cells(env, seat: int) -> str:
    """A position key of one's own for TicTacToe: the nine cells only (``-`` empty), without
    the mark to move (``envs[].position`` in tests/test_own_components.py's run)."""
    return "".join(cell or "-" for row in env.state.game_state["board"] for cell in row)


def guesses_so_far(env, seat: int) -> str:
    """A position key for a game ub has none for: GuessTheNumber's guesses, in order of size
    (docs/data.md's example)."""
    return ",".join(str(n) for n in sorted(env.guessed_numbers))


class NotATransform:
    """A class that subclasses none of ub's bases: a config naming it is refused."""
