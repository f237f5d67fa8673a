"""``ub learn``: one learner update, shards -> a new LoRA checkpoint."""

from __future__ import annotations

import argparse
from pathlib import Path

from ub.cli.args import (
    add_batch_options,
    add_checkpoint_io,
    add_learner_options,
    check_can_create,
    yaml_section,
)
from ub.cli.batch import batch_config
from ub.errors import UbError


def add_parser(sub) -> None:
    learn = sub.add_parser("learn", help="one learner update: shards -> new LoRA checkpoint")
    add_checkpoint_io(learn)
    learn.add_argument("--from", dest="from_checkpoint", help="checkpoint to continue from "
                       "(default: a cold start from --init-adapter or a fresh adapter)")
    learn.add_argument("--config", help="YAML with `batch:` and `learner:` sections")
    learn.add_argument("--algorithm", help="reinforce (default) or ppo")
    add_learner_options(learn, records="--from or --init-adapter",
                        init_adapter_help="PEFT adapter to start a cold start from")
    add_batch_options(learn)
    learn.set_defaults(func=cmd_learn)


def cmd_learn(args: argparse.Namespace) -> int:
    import json

    from ub.learner import learn_step

    root = Path(args.shards)
    if not root.exists():
        raise UbError(f"{root} does not exist: give the data folder of the decisions to learn from")
    if args.from_checkpoint and not Path(args.from_checkpoint).exists():
        raise UbError(f"checkpoint {args.from_checkpoint} does not exist")
    batch = batch_config(args)
    learner = learner_config(args)
    out = Path(args.out)
    check_can_create(out.parent)
    metrics = learn_step(root, batch, learner, args.from_checkpoint, out,
                         overwrite=args.overwrite)
    summary = {k: v for k, v in metrics.items() if not isinstance(v, dict)}
    print(json.dumps(summary, indent=2, default=str))
    print(f"checkpoint: {out}")
    return 0


def learner_config(args: argparse.Namespace):
    """The ``learner:`` section of ``--config`` with the command-line overrides."""
    from ub.learner import LearnerConfig

    data = yaml_section(args.config, "learner")
    for key in ("algorithm", "learning_rate", "init_adapter", "base_model"):
        if getattr(args, key, None) is not None:
            data[key] = getattr(args, key)
    start = getattr(args, "from_checkpoint", None) or data.get("init_adapter")
    if not data.get("base_model") and start:
        # The base model the checkpoint records (its own tiny build, not whatever `tiny`
        # builds now), found or built on this machine.
        from ub.learner.base_identity import resolve_checkpoint_base

        data["base_model"] = resolve_checkpoint_base(start)
    if not data.get("base_model"):
        from ub.model.tiny import build_tiny_model

        data["base_model"] = str(build_tiny_model())
    return LearnerConfig.from_dict(data)

