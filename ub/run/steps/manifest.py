"""A round's manifest (``rounds/round-NNNNNN.json``): what was played, learned and measured, and
how long each part took; and the clocks that time a round."""

from __future__ import annotations

import gc
import hashlib
import inspect
import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from ub.components import import_path
from ub.run.config.load import TrainConfig
from ub.run.folder.layout import RunPaths, read_json, round_label
from ub.run.folder.views import LEARNER_METRICS
from ub.run.processes.cluster import rollout_worker
from ub.run.steps.play import ShardResult
from ub.run.steps.rounds import Run


def round_manifest(run: Run, shards: list[ShardResult], metrics: dict[str, Any],
                   evaluated: dict[int, dict[str, Any]], leaderboard: list[dict[str, Any]],
                   seconds: float, phases: dict[str, float],
                   benchmarks: dict[int, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The round's record: what was played, learned, measured, and how long each part took
    (``benchmarks``: :func:`ub.run.steps.benchmarks.score_round_benchmarks` by checkpoint)."""
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
        "copies": sum(s.copies for s in shards),  # (of the games: made at branch points)
        "decisions": sum(s.decisions for s in shards),
        "model_decisions": sum(s.model_decisions for s in shards),
        "invalid_moves": sum(s.invalid_moves for s in shards),
        "generated_tokens": sum(s.generated_tokens for s in shards),
        "outcomes": sum_counts(s.outcomes for s in shards),
        # The learner's own figures and every statistic its algorithm reported.
        "learner": {k: metrics[k] for k in (*LEARNER_METRICS.names,
                                            *metrics.get("algorithm_statistics", ()),
                                            "reused", "assemble_seconds") if k in metrics},
        "batch": {k: batch[k] for k in ("size", "total_tokens", "truncated", "reward_mean",
                                        "advantage_std") if k in batch},
        "evals": {str(u): e["rows"] for u, e in evaluated.items()},
        "exploitability": {str(u): e["exploitability"] for u, e in evaluated.items()
                           if e.get("exploitability")},
        "benchmarks": {str(u): b["rows"] for u, b in (benchmarks or {}).items()},
        "leaderboard": leaderboard[:20],
        "timings": close_timings({"rollout": rollout_seconds, "eval": eval_seconds,
                                  "benchmarks": sum(b["seconds"] for b in
                                                    (benchmarks or {}).values()),
                                  "learner": learner_seconds, "tasks": phases}, seconds),
        "execution": _execution(run, len(shards)),
        "components": components(run.config),
    }


def components(config: TrainConfig) -> dict[str, Any]:
    """The classes the round's learner and batch ran, by import path, whether built in or named
    by one in the config (``learner.algorithm``, the ``batch:`` stages); the position
    functions of one's own that keyed a game's decisions (``envs.position``, by env id), the
    rules of one's own games (``envs.rules``, by env id) and the actors of one's own that sat
    in its games or evaluations (``actors``, by name); and under ``sources`` the sha256 of
    each module outside ub that holds one, so that a reader sees which code of one's own
    trained each round."""
    from ub.actors.spec import parse_actor
    from ub.games.positions import position_function
    from ub.games.registry import load_rules
    from ub.learner.algorithms import algorithm_class
    from ub.rewards import STAGES

    algorithm = algorithm_class(config.learner.algorithm)
    transforms = config.batch.transforms
    by_stage = {stage: [type(t) for t in getattr(transforms, stage)] for stage in STAGES}
    positions = {env.env_id: env.position for env in config.envs if env.position}
    rules = {env.env_id: env.rules for env in config.envs if env.rules}
    actors = {name: type(parse_actor(name)) for name in
              dict.fromkeys([*config.opponents.fixed_names(), *config.eval.opponents])}
    own_actors = sorted(name for name, cls in actors.items() if not _in_ub(cls))
    ran: list[Any] = [algorithm, *(cls for classes in by_stage.values() for cls in classes),
                      *(position_function(env_id, path) for env_id, path in positions.items()),
                      *(type(load_rules(path)) for path in rules.values()),
                      *(actors[name] for name in own_actors)]
    own = sorted({code for code in ran if not _in_ub(code)}, key=import_path)
    recorded: dict[str, Any] = {
        "learner.algorithm": import_path(algorithm),
        **{f"batch.{stage}": [import_path(c) for c in classes]
           for stage, classes in by_stage.items()}}
    if positions:
        recorded["envs.position"] = positions
    if rules:
        recorded["envs.rules"] = rules
    if own_actors:
        recorded["actors"] = own_actors
    return {**recorded, "sources": {code.__module__: _source_sha256(code) for code in own}}


def _in_ub(code: Any) -> bool:
    return code.__module__.partition(".")[0] == "ub"


def changed_sources(paths: RunPaths, config: TrainConfig) -> list[str]:
    """A line for each module of one's own (holding a component named by import path) whose
    file differs from the sha256 the run's last committed round recorded. The config keeps only
    the import path, so a resumed run trains on with the code as it is now; its log says so."""
    committed = paths.committed_rounds()
    if not committed:
        return []
    last = committed[-1]
    recorded = read_json(paths.manifest(last)).get("components", {}).get("sources", {})
    now = components(config)["sources"]
    return [f"{module} changed since {round_label(last)} recorded it (sha256 {old[:12]}, now "
            f"{now[module][:12]}): the rounds from here train with the code as it is now"
            for module, old in sorted(recorded.items())
            if old and now.get(module) and now[module] != old]


def _source_sha256(code: Any) -> str | None:
    """The sha256 of the file that defines ``code``, a class or function (``None``: it has no
    file, e.g. ``__main__`` of an interactive session)."""
    try:
        path = inspect.getsourcefile(code)
    except TypeError:
        return None
    if path is None:
        return None
    with open(path, "rb") as source:
        return hashlib.sha256(source.read()).hexdigest()


def _execution(run: Run, shards: int) -> dict[str, Any]:
    """How the round's work was executed (the settings that may change on resume), with the
    shards it was split into (a round a process left unfinished keeps its own:
    :func:`ub.run.steps.plan.round_shards`)."""
    record = run.config.execution_settings()
    record["rollout"] = {**record["rollout"], "shards": shards}
    return record


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
                           - timings.get("benchmarks", 0.0) - timings["learner"])
    return timings


@contextmanager
def timed(phases: dict[str, float], name: str) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        phases[name] = phases.get(name, 0.0) + time.perf_counter() - started


def sum_counts(items: Iterable[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for counts in items:
        for key, value in counts.items():
            out[key] = out.get(key, 0) + value
    return out
