"""One training batch: plan, final stage, both queries and collate, timed (see :mod:`ub.batch`)."""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from ub.batch.collate import collate
from ub.batch.config import BatchConfig
from ub.batch.plan import connect, make_plan, run_final_stage, run_sql
from ub.batch.sql import (
    MOVE_COLUMNS,
    TOKEN_COLUMNS,
    attach_tokens,
    explain_empty,
    fetch_sql,
    select_sql,
)
from ub.errors import UbError

if TYPE_CHECKING:  # (torch is imported where tensors are made: reading a config needs no torch)
    import torch


@dataclass
class BatchStats:
    """Per-batch figures, for logs and dashboards (:meth:`to_dict` gives a flat dict)."""

    size: int = 0  # rows in the batch
    requested: int = 0  # config.batch_size
    window: tuple[int, int] = (0, 0)  # rounds [first, last]
    shards: int = 0  # steps shards in the window
    total_tokens: int = 0  # tokens the learner sees (after truncation)
    prompt_tokens: int = 0  # of which prompt tokens
    completion_tokens: int = 0  # of which completion tokens
    max_len: int = 0  # longest sequence after truncation (the tensors' width)
    truncated: int = 0  # sequences longer than max_train_len
    truncated_tokens: int = 0  # tokens cut from them
    truncated_no_completion: int = 0  # truncated sequences left with no completion token
    reward_mean: float = 0.0  # reward after the final and step stages
    reward_std: float = 0.0
    reward_min: float = 0.0
    reward_max: float = 0.0
    advantage_mean: float = 0.0  # after the sampling stage: what the learner uses
    advantage_std: float = 0.0
    advantage_min: float = 0.0
    advantage_max: float = 0.0
    per_env: dict[str, int] = field(default_factory=dict)  # rows per env_id
    seconds: float = 0.0  # wall time of assemble_batch
    # wall time by phase: plan, final (read games + fold), select (phase 1), fetch (phase 2),
    # collate
    timings: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["window"] = list(self.window)
        return out


MaskedMoves = tuple[str, tuple[str, ...]]
"""A decision sampled under the legal-move mask: its template and its legal moves."""


@dataclass
class Batch:
    """A training batch: tensors, the rows they came from, stats and the reward state. The one
    type a batch has from here to the learner (which cuts it with :meth:`select`); the
    algorithms see its micro-batches' tokens as :class:`ub.learner.TokenBatch`.

    Tensors (``B`` rows, ``T`` = longest sequence after truncation):

    - ``input_ids`` (B, T) int64: prompt then completion token ids, right-padded with
      ``pad_token_id``;
    - ``completion_mask`` (B, T) float32: 1 on completion tokens only (what the loss trains on);
    - ``behaviour_logprobs`` (B, T) float32: at completion positions, the sampling logprob of
      the token *at that position* (``input_ids[b, t]``), 0 elsewhere; a learner that scores
      token ``t`` with the logits at ``t - 1`` compares them directly;
    - ``advantages`` (B,) float32: one per sequence, after the sampling stage (the
      ``advantage`` column);
    - ``lengths`` (B,) int64: real tokens per row;
    - ``returns`` (B,) float32: each decision's return, its reward after the final and step
      stages (the ``reward`` column: the sampling stage does not touch it), for an algorithm
      that reads returns (``Algorithm.reads``); ``None`` for a batch made without them.

    ``rows`` has one row per batch row, same order: identifiers (``game_id``, ``turn``, ``seat``,
    ``round``, ``shard``, ``env_id``, ...) and ``raw_reward``, ``final_reward``, ``reward``,
    ``advantage``. ``final_state`` is the final-rewards state after ``last_round``;
    ``final_state_by_round[r]`` the state after round ``r`` (persist the one of the round before
    the next window's first round; see ``docs/rewards.md``). A batch made in memory (a test, a
    benchmark) may leave them empty.

    ``measured`` holds what an update measured at its start, at the weights it began from (no
    gradient), by name: ``old_logprobs`` (B, T), like ``behaviour_logprobs`` but the learner's
    own, where an update of several steps measures its importance weights and trust region
    against them, and the (B,) columns the algorithm declares it adds (``Algorithm.adds``,
    e.g. a2c's ``values``). A batch as assembled has none; the update's copy gains them.

    ``masked_moves`` says, per row, what its decision was sampled under where that was the
    legal-move mask (``envs[].legal_moves: mask``): ``(template, legal moves)``, from which the
    learner rebuilds the constraint to score its tokens under (:mod:`ub.games.move_mask`);
    ``None`` for a row sampled free. ``None`` for the whole batch: no row was masked.
    """

    input_ids: torch.Tensor
    completion_mask: torch.Tensor
    behaviour_logprobs: torch.Tensor
    advantages: torch.Tensor
    lengths: torch.Tensor
    rows: pa.Table | None = None
    stats: BatchStats = field(default_factory=BatchStats)
    final_state: dict[str, Any] = field(default_factory=dict)
    final_state_by_round: dict[int, dict[str, Any]] = field(default_factory=dict)
    sql: str = ""
    returns: torch.Tensor | None = None
    measured: dict[str, torch.Tensor] = field(default_factory=dict)
    masked_moves: list[MaskedMoves | None] | None = None

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def attention_mask(self) -> torch.Tensor:
        """(B, T) int64: 1 on real tokens."""
        import torch

        return (torch.arange(self.input_ids.shape[1])[None, :] < self.lengths[:, None]).long()

    def validate(self) -> None:
        """Raise :class:`UbError` for an empty batch or tensors of inconsistent shapes."""
        rows = len(self)
        if rows == 0:
            raise UbError("the training batch is empty: there are no decisions to train on")
        shape = tuple(self.input_ids.shape)
        for name in ("completion_mask", "behaviour_logprobs"):
            if tuple(getattr(self, name).shape) != shape:
                raise UbError(f"batch {name} has shape {tuple(getattr(self, name).shape)}, "
                              f"input_ids has {shape}: the batch is inconsistent")
        for name in ("advantages", "lengths"):
            if tuple(getattr(self, name).shape) != (rows,):
                raise UbError(f"batch {name} has shape {tuple(getattr(self, name).shape)}, "
                              f"expected ({rows},): one value per row")
        if float(self.completion_mask.sum()) == 0:
            raise UbError(f"the training batch ({rows} rows) has no completion tokens: every "
                          "completion was cut by max_train_len? raise it")
        if bool(self.completion_mask[:, 0].any()):
            # Token t is scored by the logits at t - 1: a completion needs a prompt before it.
            raise UbError("a batch row starts with a completion token: every row needs at "
                          "least one prompt token")

    def select(self, rows: list[int]) -> Batch:
        """The given rows, in that order, trimmed to their longest row."""
        import torch

        index = torch.tensor(rows, dtype=torch.int64)
        width = int(self.lengths[index].max())

        def by_row(t: torch.Tensor) -> torch.Tensor:  # (B,) or (B, T)
            return t[index] if t.dim() == 1 else t[index, :width]

        return dataclasses.replace(
            self, input_ids=self.input_ids[index, :width],
            completion_mask=self.completion_mask[index, :width],
            behaviour_logprobs=self.behaviour_logprobs[index, :width],
            advantages=self.advantages[index], lengths=self.lengths[index],
            rows=None if self.rows is None else self.rows.take(pa.array(rows, pa.int64())),
            returns=None if self.returns is None else self.returns[index],
            measured={name: by_row(t) for name, t in self.measured.items()},
            masked_moves=None if self.masked_moves is None
            else [self.masked_moves[r] for r in rows])


@dataclass
class Selection:
    """The sampled rows (token lists included) in batch order, and how they were selected."""

    rows: pa.Table
    final_state: dict[str, Any]
    final_state_by_round: dict[int, dict[str, Any]]
    sql: str  # the phase-1 query
    window: tuple[int, int]
    shards: int  # steps shards in the window
    timings: dict[str, float]  # seconds by phase


def select_rows(root: Path, config: BatchConfig,
                final_rewards_state: Mapping[str, Any] | None = None, *,
                threads: int | None = None) -> Selection:
    """Plan, final stage, phase 1 and phase 2: the batch's rows as Arrow, in batch order.

    ``threads``: DuckDB's thread count (default: one per core). The result does not depend on it.
    """
    clock = time.perf_counter()
    timings: dict[str, float] = {}

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timings[name] = now - clock
        clock = now

    plan = make_plan(root, config)
    sql = select_sql(plan, config)
    lap("plan")
    con = connect(threads)
    try:
        final_rewards, state, by_round = run_final_stage(plan, config, final_rewards_state, con)
        con.register("final_rewards", final_rewards)
        lap("final")
        sampled = run_sql(con, sql)
        if sampled.num_rows == 0:
            raise explain_empty(con, plan, config, sql)
        lap("select")
        rows = attach_tokens(sampled, run_sql(con, fetch_sql(plan, sampled)), plan.root)
        lap("fetch")
    finally:
        con.close()
    return Selection(rows.drop_columns(["file_row_number"]), state, by_round, sql,
                     (plan.first_round, plan.last_round), len(plan.window), timings)


def _moments(values: np.ndarray) -> tuple[float, float, float, float]:
    if not len(values):
        return 0.0, 0.0, 0.0, 0.0
    return (float(values.mean()), float(values.std()), float(values.min()),
            float(values.max()))


def assemble_batch(root: Path, config: BatchConfig,
                   final_rewards_state: Mapping[str, Any] | None = None, *,
                   threads: int | None = None) -> Batch:
    """Assemble one training batch from the committed shards under ``root``.

    :param root: the data root (``steps/`` and ``games/`` inside).
    :param config: what to select, how to shape and sample it (:class:`BatchConfig`).
    :param final_rewards_state: the final stage's state saved after some round before the
        window (``batch.final_state_by_round[r]`` of an earlier batch, loaded from JSON), or
        ``None`` to replay every game from the first round (always correct, costs time
        proportional to the number of games).
    :param threads: DuckDB's thread count (default: one per core); the batch does not depend
        on it. On a machine whose cores are busy with other work, 1 can be faster.
    :raises UbError: empty selection (saying which filter emptied it), bad shard, bad config.
    """
    started = time.perf_counter()
    selection = select_rows(root, config, final_rewards_state, threads=threads)
    rows = selection.rows
    collate_started = time.perf_counter()
    tensors = collate(rows, config.pad_token_id, config.max_train_len)
    reward = rows["reward"].to_numpy()
    advantage = rows["advantage"].to_numpy()
    if not (np.all(np.isfinite(reward)) and np.all(np.isfinite(advantage))):
        raise UbError("the batch has a NaN or infinite reward or advantage: check the custom "
                      "reward transforms' SQL")
    stats = BatchStats(
        size=rows.num_rows, requested=config.batch_size,
        window=selection.window, shards=selection.shards,
        total_tokens=tensors.prompt_tokens + tensors.completion_tokens,
        prompt_tokens=tensors.prompt_tokens, completion_tokens=tensors.completion_tokens,
        max_len=int(tensors.input_ids.shape[1]), truncated=tensors.truncated,
        truncated_tokens=tensors.truncated_tokens,
        truncated_no_completion=tensors.truncated_no_completion,
        per_env=dict(sorted(Counter(rows["env_id"].to_pylist()).items())),
    )
    (stats.reward_mean, stats.reward_std, stats.reward_min, stats.reward_max) = _moments(reward)
    (stats.advantage_mean, stats.advantage_std, stats.advantage_min,
     stats.advantage_max) = _moments(advantage)
    stats.timings = {**selection.timings, "collate": time.perf_counter() - collate_started}
    stats.seconds = time.perf_counter() - started
    import torch

    return Batch(
        input_ids=tensors.input_ids, completion_mask=tensors.completion_mask,
        behaviour_logprobs=tensors.behaviour_logprobs,
        advantages=torch.from_numpy(advantage.astype(np.float32)), lengths=tensors.lengths,
        returns=torch.from_numpy(reward.astype(np.float32)),
        rows=rows.drop_columns(TOKEN_COLUMNS + MOVE_COLUMNS), stats=stats,
        final_state=selection.final_state,
        final_state_by_round=selection.final_state_by_round, sql=selection.sql,
        masked_moves=masked_moves(rows),
    )


def masked_moves(rows: pa.Table) -> list[MaskedMoves | None] | None:
    """Per row, ``(template, legal moves)`` where it was sampled under the legal-move mask;
    ``None`` when no row was."""
    modes = rows["legal_moves_mode"].to_pylist()
    if "mask" not in modes:
        return None
    templates, legal = rows["template"].to_pylist(), rows["legal_moves"].to_pylist()
    return [(templates[i], tuple(legal[i])) if mode == "mask" else None
            for i, mode in enumerate(modes)]
