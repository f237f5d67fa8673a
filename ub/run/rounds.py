"""The steps of one self-play round, as plain functions over a run directory.

The Prefect tasks in ``tasks/`` are thin wrappers of these; ``ub`` itself imports no Prefect.
Every step is idempotent: its output path is a function of (run, round, shard), an existing
committed output is returned instead of redone, and every seed derives from (run seed, round,
game, turn). So a run killed at any moment and started again redoes only unfinished work and
produces what an uninterrupted run would have.

Round ``r`` (synchronous mode)::

    plan      the pool picks each game's env and seats           (pure, from ratings r-1)
    rollout   games played by checkpoint r  -> steps/games shards (one per rollout task)
    learn     batch of round r's decisions  -> checkpoint r+1     (+ final-reward state r)
    evaluate  checkpoint r+1 vs fixed opponents, if due -> eval shard
    rate      ratings r-1 + round r's games + its eval games -> ratings r
    commit    round manifest r (written last: the commit point)
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml

from ub.actors.names import checkpoint_update
from ub.actors.spec import ActorSpec, parse_actor
from ub.data.shards import (
    ShardId,
    is_committed,
    read_metadata,
    round_dir,
    shard_path,
    write_shard,
)
from ub.errors import UbError
from ub.faults import fault_point
from ub.games.specs import GameSpec
from ub.run.config import TrainConfig, load_yaml, read_text, validate_config
from ub.run.layout import (
    RunPaths,
    check_run_format,
    checkpoint_name,
    mark_run_format,
    read_json,
    write_json_atomic,
)
from ub.run.store import (
    fetch_checkpoint,
    fetch_missing,
    fetch_round,
    publish,
    publish_checkpoint,
)
from ub.seeding import derive_seed

if TYPE_CHECKING:
    from ub.inference.protocols import InferenceEngine
    from ub.inference.types import EngineConfig, SamplingConfig
    from ub.run.worker import Worker

log_rollout = logging.getLogger("ub.rollout")
log_learner = logging.getLogger("ub.learner")
log_eval = logging.getLogger("ub.eval")
log_pool = logging.getLogger("ub.pool")


@dataclass(frozen=True)
class Run:
    """What every step needs: where the run lives, its config and the resolved base model."""

    paths: RunPaths
    config: TrainConfig
    base_model: str

    @property
    def name(self) -> str:
        return self.paths.name


# --------------------------------------------------------------------------------------------
# Starting and resuming
# --------------------------------------------------------------------------------------------


def resolve_base_model(config: TrainConfig) -> str:
    """``tiny`` -> the locally built tiny model (built on first use, then cached)."""
    if config.model.base == "tiny":
        from ub.model.tiny import build_tiny_model

        return str(build_tiny_model(seed=config.model.tiny_seed))
    path = Path(config.model.base).expanduser()
    return str(path.absolute()) if path.exists() else config.model.base


def recorded_base_model(paths: RunPaths) -> dict[str, Any] | None:
    """The tiny build a run trains on (:func:`ub.model.identity.tiny_identity`), as recorded in
    its ``ub-run.json`` when it started; for a run from before that record, what its latest
    checkpoint names. ``None``: nothing recorded (a new run, or not a tiny base model)."""
    from ub.learner.checkpoint import identity_source, latest_checkpoint
    from ub.learner.checkpoint import read_manifest as read_checkpoint_manifest

    marker = paths.root / "ub-run.json"
    if marker.exists():
        recorded = read_json(marker).get("base_model")
        if isinstance(recorded, dict):
            return recorded
    latest = latest_checkpoint(paths.root / "checkpoints")
    if latest is None:
        return None
    source = identity_source(read_checkpoint_manifest(latest).get("base_model") or {})
    return source if source.get("kind") == "tiny" else None


def check_recorded_base(paths: RunPaths, config: TrainConfig) -> None:
    """Refuse to go on with a run on another tiny build than the one it started on.

    ``model.base: tiny`` means the tiny build of *this* ub's recipe: after a recipe change (a
    new recipe version, other textarena) it names other weights, and the run's checkpoints
    would continue on a base model they were not trained on. The run is refused rather than
    its old build rebuilt: an older recipe's code is not in this ub (`ub play`/`ub learn` with
    one of its checkpoints use the build it names when this machine has or can build it)."""
    if config.model.base != "tiny":
        return
    recorded = recorded_base_model(paths)
    if recorded is None or recorded.get("kind") != "tiny":
        return
    from ub.model.identity import (
        current_tiny_identity,
        describe_difference,
        describe_tiny,
        same_tiny_build,
    )

    now = current_tiny_identity(config.model.tiny_seed)
    if not same_tiny_build(recorded, now):
        raise UbError(
            f"run {paths.name} was trained on {describe_tiny(recorded)}, but model.base 'tiny' "
            f"is now {describe_tiny(now)} ({describe_difference(recorded, now)}): its "
            "checkpoints would go on with another base model. Resume or evaluate it with the "
            "ub and textarena versions that built it, or start a new run (--run NAME)")


def record_base_model(paths: RunPaths, config: TrainConfig) -> None:
    """Write the tiny build a run trains on into its ``ub-run.json`` (once, at its start; a
    run from before the record gets it on its first resume, after
    :func:`check_recorded_base`), so a later recipe change cannot silently swap it."""
    if config.model.base != "tiny":
        return
    from ub.model.identity import current_tiny_identity

    marker = paths.root / "ub-run.json"
    mark_run_format(paths.root)
    data = read_json(marker)
    if "base_model" not in data:
        write_json_atomic(marker, {**data,
                                   "base_model": current_tiny_identity(config.model.tiny_seed)})


def check_base_model(base: str) -> None:
    """Refuse a ``model.base`` that can never load, before any work: ``tiny``, a model folder
    (with ``config.json``) or a Hugging Face id (``ORG/NAME``, fetched on first use unless
    ``HF_HUB_OFFLINE`` is set, then it must be in the local cache)."""
    if base == "tiny":
        return
    path = Path(base).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UbError(f"model.base {base} has no config.json: give a transformers model "
                          "folder (save_pretrained), 'tiny', or a Hugging Face id")
        return
    if path.exists() or base.startswith(("/", ".", "~")):
        raise UbError(f"model.base {base} is not a model folder (it does not exist or is a "
                      "file)")
    from ub.model.identity import HUB_ID

    if not HUB_ID.match(base):
        raise UbError(f"model.base {base!r} is not 'tiny', a model folder, or a Hugging Face "
                      "id like Qwen/Qwen3-1.7B-Base")
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false"):
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(base, "config.json"), str):
            raise UbError(f"model.base {base} is not in the Hugging Face cache and "
                          "HF_HUB_OFFLINE is set: download it first (huggingface-cli download "
                          f"{base}) or unset HF_HUB_OFFLINE")


def _first_difference(old: Any, new: Any, where: str = "") -> str | None:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            found = _first_difference(old.get(key), new.get(key), f"{where}.{key}" if where
                                      else str(key))
            if found:
                return found
        return None
    return None if old == new else f"{where} ({old!r} in the run, {new!r} now)"


def open_run(paths: RunPaths, config: TrainConfig | None, *, rounds: int | None = None,
             add_rounds: int | None = None, ray_address: str | None = None) -> TrainConfig:
    """:func:`resolve_run_config`, and the result stored as the run's ``config.yaml``."""
    chosen, changed = resolve_run_config(paths, config, rounds=rounds, add_rounds=add_rounds,
                                         ray_address=ray_address)
    if changed:
        _write_config(paths, chosen)
    record_base_model(paths, chosen)
    return chosen


def resolve_run_config(paths: RunPaths, config: TrainConfig | None, *,
                       rounds: int | None = None, add_rounds: int | None = None,
                       ray_address: str | None = None) -> tuple[TrainConfig, bool]:
    """The run's config and whether it differs from the stored one (nothing is written).

    A new run takes ``config``; an existing run keeps its own.

    Resuming with a config is allowed when the training settings match (``rounds`` and
    ``eval`` may change: more rounds extend a finished run); anything else is refused, since
    the run's data would mix two setups. ``rounds`` sets the total, ``add_rounds`` adds to the
    committed count. ``ray_address`` sets ``cluster.address`` (``"local"``: none).
    """
    check_run_format(paths.root)
    stored = None
    if paths.config.exists():
        try:
            data = load_yaml(read_text(paths.config, "run config"))
        except yaml.YAMLError as exc:
            raise UbError(f"{paths.config} is corrupt ({exc})".replace("\n", " ")) from None
        stored = validate_config(data, str(paths.config))
        if config is not None:
            diff = _first_difference(stored.training_settings(), config.training_settings())
            if diff:
                raise UbError(
                    f"run {paths.name} at {paths.root} was started with another config: {diff}. "
                    f"Resume it as it is with `ub train --resume {paths.name}` (optionally "
                    "--rounds N), or start a new run with another --run NAME")
    elif config is None:
        raise UbError(f"no run {paths.name} under {paths.root.parent}: start it with "
                      f"`ub train CONFIG --run {paths.name}`")
    chosen = config if config is not None else stored
    assert chosen is not None
    if stored is not None:
        check_recorded_base(paths, chosen)  # before anything is built, loaded or written
    if add_rounds is not None:
        rounds = len(paths.committed_rounds()) + add_rounds
    if rounds is not None:
        if rounds < 1:
            raise UbError(f"--rounds must be >= 1, got {rounds}")
        chosen = chosen.model_copy(update={"rounds": rounds})
    if ray_address is not None:
        address = None if ray_address == "local" else ray_address
        chosen = chosen.model_copy(
            update={"cluster": chosen.cluster.model_copy(update={"address": address})})
    return chosen, chosen != stored


def _write_config(paths: RunPaths, config: TrainConfig) -> None:
    text = yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
    paths.root.mkdir(parents=True, exist_ok=True)
    mark_run_format(paths.root)
    tmp = paths.config.with_name(".config.yaml.tmp")
    tmp.write_text(text)
    tmp.replace(paths.config)


# --------------------------------------------------------------------------------------------
# Actors and the pool
# --------------------------------------------------------------------------------------------


def actor_spec(run: Run, name: str) -> ActorSpec:
    """A pool member's actor: ``ckpt-NNNNNN`` is the learner's checkpoint as a LoRA adapter;
    anything else is a fixed opponent named as in ``ub play --players``."""
    update = checkpoint_update(name)
    if update is not None:
        return ActorSpec(name, "model", adapter=str(run.paths.checkpoint(update)))
    return parse_actor(name)


def behaviour_update(config: TrainConfig, round_: int) -> int:
    """The checkpoint that plays round ``round_``: ``r``, or ``r - 1`` when pipelined."""
    return max(0, round_ - config.pipeline.max_staleness)


def game_specs(config: TrainConfig) -> list[GameSpec]:
    return [GameSpec(e.env_id, e.num_players, e.template, e.extractor, e.max_turns)
            for e in config.envs]


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
    names = list(config.opponent_config().fixed_names())
    for name in config.eval.opponents:
        if name not in names:
            names.append(name)
    return tuple(names)


def load_ratings(run: Run, round_: int):
    """The rating table after round ``round_`` (``-1``: the initial pool)."""
    from ub.pool.ratings import RatingTable

    if round_ >= 0:
        return RatingTable.from_snapshot(read_json(run.paths.ratings(round_)))
    table = RatingTable(run.config.rating_config())
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
    opponents_config = config.opponent_config()
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
    n = config.rollout.shards
    size = -(-len(games) // n)
    return [games[i * size:(i + 1) * size] for i in range(n)]


# --------------------------------------------------------------------------------------------
# Engine
# --------------------------------------------------------------------------------------------


def run_engine_config(run: Run) -> EngineConfig:
    """The run's vLLM engine settings (its ``engine:`` section on its base model)."""
    from ub.inference.types import EngineConfig

    e = run.config.engine
    return EngineConfig(
        model=run.base_model, dtype=e.dtype, max_model_len=e.max_model_len,
        max_num_seqs=e.max_num_seqs, max_lora_rank=e.max_lora_rank, max_loras=e.max_loras,
        kv_cache_gib=e.kv_cache_gib, gpu_memory_utilization=e.gpu_memory_utilization,
        seed=run.config.seed)


def run_engine(worker: Worker, run: Run, sampling: SamplingConfig) -> InferenceEngine:
    """The worker's vLLM engine for this run (started once, kept across rounds), sampling with
    ``sampling`` unless a request says otherwise."""
    from ub.inference.environment import configure_vllm_environment

    configure_vllm_environment()
    return worker.engine(run_engine_config(run), sampling)


def rollout_sampling(config: TrainConfig, *, evaluation: bool = False) -> SamplingConfig:
    """How the run's model seats sample: ``sampling`` for training games; for evaluation the
    same budget and stop strings at ``eval.temperature`` (no top-p)."""
    from ub.inference.types import SamplingConfig

    s = config.sampling
    if evaluation:
        return SamplingConfig(config.eval.temperature, 1.0, s.max_tokens, tuple(s.stop))
    return SamplingConfig(s.temperature, s.top_p, s.max_tokens, tuple(s.stop))


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


def eval_game_id_prefix(run_name: str, sid: ShardId) -> str:
    """Eval game ids ``RUN-eval-cNNNNNN-sNNNN-gNNNNNN``: never equal to a training game's id
    (``RUN-rNNNNNN-gNNNNNN``), so a join on ``game_id`` cannot mix the two."""
    return f"{run_name}-eval-c{sid.round:06d}-s{sid.shard:04d}"


def _play_shard(worker: Worker, run: Run, root: Path, sid: ShardId, assignments: list, *,
                sampling: SamplingConfig, kind: str) -> ShardResult:
    from ub.rollout import play_games
    from ub.run.progress import progress_bar

    games_path = shard_path(root, "games", sid)
    logger = log_eval if kind == "eval" else log_rollout
    if is_committed(root, sid):
        logger.info("%s shard %s/%s already committed: reused", kind, sid.round, sid.shard)
        meta = read_metadata(games_path)
        return ShardResult(str(games_path), pq.read_metadata(games_path).num_rows,
                           meta.get("decisions", 0), meta.get("model_decisions", 0),
                           meta.get("generated_tokens", 0), meta.get("seconds", 0.0), True,
                           meta.get("invalid_moves", 0), meta.get("outcomes", {}))
    from ub.actors.hosted import check_hosted

    for name in sorted({a.name for g in assignments for a in g.actors if a.kind == "hosted"}):
        check_hosted(name)  # unreachable or keyless: say so before any game starts
    checkpoints = run.paths.root / "checkpoints"
    for adapter in sorted({a.adapter for g in assignments for a in g.actors if a.adapter}):
        if Path(adapter).parent == checkpoints:
            fetch_checkpoint(run.paths, Path(adapter))  # a worker without the run's files
    needs_engine = any(a.kind == "model" for g in assignments for a in g.actors)
    engine = run_engine(worker, run, sampling) if needs_engine else None
    logger.info("%s shard %s/%s: playing %d games", kind, sid.round, sid.shard, len(assignments))
    try:
        # Eval games are paired: every checkpoint meets the same seeds (env, opponent, sampling).
        paired = {"seed_round": "eval", "game_id_prefix": eval_game_id_prefix(run.name, sid)}
        what = (f"eval ckpt {sid.round}" if kind == "eval" else f"round {sid.round}") + (
            f" shard {sid.shard}" if sid.shard else "")
        with progress_bar(what, len(assignments), logger=logger) as progress:
            rollout = play_games(assignments, engine=engine, run=run.name, round_=sid.round,
                                 shard=sid.shard, base_seed=run.config.seed,
                                 concurrency=run.config.rollout.concurrency, sampling=sampling,
                                 progress=progress, **(paired if kind == "eval" else {}))
    except Exception:
        # Nothing of the shard was written; the task's retry (or a resume) replays it.
        logger.exception("%s shard %s/%s failed", kind, sid.round, sid.shard)
        raise
    st = rollout.stats
    model_rows = rollout.steps.filter(pc.equal(rollout.steps["actor_kind"], "model"))
    invalid = int(pc.sum(model_rows["invalid_move"].cast(pa.int64())).as_py() or 0)
    extra = {"kind": kind, "model": run.base_model, "decisions": st.decisions,
             "model_decisions": st.model_decisions, "generated_tokens": st.generated_tokens,
             "seconds": st.seconds, "invalid_moves": invalid, "outcomes": st.outcomes}
    publish(run.paths, *write_shard(root, sid, run.name, rollout.steps, rollout.games, extra))
    logger.info("%s shard %s/%s committed: %d games (%s), %d model decisions, %d invalid, "
                "%d tokens in %.1f s -> %s", kind, sid.round, sid.shard, st.games, st.outcomes,
                st.model_decisions, invalid, st.generated_tokens, st.seconds, games_path)
    return ShardResult(str(games_path), st.games, st.decisions, st.model_decisions,
                       st.generated_tokens, st.seconds, False, invalid, dict(st.outcomes))


def rollout_shard(run: Run, round_: int, shard: int, games: list[PlannedGame], *,
                  worker: Worker) -> ShardResult:
    """Play one shard of round ``round_`` (or return it if already committed) on ``worker``'s
    engine."""
    from ub.rollout import GameAssignment

    specs = game_specs(run.config)
    actors: dict[str, ActorSpec] = {}
    assignments = []
    for g in games:
        seated = tuple(actors.setdefault(n, actor_spec(run, n)) for n in g.actors)
        env_seed = derive_seed(run.config.seed, round_, g.game_index, "env")
        assignments.append(GameAssignment(specs[g.env], g.game_index, env_seed, seated))
    return _play_shard(worker, run, run.paths.train_data, ShardId(round_, shard), assignments,
                       sampling=rollout_sampling(run.config), kind="train")


def initial_checkpoint(run: Run, *, worker: Worker) -> str:
    """Checkpoint 0: the learner's cold start (``learner.init_adapter`` or a fresh LoRA), by
    ``worker``'s learner."""
    from ub.learner import write_initial_checkpoint

    path = run.paths.checkpoint(0)
    fetch_checkpoint(run.paths, path)  # a resume elsewhere: the run's own start, not a new one
    write_initial_checkpoint(run.config.learner_config(run.base_model), path, worker=worker)
    publish_checkpoint(run.paths, path)
    return str(path)


def learn_round(run: Run, round_: int, *, worker: Worker) -> dict[str, Any]:
    """One update on round ``round_``'s decisions: checkpoint r -> checkpoint r+1, by
    ``worker``'s learner.

    The batch takes the decisions of the checkpoint that played the round (its own seats,
    not older opponents'), sampled with a per-round seed. The final-reward transforms' state
    after the round is saved before the update, so a resumed run continues it.
    """
    from ub.batch import assemble_batch
    from ub.learner import learn_on_batch
    from ub.learner.distributed import rank_and_world

    config = run.config
    writer = rank_and_world()[0] == 0  # data-parallel ranks: rank 0 writes for all
    paths = run.paths
    # A learner on a machine without the run's files takes them from the run's store.
    fetch_round(paths, paths.train_data, "steps", round_)
    fetch_round(paths, paths.train_data, "games", round_)
    fetch_missing(paths, paths.root / "state")
    fetch_checkpoint(paths, paths.checkpoint(round_))
    fetch_checkpoint(paths, paths.checkpoint(round_ + 1))  # made before a crash: reused
    previous = paths.final_rewards_state(round_ - 1)
    state = read_json(previous) if round_ > 0 else None
    batch_config = config.batch_config(
        first_round=round_, last_round=round_,
        checkpoints=[checkpoint_name(behaviour_update(config, round_))],
        seed=derive_seed(config.seed, round_, "batch"))
    started = time.perf_counter()
    batch = assemble_batch(paths.train_data, batch_config, state)
    assemble_seconds = time.perf_counter() - started
    if writer:
        publish(paths, write_json_atomic(paths.final_rewards_state(round_), batch.final_state))
    fault_point("learn.after-state")
    metrics = learn_on_batch(batch, config.learner_config(run.base_model),
                             paths.checkpoint(round_), paths.checkpoint(round_ + 1),
                             worker=worker)
    if writer:
        publish_checkpoint(paths, paths.checkpoint(round_ + 1))
    metrics["assemble_seconds"] = assemble_seconds
    log_learner.info(
        "round %d: %s -> %s%s: batch %s rows / %s tokens (%s truncated), loss %.5f, grad norm "
        "%.4f, %.1f s", round_, checkpoint_name(round_), checkpoint_name(round_ + 1),
        " (reused)" if metrics.get("reused") else "", batch.stats.size,
        batch.stats.total_tokens, batch.stats.truncated, metrics.get("loss", 0.0),
        metrics.get("grad_norm", 0.0), metrics.get("seconds", 0.0))
    return metrics


def eval_due(config: TrainConfig, update: int) -> bool:
    """Checkpoints evaluated: the start (0), every ``eval.every`` updates, and the last."""
    every = config.eval.every
    return every > 0 and (update == 0 or update % every == 0 or update == config.rounds)


def evaluate_checkpoint(run: Run, update: int, *, opponents: list[str] | None = None,
                        envs: list[str] | None = None, games: int | None = None,
                        shard: int = 0, worker: Worker) -> dict[str, Any]:
    """Checkpoint ``update`` vs each opponent on each env, seats balanced: ``{"rows": [per
    (env, opponent) results with Wilson intervals], "seconds": play time, "reused": bool,
    "shard": path}``.

    Shard 0 of eval round ``update`` is the run's own evaluation (the ``eval`` settings; rated,
    and reused if it exists); ad-hoc evaluations (``ub eval`` with other opponents, envs or
    game counts) go to later shards of the same round and are not rated.

    The games run on ``worker``'s engine.
    """
    from ub.evaluation import eval_assignments, random_baseline, summarize, with_baseline

    config = run.config
    actor = actor_spec(run, checkpoint_name(update))
    rivals = [actor_spec(run, n) for n in (opponents or config.eval.opponents)]
    env_ids = envs or config.eval.envs or [e.env_id for e in config.envs]
    by_id = {e.env_id: e for e in config.envs}
    specs = [GameSpec(i, by_id[i].num_players, by_id[i].template, by_id[i].extractor,
                      by_id[i].max_turns) if i in by_id else GameSpec(i) for i in env_ids]
    assignments = eval_assignments(actor, rivals, specs, games or config.eval.games,
                                   derive_seed(config.seed, "eval"))
    sampling = rollout_sampling(config, evaluation=True)
    sid = ShardId(update, shard)
    played = _play_shard(worker, run, run.paths.eval_data, sid, assignments, sampling=sampling,
                         kind="eval")
    games_table = pq.read_table(shard_path(run.paths.eval_data, "games", sid))
    steps = pq.read_table(shard_path(run.paths.eval_data, "steps", sid),
                          columns=["game_id", "env_id", "actor", "invalid_move", "format_ok"])
    summary = summarize(games_table, steps, actor.name)
    if all(r.kind == "scripted" for r in rivals):  # the bar to clear: random on the same seeds
        baseline = random_baseline(assignments, actor.name, config.seed)
        summary = with_baseline(summary, baseline)
    rows = [row.to_dict() for row in summary]
    for row in rows:
        log_eval.info("%s vs %s on %s: %d games, win %.3f [%.3f, %.3f], invalid %.3f "
                      "(random in its seats: %s)", actor.name, row["opponent"], row["env_id"],
                      row["games"], row["win_rate"], row["win_low"], row["win_high"],
                      row["invalid_move_rate"], "n/a" if row["baseline_win_rate"] is None
                      else f"{row['baseline_win_rate']:.3f}")
    return {"rows": rows, "seconds": 0.0 if played.reused else played.seconds,
            "reused": played.reused, "shard": played.games_path}


def _games_of(root: Path, round_: int, only_shard: int | None = None) -> pa.Table | None:
    folder = round_dir(root, "games", round_)
    files = sorted(folder.glob("shard-*.parquet")) if folder.is_dir() else []
    if only_shard is not None:
        files = [f for f in files if f.name == f"shard-{only_shard:04d}.parquet"]
    if not files:
        return None
    table = pa.concat_tables(pq.read_table(f, columns=["game_index", "game_id", "actors",
                                                       "rewards", "outcome", "winner"])
                             for f in files)
    return table.sort_by("game_index")


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
    log_pool.info("ratings after round %d: %s", round_, ", ".join(
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


def commit_round(run: Run, round_: int, manifest: dict[str, Any]) -> Path:
    """Write round ``round_``'s manifest: from now on the round is done."""
    fault_point("round.before-commit")
    path = write_json_atomic(run.paths.manifest(round_), {"round": round_, **manifest})
    publish(run.paths, path)  # last: in the store too, the manifest commits the round
    return path


def read_manifest(run: Run, round_: int) -> dict[str, Any]:
    return read_json(run.paths.manifest(round_))
