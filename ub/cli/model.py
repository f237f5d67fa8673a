"""``ub model tiny``: build (or find cached) the tiny CPU default model."""

from __future__ import annotations

import argparse
from pathlib import Path

from ub.cli.args import whole_number
from ub.cli.parser import Parser
from ub.data.atomic import check_can_create
from ub.errors import UbError


def add_parser(sub) -> None:
    model = sub.add_parser("model", help="build models")
    model_sub = model.add_subparsers(dest="model_command", required=True, parser_class=Parser)
    tiny = model_sub.add_parser("tiny", help="build (or find cached) the tiny CPU default model")
    add_tiny_arguments(tiny)
    tiny.set_defaults(func=cmd_model_tiny)


def add_tiny_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``ub model tiny``."""
    parser.add_argument("--seed", type=whole_number, default=0, help="build seed (default 0)")
    parser.add_argument("--out", help="build into this folder instead of the cache")
    parser.add_argument("--set", action="append", default=[], dest="overrides",
                        metavar="NAME=VALUE",
                        help="change a setting of the recipe (docs/config.md: TinyModelConfig), "
                             "e.g. --set num_layers=6; repeatable")
    parser.add_argument("--for", dest="for_checkpoint", metavar="CKPT",
                        help="the tiny build checkpoint CKPT was trained on (found or built)")


def cmd_model_tiny(args: argparse.Namespace) -> int:
    from ub.model.tiny import TinyModelConfig, build_tiny_model
    from ub.settings import apply_overrides

    if args.for_checkpoint:
        print(_tiny_build_of(args.for_checkpoint, args))
        return 0
    try:
        config = TinyModelConfig.from_dict(apply_overrides({}, args.overrides, "num_layers=6"))
    except UbError as exc:
        raise UbError(f"invalid tiny model settings: {exc}") from None
    out = Path(args.out) if args.out else None
    if out is not None:
        check_can_create(out.parent)  # (creates nothing: a refused build leaves no folder)
    path = build_tiny_model(out, seed=args.seed, config=config)
    print(path)
    return 0


def _tiny_build_of(checkpoint: str, args: argparse.Namespace) -> str:
    """The folder of the tiny build a checkpoint records (plain PEFT loads its base from it)."""
    from ub.learner.base_identity import checkpoint_base
    from ub.model.identity import portable_name, resolve_tiny_build

    if args.out or args.seed or args.overrides:
        raise UbError("--for takes the build from the checkpoint: give no --out, --seed or --set")
    identity = checkpoint_base(checkpoint)
    if identity.get("kind") != "tiny":
        raise UbError(f"{checkpoint} was trained on {portable_name(identity)}, not a tiny "
                      "build: load that base model")
    return str(resolve_tiny_build(identity))
