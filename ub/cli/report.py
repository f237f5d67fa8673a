"""``ub report``: plots of a run, or of a folder of runs overlaid, as PNGs and one HTML page."""

from __future__ import annotations

import argparse
from pathlib import Path

from ub.cli.args import add_root_argument, run_dir
from ub.errors import UbError


def add_parser(sub) -> None:
    report = sub.add_parser("report", help="plots of a run (or of a folder of runs, "
                            "overlaid by arm): PNGs and one HTML page")
    report.add_argument("run", help="run name (under --root), run directory, or a folder of "
                        "runs (a sweep: each run's learning curve, each arm's mean)")
    add_root_argument(report)
    report.add_argument("--out", help="output folder (default: RUN/report, or FOLDER/report)")
    report.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from ub.report import write_report, write_sweep_report
    from ub.run.folder.sweep import is_runs_root

    folder = Path(args.run)
    if is_runs_root(folder):
        print(write_sweep_report(folder, _output_folder(args.out, folder)))
        return 0
    root = run_dir(args)
    print(write_report(root, _output_folder(args.out, root)))
    return 0


def _output_folder(out: str | None, root: Path) -> Path:
    """``--out``, the user's choice, or ``ROOT/report``, which must be no link: whoever can
    write a run or a folder of runs would aim the report's files (and the removal of a stale
    figure) at a folder of the reader's (docs/security.md)."""
    if out:
        return Path(out)
    default = root / "report"
    if default.is_symlink():
        raise UbError(f"{default} is a link, and ub report writes no file through a link "
                      "inside a run or a folder of runs: remove it, or give --out FOLDER")
    return default
