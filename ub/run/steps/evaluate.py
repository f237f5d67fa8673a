"""Evaluating a run's checkpoints against fixed opponents: when it is due, and the games."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from ub.data.shards import ShardId, committed_shards, next_free_shard, shard_path
from ub.run.config.load import TrainConfig, game_specs
from ub.run.folder.layout import checkpoint_name
from ub.run.steps.plan import pool_actor
from ub.run.steps.play import play_shard, rollout_sampling
from ub.run.steps.rounds import Run
from ub.seeding import derive_seed

if TYPE_CHECKING:
    from pathlib import Path

    from ub.rollout import GameAssignment
    from ub.run.processes.worker import Worker

log_eval = logging.getLogger("ub.eval")


def eval_due(config: TrainConfig, update: int) -> bool:
    """Checkpoints evaluated: the start (0), every ``eval.every`` updates, and the last."""
    every = config.eval.every
    return every > 0 and (update == 0 or update % every == 0 or update == config.rounds)


def evaluate_checkpoint(run: Run, update: int, *, opponents: list[str] | None = None,
                        envs: list[str] | None = None, games: int | None = None,
                        shard: int | None = 0, worker: Worker) -> dict[str, Any]:
    """Checkpoint ``update`` vs each opponent on each env, seats balanced: ``{"rows": [per
    (env, opponent) results with Wilson intervals], "seconds": play time, "reused": bool,
    "shard": path}``.

    Shard 0 of eval round ``update`` is the run's own evaluation (the ``eval`` settings; rated,
    and reused if it exists), with the checkpoint's exploitability where
    ``eval.exploitability`` asks (``"exploitability"``: its rows,
    :mod:`ub.run.steps.exploitability`); ad-hoc evaluations (``ub eval`` with other
    opponents, envs or game counts: ``shard=None``) go to later shards of the same round and
    are not rated. An
    ad-hoc evaluation asked for again reads the shard that played the same games (it would
    replay them move for move, and a second copy would count every game twice in a query).

    The games run on ``worker``'s engine.
    """
    from ub.evaluation import eval_assignments, random_baseline, summarize, with_baseline

    config = run.config
    actor = pool_actor(run, checkpoint_name(update))
    rivals = [pool_actor(run, n) for n in (opponents or config.eval.opponents)]
    # (as evaluated: eval.legal_moves applies to the training envs too)
    specs = game_specs(config, envs or config.eval.envs or [e.env_id for e in config.envs])
    assignments = eval_assignments(actor, rivals, specs, games or config.eval.games,
                                   derive_seed(config.seed, "eval"))
    sampling = rollout_sampling(config, evaluation=True)
    if shard is None:
        shard = stored_eval_shard(run.paths.eval_data, update, assignments)
        shard = shard if shard is not None else next_free_shard(run.paths.eval_data, update,
                                                                start=1).shard
    sid = ShardId(update, shard)
    played = play_shard(worker, run, run.paths.eval_data, sid, assignments, sampling=sampling,
                         kind="eval")
    games_table = pq.read_table(shard_path(run.paths.eval_data, "games", sid))
    steps = read_columns(shard_path(run.paths.eval_data, "steps", sid), SUMMARY_COLUMNS)
    summary = summarize(games_table, steps, actor.name)
    if all(r.plays_offline for r in rivals):  # the bar to clear: random on the same seeds
        baseline = random_baseline(assignments, actor.name, config.seed)
        summary = with_baseline(summary, baseline)
    rows = [row.to_dict() for row in summary]
    for row in rows:
        log_eval.info("%s vs %s on %s: %d games, win %.3f [%.3f, %.3f], invalid %.3f "
                      "(random in its seats: %s)", actor.name, row["opponent"], row["env_id"],
                      row["games"], row["win_rate"], row["win_low"], row["win_high"],
                      row["invalid_move_rate"], "n/a" if row["baseline_win_rate"] is None
                      else f"{row['baseline_win_rate']:.3f}")
    result = {"rows": rows, "seconds": 0.0 if played.reused else played.seconds,
              "reused": played.reused, "shard": played.games_path}
    if shard == 0 and config.eval.exploitability.enabled:  # (the run's own evaluation)
        from ub.run.steps.exploitability import measure_checkpoint

        measured = measure_checkpoint(run, update)
        result["exploitability"] = measured["rows"]
        result["seconds"] += measured["seconds"]
    return result


def stored_eval_shard(root: Path, update: int, assignments: list[GameAssignment]) -> int | None:
    """The committed ad-hoc evaluation shard (>= 1) of checkpoint ``update`` whose games are
    exactly ``assignments`` (the same envs, seeds and seating) played under the same
    legal-move modes, or None."""
    wanted = sorted((a.game_index, a.spec.env_id, a.seed, [x.name for x in a.actors])
                    for a in assignments)
    modes = {a.spec.legal_moves for a in assignments if any(x.needs_engine for x in a.actors)}
    for sid in committed_shards(root):
        if sid.round != update or sid.shard < 1:
            continue
        games = pq.read_table(shard_path(root, "games", sid),
                              columns=["game_index", "env_id", "seed", "actors"]).to_pylist()
        if sorted((g["game_index"], g["env_id"], g["seed"], g["actors"]) for g in games) != wanted:
            continue
        steps = read_columns(shard_path(root, "steps", sid), ["actor_kind", "legal_moves_mode"])
        played = {s.get("legal_moves_mode") or "free" for s in steps.to_pylist()
                  if s["actor_kind"] == "model"}
        if played == modes:
            return sid.shard
    return None


SUMMARY_COLUMNS = ["game_id", "env_id", "actor", "invalid_move", "format_ok", "legal_moves_mode"]
"""What :func:`ub.evaluation.summarize` reads of an eval steps shard."""


def read_columns(path: Path, columns: list[str]) -> pa.Table:
    """``columns`` of a shard, those it has (a shard of an older schema lacks later ones)."""
    have = set(pq.read_schema(path).names)
    return pq.read_table(path, columns=[c for c in columns if c in have])
