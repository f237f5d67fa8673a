"""``ub dashboard``: a live terminal view of a run."""

from __future__ import annotations

import argparse

from ub.cli.args import add_root_argument, run_dir, wait_seconds


def add_parser(sub) -> None:
    dashboard = sub.add_parser("dashboard", help="live terminal view of a run (q quits)")
    dashboard.add_argument("run", help="run name (under --root) or run directory")
    add_root_argument(dashboard)
    dashboard.add_argument("--once", action="store_true", help="print one frame and exit")
    dashboard.add_argument("--refresh", type=wait_seconds, default=2.0,
                           help="seconds between refreshes (default 2)")
    dashboard.set_defaults(func=cmd_dashboard)


def cmd_dashboard(args: argparse.Namespace) -> int:
    from ub.dashboard import run_dashboard

    run_dashboard(run_dir(args), once=args.once, refresh=args.refresh)
    return 0
