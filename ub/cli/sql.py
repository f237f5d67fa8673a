"""``ub sql``: read-only SQL over a data folder, a run directory or a run in a store."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence

from ub.cli.args import add_root_argument, positive_int
from ub.cli.sql_output import MAX_ROWS, print_result


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
    from ub.analysis import open as open_data

    opened = open_data(args.run, args.root)
    for warning in opened.warnings:
        print(f"ub: warning: {warning}", file=sys.stderr)
    with opened:
        if args.query is not None:
            print_result(opened.connection, args.query, args.format, args.max_rows)
            return 0
        from ub.cli.sql_shell import sql_shell

        sql_shell(opened.connection, opened.location, opened.views, args.max_rows)
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
