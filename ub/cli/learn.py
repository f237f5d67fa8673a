"""``ub learn``: one learner update, shards -> a new LoRA checkpoint."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ub.cli.args import (
    HelpWhenPrinted,
    add_batch_options,
    add_checkpoint_io,
    add_learner_options,
    yaml_document,
    yaml_section,
)
from ub.cli.batch import batch_config
from ub.data.atomic import check_can_create
from ub.errors import UbError

if TYPE_CHECKING:
    from ub.learner import LearnerConfig


def add_parser(sub) -> None:
    learn = sub.add_parser("learn", help="one learner update: shards -> new LoRA checkpoint")
    add_checkpoint_io(learn)
    learn.add_argument("--from", dest="from_checkpoint", help="checkpoint to continue from "
                       "(default: a cold start from --init-adapter or a fresh adapter)")
    learn.add_argument("--config", help="YAML with `batch:` and `learner:` sections")
    learn.add_argument("--algorithm", help=HelpWhenPrinted(_algorithm_help))
    add_learner_options(learn, records="--from or --init-adapter",
                        init_adapter_help="PEFT adapter to start a cold start from")
    add_batch_options(learn)
    learn.set_defaults(func=cmd_learn)


def _algorithm_help() -> str:
    from ub.learner import algorithm_names
    from ub.learner.config import LearnerSection
    from ub.settings import default_of

    return (f"the loss: {', '.join(algorithm_names())}, or your own as package.module:Class "
            f"(default: --config's learner.algorithm, else "
            f"{default_of(LearnerSection, 'algorithm')})")


def cmd_learn(args: argparse.Namespace) -> int:
    import json

    from ub.learner import learn_step

    root = Path(args.shards)
    if not root.exists():
        raise UbError(f"{root} does not exist: give the data folder of the decisions to learn from")
    if args.from_checkpoint and not Path(args.from_checkpoint).exists():
        raise UbError(f"checkpoint {args.from_checkpoint} does not exist")
    if args.overwrite:
        from ub.learner.checkpoint_writer import check_replaceable

        check_replaceable(args.out)  # (before the batch and the model load)
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


def learner_config(args: argparse.Namespace) -> LearnerConfig:
    """The ``learner:`` section of ``--config`` with the command-line overrides."""
    from ub.learner.config import LearnerConfig, with_run_given

    # null means "the default" (a run's config.yaml stores every setting, nulls included); a
    # run's config also carries what its learner takes from the run (seed, sampling).
    data = {k: v for k, v in yaml_section(args.config, "learner").items() if v is not None}
    run = run_level_learner_defaults(args.config)
    if run is not None:
        data = with_run_given(data, run)
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


def run_level_learner_defaults(path_text: str | None) -> dict[str, Any] | None:
    """The learner settings a run's config gives through its top-level ``seed`` and
    ``sampling:`` (:func:`ub.learner.config.run_given`; ``None`` for a YAML that has neither,
    e.g. just ``batch:`` and ``learner:``: a default run's then, as for any LearnerConfig)."""
    whole = yaml_document(path_text)
    if "seed" not in whole and "sampling" not in whole:
        return None
    from ub.inference.types import SamplingConfig
    from ub.learner.config import run_given
    from ub.seeding import DEFAULT_SEED

    try:
        sampling = SamplingConfig.from_dict(whole.get("sampling"))
    except UbError as error:
        raise UbError(f"{path_text}: {error}") from None
    seed = whole.get("seed")
    return run_given(DEFAULT_SEED if seed is None else seed, sampling)
