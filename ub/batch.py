"""Training batches from a data root, assembled by DuckDB, delivered as torch tensors.

:func:`assemble_batch` does, in order:

1. **plan**: the committed shards whose round is in the window ``[first_round, last_round]``
   (explicit file lists, so DuckDB never lists or opens other rounds); every file's schema is
   checked (:func:`ub.data.shards.check_shard_schema`).
2. **final stage** (Python, :mod:`ub.rewards`): the games from the reward state's watermark (or
   from the first round, with no state) through ``last_round`` are folded into the final
   transform chain in canonical order; the window's per-(game, seat) rewards become an Arrow
   table that DuckDB joins.
3. **select** (one DuckDB query, :func:`batch_sql`): the learner's decisions in the window, their
   final rewards, step shaping, the optional zero-advantage drop, a seeded sample of
   ``batch_size`` rows and the sampling normalization on those rows. It reads scalar columns
   only.
4. **fetch** (one DuckDB query): the token lists of the sampled rows only, file by file.
5. **collate** (:func:`collate`): Arrow list offsets to padded numpy arrays to torch tensors.

Everything is a pure function of the data, the config and the reward state: the same inputs
give the same batch, row for row, in the same order.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import os
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from ub.data.schema import GAMES_SCHEMA
from ub.data.shards import ShardId, check_shard_schema, committed_shards, shard_path
from ub.errors import UbError, settings_from_mapping
from ub.rewards import (
    FinalRewardChain,
    GameView,
    InvalidMovePenalty,
    build_transforms,
    games_after,
    step_reward_sql,
)

# A reward whose magnitude is at or below this counts as zero for ``drop_zero_advantage``.
ZERO_EPS = 1e-9
# The games columns the final stage reads.
GAME_COLUMNS = ["round", "game_index", "game_id", "env_id", "num_players", "actors", "roles",
                "rewards", "results", "outcome"]
# The steps columns phase 1 reads (never the token lists, nor the texts).
DECISION_COLUMNS = ["round", "shard", "game_id", "turn", "seat", "env_id", "role", "actor",
                    "checkpoint", "format_ok", "invalid_move", "step_reward",
                    "num_prompt_tokens", "num_completion_tokens"]
TOKEN_COLUMNS = ["prompt_token_ids", "completion_token_ids", "completion_logprobs"]


def _default_final() -> list[str | dict[str, Any]]:
    return [{"name": "win_draw_loss"}, {"name": "role_advantage", "ema": 0.95}]


def _default_sampling() -> list[str | dict[str, Any]]:
    return [{"name": "normalize_per_env"}]


@dataclass
class BatchConfig:
    """What goes into a training batch. Every field is plain data (YAML/JSON-able).

    :param batch_size: decisions to sample (fewer if the pool is smaller: see ``stats.size``).
    :param first_round: first round of the window, inclusive; ``None``: the first committed round.
    :param last_round: last round of the window, inclusive; ``None``: the last committed round.
    :param actors: keep only decisions whose ``steps.actor`` is one of these; ``None``: any model.
    :param checkpoints: keep only decisions whose ``steps.checkpoint`` is one of these (e.g. the
        learner's current checkpoint, for on-policy training); ``None``: any.
    :param final: final-stage transforms, in order (names or ``{"name": ..., **params}``).
    :param step: step-stage transforms (per-decision shaping), in order.
    :param sampling: sampling-stage transforms (on the sampled rows), in order.
    :param drop_zero_advantage: drop decisions whose reward after the final and step stages is
        zero (``|reward| <= 1e-9``) *before* sampling: they carry no policy gradient. Note: this
        is the pre-normalization reward; a mean-centering sampling transform is applied later.
    :param max_train_len: keep the first ``max_train_len`` tokens of prompt + completion (the
        original UnstableBaselines rule); longer sequences are truncated and counted in the stats.
        ``None``: no limit.
    :param seed: the sampling seed. The sample is the ``batch_size`` rows with the smallest
        ``md5(f"{seed}/{game_id}/{turn}")``: pass a different seed per round (e.g.
        ``derive_seed(run_seed, round, "batch")``), or overlapping windows re-pick the same rows.
    :param pad_token_id: the id that pads ``input_ids`` on the right.
    """

    batch_size: int = 384
    first_round: int | None = None
    last_round: int | None = None
    actors: list[str] | None = None
    checkpoints: list[str] | None = None
    final: list[str | dict[str, Any]] = field(default_factory=_default_final)
    step: list[str | dict[str, Any]] = field(default_factory=list)
    sampling: list[str | dict[str, Any]] = field(default_factory=_default_sampling)
    drop_zero_advantage: bool = False
    max_train_len: int | None = None
    seed: int = 0
    pad_token_id: int = 0

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BatchConfig:
        """A validated config from a mapping (unknown keys are an error)."""
        return settings_from_mapping(cls, data, "batch")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self) -> None:
        """Raise :class:`UbError` for any bad setting, before any data is read."""
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise UbError(f"batch_size must be a positive integer, got {self.batch_size!r}")
        for key in ("first_round", "last_round"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise UbError(f"{key} must be a round number >= 0 or null, got {value!r}")
        if (self.first_round is not None and self.last_round is not None
                and self.first_round > self.last_round):
            raise UbError(f"the rounds window is empty: first_round {self.first_round} > "
                          f"last_round {self.last_round}")
        if self.max_train_len is not None and (
                not isinstance(self.max_train_len, int) or self.max_train_len < 1):
            raise UbError(f"max_train_len must be a positive integer or null, "
                          f"got {self.max_train_len!r}")
        for key in ("actors", "checkpoints"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, str) or not all(
                    isinstance(v, str) for v in value) or not value):
                raise UbError(f"{key} must be a non-empty list of names or null, got {value!r}")
        if not isinstance(self.seed, int):
            raise UbError(f"seed must be an integer, got {self.seed!r}")
        if not isinstance(self.pad_token_id, int) or self.pad_token_id < 0:
            raise UbError(f"pad_token_id must be an integer >= 0, got {self.pad_token_id!r}")
        FinalRewardChain(self.final)
        steps = [t.name for t in build_transforms("step", self.step)]
        if InvalidMovePenalty.name in steps[:-1]:
            raise UbError(f"step transforms {steps}: list {InvalidMovePenalty.name} last, so "
                          "that no later transform lifts an invalid move above a valid one")
        build_transforms("sampling", self.sampling)


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


@dataclass
class Batch:
    """A training batch: tensors, the rows they came from, stats and the reward state.

    Tensors (``B`` rows, ``T`` = longest sequence after truncation):

    - ``input_ids`` (B, T) int64: prompt then completion token ids, right-padded with
      ``pad_token_id``;
    - ``attention_mask`` (B, T) int64: 1 on real tokens;
    - ``completion_mask`` (B, T) float32: 1 on completion tokens only (what the loss trains on);
    - ``behaviour_logprobs`` (B, T) float32: at completion positions, the sampling logprob of
      the token *at that position* (``input_ids[b, t]``), 0 elsewhere; a learner that scores
      token ``t`` with the logits at ``t - 1`` compares them directly;
    - ``advantages`` (B,) float32: one per sequence;
    - ``lengths`` (B,) int64: real tokens per row.

    ``rows`` has one row per batch row, same order: identifiers (``game_id``, ``turn``, ``seat``,
    ``round``, ``shard``, ``env_id``, ...) and ``raw_reward``, ``final_reward``, ``reward``,
    ``advantage``. ``final_state`` is the final-rewards state after ``last_round``;
    ``final_state_by_round[r]`` the state after round ``r`` (persist the one of the round before
    the next window's first round; see ``docs/rewards.md``).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_mask: torch.Tensor
    behaviour_logprobs: torch.Tensor
    advantages: torch.Tensor
    lengths: torch.Tensor
    rows: pa.Table
    stats: BatchStats
    final_state: dict[str, Any]
    final_state_by_round: dict[int, dict[str, Any]]
    sql: str

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


# --------------------------------------------------------------------------------------------
# Plan: which files
# --------------------------------------------------------------------------------------------


@dataclass
class _Plan:
    root: Path
    first_round: int
    last_round: int
    window: list[ShardId]  # steps shards to sample from
    shards: list[ShardId]  # every committed shard through last_round (for the final stage)


# Committed shard files never change (they are renamed into place whole), so a schema check
# is remembered by (path, mtime, size): repeated batches in one process check each file once.
_CHECKED: set[tuple[str, int, int]] = set()


def _check(path: Path, table: str) -> None:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise UbError(f"cannot read {path}: {exc.strerror}; was the run directory changed "
                      "while reading?") from None
    key = (str(path), st.st_mtime_ns, st.st_size)
    if key not in _CHECKED:
        check_shard_schema(path, table)
        _CHECKED.add(key)


def _plan(root: Path, config: BatchConfig) -> _Plan:
    root = Path(root)
    if not root.is_dir():
        raise UbError(f"{root} is not a directory of ub data (expected steps/ and games/ inside)")
    shards = committed_shards(root)
    if not shards:
        raise UbError(f"no committed shards under {root}: the batch is empty; play some rounds "
                      "first (a shard counts once its games file is written)")
    rounds = sorted({s.round for s in shards})
    first = rounds[0] if config.first_round is None else config.first_round
    last = rounds[-1] if config.last_round is None else config.last_round
    window = [s for s in shards if first <= s.round <= last]
    if not window:
        raise UbError(f"no committed shards in rounds [{first}, {last}] under {root}: the "
                      f"committed rounds are {_ranges(rounds)}; change first_round/last_round")
    for sid in window:
        _check(shard_path(root, "steps", sid), "steps")
    return _Plan(root, first, last, window, [s for s in shards if s.round <= last])


def _ranges(values: Sequence[int]) -> str:
    out, start, prev = [], None, None
    for v in [*values, None]:
        if start is None:
            start = prev = v
        elif v is not None and v == prev + 1:
            prev = v
        else:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = v
    return ", ".join(out)


def _quote(text: str) -> str:
    return "'" + str(text).replace("'", "''") + "'"


# --------------------------------------------------------------------------------------------
# The final stage over the plan's games
# --------------------------------------------------------------------------------------------


def _chain(config: BatchConfig, state: Mapping[str, Any] | None) -> FinalRewardChain:
    chain = FinalRewardChain(config.final)
    if state is not None:
        chain.load_state_dict(state)
    return chain


def _fold_start(plan: _Plan, chain: FinalRewardChain) -> int:
    """The first round whose games must be read; refuse a state that overlaps the window."""
    if chain.through is None:
        return plan.shards[0].round
    through_round = chain.through[0]
    if through_round >= plan.first_round:
        before = plan.first_round - 1
        hint = (f"pass the state saved after round {before} (final_state_by_round[{before}] "
                "of an earlier batch), or no state to replay the games from the start"
                if before >= plan.shards[0].round else "pass no state: the window starts at "
                "the first round")
        raise UbError(
            f"the final-rewards state already includes games of round {through_round} (through "
            f"game {chain.through[2]}), inside the window [{plan.first_round}, "
            f"{plan.last_round}]: {hint}")
    return through_round


def _read_games(plan: _Plan, start_round: int, con: duckdb.DuckDBPyConnection) -> pa.Table:
    files = []
    for sid in plan.shards:
        if sid.round >= start_round:
            path = shard_path(plan.root, "games", sid)
            _check(path, "games")
            files.append(_quote(path))
    if not files:
        return pa.schema([GAMES_SCHEMA.field(c) for c in GAME_COLUMNS]).empty_table()
    # DuckDB reads the small games files in parallel (pyarrow.dataset was ~3x slower here).
    return _run(con, f"SELECT {', '.join(GAME_COLUMNS)} FROM read_parquet([{', '.join(files)}], "
                     "hive_partitioning = false)")


def final_stage(root: Path, config: BatchConfig,
                final_rewards_state: Mapping[str, Any] | None = None
                ) -> tuple[pa.Table, dict[str, Any], dict[int, dict[str, Any]]]:
    """The final stage alone, as :func:`assemble_batch` runs it: the window's final rewards
    (``ub.rewards.FINAL_REWARDS_SCHEMA``), the state after the window's last round, and the
    state after each round from ``first_round - 1`` on. Useful to persist or inspect the state
    without assembling a batch.
    """
    config.validate()
    con = _connect()
    try:
        return _final_stage(_plan(root, config), config, final_rewards_state, con)
    finally:
        con.close()


def _final_stage(plan: _Plan, config: BatchConfig, state: Mapping[str, Any] | None,
                 con: duckdb.DuckDBPyConnection
                 ) -> tuple[pa.Table, dict[str, Any], dict[int, dict[str, Any]]]:
    chain = _chain(config, state)
    games = _read_games(plan, _fold_start(plan, chain), con)
    if chain.through is not None and games.num_rows:
        games = games.filter(games_after(games, chain.through))
    # Snapshots from the round before the window on: the next batch's window starts later.
    result = chain.fold(games, snapshot_from=plan.first_round - 1)
    table = result.table.filter(pc.greater_equal(result.table["round"], plan.first_round))
    return table, result.state, result.state_by_round


# --------------------------------------------------------------------------------------------
# SQL
# --------------------------------------------------------------------------------------------


def _source_sql(plan: _Plan) -> str:
    """The window's steps shards, as an explicit file list (no globbing, no other rounds).

    Hive partitioning is off: ``round=NNNNNN`` in the path would shadow the ``round`` column.
    """
    files = ",\n        ".join(_quote(shard_path(plan.root, "steps", s)) for s in plan.window)
    return (f"read_parquet([\n        {files}\n    ], file_row_number = true, "
            "hive_partitioning = false)")


def _select_sql(plan: _Plan, config: BatchConfig) -> str:
    filters = [f"round BETWEEN {plan.first_round} AND {plan.last_round}"]
    if config.actors is not None:
        filters.append(f"actor IN ({', '.join(_quote(a) for a in config.actors)})")
    if config.checkpoints is not None:
        filters.append(f"checkpoint IN ({', '.join(_quote(c) for c in config.checkpoints)})")
    step = step_reward_sql(build_transforms("step", config.step), "final_reward + step_reward")
    drop = f"\n    WHERE abs(reward) > {ZERO_EPS!r}  -- drop_zero_advantage" if (
        config.drop_zero_advantage) else ""
    layers, prev = [], "sampled"
    for k, t in enumerate(build_transforms("sampling", config.sampling), start=1):
        layers.append(f"sampling_{k} AS (  -- {t.name} {t.params()}\n"
                      f"    SELECT * REPLACE ({t.sql('advantage')} AS advantage)\n"
                      f"    FROM {prev}\n)")
        prev = f"sampling_{k}"
    sampling = "".join(f",\n{layer}" for layer in layers)
    return f"""-- ub batch, phase 1: select, shape, sample and normalize (scalar columns only)
WITH decisions AS (  -- the learner's decisions in the window
    SELECT {', '.join(c if c != 'step_reward' else 'CAST(step_reward AS DOUBLE) AS step_reward'
                      for c in DECISION_COLUMNS)},
           file_row_number
    FROM {_source_sql(plan)}
    WHERE actor_kind = 'model'
      AND {(chr(10) + '      AND ').join(filters)}
),
game_floor AS (  -- each game's lowest final reward (invalid_move_penalty anchors to it)
    SELECT game_id, min(reward) AS game_min_final_reward
    FROM final_rewards
    GROUP BY game_id
),
joined AS (  -- final stage: the Arrow table `final_rewards`, one row per (game, seat);
             -- errored games have no row, so their decisions drop out here
    SELECT d.*, f.raw_reward, f.reward AS final_reward, g.game_min_final_reward
    FROM decisions AS d JOIN final_rewards AS f USING (game_id, seat)
         JOIN game_floor AS g USING (game_id)
),
shaped AS (  -- step stage
    SELECT *, {step} AS reward
    FROM joined
),
pool AS (  -- what can be sampled; sample_key is a pure function of (seed, game_id, turn)
    SELECT *, md5_number(concat({int(config.seed)}, '/', game_id, '/', turn)) AS sample_key
    FROM shaped{drop}
),
sampled AS (  -- uniform sample without replacement
    SELECT *, reward AS advantage
    FROM pool
    ORDER BY sample_key, game_id, turn
    LIMIT {int(config.batch_size)}
){sampling}
SELECT * EXCLUDE (sample_key)
FROM {prev}
ORDER BY sample_key, game_id, turn"""


def _fetch_sql(root: Path, rows: pa.Table) -> str:
    """Phase 2: the token lists of the given (round, shard, file_row_number) rows only.

    One branch per shard file, each filtered by row number, so DuckDB decodes the lists of those
    rows only. (Joining the sampled rows in SQL instead was measured ~40% slower.)
    """
    by_file: dict[tuple[int, int], list[int]] = {}
    for r, s, n in zip(rows["round"].to_pylist(), rows["shard"].to_pylist(),
                       rows["file_row_number"].to_pylist(), strict=True):
        by_file.setdefault((r, s), []).append(n)
    parts = [
        f"SELECT round, shard, file_row_number, game_id, turn, {', '.join(TOKEN_COLUMNS)}\n"
        f"FROM read_parquet({_quote(shard_path(root, 'steps', ShardId(r, s)))}, "
        "file_row_number = true, hive_partitioning = false)\n"
        f"WHERE file_row_number IN ({', '.join(map(str, sorted(numbers)))})"
        for (r, s), numbers in sorted(by_file.items())
    ]
    return ("-- ub batch, phase 2: the token lists of the sampled rows only, file by file\n"
            + "\nUNION ALL\n".join(parts))


def _attach_tokens(sampled: pa.Table, fetched: pa.Table, root: Path) -> pa.Table:
    """``sampled`` plus the token columns of ``fetched``, matched on (round, shard, row)."""
    where = {(r, s, n): i for i, (r, s, n) in enumerate(zip(
        fetched["round"].to_pylist(), fetched["shard"].to_pylist(),
        fetched["file_row_number"].to_pylist(), strict=True))}
    keys = zip(sampled["round"].to_pylist(), sampled["shard"].to_pylist(),
               sampled["file_row_number"].to_pylist(), strict=True)
    order = [where.get(k, -1) for k in keys]
    if -1 in order or len(order) != len(where):
        raise UbError(f"the sampled decisions changed between the two reads of {root}: was a "
                      "shard rewritten meanwhile? Retry the batch")
    fetched = fetched.take(pa.array(order))
    if not (fetched["game_id"].equals(sampled["game_id"])
            and fetched["turn"].equals(sampled["turn"])):
        raise UbError(f"the sampled decisions changed between the two reads of {root}: was a "
                      "shard rewritten meanwhile? Retry the batch")
    for name in TOKEN_COLUMNS:
        sampled = sampled.append_column(name, fetched[name])
    return sampled


def batch_sql(root: Path, config: BatchConfig) -> str:
    """The exact phase-1 query :func:`assemble_batch` runs for ``config`` on ``root``.

    It reads the Arrow table ``final_rewards`` (registered by the caller: see
    :func:`final_stage`), and returns the sampled rows without token lists.
    """
    config.validate()
    return _select_sql(_plan(root, config), config)


def explain(root: Path, config: BatchConfig) -> str:
    """A readable account of what :func:`assemble_batch` will do: plan and both queries."""
    config.validate()
    plan = _plan(root, config)
    fetch_example = _fetch_sql(plan.root, pa.table({
        "round": [plan.window[0].round], "shard": [plan.window[0].shard],
        "file_row_number": [0]}))
    return "\n".join([
        f"-- data root: {plan.root}",
        f"-- window: rounds [{plan.first_round}, {plan.last_round}], "
        f"{len(plan.window)} steps shards",
        f"-- final stage (Python, canonical order (round, game_index, game_id)): "
        f"{FinalRewardChain(config.final).specs()}",
        "",
        _select_sql(plan, config) + ";",
        "",
        "-- phase 2 is generated from phase 1's result (one branch per shard that holds a",
        "-- sampled row; rows are matched back on (round, shard, file_row_number)), e.g.:",
        fetch_example + ";",
    ])


# --------------------------------------------------------------------------------------------
# Selection
# --------------------------------------------------------------------------------------------


def _connect(threads: int | None = None) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(":memory:")
    if threads is not None:
        con.execute(f"SET threads = {int(threads)}")
    return con


def _run(con: duckdb.DuckDBPyConnection, sql: str) -> pa.Table:
    try:
        return con.sql(sql).to_arrow_table()
    except duckdb.Error as exc:
        raise UbError(f"batch query failed: {str(exc).splitlines()[0]}") from None


def _explain_empty(con: duckdb.DuckDBPyConnection, plan: _Plan, config: BatchConfig,
                   sql: str) -> UbError:
    """Which filter emptied the batch: run the same CTEs with counts."""
    ctes = sql[sql.index("WITH "):sql.index("\nSELECT * EXCLUDE")]
    files = _source_sql(plan)
    counts = _run(con, f"""{ctes}
SELECT (SELECT count(*) FROM {files} WHERE round BETWEEN {plan.first_round}
                                         AND {plan.last_round}) AS rows,
       (SELECT count(*) FROM {files} WHERE actor_kind = 'model' AND round BETWEEN
                                         {plan.first_round} AND {plan.last_round}) AS model,
       (SELECT count(*) FROM decisions) AS selected,
       (SELECT count(*) FROM joined) AS rewarded,
       (SELECT count(*) FROM pool) AS pool""").to_pylist()[0]
    where = f"rounds [{plan.first_round}, {plan.last_round}] of {plan.root}"
    if counts["model"] == 0:
        who = (f"{counts['rows']} decisions, all by scripted players" if counts["rows"]
               else "the shards hold no decisions at all")
        return UbError(f"no model decisions (actor_kind = 'model') in {where}: {who}; widen "
                       "the window or play rounds with the model")
    if counts["selected"] == 0:
        found = _run(con, f"SELECT DISTINCT actor, checkpoint FROM {files} WHERE actor_kind = "
                          f"'model' ORDER BY ALL LIMIT 10").to_pylist()
        have = ", ".join(f"{r['actor']} @ {r['checkpoint']}" for r in found)
        return UbError(f"no model decisions match actors={config.actors} "
                       f"checkpoints={config.checkpoints} in {where}; found (actor @ "
                       f"checkpoint): {have}")
    if counts["rewarded"] == 0:
        return UbError(f"all {counts['selected']} selected model decisions in {where} come from "
                       "errored games (no rewards); see `SELECT error FROM games` for why")
    return UbError(f"all {counts['rewarded']} selected model decisions in {where} have zero "
                   "reward after the final and step stages and drop_zero_advantage dropped "
                   "them; set drop_zero_advantage=false or change the reward transforms")


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
    config.validate()
    clock = time.perf_counter()
    timings: dict[str, float] = {}

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timings[name] = now - clock
        clock = now

    plan = _plan(root, config)
    sql = _select_sql(plan, config)
    lap("plan")
    con = _connect(threads)
    try:
        final_rewards, state, by_round = _final_stage(plan, config, final_rewards_state, con)
        con.register("final_rewards", final_rewards)
        lap("final")
        sampled = _run(con, sql)
        if sampled.num_rows == 0:
            raise _explain_empty(con, plan, config, sql)
        lap("select")
        rows = _attach_tokens(sampled, _run(con, _fetch_sql(plan.root, sampled)), plan.root)
        lap("fetch")
    finally:
        con.close()
    return Selection(rows.drop_columns(["file_row_number"]), state, by_round, sql,
                     (plan.first_round, plan.last_round), len(plan.window), timings)


# --------------------------------------------------------------------------------------------
# Arrow -> tensors
# --------------------------------------------------------------------------------------------


@dataclass
class Collated:
    """Padded numpy-backed tensors of a batch and its token counts (see :class:`Batch`)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_mask: torch.Tensor
    behaviour_logprobs: torch.Tensor
    lengths: torch.Tensor
    prompt_tokens: int
    completion_tokens: int
    truncated: int
    truncated_tokens: int
    truncated_no_completion: int


def _list_parts(column: pa.ChunkedArray | pa.Array, name: str, rows: pa.Table
                ) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, flat values) of a list column, straight from its offsets: no per-row loop."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if arr.null_count:
        i = int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
        where = (f"game {rows['game_id'][i].as_py()} turn {rows['turn'][i].as_py()}"
                 if "game_id" in rows.column_names else f"row {i}")
        raise UbError(f"{where} is a model decision without {name}: the steps shard is "
                      "incomplete; rerun its rollout")
    offsets = arr.offsets.to_numpy()
    values = arr.values.to_numpy(zero_copy_only=False)[offsets[0]:offsets[-1]]
    return np.diff(offsets).astype(np.int64), values


def collate(rows: pa.Table, pad_token_id: int = 0, max_train_len: int | None = None) -> Collated:
    """Right-padded tensors from ``rows``' ``prompt_token_ids``, ``completion_token_ids`` and
    ``completion_logprobs`` (numpy scatter over the Arrow buffers).

    A sequence longer than ``max_train_len`` keeps its first ``max_train_len`` tokens of
    prompt + completion (the completion is cut first; a prompt that alone exceeds the limit
    leaves no completion token, and the row then contributes nothing to the loss).
    """
    p_len, p_val = _list_parts(rows["prompt_token_ids"], "prompt_token_ids", rows)
    c_len, c_val = _list_parts(rows["completion_token_ids"], "completion_token_ids", rows)
    l_len, l_val = _list_parts(rows["completion_logprobs"], "completion_logprobs", rows)
    bad = np.flatnonzero(l_len != c_len)
    if len(bad):
        i = int(bad[0])
        raise UbError(f"row {i} has {c_len[i]} completion tokens but {l_len[i]} logprobs: the "
                      "steps shard is inconsistent")
    n = len(p_len)
    full = p_len + c_len
    keep = np.minimum(full, max_train_len) if max_train_len is not None else full
    width = int(keep.max()) if n else 0
    input_ids = np.full((n, width), pad_token_id, dtype=np.int64)
    completion_mask = np.zeros((n, width), dtype=np.float32)
    logprobs = np.zeros((n, width), dtype=np.float32)

    # prompt tokens: row r, position j < keep[r]
    row = np.repeat(np.arange(n), p_len)
    pos = np.arange(len(p_val)) - np.repeat(np.cumsum(p_len) - p_len, p_len)
    ok = pos < keep[row]
    input_ids[row[ok], pos[ok]] = p_val[ok]
    # completion tokens: after the prompt
    row = np.repeat(np.arange(n), c_len)
    pos = p_len[row] + np.arange(len(c_val)) - np.repeat(np.cumsum(c_len) - c_len, c_len)
    ok = pos < keep[row]
    input_ids[row[ok], pos[ok]] = c_val[ok]
    completion_mask[row[ok], pos[ok]] = 1.0
    logprobs[row[ok], pos[ok]] = l_val[ok]

    attention_mask = (np.arange(width)[None, :] < keep[:, None]).astype(np.int64)
    cut = full > keep
    return Collated(
        input_ids=torch.from_numpy(input_ids),
        attention_mask=torch.from_numpy(attention_mask),
        completion_mask=torch.from_numpy(completion_mask),
        behaviour_logprobs=torch.from_numpy(logprobs),
        lengths=torch.from_numpy(keep.astype(np.int64)),
        prompt_tokens=int(np.minimum(p_len, keep).sum()),
        completion_tokens=int(completion_mask.sum()),
        truncated=int(cut.sum()),
        truncated_tokens=int((full - keep).sum()),
        truncated_no_completion=int((cut & (p_len >= keep) & (c_len > 0)).sum()),
    )


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
    return Batch(
        input_ids=tensors.input_ids, attention_mask=tensors.attention_mask,
        completion_mask=tensors.completion_mask, behaviour_logprobs=tensors.behaviour_logprobs,
        advantages=torch.from_numpy(advantage.astype(np.float32)), lengths=tensors.lengths,
        rows=rows.drop_columns(TOKEN_COLUMNS), stats=stats, final_state=selection.final_state,
        final_state_by_round=selection.final_state_by_round, sql=selection.sql,
    )


# --------------------------------------------------------------------------------------------
# Plain-Python reference (tests and the benchmark compare assemble_batch against it)
# --------------------------------------------------------------------------------------------


def sample_key(seed: int, game_id: str, turn: int) -> int:
    """The sampling key of a decision, as the batch query computes it (``md5_number``)."""
    return int.from_bytes(hashlib.md5(f"{seed}/{game_id}/{turn}".encode()).digest(), "little")


def reference_rows(root: Path, config: BatchConfig,
                   final_rewards_state: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """The batch rows :func:`select_rows` returns, computed by loading shards into Python and
    looping: the final stage game by game (``transform_game``), step and sampling transforms
    through their Python forms. Slow; an oracle, not for training.
    """
    config.validate()
    root = Path(root)
    shards = committed_shards(root)
    rounds = [s.round for s in shards]
    first = min(rounds) if config.first_round is None else config.first_round
    last = max(rounds) if config.last_round is None else config.last_round

    # final stage: every game through `last`, after the watermark, in canonical order
    chain = _chain(config, final_rewards_state)
    games = []
    for sid in shards:
        if sid.round <= last:
            games += pq.read_table(shard_path(root, "games", sid), columns=GAME_COLUMNS).to_pylist()
    games.sort(key=lambda g: (g["round"], g["game_index"], g["game_id"]))
    final: dict[tuple[str, int], tuple[float, float]] = {}
    game_min: dict[str, float] = {}
    for g in games:
        key = (g["round"], g["game_index"], g["game_id"])
        if chain.through is not None and key <= chain.through:
            continue
        if g["rewards"] is None or g["outcome"] == "error":
            continue
        roles = [r if r is not None else f"seat {s}"
                 for s, r in enumerate(g["roles"] or [None] * len(g["rewards"]))]
        view = GameView(g["game_id"], g["round"], g["game_index"], g["env_id"], roles,
                        g["actors"], g["results"] or [None] * len(g["rewards"]),
                        [float(r) for r in g["rewards"]])
        rewards = list(view.raw_rewards)
        for t in chain.transforms:
            rewards = t.transform_game(rewards, view)
        if g["round"] >= first:
            for seat, (raw, r) in enumerate(zip(view.raw_rewards, rewards, strict=True)):
                final[(g["game_id"], seat)] = (raw, r)
            game_min[g["game_id"]] = min(rewards)

    # steps: filter, shape, keep the batch_size smallest sample keys
    steps = build_transforms("step", config.step)
    # A min-heap of (-key, n, row) keeps the batch_size smallest keys. md5 keys of distinct
    # (game_id, turn) never collide in practice, so the SQL tie-breakers are not needed here.
    best: list[tuple[int, int, dict]] = []
    for sid in shards:
        if not first <= sid.round <= last:
            continue
        table = pq.read_table(shard_path(root, "steps", sid),
                              columns=[*DECISION_COLUMNS, "actor_kind", *TOKEN_COLUMNS])
        for row in table.to_pylist():
            if row["actor_kind"] != "model":
                continue
            if config.actors is not None and row["actor"] not in config.actors:
                continue
            if config.checkpoints is not None and row["checkpoint"] not in config.checkpoints:
                continue
            got = final.get((row["game_id"], row["seat"]))
            if got is None:
                continue
            row["raw_reward"], row["final_reward"] = got
            row["game_min_final_reward"] = game_min[row["game_id"]]
            reward = row["final_reward"] + row["step_reward"]
            for t in steps:
                reward = t.apply_row(reward, row)
            row["reward"] = reward
            if config.drop_zero_advantage and abs(reward) <= ZERO_EPS:
                continue
            item = (-sample_key(config.seed, row["game_id"], row["turn"]), len(best), row)
            if len(best) < config.batch_size:
                heapq.heappush(best, item)
            elif item[0] > best[0][0]:
                heapq.heapreplace(best, item)
    picked = [item[2] for item in sorted(best, key=lambda x: x[0], reverse=True)]
    values = [r["reward"] for r in picked]
    for t in build_transforms("sampling", config.sampling):
        values = t.apply_rows(values, picked)
    for r, v in zip(picked, values, strict=True):
        r["advantage"] = v
        del r["actor_kind"]
    return picked
