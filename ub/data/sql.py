"""Read-only DuckDB over a data root: views ``steps`` and ``games`` over the committed shards.

The views are Arrow datasets registered in DuckDB (filters and projections are pushed down to
the Parquet files), after which DuckDB's external access is switched off and the configuration
locked: a query can read the run's data and nothing else, and cannot write files. The one
folder DuckDB still reads and writes, its temporary folder (where a large query spills), is a
private one of the connection's own, not DuckDB's default ``.tmp`` of the working directory.

Shards of every schema version ub reads are shown in the current column names
(:func:`current_names_sql`, the one place that maps a former name to its current one): a run
resumed by a newer ub mixes versions, e.g. ``steps.env_reward`` was ``final_reward`` in version
1 (:mod:`ub.data.schema`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import weakref
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds

from ub.data.schema import (
    ADDED,
    READING_TABLE,
    RENAMED,
    SCHEMA_VERSION,
    TABLES,
    column_names,
    reading_schema,
)
from ub.data.shards import check_shard_schema, committed_shards, shard_path
from ub.errors import UbError


def current_names_sql(table: str, source: str, columns: Collection[str]) -> str:
    """``table``'s rows of ``source`` in the current column names, as a SQL table expression:
    ``source`` itself when its columns are already the current ones, else a subquery over it.

    ``source`` is a SQL table expression over shards of any schema versions (a
    ``read_parquet(...)`` call, a registered name) and ``columns`` the names it has. A column
    renamed since version 1 (:data:`ub.data.schema.RENAMED`) is renamed when only its former
    name is there; when both are (shards of both sides of the rename, read by name), each row
    holds it under one name and NULL under the other, and the current name takes the
    non-NULL one. A column added since (:data:`ub.data.schema.ADDED`) that no shard has is
    appended as NULL. Every reader of ``steps`` shards in ub goes through this function (through
    :func:`read_parquet_sql` or :func:`connect_tables`), except those that read only columns
    every version has.
    """
    exclude, replace, rename = [], [], []
    for old, (new, _) in RENAMED.get(table, {}).items():
        if old not in columns:
            continue
        if new in columns:
            exclude.append(old)
            replace.append(f"coalesce({new}, {old}) AS {new}")
        else:
            rename.append(f"{old} AS {new}")
    missing = [f"CAST(NULL AS {_SQL_TYPES[TABLES[table].field(name).type]}) AS {name}"
               for name in ADDED.get(table, {}) if name not in columns]
    if not (exclude or rename or missing):
        return source
    star = "*"
    for keyword, items in (("EXCLUDE", exclude), ("REPLACE", replace), ("RENAME", rename)):
        if items:
            star += f" {keyword} ({', '.join(items)})"
    return f"(SELECT {', '.join([star, *missing])} FROM {source})"


# The DuckDB types of the columns a reader may have to append as NULL (ADDED).
_SQL_TYPES = {pa.string(): "VARCHAR", pa.list_(pa.string()): "VARCHAR[]", pa.int32(): "INTEGER"}


def read_parquet_sql(table: str, files: Sequence[tuple[Path, int]], options: str) -> str:
    """DuckDB SQL for ``table``'s rows in ``files`` (path, schema version) in the current column
    names, read with ``read_parquet``'s ``options`` (e.g. ``"hive_partitioning = false"``):
    files of mixed versions are read by name (``union_by_name``)."""
    versions = {version for _, version in files}
    if len(versions) > 1:
        options += ", union_by_name = true"
    listing = (quote(files[0][0]) if len(files) == 1 else
               "[\n        " + ",\n        ".join(quote(path) for path, _ in files) + "\n    ]")
    columns = {name for version in versions for name in column_names(table, version)}
    return current_names_sql(table, f"read_parquet({listing}, {options})", columns)


def quote(text: str | Path) -> str:
    """``text`` as a DuckDB SQL string literal."""
    return "'" + str(text).replace("'", "''") + "'"


def shards_dataset(table: str, files: Sequence[str], versions: Collection[int] | None = None,
                   filesystem: Any = None) -> ds.Dataset:
    """An Arrow dataset over ``table``'s shard ``files`` (empty when there are none), whose
    schema versions are ``versions`` (``None``: not known). Files that may be older than this
    ub's version are read with :func:`ub.data.schema.reading_schema` (every version's names),
    which :func:`connect_tables` exposes in the current names."""
    older = table in RENAMED and (versions is None or any(v != SCHEMA_VERSION for v in versions))
    schema = reading_schema(table) if files and older else TABLES[table]
    if not files:
        return ds.dataset(pa.Table.from_batches([], schema=schema))
    return ds.dataset(list(files), schema=schema, format="parquet", filesystem=filesystem)


def table_dataset(root: Path, table: str, files: Sequence[Path] | None = None) -> ds.Dataset:
    """An Arrow dataset over ``table``'s committed shard files (empty when there are none), or
    over ``files`` (shard files of ``table`` under ``root``).

    Every file must carry ub's schema marker for ``table``: a Parquet file of another schema
    in a shard's place would otherwise read as NULL columns.
    """
    if files is None:
        files = [shard_path(root, table, sid) for sid in committed_shards(root)]
    versions = {check_shard_schema(Path(file), table) for file in files}
    try:
        return shards_dataset(table, [str(file) for file in files], versions)
    except (OSError, pa.ArrowInvalid) as exc:
        raise UbError(f"cannot read the {table} shards under {root}: {exc}") from None


def connect(root: Path, extra: dict[str, pa.Table | ds.Dataset] | None = None
            ) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with read-only views over the data under ``root`` (and
    ``extra`` tables, e.g. a run's ratings), then external access switched off."""
    return connect_tables({**data_tables(root), **(extra or {})})


def data_tables(root: Path) -> dict[str, ds.Dataset]:
    """Every table of the data under ``root``, over its committed shards."""
    root = Path(root)
    if not root.is_dir():
        raise UbError(f"{root} is not a directory of ub data (expected steps/ and games/ inside)")
    return {t: table_dataset(root, t) for t in TABLES}


def connect_tables(tables: dict[str, pa.Table | ds.Dataset]) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with a read-only view per table, then external access
    switched off (the views still read their files: Arrow scans them, not DuckDB). A dataset
    of shards read with :func:`ub.data.schema.reading_schema` shows the current column names.
    DuckDB's temporary folder is a new private one (mode 0700), removed with the connection:
    its default, ``.tmp`` in the working directory, is readable by a query even with external
    access off, and holds whatever was put there."""
    spill = tempfile.mkdtemp(prefix="ub-duckdb-")
    con = duckdb.connect(":memory:", config={"temp_directory": spill})
    weakref.finalize(con, _remove_spill, spill, os.getpid())
    for name, table in tables.items():
        shards = (table.schema.metadata or {}).get(READING_TABLE)
        if shards is None:
            con.register(name, table)
            continue
        sql = current_names_sql(shards.decode(), "shards", table.schema.names)
        con.from_arrow(table).query("shards", f"SELECT * FROM {sql}").create_view(name)
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


def _remove_spill(folder: str, owner: int) -> None:
    """Remove a connection's temporary folder, in the process that made it (a forked child
    that inherited the connection leaves its parent's alone)."""
    if os.getpid() == owner:
        shutil.rmtree(folder, ignore_errors=True)


def query(root: Path, sql: str, extra: dict[str, pa.Table | ds.Dataset] | None = None
          ) -> pa.Table:
    """Run ``sql`` against the views of ``root`` and return the result as an Arrow table."""
    return query_tables({**data_tables(root), **(extra or {})}, sql)


def query_tables(tables: dict[str, pa.Table | ds.Dataset], sql: str) -> pa.Table:
    """Run ``sql`` against ``tables`` alone: a round's step opens its own rounds' shards, not
    every committed shard of the run (whose footers :func:`connect` reads: ~2 ms a file, so a
    cost per round that grows with the run)."""
    con = connect_tables(tables)
    try:
        return run_sql(con, sql)
    finally:
        con.close()


READ_ONLY_STATEMENTS = frozenset({"SELECT", "EXPLAIN", "PRAGMA"})


def run_sql(con: duckdb.DuckDBPyConnection, sql: str) -> pa.Table:
    """Run read-only SQL on an open connection (the last statement's result); anything that
    would write (CREATE, INSERT, COPY, ATTACH, SET, ...) is refused; DuckDB's errors come back
    as one-line :class:`UbError`."""
    with _sql_errors():
        relation = _read_only(con, sql)
        return relation.to_arrow_table() if relation is not None else pa.table({})


def read_only_relation(con: duckdb.DuckDBPyConnection, sql: str) -> duckdb.DuckDBPyRelation:
    """:func:`run_sql`'s result as a DuckDB relation, computed as it is read (``.df()``,
    ``.pl()``, ``.arrow()``); a statement that returns no rows gives an empty relation."""
    with _sql_errors():
        relation = _read_only(con, sql)
        return relation if relation is not None else con.sql("SELECT NULL LIMIT 0")


def stream_sql(con: duckdb.DuckDBPyConnection, sql: str, batch_rows: int = 10_000
               ) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """:func:`run_sql`'s result as it is computed: its schema, and its rows in batches of up to
    ``batch_rows`` (a reader that stops early never has the rest computed or held); DuckDB's
    errors, while reading too, come back as one-line :class:`UbError`."""
    with _sql_errors():
        relation = _read_only(con, sql)
        if relation is None:
            return pa.schema([]), iter(())
        reader = relation.to_arrow_reader(batch_rows)

    def batches() -> Iterator[pa.RecordBatch]:
        with _sql_errors():
            yield from reader

    return reader.schema, batches()


def _read_only(con: duckdb.DuckDBPyConnection, sql: str) -> duckdb.DuckDBPyRelation | None:
    """``sql``'s relation (the last statement's), once every statement is one that reads."""
    statements = con.extract_statements(sql)
    if not statements:
        raise UbError("the query holds no SQL statement (it is empty or only comments): "
                      "give one, e.g. \"SELECT count(*) FROM games\"")
    for statement in statements:
        kind = statement.type.name
        if kind not in READ_ONLY_STATEMENTS:
            raise UbError(f"ub sql is read-only: {kind} statements are refused "
                          "(use SELECT, DESCRIBE, SHOW, SUMMARIZE, EXPLAIN)")
    return con.sql(sql)


def sql_error_line(error: BaseException) -> str:
    """DuckDB's error in one line, with its hints (``Candidate bindings: ...``, ``Did you mean
    "games"?``) and without the query's text it quotes below them (``LINE 1: ...``)."""
    lines = []
    for line in str(error).splitlines():
        if line.startswith("LINE "):
            break
        if line.strip():
            lines.append(line.strip())
    return "; ".join(lines)


@contextlib.contextmanager
def _sql_errors() -> Iterator[None]:
    """DuckDB's errors as one-line :class:`UbError`; a query that a signal (Ctrl-C, SIGTERM)
    interrupted as the :class:`KeyboardInterrupt` it was (DuckDB turns it into its own error)."""
    try:
        yield
    except duckdb.InterruptException:
        raise KeyboardInterrupt from None
    except RuntimeError as exc:
        if str(exc) == "Query interrupted":
            raise KeyboardInterrupt from None
        raise
    except duckdb.Error as exc:
        message = sql_error_line(exc)
        if "Parquet" in message and "input source" in message:
            message += " (`ub doctor RUN` checks every file; --repair quarantines broken ones)"
        raise UbError(f"SQL error: {message}") from None
