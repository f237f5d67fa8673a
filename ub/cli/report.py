"""``ub report``: plots of a run, as PNGs and one HTML page."""

from __future__ import annotations

import argparse
from pathlib import Path

from ub.cli.args import add_root_argument, run_dir


def add_parser(sub) -> None:
    report = sub.add_parser("report", help="plots of a run: PNGs and one HTML page")
    report.add_argument("run", help="run name (under --root) or run directory")
    add_root_argument(report)
    report.add_argument("--out", help="output folder (default: RUN/report)")
    report.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from ub.report import write_report

    root = run_dir(args)
    print(write_report(root, Path(args.out) if args.out else root / "report"))
    return 0
