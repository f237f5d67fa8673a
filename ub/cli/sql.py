"""``ub sql``: read-only SQL over a data folder, a run directory or a run in a store."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from ub.cli.args import add_root_argument, positive_int
from ub.cli.sql_output import MAX_ROWS, print_result
from ub.errors import UbError


def add_parser(sub) -> None:
    sql = sub.add_parser("sql", help="read-only SQL over a data folder, a run or a folder of "
                         "runs (docs/sql.md)")
    _parse_intermixed(sql)
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


def _parse_intermixed(parser: argparse.ArgumentParser) -> None:
    """Let ``parser``'s positionals come after its options too: ``ub sql NAME --root R QUERY``.
    argparse matches the positionals before the first option at once, so the optional QUERY
    was given nothing at NAME and the query after ``--root`` refused as unrecognized. A
    subcommand's parser is called through its ``parse_known_args`` (argparse has no way to
    make a subparser parse intermixed), which ``parse_known_intermixed_args`` calls in turn:
    hence the guard."""
    plain = parser.parse_known_args
    inside = False

    def parse_known_args(args: Sequence[str] | None = None,
                         namespace: argparse.Namespace | None = None
                         ) -> tuple[argparse.Namespace, list[str]]:
        nonlocal inside
        if inside:
            return plain(args, namespace)
        inside = True
        try:
            return parser.parse_known_intermixed_args(args, namespace)
        finally:
            inside = False

    parser.parse_known_args = parse_known_args  # type: ignore[method-assign, assignment]


def cmd_sql(args: argparse.Namespace) -> int:
    # SIGTERM (a scheduler's stop, `kill`) ends the command as Ctrl-C does, so its private
    # temporary folders go with it (killed by the default handler, they stayed).
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _sql(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _sql(args: argparse.Namespace) -> int:
    from ub.data.sql import connect_tables, data_tables
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
        elif is_run(root):  # (its shards too, read as its views read it: no link followed)
            views = RunViews(root)
            tables = {**views.shard_tables(), **views.tables()}
            warnings = views.warnings
        else:
            tables = {**data_tables(root)}
        con, names = connect_tables(tables), sorted(tables)
        for warning in warnings:
            print(f"ub: warning: {warning}", file=sys.stderr)
        shown = root
    try:
        if args.query is not None:

            print_result(con, args.query, args.format, args.max_rows)
            return 0
        from ub.cli.sql_shell import sql_shell

        sql_shell(con, shown, names, args.max_rows)
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
