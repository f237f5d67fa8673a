"""The reward transforms' base classes, one per stage, and the registry that builds them by
name from config entries (see :mod:`ub.rewards`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from ub.components import import_path, is_import_path, load_class, public_name
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

    @classmethod
    def config_name(cls) -> str:
        """How a config names this transform: its registered ``name``, or else its import
        path (``package.module:Class``)."""
        registered = REGISTRY.get(cls.stage, {}).get(cls.name)
        return cls.name if registered is cls else import_path(cls)

    def spec(self) -> dict[str, Any]:
        """The config entry that rebuilds this transform: ``{"name": ..., **params}``."""
        return {"name": self.config_name(), **self.params()}

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
                raise UbError(f"final transform {self.config_name()} returned {len(new)} rewards "
                              f"for the {hi - lo} seats of game {view.game_id}")
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
        raise NotImplementedError(f"{self.config_name()} has no Python form")


@dataclass
class SamplingTransform(RewardTransform):
    """A batch-level transform, as a SQL window expression over the sampled rows.

    Each sampling transform is evaluated in its own query layer, so it may use window functions
    over the previous one's output (windows cannot be nested in one SQL expression).
    """

    stage: ClassVar[str] = "sampling"
    # Columns the batch query computes only for the transforms that read them
    # (:data:`ub.batch.sql.ON_DEMAND_COLUMNS`), e.g. ``state_key``; a property where a
    # parameter decides it (``state_baseline``'s ``key``).
    needs: ClassVar[tuple[str, ...]] = ()

    def sql(self, value: str) -> str:
        """The transformed value, given the column ``value`` of the value so far."""
        raise NotImplementedError

    def apply_rows(self, values: list[float], rows: Sequence[Mapping[str, Any]]) -> list[float]:
        """The same in plain Python (used by the reference implementation; optional)."""
        raise NotImplementedError(f"{self.config_name()} has no Python form")


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


GUIDE = "docs/rewards.md, \"Your own transform\""


def transform_class(stage: str, name: str) -> type[RewardTransform]:
    """The class a ``stage`` entry names: a registered name, or ``package.module:Class`` (a
    ``@dataclass`` subclass of the stage's base class, imported once)."""
    if is_import_path(name):
        loaded = load_class(name, _BASES[stage], f"{stage} reward transform", GUIDE)
        if "__dataclass_fields__" not in loaded.__dict__:
            raise UbError(f"{stage} reward transform {name!r} is not a @dataclass: decorate it "
                          f"with @dataclass, its fields are its parameters ({GUIDE})")
        return loaded
    registered = REGISTRY[stage].get(name)
    if registered is None:
        raise UbError(f"unknown {stage} reward transform {name!r}; available: "
                      f"{', '.join(available_transforms(stage))}; or your own as "
                      f"package.module:Class, a subclass of {public_name(_BASES[stage])} "
                      f"({GUIDE})")
    return registered


TransformSpec = str | Mapping[str, Any] | RewardTransform
"""A config entry of a transform: its name, ``{"name": ..., **params}``, or the object."""


def build_transforms(stage: str, specs: Iterable[TransformSpec]) -> list[Any]:
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
                raise UbError(f"{spec.config_name()} is a {spec.stage} transform, listed under "
                              f"{stage}")
            spec.validate()
            out.append(spec)
            continue
        if isinstance(spec, str):
            spec = {"name": spec}
        if not isinstance(spec, Mapping) or "name" not in spec:
            raise UbError(f"{stage} reward transform {spec!r} must be a name or a mapping with "
                          "'name', e.g. {'name': 'role_advantage', 'ema': 0.95}")
        params = {k: v for k, v in spec.items() if k != "name"}
        cls = transform_class(stage, str(spec["name"]))
        allowed = [f.name for f in dataclasses.fields(cls) if f.init]
        unknown = sorted(set(params) - set(allowed))
        if unknown:
            raise UbError(f"{stage} reward transform {cls.config_name()!r} has no parameter(s) "
                          f"{', '.join(unknown)}; its parameters: {', '.join(allowed) or 'none'}")
        try:
            transform = cls(**params)
        except (TypeError, ValueError) as exc:  # a transform of one's own checking its fields
            raise UbError(f"{stage} reward transform {cls.config_name()!r}: {exc}") from None
        transform.validate()
        out.append(transform)
    return out


@dataclass(frozen=True)
class RewardTransforms:
    """A batch's reward transforms, stage by stage: built and checked once from the config's
    entries (:meth:`build`), then handed as objects to the final stage and the batch query.

    Final transforms keep state while they fold games: a chain folds copies
    (:class:`~ub.rewards.FinalRewardChain`), so these stay as configured and build any number
    of chains.
    """

    final: tuple[FinalTransform, ...]
    step: tuple[StepTransform, ...]
    sampling: tuple[SamplingTransform, ...]

    @classmethod
    def build(cls, final: Iterable[TransformSpec], step: Iterable[TransformSpec],
              sampling: Iterable[TransformSpec]) -> RewardTransforms:
        """The three stages' objects from their config entries; :class:`UbError` for an
        unknown name, an unknown parameter or a bad value."""
        return cls(tuple(build_transforms("final", final)), tuple(build_transforms("step", step)),
                   tuple(build_transforms("sampling", sampling)))
