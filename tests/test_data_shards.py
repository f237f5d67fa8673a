"""Shards on disk: atomic writes, commit rules, schema checks, provenance."""

from __future__ import annotations

import os
from pathlib import Path

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
    round_dir,
    shard_path,
    uses_legacy_layout,
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
        tmp_path / "steps" / "round-000003" / "shard-0001.parquet"
    )


def _write_rounds(root, rollout, rounds):
    """Round ``r``'s shard for each of ``rounds`` (its decisions labelled as a model's)."""
    n, schema = rollout.steps.num_rows, rollout.steps.schema
    for round_ in rounds:
        steps = rollout.steps.set_column(schema.get_field_index("round"), "round",
                                         pa.array([round_] * n, pa.int32()))
        steps = steps.set_column(schema.get_field_index("actor_kind"), "actor_kind",
                                 pa.array(["model"] * n, pa.string()))
        write_shard(root, ShardId(round_, 0), "unit", steps, rollout.games)


def test_plain_readers_type_round_as_an_integer(tmp_path, rollout):
    """Plain DuckDB, pyarrow and pandas on the shard files, with no options: ``round`` is an
    integer (a hive folder ``round=000000`` made it DuckDB VARCHAR and broke pyarrow/pandas)."""
    import duckdb

    _write_rounds(tmp_path, rollout, [0, 2, 10])
    glob = f"{tmp_path}/steps/**/*.parquet"
    rows = duckdb.sql(f"SELECT typeof(round) AS t, round + 1 AS next, count(*) AS n "
                      f"FROM read_parquet('{glob}') GROUP BY ALL ORDER BY next").fetchall()
    per_round = rollout.steps.num_rows
    assert rows == [("INTEGER", 1, per_round), ("INTEGER", 3, per_round),
                    ("INTEGER", 11, per_round)]
    table = pq.read_table(tmp_path / "steps")
    assert table.schema.field("round").type == pa.int32()
    assert sorted(set(table["round"].to_pylist())) == [0, 2, 10]
    # Folder names sort in round order (code and people list them with a plain sort).
    assert [p.name for p in sorted((tmp_path / "steps").iterdir())] == [
        "round-000000", "round-000002", "round-000010"]
    # The plain-DuckDB query of docs/data.md, as written there (on this folder).
    doc = (Path(__file__).resolve().parents[1] / "docs" / "data.md").read_text()
    [sql] = [block.split("```")[0] for block in doc.split("```sql")[1:]
             if "read_parquet('runs/demo/steps" in block]
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "demo").symlink_to(tmp_path)
    rows = duckdb.sql(sql.replace("runs/demo", str(tmp_path / "runs" / "demo"))).fetchall()
    assert [r[0] for r in rows] == [0, 2, 10] and all(r[1] > 0 for r in rows)


def test_pandas_types_round_as_an_integer(tmp_path, rollout):
    pandas = pytest.importorskip("pandas")  # (not a dependency of ub: checked where present)
    _write_rounds(tmp_path, rollout, [0, 2, 10])
    frame = pandas.read_parquet(tmp_path / "steps")
    assert pandas.api.types.is_integer_dtype(frame["round"])
    assert (frame["round"] + 1).max() == 11


def test_format_1_hive_folders_are_still_read_and_kept(tmp_path, rollout):
    """A data root written in run format 1 (``round=NNNNNN``) reads as before, and new rounds
    written to it follow its layout instead of mixing the two."""
    legacy = tmp_path / "games" / "round=000000"
    write_shard(tmp_path, ShardId(0, 0), "unit", rollout.steps, rollout.games)
    for table in ("steps", "games"):  # what an older ub wrote
        (tmp_path / table / "round-000000").rename(tmp_path / table / "round=000000")
    assert uses_legacy_layout(tmp_path) and legacy.is_dir()
    assert committed_shards(tmp_path) == [ShardId(0, 0)]
    assert shard_path(tmp_path, "games", ShardId(0, 0)).parent == legacy
    assert next_free_shard(tmp_path, 0) == ShardId(0, 1)
    write_shard(tmp_path, ShardId(1, 0), "unit", rollout.steps, rollout.games)
    assert (tmp_path / "games" / "round=000001" / "shard-0000.parquet").exists()
    assert committed_shards(tmp_path) == [ShardId(0, 0), ShardId(1, 0)]
    n = query(tmp_path, "SELECT count(*) AS n FROM games").to_pylist()[0]["n"]
    assert n == 2 * rollout.games.num_rows
    assert round_dir(tmp_path / "new", "steps", 0).name == "round-000000"
    # A run's first eval shard follows its training data's layout.
    assert round_dir(tmp_path / "eval", "games", 4).name == "round=000004"


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
    target = tmp_path / "games" / "round-000000" / "shard-0000.parquet"

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
