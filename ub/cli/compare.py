"""``ub compare FOLDER``: a sweep's arms over paired seeds (:mod:`ub.compare`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ub.cli.args import whole_number
from ub.compare import (
    arm_letters,
    arm_settings,
    comparable_runs,
    compare,
    latest_common_checkpoint,
    measured,
)
from ub.errors import UbError


def add_parser(sub) -> None:
    parser = sub.add_parser("compare", help="a folder of runs as arms over paired seeds: "
                            "each arm's mean and interval, each arm less the reference")
    parser.add_argument("folder", help="a folder of runs (a sweep: runs that differ in their "
                        "settings and seed)")
    parser.add_argument("--checkpoint", type=whole_number,
                        help="the checkpoint to compare (default: the latest every run "
                        "evaluated)")
    parser.add_argument("--reference", help="the arm the others are paired with: its name "
                        "(a sweep's --arm NAME) or its settings as the table's legend gives them "
                        "(default: the first arm by name)")
    parser.add_argument("--format", choices=("table", "csv"), default="table")
    parser.set_defaults(func=cmd_compare)


def cmd_compare(args: argparse.Namespace) -> int:
    from ub.run.folder.sweep import is_runs_root, sweep_tables

    folder = Path(args.folder)
    if not is_runs_root(folder):
        raise UbError(_no_runs_root(folder))
    tables, warnings = sweep_tables(folder)
    runs, left_out = comparable_runs(tables["runs"].to_pylist())
    for warning in [*warnings, *left_out]:
        print(f"ub: warning: {warning}", file=sys.stderr)
    if not runs:
        raise UbError(f"no run under {folder} can be compared: each is left out (the warnings "
                      "above say why)")
    evals = tables["evals"].to_pylist()
    checkpoint = args.checkpoint
    if checkpoint is None:
        checkpoint = latest_common_checkpoint(evals, [r["run"] for r in runs])
        if checkpoint is None:
            raise UbError(f"the runs under {folder} evaluated no checkpoint in common: compare "
                          "one they did with --checkpoint N (the evals view lists them)")
    figures = measured(runs, evals, tables["exploitability"].to_pylist(), checkpoint)
    if not figures:
        raise UbError(f"no run under {folder} evaluated checkpoint {checkpoint}")
    arms = sorted({f.arm for f in figures})
    settings = arm_settings(runs)
    reference = arms[0]
    if args.reference is not None:
        named = [arm for arm in arms if args.reference in (arm, settings[arm])]
        if not named:
            raise UbError(f"--reference {args.reference!r} is none of the arms: give one of "
                          f"{'; '.join(arms)}")
        reference = named[0]
    summaries, pairs = compare(figures, reference)
    _print(summaries, pairs, reference, settings, checkpoint, args.format)
    return 0


def _no_runs_root(folder: Path) -> str:
    """Why ``folder`` is no folder of runs, and what to give instead (every hint works)."""
    from ub.run.folder.layout import is_run  # (pydantic: commands start without it)

    if not folder.is_dir():
        return f"no folder {folder}: give the folder that holds a sweep's runs (its --root)"
    if is_run(folder):
        return (f"{folder} is one run, not a folder of runs: give the folder that holds it "
                f"with the runs to compare it to ({folder.parent}, say)")
    return (f"{folder} holds no run (a run is a folder with ub-run.json, as ub train and "
            "ub sweep make them): give the folder a sweep's --root named")


def _print(summaries, pairs, reference: str, settings: dict[str, str], checkpoint: int,
           fmt: str) -> None:
    paired = {(p.figure, p.arm): p for p in pairs}
    # A table names each arm by its name or a letter, and a legend above it says its settings
    # once.
    letters = arm_letters({s.arm for s in summaries}, settings)
    columns = ("figure", "arm", "moves", "seeds", "mean", "95% interval", "clears random",
               "less the reference", "se", "seeds up")
    rows = []
    for s in summaries:
        p = paired.get((s.figure, s.arm))
        rows.append((s.figure, s.arm if fmt == "csv" else letters[s.arm], s.moves or "-",
                     str(s.seeds),
                     f"{s.mean:.3f}",
                     f"[{s.low:.3f}, {s.high:.3f}]",
                     f"{s.clears} of {s.barred}" if s.barred else "-",
                     f"{p.mean:+.3f}" if p else "(reference)" if s.arm == reference else "-",
                     f"{p.se:.3f}" if p and p.se is not None else "-",
                     f"{p.up} of {p.seeds}" if p else "-"))
    if fmt == "csv":
        import csv

        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(["checkpoint", *columns, "settings"])
        writer.writerows([(checkpoint, *row, settings[s.arm])
                          for row, s in zip(rows, summaries, strict=True)])
        return
    from rich.console import Console
    from rich.table import Table

    from ub.display import shown

    console = Console(highlight=False)
    if not console.is_terminal:  # (a pipe or a log: rich would wrap at 80 columns)
        console.width = max(console.width, 160)
    for arm, letter in letters.items():
        console.print(shown(f"arm {letter}: {settings[arm]}" + (" (the reference)"
                                                                 if arm == reference else "")))
    table = Table(title=f"checkpoint {checkpoint}: each arm over its seeds, and less the "
                  f"reference arm ({letters[reference]}) seed by seed")
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(shown(cell) for cell in row))
    console.print(table)

