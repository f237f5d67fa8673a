"""The built-in step transforms (per decision) and sampling transforms (per batch), as SQL
expressions DuckDB evaluates, with their plain-Python forms for the reference."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ub.errors import UbError
from ub.rewards.base import SamplingTransform, StepTransform, register, sql_float


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
class Discount(StepTransform):
    """Multiply the reward by ``gamma ** seat_moves_after``: the seat's last move of a game keeps
    all of it, each earlier move a factor ``gamma`` less.

    A game's outcome is mostly decided by its last moves (the winning move, the move that did
    not block it); an undiscounted final reward credits the opening as much as those.
    ``gamma = 1`` changes nothing.
    """

    name: ClassVar[str] = "discount"
    gamma: float = 0.9

    def validate(self) -> None:
        sql_float(self.gamma)
        if not 0.0 < float(self.gamma) <= 1.0:
            raise UbError(f"discount gamma must be in (0, 1], got {self.gamma}")

    def sql(self, reward: str) -> str:
        return f"({reward}) * pow({sql_float(self.gamma)}, seat_moves_after)"

    def apply_row(self, reward: float, row: Mapping[str, Any]) -> float:
        return reward * float(self.gamma) ** row["seat_moves_after"]


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


def _row_groups(rows: Sequence[Mapping[str, Any]],
                key: Callable[[Mapping[str, Any]], tuple]) -> list[list[int]]:
    """The indices of ``rows`` grouped by ``key`` (a window's PARTITION BY, in Python)."""
    groups: dict[tuple, list[int]] = {}
    for i, row in enumerate(rows):
        groups.setdefault(key(row), []).append(i)
    return list(groups.values())


def _check_scale(name: str, scale: object, eps: float) -> None:
    if not isinstance(scale, bool):
        raise UbError(f"{name} scale must be true or false, got {scale!r}")
    if not float(eps) > 0:
        raise UbError(f"{name} eps must be > 0, got {eps}")
    sql_float(eps)


def _standardized_sql(value: str, over: str, scale: bool, eps: float) -> str:
    """``value`` less its mean over the window ``over``, divided by its standard deviation
    there when ``scale``: 0 when that is at most ``eps`` (one row, or all values equal), never
    NaN or inf. stddev_pop is 0 (not NULL, unlike stddev_samp) for a one-row group."""
    centered = f"({value} - avg({value}) {over})"
    if not scale:
        return centered
    std = f"stddev_pop({value}) {over}"
    return f"CASE WHEN {std} > {sql_float(eps)} THEN {centered} / {std} ELSE 0.0 END"


def _standardized(xs: Sequence[float], scale: bool, eps: float) -> list[float]:
    """:func:`_standardized_sql` of one group, in Python."""
    mean = sum(xs) / len(xs)
    if not scale:
        return [x - mean for x in xs]
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))
    return [(x - mean) / std if std > eps else 0.0 for x in xs]


@dataclass
class _Normalize(SamplingTransform):
    """Shared by ``normalize`` and ``normalize_per_env``: (x - mean) / std over a partition."""

    partition: ClassVar[tuple[str, ...]] = ()
    scale: bool = True  # False: subtract the mean only
    eps: float = 1e-6  # a std at or below eps counts as zero: the advantage is 0, never inf

    def validate(self) -> None:
        _check_scale(self.name, self.scale, self.eps)

    def sql(self, value: str) -> str:
        over = f"OVER (PARTITION BY {', '.join(self.partition)})" if self.partition else "OVER ()"
        return _standardized_sql(value, over, self.scale, self.eps)

    def apply_rows(self, values: list[float], rows: Sequence[Mapping[str, Any]]) -> list[float]:
        out = [0.0] * len(values)
        for members in _row_groups(rows, lambda row: tuple(row[c] for c in self.partition)):
            for i, x in zip(members, _standardized([values[i] for i in members], self.scale,
                                                   self.eps), strict=True):
                out[i] = x
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


# The three keys a decision's state can be read by: the prompt it saw, token for token (which
# holds the move history); its position (``steps.position``: the game's state as the mover
# faces it, ub.games.positions); or its branch point (``steps.branch_group``: the moves sampled
# from one position of one game, ub.branching). A NULL position or group is no state: such a
# decision is in no group.
STATE_KEYS = ("prompt", "position", "branch")


def _state_groups(rows: Sequence[Mapping[str, Any]], key: str) -> list[list[int]]:
    """The indices of ``rows`` that share a state, by ``key`` (NULL keys left out)."""
    if key == "prompt":
        return _row_groups(rows, lambda row: tuple(row["prompt_token_ids"]))
    column = "branch_group" if key == "branch" else "position"
    keyed = [i for i, row in enumerate(rows) if row[column] is not None]
    groups = _row_groups([rows[i] for i in keyed], lambda row: (row["env_id"], row[column]))
    return [[keyed[j] for j in members] for members in groups]


def _state_window(key: str) -> tuple[str, str]:
    """(the SQL window over a decision's state, the condition that it has one) for ``key``."""
    if key == "prompt":
        return "OVER (PARTITION BY state_key)", "TRUE"
    column = "branch_group" if key == "branch" else "position"
    return f"OVER (PARTITION BY env_id, {column})", f"{column} IS NOT NULL"


def _check_key(name: str, key: object, keys: Sequence[str]) -> None:
    if key not in keys:
        raise UbError(f"{name} key must be one of {', '.join(keys)}, got {key!r}")


@register
@dataclass
class StateBaseline(SamplingTransform):
    """Subtract, from each decision's value, the mean value of the batch's *other* decisions
    taken in the same state; a state seen once keeps its value.

    A per-state baseline: a game's outcome credits every move of the seat alike, but two
    decisions in the same position that went on to different outcomes tell the moves apart
    (the block that was made against the one that was missed). The mean of the other
    decisions does not depend on this decision's move, so the baseline adds no bias. Put it
    before ``normalize_per_env``. ``key``: ``prompt`` (the same prompt tokens, so the same
    history too), ``position`` (the same ``env_id`` and ``steps.position``; a decision
    without a position keeps its value) or ``branch`` (the same ``steps.branch_group``: the
    ``rollout.branch.k`` moves sampled from one position of one game, ub.branching; a
    decision at no branch point keeps its value).
    """

    name: ClassVar[str] = "state_baseline"
    key: str = "prompt"

    def validate(self) -> None:
        _check_key(self.name, self.key, STATE_KEYS)

    @property
    def needs(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("state_key",) if self.key == "prompt" else ()

    def sql(self, value: str) -> str:
        over, keyed = _state_window(self.key)
        n = f"count(*) {over}"
        return (f"CASE WHEN {keyed} AND {n} > 1 THEN {value} - (sum({value}) {over} - {value}) "
                f"/ ({n} - 1) ELSE {value} END")

    def apply_rows(self, values: list[float], rows: Sequence[Mapping[str, Any]]) -> list[float]:
        out = list(values)
        for members in _state_groups(rows, self.key):
            if len(members) > 1:
                total = sum(values[i] for i in members)
                for i in members:
                    out[i] = values[i] - (total - values[i]) / (len(members) - 1)
        return out


@register
@dataclass
class PositionAdvantage(SamplingTransform):
    """GiGPO's step-level advantage: add ``weight`` times the decision's return relative to the
    batch's other decisions taken in the same position.

    ``value + weight * A_step``, where ``A_step`` is the decision's shaped reward (the
    ``reward`` column: the step stage's output, its discounted return) less the mean reward of
    its group, the batch's decisions of the same ``env_id`` and ``steps.position``, divided by
    the group's standard deviation when ``scale`` (0 when that is at most ``eps``). A decision
    alone in its position, or without one (NULL), gets ``A_step = 0``.

    The episode-level term is the value so far, so list it after the normalization:
    ``[normalize_per_env, position_advantage]`` is GiGPO's ``A_episode + w * A_step``
    (Feng et al. 2025, arXiv 2505.10978). A game's outcome credits every move of a seat alike;
    within a position the moves are compared with each other, so "take the whole last pile"
    is scored against "take one" where both were possible. ``key: branch`` groups by
    ``steps.branch_group`` instead: the moves sampled from one position of one game
    (``rollout.branch``), compared with each other only.
    """

    name: ClassVar[str] = "position_advantage"
    weight: float = 1.0
    scale: bool = True
    eps: float = 1e-6
    key: str = "position"

    def validate(self) -> None:
        sql_float(self.weight)
        if not float(self.weight) > 0:
            raise UbError(f"position_advantage weight must be > 0, got {self.weight}")
        _check_scale(self.name, self.scale, self.eps)
        _check_key(self.name, self.key, STATE_KEYS[1:])

    def sql(self, value: str) -> str:
        over, keyed = _state_window(self.key)
        step = _standardized_sql("reward", over, self.scale, self.eps)
        return (f"{value} + {sql_float(self.weight)} * CASE WHEN {keyed} AND count(*) {over} > 1 "
                f"THEN {step} ELSE 0.0 END")

    def apply_rows(self, values: list[float], rows: Sequence[Mapping[str, Any]]) -> list[float]:
        out = list(values)
        for members in _state_groups(rows, self.key):
            if len(members) < 2:
                continue
            steps = _standardized([rows[i]["reward"] for i in members], self.scale, self.eps)
            for i, step in zip(members, steps, strict=True):
                out[i] += float(self.weight) * step
        return out


@register
@dataclass
class InvalidMoveAdvantage(SamplingTransform):
    """An invalid move's advantage is at most ``advantage`` (< 0): ``least(x, advantage)``.

    Normalization cannot tell a group apart from itself: when every decision of an env's batch
    is the same invalid move (a policy collapsed onto it), every reward is equal, the
    normalized advantage is 0 and no gradient leads away. Listed after the normalization, this
    keeps a push away from invalid moves whatever the rest of the group did, and leaves an
    invalid move that already scores lower as it is.
    """

    name: ClassVar[str] = "invalid_move_advantage"
    advantage: float = -1.0

    def validate(self) -> None:
        sql_float(self.advantage)
        if not float(self.advantage) < 0:
            raise UbError(f"invalid_move_advantage advantage is the most an invalid move may "
                          f"score and must be < 0, got {self.advantage}")

    def sql(self, value: str) -> str:
        return (f"CASE WHEN invalid_move THEN least({value}, {sql_float(self.advantage)}) "
                f"ELSE {value} END")

    def apply_rows(self, values: list[float], rows: Sequence[Mapping[str, Any]]) -> list[float]:
        return [min(v, float(self.advantage)) if row["invalid_move"] else v
                for v, row in zip(values, rows, strict=True)]
