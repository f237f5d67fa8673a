"""Shards on disk: atomic writes, commit rules, schema checks, provenance."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ub.actors.spec import parse_actor
from ub.data.schema import GAMES_SCHEMA, SCHEMA_VERSION, STEPS_SCHEMA
from ub.data.shards import (
    ShardId,
    check_shard_schema,
    committed_shards,
    next_free_shard,
    read_metadata,
    shard_path,
    write_parquet_atomic,
    write_shard,
)
from ub.data.sql import query
from ub.errors import UbError
from ub.games.specs import GameSpec
from ub.rollout import assign_games, play_games


@pytest.fixture(scope="module")
def rollout():
    spec = GameSpec("TicTacToe-v0-train")
    actors = [parse_actor("random"), parse_actor("random")]
    return play_games(assign_games(spec, actors, 30, base_seed=3), run="unit", base_seed=3)


def test_shard_paths_are_a_function_of_round_and_shard(tmp_path):
    assert shard_path(tmp_path, "steps", ShardId(3, 1)) == (
        tmp_path / "steps" / "round=000003" / "shard-0001.parquet"
    )


def test_written_shard_has_schema_rows_and_provenance(tmp_path, rollout):
    steps_path, games_path = write_shard(tmp_path, ShardId(0, 0), "unit", rollout.steps,
                                         rollout.games, {"model": "none"})
    assert pq.read_schema(steps_path).remove_metadata().equals(STEPS_SCHEMA)
    assert pq.read_schema(games_path).remove_metadata().equals(GAMES_SCHEMA)
    assert pq.ParquetFile(steps_path).metadata.row_group(0).column(0).compression == "ZSTD"
    meta = read_metadata(games_path)
    assert meta["schema_version"] == SCHEMA_VERSION
    assert (meta["run"], meta["round"], meta["shard"], meta["model"]) == ("unit", 0, 0, "none")
    games = query(tmp_path, "SELECT count(*) AS n, sum(num_turns) AS turns FROM games").to_pylist()
    steps = query(tmp_path, "SELECT count(*) AS n FROM steps").to_pylist()
    assert games[0]["n"] == 30
    assert steps[0]["n"] == games[0]["turns"] == rollout.steps.num_rows


def test_steps_without_games_are_not_committed(tmp_path, rollout):
    write_parquet_atomic(rollout.steps, shard_path(tmp_path, "steps", ShardId(0, 0)))
    assert committed_shards(tmp_path) == []
    assert query(tmp_path, "SELECT count(*) AS n FROM steps").to_pylist()[0]["n"] == 0
    # the half-written shard's index is not reused by a new writer
    assert next_free_shard(tmp_path, 0) == ShardId(0, 1)


def test_failed_write_leaves_nothing_behind(tmp_path, monkeypatch):
    target = tmp_path / "games" / "round=000000" / "shard-0000.parquet"

    def boom(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pq, "write_table", boom)
    with pytest.raises(UbError, match="No space left on device"):
        write_parquet_atomic(pa.table({"a": [1]}), target)
    assert os.listdir(target.parent) == []


def test_unwritable_folder_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(UbError, match="cannot create output folder"):
        write_parquet_atomic(pa.table({"a": [1]}), blocker / "sub" / "x.parquet")


def test_schema_checks_name_the_file(tmp_path, rollout):
    path = tmp_path / "foreign.parquet"
    pq.write_table(pa.table({"a": [1]}), path)
    with pytest.raises(UbError, match="not written by ub"):
        check_shard_schema(path, "steps")
    newer = write_parquet_atomic(rollout.steps, tmp_path / "newer.parquet",
                                 {"schema_version": SCHEMA_VERSION + 1})
    with pytest.raises(UbError, match="newer than this ub"):
        check_shard_schema(newer, "steps")
    partial = write_parquet_atomic(rollout.steps.drop_columns(["action"]),
                                   tmp_path / "partial.parquet", {"schema_version": 1})
    with pytest.raises(UbError, match="missing columns action"):
        check_shard_schema(partial, "steps")
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"PAR1 not really")
    with pytest.raises(UbError, match=r"garbage\.parquet is not a readable Parquet file"):
        read_metadata(garbage)


def test_sql_is_read_only(tmp_path, rollout):
    write_shard(tmp_path, ShardId(0, 0), "unit", rollout.steps, rollout.games)
    outside = tmp_path / "leak.csv"
    with pytest.raises(UbError, match="read-only: COPY statements are refused"):
        query(tmp_path, f"COPY games TO '{outside}'")
    assert not outside.exists()
    for statement in ("SET enable_external_access = true", "CREATE TABLE t AS SELECT 1",
                      "INSERT INTO games SELECT * FROM games", f"ATTACH '{tmp_path}/x.db'"):
        with pytest.raises(UbError, match=r"read-only: .* statements are refused"):
            query(tmp_path, statement)
    # Even a write hidden behind a SELECT cannot reach the file system.
    with pytest.raises(UbError, match="SQL error"):
        query(tmp_path, f"SELECT * FROM read_csv('{outside}')")
