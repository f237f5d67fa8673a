"""``ub config show``: a resolved training config, every key explained."""

from __future__ import annotations

import argparse

from ub.cli.parser import Parser


def add_parser(sub) -> None:
    config = sub.add_parser("config", help="show a resolved training config, every key explained")
    config_sub = config.add_subparsers(dest="config_command", required=True, parser_class=Parser)
    show = config_sub.add_parser("show", help="print a config as YAML with each key's meaning "
                                 "(docs/config.md lists every key)")
    show.add_argument("what", help="a preset name, a YAML file or a run folder (its config.yaml)")
    show.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                      help="override one field (the value is YAML), e.g. --set rounds=4")
    show.set_defaults(func=cmd_config)


def cmd_config(args: argparse.Namespace) -> int:
    from ub.run.config.docs import load_any, show

    config, label = load_any(args.what, args.overrides)
    print(show(config, label), end="")
    return 0
