"""Which files a batch reads, and the final stage over their games (Python, canonical order)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from ub.batch.config import BatchConfig
from ub.data.schema import GAMES_SCHEMA
from ub.data.shards import (
    ShardId,
    check_shard_schema,
    committed_shards,
    round_ranges,
    shard_path,
)
from ub.data.sql import quote, read_parquet_sql
from ub.errors import UbError
from ub.rewards import FinalRewardChain, FinalTransform, games_after

# The games columns the final stage reads.
GAME_COLUMNS = ["round", "game_index", "game_id", "env_id", "num_players", "actors", "roles",
                "rewards", "results", "outcome"]


@dataclass
class Plan:
    root: Path
    first_round: int
    last_round: int
    window: list[ShardId]  # steps shards to sample from
    shards: list[ShardId]  # every committed shard through last_round (for the final stage)
    versions: dict[ShardId, int]  # the schema version of each window shard's steps file

    def steps_sql(self, shards: Sequence[ShardId], options: str) -> str:
        """The steps rows of ``shards`` (of the window) in the current column names."""
        return read_parquet_sql("steps", [(shard_path(self.root, "steps", s), self.versions[s])
                                          for s in shards], options)


def check_file(path: Path, table: str) -> int:
    """Refuse a shard file that vanished or holds another schema (a footer read, ~0.5 ms: cheap
    next to reading the file, so it is not cached); returns its schema version."""
    if not path.is_file():
        raise UbError(f"cannot read {path}: it is gone; was the run directory changed "
                      "while reading?")
    return check_shard_schema(path, table)


def make_plan(root: Path, config: BatchConfig) -> Plan:
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
                      f"committed rounds are {round_ranges(rounds)}; change first_round/last_round")
    versions = {sid: check_file(shard_path(root, "steps", sid), "steps") for sid in window}
    return Plan(root, first, last, window, [s for s in shards if s.round <= last], versions)


# --------------------------------------------------------------------------------------------
# The final stage over the plan's games
# --------------------------------------------------------------------------------------------


def final_chain(transforms: Sequence[FinalTransform], state: Mapping[str, Any] | None
                ) -> FinalRewardChain:
    """A chain of the config's final ``transforms``, restored to ``state`` when given."""
    chain = FinalRewardChain(transforms)
    if state is not None:
        chain.load_state_dict(state)
    return chain


def _fold_start(plan: Plan, chain: FinalRewardChain) -> int:
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


def _read_games(plan: Plan, start_round: int, con: duckdb.DuckDBPyConnection) -> pa.Table:
    files = []
    for sid in plan.shards:
        if sid.round >= start_round:
            path = shard_path(plan.root, "games", sid)
            check_file(path, "games")
            files.append(quote(path))
    if not files:
        return pa.schema([GAMES_SCHEMA.field(c) for c in GAME_COLUMNS]).empty_table()
    # DuckDB reads the small games files in parallel (pyarrow.dataset was ~3x slower here).
    return run_sql(con, f"SELECT {', '.join(GAME_COLUMNS)} FROM read_parquet([{', '.join(files)}], "
                     "hive_partitioning = false)")


def final_stage(root: Path, config: BatchConfig,
                final_rewards_state: Mapping[str, Any] | None = None
                ) -> tuple[pa.Table, dict[str, Any], dict[int, dict[str, Any]]]:
    """The final stage alone, as :func:`assemble_batch` runs it: the window's final rewards
    (``ub.rewards.FINAL_REWARDS_SCHEMA``), the state after the window's last round, and the
    state after each round from ``first_round - 1`` on. Useful to persist or inspect the state
    without assembling a batch.
    """
    con = connect()
    try:
        return run_final_stage(make_plan(root, config), config, final_rewards_state, con)
    finally:
        con.close()


def run_final_stage(plan: Plan, config: BatchConfig, state: Mapping[str, Any] | None,
                 con: duckdb.DuckDBPyConnection
                 ) -> tuple[pa.Table, dict[str, Any], dict[int, dict[str, Any]]]:
    chain = final_chain(config.transforms.final, state)
    games = _read_games(plan, _fold_start(plan, chain), con)
    if chain.through is not None and games.num_rows:
        games = games.filter(games_after(games, chain.through))
    # Snapshots from the round before the window on: the next batch's window starts later.
    result = chain.fold(games, snapshot_from=plan.first_round - 1)
    table = result.table.filter(pc.greater_equal(result.table["round"], plan.first_round))
    return table, result.state, result.state_by_round


def connect(threads: int | None = None) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(":memory:")
    if threads is not None:
        con.execute(f"SET threads = {int(threads)}")
    return con


def run_sql(con: duckdb.DuckDBPyConnection, sql: str) -> pa.Table:
    try:
        return con.sql(sql).to_arrow_table()
    except duckdb.Error as exc:
        raise UbError(f"batch query failed: {str(exc).splitlines()[0]}") from None
