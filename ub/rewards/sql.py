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
        out = [0.0] * len(values)
        for members in _row_groups(rows, lambda row: tuple(row[c] for c in self.partition)):
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


@register
@dataclass
class StateBaseline(SamplingTransform):
    """Subtract, from each decision's value, the mean value of the batch's *other* decisions
    taken in the same state (the same prompt tokens); a state seen once keeps its value.

    A per-state baseline: a game's outcome credits every move of the seat alike, but two
    decisions in the same position that went on to different outcomes tell the moves apart
    (the block that was made against the one that was missed). The mean of the other
    decisions does not depend on this decision's move, so the baseline adds no bias. Put it
    before ``normalize_per_env``.
    """

    name: ClassVar[str] = "state_baseline"
    needs: ClassVar[tuple[str, ...]] = ("state_key",)

    def sql(self, value: str) -> str:
        over = "OVER (PARTITION BY state_key)"
        n = f"count(*) {over}"
        return (f"CASE WHEN {n} > 1 THEN {value} - (sum({value}) {over} - {value}) / ({n} - 1) "
                f"ELSE {value} END")

    def apply_rows(self, values: list[float], rows: Sequence[Mapping[str, Any]]) -> list[float]:
        out = list(values)
        for members in _row_groups(rows, lambda row: tuple(row["prompt_token_ids"])):
            if len(members) > 1:
                total = sum(values[i] for i in members)
                for i in members:
                    out[i] = values[i] - (total - values[i]) / (len(members) - 1)
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
