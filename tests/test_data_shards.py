"""Shards on disk: atomic writes, commit rules, schema checks, provenance."""

from __future__ import annotations

import gc
import os
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from ub.data.schema import ADDED, GAMES_SCHEMA, SCHEMA_VERSION, STEPS_SCHEMA, column_names
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
from ub.data.sql import connect, query, run_sql
from ub.errors import UbError


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
        write_shard(root, ShardId(round_, 0), "run", steps, rollout.games)


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
    write_shard(tmp_path, ShardId(0, 0), "run", rollout.steps, rollout.games)
    for table in ("steps", "games"):  # what an older ub wrote
        (tmp_path / table / "round-000000").rename(tmp_path / table / "round=000000")
    assert uses_legacy_layout(tmp_path) and legacy.is_dir()
    assert committed_shards(tmp_path) == [ShardId(0, 0)]
    assert shard_path(tmp_path, "games", ShardId(0, 0)).parent == legacy
    assert next_free_shard(tmp_path, 0) == ShardId(0, 1)
    write_shard(tmp_path, ShardId(1, 0), "run", rollout.steps, rollout.games)
    assert (tmp_path / "games" / "round=000001" / "shard-0000.parquet").exists()
    assert committed_shards(tmp_path) == [ShardId(0, 0), ShardId(1, 0)]
    n = query(tmp_path, "SELECT count(*) AS n FROM games").to_pylist()[0]["n"]
    assert n == 2 * rollout.games.num_rows
    assert round_dir(tmp_path / "new", "steps", 0).name == "round-000000"
    # A run's first eval shard follows its training data's layout.
    assert round_dir(tmp_path / "eval", "games", 4).name == "round=000004"


def test_written_shard_has_schema_rows_and_provenance(tmp_path, rollout):
    steps_path, games_path = write_shard(tmp_path, ShardId(0, 0), "run", rollout.steps,
                                         rollout.games, {"model": "none"})
    assert pq.read_schema(steps_path).remove_metadata().equals(STEPS_SCHEMA)
    assert pq.read_schema(games_path).remove_metadata().equals(GAMES_SCHEMA)
    assert pq.ParquetFile(steps_path).metadata.row_group(0).column(0).compression == "ZSTD"
    meta = read_metadata(games_path)
    assert meta["schema_version"] == SCHEMA_VERSION
    assert (meta["run"], meta["round"], meta["shard"], meta["model"]) == ("run", 0, 0, "none")
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
    """``ub sql`` runs a user's SQL over a run's data and nothing else: statements that write
    (COPY, CREATE, INSERT, ATTACH, SET) are refused by name, and a SELECT cannot read or
    write the file system around the run (DuckDB's external access is off), so a query of a
    shared run cannot leak another file into its output."""
    root = tmp_path / "data"
    write_shard(root, ShardId(0, 0), "run", rollout.steps, rollout.games)
    outside = tmp_path / "leak.csv"
    with pytest.raises(UbError, match="read-only: COPY statements are refused"):
        query(root, f"COPY games TO '{outside}'")
    assert not outside.exists()
    for statement in ("SET enable_external_access = true", "CREATE TABLE t AS SELECT 1",
                      "INSERT INTO games SELECT * FROM games", f"ATTACH '{tmp_path}/x.db'"):
        with pytest.raises(UbError, match=r"read-only: .* statements are refused"):
            query(root, statement)
    # A file that exists beside the run (readable by this user: DuckDB itself would read it)
    # cannot be read, nor written, through a SELECT.
    secret = tmp_path / "secret.csv"
    secret.write_text("password\nhunter2\n")
    with pytest.raises(UbError, match=r"SQL error.*disabled by configuration"):
        query(root, f"SELECT * FROM read_csv('{secret}')")
    import duckdb

    assert duckdb.sql(f"SELECT * FROM read_csv('{secret}')").fetchall() == [("hunter2",)]
    with pytest.raises(UbError, match=r"SQL error.*disabled by configuration"):
        query(root, f"SELECT * FROM read_text('{secret}')")
    assert query(root, "SELECT count(*) AS n FROM games").column("n").to_pylist() == [30]


def test_a_query_interrupted_by_a_signal_is_the_interrupt(rollout, tmp_path):
    """Ctrl-C (or SIGTERM, as Prefect raises it) mid-query: DuckDB turns the signal into an
    error of its own (RuntimeError 'Query interrupted', seen when a SIGTERM hit a run's
    tracking query; its InterruptException when interrupted otherwise); ub's commands and
    flows need the interrupt back, to stop as an interrupted run does (docs/reliability.md).
    Which of DuckDB's paths a real signal takes depends on the thread it lands in, so each is
    raised here as DuckDB raises it."""
    from ub.data.sql import _sql_errors

    write_shard(tmp_path, ShardId(0, 0), "run", rollout.steps, rollout.games)
    con = connect(tmp_path)
    threading.Timer(1.0, con.interrupt).start()
    with pytest.raises(KeyboardInterrupt):  # (uncut: ~1 min)
        run_sql(con, "SELECT sum(hash(s.turn + r.range)) FROM steps s, range(20000000) r")
    with pytest.raises(KeyboardInterrupt), _sql_errors():
        raise RuntimeError("Query interrupted")
    with pytest.raises(RuntimeError, match="another"), _sql_errors():
        raise RuntimeError("another")


def test_duckdbs_temporary_folder_is_private(tmp_path, rollout, monkeypatch):
    """DuckDB's default temporary folder, ``.tmp`` in the working directory, stays readable
    with external access off: whatever was kept there could be read through ``ub sql``."""
    write_shard(tmp_path / "data", ShardId(0, 0), "run", rollout.steps, rollout.games)
    (tmp_path / ".tmp").mkdir()
    (tmp_path / ".tmp" / "notes.txt").write_text("not the run's")
    monkeypatch.chdir(tmp_path)
    for sql in ("SELECT content FROM read_text('.tmp/notes.txt')", "SELECT * FROM glob('.tmp/*')",
                f"SELECT * FROM read_text('{tmp_path}/.tmp/notes.txt')"):
        with pytest.raises(UbError, match="SQL error: Permission Error: Cannot access file"):
            query(tmp_path / "data", sql)
    # (A query that spills does so into a folder of its own connection, removed with it.)
    con = connect(tmp_path / "data")
    spill = run_sql(con, "SELECT current_setting('temp_directory') AS d").to_pylist()[0]["d"]
    assert Path(spill).stat().st_mode & 0o077 == 0 and Path(spill).parent != tmp_path
    con.close()
    del con
    gc.collect()
    assert not Path(spill).exists()


def test_ub_sql_streams_and_a_table_stops_at_its_row_cap(tmp_path, rollout, capsys):
    from ub.flows.cli import main

    write_shard(tmp_path, ShardId(0, 0), "run", rollout.steps, rollout.games)
    n = rollout.steps.num_rows
    assert main(["sql", str(tmp_path), "SELECT turn FROM steps", "--max-rows", "4"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len([line for line in out if line.startswith("│")]) == 4
    assert out[-1] == ("(the first 4 rows; the query returns more, not fetched: add "
                       "LIMIT/OFFSET, raise --max-rows, or use --format csv for every row)")
    assert main(["sql", str(tmp_path), "SELECT turn FROM steps", "--max-rows", str(n)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"({n} rows)"
    assert main(["sql", str(tmp_path), "SELECT turn FROM steps", "--format", "csv"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == n + 1  # (csv: every row, and a header)
    # A billion rows: the table's first three, at once (the rest is never computed or held).
    started = time.monotonic()
    assert main(["sql", str(tmp_path), "SELECT * FROM range(1000000000)", "--max-rows", "3"]) == 0
    assert time.monotonic() - started < 30
    assert "the first 3 rows; the query returns more" in capsys.readouterr().out


# ------------------------------------------------------------------ schema versions (history)


def _round_of(rollout, round_: int) -> tuple[pa.Table, pa.Table]:
    """The rollout's games as round ``round_``'s (own game ids), every decision a model's."""
    steps, games = rollout.steps, rollout.games
    n = steps.num_rows

    def relabel(table: pa.Table, columns: dict) -> pa.Table:
        for name, values in columns.items():
            table = table.set_column(table.schema.get_field_index(name), name, values)
        return table

    def ids(table: pa.Table) -> pa.Array:
        return pa.array([g.replace("-r000000-", f"-r{round_:06d}-")
                         for g in table["game_id"].to_pylist()])

    steps = relabel(steps, {
        "round": pa.array([round_] * n, pa.int32()), "game_id": ids(steps),
        "actor": pa.array(["model"] * n), "actor_kind": pa.array(["model"] * n),
        "checkpoint": pa.array([f"ckpt-{round_:06d}"] * n),
        "prompt_token_ids": pa.array([[1, 2, 3 + t] for t in range(n)], pa.list_(pa.int32())),
        "completion_token_ids": pa.array([[7, t] for t in range(n)], pa.list_(pa.int32())),
        "completion_logprobs": pa.array([[-0.5, -0.25]] * n, pa.list_(pa.float32())),
        "num_prompt_tokens": pa.array([3] * n, pa.int32()),
        "num_completion_tokens": pa.array([2] * n, pa.int32())})
    games = relabel(games, {"round": pa.array([round_] * games.num_rows, pa.int32()),
                            "game_id": ids(games),
                            "actors": pa.array([["model", "model"]] * games.num_rows)})
    return steps, games


def _write_old_shard(root: Path, sid: ShardId, steps: pa.Table, games: pa.Table,
                     version: int) -> None:
    """A shard exactly as an older ub wrote it (schema ``version``), with plain pyarrow: the
    steps columns of that version under its names (``env_reward`` was ``final_reward`` in
    version 1; ``position`` came in version 3, ``legal_moves`` and ``legal_moves_mode`` in
    version 4, the branching columns of both tables in version 5), ``ub.*`` JSON metadata
    saying ``schema_version``, zstd."""
    import json

    current = [name for name in STEPS_SCHEMA.names if ADDED["steps"].get(name, 1) <= version]
    steps = steps.cast(STEPS_SCHEMA).select(current).rename_columns(
        column_names("steps", version))
    games = games.cast(GAMES_SCHEMA).select(column_names("games", version))
    for table, data in (("steps", steps), ("games", games)):
        meta = {"schema_version": version, "table": table, "ub_version": "0.1.0", "run": "run",
                "round": sid.round, "shard": sid.shard, "created_at": "2026-01-01T00:00:00Z",
                "host": "old"}
        path = shard_path(root, table, sid)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(data.replace_schema_metadata(
            {f"ub.{k}".encode(): json.dumps(v).encode() for k, v in meta.items()}),
            path, compression="zstd")


@pytest.fixture(scope="module")
def versioned_roots(rollout, tmp_path_factory):
    """Rounds 0-3 of the same games six times: written by this ub (schema 5), by older ubs
    (schemas 1 to 4), and by older ubs then resumed by newer ones (round r in schema
    r + 1: round 3 by this ub)."""
    roots = {name: tmp_path_factory.mktemp(name)
             for name in ("v5", "v4", "v3", "v2", "v1", "mixed")}
    for round_ in range(4):
        steps, games = _round_of(rollout, round_)
        sid = ShardId(round_, 0)
        write_shard(roots["v5"], sid, "run", steps, games)
        for version in (1, 2, 3, 4):
            _write_old_shard(roots[f"v{version}"], sid, steps, games, version)
        if round_ < 3:
            _write_old_shard(roots["mixed"], sid, steps, games, round_ + 1)
        else:
            write_shard(roots["mixed"], sid, "run", steps, games)
    assert read_metadata(shard_path(roots["mixed"], "steps", ShardId(0, 0)))["schema_version"] == 1
    assert "final_reward" in pq.read_schema(shard_path(roots["v1"], "steps", ShardId(3, 0))).names
    assert "position" not in pq.read_schema(shard_path(roots["v2"], "steps", ShardId(3, 0))).names
    assert "legal_moves" not in pq.read_schema(shard_path(roots["v3"], "steps",
                                                          ShardId(3, 0))).names
    assert "parent_game_id" not in pq.read_schema(shard_path(roots["v4"], "games",
                                                             ShardId(3, 0))).names
    return roots


def as_read(table: pa.Table, version: int) -> pa.Table:
    """``table`` as a run written in schema ``version`` reads: the columns added since NULL."""
    for name, since in ADDED["steps"].items():
        if since > version:
            i = table.schema.get_field_index(name)
            table = table.set_column(i, table.schema.field(i), pa.nulls(table.num_rows,
                                                                         table.schema.field(i).type))
    return table


def test_schema_versions_1_to_5_are_read_newer_refused(tmp_path, versioned_roots):
    assert SCHEMA_VERSION == 5
    for version in (1, 2, 3, 4, 5):
        assert check_shard_schema(shard_path(versioned_roots[f"v{version}"], "steps",
                                             ShardId(0, 0)), "steps") == version
    newer = tmp_path / "newer.parquet"
    write_parquet_atomic(pq.read_table(shard_path(versioned_roots["v5"], "steps",
                                                  ShardId(0, 0))), newer, {"schema_version": 6})
    with pytest.raises(UbError, match="schema version 6, newer than this ub's 5: upgrade ub"):
        check_shard_schema(newer, "steps")


def test_old_and_mixed_runs_show_current_columns_in_ub_sql(versioned_roots, capsys):
    """``ub sql`` (a data folder, a run in a store) and ub's views show schema 1's
    ``final_reward`` as ``env_reward``, a NULL ``position`` before schema 3 and NULL legal
    moves before schema 4: the same rows as a run written by this ub otherwise."""
    from ub.data.sql import table_dataset
    from ub.flows.cli import main

    everything = "SELECT * FROM steps ORDER BY round, game_id, turn"
    expected = query(versioned_roots["v5"], everything)
    assert expected.column_names == STEPS_SCHEMA.names
    assert expected["env_reward"].null_count < expected.num_rows
    assert expected["position"].null_count == 0
    assert expected["legal_moves"].null_count == 0  # (random players: no mode of their own)
    for version in (1, 2, 3, 4):
        got = query(versioned_roots[f"v{version}"], everything)
        assert got.column_names == STEPS_SCHEMA.names, version
        assert got.equals(as_read(expected, version)), version
    mixed = query(versioned_roots["mixed"], everything)
    assert mixed.column_names == STEPS_SCHEMA.names
    for round_ in range(4):  # (round r written in schema r + 1)
        where = pc.equal(mixed["round"], round_)
        assert mixed.filter(where).equals(as_read(expected.filter(where), round_ + 1)), round_
    summary = "SELECT round, sum(env_reward) AS total, count(env_reward) AS n FROM steps " \
              "GROUP BY round ORDER BY round"
    outputs = []
    for where in (str(versioned_roots["v5"]), str(versioned_roots["mixed"]),
                  f"file://{versioned_roots['mixed']}"):  # (a store: read in place)
        assert main(["sql", where, summary, "--format", "csv"]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] == outputs[2] and len(outputs[0].splitlines()) == 5
    # docs/data.md's plain-DuckDB query for a run of every version, as written there.
    import duckdb

    doc = (Path(__file__).resolve().parents[1] / "docs" / "data.md").read_text()
    [plain] = [block.split("```")[0] for block in doc.split("```sql")[1:]
               if "read_parquet('runs/old/steps" in block]
    plain = plain.replace("runs/old", str(versioned_roots["mixed"])).rstrip().rstrip(";")
    got = duckdb.sql(f"SELECT * FROM ({plain}) ORDER BY round, game_id, turn").to_arrow_table()
    assert sorted(got.column_names) == sorted(STEPS_SCHEMA.names)  # (in another order)
    assert got["env_reward"].equals(expected["env_reward"])
    assert got["position"].equals(mixed["position"])
    assert got["legal_moves"].equals(mixed["legal_moves"])
    # One round's files (what the per-round metrics read) in the current names too.
    folder = shard_path(versioned_roots["v1"], "steps", ShardId(1, 0)).parent
    one = query(versioned_roots["v1"], "SELECT sum(env_reward) AS s, count(position) AS p FROM r",
                {"r": table_dataset(folder, "steps", sorted(folder.glob("shard-*.parquet")))})
    assert one["s"].to_pylist() == query(
        versioned_roots["v5"], "SELECT sum(env_reward) AS s FROM steps WHERE round = 1"
    )["s"].to_pylist()
    assert one["p"].to_pylist() == [0]


def test_old_and_mixed_runs_assemble_the_same_batch(versioned_roots):
    from ub.batch import BatchConfig, assemble_batch, batch_sql

    config = BatchConfig(batch_size=48, seed=5, first_round=1, final=["win_draw_loss"],
                         step=[{"name": "invalid_move_penalty", "penalty": -1.0}],
                         sampling=["normalize"])
    batches = {name: assemble_batch(root, config) for name, root in versioned_roots.items()}
    expected = batches["v5"]
    assert len(expected) == 48
    for name in ("v1", "v2", "v3", "v4", "mixed"):
        batch = batches[name]
        positions = batch.rows["position"]
        assert batch.rows.drop_columns(["position"]).equals(
            expected.rows.drop_columns(["position"])), name
        if name in ("mixed", "v3", "v4"):  # (v3, v4: every round has them; mixed: 2-3)
            assert positions.equals(pc.if_else(pc.less(batch.rows["round"],
                                                       2 if name == "mixed" else 0),
                                               pa.nulls(48, pa.string()),
                                               expected.rows["position"]))
        else:
            assert positions.null_count == 48, name
        for tensor in ("input_ids", "attention_mask", "completion_mask", "behaviour_logprobs",
                       "advantages", "lengths"):
            assert torch_equal(getattr(batch, tensor), getattr(expected, tensor)), tensor
        assert batch.final_state == expected.final_state
    assert "union_by_name" in batch_sql(versioned_roots["mixed"], config)
    for name in ("v1", "v2", "v3", "v4", "v5"):
        assert "union_by_name" not in batch_sql(versioned_roots[name], config)


def test_a_position_keyed_transform_on_a_run_without_positions_keeps_the_episode_term(
        versioned_roots):
    """A run written before positions has NULL ones: the step term is 0 everywhere, so the
    batch equals one without the transform (no error, no NaN)."""
    from ub.batch import BatchConfig, assemble_batch

    plain = BatchConfig(batch_size=48, seed=5, final=["win_draw_loss"],
                        sampling=["normalize_per_env"])
    with_step = plain.replace(sampling=["normalize_per_env", "position_advantage",
                                        {"name": "state_baseline", "key": "position"}])
    for name in ("v1", "v2"):
        a, b = assemble_batch(versioned_roots[name], plain), assemble_batch(
            versioned_roots[name], with_step)
        assert torch_equal(a.advantages, b.advantages), name
    a, b = (assemble_batch(versioned_roots["v5"], c) for c in (plain, with_step))
    assert not torch_equal(a.advantages, b.advantages)


def torch_equal(a, b) -> bool:
    return a.shape == b.shape and bool((a == b).all())


def test_doctor_names_the_schema_versions_of_a_runs_rounds(versioned_roots, tmp_path, capsys):
    import json
    import shutil

    from ub.flows.cli import main
    from ub.run.checks.doctor import examine

    run = tmp_path / "run"
    shutil.copytree(versioned_roots["mixed"], run)
    (run / "rounds").mkdir()
    for round_ in range(4):
        shard = f"games/round-{round_:06d}/shard-0000.parquet"
        (run / "rounds" / f"round-{round_:06d}.json").write_text(json.dumps({"shards": [shard]}))
    # (rounds counted from 1, as every line ub prints: round-000000 is round 1)
    line = ("data schema v1: round 1; v2: round 2; v3: round 3; v5: round 4 (v1, v2, v3 older, "
            "read in the current column names)")
    assert examine(run).format_line.splitlines()[1] == line
    main(["doctor", str(run)])  # (the bare run has problems: no config, no checkpoints)
    assert line in capsys.readouterr().out.splitlines()
    (run / "rounds" / "round-000002.json").unlink()
    (run / "rounds" / "round-000003.json").unlink()
    assert examine(run).format_line.splitlines()[1] == "; ".join(line.split("; ")[:2]) + \
        " (v1, v2 older, read in the current column names)"


def test_ub_sql_stopped_by_sigterm_leaves_no_temporary_folder(tmp_path, rollout):
    """DuckDB's private spill folder (above) went only at a normal exit: `kill` left it."""
    import subprocess
    import sys

    write_shard(tmp_path / "data", ShardId(0, 0), "run", rollout.steps, rollout.games)
    temp = tmp_path / "temp"
    temp.mkdir()
    shell = subprocess.Popen([sys.executable, "-m", "ub.flows.cli", "sql", str(tmp_path / "data")],
                             stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "TMPDIR": str(temp)})
    deadline = time.monotonic() + 120
    while not list(temp.glob("ub-duckdb-*")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list(temp.glob("ub-duckdb-*")), "the shell made no temporary folder"
    time.sleep(1.0)  # (in its prompt's read)
    shell.terminate()
    _, err = shell.communicate(timeout=60)
    assert shell.returncode == 130, err
    assert list(temp.iterdir()) == []
