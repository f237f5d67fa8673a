"""What sits in a seat: an :class:`Actor` takes its turn and hands back its move.

Every kind of actor is one subclass: the model (the base model, a run's checkpoint or any
adapter: :mod:`ub.actors.model`), a scripted player (:mod:`ub.actors.scripted`), a hosted LLM
endpoint (:mod:`ub.actors.hosted`), or one of your own, named in a config by its import path
(``package.module:Class``, like an algorithm) and built with that name alone. The rollout
(:mod:`ub.rollout`) only advances games and batches requests: when a seat is to move it hands
the seat's actor a :class:`Turn`, and the actor answers with a :class:`Move` at once (a
scripted player), or with a :class:`Pending` request in a :class:`Batch` that the rollout steps
with the others (the engine's, which batches every model seat's prompts; the hosted endpoints'
thread pool) until it answers with the move.

A move's credit is the game's: the rollout records every decision with its actor's name and
kind, and the rewards judge the game's outcome for each seat (docs/rewards.md).
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

if TYPE_CHECKING:
    from ub.games.loop import Game
    from ub.games.specs import GameSpec

B = TypeVar("B", bound="Batch")


class MoveFailed(Exception):
    """The actor cannot move in this game (a scripted player that raised, a prompt too long for
    the engine, a hosted seat that gave up): the game is recorded as errored with ``cause`` as
    its error, and the rollout goes on with the others."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


@dataclass
class Move:
    """An actor's answer.

    :param action: the text the game is given (``"[4]"``).
    :param format_ok: whether the answer had the move's format (the extractor found one).
    :param details: the decision's own ``steps`` columns (``template``, ``prompt``,
        ``completion``, token ids and log-probabilities, ``sampling_seed``, ...); a scripted
        move has none.
    """

    action: str
    format_ok: bool = True
    details: dict[str, Any] = field(default_factory=dict)


class Batch(ABC):
    """Requests answered later, which the rollout steps with the other batches."""

    computes: ClassVar[bool] = False
    """``True``: :meth:`collect` does the work itself (an engine step), so the rollout never
    waits on another batch while this one has requests."""

    @property
    @abstractmethod
    def waiting(self) -> int:
        """How many requests are not answered yet."""

    @abstractmethod
    def collect(self, block: bool) -> list[tuple[str, Move | MoveFailed]]:
        """The requests answered since the last call, by request id, in the order they are to
        be applied (``block``: wait for at least one)."""

    def close(self) -> None:  # noqa: B027  (a batch with nothing to free keeps this)
        """Drop what is still waiting and free what the batch holds (the rollout ends)."""


@dataclass(frozen=True)
class Pending:
    """A move asked of ``batch`` as ``request_id``: the rollout applies its answer."""

    batch: Batch
    request_id: str


class RolloutContext(Protocol):
    """What the rollout lends an actor for its turns."""

    def batch(self, key: str, make: Callable[[], B]) -> B:
        """The rollout's batch under ``key``, made by ``make`` the first time: actors of one
        kind share one (all hosted seats share the hosted endpoints' thread pool)."""
        ...

    def model_turn(self, turn: Turn, adapter: str | None) -> Pending:
        """Ask the rollout's engine for ``turn``'s move from the base model with the LoRA
        adapter at ``adapter`` (``None``: no adapter), batched with every other model seat's.

        :raises MoveFailed: the prompt does not fit the engine's context, or the position has
            no legal move to mask to.
        """
        ...


@dataclass
class Turn:
    """A seat to move: what its actor sees and may use.

    :param game: the game (its ``observation``, ``legal_moves``, ``env``, ``turn`` and
        ``current_seat``); an actor reads it and never plays on it (the rollout applies the move).
    :param seed: the decision's sampling seed (from the run's seed, the game and the turn).
    :param seat_seed: the seat's seed in this game: what a player's randomness draws from
        (:attr:`rng`), so that a game replays whatever else the rollout does.
    :param memory: what the actor keeps between its turns in this game (a branch copy starts
        with none).
    :param rollout: the rollout's engine and batches (:class:`RolloutContext`).
    """

    game: Game
    seed: int
    seat_seed: int
    memory: dict[str, Any]
    rollout: RolloutContext

    @property
    def spec(self) -> GameSpec:
        """The game's spec: its env, template, extractor and ``legal_moves`` mode."""
        return self.game.spec

    @property
    def request_id(self) -> str:
        """The id of a request for this turn's move, unique within a rollout."""
        return f"{self.game.game_id}-t{self.game.turn}"

    @property
    def rng(self) -> random.Random:
        """The seat's own random generator in this game, seeded with :attr:`seat_seed` (never
        Python's global one, which TextArena's games deal their cards from)."""
        if "rng" not in self.memory:
            self.memory["rng"] = random.Random(self.seat_seed)
        return self.memory["rng"]


class Actor(ABC):
    """Whatever sits in a seat. A subclass is a new kind of seat; ub builds it from its name
    alone (``Class(name)``), where configs and the CLI name it (``opponents``,
    ``eval.opponents``, ``ub play --players``); an actor of one's own is named by its import
    path, ``package.module:Class``.

    :param name: the name as written, stored with every decision (``steps.actor``).
    """

    kind: ClassVar[str] = "own"
    """Stored in ``steps.actor_kind``: ``model``, ``scripted``, ``hosted``, or ``own``."""
    needs_engine: ClassVar[bool] = False
    """Whether the actor asks the rollout's engine for its moves
    (:meth:`RolloutContext.model_turn`): a rollout seating it needs one."""

    plays_offline: ClassVar[bool] = True
    """Whether the actor moves with neither the engine nor the network: an evaluation against
    such opponents alone also plays the random player in the checkpoint's seats, the bar to
    clear (:func:`ub.evaluation.random_baseline`)."""

    def __init__(self, name: str) -> None:
        self.name = name

    @property
    def adapter(self) -> str | None:
        """The LoRA adapter folder the actor plays with (model seats only)."""
        return None

    @property
    def checkpoint(self) -> str | None:
        """A short label of the model the actor plays, stored in ``steps.checkpoint``."""
        return None

    def check_game(self, env_id: str) -> None:  # noqa: B027  (most actors play any game)
        """Raise :class:`ub.errors.UbError` (one line: what to choose instead) unless the actor
        can play ``env_id`` (checked before a run, an evaluation or ``ub play`` starts)."""

    def check_ready(self) -> None:  # noqa: B027  (most need nothing outside)
        """Raise :class:`ub.errors.UbError` unless the actor can play now (an endpoint that
        answers, its key set): checked before any game starts."""

    def environment_variables(self) -> list[str]:
        """The environment variables the actor reads where its games run (a hosted endpoint's
        key): a Ray worker is sent them."""
        return []

    @abstractmethod
    def take_turn(self, turn: Turn) -> Move | Pending:
        """The actor's move in ``turn``, or the request that will answer it.

        :raises MoveFailed: the actor cannot move in this game (the game is recorded as
            errored; any other exception stops the rollout).
        """

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Actor) and type(other) is type(self)
                and other.name == self.name and other.adapter == self.adapter)

    def __hash__(self) -> int:
        return hash((type(self), self.name, self.adapter))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"
