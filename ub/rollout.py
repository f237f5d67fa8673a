"""Batched rollouts: play many games at once around one inference engine.

Games advance independently. Whenever a game needs a model move, its prompt is submitted to the
engine, which batches every pending request (base model and any number of LoRA adapters mixed)
and returns each completion as soon as it finishes; that game then steps and, if it needs the
model again, submits its next prompt while the others are still generating. Scripted seats move
instantly. New games start as soon as others finish, up to ``concurrency`` at once, so the engine
stays full.

The result is two Arrow tables in the ``steps`` and ``games`` schemas (:mod:`ub.data.schema`):
a finished game adds :func:`step_rows` and :func:`game_row`. :func:`play_games` plays a list of
assignments with a :class:`RolloutRunner`, which holds the rollout's state (games in flight,
requests they wait on, rows so far) between engine steps.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ub.actors.spec import ActorSpec
from ub.branching import BranchConfig, Candidate, choose_points, copy_game_id, group_id
from ub.data.schema import GAMES_SCHEMA, STEPS_SCHEMA
from ub.faults import fault_point
from ub.games.actions import get_extractor
from ub.games.loop import Game, Snapshot
from ub.games.move_mask import played_move, template_constraint
from ub.games.specs import GameSpec
from ub.games.templates import get_template
from ub.seeding import derive_seed

if TYPE_CHECKING:
    from ub.inference.protocols import InferenceEngine


@dataclass(frozen=True)
class GameAssignment:
    """One game to play: which env, which seed, who sits where."""

    spec: GameSpec
    game_index: int
    seed: int
    actors: tuple[ActorSpec, ...]

    def __post_init__(self) -> None:
        if len(self.actors) != self.spec.num_players:
            from ub.errors import UbError

            raise UbError(
                f"{self.spec.env_id} has {self.spec.num_players} seat(s) but "
                f"{len(self.actors)} actor(s) were given"
            )


def assign_games(
    spec: GameSpec, actors: list[ActorSpec], num_games: int, base_seed: int, round_: int = 0,
    first_index: int = 0, rotate_seats: bool = True,
) -> list[GameAssignment]:
    """``num_games`` games of ``spec``; with ``rotate_seats`` the actors take turns in each seat."""
    out = []
    for i in range(first_index, first_index + num_games):
        shift = i % len(actors) if rotate_seats else 0
        seated = tuple(actors[shift:] + actors[:shift])
        out.append(GameAssignment(spec, i, derive_seed(base_seed, round_, i, "env"), seated))
    return out


def prompt_problem(prompt_tokens: int, max_model_len: int, max_tokens: int) -> str | None:
    """Why a prompt of ``prompt_tokens`` cannot get a whole completion of up to ``max_tokens``
    within the engine's context, or ``None``."""
    room = max_model_len - prompt_tokens
    if room >= max_tokens:
        return None
    return (f"prompt of {prompt_tokens} tokens leaves {max(room, 0)} of engine.max_model_len "
            f"{max_model_len} for a completion of up to sampling.max_tokens {max_tokens}: raise "
            "engine.max_model_len, lower sampling.max_tokens, or shorten the game "
            "(max_turns)")


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
    """A game in flight: its assignment, its state, its scripted seats' players, and what its
    seeds derive from (``seed_parts``: the run's seed, the scope and the game's index; a copy's,
    its parent's sampling seed at the point and its number); with branching, its state before
    each of the learner's decisions (``snapshots``, by turn), or, for a copy, its parent."""

    assignment: GameAssignment
    game: Game
    players: dict[int, Any]
    seed_parts: tuple[object, ...]
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


def play_games(assignments: list[GameAssignment], **options: Any) -> Rollout:
    """Play every assignment and return the ``steps`` and ``games`` tables
    (``options``: :class:`RolloutRunner`'s keyword parameters; one runner, played once)."""
    return RolloutRunner(assignments, **options).play()


class RolloutRunner:
    """One batched rollout: :meth:`play` plays every assignment around one engine, once.

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
        sampling: Any = None,
        seed_round: int | str | None = None,
        game_id_prefix: str | None = None,
        progress: Callable[[int, int], None] | None = None,
        branch: BranchConfig | None = None,
        learner: str | None = None,
        spread: dict[str, dict[str, float]] | None = None,
    ) -> None:
        if engine is None and any(a.kind == "model" for g in assignments for a in g.actors):
            raise ValueError("a model actor needs an engine")
        self.branch = branch if branch is not None and branch.on else None
        if self.branch is not None and learner is None:
            raise ValueError("branching needs the learner's actor name")
        self.learner, self.spread = learner, spread or {}
        self.assignments = list(assignments)
        self.engine = engine
        self.run, self.round, self.shard, self.base_seed = run, round_, shard, base_seed
        self.concurrency = concurrency
        self.sampling = sampling
        self.seed_scope = round_ if seed_round is None else seed_round
        self.prefix = game_id_prefix or f"{run or 'play'}-r{round_:06d}"
        self.progress = progress
        self.stats = RolloutStats()
        self._end_tokens: dict[str, tuple[int, ...]] = {}  # template name -> its end of turn
        self._step_rows: list[dict] = []
        self._game_rows: list[dict] = []
        self._queue: deque[GameAssignment | _CopyOrder] = deque(self.assignments)
        self._originals_done = 0
        self._live: dict[str, _Live] = {}
        self._waiting: dict[str, tuple[_Live, dict]] = {}  # request id -> game waiting on it
        self._hosted_clients: dict[str, Any] = {}
        self._hosted_waiting: dict[Any, tuple[_Live, dict]] = {}  # future -> game waiting on it
        self._played = False

    def game_id(self, assignment: GameAssignment) -> str:
        """The id of ``assignment``'s game in this rollout's rows."""
        return f"{self.prefix}-g{assignment.game_index:06d}"

    def play(self) -> Rollout:
        """Play every assignment; return the tables, rows ordered by game then turn."""
        if self._played:
            raise RuntimeError("a RolloutRunner plays once")
        self._played = True
        started = time.perf_counter()
        try:
            self._start_more()
            while self._live or self._queue:
                if not self._waiting and not self._hosted_waiting:
                    self._start_more()
                    if not self._waiting and not self._hosted_waiting:
                        if not self._live and not self._queue:
                            break
                        raise RuntimeError("live games wait on nothing: a rollout bug")
                if self._hosted_waiting:
                    self._receive_hosted(block=not self._waiting)
                    self._start_more()
                if not self._waiting:
                    continue
                fault_point("rollout.step")
                self._receive_model()
                self._start_more()
        finally:
            self._release()
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

    def _model_engine(self) -> InferenceEngine:
        """The engine, for model seats (``__init__`` refused model seats without one)."""
        assert self.engine is not None
        return self.engine

    def _release(self) -> None:
        for client in self._hosted_clients.values():
            client.close()
        if self._waiting:  # failed midway: nothing of this rollout may surface in the next one
            self._model_engine().abort(list(self._waiting))

    def _start_more(self) -> None:
        """Start queued games until ``concurrency`` are in flight."""
        while self._queue and len(self._live) < self.concurrency:
            order = self._queue.popleft()
            if isinstance(order, _CopyOrder):
                item = self._copy(order)
            else:
                a = order
                parts = (self.base_seed, self.seed_scope, a.game_index)
                item = _Live(a, Game(a.spec, a.seed, self.game_id(a)),
                             _scripted_players(a.actors, parts), parts)
            self._live[item.game.game_id] = item
            self._advance(item)

    def _copy(self, order: _CopyOrder) -> _Live:
        """A copy of ``order.parent`` from its state at ``order.turn``: its own seeds (from the
        parent's sampling seed at the point), fresh scripted players on them."""
        parent, group = order.parent, order.parent.groups[order.turn]
        parts = (order.seed, "branch", order.copy)
        game = parent.game.copy(parent.snapshots[order.turn], copy_game_id(group, order.copy))
        return _Live(parent.assignment, game, _scripted_players(parent.assignment.actors, parts),
                     parts, parent=parent.game.game_id, groups={order.turn: group})

    def _advance(self, item: _Live) -> None:
        """Move scripted seats until the game ends or waits for the model or a hosted seat."""
        g = item.game
        while not g.done:
            actor = item.assignment.actors[g.current_seat]
            if actor.kind == "scripted":
                player = item.players[g.current_seat]
                try:
                    action = g.act_with(player.act)
                except Exception as exc:  # a broken scripted player must not stop the rollout
                    g.fail(exc)
                    break
                g.apply(action, format_ok=True)
                continue
            submit = self._submit_hosted if actor.kind == "hosted" else self._submit_model
            if submit(item, actor):
                return
        self._finish(item)
        del self._live[g.game_id]

    def _submit_model(self, item: _Live, actor: ActorSpec) -> bool:
        """Queue the model's move; False (and the game failed) if the prompt cannot fit."""
        from ub.inference.types import GenerationRequest

        g, spec = item.game, item.assignment.spec
        template = get_template(spec.template)
        engine = self._model_engine()
        prompt = template.render(g.observation, engine.tokenizer)
        ids = engine.tokenizer.encode(prompt)
        problem = prompt_problem(len(ids), engine.config.max_model_len, self._max_tokens(engine))
        if problem:
            # vLLM would cut the completion at the context's end, and the cut answer would be
            # scored as an invalid move: the game is stopped instead (errored games are not
            # trained on), saying why.
            g.fail(ValueError(problem))
            return False
        if template.name not in self._end_tokens:
            self._end_tokens[template.name] = template.end_token_ids(engine.tokenizer)
        seed = derive_seed(*item.seed_parts, g.turn, "sample")
        if self.branch is not None and item.parent is None and actor.name == self.learner:
            item.snapshots[g.turn] = g.snapshot()  # (a branch point, maybe: read at its end)
        mask = None
        if spec.legal_moves == "mask":
            try:  # (preflight refuses a game without legal moves; a position without any:)
                mask = template_constraint(template, g.legal_moves or [], engine.tokenizer)
            except ValueError as exc:
                g.fail(ValueError(f"legal_moves mask at turn {g.turn}: {exc}"))
                return False
        request_id = f"{g.game_id}-t{g.turn}"
        request = GenerationRequest(request_id, ids, seed, actor.adapter, self.sampling,
                                    stop_token_ids=self._end_tokens[template.name],
                                    move_mask=mask)
        engine.submit(request)
        self._waiting[request_id] = (item, {
            "template": template.name, "prompt": prompt, "prompt_token_ids": ids,
            "sampling_seed": seed, "legal_moves_mode": spec.legal_moves,
            "submitted": time.perf_counter(),
        })
        return True

    def _max_tokens(self, engine: InferenceEngine) -> int:
        """The completion budget of this rollout's model turns."""
        sampling = self.sampling or getattr(engine, "sampling", None)
        return sampling.max_tokens if sampling is not None else 1

    def _receive_model(self) -> None:
        """One engine step: apply every finished completion to its game, in the engine's order."""
        for gen in self._model_engine().step():
            item, det = self._waiting.pop(gen.request_id)
            action, format_ok = get_extractor(item.assignment.spec.extractor_name)(gen.text)
            if det["legal_moves_mode"] == "mask":
                # The move is the completion's first bracket, legal by construction (unless
                # max_tokens cut it: then the extractor's reading, as unmasked).
                action = played_move(gen.text, item.game.legal_moves or []) or action
            self.stats.model_decisions += 1
            self.stats.prompt_tokens += len(det["prompt_token_ids"])
            self.stats.generated_tokens += len(gen.completion_token_ids)
            det.update(
                completion=gen.text,
                completion_token_ids=list(gen.completion_token_ids),
                completion_logprobs=list(gen.completion_logprobs),
                num_prompt_tokens=len(det["prompt_token_ids"]),
                num_completion_tokens=len(gen.completion_token_ids),
                finish_reason=gen.finish_reason,
                gen_seconds=time.perf_counter() - det.pop("submitted"),
            )
            item.game.apply(action, format_ok=format_ok, **det)
            self._advance(item)

    def _submit_hosted(self, item: _Live, actor: ActorSpec) -> bool:
        """Ask the hosted endpoint for the move (in its client's thread pool)."""
        from ub.actors.hosted import HostedClient, parse_hosted

        client = self._hosted_clients.get(actor.name)
        if client is None:
            client = self._hosted_clients[actor.name] = HostedClient(parse_hosted(actor.name))
        template = get_template(item.assignment.spec.template)
        # A chat endpoint applies its own chat template: send it the observation itself.
        prompt = (item.game.observation if template.name == "chat"
                  else template.render(item.game.observation, None))
        self._hosted_waiting[client.submit(prompt)] = (item, {
            "template": template.name, "prompt": prompt, "legal_moves_mode": "free",
            "submitted": time.perf_counter(),
        })
        return True

    def _receive_hosted(self, block: bool) -> None:
        """Apply the hosted moves that are done (waiting for one if ``block``), in game order."""
        from concurrent.futures import FIRST_COMPLETED
        from concurrent.futures import wait as wait_futures

        from ub.actors.hosted import HostedFailure, parse_hosted

        pending = self._hosted_waiting
        done = [f for f in pending if f.done()]
        if not done and block:
            done = list(wait_futures(list(pending), return_when=FIRST_COMPLETED).done)
        # Apply in game order, not completion order: the rows do not depend on timing.
        for future in sorted(done, key=lambda f: pending[f][0].game.game_id):
            item, det = pending.pop(future)
            g = item.game
            try:
                text = future.result()
            except HostedFailure as exc:
                actor = item.assignment.actors[g.current_seat]
                if parse_hosted(actor.name).on_failure == "error":
                    raise
                g.fail(exc)  # on_failure=skip: the game is recorded as errored, with why
                self._advance(item)
                continue
            action, format_ok = get_extractor(item.assignment.spec.extractor_name)(text)
            det.update(completion=text, gen_seconds=time.perf_counter() - det.pop("submitted"))
            g.apply(action, format_ok=format_ok, **det)
            self._advance(item)

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


def _scripted_players(actors: tuple[ActorSpec, ...], seed_parts: tuple[object, ...]
                      ) -> dict[int, Any]:
    """The scripted seats' players of a game whose seeds derive from ``seed_parts``, by seat."""
    from ub.actors.scripted import make_scripted_player

    return {seat: make_scripted_player(actor.name, derive_seed(*seed_parts, seat, "player"))
            for seat, actor in enumerate(actors) if actor.kind == "scripted"}


# The rows a finished game adds to the ``steps`` and ``games`` tables. ``where`` holds the
# columns the rollout sets for every row: ``run``, ``round`` and ``shard``.


def step_rows(a: GameAssignment, g: Game, where: dict[str, Any],
              groups: dict[int, str] | None = None) -> list[dict]:
    """The ``steps`` rows of a finished game, one per decision (a copy's: from the turn it was
    copied at); ``groups``: the branch group of each branch point's turn."""
    result = g.final
    groups = groups or {}
    rows = []
    for d in g.decisions[g.first_turn:]:
        actor = a.actors[d.seat]
        det = d.details
        rows.append({
            **where, "game_id": g.game_id,
            "env_id": a.spec.env_id, "turn": d.turn, "seat": d.seat,
            "role": result.roles[d.seat], "actor": actor.name, "actor_kind": actor.kind,
            "checkpoint": actor.checkpoint, "template": det.get("template"),
            "observation": d.observation, "position": d.position, "prompt": det.get("prompt"),
            "completion": det.get("completion"),
            "prompt_token_ids": det.get("prompt_token_ids"),
            "completion_token_ids": det.get("completion_token_ids"),
            "completion_logprobs": det.get("completion_logprobs"),
            "num_prompt_tokens": det.get("num_prompt_tokens"),
            "num_completion_tokens": det.get("num_completion_tokens"),
            "action": d.action, "format_ok": d.format_ok, "invalid_move": d.invalid_move,
            "step_reward": 0.0,
            "env_reward": None if result.rewards is None else result.rewards[d.seat],
            "finish_reason": det.get("finish_reason"),
            "sampling_seed": det.get("sampling_seed"),
            "gen_seconds": det.get("gen_seconds"), "env_seconds": d.env_seconds,
            "legal_moves": d.legal_moves, "legal_moves_mode": det.get("legal_moves_mode"),
            "branch_group": groups.get(d.turn),
        })
    return rows


def game_row(a: GameAssignment, g: Game, where: dict[str, Any], parent: str | None = None
             ) -> dict:
    """The ``games`` row of a finished game (``parent``: a copy's parent game id)."""
    result = g.final
    return {
        **where, "game_id": g.game_id,
        "game_index": a.game_index, "env_id": a.spec.env_id, "seed": a.seed,
        "num_players": a.spec.num_players, "actors": [x.name for x in a.actors],
        "roles": result.roles, "rewards": result.rewards, "results": result.results,
        "invalid_moves": result.invalid_moves, "outcome": result.outcome,
        "winner": result.winner, "num_turns": g.turn, "reason": result.reason,
        "error": result.error, "seconds": result.seconds,
        "parent_game_id": parent, "branch_turn": g.first_turn if parent else None,
    }
