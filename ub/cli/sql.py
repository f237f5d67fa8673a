"""``ub sql``: read-only SQL over a data folder, a run directory or a run in a store."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ub.cli.args import add_root_argument, positive_int
from ub.errors import UbError

if TYPE_CHECKING:
    from rich.text import Text

MAX_ROWS = 1000
"""The rows a table shows by default (``--max-rows``): the result streams, so a query of a
whole run prints what a terminal can show without holding the rest."""


def add_parser(sub) -> None:
    sql = sub.add_parser("sql", help="read-only SQL over a data folder, a run or a folder of "
                         "runs (docs/sql.md)")
    sql.add_argument("run", metavar="RUN", help="a run (its name under --root, or its "
                     "folder), a folder of runs (every run's tables as one, with a run "
                     "column), a data folder of `ub play`, or a run's store URL "
                     "(s3://bucket/runs/NAME)")
    add_root_argument(sql)
    sql.add_argument("query", nargs="?", help="the SQL query (none: an interactive shell)")
    sql.add_argument("--format", choices=("table", "csv"), default="table",
                     help="table (at most --max-rows rows) or csv (every row, streamed)")
    sql.add_argument("--max-rows", type=positive_int, default=MAX_ROWS,
                     help=f"most rows a table shows (default {MAX_ROWS}); the rest is never "
                     "computed: add LIMIT/OFFSET, or --format csv for every row")
    sql.set_defaults(func=cmd_sql)


def cmd_sql(args: argparse.Namespace) -> int:
    # SIGTERM (a scheduler's stop, `kill`) ends the command as Ctrl-C does, so its private
    # temporary folders go with it (killed by the default handler, they stayed).
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _sql(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _sql(args: argparse.Namespace) -> int:
    from ub.data.sql import connect, connect_tables, table_dataset
    from ub.run.folder.layout import is_run, no_such_run
    from ub.run.folder.sweep import is_runs_root, sweep_tables
    from ub.run.folder.urls import DEFAULT_RUNS_ROOT, is_url
    from ub.run.folder.views import RunViews

    given = args.run if args.root is None else f"{args.root.rstrip('/')}/{args.run}"
    shown: Path | str = given
    if is_url(given):
        con, names = _connect_store(given)
    else:
        root = Path(given)
        named = Path(DEFAULT_RUNS_ROOT) / args.run
        if not root.exists() and args.root is None and len(root.parts) == 1 and is_run(named):
            root = named  # a run's name, under the default runs root
        if not root.exists():
            if len(Path(args.run).parts) == 1:
                raise no_such_run(args.root or DEFAULT_RUNS_ROOT, args.run,
                                  "" if args.root else f" (and no folder {args.run} here)")
            raise UbError(f"{root} does not exist: give a run (its name or folder), a folder "
                          "of runs, or the folder `ub play --out` wrote")
        warnings: list[str] = []
        if is_runs_root(root):
            tables, warnings = sweep_tables(root)
            con, names = connect_tables(tables), sorted(tables)
        else:
            extra = {}
            if is_run(root):
                views = RunViews(root)
                extra = views.tables()
                for table in ("steps", "games"):
                    extra[f"eval_{table}"] = table_dataset(root / "eval", table)
                warnings = views.warnings
            con = connect(root, extra)
            names = sorted(["steps", "games", *extra])
        for warning in warnings:
            print(f"ub: warning: {warning}", file=sys.stderr)
        shown = root
    try:
        if args.query is not None:
            _print_result(con, args.query, args.format, args.max_rows)
            return 0
        _sql_shell(con, shown, names, args.max_rows)
    finally:
        con.close()
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _connect_store(url: str):
    """DuckDB over a run in a store: the shards read in place, the run's tables built from its
    records (fetched to a temporary folder; they are small)."""
    import tempfile

    from ub.data.schema import TABLES
    from ub.data.sql import connect_tables
    from ub.run.folder.store import RunStore
    from ub.run.folder.views import RunViews

    store = RunStore(url.rstrip("/"))
    if not store.files("games") and not store.files("rounds"):
        raise UbError(f"{url} holds no ub data (no games/ or rounds/): give the URL of a run "
                      "(the runs root followed by the run name)")
    tables = {}
    for table in TABLES:
        tables[table] = store.shard_dataset(table)
        tables[f"eval_{table}"] = store.shard_dataset(table, "eval")
    with tempfile.TemporaryDirectory(prefix="ub-sql-") as records:
        store.pull_records(Path(records))
        views = RunViews(Path(records))
        tables.update(views.tables())
    for warning in views.warnings:
        print(f"ub: warning: {warning}", file=sys.stderr)
    return connect_tables(tables), sorted(tables)


def _sql_shell(con, root: Path | str, views: list[str], max_rows: int = MAX_ROWS) -> None:
    """Read statements (ending with ``;``) from stdin until EOF or ``.quit``."""
    import duckdb

    from ub.data.sql import sql_error_line

    interactive = sys.stdin.isatty()
    if interactive:
        print(f"ub sql {root} (read-only). Views: {', '.join(views)}. End statements with ';', "
              "quit with .quit or Ctrl-D.")
    buffer = ""
    while True:
        try:
            line = input("ub> " if not buffer else "... ") if interactive else sys.stdin.readline()
        except EOFError:
            break
        if not interactive and line == "":
            break
        if line.strip() in (".quit", ".exit"):
            break
        buffer += line + ("\n" if interactive else "")
        if buffer.strip().endswith(";"):
            try:
                for statement in con.extract_statements(buffer):
                    _print_result(con, statement.query, "table", max_rows)
            except (UbError, duckdb.Error) as exc:
                print(f"ub: error: {sql_error_line(exc)}", file=sys.stderr)
            buffer = ""


def _print_result(con, sql: str, fmt: str, max_rows: int = MAX_ROWS) -> None:
    """Print ``sql``'s result as it streams: every row as CSV, or a table of at most
    ``max_rows`` rows (the query stops there)."""
    from ub.data.sql import stream_sql

    schema, batches = stream_sql(con, sql)
    if fmt == "csv":
        import csv

        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(schema.names)
        for batch in batches:
            for row in batch.to_pylist():
                writer.writerow(["" if v is None else v for v in row.values()])
        return
    from rich.console import Console
    from rich.table import Table

    view = Table(show_lines=False)
    for name in schema.names:
        view.add_column(_cell(name))
    shown, more, cut = 0, False, False
    for batch in batches:
        room = max_rows - shown
        for row in batch.slice(0, room).to_pylist():
            cut = cut or any(len(str(v)) > CELL_WIDTH for v in row.values())
            view.add_row(*[_cell(v) for v in row.values()])
        shown += min(batch.num_rows, room)
        if batch.num_rows > room:  # (a row past the cap: the query stops here)
            more = True
            break
    Console().print(view)
    if more:
        print(f"(the first {shown} rows; the query returns more, not fetched: "
              "add LIMIT/OFFSET, raise --max-rows, or use --format csv for every row)")
    else:
        print(f"({shown} row{'s' if shown != 1 else ''})")
    if cut:
        print(f"(values longer than {CELL_WIDTH} characters are cut, ending in …: --format "
              "csv writes them whole)")


CELL_WIDTH = 80
"""The characters a table cell shows of a value (a prompt is thousands)."""


def _cell(value: object, width: int = CELL_WIDTH) -> Text:
    from ub.display import shown

    text = "NULL" if value is None else str(value)
    return shown(text if len(text) <= width else text[: width - 1] + "…")
