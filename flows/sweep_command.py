"""``ub sweep CONFIG [--set KEY=VALUE ...] --arm NAME [KEY=VALUE ...] ... --seeds 0-9``: a
config's arms over seeds, as the ``sweep`` Prefect flow (:mod:`ub.flows.sweep`);
``ub compare ROOT`` reads them."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from ub.cli.args import round_number
from ub.errors import UbError
from ub.flows.sweep_plan import MAX_SWEEP_RUNS, check_recorded_settings, sweep_runs, too_many_runs
from ub.numbers import NumberError, parse_int


def add_parser(sub) -> None:
    sweep = sub.add_parser("sweep", help="train a config's arms over seeds (a resumable "
                           "Prefect flow); ub compare ROOT reads them")
    sweep.add_argument("config", help="a preset or a YAML file: every run's config")
    sweep.add_argument("--arm", nargs="+", action="append", required=True,
                       metavar=("NAME", "KEY=VALUE"),
                       help="an arm: its name, then its settings over CONFIG (none: CONFIG "
                       "itself); repeat for each arm")
    sweep.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="a setting every arm shares, e.g. --set rounds=16 (an arm's own "
                       "setting of the same key wins); repeatable")
    sweep.add_argument("--seeds", required=True, type=seed_list,
                       help="the seeds of every arm: 0-9, or 0,3,7")
    sweep.add_argument("--root", required=True,
                       help="the sweep's folder: its runs are ROOT/ARM-sSEED")
    sweep.add_argument("--rounds", type=round_number(1), help="each run's rounds (default: "
                       "the config's)")
    sweep.add_argument("--quiet", action="store_true", help="no progress lines")
    sweep.set_defaults(func=cmd_sweep)


def seed_list(text: str) -> list[int]:
    """``0-9`` or ``0,3,7`` (or both: ``0-4,9``), as whole numbers in order, once each; more
    than a sweep plans is refused before a seed is listed."""
    seeds: dict[int, None] = {}
    try:
        for part in text.split(","):
            first, dash, last = part.strip().partition("-")
            low = parse_int(first, 0)
            high = parse_int(last, 0) if dash else low
            if high - low < MAX_SWEEP_RUNS:  # (a span is counted before it is listed)
                seeds.update(dict.fromkeys(range(low, high + 1)))
            if high - low >= MAX_SWEEP_RUNS or len(seeds) > MAX_SWEEP_RUNS:
                raise argparse.ArgumentTypeError(too_many_runs(
                    f"{text} is more than {MAX_SWEEP_RUNS} seeds"))
    except NumberError as exc:
        raise argparse.ArgumentTypeError(f"seeds are whole numbers >= 0 as 0-9 or 0,3,7: "
                                         f"{exc}") from None
    if not seeds:
        raise argparse.ArgumentTypeError(f"no seed in {text!r}: give 0-9 or 0,3,7")
    return list(seeds)


def cmd_sweep(args: argparse.Namespace) -> int:
    from ub.flows.server_watch import grace_seconds, require_server
    from ub.flows.train_command import start_prefect, stopped_by_a_signal

    bad = [s for s in args.set if "=" not in s]
    if bad:
        raise UbError(f"--set {bad[0]!r} is no KEY=VALUE setting")
    own: dict[str, list[str]] = {}  # each arm's settings as given
    for name, *settings in args.arm:
        if "=" in name:
            raise UbError(f"--arm {name}: an arm needs a name: --arm NAME KEY=VALUE ...")
        if name in own:
            raise UbError(f"--arm {name} is given twice: give each arm one name")
        bad = [s for s in settings if "=" not in s]
        if bad:
            raise UbError(f"--arm {name}: {bad[0]!r} is no KEY=VALUE setting")
        own[name] = settings
    arms = {name: [*args.set, *settings] for name, settings in own.items()}  # (later wins)
    # Every run's config, and each existing run's settings, are checked before Prefect starts
    # (and again by the flow).
    runs = sweep_runs(args.config, arms, args.seeds)
    check_recorded_settings(runs, str(args.root))
    grace_seconds()
    require_server()
    start_prefect(Path(args.root) / ".prefect")
    from ub.flows.sweep import sweep

    def train() -> None:
        sweep(config=args.config, arms=arms, seeds=args.seeds, root=str(args.root),
              rounds=args.rounds, quiet=args.quiet)

    if not stopped_by_a_signal(train):
        print(f"{len(runs)} runs under {args.root}: `ub compare {args.root}` compares the arms")
        return 0
    again = shlex.join(["ub", "sweep", args.config,
                        *(word for setting in args.set for word in ("--set", setting)),
                        *(word for name, s in own.items() for word in ("--arm", name, *s)),
                        "--seeds", ",".join(map(str, args.seeds)), "--root", str(args.root),
                        *(["--rounds", str(args.rounds)] if args.rounds else [])])
    raise KeyboardInterrupt(f"the sweep stopped; each run keeps its committed rounds: "
                            f"`{again}` continues it")
