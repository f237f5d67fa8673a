"""The self-play training loop, as a Prefect flow.

Each round: the pool plans the games, rollout tasks play them into shards, the learner turns the
round's decisions into the next checkpoint, evaluation measures it against fixed opponents when
due, ratings absorb the round's games, and the round manifest commits it. Starting the flow again
on the same run continues after the last committed round.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

from prefect import flow

from flows.prefect_logs import ub_logs_to_prefect
from tasks import (
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
from ub.errors import UbError
from ub.run.cluster import rollout_worker
from ub.run.config import load_config
from ub.run.layout import RunPaths, remove_orphans
from ub.run.lock import RunLock
from ub.run.logs import run_logs
from ub.run.progress import Progress
from ub.run.rounds import Run, ShardResult, eval_due, open_run, resolve_base_model
from ub.run.store import publish, sync
from ub.run.tracking import finish_wandb, wandb_run_id

log = logging.getLogger("ub.flow")


@flow(name="selfplay", validate_parameters=True)
def selfplay(run_name: str, config: str | None = None, root: str = "runs",
             rounds: int | None = None, add_rounds: int | None = None,
             overrides: list[str] | None = None, quiet: bool = False,
             ray_address: str | None = None, keep_run_config: bool = False) -> dict[str, Any]:
    """Train run ``run_name`` under ``root`` until ``rounds`` rounds are committed.

    Starting the flow again on the same run continues after its last committed round.

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
    paths = RunPaths.of(root, run_name)
    new_config = load_config(config, overrides) if config is not None else None
    with (RunLock(paths.lock) as lock, GcClock() as gc_clock, run_logs(paths.logs),
          ub_logs_to_prefect()):
        try:
            return _train(paths, new_config, rounds, add_rounds, quiet, lock, gc_clock,
                          ray_address, keep_run_config)
        except Exception:
            log.exception("run %s failed", run_name)  # the traceback, for after the fact
            raise


def _train(paths: RunPaths, new_config: Any, rounds: int | None, add_rounds: int | None,
           quiet: bool, lock: RunLock, gc_clock: GcClock, ray_address: str | None,
           keep_run_config: bool = False) -> dict[str, Any]:
    """The rounds of one process: resume after the last committed round, run to the end."""
    fetched, published = sync(paths)  # a run in a store: this machine's copy catches up
    if fetched or published:
        log.info("run store %s: fetched %d file(s), published %d", paths.store, len(fetched),
                 len(published))
    if keep_run_config and new_config is not None and paths.config.exists():
        # (checked after the sync: a run in a store may exist only there)
        log.info("run %s exists: continuing it with its own config (%s); the given config "
                 "and overrides start a new run only", paths.name, paths.config)
        new_config = None
    train_config = open_run(paths, new_config, rounds=rounds, add_rounds=add_rounds,
                            ray_address=ray_address)
    wandb_run_id(paths)  # made once, at the run's start, and published with ub-run.json
    publish(paths, paths.config, paths.root / "ub-run.json")
    run = Run(paths, train_config, resolve_base_model(train_config))
    with cluster_tasks(run):
        return _rounds(run, quiet, lock, gc_clock)


def _rounds(run: Run, quiet: bool, lock: RunLock, gc_clock: GcClock) -> dict[str, Any]:
    paths, train_config = run.paths, run.config
    progress = Progress(run, quiet=quiet)
    if lock.recovered_from:
        progress.note(f"recovered the lock of a process that died "
                      f"(pid {lock.recovered_from.get('pid')})")
    removed = remove_orphans(paths.root)
    if removed:
        progress.note(f"removed {len(removed)} unfinished file(s) of an interrupted process")
    first = paths.next_round()
    progress.start(first)
    start_checkpoint(run)
    staleness = train_config.pipeline.max_staleness
    pending: dict[int, list[ShardResult]] = {}
    for round_ in range(first, train_config.rounds):
        started, gc_before = time.perf_counter(), gc_clock.seconds
        phases: dict[str, float] = {}  # wall time of each task call, for the breakdown
        evaluated: dict[int, dict[str, Any]] = {}
        if round_ == 0 and eval_due(train_config, 0):
            with timed(phases, "eval_task"):
                evaluated[0] = evaluate_now(run, 0)
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
        with timed(phases, "rate_task"):
            leaderboard = rate(run, round_, sorted(evaluated))
        phases["gc"] = gc_clock.seconds - gc_before
        manifest = round_manifest(run, shards, metrics, evaluated, leaderboard,
                                  time.perf_counter() - started, phases)
        with timed(phases, "track_task"):  # (the round's time, which track logs, ends here)
            track(run, round_, manifest)
        commit(run, round_, manifest)
        progress.round_done(round_, manifest)
    finish_wandb(run)
    report(run, max(0, train_config.rounds - first))
    return progress.finish()


def play_round(run: Run, round_: int) -> list[ShardResult]:
    """Plan the round and play its shards. On one machine the shards share the process's
    engine, so they run one after another; on a Ray cluster they run in parallel."""
    shards = plan(run, round_)
    if run.config.cluster.address is None:
        return [rollout(run, round_, i, games) for i, games in enumerate(shards)]
    futures = [rollout.submit(run, round_, i, games) for i, games in enumerate(shards)]
    return [future.result() for future in futures]


def evaluate_now(run: Run, update: int) -> dict[str, Any]:
    if run.config.cluster.address is None:
        return evaluate(run, update)
    return evaluate.submit(run, update).result()


@contextmanager
def cluster_tasks(run: Run) -> Iterator[None]:
    """With ``cluster.address`` set: the flow's submitted tasks go through prefect-ray's
    ``RayTaskRunner`` and the run's Ray workers start (see :mod:`ub.run.cluster`).

    The address is in the run's config, which the flow reads only once it runs, so the flow
    swaps its task runner here rather than at decoration. The tasks themselves ask Ray for no
    resources: they wait on the workers, which hold the CPUs and GPUs.
    """
    address = run.config.cluster.address
    if address is None:
        if run.config.cluster.learner_workers > 1:
            log.warning("cluster.learner_workers=%d applies on a Ray cluster only "
                        "(cluster.address or --ray); this run learns in one process",
                        run.config.cluster.learner_workers)
        yield
        return
    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext
    from prefect_ray import RayTaskRunner
    from prefect_ray.context import remote_options

    from ub.run.cluster import (
        alive_nodes,
        check_api_shared,
        check_reachable,
        connect_error,
        ray_init_kwargs,
        start_workers,
    )

    check_reachable(address)
    with get_client(sync_client=True) as client:
        api_url = str(client.api_url)  # also the temporary server's, which workers must share
    context = FlowRunContext.get()
    runner = RayTaskRunner(address=address, init_kwargs=ray_init_kwargs(api_url))
    try:
        runner.__enter__()
    except (ConnectionError, TimeoutError, RuntimeError) as exc:
        raise connect_error(address, exc) from None
    try:
        check_api_shared(api_url, alive_nodes())
    except UbError:
        runner.__exit__(None, None, None)
        raise
    previous, context.task_runner = context.task_runner, runner
    try:
        workers = start_workers(run)  # noqa: F841 (the flow owns them while it runs)
        with remote_options(num_cpus=0):
            yield
    finally:
        context.task_runner = previous
        runner.__exit__(None, None, None)


def round_manifest(run: Run, shards: list[ShardResult], metrics: dict[str, Any],
                   evaluated: dict[int, dict[str, Any]], leaderboard: list[dict[str, Any]],
                   seconds: float, phases: dict[str, float]) -> dict[str, Any]:
    """The round's record: what was played, learned, measured, and how long each part took."""
    # On a cluster each worker plays its shards in turn, side by side with the other workers:
    # the round waits for the busiest worker.
    per_worker: dict[int, float] = {}
    for index, shard in enumerate(shards):
        if not shard.reused:
            worker = rollout_worker(run, index) if run.config.cluster.address else 0
            per_worker[worker] = per_worker.get(worker, 0.0) + shard.seconds
    rollout_seconds = max(per_worker.values(), default=0.0)
    eval_seconds = sum(e["seconds"] for e in evaluated.values())
    learner_seconds = 0.0 if metrics.get("reused") else float(metrics.get("seconds", 0.0))
    batch = metrics.get("batch", {})
    return {
        # Relative to the run, so a moved or mounted run still reads.
        "shards": [os.path.relpath(s.games_path, run.paths.root) for s in shards],
        "games": sum(s.games for s in shards),
        "decisions": sum(s.decisions for s in shards),
        "model_decisions": sum(s.model_decisions for s in shards),
        "invalid_moves": sum(s.invalid_moves for s in shards),
        "generated_tokens": sum(s.generated_tokens for s in shards),
        "outcomes": _sum_counts(s.outcomes for s in shards),
        "learner": {k: metrics[k] for k in (
            "update", "loss", "grad_norm", "entropy_mean", "logprob_mean", "tokens",
            "tokens_per_second", "seconds", "clip_fraction", "ratio_mean", "reused",
            "assemble_seconds") if k in metrics},
        "batch": {k: batch[k] for k in ("size", "total_tokens", "truncated", "reward_mean",
                                        "advantage_std") if k in batch},
        "evals": {str(u): e["rows"] for u, e in evaluated.items()},
        "leaderboard": leaderboard[:20],
        "timings": close_timings({"rollout": rollout_seconds, "eval": eval_seconds,
                                  "learner": learner_seconds, "tasks": phases}, seconds),
    }


class GcClock:
    """Total time spent in Python's cyclic garbage collector while installed: in a process
    holding an engine and a model, a full collection walks millions of objects."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started

    def __enter__(self) -> GcClock:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


def close_timings(timings: dict[str, Any], seconds: float) -> dict[str, Any]:
    """Set the round's wall time and what it left for everything but engines and learner."""
    timings["round"] = seconds
    timings["other"] = max(0.0, seconds - timings["rollout"] - timings["eval"]
                           - timings["learner"])
    return timings


@contextmanager
def timed(phases: dict[str, float], name: str) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        phases[name] = phases.get(name, 0.0) + time.perf_counter() - started


def _sum_counts(items) -> dict[str, int]:
    out: dict[str, int] = {}
    for counts in items:
        for key, value in counts.items():
            out[key] = out.get(key, 0) + value
    return out
