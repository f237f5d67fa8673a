"""``ub eval``: evaluate a run's checkpoint against fixed opponents (in this process)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ub.cli.args import game_count, non_negative_int
from ub.errors import UbError

if TYPE_CHECKING:
    from ub.run.folder.layout import RunPaths
    from ub.run.steps.rounds import Run


def add_parser(sub) -> None:
    evaluate = sub.add_parser("eval", help="evaluate a run's checkpoint against fixed opponents")
    evaluate.add_argument("run", help="run name")
    evaluate.add_argument("--root", default="runs",
                          help="folder of runs, or an fsspec URL (default: runs)")
    evaluate.add_argument("--checkpoint", type=non_negative_int,
                          help="checkpoint update (default: latest)")
    evaluate.add_argument("--opponents", help="comma-separated actors (default: the run's)")
    evaluate.add_argument("--envs", help="comma-separated env ids (default: the run's)")
    evaluate.add_argument("--games", type=game_count, help="games per (env, opponent)")
    evaluate.set_defaults(func=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from ub.run.folder.layout import RunPaths, checkpoint_name
    from ub.run.folder.lock import RunLock, removed_if_refused
    from ub.run.processes.worker import process_worker
    from ub.run.steps.evaluate import evaluate_checkpoint
    from ub.run.steps.progress import baseline_cell, eval_cell

    paths = RunPaths.of(args.root, args.run)
    # Everything that can be refused is refused before the lock and the engine (an eval that
    # starts writes a shard); a store run's working copy made for a refused one goes again.
    with removed_if_refused(paths):
        run, update, opponents, envs = _checked(args, paths)
    with RunLock(paths.lock):
        custom = opponents is not None or envs is not None or args.games is not None
        shard = None if custom else 0  # None: the stored ad-hoc shard of these games or a new one
        result = evaluate_checkpoint(run, update, opponents=opponents, envs=envs,
                                     games=args.games, shard=shard, worker=process_worker())
    table = Table(title=f"{args.run}: {checkpoint_name(update)}")
    for column in ("env", "opponent", "games", "win rate [95% CI]", "random in its seats",
                   "draws", "losses", "invalid moves", "format ok"):
        table.add_column(column)
    for row in result["rows"]:
        table.add_row(row["env_id"], row["opponent"], str(row["games"]), eval_cell(row),
                      baseline_cell(row), str(row["draws"]), str(row["losses"]),
                      f"{row['invalid_move_rate']:.1%}", f"{row['format_rate']:.1%}")
    Console(highlight=False).print(table)
    print(f"games: {result['shard']}" + (" (stored earlier)" if result["reused"] else ""))
    return 0


def _checked(args: argparse.Namespace, paths: RunPaths
             ) -> tuple[Run, int, list[str] | None, list[str] | None]:
    """The run, the checkpoint's update, the opponents and envs ``ub eval`` was asked for,
    each checked (the envs started with the seats the evaluation gives them)."""
    from ub.games.specs import check_env
    from ub.learner.checkpoint import latest_checkpoint, read_adapter
    from ub.run.config.base_model import resolve_base_model
    from ub.run.config.load import game_specs
    from ub.run.folder.store import catch_up, fetch_checkpoint
    from ub.run.steps.plan import actor_spec
    from ub.run.steps.rounds import Run, resolve_run_config

    catch_up(paths)
    config, _ = resolve_run_config(paths, None)
    if args.checkpoint is None:
        latest = latest_checkpoint(paths.root / "checkpoints")
        if latest is None:
            raise UbError(f"run {args.run} has no checkpoint yet")
        update = int(latest.name.rsplit("-", 1)[1])
    else:
        update = args.checkpoint
        fetch_checkpoint(paths, paths.checkpoint(update))
        if not paths.checkpoint(update).exists():
            raise UbError(f"run {args.run} has no checkpoint {update} "
                          f"({paths.checkpoint(update)})")
    opponents = _names(args.opponents)
    envs = _names(args.envs)
    if args.games is not None and args.games % 2:
        raise UbError(f"--games must be even so both seats get the same number, got "
                      f"{args.games}")
    try:  # each started with the seats and the prompt format the evaluation gives it
        for spec in game_specs(config, envs) if envs else []:
            check_env(spec)
    except (UbError, ValueError) as exc:  # (ValueError: no prompt format to take)
        raise UbError(f"--envs: {exc}") from None
    read_adapter(paths.checkpoint(update))  # safetensors that load, before vLLM meets them
    run = Run(paths, config, resolve_base_model(config))
    # Unknown names list the valid ones, before the engine starts.
    for name in opponents or []:
        actor_spec(run, name)
        if name == "expert":
            from ub.actors.expert import check_expert_supports

            for env_id in envs or config.eval.env_ids or [e.env_id for e in config.envs]:
                check_expert_supports(env_id)
    return run, update, opponents, envs


def _names(text: str | None) -> list[str] | None:
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UbError(f"expected a comma-separated list of names, got {text!r}")
    return names
