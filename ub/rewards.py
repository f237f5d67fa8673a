"""Reward transforms at three stages: final (per game), step (per decision), sampling (per batch).

A training reward is built in three composable stages, each a list of transforms applied in
order (the output of one is the input of the next):

1. **final** (:class:`FinalTransform`): per game, on the reward vector by seat, knowing the env,
   the roles, the actors and the results. Runs in Python over the ``games`` table in the
   *canonical order* (below), because a transform may keep state (``role_advantage``'s baselines).
2. **step** (:class:`StepTransform`): per decision, a SQL expression over the ``steps`` columns
   that shapes the reward (``format_reward``, ``invalid_move_penalty``). Runs inside DuckDB.
3. **sampling** (:class:`SamplingTransform`): on the sampled batch, a SQL window expression
   (``normalize``, ``normalize_per_env``). Runs inside DuckDB, on the sampled rows only.

Transforms are configured by name with parameters, e.g.::

    final = [{"name": "win_draw_loss"}, {"name": "role_advantage", "ema": 0.95}]
    step = [{"name": "format_reward", "bonus": 0.1}]
    sampling = ["normalize_per_env"]

and built with :func:`build_transforms`. Your own transform: subclass the stage's base class as a
dataclass (its fields are its parameters), give it a unique ``name`` and decorate it with
:func:`register`; see ``docs/rewards.md``.

**Canonical order.** Final transforms see games sorted by ``(round, game_index, game_id)``.
``game_index`` is unique within a round and ``game_id`` within a run, so the order is total and
does not depend on which shard or task played a game, or on when it finished. Stateful transforms
are therefore a deterministic function of the games folded in, in that order; their state is a
plain JSON-able dict (:meth:`FinalRewardChain.state_dict`) that records the last game folded in
(the *watermark*), so a restored chain refuses to fold a game twice.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ub.actors.names import is_model_actor
from ub.errors import UbError

STAGES = ("final", "step", "sampling")
STATE_FORMAT = 1  # version of FinalRewardChain.state_dict(); bump on incompatible changes

# Column types of the table returned by the final stage.
FINAL_REWARDS_SCHEMA = pa.schema([
    pa.field("game_id", pa.string(), nullable=False),
    pa.field("seat", pa.int32(), nullable=False),
    pa.field("env_id", pa.string(), nullable=False),
    pa.field("role", pa.string(), nullable=False),
    pa.field("round", pa.int32(), nullable=False),
    pa.field("game_index", pa.int32(), nullable=False),
    pa.field("raw_reward", pa.float64(), nullable=False),
    pa.field("reward", pa.float64(), nullable=False),
])

GameKey = tuple[int, int, str]  # (round, game_index, game_id): the canonical order


def sql_float(value: float) -> str:
    """A float as an exact DuckDB DOUBLE literal (a bare ``0.5`` would be a DECIMAL)."""
    value = float(value)
    if not math.isfinite(value):
        raise UbError(f"reward transform parameter {value} is not finite: use a finite number")
    return f"CAST({value!r} AS DOUBLE)"


# --------------------------------------------------------------------------------------------
# Base classes and registry
# --------------------------------------------------------------------------------------------


@dataclass
class RewardTransform:
    """Common base: a transform's dataclass fields are its (JSON-able) parameters."""

    name: ClassVar[str] = ""
    stage: ClassVar[str] = ""

    def params(self) -> dict[str, Any]:
        """The parameters, as given in the config (for state checks and logging)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}

    def spec(self) -> dict[str, Any]:
        """The config entry that rebuilds this transform: ``{"name": ..., **params}``."""
        return {"name": self.name, **self.params()}

    def validate(self) -> None:
        """Raise :class:`UbError` for bad parameters. Called by :func:`build_transforms`."""


@dataclass
class GameView:
    """One game as a final transform sees it (every list is by seat)."""

    game_id: str
    round: int
    game_index: int
    env_id: str
    roles: list[str]
    actors: list[str]
    results: list[str | None]
    raw_rewards: list[float]


@dataclass
class SeatRows:
    """Non-errored games exploded to one row per (game, seat), in canonical order, columnar.

    ``offsets[g]:offsets[g + 1]`` are the rows of game ``g``; built-in final transforms work on
    these arrays directly, which is what makes the final stage fast on 100k+ games.
    """

    game_id: pa.Array  # per game
    round: np.ndarray  # per game
    game_index: np.ndarray  # per game
    offsets: np.ndarray  # per game + 1
    game: np.ndarray  # per row: index of its game
    seat: np.ndarray  # per row
    env_id: pa.Array  # per row
    role: pa.Array  # per row
    actor: pa.Array  # per row
    result: pa.Array  # per row (may hold nulls)
    raw_reward: np.ndarray  # per row, float64

    @property
    def num_games(self) -> int:
        return len(self.offsets) - 1

    def __len__(self) -> int:
        return len(self.raw_reward)

    def views(self) -> list[GameView]:
        """Every game as a :class:`GameView`, in order (built from whole columns at once)."""
        ids, env = self.game_id.to_pylist(), self.env_id.to_pylist()
        role, actor = self.role.to_pylist(), self.actor.to_pylist()
        result, raw = self.result.to_pylist(), self.raw_reward.tolist()
        bounds = self.offsets.tolist()
        return [
            GameView(ids[g], int(self.round[g]), int(self.game_index[g]), env[lo], role[lo:hi],
                     actor[lo:hi], result[lo:hi], raw[lo:hi])
            for g, (lo, hi) in enumerate(pairwise(bounds))
        ]


@dataclass
class FinalTransform(RewardTransform):
    """Per-game transform of the reward vector by seat. May keep state across games.

    Implement :meth:`transform_game` (simple, per game). Built-ins also override :meth:`apply`
    with a columnar version; both must agree. A stateful transform also implements
    :meth:`state_dict` / :meth:`load_state_dict` with plain JSON-able dicts.
    """

    stage: ClassVar[str] = "final"

    def transform_game(self, rewards: list[float], game: GameView) -> list[float]:
        """The new reward of each seat of ``game``, given the current ``rewards`` by seat."""
        raise NotImplementedError

    def apply(self, rewards: np.ndarray, seats: SeatRows) -> np.ndarray:
        """All games at once, in canonical order. Default: :meth:`transform_game` per game."""
        current, bounds = rewards.tolist(), seats.offsets.tolist()
        out: list[float] = []
        for view, lo, hi in zip(seats.views(), bounds[:-1], bounds[1:], strict=True):
            new = self.transform_game(current[lo:hi], view)
            if len(new) != hi - lo:
                raise UbError(f"final transform {self.name} returned {len(new)} rewards for the "
                              f"{hi - lo} seats of game {view.game_id}")
            out.extend(float(x) for x in new)
        return np.asarray(out, dtype=np.float64)

    def state_dict(self) -> dict[str, Any]:
        """The transform's state as a JSON-able dict (``{}`` when stateless)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


@dataclass
class StepTransform(RewardTransform):
    """Per-decision shaping, as a SQL expression evaluated by DuckDB on every selected decision.

    The expression may use the columns listed in ``docs/rewards.md`` (``format_ok``,
    ``invalid_move``, ``turn``, ``seat``, ``env_id``, ``role``, ``num_completion_tokens``, ...).
    """

    stage: ClassVar[str] = "step"

    def sql(self, reward: str) -> str:
        """The shaped reward, given the SQL expression ``reward`` of the reward so far."""
        raise NotImplementedError

    def apply_row(self, reward: float, row: Mapping[str, Any]) -> float:
        """The same in plain Python (used by the reference implementation; optional)."""
        raise NotImplementedError(f"{self.name} has no Python form")


@dataclass
class SamplingTransform(RewardTransform):
    """A batch-level transform, as a SQL window expression over the sampled rows.

    Each sampling transform is evaluated in its own query layer, so it may use window functions
    over the previous one's output (windows cannot be nested in one SQL expression).
    """

    stage: ClassVar[str] = "sampling"

    def sql(self, value: str) -> str:
        """The transformed value, given the column ``value`` of the value so far."""
        raise NotImplementedError

    def apply_rows(self, values: list[float], rows: Sequence[Mapping[str, Any]]) -> list[float]:
        """The same in plain Python (used by the reference implementation; optional)."""
        raise NotImplementedError(f"{self.name} has no Python form")


_BASES: dict[str, type[RewardTransform]] = {
    "final": FinalTransform, "step": StepTransform, "sampling": SamplingTransform,
}
REGISTRY: dict[str, dict[str, type[RewardTransform]]] = {stage: {} for stage in STAGES}


def register(cls: type[RewardTransform]) -> type[RewardTransform]:
    """Class decorator: make a transform available by its ``name`` in its stage's configs."""
    stage = next((s for s, base in _BASES.items() if issubclass(cls, base)), None)
    if stage is None:
        raise TypeError(f"{cls.__name__} must subclass FinalTransform, StepTransform or "
                        "SamplingTransform")
    if not dataclasses.is_dataclass(cls) or "__dataclass_fields__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__} must be a @dataclass (its fields are its parameters)")
    if not cls.name:
        raise TypeError(f"{cls.__name__} needs a class attribute name = '...'")
    existing = REGISTRY[stage].get(cls.name)
    if existing is not None and existing is not cls:
        raise TypeError(f"a {stage} transform named {cls.name!r} is already registered "
                        f"({existing.__module__}.{existing.__qualname__})")
    REGISTRY[stage][cls.name] = cls
    return cls


def available_transforms(stage: str) -> list[str]:
    """The registered transform names of ``stage``."""
    return sorted(REGISTRY[stage])


def build_transforms(stage: str, specs: Iterable[str | Mapping[str, Any] | RewardTransform]
                     ) -> list[Any]:
    """Transform objects from config entries: a name, ``{"name": ..., **params}``, or an object."""
    if stage not in STAGES:
        raise UbError(f"unknown reward stage {stage!r}; stages are {', '.join(STAGES)}")
    if isinstance(specs, str | bytes | Mapping) or not isinstance(specs, Iterable):
        raise UbError(f"{stage} must be a list of reward transforms, e.g. "
                      f"[{{name: {next(iter(REGISTRY[stage]), 'NAME')}}}], got {specs!r}")
    out = []
    for spec in specs:
        if isinstance(spec, RewardTransform):
            if spec.stage != stage:
                raise UbError(f"{spec.name} is a {spec.stage} transform, listed under {stage}")
            spec.validate()
            out.append(spec)
            continue
        if isinstance(spec, str):
            spec = {"name": spec}
        if not isinstance(spec, Mapping) or "name" not in spec:
            raise UbError(f"{stage} reward transform {spec!r} must be a name or a mapping with "
                          "'name', e.g. {'name': 'role_advantage', 'ema': 0.95}")
        params = {k: v for k, v in spec.items() if k != "name"}
        cls = REGISTRY[stage].get(spec["name"])
        if cls is None:
            raise UbError(f"unknown {stage} reward transform {spec['name']!r}; available: "
                          f"{', '.join(available_transforms(stage))}")
        allowed = [f.name for f in dataclasses.fields(cls) if f.init]
        unknown = sorted(set(params) - set(allowed))
        if unknown:
            raise UbError(f"{stage} reward transform {cls.name!r} has no parameter(s) "
                          f"{', '.join(unknown)}; its parameters: {', '.join(allowed) or 'none'}")
        transform = cls(**params)
        transform.validate()
        out.append(transform)
    return out


# --------------------------------------------------------------------------------------------
# Final transforms
# --------------------------------------------------------------------------------------------


@register
@dataclass
class WinDrawLoss(FinalTransform):
    """Replace each seat's reward by ``win`` / ``draw`` / ``loss`` from the seat's result."""

    name: ClassVar[str] = "win_draw_loss"
    win: float = 1.0
    draw: float = 0.0
    loss: float = -1.0

    def validate(self) -> None:
        for key in ("win", "draw", "loss"):
            sql_float(getattr(self, key))

    def _value(self, result: str | None, game_id: str) -> float:
        if result == "win":
            return float(self.win)
        if result == "draw":
            return float(self.draw)
        if result == "loss":
            return float(self.loss)
        raise UbError(f"game {game_id} has result {result!r} for a seat: win_draw_loss needs "
                      "'win', 'draw' or 'loss' in games.results")

    def transform_game(self, rewards: list[float], game: GameView) -> list[float]:
        return [self._value(r, game.game_id) for r in game.results]

    def apply(self, rewards: np.ndarray, seats: SeatRows) -> np.ndarray:
        out = np.full(len(rewards), np.nan)
        for result, value in (("win", self.win), ("draw", self.draw), ("loss", self.loss)):
            mask = pc.fill_null(pc.equal(seats.result, result), False).to_numpy(
                zero_copy_only=False)
            out[mask] = float(value)
        bad = np.flatnonzero(np.isnan(out))
        if len(bad):
            row = int(bad[0])
            self._value(seats.result[row].as_py(), seats.game_id[int(seats.game[row])].as_py())
        return out


@register
@dataclass
class RoleAdvantage(FinalTransform):
    """SPIRAL's role-conditioned advantage: ``R - b[env_id, role]`` with an EMA baseline ``b``.

    For each game in canonical order, every seat gets ``R - b`` with ``b`` read *before* the game
    updates it; then, in seat order, ``b <- ema * b + (1 - ema) * R``. ``b`` starts at 0.
    With ``update_from="model"`` only seats played by a model (actor ``model``,
    ``model:...`` or a run's checkpoint ``ckpt-...``) update ``b``: the baseline estimates
    the learner's return in that role, not a
    scripted opponent's. In self-play every seat is a model, which is SPIRAL exactly.
    """

    name: ClassVar[str] = "role_advantage"
    ema: float = 0.95
    update_from: str = "model"
    baselines: dict[str, dict[str, float]] = field(default_factory=dict, init=False, repr=False)
    counts: dict[str, dict[str, int]] = field(default_factory=dict, init=False, repr=False)

    def validate(self) -> None:
        if not 0.0 <= float(self.ema) < 1.0:
            raise UbError(f"role_advantage ema must be in [0, 1), got {self.ema}")
        if self.update_from not in ("model", "all"):
            raise UbError(f"role_advantage update_from must be 'model' or 'all', "
                          f"got {self.update_from!r}")

    def _updates(self, actor: str) -> bool:
        return self.update_from == "all" or is_model_actor(actor)

    def transform_game(self, rewards: list[float], game: GameView) -> list[float]:
        seen = self.baselines.get(game.env_id, {})
        out = [r - seen.get(role, 0.0) for r, role in zip(rewards, game.roles, strict=True)]
        ema = float(self.ema)
        for r, role, actor in zip(rewards, game.roles, game.actors, strict=True):
            if self._updates(actor):
                env = self.baselines.setdefault(game.env_id, {})
                counts = self.counts.setdefault(game.env_id, {})
                env[role] = ema * env.get(role, 0.0) + (1.0 - ema) * r
                counts[role] = counts.get(role, 0) + 1
        return out

    def apply(self, rewards: np.ndarray, seats: SeatRows) -> np.ndarray:
        # Baselines of different (env, role) keys never interact, so rows are grouped by key
        # (stable: canonical order within a key) and each key's recursion runs on its own.
        # The recursion is sequential by nature: a tight loop over plain floats keeps it
        # bit-identical to transform_game, at ~0.2 us per seat.
        n = len(rewards)
        keys = pc.binary_join_element_wise(seats.env_id, seats.role, "\x1f")
        encoded = pc.dictionary_encode(keys)
        codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        pairs = [k.split("\x1f", 1) for k in encoded.dictionary.to_pylist()]
        if self.update_from == "all":
            updates = np.ones(n, dtype=bool)
        else:
            # One decision per distinct name, by the one function that defines a model actor.
            names = pc.dictionary_encode(seats.actor)
            is_model = np.array([is_model_actor(a) for a in names.dictionary.to_pylist()],
                                dtype=bool)
            updates = is_model[names.indices.to_numpy(zero_copy_only=False).astype(np.int64)]
        order = np.argsort(codes, kind="stable")
        ema, one_minus = float(self.ema), 1.0 - float(self.ema)
        out_sorted: list[float] = []
        final_b: dict[int, float] = {}
        prev_code, prev_game, b, b_read = -1, -1, 0.0, 0.0
        for code, game, r, update in zip(codes[order].tolist(), seats.game[order].tolist(),
                                         rewards[order].tolist(), updates[order].tolist(),
                                         strict=True):
            if code != prev_code:
                if prev_code >= 0:
                    final_b[prev_code] = b
                env, role = pairs[code]
                b = self.baselines.get(env, {}).get(role, 0.0)
                prev_code, prev_game = code, -1
            if game != prev_game:  # every seat of a game reads b before the game updates it
                b_read, prev_game = b, game
            out_sorted.append(r - b_read)
            if update:
                b = ema * b + one_minus * r
        if prev_code >= 0:
            final_b[prev_code] = b
        added = np.bincount(codes[updates], minlength=len(pairs))
        for code, b in final_b.items():
            if added[code]:
                env, role = pairs[code]
                self.baselines.setdefault(env, {})[role] = b
                counts = self.counts.setdefault(env, {})
                counts[role] = counts.get(role, 0) + int(added[code])
        out = np.empty(n, dtype=np.float64)
        out[order] = out_sorted
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"baselines": json.loads(json.dumps(self.baselines)),
                "counts": json.loads(json.dumps(self.counts))}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.baselines = {env: {role: float(b) for role, b in roles.items()}
                          for env, roles in state.get("baselines", {}).items()}
        self.counts = {env: {role: int(n) for role, n in roles.items()}
                       for env, roles in state.get("counts", {}).items()}


# --------------------------------------------------------------------------------------------
# The final stage over a games table
# --------------------------------------------------------------------------------------------


def sort_games(games: pa.Table) -> pa.Table:
    """``games`` in the canonical order ``(round, game_index, game_id)``."""
    return games.sort_by([("round", "ascending"), ("game_index", "ascending"),
                          ("game_id", "ascending")])


def games_after(games: pa.Table, key: GameKey) -> pa.Array:
    """Mask of the games strictly after ``key`` in the canonical order."""
    r, i, gid = key
    rnd, idx, ids = games["round"], games["game_index"], games["game_id"]
    same_round = pc.equal(rnd, r)
    return pc.or_(pc.greater(rnd, r), pc.and_(same_round, pc.or_(
        pc.greater(idx, i), pc.and_(pc.equal(idx, i), pc.greater(ids, gid)))))


def seat_rows(games: pa.Table) -> SeatRows:
    """Explode sorted, non-errored ``games`` into :class:`SeatRows` (vectorized)."""
    games = games.combine_chunks()
    n = games.num_rows
    rewards = games["rewards"].chunk(0) if n else pa.array([], pa.list_(pa.float32()))
    lengths = pc.list_value_length(rewards).to_numpy(zero_copy_only=False)
    num_players = games["num_players"].to_numpy()
    for column, may_be_null in (("roles", True), ("actors", False), ("results", True)):
        col = games[column].chunk(0) if n else pa.array([], pa.list_(pa.string()))
        col_len = pc.fill_null(pc.list_value_length(col), -1).to_numpy(zero_copy_only=False)
        bad = np.flatnonzero((col_len != lengths) & ~(may_be_null & (col_len == -1)))
        if len(bad):
            g = int(bad[0])
            raise UbError(f"game {games['game_id'][g].as_py()} has {lengths[g]} rewards but "
                          f"{max(col_len[g], 0)} {column}: the games shard is inconsistent")
    bad = np.flatnonzero(lengths != num_players)
    if len(bad):
        g = int(bad[0])
        raise UbError(f"game {games['game_id'][g].as_py()} has {lengths[g]} rewards for "
                      f"{num_players[g]} players: the games shard is inconsistent")
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    game = np.repeat(np.arange(n), lengths)
    seat = (np.arange(total) - offsets[:-1][game]).astype(np.int32)
    raw = pc.list_flatten(rewards)
    if raw.null_count:
        row = int(np.flatnonzero(raw.is_null().to_numpy(zero_copy_only=False))[0])
        raise UbError(f"game {games['game_id'][int(game[row])].as_py()} has a null reward for "
                      f"seat {seat[row]} but is not marked as errored")
    roles_col = games["roles"].chunk(0) if n else pa.array([], pa.list_(pa.string()))
    role = _flatten_padded(roles_col, lengths)
    if role.null_count:  # a seat without a role name gets "seat N"
        seat_names = pa.array([f"seat {s}" for s in seat.tolist()], pa.string())
        role = pc.coalesce(role, seat_names)
    results_col = games["results"].chunk(0) if n else pa.array([], pa.list_(pa.string()))
    return SeatRows(
        game_id=games["game_id"].chunk(0) if n else pa.array([], pa.string()),
        round=games["round"].to_numpy(), game_index=games["game_index"].to_numpy(),
        offsets=offsets, game=game, seat=seat,
        env_id=games["env_id"].chunk(0).take(pa.array(game)) if n else pa.array([], pa.string()),
        role=role,
        actor=pc.list_flatten(games["actors"].chunk(0)) if n else pa.array([], pa.string()),
        result=_flatten_padded(results_col, lengths),
        raw_reward=raw.to_numpy(zero_copy_only=False).astype(np.float64),
    )


def _flatten_padded(lists: pa.Array, lengths: np.ndarray) -> pa.Array:
    """Flatten ``lists``, standing in ``lengths[i]`` nulls for a null list ``i``."""
    if not lists.null_count:
        return pc.list_flatten(lists)
    filled = [x if x is not None else [None] * int(n) for x, n in zip(
        lists.to_pylist(), lengths, strict=True)]
    return pa.array([v for x in filled for v in x], type=lists.type.value_type)


@dataclass
class FinalRewards:
    """The final stage's output.

    :param table: one row per (non-errored game, seat), in canonical order, with the columns of
        :data:`FINAL_REWARDS_SCHEMA` (``raw_reward`` from ``games.rewards``, ``reward`` after
        the chain).
    :param state: the chain's state after the last game (JSON-able; see
        :meth:`FinalRewardChain.state_dict`).
    :param state_by_round: the state after the last game of each round in the input (from
        ``snapshot_from`` on, see :meth:`FinalRewardChain.fold`).
    """

    table: pa.Table
    state: dict[str, Any]
    state_by_round: dict[int, dict[str, Any]]


class FinalRewardChain:
    """The final stage: a list of final transforms plus the watermark of the games folded in.

    :meth:`fold` accepts only games after the watermark, in any order (it sorts them), so a
    chain restored from :meth:`state_dict` continues exactly as an uninterrupted one would.
    """

    def __init__(self, specs: Iterable[str | Mapping[str, Any] | RewardTransform] = ()) -> None:
        self.transforms: list[FinalTransform] = build_transforms("final", specs)
        self.through: GameKey | None = None  # the last game folded in (canonical key)
        self.games_folded = 0  # games folded in, errored ones included

    def specs(self) -> list[dict[str, Any]]:
        """The config entries of the chain's transforms."""
        return [t.spec() for t in self.transforms]

    def state_dict(self) -> dict[str, Any]:
        """A JSON-able snapshot: format, transform specs and states, watermark, games count."""
        return {
            "format": STATE_FORMAT,
            "transforms": [{"name": t.name, "params": t.params(), "state": t.state_dict()}
                           for t in self.transforms],
            "through": list(self.through) if self.through is not None else None,
            "games": self.games_folded,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict`; refuse one saved with other transforms or parameters."""
        if state.get("format") != STATE_FORMAT:
            raise UbError(f"final-rewards state has format {state.get('format')!r}, this ub "
                          f"reads {STATE_FORMAT}: start from no state (replays from round 0)")
        saved = [{"name": t["name"], **t["params"]} for t in state.get("transforms", [])]
        mine = json.loads(json.dumps(self.specs()))
        if json.loads(json.dumps(saved)) != mine:
            raise UbError(f"final-rewards state was saved with final transforms {saved} but the "
                          f"config has {mine}: use the matching config, or no state to replay "
                          "the games from round 0")
        for t, saved_t in zip(self.transforms, state["transforms"], strict=True):
            t.load_state_dict(saved_t.get("state", {}))
        through = state.get("through")
        self.through = (int(through[0]), int(through[1]), str(through[2])) if through else None
        self.games_folded = int(state.get("games", 0))

    def fold(self, games: pa.Table, snapshot_from: int | None = None) -> FinalRewards:
        """Fold ``games`` (all after the watermark) into the state; return their final rewards.

        Errored games (``outcome = 'error'`` or null ``rewards``) produce no rows and leave the
        transforms' state unchanged; they still move the watermark. The state is snapshotted
        after each round from ``snapshot_from`` on (every round when ``None``); earlier rounds
        are folded in one pass.
        """
        games = sort_games(games)
        if self.through is not None and games.num_rows:
            first = (games["round"][0].as_py(), games["game_index"][0].as_py(),
                     games["game_id"][0].as_py())
            if first <= self.through:
                raise UbError(
                    f"game {first[2]} (round {first[0]}, index {first[1]}) is at or before the "
                    f"final-rewards state's last game {self.through[2]} (round "
                    f"{self.through[0]}, index {self.through[1]}): it was already folded in; "
                    "pass only later games, or an earlier state")
        rounds = games["round"].to_numpy() if games.num_rows else np.array([], np.int32)
        cuts = np.flatnonzero(np.diff(rounds)) + 1  # where a new round starts
        if snapshot_from is not None:
            cuts = cuts[rounds[cuts] > snapshot_from]
        tables, by_round = [], {}
        for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(rounds)], strict=True):
            if hi <= lo:
                continue
            tables.append(self._fold_sorted(games.slice(int(lo), int(hi - lo))))
            if snapshot_from is None or rounds[hi - 1] >= snapshot_from:
                by_round[int(rounds[hi - 1])] = self.state_dict()
        table = (pa.concat_tables(tables) if tables
                 else FINAL_REWARDS_SCHEMA.empty_table())
        return FinalRewards(table, self.state_dict(), by_round)

    def _fold_sorted(self, games: pa.Table) -> pa.Table:
        ok = pc.and_(pc.invert(pc.is_null(games["rewards"])),
                     pc.not_equal(games["outcome"], "error"))
        played = games.filter(ok)
        seats = seat_rows(played)
        reward = seats.raw_reward.copy()
        for t in self.transforms:
            reward = np.asarray(t.apply(reward, seats), dtype=np.float64)
            if len(reward) != len(seats):
                raise UbError(f"final transform {t.name} returned {len(reward)} rewards for "
                              f"{len(seats)} seats")
        if not np.all(np.isfinite(reward)):
            raise UbError("a final reward transform produced NaN or inf: check its parameters")
        last = games.num_rows - 1
        self.through = (games["round"][last].as_py(), games["game_index"][last].as_py(),
                        games["game_id"][last].as_py())
        self.games_folded += games.num_rows
        game = pa.array(seats.game)
        return pa.table({
            "game_id": seats.game_id.take(game),
            "seat": pa.array(seats.seat, pa.int32()),
            "env_id": seats.env_id,
            "role": seats.role,
            "round": pa.array(seats.round[seats.game], pa.int32()),
            "game_index": pa.array(seats.game_index[seats.game], pa.int32()),
            "raw_reward": pa.array(seats.raw_reward, pa.float64()),
            "reward": pa.array(reward, pa.float64()),
        }, schema=FINAL_REWARDS_SCHEMA)


def apply_final_transforms(
    games: pa.Table,
    specs: Iterable[str | Mapping[str, Any] | RewardTransform],
    state: Mapping[str, Any] | None = None,
) -> FinalRewards:
    """Apply the final chain ``specs`` to ``games`` (sorted into canonical order first).

    Pure: ``state`` (a previous :attr:`FinalRewards.state`, or ``None`` for a fresh start) is not
    modified. Returns the per-(game, seat) rewards and the new state.
    """
    chain = FinalRewardChain(specs)
    if state is not None:
        chain.load_state_dict(state)
    return chain.fold(games)


# --------------------------------------------------------------------------------------------
# Step transforms (SQL)
# --------------------------------------------------------------------------------------------


@register
@dataclass
class FormatReward(StepTransform):
    """Add ``bonus`` to the reward of a decision whose completion followed the answer format."""

    name: ClassVar[str] = "format_reward"
    bonus: float = 0.1

    def validate(self) -> None:
        sql_float(self.bonus)

    def sql(self, reward: str) -> str:
        return f"({reward}) + CASE WHEN format_ok THEN {sql_float(self.bonus)} ELSE 0.0 END"

    def apply_row(self, reward: float, row: Mapping[str, Any]) -> float:
        return reward + (float(self.bonus) if row["format_ok"] else 0.0)


@register
@dataclass
class InvalidMovePenalty(StepTransform):
    """An invalid move scores ``penalty`` (<= 0) below the lowest final reward of its game.

    ``reward := least(reward, game_min_final_reward) + penalty`` for a decision the game
    rejected. An additive penalty alone is not enough: in a game its seat went on to win, an
    invalid move would keep most of the win and, after centring, often a positive advantage.
    Anchored to the game's lowest final reward it can never score above any valid move of the
    same game (a valid move scores at least its seat's final reward), whatever the outcome.
    List it last among the step transforms, so no later bonus lifts an invalid move again.
    """

    name: ClassVar[str] = "invalid_move_penalty"
    penalty: float = -1.0

    def validate(self) -> None:
        sql_float(self.penalty)
        if float(self.penalty) > 0:
            raise UbError(f"invalid_move_penalty penalty is added to the game's lowest final "
                          f"reward and must be <= 0, got {self.penalty}")

    def sql(self, reward: str) -> str:
        return (f"CASE WHEN invalid_move THEN least({reward}, game_min_final_reward) + "
                f"{sql_float(self.penalty)} ELSE {reward} END")

    def apply_row(self, reward: float, row: Mapping[str, Any]) -> float:
        if not row["invalid_move"]:
            return reward
        return min(reward, row["game_min_final_reward"]) + float(self.penalty)


def step_reward_sql(transforms: Sequence[StepTransform], base: str) -> str:
    """The SQL expression of the shaped reward: ``base`` through every step transform in order."""
    expr = base
    for t in transforms:
        expr = t.sql(expr)
    return expr


# --------------------------------------------------------------------------------------------
# Sampling transforms (SQL window expressions)
# --------------------------------------------------------------------------------------------


@dataclass
class _Normalize(SamplingTransform):
    """Shared by ``normalize`` and ``normalize_per_env``: (x - mean) / std over a partition."""

    partition: ClassVar[tuple[str, ...]] = ()
    scale: bool = True  # False: subtract the mean only
    eps: float = 1e-6  # a std at or below eps counts as zero: the advantage is 0, never inf

    def validate(self) -> None:
        if not isinstance(self.scale, bool):
            raise UbError(f"{self.name} scale must be true or false, got {self.scale!r}")
        if not float(self.eps) > 0:
            raise UbError(f"{self.name} eps must be > 0, got {self.eps}")
        sql_float(self.eps)

    def sql(self, value: str) -> str:
        over = f"OVER (PARTITION BY {', '.join(self.partition)})" if self.partition else "OVER ()"
        centered = f"({value} - avg({value}) {over})"
        if not self.scale:
            return centered
        # stddev_pop is 0 (not NULL, unlike stddev_samp) for a one-row group; the guard maps a
        # zero-variance group to 0 instead of 0/0.
        std = f"stddev_pop({value}) {over}"
        return f"CASE WHEN {std} > {sql_float(self.eps)} THEN {centered} / {std} ELSE 0.0 END"

    def apply_rows(self, values: list[float], rows: Sequence[Mapping[str, Any]]) -> list[float]:
        groups: dict[tuple, list[int]] = {}
        for i, row in enumerate(rows):
            groups.setdefault(tuple(row[c] for c in self.partition), []).append(i)
        out = [0.0] * len(values)
        for members in groups.values():
            xs = [values[i] for i in members]
            mean = sum(xs) / len(xs)
            std = math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))
            for i in members:
                if not self.scale:
                    out[i] = values[i] - mean
                else:
                    out[i] = (values[i] - mean) / std if std > self.eps else 0.0
        return out


@register
@dataclass
class Normalize(_Normalize):
    """Normalize over the whole batch: ``(x - mean) / std`` (or ``x - mean`` with scale=false)."""

    name: ClassVar[str] = "normalize"


@register
@dataclass
class NormalizePerEnv(_Normalize):
    """Normalize within each env_id of the batch: ``(x - mean_env) / std_env``."""

    name: ClassVar[str] = "normalize_per_env"
    partition: ClassVar[tuple[str, ...]] = ("env_id",)
