"""Planning a round: the pool's actors, the ratings it draws from, and each game's env and seats
(a pure function of the config, the round and committed ratings)."""

from __future__ import annotations

from dataclasses import dataclass

from ub.actors.base import Actor
from ub.actors.model import ModelActor
from ub.actors.names import checkpoint_update
from ub.actors.spec import parse_actor
from ub.run.config.load import TrainConfig
from ub.run.folder.layout import checkpoint_name, read_json
from ub.run.steps.rounds import Run
from ub.seeding import derive_seed


def pool_actor(run: Run, name: str) -> Actor:
    """A pool member's actor: ``ckpt-NNNNNN`` is the learner's checkpoint as a LoRA adapter;
    anything else is a fixed opponent named as in ``ub play --players``."""
    update = checkpoint_update(name)
    if update is not None:
        return ModelActor(name, adapter=str(run.paths.checkpoint(update)))
    return parse_actor(name)


def behaviour_update(config: TrainConfig, round_: int) -> int:
    """The checkpoint that plays round ``round_``: ``r``, or ``r - 1`` when pipelined."""
    return max(0, round_ - config.pipeline.max_staleness)


def split_by_weight(total: int, weights: list[float]) -> list[int]:
    """``total`` split in proportion to ``weights`` (largest remainders; ties to the first)."""
    scale = sum(weights)
    exact = [total * w / scale for w in weights]
    counts = [int(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


def fixed_opponents(config: TrainConfig) -> tuple[str, ...]:
    """Fixed pool members: those the opponent modes name, plus the eval opponents."""
    names = list(config.opponents.fixed_names())
    for name in config.eval.opponents:
        if name not in names:
            names.append(name)
    return tuple(names)


def load_ratings(run: Run, round_: int):
    """The rating table after round ``round_`` (``-1``: the initial pool)."""
    from ub.pool.ratings import RatingTable

    if round_ >= 0:
        return RatingTable.from_snapshot(read_json(run.paths.ratings(round_)))
    table = RatingTable(run.config.rating)
    table.add_checkpoint(checkpoint_name(0))
    for name in fixed_opponents(run.config):
        table.add_fixed(name)
    return table


@dataclass(frozen=True)
class PlannedGame:
    """One game of a round: env (index into ``config.envs``), game index, actors by seat."""

    env: int
    game_index: int
    actors: tuple[str, ...]


def plan_round(run: Run, round_: int) -> list[list[PlannedGame]]:
    """The round's games, split into ``rollout.shards`` contiguous shards.

    A pure function of the config, the round and committed ratings: a resumed run plans
    exactly the games the interrupted one did.
    """
    from ub.pool.sampling import PoolView, sample_opponents, seat_players

    config = run.config
    current = behaviour_update(config, round_)
    # Pipelined, round r is planned while round r-1 is still learning: use the ratings before.
    ratings = load_ratings(run, round_ - 1 - config.pipeline.max_staleness)
    view = PoolView(current=checkpoint_name(current),
                    checkpoints=tuple(checkpoint_name(u) for u in range(current + 1)),
                    fixed=fixed_opponents(config), ratings=ratings)
    opponents_config = config.opponents
    counts = split_by_weight(config.rollout.games_per_round, [e.weight for e in config.envs])
    games: list[PlannedGame] = []
    for env_index, (env, count) in enumerate(zip(config.envs, counts, strict=True)):
        if count == 0:
            continue
        drawn = sample_opponents(opponents_config, view, count,
                                 derive_seed(config.seed, round_, env_index, "opponents"),
                                 num_opponents=env.num_players - 1)
        for opponents in drawn:
            index = len(games)
            seats = seat_players(view.current, list(opponents), env.num_players, index,
                                 derive_seed(config.seed, round_, index, "seats"))
            games.append(PlannedGame(env_index, index, tuple(seats)))
    n = round_shards(run, round_)
    size = -(-len(games) // n)
    return [games[i * size:(i + 1) * size] for i in range(n)]


def round_shards(run: Run, round_: int) -> int:
    """How many shards round ``round_`` is split into: ``rollout.shards``, unless a process
    that died mid-round committed some of its shards with another value (it may change on
    resume), which they record: an unfinished round keeps its split, so that no game is
    played twice or never."""
    from ub.data.shards import ShardId, is_committed, read_metadata, round_dir, shard_path

    folder = round_dir(run.paths.train_data, "games", round_)
    for file in sorted(folder.glob("shard-*.parquet")) if folder.is_dir() else []:
        sid = ShardId(round_, int(file.stem.removeprefix("shard-")))
        if is_committed(run.paths.train_data, sid):
            recorded = read_metadata(shard_path(run.paths.train_data, "games", sid)).get("shards")
            if isinstance(recorded, int) and recorded >= 1:
                return recorded
    return run.config.rollout.shards
