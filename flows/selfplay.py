"""The self-play training loop, as a Prefect flow.

Each round: the pool plans the games, rollout tasks play them into shards, the learner turns the
round's decisions into the next checkpoint, evaluation measures it against fixed opponents when
due, ratings absorb the round's games, and the round manifest commits it. Starting the flow again
on the same run continues after the last committed round.

On a Ray cluster the same tasks run through prefect-ray (:mod:`ub.flows.ray_runner`); the steps
themselves are the library's (:mod:`ub.run.steps.rounds` names their modules; through :mod:`tasks`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from typing import Any

from prefect import flow

from ub.flows.flow_runs import crash_dead_holders_flow_run, lock_owner
from ub.flows.prefect_env import current_api_url
from ub.flows.prefect_logs import ub_logs_to_prefect
from ub.flows.ray_runner import cluster_tasks
from ub.flows.server_watch import ServerWatch, grace_seconds, stop_process
from ub.flows.stopping import stopped
from ub.run.checks.preflight import RunRequest, RunStart, preflight
from ub.run.folder.layout import RunPaths, remove_orphans
from ub.run.folder.lock import RunLock
from ub.run.folder.logs import run_logs
from ub.run.folder.store import publish, sync
from ub.run.folder.urls import DEFAULT_RUNS_ROOT
from ub.run.steps.benchmarks import round_benchmarks_due
from ub.run.steps.evaluate import eval_due
from ub.run.steps.manifest import GcClock, round_manifest, timed
from ub.run.steps.play import ShardResult
from ub.run.steps.progress import Progress
from ub.run.steps.rounds import Run, save_run_config
from ub.run.steps.tracking import finish_wandb, wandb_run_id
from ub.tasks import (
    benchmarks,
    commit,
    evaluate,
    learn,
    plan,
    rate,
    report,
    rollout,
    start_checkpoint,
    track,
)

log = logging.getLogger("ub.flow")


_PREFLIGHTED: ContextVar[RunStart | None] = ContextVar("ub_preflighted_run", default=None)


@contextmanager
def preflighted(start: RunStart) -> Iterator[None]:
    """In this block the ``selfplay`` flow of ``start``'s run takes ``start`` as its preflight
    (``ub train``'s, made before Prefect started) instead of making its own, so the run's
    config is resolved once. It stays in this process: a flow's parameters are what a
    deployment can give, JSON, and the deployment's own runs make their preflight."""
    token = _PREFLIGHTED.set(start)
    try:
        yield
    finally:
        _PREFLIGHTED.reset(token)


def _handed_over(paths: RunPaths) -> RunStart | None:
    """The preflight ``ub train`` handed over for this run (:func:`preflighted`), if any.

    (The flow's body reaches the context variable only through this function: prefect-ray
    pickles the flow's function by value, with the globals it names, for its Ray tasks, and a
    ``ContextVar`` does not pickle.)"""
    start = _PREFLIGHTED.get()
    return start if start is not None and start.paths == paths else None


@flow(name="selfplay", flow_run_name="{run_name}", validate_parameters=True)
def selfplay(run_name: str, config: str | None = None, root: str = DEFAULT_RUNS_ROOT,
             rounds: int | None = None, add_rounds: int | None = None,
             overrides: list[str] | None = None, quiet: bool = False,
             ray_address: str | None = None, keep_run_config: bool = False) -> dict[str, Any]:
    """Train run ``run_name`` under ``root`` until ``rounds`` rounds are committed.

    Starting the flow again on the same run continues after its last committed round. Its
    preflight (:func:`ub.run.checks.preflight.preflight`, ``ub train``'s own) first refuses, with
    one line and before the run writes a file, whatever would make the run fail.

    Args:
        run_name: The run's name: its folder under ``root``.
        config: A preset name (``tiny-cpu``) or a YAML path that starts the run. Empty: resume
            the run with its own config (``RUN/config.yaml``).
        root: The runs folder, or an fsspec URL (``s3://bucket/runs``): a run in a store works
            in a local copy and publishes each round to the store as it commits.
        rounds: The total number of rounds (more extends a finished run). Empty: the config's.
        add_rounds: Rounds to add to those committed (a nightly deployment's "continue").
        overrides: ``key.sub=value`` settings applied over ``config`` (a new run's settings).
        quiet: No progress lines on stdout (Prefect's run logs still record the run).
        ray_address: Run on this Ray cluster (sets ``cluster.address``; ``local``: in this
            process), e.g. to resume a run elsewhere than it started.
        keep_run_config: If the run exists, continue it with its own config and ignore
            ``config`` and ``overrides``, which then only start the run the first time (the
            nightly deployment's setting: a run started with overrides stays resumable).

    Returns:
        Where the run lives and its last evaluation.
    """
    # A deployment or a schedule makes its preflight here, before the run writes a file.
    handed_over = _handed_over(RunPaths.of(root, run_name))
    start = handed_over or preflight(RunRequest(
        run_name, root, config, tuple(overrides or ()), rounds=rounds, add_rounds=add_rounds,
        ray_address=ray_address, keep_run_config=keep_run_config))
    paths = start.paths
    with (RunLock(paths.lock, owner=lock_owner()) as lock, GcClock() as gc_clock,
          run_logs(paths.logs), ub_logs_to_prefect(),
          _watching_the_server(paths, handed_over is not None)):
        try:
            return _train(start, quiet, lock, gc_clock)
        except Exception as error:
            if stopped(error):  # Ctrl-C met in Prefect's machinery, which made it another error
                raise KeyboardInterrupt from None
            log.exception("run %s failed", run_name)  # the traceback, for after the fact
            raise


def _watching_the_server(paths: RunPaths, by_ub_train: bool) -> AbstractContextManager[object]:
    """Watch the Prefect server this flow reports to: a silence beyond the grace ends the
    process with one line that says how to resume (:mod:`ub.flows.server_watch`). Only in a
    process of the run's own, ``ub train``'s or a deployment run's: a script (or a test)
    that calls the flow keeps its process."""
    from prefect.runtime import deployment

    api_url = current_api_url()
    if api_url is None or not (by_ub_train or deployment.id):
        return nullcontext()
    own = "PREFECT_API_URL" not in os.environ  # the temporary server ub started

    def lost(silent_s: float, problem: str, stderr: int) -> None:
        again = ("`ub train` starts a new temporary server" if own else
                 "once the server answers again, or with PREFECT_API_URL unset for a "
                 "temporary server of ub's own")
        stop_process(f"the Prefect server at {api_url} has not answered for {silent_s:.0f} s "
                     f"({problem}): the run stopped ({committed_so_far(paths)}); {again}: "
                     f"{paths.resume_command}",
                     stderr)

    return ServerWatch(api_url, grace_seconds(), lost)


def _train(start: RunStart, quiet: bool, lock: RunLock, gc_clock: GcClock) -> dict[str, Any]:
    """The rounds of one process: resume after the last committed round, run to the end."""
    paths = start.paths
    fetched, published = sync(paths)  # a store run: what came since the preflight, locked now
    if fetched or published:
        log.info("run store %s: fetched %d file(s), published %d", paths.store, len(fetched),
                 len(published))
    for note in start.notes:
        log.info("%s", note)
    train_config = save_run_config(paths, start.config, start.config_changed)
    wandb_run_id(paths)  # made once, at the run's start, and published with ub-run.json
    publish(paths, paths.config, paths.root / "ub-run.json")
    run = Run.of(paths, train_config)
    with cluster_tasks(run):
        return _rounds(run, quiet, lock, gc_clock, start.settings)


def committed_so_far(paths: RunPaths) -> str:
    """What a stopped run keeps, for the line that says how to resume it."""
    committed = len(paths.committed_rounds())
    kept = {0: "no round is committed", 1: "round 1 is committed"}.get(
        committed, f"rounds 1-{committed} are committed")
    return f"{kept}; the round in progress is played again on resume"


def _rounds(run: Run, quiet: bool, lock: RunLock, gc_clock: GcClock,
            settings: tuple[str, ...] = ()) -> dict[str, Any]:
    """From the first uncommitted round to the last: play, learn, evaluate when due, rate,
    track, commit (the manifest, :func:`ub.run.steps.manifest.round_manifest`, written last)."""
    paths, train_config = run.paths, run.config
    progress = Progress(run, quiet=quiet)
    if lock.recovered_from:
        progress.note(f"recovered the lock of a process that died "
                      f"(pid {lock.recovered_from.get('pid')})")
        crashed = crash_dead_holders_flow_run(lock.recovered_from)
        if crashed:
            progress.note(crashed)
    removed = remove_orphans(paths.root)
    if removed:
        progress.note(f"removed {len(removed)} unfinished file(s) of an interrupted process")
    first = paths.next_round()
    progress.start(first, settings)
    start_checkpoint(run)
    staleness = train_config.pipeline.max_staleness
    pending: dict[int, list[ShardResult]] = {}
    for round_ in range(first, train_config.rounds):
        started, gc_before = time.perf_counter(), gc_clock.seconds
        phases: dict[str, float] = {}  # wall time of each task call, for the breakdown
        evaluated: dict[int, dict[str, Any]] = {}
        scored: dict[int, dict[str, Any]] = {}  # the reasoning benchmarks, when due
        if round_ == 0 and eval_due(train_config, 0):
            with timed(phases, "eval_task"):
                evaluated[0] = evaluate_now(run, 0)
        if round_ == 0 and round_benchmarks_due(run, 0):
            with timed(phases, "benchmarks_task"):
                scored[0] = benchmarks_now(run, 0)
        with timed(phases, "rollout_tasks"):
            shards = pending.pop(round_, None) or play_round(run, round_)
        with timed(phases, "learn_task"):
            learning: Future = learn.submit(run, round_)
            if staleness and round_ + 1 < train_config.rounds:
                # Pipelined: the next round plays checkpoint r while the learner makes r+1.
                pending[round_ + 1] = play_round(run, round_ + 1)
            metrics = learning.result()
        if eval_due(train_config, round_ + 1):
            with timed(phases, "eval_task"):
                evaluated[round_ + 1] = evaluate_now(run, round_ + 1)
        if round_benchmarks_due(run, round_ + 1):
            with timed(phases, "benchmarks_task"):
                scored[round_ + 1] = benchmarks_now(run, round_ + 1)
        with timed(phases, "rate_task"):
            leaderboard = rate(run, round_, sorted(evaluated))
        phases["gc"] = gc_clock.seconds - gc_before
        manifest = round_manifest(run, shards, metrics, evaluated, leaderboard,
                                  time.perf_counter() - started, phases, benchmarks=scored)
        with timed(phases, "track_task"):  # (the round's time, which track logs, ends here)
            track(run, round_, manifest)
        commit(run, round_, manifest)
        progress.round_done(round_, manifest)
    report(run, max(0, train_config.rounds - first))  # (its figures go to W&B: before finish)
    finish_wandb(run)
    return progress.finish()


def play_round(run: Run, round_: int) -> list[ShardResult]:
    """Plan the round and play its shards. On one machine the shards share the process's
    engine, so they run one after another; on a Ray cluster they run in parallel."""
    shards = plan(run, round_)
    if run.config.cluster.address is None:
        return [rollout(run, round_, i, games, len(shards)) for i, games in enumerate(shards)]
    futures = [rollout.submit(run, round_, i, games, len(shards))
               for i, games in enumerate(shards)]
    return [future.result() for future in futures]


def evaluate_now(run: Run, update: int) -> dict[str, Any]:
    """Evaluate checkpoint ``update`` (on a Ray cluster: on a worker) and wait for it."""
    if run.config.cluster.address is None:
        return evaluate(run, update)
    return evaluate.submit(run, update).result()


def benchmarks_now(run: Run, update: int) -> dict[str, Any]:
    """Score checkpoint ``update`` on the run's reasoning benchmarks (on a Ray cluster: on a
    worker) and wait for it."""
    if run.config.cluster.address is None:
        return benchmarks(run, update)
    return benchmarks.submit(run, update).result()
