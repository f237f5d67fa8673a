"""Read-only DuckDB over a data root: views ``steps`` and ``games`` over the committed shards.

The views are Arrow datasets registered in DuckDB (filters and projections are pushed down to
the Parquet files), after which DuckDB's external access is switched off and the configuration
locked: a query can read the run's data and nothing else, and cannot write files.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds

from ub.data.schema import TABLES
from ub.data.shards import check_shard_schema, committed_shards, shard_path
from ub.errors import UbError


def table_dataset(root: Path, table: str) -> ds.Dataset:
    """An Arrow dataset over ``table``'s committed shard files (empty when there are none).

    Every file must carry ub's schema marker for ``table``: a Parquet file of another schema
    in a shard's place would otherwise read as NULL columns.
    """
    schema = TABLES[table]
    files = [str(shard_path(root, table, sid)) for sid in committed_shards(root)]
    for file in files:
        check_shard_schema(Path(file), table)
    if not files:
        return ds.dataset(pa.Table.from_batches([], schema=schema))
    try:
        return ds.dataset(files, schema=schema, format="parquet")
    except (OSError, pa.ArrowInvalid) as exc:
        raise UbError(f"cannot read the {table} shards under {root}: {exc}") from None


def connect(root: Path, extra: dict[str, pa.Table | ds.Dataset] | None = None
            ) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with read-only views over the data under ``root`` (and
    ``extra`` tables, e.g. a run's ratings), then external access switched off."""
    root = Path(root)
    if not root.is_dir():
        raise UbError(f"{root} is not a directory of ub data (expected steps/ and games/ inside)")
    return connect_tables({**{t: table_dataset(root, t) for t in TABLES}, **(extra or {})})


def connect_tables(tables: dict[str, pa.Table | ds.Dataset]) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with a read-only view per table, then external access
    switched off (the views still read their files: Arrow scans them, not DuckDB)."""
    con = duckdb.connect(":memory:")
    for name, table in tables.items():
        con.register(name, table)
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


def query(root: Path, sql: str, extra: dict[str, pa.Table | ds.Dataset] | None = None
          ) -> pa.Table:
    """Run ``sql`` against the views of ``root`` and return the result as an Arrow table."""
    con = connect(root, extra)
    try:
        return run_sql(con, sql)
    finally:
        con.close()


READ_ONLY_STATEMENTS = frozenset({"SELECT", "EXPLAIN", "PRAGMA"})


def run_sql(con: duckdb.DuckDBPyConnection, sql: str) -> pa.Table:
    """Run read-only SQL on an open connection (the last statement's result); anything that
    would write (CREATE, INSERT, COPY, ATTACH, SET, ...) is refused; DuckDB's errors come back
    as one-line :class:`UbError`."""
    try:
        statements = con.extract_statements(sql)
        if not statements:
            raise UbError("the query holds no SQL statement (it is empty or only comments): "
                          "give one, e.g. \"SELECT count(*) FROM games\"")
        for statement in statements:
            kind = statement.type.name
            if kind not in READ_ONLY_STATEMENTS:
                raise UbError(f"ub sql is read-only: {kind} statements are refused "
                              "(use SELECT, DESCRIBE, SHOW, SUMMARIZE, EXPLAIN)")
        relation = con.sql(sql)
        return relation.to_arrow_table() if relation is not None else pa.table({})
    except duckdb.Error as exc:
        message = str(exc).splitlines()[0]
        if "Parquet" in message and "input source" in message:
            message += " (`ub doctor RUN` checks every file; --repair quarantines broken ones)"
        raise UbError(f"SQL error: {message}") from None
