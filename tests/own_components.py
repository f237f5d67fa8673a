"""A user's own algorithms, reward transforms, position key and seat, outside the ub package: a
config names them by import path (``own_components:EnvBaseline``), with this folder on
``PYTHONPATH``. None of them is registered: the path alone finds them
(tests/test_own_components.py). No file of ub knows them: ``EnvBaseline`` owns state (a module
it trains, a file of its own in each checkpoint, a statistic) only through what
``ub.learner.Algorithm`` lets it declare; ``FirstLegal`` is a kind of seat only through
``ub.actors.Actor``."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from ub.actors import Actor, Move, Turn
from ub.errors import UbError
from ub.games.legal import supports_legal_actions
from ub.learner import Algorithm, TokenBatch, Trained
from ub.learner.algorithms import PolicyView, Reduction
from ub.rewards import FinalTransform, SeatRows, StepTransform, sql_float

if TYPE_CHECKING:
    from ub.batch import Batch


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


class Baselines(torch.nn.Module):
    """One learned number per env, 0 at the start."""

    def __init__(self, envs: int) -> None:
        super().__init__()
        self.values = torch.nn.Parameter(torch.zeros(envs))


class EnvBaseline(AsymmetricClip):
    """AsymmetricClip on the return less a learned baseline per env: each env's baseline is
    trained towards its decisions' returns (mean squared error, by its own AdamW), saved in a
    file of its own in each checkpoint (``env_baseline.safetensors``); its statistic,
    ``baseline_mse``, is the baseline's squared error per row."""

    reads = ("returns",)  # each decision's reward after the final and step stages
    statistics: ClassVar[Mapping[str, Reduction]] = {"baseline_mse": "row"}  # per row

    def __init__(self, envs: Sequence[str] = (), learning_rate: float = 0.1,
                 clip_low: float = 0.2, clip_high: float = 0.28) -> None:
        super().__init__(clip_low, clip_high)
        if not envs or not learning_rate > 0:
            raise ValueError(f"need the env ids the run trains (envs) and a learning_rate > 0, "
                             f"got {envs}, {learning_rate}")
        self.envs = list(envs)
        self.learning_rate = learning_rate
        self.baselines: Baselines | None = None

    def build(self, policy: PolicyView) -> dict[str, Trained]:
        self.baselines = Baselines(len(self.envs)).to(policy.device)
        return {"env_baseline": Trained(self.baselines, learning_rate=self.learning_rate)}

    def baseline(self, batch: Batch) -> torch.Tensor:
        """Each row's env's baseline (with its gradient)."""
        assert self.baselines is not None and batch.rows is not None
        index = []
        for env in batch.rows.column("env_id").to_pylist():
            if env not in self.envs:
                raise ValueError(f"env {env} is not one of envs {self.envs}")
            index.append(self.envs.index(env))
        return self.baselines.values[torch.tensor(index, device=self.baselines.values.device)]

    def prepare(self, batch: Batch, rng: random.Random) -> Batch:
        assert batch.returns is not None
        with torch.no_grad():  # the baseline at the update's start
            return dataclasses.replace(batch, advantages=batch.returns - self.baseline(batch).cpu())

    def loss(self, tokens: TokenBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss, stats = super().loss(tokens)
        assert tokens.batch is not None and tokens.batch.returns is not None
        baseline = self.baseline(tokens.batch)
        error = (baseline - tokens.batch.returns.to(baseline.device)) ** 2
        stats["baseline_mse"] = error.detach().sum()
        return loss + error.sum() / tokens.batch_rows, stats


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


class FirstLegal(Actor):
    """A seat of one's own: plays the first legal move of every position, at once."""

    def check_game(self, env_id: str) -> None:
        if not supports_legal_actions(env_id):
            raise UbError(f"{self.name} plays the first legal move, and ub knows no legal moves "
                          f"of {env_id}")

    def take_turn(self, turn: Turn) -> Move:
        return Move(turn.game.legal_moves[0])
