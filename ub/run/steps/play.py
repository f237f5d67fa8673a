"""Playing a round's games: the run's engine and sampling, and one shard of games played and
committed (training rollouts here; evaluation shards through :mod:`ub.run.steps.evaluate`)."""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ub.actors.base import Actor
from ub.data.shards import ShardId, is_committed, read_metadata, shard_path, write_shard
from ub.run.config.load import TrainConfig, game_specs
from ub.run.folder.layout import checkpoint_name, round_label
from ub.run.folder.store import fetch_checkpoint, fetch_round, publish
from ub.run.steps.plan import PlannedGame, behaviour_update, pool_actor
from ub.run.steps.rounds import Run
from ub.seeding import env_seed

if TYPE_CHECKING:
    from ub.inference.protocols import InferenceEngine
    from ub.inference.types import EngineConfig, SamplingConfig
    from ub.rollout.runner import BranchOptions
    from ub.run.processes.worker import Worker

ENGINE_REPLACEMENTS = 1
"""How many times one call replaces an engine that died under its shard and replays the shard
(beyond that the error is raised, and the task's retry or a resume takes over)."""

log_rollout = logging.getLogger("ub.rollout")
log_eval = logging.getLogger("ub.eval")


def run_engine_config(run: Run) -> EngineConfig:
    """The run's vLLM engine settings (its ``engine:`` section on its base model)."""
    from ub.inference.types import EngineConfig

    # Sleep mode's allocator only where the engine sleeps: an engine on a Ray worker or beside
    # a pipelined learner never does, and keeps its memory to itself.
    return EngineConfig.model_validate({
        **dict(run.config.engine), "model": run.model_folder(),
        "sleep_mode": run.config.engine_sleeps_during_updates, "seed": run.config.seed})


def run_engine(worker: Worker, run: Run, sampling: SamplingConfig) -> InferenceEngine:
    """The worker's vLLM engine for this run (started once, kept across rounds), sampling with
    ``sampling`` unless a request says otherwise. A new engine's KV cache is checked against
    what the run's games may ask of it (:func:`kv_cache_problem`): a warning says what to
    change."""
    from ub.vllm_environment import configure_vllm_environment

    configure_vllm_environment()
    handle = worker.engine(run_engine_config(run), sampling)
    if handle.engine not in _KV_CHECKED:
        _KV_CHECKED.add(handle.engine)
        sequences = min(run.config.engine.max_num_seqs, run.config.rollout.concurrency)
        problem = kv_cache_problem(handle.engine.kv_cache_tokens, sequences,
                                   run.config.sampling.max_tokens)
        if problem:
            log_rollout.warning("%s", problem)
    return handle


_KV_CHECKED: weakref.WeakSet[Any] = weakref.WeakSet()  # engines whose KV cache was checked


def kv_cache_problem(capacity: int | None, sequences: int, max_tokens: int) -> str | None:
    """Why an engine whose KV cache holds ``capacity`` tokens is short for ``sequences``
    concurrent completions of up to ``max_tokens`` tokens (their prompts come on top), or
    ``None``. Short, vLLM preempts sequences and recomputes them later: it still works, at a
    fraction of the speed."""
    demand = sequences * max_tokens
    if capacity is None or demand <= capacity:
        return None
    fits = max(1, capacity // max_tokens)
    return (f"the engine's KV cache holds {capacity:,} tokens, but {sequences} concurrent "
            f"completions (min of engine.max_num_seqs and rollout.concurrency) of up to "
            f"sampling.max_tokens {max_tokens} need {demand:,} before their prompts: vLLM will "
            f"preempt and recompute. Lower engine.max_num_seqs or rollout.concurrency to about "
            f"{fits}, raise engine.gpu_memory_utilization (engine.kv_cache_gib on the CPU), or "
            "lower sampling.max_tokens")


def rollout_sampling(config: TrainConfig, *, evaluation: bool = False) -> SamplingConfig:
    """How the run's model seats sample: ``sampling`` for training games; for evaluation the
    same budget and stop strings at ``eval.temperature`` (no top-p)."""
    if evaluation:
        return config.sampling.replace(temperature=config.eval.temperature, top_p=1.0)
    return config.sampling


# --------------------------------------------------------------------------------------------
# Steps
# --------------------------------------------------------------------------------------------


@dataclass
class ShardResult:
    """What a rollout or eval task returns: the shard's paths and a few counts."""

    games_path: str
    games: int
    decisions: int
    model_decisions: int
    generated_tokens: int
    seconds: float
    reused: bool
    invalid_moves: int = 0
    """Invalid moves among the model's decisions."""
    outcomes: dict[str, int] = field(default_factory=dict)
    copies: int = 0
    """Of ``games``, the copies made at branch points (ub.branching)."""


def eval_game_id_prefix(run_name: str, sid: ShardId) -> str:
    """Eval game ids ``RUN-eval-cNNNNNN-sNNNN-gNNNNNN``: never equal to a training game's id
    (``RUN-rNNNNNN-gNNNNNN``), so a join on ``game_id`` cannot mix the two."""
    return f"{run_name}-eval-c{sid.round:06d}-s{sid.shard:04d}"


def play_shard(worker: Worker, run: Run, root: Path, sid: ShardId, assignments: list, *,
                sampling: SamplingConfig, kind: str,
                metadata: dict[str, Any] | None = None,
                branching: BranchOptions | None = None) -> ShardResult:
    from ub.inference.watch import EngineDied
    from ub.progress_bar import progress_bar
    from ub.rollout import play_games

    games_path = shard_path(root, "games", sid)
    logger = log_eval if kind == "eval" else log_rollout
    if is_committed(root, sid):
        logger.info("%s shard %s/%s already committed: reused", kind, sid.round, sid.shard)
        meta = read_metadata(games_path)
        return ShardResult(str(games_path), pq.read_metadata(games_path).num_rows,
                           meta.get("decisions", 0), meta.get("model_decisions", 0),
                           meta.get("generated_tokens", 0), meta.get("seconds", 0.0), True,
                           meta.get("invalid_moves", 0), meta.get("outcomes", {}),
                           meta.get("copies", 0))
    for actor in sorted({a for g in assignments for a in g.actors}, key=lambda a: a.name):
        actor.check_ready()  # (an endpoint unreachable or keyless: said before any game)
    checkpoints = run.paths.root / "checkpoints"
    for adapter in sorted({a.adapter for g in assignments for a in g.actors if a.adapter}):
        if Path(adapter).parent == checkpoints:
            fetch_checkpoint(run.paths, Path(adapter))  # a worker without the run's files
    needs_engine = any(a.needs_engine for g in assignments for a in g.actors)
    # Eval games are paired: every checkpoint meets the same seeds (env, opponent, sampling).
    paired = {"seed_round": "eval", "game_id_prefix": eval_game_id_prefix(run.name, sid)}
    what = (f"eval ckpt {sid.round}" if kind == "eval" else round_label(sid.round)) + (
        f" shard {sid.shard}" if sid.shard else "")
    for attempt in range(1 + ENGINE_REPLACEMENTS):
        engine = run_engine(worker, run, sampling) if needs_engine else None
        logger.info("%s shard %s/%s: playing %d games", kind, sid.round, sid.shard,
                    len(assignments))
        try:
            with progress_bar(what, len(assignments), logger=logger) as progress:
                rollout = play_games(
                    assignments, engine=engine, run=run.name, round_=sid.round,
                    shard=sid.shard, base_seed=run.config.seed,
                    concurrency=run.config.rollout.concurrency, sampling=sampling,
                    progress=progress, **(paired if kind == "eval" else {}),
                    **(branching or {}))
            break
        except EngineDied as exc:
            # Nothing of the shard was written, and its games are a function of their seeds:
            # a new engine replays them all, the same games, none twice.
            if attempt == ENGINE_REPLACEMENTS:
                logger.error("%s shard %s/%s failed: %s", kind, sid.round, sid.shard, exc)
                raise
            # (run_engine's Worker.engine replaces the dead engine, as between rounds)
            logger.warning("%s shard %s/%s: %s; replaying its %d games on a new engine", kind,
                           sid.round, sid.shard, exc, len(assignments))
        except Exception:
            # Nothing of the shard was written; the task's retry (or a resume) replays it.
            logger.exception("%s shard %s/%s failed", kind, sid.round, sid.shard)
            raise
    st = rollout.stats
    model_rows = rollout.steps.filter(pc.equal(rollout.steps["actor_kind"], "model"))
    invalid = int(pc.sum(model_rows["invalid_move"].cast(pa.int64())).as_py() or 0)
    extra = {"kind": kind, "model": run.base_model, "copies": st.copies,
             "decisions": st.decisions,
             "model_decisions": st.model_decisions, "generated_tokens": st.generated_tokens,
             "seconds": st.seconds, "invalid_moves": invalid, "outcomes": st.outcomes,
             **(metadata or {})}
    publish(run.paths, *write_shard(root, sid, run.name, rollout.steps, rollout.games, extra))
    logger.info("%s shard %s/%s committed: %d games%s (%s), %d model decisions, %d invalid, "
                "%d tokens in %.1f s -> %s", kind, sid.round, sid.shard, st.games,
                f", {st.copies} of them branch copies" if st.copies else "", st.outcomes,
                st.model_decisions, invalid, st.generated_tokens, st.seconds, games_path)
    return ShardResult(str(games_path), st.games, st.decisions, st.model_decisions,
                       st.generated_tokens, st.seconds, False, invalid, dict(st.outcomes),
                       st.copies)


def rollout_shard(run: Run, round_: int, shard: int, games: list[PlannedGame],
                  shards: int | None = None, *, worker: Worker) -> ShardResult:
    """Play one shard of round ``round_`` (or return it if already committed) on ``worker``'s
    engine; ``shards``: how many the round is split into (default ``rollout.shards``), which
    the shard records (:func:`ub.run.steps.plan.round_shards`)."""
    from ub.rollout import GameAssignment

    specs = game_specs(run.config)
    actors: dict[str, Actor] = {}
    assignments = []
    for g in games:
        seated = tuple(actors.setdefault(n, pool_actor(run, n)) for n in g.actors)
        assignments.append(GameAssignment(specs[g.env], g.game_index,
                                          env_seed(run.config.seed, round_, g.game_index), seated))
    return play_shard(worker, run, run.paths.train_data, ShardId(round_, shard), assignments,
                       sampling=rollout_sampling(run.config), kind="train",
                       metadata={"shards": shards or run.config.rollout.shards},
                       branching=round_branching(run, round_))


def round_branching(run: Run, round_: int) -> BranchOptions:
    """The rollout's branching options for round ``round_`` (:class:`ub.rollout.RolloutRunner`'s
    ``branch``, ``learner`` and ``spread``); none when ``rollout.branch`` is off."""
    from ub.branching import SPREAD_ROUNDS, read_spread
    from ub.rollout.runner import BranchOptions

    branch = run.config.rollout.branch
    if not branch.on:
        return BranchOptions()
    spread: dict[str, dict[str, float]] = {}
    first = max(0, round_ - SPREAD_ROUNDS)
    if branch.select == "spread" and round_ > 0:
        for previous in range(first, round_):  # (a worker without the run's files)
            fetch_round(run.paths, run.paths.train_data, "steps", previous)
        spread = read_spread(run.paths.train_data, first, round_ - 1)
    return BranchOptions(branch=branch, spread=spread,
                         learner=checkpoint_name(behaviour_update(run.config, round_)))
