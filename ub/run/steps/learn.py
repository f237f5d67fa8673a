"""The learner's steps of a run: checkpoint 0, and one update per round."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from ub.faults import fault_point
from ub.run.folder.layout import checkpoint_name, read_json, write_json_atomic
from ub.run.folder.store import (
    fetch_checkpoint,
    fetch_missing,
    fetch_round,
    publish,
    publish_checkpoint,
)
from ub.run.steps.plan import behaviour_update
from ub.run.steps.rounds import Run
from ub.seeding import derive_seed

if TYPE_CHECKING:
    from ub.run.processes.worker import Worker

log_learner = logging.getLogger("ub.learner")


def initial_checkpoint(run: Run, *, worker: Worker) -> str:
    """Checkpoint 0: the learner's cold start (``learner.init_adapter`` or a fresh LoRA), by
    ``worker``'s learner."""
    from ub.learner import write_initial_checkpoint

    path = run.paths.checkpoint(0)
    fetch_checkpoint(run.paths, path)  # a resume elsewhere: the run's own start, not a new one
    write_initial_checkpoint(run.learner_config, path, worker=worker)
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
    from ub.distributed import rank_and_world
    from ub.learner import learn_on_batch

    config = run.config
    writer = rank_and_world()[0] == 0  # data-parallel ranks: rank 0 writes for all
    paths = run.paths
    # A learner on a machine without the run's files takes them from the run's store.
    fetch_round(paths, paths.train_data, "steps", round_)
    fetch_round(paths, paths.train_data, "games", round_)
    fetch_missing(paths, paths.root / "state")
    fetch_checkpoint(paths, paths.checkpoint(round_))
    fetch_checkpoint(paths, paths.checkpoint(round_ + 1))  # made before a crash: reused below
    previous = paths.final_rewards_state(round_ - 1)
    state = read_json(previous) if round_ > 0 else None
    batch_config = config.batch.replace(
        first_round=round_, last_round=round_,
        checkpoints=[checkpoint_name(behaviour_update(config, round_))],
        seed=derive_seed(config.seed, round_, "batch"))
    started = time.perf_counter()
    batch = assemble_batch(paths.train_data, batch_config, state)
    assemble_seconds = time.perf_counter() - started
    if writer:
        publish(paths, write_json_atomic(paths.final_rewards_state(round_), batch.final_state))
    fault_point("learn.after-state")
    start, out = paths.checkpoint(round_), paths.checkpoint(round_ + 1)
    # Not pipelined, the engine idles while the learner updates: on a GPU it lends the learner
    # its memory (a no-op on the CPU, and where no engine lives in this process).
    metrics = learn_on_batch(batch, run.learner_config, start, out, worker=worker,
                             around_update=worker.engine_asleep
                             if config.engine_sleeps_during_updates else None)
    if writer:  # (also a reused one: the crash may have come before its upload)
        publish_checkpoint(paths, out)
    metrics["assemble_seconds"] = assemble_seconds
    log_learner.info(
        "round %d: %s -> %s%s: batch %s rows / %s tokens (%s truncated), loss %.5f, grad norm "
        "%.4f, %.1f s", round_ + 1, checkpoint_name(round_), checkpoint_name(round_ + 1),
        " (reused)" if metrics.get("reused") else "", batch.stats.size,
        batch.stats.total_tokens, batch.stats.truncated, metrics.get("loss", 0.0),
        metrics.get("grad_norm", 0.0), metrics.get("seconds", 0.0))
    return metrics
