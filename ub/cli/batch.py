"""``ub batch``: show the training batch a config would assemble (and its SQL)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from ub.cli.args import add_batch_options, yaml_section
from ub.errors import UbError
from ub.numbers import NumberError, parse_int

if TYPE_CHECKING:
    from ub.batch import BatchConfig


def add_parser(sub) -> None:
    batch = sub.add_parser("batch", help="show the training batch a config would assemble")
    batch.add_argument("root", help="a data folder or run directory")
    batch.add_argument("--config", help="YAML file of batch settings (or with a `batch:` key)")
    add_batch_options(batch)
    batch.add_argument("--explain", action="store_true", help="print the plan and SQL only")
    batch.set_defaults(func=cmd_batch)


def batch_config(args: argparse.Namespace) -> BatchConfig:
    """The ``batch:`` section of ``--config`` with the command-line overrides, validated (one
    :class:`UbError` line naming the bad key)."""
    from ub.batch import BatchConfig

    data = yaml_section(args.config, "batch")
    for key in ("batch_size", "seed", "max_train_len"):
        if getattr(args, key) is not None:
            data[key] = getattr(args, key)
    if args.rounds:
        first, _, last = args.rounds.partition(":")
        try:
            data["first_round"] = parse_int(first) if first else None
            data["last_round"] = (parse_int(last) if last
                                  else (None if _ else data["first_round"]))
        except NumberError:
            raise UbError(
                f"--rounds takes A:B, A: or :B with round numbers, got {args.rounds!r}"
            ) from None
    return BatchConfig.from_dict(data)


def cmd_batch(args: argparse.Namespace) -> int:
    from ub.batch import assemble_batch, explain

    root = Path(args.root)
    if not root.exists():
        raise UbError(f"{root} does not exist: give a data folder or run directory")
    config = batch_config(args)
    if args.explain:
        print(explain(root, config))
        return 0
    batch = assemble_batch(root, config)
    stats = batch.stats
    print(f"batch: {stats.size} decisions (asked {stats.requested}) from rounds "
          f"{stats.window[0]}..{stats.window[1]} ({stats.shards} shards), per env {stats.per_env}")
    print(f"tokens: {stats.total_tokens} ({stats.prompt_tokens} prompt, "
          f"{stats.completion_tokens} completion), longest {stats.max_len}; truncated "
          f"{stats.truncated} sequences by {stats.truncated_tokens} tokens")
    print(f"reward: mean {stats.reward_mean:.3f} std {stats.reward_std:.3f} "
          f"[{stats.reward_min:.3f}, {stats.reward_max:.3f}]; advantage: mean "
          f"{stats.advantage_mean:.3f} std {stats.advantage_std:.3f} "
          f"[{stats.advantage_min:.3f}, {stats.advantage_max:.3f}]")
    print(f"assembled in {stats.seconds:.2f} s; the query (see --explain for the full plan):")
    print(batch.sql)
    return 0

