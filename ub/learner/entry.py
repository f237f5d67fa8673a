"""The learner's entry points: one update from a checkpoint to the next, written atomically.

:func:`learn_on_batch`, **the learn step**, the one composition of it: reuse a finished
output checkpoint (:func:`committed_update`), else start the learner at the input checkpoint,
update, write (one process or one data-parallel rank: every rank updates, rank 0 writes).
``ub learn`` reaches it through :func:`learn_step` (assemble a batch from shards first), a
run's round through :func:`ub.run.steps.learn.learn_round` (which hands it what to do around
the update: the engine asleep). :func:`write_initial_checkpoint` writes update 0.

They take the learner from ``worker`` (anything with ``learner(config) -> Learner``, such as
a :class:`KeptLearner` or the process's :class:`ub.run.processes.worker.Worker`, which keeps
the base model loaded across rounds with one); without one they load a learner for the call.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from ub.distributed import barrier, rank_and_world
from ub.errors import UbError
from ub.learner.checkpoint import is_checkpoint, read_checkpoint, read_metrics
from ub.learner.config import LearnerConfig
from ub.learner.learner import Learner


class LearnerSource(Protocol):
    """What hands out the learner for a config (e.g. :class:`ub.run.processes.worker.Worker`)."""

    def learner(self, config: LearnerConfig) -> Learner: ...


class KeptLearner:
    """A :class:`LearnerSource` that keeps its learner: built on first use, reused while the
    model fields of the config stay the same (the others are applied with
    :meth:`~ub.learner.learner.Learner.configure`), replaced when they change, and released by
    :meth:`close`. The learner half of a process's :class:`ub.run.processes.worker.Worker`."""

    def __init__(self) -> None:
        self._learner: Learner | None = None

    def learner(self, config: LearnerConfig) -> Learner:
        """The learner for ``config``: the base model is loaded on first use and kept while the
        model fields of ``config`` stay the same."""
        if self._learner is not None and self._learner.same_model(config):
            self._learner.configure(config)
            return self._learner
        if self._learner is not None:
            self.close()
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        self._learner = Learner(config)
        # A learner's start leaves a heap of long-lived objects (torch, transformers, peft):
        # frozen, full garbage collections stop scanning them again, as after vLLM's start
        # (which freezes too). A short `ub train` (the fault suite's) spent 6.7-7.1 s in full
        # collections, 3.9-5.6 s with this. close unfreezes, so a dropped learner's cycles are
        # still freed.
        gc.freeze()
        return self._learner

    def close(self) -> None:
        """Drop the learner and free its memory."""
        self._learner = None
        gc.unfreeze()  # (frozen cycles are never collected)
        gc.collect()


def _learner(worker: LearnerSource | None, config: LearnerConfig) -> Learner:
    return Learner(config) if worker is None else worker.learner(config)


def committed_update(out: Path, from_checkpoint: str | Path | None) -> dict[str, Any] | None:
    """The metrics of a finished checkpoint at ``out`` trained from ``from_checkpoint``;
    ``None`` if there is nothing at ``out``."""
    if not out.exists():
        return None
    if not is_checkpoint(out):
        raise UbError(f"{out} exists and is not a finished ub checkpoint: remove it or pick "
                      "another output path")
    metrics = read_metrics(out)
    if "from_checkpoint" in metrics and metrics["from_checkpoint"] != _path_str(from_checkpoint):
        raise UbError(f"checkpoint {out} already exists and was trained from "
                      f"{metrics['from_checkpoint']}, not {_path_str(from_checkpoint)}: pick "
                      "another output path, or pass overwrite=True to replace it")
    return {**metrics, "reused": True}


def _path_str(path: str | Path | None) -> str | None:
    return None if path is None else str(Path(path).expanduser().absolute())


def learn_on_batch(batch: Any, learner_config: LearnerConfig,
                   from_checkpoint: str | Path | None, out_checkpoint: str | Path, *,
                   overwrite: bool = False, worker: LearnerSource | None = None,
                   around_update: Callable[[], contextlib.AbstractContextManager[Any]] | None
                   = None) -> dict[str, Any]:
    """One update on ``batch`` from ``from_checkpoint`` (``None``: cold start), written to
    ``out_checkpoint``. An existing finished ``out_checkpoint`` is returned as is (its metrics
    with ``"reused": True``) unless ``overwrite``. Returns the update's metrics (with where it
    started and the batch's stats under ``"batch"``). The learner comes from ``worker``
    (``None``: one loaded for this call); ``around_update`` (a run's: its engine asleep) is
    entered around the learner's start, update and save, only when there is an update to do.
    """
    out = Path(out_checkpoint)
    if not overwrite and (done := committed_update(out, from_checkpoint)) is not None:
        return done
    with around_update() if around_update is not None else contextlib.nullcontext():
        learner = _learner(worker, learner_config)
        learner.start(from_checkpoint)
        metrics = learner.update(batch)
        metrics["from_checkpoint"] = _path_str(from_checkpoint)
        if hasattr(batch, "stats"):
            metrics["batch"] = batch.stats.to_dict()
        if rank_and_world()[0] == 0:  # data-parallel ranks hold the same state: one writes it
            learner.save(out, metrics, overwrite=overwrite)
        barrier()  # no rank goes on (e.g. to start from ``out``) before it is written
    return metrics


def learn_step(root: str | Path, batch_config: Any, learner_config: LearnerConfig,
               from_checkpoint: str | Path | None, out_checkpoint: str | Path, *,
               final_rewards_state: Mapping[str, Any] | None = None,
               overwrite: bool = False, worker: LearnerSource | None = None
               ) -> dict[str, Any]:
    """Assemble a batch from the shards under ``root`` and do one update (see
    :func:`learn_on_batch`); the entry point of ``ub learn`` and the learner task.

    :param root: the data root (``steps/`` and ``games/``).
    :param batch_config: a :class:`ub.batch.BatchConfig`.
    :param learner_config: a :class:`LearnerConfig`.
    :param from_checkpoint: the checkpoint to continue from; ``None``: a cold start.
    :param out_checkpoint: the checkpoint folder to write (atomically).
    :param final_rewards_state: passed to :func:`ub.batch.assemble_batch`.
    :param overwrite: redo and replace an existing ``out_checkpoint`` (default: return it).
    :param worker: where the learner comes from (``None``: one loaded for this call).
    :returns: the update's metrics, with the batch's stats under ``"batch"``.
    """
    from ub.batch import assemble_batch
    from ub.learner.algorithms import sampling_refusal

    out = Path(out_checkpoint)
    if not overwrite and (done := committed_update(out, from_checkpoint)) is not None:
        return done
    refusal = sampling_refusal(learner_config.algorithm,
                               [t.config_name() for t in batch_config.transforms.sampling])
    if refusal:
        raise UbError(f"batch.sampling: {refusal}")
    if from_checkpoint is not None:
        read_checkpoint(from_checkpoint)  # a bad checkpoint fails before the batch is assembled
    batch = assemble_batch(Path(root), batch_config, final_rewards_state)
    return learn_on_batch(batch, learner_config, from_checkpoint, out_checkpoint,
                          overwrite=overwrite, worker=worker)


def write_initial_checkpoint(learner_config: LearnerConfig, out_checkpoint: str | Path, *,
                             overwrite: bool = False, worker: LearnerSource | None = None
                             ) -> Path:
    """Write the cold-start state (update 0: ``init_adapter`` or a fresh adapter) as a
    checkpoint, e.g. for round 0's rollouts. An existing finished one is kept."""
    out = Path(out_checkpoint)
    if not overwrite and committed_update(out, None) is not None:
        return out
    learner = _learner(worker, learner_config)
    learner.start(None)
    return learner.save(out, {"update": 0, "from_checkpoint": None,
                              "init_adapter": _path_str(learner_config.init_adapter)},
                        overwrite=overwrite)
