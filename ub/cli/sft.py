"""``ub sft``: warm start, fine-tune an adapter on SQL-selected moves."""

from __future__ import annotations

import argparse
from pathlib import Path

from ub.cli.args import (
    add_batch_options,
    add_checkpoint_io,
    add_learner_options,
    positive_int,
    yaml_section,
)
from ub.cli.learn import learner_config
from ub.data.atomic import check_can_create
from ub.errors import UbError


def add_parser(sub) -> None:
    sft = sub.add_parser("sft", help="warm start: fine-tune an adapter on SQL-selected moves")
    add_checkpoint_io(sft)
    sft.add_argument("--where", help="DuckDB condition over s (steps) and g (games); default: "
                     "the winners' legal moves")
    sft.add_argument("--config", help="YAML with `sft:` and `learner:` sections")
    sft.add_argument("--epochs", type=positive_int)
    add_learner_options(sft, records="--init-adapter",
                        init_adapter_help="PEFT adapter to start from")
    add_batch_options(sft, rounds=False)
    sft.set_defaults(func=cmd_sft)


def cmd_sft(args: argparse.Namespace) -> int:
    from ub.sft import SftConfig, train_sft

    root = Path(args.shards)
    if not root.exists():
        raise UbError(f"{root} does not exist: give the data folder of the decisions to imitate")
    if args.overwrite:
        from ub.learner.checkpoint_writer import check_replaceable

        check_replaceable(args.out)  # (before the data and the model load)
    data = yaml_section(args.config, "sft")
    for key in ("where", "epochs", "batch_size", "max_train_len", "seed"):
        if getattr(args, key) is not None:
            data[key] = getattr(args, key)
    config = SftConfig.from_dict(data)
    learner = learner_config(args)
    out = Path(args.out)
    check_can_create(out.parent)
    summary = train_sft(root, config, learner, out, overwrite=args.overwrite)
    print(f"{summary['decisions']} decisions, {summary['steps']} steps, final loss "
          f"{summary['loss']:.4f}")
    print(f"checkpoint: {out}")
    return 0

