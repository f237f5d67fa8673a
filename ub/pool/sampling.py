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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ub.errors import UbError
from ub.run.sections import LAGGED_K, OPPONENT_MODES

MODES = OPPONENT_MODES
_PARAMS = {"lagged": {"k"}, "fixed": {"names"}, "ts-dist": {"scale"}}


@dataclass(frozen=True)
class ModeSpec:
    """One component of the mixture."""

    mode: str
    weight: float = 1.0
    k: int = LAGGED_K
    names: tuple[str, ...] | None = None
    scale: float | None = None


@dataclass(frozen=True)
class OpponentConfig:
    """The ``opponents`` section: a mixture of modes, and the LoRA budget."""

    modes: tuple[ModeSpec, ...]
    max_active_lora: int | None = None

    @classmethod
    def from_dict(cls, data: Any) -> OpponentConfig:
        """From a list of ``{mode, weight, **params}`` (or ``{modes: [...],
        max_active_lora: N}``), validated with one clear error per problem."""
        max_active = None
        if isinstance(data, Mapping):
            unknown = sorted(set(data) - {"modes", "max_active_lora"})
            if unknown:
                raise UbError(f"unknown opponents setting(s) {', '.join(unknown)}; valid: "
                              "modes, max_active_lora")
            max_active = data.get("max_active_lora")
            data = data.get("modes", [])
        if isinstance(data, str | bytes) or not isinstance(data, Sequence) or not data:
            raise UbError("opponents must be a non-empty list of modes, e.g. "
                          "[{mode: mirror, weight: 0.8}, {mode: lagged, k: 4, weight: 0.2}]")
        if max_active is not None and (not isinstance(max_active, int) or max_active < 1):
            raise UbError(f"max_active_lora must be a positive integer, got {max_active!r}")
        modes = []
        for item in data:
            if isinstance(item, str):
                item = {"mode": item}
            if not isinstance(item, Mapping) or "mode" not in item:
                raise UbError(f"opponent mode {item!r} must be a name or a mapping with 'mode'")
            name = item["mode"]
            if name not in MODES:
                raise UbError(f"unknown opponent mode {name!r}; modes: {', '.join(MODES)}")
            allowed = {"mode", "weight"} | _PARAMS.get(name, set())
            extra = sorted(set(item) - allowed)
            if extra:
                raise UbError(f"opponent mode {name} has no parameter(s) {', '.join(extra)}; "
                              f"it takes: {', '.join(sorted(allowed - {'mode'}))}")
            weight = item.get("weight", 1.0)
            if isinstance(weight, bool) or not isinstance(weight, int | float) or weight < 0 \
                    or not math.isfinite(weight):
                raise UbError(f"opponent mode {name}: weight must be a number >= 0, got "
                              f"{weight!r}")
            k = item.get("k", LAGGED_K)
            if isinstance(k, bool) or not isinstance(k, int) or k < 1:
                raise UbError(f"opponent mode lagged: k must be a positive integer, got {k!r}")
            names = item.get("names")
            if names is not None and (isinstance(names, str) or not all(
                    isinstance(n, str) for n in names)):
                raise UbError(f"opponent mode fixed: names must be a list of actor names, got "
                              f"{names!r}")
            scale = item.get("scale")
            if scale is not None and (not isinstance(scale, int | float) or scale <= 0):
                raise UbError(f"opponent mode ts-dist: scale must be > 0, got {scale!r}")
            modes.append(ModeSpec(name, float(weight), k,
                                  tuple(names) if names is not None else None,
                                  None if scale is None else float(scale)))
        if sum(m.weight for m in modes) <= 0:
            raise UbError("opponent mode weights must sum to a positive number")
        if names := [n for m in modes for n in (m.names or ())]:
            from ub.actors.spec import parse_actor

            for n in names:
                parse_actor(n)  # unknown names list the valid ones
        return cls(tuple(modes), max_active)

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


def candidates(spec: ModeSpec, view: PoolView, max_active: int | None = None
               ) -> tuple[list[str], list[float]]:
    """The opponents a mode may pick and their (unnormalized) weights."""
    older = _active_checkpoints(view, max_active)
    if spec.mode == "mirror":
        return [view.current], [1.0]
    if spec.mode == "lagged":
        chosen = older[-spec.k:]
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
