"""Rating a round: its training games and its evaluation games, on top of the previous
snapshot; and the ratings rebuilt from the games alone."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pyarrow as pa

from ub.branching import played_games
from ub.data.shards import round_dir
from ub.faults import fault_point
from ub.run.folder.layout import checkpoint_name, write_json_atomic
from ub.run.folder.store import fetch_round, publish
from ub.run.steps.plan import load_ratings
from ub.run.steps.rounds import Run, read_manifest

log_pool = logging.getLogger("ub.pool")


def _games_of(root: Path, round_: int, only_shard: int | None = None) -> pa.Table | None:
    folder = round_dir(root, "games", round_)
    files = sorted(folder.glob("shard-*.parquet")) if folder.is_dir() else []
    if only_shard is not None:
        files = [f for f in files if f.name == f"shard-{only_shard:04d}.parquet"]
    if not files:
        return None
    return played_games(files, ["game_index", "game_id", "actors", "rewards", "outcome",
                                "winner"]).sort_by("game_index")



def rate_round(run: Run, round_: int, evaluated: list[int]) -> list[dict[str, Any]]:
    """Ratings after round ``round_``: the previous snapshot, the new checkpoint (inheriting its
    parent's rating), then the round's training games and the eval games of the checkpoints
    ``evaluated`` in the round, in game order. Returns the leaderboard."""
    fetch_round(run.paths, run.paths.train_data, "games", round_)
    for update in evaluated:
        fetch_round(run.paths, run.paths.eval_data, "games", update)
    table = _apply_round(run, load_ratings(run, round_ - 1), round_, evaluated)
    fault_point("rate.before-snapshot")
    publish(run.paths, write_json_atomic(run.paths.ratings(round_), table.snapshot()))
    top = table.leaderboard()[:3]
    log_pool.info("ratings after round %d: %s", round_ + 1, ", ".join(
        f"{m['name']} {m['mu']:.2f}±{m['sigma']:.2f}" for m in top))
    return table.leaderboard()


def _apply_round(run: Run, table: Any, round_: int, evaluated: list[int]) -> Any:
    table.add_checkpoint(checkpoint_name(round_ + 1), parent=checkpoint_name(round_))
    for games in [_games_of(run.paths.train_data, round_),
                  *(_games_of(run.paths.eval_data, u, only_shard=0) for u in sorted(evaluated))]:
        if games is not None:
            table.rate_games(games)
    return table


def rebuild_ratings(run: Run, through_round: int) -> Any:
    """The ratings after ``through_round`` recomputed from the games alone (the evaluated
    checkpoints of each round read from its manifest): equal to the stored snapshot."""
    table = load_ratings(run, -1)
    for round_ in range(through_round + 1):
        evaluated = [int(u) for u in read_manifest(run, round_).get("evals", {})]
        table = _apply_round(run, table, round_, evaluated)
    return table
