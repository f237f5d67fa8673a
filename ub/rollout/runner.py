"""Batched rollouts: play many games at once, each seat's actor taking its turns.

Games advance independently. Whenever a seat is to move, its actor (:class:`ub.actors.base.Actor`)
takes the turn: a scripted player moves at once; a model seat's prompt goes to the engine, which
batches every pending request (base model and any number of LoRA adapters mixed) and returns
each completion as soon as it finishes (:mod:`ub.rollout.engine_batch`); a hosted seat's goes
to its endpoint's thread pool. The runner only advances games and steps those batches: a game
whose move came back steps and, if a batch must answer its next move, asks while the others are
still waiting. New games start as soon as others finish, up to ``concurrency`` at once, so the
engine stays full.

The result is two Arrow tables in the ``steps`` and ``games`` schemas (:mod:`ub.data.schema`):
a finished game adds :func:`ub.rollout.rows.step_rows` and :func:`ub.rollout.rows.game_row`.
:func:`play_games` plays a list of assignments with a :class:`RolloutRunner`, which holds the
rollout's state (games in flight, requests they wait on, rows so far) between batch steps.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ParamSpec, TypedDict, TypeVar

import pyarrow as pa

from ub.actors.base import Batch, Move, MoveFailed, Pending, Turn
from ub.branching import BranchConfig, Candidate, choose_points, copy_game_id, group_id
from ub.data.schema import GAMES_SCHEMA, STEPS_SCHEMA
from ub.faults import fault_point
from ub.games.loop import Game, Snapshot
from ub.rollout.assignments import GameAssignment
from ub.rollout.engine_batch import EngineBatch
from ub.rollout.rows import game_row, step_rows
from ub.seeding import derive_seed

if TYPE_CHECKING:
    from ub.inference.protocols import InferenceEngine
    from ub.inference.types import SamplingConfig

B = TypeVar("B", bound=Batch)
P = ParamSpec("P")


@dataclass
class RolloutStats:
    """Counters of one rollout, for summaries and throughput figures."""

    games: int = 0
    copies: int = 0
    """Of ``games``, the copies made at branch points (:mod:`ub.branching`)."""
    errored_games: int = 0
    decisions: int = 0
    model_decisions: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    seconds: float = 0.0
    outcomes: dict[str, int] = field(default_factory=dict)

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def games_per_second(self) -> float:
        return self.games / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Rollout:
    steps: pa.Table
    games: pa.Table
    stats: RolloutStats


@dataclass
class _Live:
    """A game in flight: its assignment, its state, what its seeds derive from
    (``seed_parts``: the run's seed, the scope and the game's index; a copy's, its parent's
    sampling seed at the point and its number), what each seat's actor keeps between its
    turns (``memory``, by seat); with branching, its state before each of the learner's
    decisions (``snapshots``, by turn), or, for a copy, its parent."""

    assignment: GameAssignment
    game: Game
    seed_parts: tuple[object, ...]
    memory: dict[int, dict[str, Any]] = field(default_factory=dict)
    snapshots: dict[int, Snapshot] = field(default_factory=dict)
    parent: str | None = None
    groups: dict[int, str] = field(default_factory=dict)  # turn -> its branch_group


@dataclass(frozen=True)
class _CopyOrder:
    """A copy to start: from ``parent``'s state at ``turn``, as copy ``copy`` of its point."""

    parent: _Live
    turn: int
    copy: int
    seed: int  # the parent's sampling seed at the point, which the copy's seeds derive from


class BranchOptions(TypedDict, total=False):
    """:class:`RolloutRunner`'s branching parameters, as one round passes them together
    (:func:`ub.run.steps.play.round_branching`; empty: branching off)."""

    branch: BranchConfig
    learner: str
    spread: dict[str, dict[str, float]]


class RolloutRunner:
    """One batched rollout: :meth:`play` plays every assignment, once.

    :param assignments: the games, started in this order.
    :param engine: a :class:`ub.inference.VLLMEngine`; needed only if a model sits in some seat.
    :param run: the run name stored in every row.
    :param round_: the round number stored in every row and mixed into every sampling seed.
    :param shard: the shard index stored in every row.
    :param base_seed: the run seed; sampling and scripted-player seeds derive from it.
    :param concurrency: the most games in flight at once.
    :param sampling: a :class:`ub.inference.SamplingConfig` for this rollout's model turns
        (e.g. greedy evaluation); ``None``: the engine's default.
    :param seed_round: what sampling and scripted-player seeds mix in instead of ``round_``
        (evaluation passes ``"eval"``, so every checkpoint meets the same opponent moves).
    :param game_id_prefix: game ids are ``PREFIX-gNNNNNN``; default ``RUN-rNNNNNN`` (the round).
    :param progress: called with (games finished, games in all) as each game ends, e.g. a
        :func:`ub.progress_bar.progress_bar` (copies not counted).
    :param branch: dynamic branching (:mod:`ub.branching`); ``None`` or ``k`` 0: off.
    :param learner: the actor whose decisions may become branch points (the round's learning
        checkpoint); needed with ``branch``.
    :param spread: ``branch.select: spread``'s standard error of the returns seen in each
        position, by env id then position (:func:`ub.branching.spread_sql`).
    """

    def __init__(
        self,
        assignments: list[GameAssignment],
        *,
        engine: InferenceEngine | None = None,
        run: str = "",
        round_: int = 0,
        shard: int = 0,
        base_seed: int = 0,
        concurrency: int = 128,
        sampling: SamplingConfig | None = None,
        seed_round: int | str | None = None,
        game_id_prefix: str | None = None,
        progress: Callable[[int, int], None] | None = None,
        branch: BranchConfig | None = None,
        learner: str | None = None,
        spread: dict[str, dict[str, float]] | None = None,
    ) -> None:
        if engine is None and any(a.needs_engine for g in assignments for a in g.actors):
            raise ValueError("a model actor needs an engine")
        self.branch = branch if branch is not None and branch.on else None
        if self.branch is not None and learner is None:
            raise ValueError("branching needs the learner's actor name")
        self.learner, self.spread = learner, spread or {}
        self.assignments = list(assignments)
        self.engine, self.sampling = engine, sampling
        self.run, self.round, self.shard, self.base_seed = run, round_, shard, base_seed
        self.concurrency = concurrency
        self.seed_scope = round_ if seed_round is None else seed_round
        self.prefix = game_id_prefix or f"{run or 'play'}-r{round_:06d}"
        self.progress = progress
        self.stats = RolloutStats()
        self._step_rows: list[dict] = []
        self._game_rows: list[dict] = []
        self._queue: deque[GameAssignment | _CopyOrder] = deque(self.assignments)
        self._originals_done = 0
        self._live: dict[str, _Live] = {}
        self._waiting: dict[str, _Live] = {}  # request id -> the game waiting on it
        self._batches: dict[str, Batch] = {}  # in the order they were first asked
        self._played = False

    def game_id(self, assignment: GameAssignment) -> str:
        """The id of ``assignment``'s game in this rollout's rows."""
        return f"{self.prefix}-g{assignment.game_index:06d}"

    # -- what the rollout lends its actors (ub.actors.base.RolloutContext) -----------------------

    def batch(self, key: str, make: Callable[[], B]) -> B:
        """The batch under ``key``, made by ``make`` the first time."""
        if key not in self._batches:
            self._batches[key] = make()
        return self._batches[key]  # type: ignore[return-value]

    def model_turn(self, turn: Turn, adapter: str | None) -> Pending:
        """``turn``'s move from the engine's base model with ``adapter``."""
        engine = self.engine
        assert engine is not None  # (__init__ refused model seats without one)
        return self.batch("engine", lambda: EngineBatch(engine, self.sampling)).submit(
            turn, adapter)

    # -- the loop --------------------------------------------------------------------------------

    def play(self) -> Rollout:
        """Play every assignment; return the tables, rows ordered by game then turn."""
        if self._played:
            raise RuntimeError("a RolloutRunner plays once")
        self._played = True
        started = time.perf_counter()
        try:
            self._start_more()
            while self._live or self._queue:
                if not self._waiting:
                    self._start_more()
                    if not self._waiting:
                        if not self._live and not self._queue:
                            break
                        raise RuntimeError("live games wait on nothing: a rollout bug")
                self._step_batches()
        finally:
            for batch in self._batches.values():
                batch.close()
        self.stats.seconds = time.perf_counter() - started
        self.stats.decisions = len(self._step_rows)
        # Rows are ordered by game then turn whatever order games finished in: shards are
        # byte-for-byte reproducible.
        self._step_rows.sort(key=lambda r: (r["game_id"], r["turn"]))
        self._game_rows.sort(key=lambda r: (r["game_index"], r["game_id"]))
        return Rollout(
            pa.Table.from_pylist(self._step_rows, schema=STEPS_SCHEMA),
            pa.Table.from_pylist(self._game_rows, schema=GAMES_SCHEMA),
            self.stats,
        )

    def _step_batches(self) -> None:
        """Apply what the waiting batches answered: those that only wait first (blocking on
        them only when no batch that computes has requests), then one step of each that
        computes (the engine)."""
        waiting = [b for b in self._batches.values() if b.waiting]
        computing = any(b.computes for b in waiting)
        for batch in waiting:
            if batch.computes:
                continue
            self._apply(batch.collect(block=not computing))
            self._start_more()
        for batch in waiting:
            if batch.computes and batch.waiting:
                fault_point("rollout.step")
                self._apply(batch.collect(block=True))
                self._start_more()

    def _apply(self, answers: list[tuple[str, Move | MoveFailed]]) -> None:
        """Apply each answered move to its game and advance the game."""
        for request_id, answer in answers:
            item = self._waiting.pop(request_id)
            if isinstance(answer, MoveFailed):
                item.game.fail(answer.cause)
            else:
                self._play(item, answer)
            self._advance(item)

    def _play(self, item: _Live, move: Move) -> None:
        """Apply ``move`` for the seat to move, counting a model's tokens."""
        details = move.details
        if "completion_token_ids" in details:
            self.stats.model_decisions += 1
            self.stats.prompt_tokens += len(details["prompt_token_ids"])
            self.stats.generated_tokens += len(details["completion_token_ids"])
        item.game.apply(move.action, format_ok=move.format_ok, **details)

    def _start_more(self) -> None:
        """Start queued games until ``concurrency`` are in flight."""
        while self._queue and len(self._live) < self.concurrency:
            order = self._queue.popleft()
            if isinstance(order, _CopyOrder):
                item = self._copy(order)
            else:
                a = order
                item = _Live(a, Game(a.spec, a.seed, self.game_id(a)),
                             (self.base_seed, self.seed_scope, a.game_index))
            self._live[item.game.game_id] = item
            self._advance(item)

    def _copy(self, order: _CopyOrder) -> _Live:
        """A copy of ``order.parent`` from its state at ``order.turn``: its own seeds (from the
        parent's sampling seed at the point), its seats' actors starting afresh on them."""
        parent, group = order.parent, order.parent.groups[order.turn]
        game = parent.game.copy(parent.snapshots[order.turn], copy_game_id(group, order.copy))
        return _Live(parent.assignment, game, (order.seed, "branch", order.copy),
                     parent=parent.game.game_id, groups={order.turn: group})

    def _advance(self, item: _Live) -> None:
        """Let the seats to move take their turns until the game ends or waits on a batch."""
        g = item.game
        while not g.done:
            seat = g.current_seat
            actor = item.assignment.actors[seat]
            if self.branch is not None and item.parent is None and actor.name == self.learner:
                item.snapshots[g.turn] = g.snapshot()  # (a branch point, maybe: read at its end)
            turn = Turn(g, derive_seed(*item.seed_parts, g.turn, "sample"),
                        derive_seed(*item.seed_parts, seat, "player"),
                        item.memory.setdefault(seat, {}), self)
            try:
                answer = actor.take_turn(turn)
            except MoveFailed as failed:
                g.fail(failed.cause)
                break
            if isinstance(answer, Pending):
                self._waiting[answer.request_id] = item
                return
            self._play(item, answer)
        self._finish(item)
        del self._live[g.game_id]

    def _finish(self, item: _Live) -> None:
        """Count a finished game and add its rows (a game that branches: after its copies are
        queued)."""
        if item.snapshots:
            self._branch(item)
        result = item.game.final
        self.stats.games += 1
        self.stats.copies += item.parent is not None
        self.stats.errored_games += result.outcome == "error"
        self.stats.outcomes[result.outcome] = self.stats.outcomes.get(result.outcome, 0) + 1
        where = {"run": self.run, "round": self.round, "shard": self.shard}
        self._step_rows.extend(step_rows(item.assignment, item.game, where, item.groups))
        self._game_rows.append(game_row(item.assignment, item.game, where, item.parent))
        if item.parent is None:
            self._originals_done += 1
            if self.progress is not None:
                self.progress(self._originals_done, len(self.assignments))

    def _branch(self, item: _Live) -> None:
        """Choose ``item``'s branch points among the learner's decisions, now that its game has
        ended, and queue their copies first (a finished game's copies start before new games,
        so its snapshots are soon released)."""
        assert self.branch is not None
        g = item.game
        if g.final.outcome == "error":  # (not trained on: its copies would not be either)
            item.snapshots.clear()
            return
        candidates = [Candidate(d.turn, -sum(d.details.get("completion_logprobs") or ()),
                                d.position)
                      for d in g.decisions if d.turn in item.snapshots]
        turns = choose_points(candidates, self.branch, derive_seed(*item.seed_parts, "branch"),
                              self.spread.get(item.assignment.spec.env_id))
        orders = []
        for turn in turns:
            item.groups[turn] = group_id(g.game_id, turn)
            seed = g.decisions[turn].details["sampling_seed"]
            orders += [_CopyOrder(item, turn, j, seed) for j in range(1, self.branch.k)]
        item.snapshots = {t: s for t, s in item.snapshots.items() if t in item.groups}
        self._queue.extendleft(reversed(orders))


def _played_once(runner: Callable[P, RolloutRunner]) -> Callable[P, Rollout]:
    # The function takes exactly the runner's parameters (ParamSpec): typed and documented in
    # one place, RolloutRunner's signature and docstring.
    def play_games(*args: P.args, **options: P.kwargs) -> Rollout:
        """Play every assignment and return the ``steps`` and ``games`` tables (``options``:
        :class:`RolloutRunner`'s keyword parameters, typed as they are; one runner, played
        once)."""
        return runner(*args, **options).play()
    return play_games


play_games = _played_once(RolloutRunner)
