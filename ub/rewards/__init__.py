"""Reward transforms at three stages: final (per game), step (per decision), sampling (per batch).

A training reward is built in three composable stages, each a list of transforms applied in
order (the output of one is the input of the next):

1. **final** (:class:`FinalTransform`): per game, on the reward vector by seat, knowing the env,
   the roles, the actors and the results. Runs in Python over the ``games`` table in the
   *canonical order* (below), because a transform may keep state (``role_advantage``'s baselines).
2. **step** (:class:`StepTransform`): per decision, a SQL expression over the ``steps`` columns
   that shapes the reward (``format_reward``, ``invalid_move_penalty``). Runs inside DuckDB.
3. **sampling** (:class:`SamplingTransform`): on the sampled batch, a SQL window expression
   (``normalize``, ``normalize_per_env``, ``invalid_move_advantage``). Runs inside DuckDB, on
   the sampled rows only.

Transforms are configured by name with parameters, e.g.::

    final = [{"name": "win_draw_loss"}, {"name": "role_advantage", "ema": 0.95}]
    step = [{"name": "format_reward", "bonus": 0.1}]
    sampling = ["normalize_per_env"]

and built with :func:`build_transforms` (a batch builds them once: :class:`RewardTransforms`).
Your own transform: subclass the stage's base class as a dataclass (its fields are its
parameters), then name it by import path (``{"name": "package.module:Class"}``), or give it a
unique ``name`` and decorate it with :func:`register`; see ``docs/rewards.md``.

**Canonical order.** Final transforms see games sorted by ``(round, game_index, game_id)``.
``game_index`` is unique within a round and ``game_id`` within a run, so the order is total and
does not depend on which shard or task played a game, or on when it finished. Stateful transforms
are therefore a deterministic function of the games folded in, in that order; their state is a
plain JSON-able dict (:meth:`FinalRewardChain.state_dict`) that records the last game folded in
(the *watermark*), so a restored chain refuses to fold a game twice.

The modules: :mod:`~ub.rewards.base` (the base classes and the registry),
:mod:`~ub.rewards.final` (the built-in final transforms), :mod:`~ub.rewards.final_stage` (the
chain that folds games in canonical order) and :mod:`~ub.rewards.sql` (the step and sampling
transforms, as SQL).
"""

from ub.rewards.base import (
    FINAL_REWARDS_SCHEMA,
    REGISTRY,
    STAGES,
    STATE_FORMAT,
    FinalTransform,
    GameKey,
    GameView,
    RewardTransform,
    RewardTransforms,
    SamplingTransform,
    SeatRows,
    StepTransform,
    TransformSpec,
    available_transforms,
    build_transforms,
    register,
    sql_float,
)
from ub.rewards.final import RoleAdvantage, WinDrawLoss
from ub.rewards.final_stage import (
    FinalRewardChain,
    FinalRewards,
    apply_final_transforms,
    games_after,
    seat_rows,
    sort_games,
)
from ub.rewards.sql import (
    FormatReward,
    InvalidMoveAdvantage,
    InvalidMovePenalty,
    Normalize,
    NormalizePerEnv,
    PositionAdvantage,
    StateBaseline,
    step_reward_sql,
)

__all__ = [
    "FINAL_REWARDS_SCHEMA", "REGISTRY", "STAGES", "STATE_FORMAT", "FinalRewardChain",
    "FinalRewards", "FinalTransform", "FormatReward", "GameKey", "GameView",
    "InvalidMoveAdvantage", "InvalidMovePenalty", "Normalize", "NormalizePerEnv",
    "PositionAdvantage", "RewardTransform", "RewardTransforms", "RoleAdvantage",
    "SamplingTransform", "SeatRows", "StateBaseline", "StepTransform", "TransformSpec",
    "WinDrawLoss", "apply_final_transforms", "available_transforms", "build_transforms",
    "games_after", "register", "seat_rows", "sort_games", "sql_float", "step_reward_sql",
]
