"""``ub eval``: evaluate a run's checkpoint against fixed opponents, measure its exact
exploitability with ``--exploitability`` (:mod:`ub.run.steps.exploitability`), or score its
checkpoints on reasoning benchmarks with ``--tasks`` (:mod:`ub.run.steps.benchmarks`), in this
process."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ub.cli.args import checkpoint_choice, game_count, named_run, positive_int
from ub.errors import UbError
from ub.run.folder.urls import DEFAULT_RUNS_ROOT

if TYPE_CHECKING:
    from rich.console import Console

    from ub.run.folder.layout import RunPaths
    from ub.run.steps.rounds import Run


def add_parser(sub) -> None:
    evaluate = sub.add_parser("eval", help="evaluate a run's checkpoint against fixed "
                              "opponents, or on reasoning benchmarks (--tasks)")
    evaluate.add_argument("run", help="run name (under --root), or without --root the run's "
                          "folder")
    evaluate.add_argument("--root", default=None,
                          help=f"folder of runs, or an fsspec URL (default: {DEFAULT_RUNS_ROOT})")
    evaluate.add_argument("--checkpoint", type=checkpoint_choice,
                          help="checkpoint update (0: the start, the base model), latest or "
                          "all (all: with --tasks or --exploitability; default: latest)")
    evaluate.add_argument("--opponents", help="comma-separated actors (default: the run's)")
    evaluate.add_argument("--envs", help="comma-separated env ids (default: the run's)")
    evaluate.add_argument("--games", type=game_count, help="games per (env, opponent)")
    evaluate.add_argument("--legal-moves", choices=("free", "mask"),
                          help="play under this legal-move mode (default: each env as the "
                          "run evaluates it; free on a masked run: would it still play an "
                          "illegal move?)")
    exploit = evaluate.add_argument_group("exploitability (exact best responses; "
                                          "docs/exploitability.md)")
    exploit.add_argument("--exploitability", action="store_true",
                         help="measure what a best response wins against the checkpoint in "
                         "each seat, in the eval envs (or --envs) whose game has a solver, "
                         "played as evaluated (under the mask and free); measured again, a "
                         "checkpoint's rows are replaced")
    exploit.add_argument("--sampled", action="store_true",
                         help="also the policy as it trains (sampling.temperature): the whole "
                         "tree up to --cut, minutes to hours on a CPU")
    exploit.add_argument("--cut", type=float,
                         help="a sampled policy's lines less likely than this are cut and "
                         "bounded (default: eval.exploitability.cut)")
    bench = evaluate.add_argument_group("reasoning benchmarks (lm-evaluation-harness; "
                                        "docs/training.md)")
    bench.add_argument("--tasks", help="comma-separated harness tasks (gsm8k, minerva_math500, "
                       "mmlu_pro, ...): score these instead of playing games; scored again, "
                       "a checkpoint's rows are replaced")
    bench.add_argument("--limit", type=positive_int, help="examples per task (default: all)")
    bench.add_argument("--include-path", help="a folder of your own task YAML files")
    bench.add_argument("--format", choices=("auto", "chat", "plain"),
                       help="prompts through the chat template or as plain text (default "
                       "auto: as the run's games are prompted)")
    evaluate.set_defaults(func=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from ub.display import shown
    from ub.run.folder.layout import RunPaths, checkpoint_name
    from ub.run.folder.lock import RunLock, removed_if_refused
    from ub.run.processes.worker import process_worker
    from ub.run.steps.evaluate import evaluate_checkpoint
    from ub.run.steps.progress import baseline_cell, env_cell, eval_cell

    if args.tasks is not None:
        return _cmd_benchmarks(args)
    if args.exploitability:
        return _cmd_exploitability(args)
    given_exploit = [f"--{n}" for n in ("sampled", "cut") if getattr(args, n)]
    if given_exploit:
        raise UbError(f"{', '.join(given_exploit)} go with --exploitability")
    given = [f"--{name.replace('_', '-')}" for name in ("limit", "include_path", "format")
             if getattr(args, name) is not None]
    if given:
        raise UbError(f"{', '.join(given)} go with --tasks (reasoning benchmarks): add "
                      "--tasks, or leave them out to play games")
    if args.checkpoint == "all":
        raise UbError("--checkpoint all goes with --tasks or --exploitability: games evaluate "
                      "one checkpoint (a number, or latest)")
    paths = RunPaths.of(*named_run(args.run, args.root))
    # Everything that can be refused is refused before the lock and the engine (an eval that
    # starts writes a shard); a store run's working copy made for a refused one goes again.
    with removed_if_refused(paths):
        run, update, opponents, envs = _checked(args, paths)
    with RunLock(paths.lock):
        custom = (opponents is not None or envs is not None or args.games is not None
                  or args.legal_moves is not None)
        shard = None if custom else 0  # None: the stored ad-hoc shard of these games or a new one
        result = evaluate_checkpoint(run, update, opponents=opponents, envs=envs,
                                     games=args.games, shard=shard, worker=process_worker())
    table = Table(title=f"{args.run}: {checkpoint_name(update)}")
    for column in ("env", "opponent", "games", "win rate [95% CI]", "random in its seats",
                   "draws", "losses", "invalid moves", "format ok"):
        table.add_column(column)
    for row in result["rows"]:
        table.add_row(shown(env_cell(row)), shown(row["opponent"]), str(row["games"]),
                      eval_cell(row), baseline_cell(row), str(row["draws"]), str(row["losses"]),
                      f"{row['invalid_move_rate']:.1%}", f"{row['format_rate']:.1%}")
    Console(highlight=False).print(table)
    print(f"games: {result['shard']}" + (" (stored earlier)" if result["reused"] else ""))
    return 0


def _checked(args: argparse.Namespace, paths: RunPaths
             ) -> tuple[Run, int, list[str] | None, list[str] | None]:
    """The run, the checkpoint's update, the opponents and envs ``ub eval`` was asked for,
    each checked (the envs started with the seats the evaluation gives them)."""
    from ub.games.specs import check_env, check_legal_moves
    from ub.learner.checkpoint import read_adapter
    from ub.run.config.load import game_specs
    from ub.run.folder.store import catch_up
    from ub.run.steps.plan import pool_actor
    from ub.run.steps.rounds import Run, resolve_run_config

    catch_up(paths)
    config, _ = resolve_run_config(paths, None)
    if args.legal_moves is not None:  # (checked as a config is: mask needs the legal moves)
        from ub.run.config.load import validate_config

        data = config.model_dump(mode="json")
        data["eval"]["legal_moves"] = args.legal_moves
        config = validate_config(data, f"of {args.run} with --legal-moves {args.legal_moves}")
    [update] = _updates(args, paths)
    opponents = _names(args.opponents)
    envs = _names(args.envs)
    if args.games is not None and args.games % 2:
        raise UbError(f"--games must be even so both seats get the same number, got "
                      f"{args.games}")
    try:  # each started with the seats and the prompt format the evaluation gives it
        for spec in game_specs(config, envs) if envs else []:
            check_env(spec)
            check_legal_moves(spec)
    except (UbError, ValueError) as exc:  # (ValueError: no prompt format to take)
        raise UbError(f"--envs: {exc}") from None
    read_adapter(paths.checkpoint(update))  # safetensors that load, before vLLM meets them
    run = Run.of(paths, config)
    # Unknown names list the valid ones, before the engine starts.
    rivals = [pool_actor(run, name) for name in opponents or []]
    for env_id in envs or config.eval.env_ids or [e.env_id for e in config.envs]:
        for rival in rivals:
            rival.check_game(env_id)
    return run, update, opponents, envs


def _names(text: str | None) -> list[str] | None:
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UbError(f"expected a comma-separated list of names, got {text!r}")
    return names


def _updates(args: argparse.Namespace, paths: RunPaths) -> list[int]:
    """The checkpoints ``--checkpoint`` names (a number, latest, all), each there."""
    from ub.learner.checkpoint import latest_checkpoint
    from ub.run.folder.store import fetch_checkpoint
    from ub.run.folder.views import RunViews

    if args.checkpoint == "all":
        views = RunViews(paths.root)
        updates = views.checkpoints().column("update").to_pylist()
        for warning in views.warnings:  # (a checkpoint left out is said so)
            print(f"ub: warning: {warning}", file=sys.stderr)
        if not updates:
            raise UbError(f"run {args.run} has no checkpoint yet")
        return sorted(updates)
    if args.checkpoint in (None, "latest"):
        latest = latest_checkpoint(paths.root / "checkpoints")
        if latest is None:
            raise UbError(f"run {args.run} has no checkpoint yet")
        return [int(latest.name.rsplit("-", 1)[1])]
    update = int(args.checkpoint)
    fetch_checkpoint(paths, paths.checkpoint(update))
    if not paths.checkpoint(update).exists():
        raise UbError(f"run {args.run} has no checkpoint {update} "
                      f"({paths.checkpoint(update)}): give one it has (--checkpoint latest "
                      "or all, or `ub sql RUN \"SELECT * FROM checkpoints\"`)")
    return [update]


def _cmd_benchmarks(args: argparse.Namespace) -> int:
    """``ub eval RUN --tasks ...``: the checkpoints' benchmark rows, stored and printed."""
    from rich.console import Console
    from rich.table import Table

    from ub.benchmarks import BenchmarksSection
    from ub.display import shown
    from ub.learner.checkpoint import read_adapter
    from ub.run.folder.layout import RunPaths
    from ub.run.folder.lock import RunLock, removed_if_refused
    from ub.run.folder.store import catch_up
    from ub.run.processes.worker import process_worker
    from ub.run.steps.benchmarks import prepare_benchmarks, score_checkpoints
    from ub.run.steps.rounds import Run, resolve_run_config

    games = [f"--{n}" for n in ("opponents", "envs", "games") if getattr(args, n) is not None]
    if games:
        raise UbError(f"{', '.join(games)} set up games; --tasks scores benchmarks: give "
                      "one or the other")
    paths = RunPaths.of(*named_run(args.run, args.root))
    with removed_if_refused(paths):  # every refusal before the lock, the engine and a file
        catch_up(paths)
        config, _ = resolve_run_config(paths, None)
        updates = _updates(args, paths)
        section = BenchmarksSection.from_dict({
            "tasks": _names(args.tasks), "limit": args.limit,
            "include_path": args.include_path, "prompt_format": args.format or "auto"})
        for update in updates:
            read_adapter(paths.checkpoint(update))  # weights that load, before vLLM meets them
        run = Run.of(paths, config)
        prepared = prepare_benchmarks(run, section)
    with RunLock(paths.lock):
        result = score_checkpoints(run, updates, section, again=True, worker=process_worker(),
                                   prepared=prepared)
    table = Table(title=f"{args.run}: reasoning benchmarks"
                  + (f" (limit {args.limit})" if args.limit else ""))
    for column in ("checkpoint", "task", "metric", "value ± stderr", "n"):
        table.add_column(column)
    for row in result["rows"]:
        metric = row["metric"] + (f" ({row['filter']})" if row["filter"] else "")
        error = "" if row["stderr"] is None else f" ± {row['stderr']:.3f}"
        table.add_row(str(row["checkpoint"]), shown(row["task"]), shown(metric),
                      f"{row['value']:.3f}{error}", str(row["n"]))
    Console(highlight=False).print(table)
    print(f"scores: {paths.benchmarks} ({len(result['scored'])} scored in "
          f"{result['seconds']:.1f} s; `ub sql {paths.root} \"SELECT * FROM benchmarks\"`)")
    return 0


def _cmd_exploitability(args: argparse.Namespace) -> int:
    """``ub eval RUN --exploitability``: the checkpoints' best responses, stored and printed
    (no engine: the model scores every decision itself)."""
    from ub.learner.checkpoint import read_adapter
    from ub.run.config.load import check_exploitability
    from ub.run.folder.layout import RunPaths
    from ub.run.folder.lock import RunLock, removed_if_refused
    from ub.run.folder.store import catch_up
    from ub.run.steps.exploitability import measure_checkpoint, measurements
    from ub.run.steps.rounds import Run, resolve_run_config

    others = [f"--{n}" for n in ("opponents", "games", "legal_moves", "tasks")
              if getattr(args, n) is not None]
    if others:
        raise UbError(f"{', '.join(o.replace('_', '-') for o in others)} set up games; "
                      "--exploitability measures the checkpoint against every reply: give "
                      "one or the other")
    if args.cut is not None and not 0 <= args.cut <= 1:
        raise UbError(f"--cut must be in [0, 1], got {args.cut}")
    paths = RunPaths.of(*named_run(args.run, args.root))
    with removed_if_refused(paths):
        catch_up(paths)
        config, _ = resolve_run_config(paths, None)
        envs = _names(args.envs)
        try:
            check_exploitability(config, envs)
        except UbError as exc:
            raise UbError(f"--exploitability: {exc}") from None
        sampled = args.sampled or None  # (None: as the run's eval.exploitability.sampled)
        if args.cut is not None and all(m.mode.greedy for m in
                                        measurements(config, envs, sampled=sampled)):
            raise UbError(f"--cut applies only to --sampled (run {args.run} evaluates greedily, "
                          "and a greedy policy's tree is never cut): add --sampled, or leave "
                          "--cut out")
        updates = _updates(args, paths)
        for update in updates:
            read_adapter(paths.checkpoint(update))
        run = Run.of(paths, config)
    rows_hint = f"`ub sql {paths.root} \"SELECT * FROM exploitability\"`"
    with RunLock(paths.lock):
        rows = _measured_in_turn(
            updates, lambda update: measure_checkpoint(run, update, envs=envs, sampled=sampled,
                                                       cut=args.cut, again=True),
            run_name=args.run, rows_hint=rows_hint)
    _print_exploitability(args.run, rows)
    print(f"rows: {paths.exploitability} ({rows_hint})")
    return 0


def _measured_in_turn(updates: list[int], measure: Callable[[int], dict[str, Any]], *,
                      run_name: str, rows_hint: str) -> list[dict[str, Any]]:
    """The rows of each checkpoint (``measure(update)``: :func:`measure_checkpoint`'s
    result), measured in turn and printed as soon as each is: a run's every checkpoint takes
    minutes. On Ctrl-C the table of those finished is printed and the interrupt goes on,
    saying where their rows are (each checkpoint's files are written as it finishes)."""
    from ub.display import in_markup
    from ub.run.folder.layout import checkpoint_name
    from ub.run.steps.progress import exploitability_lines

    console = _wide_console()
    rows: list[dict[str, Any]] = []
    finished = 0
    try:
        for update in updates:
            result = measure(update)
            rows += result["rows"]
            finished += 1
            console.print(f"checkpoint {finished} of {len(updates)}: {checkpoint_name(update)} "
                          f"({result['seconds']:.1f} s)", soft_wrap=True)
            for text in exploitability_lines(result["rows"]):
                console.print(f"    {in_markup(text)}", soft_wrap=True)
    except KeyboardInterrupt:
        if rows:
            _print_exploitability(run_name, rows)
        raise KeyboardInterrupt(f"{finished} of {len(updates)} checkpoints measured"
                                + (f"; their rows are on disk: {rows_hint}" if finished
                                   else "")) from None
    return rows


def _print_exploitability(run_name: str, rows: list[dict[str, Any]]) -> None:
    """The table of measured rows, one a line."""
    from rich.table import Table

    from ub.display import shown
    from ub.run.steps.progress import nash_conv_cell

    table = Table(title=f"{run_name}: exploitability (what a best response wins in each seat; "
                  "NashConv is their sum, 0 at an equilibrium)")
    for column in ("ckpt", "env", "policy", "moves", "NashConv", "seat 0", "seat 1", "illegal",
                   "random", "s"):
        table.add_column(column)
    for r in rows:
        table.add_row(str(r["update"]), shown(r["env_id"]), shown(r["policy"]),
                      r["legal_moves"], nash_conv_cell(r), f"{r['best_response_seat0']:+.3f}",
                      f"{r['best_response_seat1']:+.3f}", f"{r['illegal']:.1%}",
                      f"{r['random_nash_conv']:.3f}", f"{r['seconds']:.1f}")
    _wide_console().print(table)


def _wide_console() -> Console:
    from rich.console import Console

    console = Console(highlight=False)
    if not console.is_terminal:  # (a pipe or a log: rich would wrap at 80 columns)
        console.width = max(console.width, 120)
    return console
