"""One TextArena game, played a decision at a time.

A :class:`Game` does not choose moves: the rollout asks it whose turn it is and what they see,
gets an action from that seat's actor (a scripted player, the model, a hosted LLM), and applies
it. That inversion lets one loop interleave hundreds of games around a single batched engine.

TextArena envs draw from Python's *global* ``random`` (``State`` reseeds it at reset). Each
:class:`Game` keeps its own copy of that state and swaps it in around every env call, so a game's
randomness depends only on its own seed, never on which other games were interleaved with it.
"""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ub.faults import fault_point
from ub.games.legal import legal_actions, supports_legal_actions
from ub.games.positions import position_function, position_key
from ub.games.specs import GameSpec, make_env

T = TypeVar("T")


@dataclass
class Decision:
    """What one seat did on one turn, plus what the actor reports about how it got there."""

    turn: int
    seat: int
    observation: str
    action: str
    format_ok: bool
    position: str | None = None  # the position key (ub.games.positions); None: the game has none
    legal_moves: list[str] | None = None  # (ub.games.legal); None: the game has no function
    invalid_move: bool = False
    env_seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class GameResult:
    """The end of a game: rewards by seat (``None`` when the game errored)."""

    rewards: list[float] | None
    roles: list[str]
    invalid_moves: list[bool]
    reason: str
    error: str | None
    seconds: float

    @property
    def outcome(self) -> str:
        if self.rewards is None:
            return "error"
        if len(self.rewards) == 1:
            return "draw" if self.rewards[0] == 0 else "decisive"
        return "draw" if len(set(self.rewards)) == 1 else "decisive"

    @property
    def winner(self) -> int | None:
        """The seat with the strictly highest reward, if there is one."""
        if self.rewards is None or len(self.rewards) < 2:
            return None
        best = max(self.rewards)
        top = [seat for seat, r in enumerate(self.rewards) if r == best]
        return top[0] if len(top) == 1 else None

    @property
    def results(self) -> list[str] | None:
        """``win``/``draw``/``loss`` per seat: vs the other seats, or by sign when alone."""
        if self.rewards is None:
            return None
        if len(self.rewards) == 1:
            r = self.rewards[0]
            return ["win" if r > 0 else "loss" if r < 0 else "draw"]
        best = max(self.rewards)
        n_best = self.rewards.count(best)
        return [
            "draw" if n_best == len(self.rewards)
            else ("win" if r == best and n_best == 1 else "draw" if r == best else "loss")
            for r in self.rewards
        ]


@dataclass(frozen=True)
class Snapshot:
    """A game's state before one decision, to play on from in a copy (:meth:`Game.copy`):
    the env and its randomness deep-copied, the decisions so far shared (never changed)."""

    env: Any
    rng_state: Any
    decisions: tuple[Decision, ...]
    current_seat: int
    observation: str
    position: str | None
    legal_moves: list[str] | None

    @property
    def turn(self) -> int:
        return len(self.decisions)


class Game:
    """A TextArena game with isolated randomness and a record of every decision."""

    def __init__(self, spec: GameSpec, seed: int, game_id: str,
                 snapshot: Snapshot | None = None) -> None:
        self.spec = spec
        self.seed = seed
        self.game_id = game_id
        self.first_turn = 0  # a copy's decisions before this turn are its parent's
        self.decisions: list[Decision] = []
        self.result: GameResult | None = None
        self.current_seat: int = -1
        self.observation: str = ""
        self.position: str | None = None  # the current seat's position key
        self.legal_moves: list[str] | None = None  # the current seat's legal moves, if known
        self._rng_state = random.Random(seed).getstate()
        self._started = time.perf_counter()
        self.env: Any = None  # a TextArena env (untyped); None if making it failed
        if snapshot is not None:
            self._restore(snapshot)
            return
        try:
            self._position_function = position_function(spec.env_id, spec.position)
            self._knows_legal_moves = supports_legal_actions(spec.env_id)
            env = self.env = make_env(spec.env_id)
            self._isolated(lambda: env.reset(num_players=spec.num_players, seed=seed))
            self._set_invalid_move_retries(spec.invalid_move_retries)
            self._observe()
        except Exception as exc:
            self.fail(exc)

    def snapshot(self) -> Snapshot:
        """The game as it stands (a decision pending), for :meth:`copy`."""
        assert not self.done, "snapshot() of a finished game"
        env, rng_state = copy.deepcopy((self.env, self._rng_state))
        return Snapshot(env, rng_state, tuple(self.decisions), self.current_seat,
                        self.observation, self.position, copy.copy(self.legal_moves))

    def copy(self, snapshot: Snapshot, game_id: str) -> Game:
        """A new game that plays on from ``snapshot`` (taken of this game), as ``game_id``:
        its own env and randomness, the decisions before the snapshot's turn its parent's."""
        return Game(self.spec, self.seed, game_id, snapshot)

    def _restore(self, snapshot: Snapshot) -> None:
        self._position_function = position_function(self.spec.env_id, self.spec.position)
        self._knows_legal_moves = supports_legal_actions(self.spec.env_id)
        # (deep-copied again: one snapshot may start several copies)
        self.env, self._rng_state = copy.deepcopy((snapshot.env, snapshot.rng_state))
        self.decisions = list(snapshot.decisions)
        self.first_turn = snapshot.turn
        self.current_seat, self.observation = snapshot.current_seat, snapshot.observation
        self.position, self.legal_moves = snapshot.position, copy.copy(snapshot.legal_moves)

    @property
    def done(self) -> bool:
        return self.result is not None

    @property
    def turn(self) -> int:
        return len(self.decisions)

    def _set_invalid_move_retries(self, retries: int) -> None:
        # TextArena's states read `error_allowance` when a move is invalid; reset() builds a new
        # state with its own default (1 for most games), so it is set after every reset.
        state = getattr(self.env, "state", None)
        if state is not None and hasattr(state, "error_allowance"):
            state.error_allowance = retries

    def _isolated(self, call: Callable[[], T]) -> T:
        outer = random.getstate()
        random.setstate(self._rng_state)
        try:
            return call()
        finally:
            self._rng_state = random.getstate()
            random.setstate(outer)

    @property
    def final(self) -> GameResult:
        """The result of a finished game (an error before it has finished)."""
        if self.result is None:
            raise RuntimeError(f"game {self.game_id} has not finished")
        return self.result

    def _observe(self) -> None:
        seat, observation = self._isolated(self.env.get_observation)
        self.current_seat = int(seat)
        self.observation = observation if isinstance(observation, str) else str(observation)
        self.position = position_key(self._position_function, self.env, self.current_seat)
        if self._knows_legal_moves:
            self.legal_moves = legal_actions(self.env)

    def act_with(self, choose: Callable[[Any], T]) -> T:
        """Call ``choose(env)`` with the game's randomness isolated (for scripted players)."""
        return self._isolated(lambda: choose(self.env))

    def apply(self, action: str, format_ok: bool = True, **details: Any) -> Decision:
        """Play ``action`` for the current seat; record the decision; end the game if it ended."""
        assert not self.done, "apply() on a finished game"
        state = getattr(self.env, "state", None)
        errors_before = getattr(state, "error_count", 0)
        decision = Decision(self.turn, self.current_seat, self.observation, action, format_ok,
                            self.position, self.legal_moves, details=details)
        self.decisions.append(decision)
        t0 = time.perf_counter()
        try:
            fault_point("env.step")
            done, _info = self._isolated(lambda: self.env.step(action=action))
            decision.env_seconds = time.perf_counter() - t0
            decision.invalid_move = getattr(state, "error_count", 0) > errors_before
            if done:
                self._close(decision)
            elif self.turn >= self.spec.max_turns:
                self.fail(RuntimeError(f"turn limit {self.spec.max_turns} reached"))
            else:
                self._observe()
        except Exception as exc:
            decision.env_seconds = time.perf_counter() - t0
            self.fail(exc)
        return decision

    def _close(self, last: Decision) -> None:
        rewards, game_info = self._isolated(self.env.close)
        n = self.spec.num_players
        info = [game_info.get(seat, {}) for seat in range(n)]
        invalid = [bool(i.get("invalid_move", False)) for i in info]
        # The move that ended the game by its invalidity is flagged on the decision too.
        if invalid[last.seat]:
            last.invalid_move = True
        reasons = {str(i.get("reason", "")) for i in info if i.get("reason")}
        self.result = GameResult(
            rewards=[float(rewards.get(seat, 0.0)) for seat in range(n)],
            roles=[str(i.get("role", f"Player {seat}")) for seat, i in enumerate(info)],
            invalid_moves=invalid,
            reason="; ".join(sorted(reasons)),
            error=None,
            seconds=time.perf_counter() - self._started,
        )

    def fail(self, exc: BaseException) -> None:
        """End the game as errored, with ``exc`` as the reason (e.g. a broken scripted player, a
        prompt too long for the engine, a hosted seat that gave up); the rollout goes on with
        the other games."""
        n = self.spec.num_players
        self.result = GameResult(
            rewards=None,
            roles=[f"Player {seat}" for seat in range(n)],
            invalid_moves=[False] * n,
            reason="error",
            error=f"{type(exc).__name__}: {exc}",
            seconds=time.perf_counter() - self._started,
        )

    def role(self, seat: int) -> str:
        """The seat's role name as the env reports it (e.g. 'Player 0')."""
        state = getattr(self.env, "state", None)
        info = getattr(state, "game_info", None) or {}
        return str(info.get(seat, {}).get("role", f"Player {seat}"))
