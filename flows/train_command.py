"""``ub train``: refuse in a second what would fail, then run the
:func:`~ub.flows.selfplay.selfplay` flow on a Prefect server tied to this process.

It is the one command that runs a flow, so it lives with the flows; :mod:`ub.flows.cli` adds it to
the library's commands (:mod:`ub.cli`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ub.cli.args import named_run, round_number
from ub.display import counted
from ub.errors import UbError
from ub.run.checks.gpu_plan import (
    DEFAULT_GPU_GIB,
    cannot_fit,
    describe,
    plan_gpus,
    plan_model_config,
    shape_line,
    this_machines_gpu,
)
from ub.run.folder.urls import DEFAULT_RUNS_ROOT

if TYPE_CHECKING:
    from ub.run.checks.preflight import RunRequest


def add_parser(sub) -> None:
    train = sub.add_parser("train", help="train by self-play: a resumable Prefect run")
    train.add_argument("config", nargs="?", help="a preset (tiny-cpu, qwen3-1.7b-simpletak, "
                       "spiral-kuhn) or a YAML file (default: tiny-cpu, or the run's own)")
    train.add_argument("--run", help="run name (default: the config's name)")
    train.add_argument("--resume", metavar="NAME", help="continue run NAME (under --root, or "
                       "without --root the run's folder) with its own config")
    train.add_argument("--root", default=None, help="folder of runs, or an fsspec "
                       "URL such as s3://bucket/runs (docs/scaling.md; default: "
                       f"{DEFAULT_RUNS_ROOT})")
    train.add_argument("--rounds", type=round_number(1),
                       help="total rounds (extends a finished run)")
    train.add_argument("--ray", metavar="ADDRESS",
                       help="run rollouts and the learner on this Ray cluster (auto, HOST:PORT, "
                       "ray://HOST:10001; 'local': in this process); overrides cluster.address")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a setting, e.g. --set rollout.games_per_round=64")
    train.add_argument("--quiet", action="store_true", help="no progress output")
    train.add_argument("--dry-run", action="store_true",
                       help="print the run it would start and its GPU memory plan (engine "
                       "weights and KV cache, learner budget and micro-batch, from the base "
                       "model's config.json alone), write nothing; exit 2 if it cannot fit")
    train.add_argument("--gpu-memory", type=float, metavar="GIB",
                       help="with --dry-run: plan for GPUs of GIB GiB (default: this machine's "
                       f"GPU, or {DEFAULT_GPU_GIB:g} GiB without one)")
    train.set_defaults(func=cmd_train)


def cmd_train(args: argparse.Namespace) -> int:
    from ub.flows.server_watch import grace_seconds, require_server
    from ub.run.checks.preflight import preflight
    from ub.run.config.load import config_run_name
    from ub.run.folder.layout import RunPaths

    if args.resume and args.config:
        raise UbError("give a CONFIG to start (or continue) a run, or --resume NAME to continue "
                      "one with its own config, not both")
    if args.resume:  # (a name or, without --root, the run's folder: as every command takes it)
        args.root, args.resume = named_run(args.resume, args.root)
    elif args.root is None:
        args.root = DEFAULT_RUNS_ROOT
    name = args.resume or args.run or config_run_name(args.config or "tiny-cpu")
    if args.gpu_memory is not None and not args.dry_run:
        raise UbError("--gpu-memory plans a run's memory: it goes with --dry-run")
    if args.dry_run:
        return _dry_run(args, RunPaths.of(args.root, name))
    # Everything that can be refused is refused here, in a second, before Prefect starts.
    grace_seconds()  # a UB_PREFECT_GRACE_S that is not a number of seconds
    require_server()  # a PREFECT_API_URL that nothing answers at
    start = preflight(_request(args, name))

    start_prefect((start.paths.root.parent if start.paths.store else Path(args.root))
                  / ".prefect")
    from ub.flows.selfplay import committed_so_far, preflighted, selfplay

    def train() -> None:
        with preflighted(start):  # the flow takes this preflight's config: resolved once
            selfplay(run_name=name, config=args.config, root=str(args.root),
                     rounds=args.rounds, overrides=list(args.set), quiet=args.quiet,
                     ray_address=args.ray)

    if not stopped_by_a_signal(train):
        return 0
    # How to go on (ub.cli.parser prints it, exit 130).
    raise KeyboardInterrupt(f"{committed_so_far(start.paths)}: {start.paths.resume_command}")


def start_prefect(home: Path) -> None:
    """Prefect's settings for a command's flows, with ``home`` its folder (``RUNS/.prefect``),
    and a temporary server of ub's own unless ``PREFECT_API_URL`` names one (it dies with this
    process, even by SIGKILL). Prefect is imported after this."""
    from ub.flows.prefect_env import configure_prefect, start_tied_server

    configure_prefect(home)
    start_tied_server()


def stopped_by_a_signal(body: Callable[[], object]) -> bool:
    """``body()`` with Ctrl-C and SIGTERM as one interrupt (its flow runs told how they ended):
    whether a stop ended it. Any other failure is raised."""
    from ub.flows.stopping import stop_on_signals, stopped

    with stop_on_signals():
        try:
            body()
        except BaseException as error:
            if not stopped(error):
                raise
            return True
        return stopped()


def _request(args: argparse.Namespace, name: str) -> RunRequest:
    """The run ``ub train`` asks for: CONFIG starts it (or must match it), ``--resume`` takes
    its own config, and neither takes its own or, for a new run, tiny-cpu's."""
    from ub.run.checks.preflight import RunRequest

    return RunRequest(name, str(args.root), config=args.config, overrides=tuple(args.set),
                      rounds=args.rounds, ray_address=args.ray,
                      new_run_config=None if args.resume else "tiny-cpu")


def _dry_run(args: argparse.Namespace, paths) -> int:
    """``ub train ... --dry-run``: the run it would start and its GPU plan; writes nothing
    (no catch-up of a store run, no lock, no Prefect), and exits 2 when the plan cannot fit."""
    from ub.run.checks.preflight import requested_config
    from ub.run.steps.rounds import resolve_run_config

    config = requested_config(paths, _request(args, paths.name))[0]
    resolved = resolve_run_config(paths, config, rounds=args.rounds, ray_address=args.ray)[0]
    state = (f"exists, {len(paths.committed_rounds())} of {counted(resolved.rounds, 'round')} "
             "committed" if paths.config.exists() else f"new, {counted(resolved.rounds, 'round')}")
    print(f"run {paths.name} at {paths.store or paths.root} ({state}); --dry-run: nothing "
          "written")
    base = resolved.model.base
    model_config = plan_model_config(resolved)
    if model_config is None or "num_hidden_layers" not in model_config:
        raise UbError(f"model.base {base}: no config.json on this machine (a hub id is read "
                      f"from the Hugging Face cache only): fetch it first (`hf "
                      f"download {base} config.json`) or give a local model folder")
    gpu_gib, found = _gpu_gib(args.gpu_memory)
    plan = plan_gpus(resolved, model_config, gpu_gib, f"model.base {base}'s config.json")
    print(f"model {base}: {shape_line(model_config)}")
    print(f"GPUs of {gpu_gib:g} GiB ({found})")
    for line in describe(plan):
        print(line)
    for problem in plan.problems:
        print(f"cannot fit: {problem}")
    refusal = cannot_fit(plan, "above")
    if refusal is not None:
        raise refusal
    return 0


def _gpu_gib(asked: float | None) -> tuple[float, str]:
    """The GPU memory to plan for, and where the figure comes from."""

    if asked is not None:
        return asked, "--gpu-memory"
    gpu = this_machines_gpu()
    if gpu is not None:
        return gpu[0], f"this machine's {gpu[1]}"
    return DEFAULT_GPU_GIB, "no GPU here: --gpu-memory GIB plans for another"
