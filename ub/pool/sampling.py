"""Opponent sampling: who the learner's current checkpoint plays.

A config is a list of modes with weights (a mixture); each game first draws a mode by weight,
then an opponent from that mode's distribution over the pool:

- ``mirror``: the current checkpoint itself (self-play);
- ``lagged`` (``k``, default 4): uniform over the last ``k`` checkpoints before the current one;
- ``random``: uniform over every checkpoint (current included) and fixed opponent;
- ``fixed`` (``names``, default all configured): uniform over fixed opponents;
- ``match-quality``: weight = TrueSkill's 1-vs-1 match quality with the current checkpoint
  (the probability-of-a-draw measure: close matches are likely);
- ``ts-dist`` (``scale``, default beta): weight = ``exp(-|mu - mu_current| / scale)``;
- ``exploration``: weight = ``sigma / (1 + games)``: members we know least about, seldom played.

``match-quality``, ``ts-dist`` and ``exploration`` range over the other pool members (older
checkpoints and fixed opponents). A mode with no candidate (``lagged`` at the first checkpoint,
``fixed`` with none configured) falls back to ``mirror``.

``max_active_lora`` (default none) bounds the distinct checkpoints any mode may pick: the current
one plus the most recent ``max_active_lora - 1`` others. vLLM keeps ``engine.max_loras``
adapters resident; older checkpoints would be swapped in and out every round.

Draws are deterministic for a seed (a local ``random.Random``).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Literal, get_args

from pydantic import Field, field_validator, model_serializer, model_validator

from ub.errors import UbError
from ub.settings import Section

OpponentModeName = Literal["mirror", "lagged", "random", "fixed", "match-quality", "ts-dist",
                           "exploration"]
OPPONENT_MODES: tuple[str, ...] = get_args(OpponentModeName)
MODES = OPPONENT_MODES
LAGGED_K = 4
"""How many recent checkpoints ``lagged`` picks from when ``k`` is not given."""
_PARAMETERS = {"lagged": ("k",), "fixed": ("names",), "ts-dist": ("scale",)}
"""The parameters a mode takes besides ``weight``; ``k``, ``names`` and ``scale`` are each
one mode's."""
_EXAMPLE = "[{mode: mirror, weight: 0.8}, {mode: lagged, k: 4, weight: 0.2}]"


class OpponentMode(Section):
    """One component of the opponents mixture (see docs/pool.md). Written as a mode's name
    alone, or as ``{mode, weight, **params}``; a mode takes only its own parameters (``k``
    lagged's, ``names`` fixed's, ``scale`` ts-dist's)."""

    mode: OpponentModeName = Field(description="How an opponent is drawn (docs/pool.md).")
    weight: float = Field(1.0, ge=0, description="Share of the games drawing this mode "
                          "(normalized over the modes).")
    k: int | None = Field(None, ge=1, description=f"lagged only: uniform over the last k "
                          f"checkpoints; null: {LAGGED_K}.")
    names: list[str] | None = Field(None, description="fixed only: the fixed opponents (actor "
                                    "names); null: all configured.")
    scale: float | None = Field(None, gt=0, description="ts-dist only: weight exp(-|mu - "
                                "mu_current| / scale); null: TrueSkill's beta.")

    key = "opponents.modes[]"

    @model_validator(mode="before")
    @classmethod
    def _own_parameters(cls, data: Any) -> Any:
        if isinstance(data, str):
            return {"mode": data}
        if not isinstance(data, dict) or data.get("mode") not in OPPONENT_MODES:
            return data  # (pydantic says what is wrong with it)
        takes = ("weight", *_PARAMETERS.get(data["mode"], ()))
        # Another mode's parameter given as null (a copy of a built mode) says nothing.
        extra = [k for k in data if k != "mode" and k not in takes
                 and (k not in cls.model_fields or data[k] is not None)]
        if extra:
            raise ValueError(f"mode {data['mode']} has no parameter {', '.join(map(str, extra))}"
                             f"; it takes: {', '.join(sorted(takes))}")
        return data

    @field_validator("names")
    @classmethod
    def _actor_names(cls, names: list[str] | None) -> list[str] | None:
        from ub.actors.spec import parse_actor

        for name in names or ():
            try:
                parse_actor(name)  # unknown names list the valid ones
            except UbError as exc:
                raise ValueError(str(exc)) from None
        return names

    @model_serializer(mode="wrap")
    def _given_only(self, handler: Any) -> dict[str, Any]:
        # A mode's parameters only when set: `{mode: mirror, weight: 1.0}`, as written.
        return {k: v for k, v in handler(self).items() if v is not None}

    @property
    def lagged_k(self) -> int:
        """How many recent checkpoints ``lagged`` picks from (``k``, else :data:`LAGGED_K`)."""
        return LAGGED_K if self.k is None else self.k


class OpponentConfig(Section):
    """Who the learner's checkpoint plays: a mixture of modes. Written as a list of modes, or
    as ``{modes: [...], max_active_lora: N}``."""

    modes: list[OpponentMode] = Field(
        default_factory=lambda: [OpponentMode(mode="mirror", weight=1.0)],
        description="The mixture: each game draws a mode by weight, then an opponent.")
    max_active_lora: int | None = Field(None, ge=1, description="Most distinct checkpoints any "
                                        "mode may pick; null: no bound.")

    key = "opponents"

    @model_validator(mode="before")
    @classmethod
    def _list_form(cls, data: Any) -> Any:
        if isinstance(data, list):
            return {"modes": data}
        if not isinstance(data, dict | OpponentConfig):
            raise ValueError(f"must be a list of modes, e.g. {_EXAMPLE}, got {data!r}")
        return data

    @field_validator("modes")
    @classmethod
    def _a_mixture(cls, modes: list[OpponentMode]) -> list[OpponentMode]:
        if not modes:
            raise ValueError(f"must be a non-empty list of modes, e.g. {_EXAMPLE}")
        if sum(m.weight for m in modes) <= 0:
            raise ValueError("the modes' weights must sum to a positive number")
        return modes

    @model_serializer(mode="wrap")
    def _as_written(self, handler: Any) -> Any:
        data = handler(self)
        return data["modes"] if data.get("max_active_lora") is None else data

    def fixed_names(self) -> tuple[str, ...]:
        """The fixed opponents the modes name (to add to the pool)."""
        return tuple(dict.fromkeys(n for m in self.modes for n in (m.names or ())))


@dataclass(frozen=True)
class PoolView:
    """What sampling sees: the current checkpoint, all checkpoints (oldest first, current
    last), fixed opponents, and the ratings (a :class:`ub.pool.ratings.RatingTable`)."""

    current: str
    checkpoints: tuple[str, ...]
    fixed: tuple[str, ...]
    ratings: Any


def _active_checkpoints(view: PoolView, max_active: int | None) -> list[str]:
    older = [c for c in view.checkpoints if c != view.current]
    if max_active is not None:
        older = older[len(older) - (max_active - 1):] if max_active > 1 else []
    return older


def candidates(spec: OpponentMode, view: PoolView, max_active: int | None = None
               ) -> tuple[list[str], list[float]]:
    """The opponents a mode may pick and their (unnormalized) weights."""
    older = _active_checkpoints(view, max_active)
    if spec.mode == "mirror":
        return [view.current], [1.0]
    if spec.mode == "lagged":
        chosen = older[-spec.lagged_k:]
        return chosen, [1.0] * len(chosen)
    if spec.mode == "random":
        chosen = [*older, view.current, *view.fixed]
        return chosen, [1.0] * len(chosen)
    if spec.mode == "fixed":
        chosen = list(spec.names if spec.names is not None else view.fixed)
        return chosen, [1.0] * len(chosen)
    others = [*older, *view.fixed]
    table = view.ratings
    me = table.rating(view.current)
    env = table.config.env()
    if spec.mode == "match-quality":
        return others, [env.quality_1vs1(me, table.rating(o)) for o in others]
    if spec.mode == "ts-dist":
        scale = spec.scale or table.config.beta
        return others, [math.exp(-abs(table.rating(o).mu - me.mu) / scale) for o in others]
    if spec.mode == "exploration":
        weights = []
        for o in others:
            m = table.members.get(o)
            sigma, games = (m.sigma, m.games) if m else (table.config.fixed_sigma, 0)
            weights.append(sigma / (1 + games))
        return others, weights
    raise UbError(f"unknown opponent mode {spec.mode!r}")


def sample_opponents(config: OpponentConfig, view: PoolView, num_games: int, seed: int,
                     num_opponents: int = 1) -> list[tuple[str, ...]]:
    """``num_opponents`` opponents for each of ``num_games`` games."""
    rng = random.Random(seed)
    table = [(spec, *candidates(spec, view, config.max_active_lora)) for spec in config.modes]
    mode_weights = [spec.weight for spec, _, _ in table]
    out = []
    for _ in range(num_games):
        picks = []
        for _ in range(num_opponents):
            _, names, weights = rng.choices(table, weights=mode_weights)[0]
            if not names or sum(weights) <= 0:
                picks.append(view.current)  # nothing to pick from: self-play
            else:
                picks.append(rng.choices(names, weights=weights)[0])
        out.append(tuple(picks))
    return out


def seat_players(learner: str, opponents: list[str], num_players: int, game_index: int,
                 seed: int) -> list[str]:
    """Seat the learner in seat ``game_index % num_players`` (so over consecutive games it
    plays every role equally often) and the opponents in the other seats, shuffled."""
    if len(opponents) != num_players - 1:
        raise UbError(f"{num_players} seats need {num_players - 1} opponent(s), got "
                      f"{len(opponents)}")
    others = list(opponents)
    random.Random(seed).shuffle(others)
    seat = game_index % num_players
    return [*others[:seat], learner, *others[seat:]]
