"""The learner: LoRA policy-gradient updates on stored token ids, and their checkpoints.

Entry points: :func:`learn_step` (assemble a batch from shards, update, write a checkpoint),
:func:`learn_on_batch`, :func:`write_initial_checkpoint` (:mod:`ub.learner.entry`), and the
:class:`Learner` class they use. Algorithms are pluggable (:mod:`ub.learner.algorithms`);
checkpoints are described in :mod:`ub.learner.checkpoint`. Importing this package loads no
model, and no torch until a name is used: reading a run's config imports
:mod:`ub.learner.config` (the ``learner:`` section), which needs neither.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ub.learner.algorithms import (
        ALGORITHMS,
        PPO,
        Algorithm,
        Reinforce,
        TokenBatch,
        algorithm_names,
        make_algorithm,
        register_algorithm,
    )
    from ub.learner.base_identity import model_identity
    from ub.learner.batching import TrainBatch, plan_micro_batches
    from ub.learner.checkpoint import (
        CheckpointState,
        is_checkpoint,
        latest_checkpoint,
        read_checkpoint,
        read_manifest,
        read_metrics,
    )
    from ub.learner.config import LearnerConfig, LearnerSection
    from ub.learner.entry import (
        LearnerSource,
        learn_on_batch,
        learn_step,
        write_initial_checkpoint,
    )
    from ub.learner.learner import Learner, NonFiniteError

_EXPORTS = {
    "ALGORITHMS": "ub.learner.algorithms",
    "PPO": "ub.learner.algorithms",
    "Algorithm": "ub.learner.algorithms",
    "Reinforce": "ub.learner.algorithms",
    "TokenBatch": "ub.learner.algorithms",
    "algorithm_names": "ub.learner.algorithms",
    "make_algorithm": "ub.learner.algorithms",
    "register_algorithm": "ub.learner.algorithms",
    "model_identity": "ub.learner.base_identity",
    "TrainBatch": "ub.learner.batching",
    "plan_micro_batches": "ub.learner.batching",
    "CheckpointState": "ub.learner.checkpoint",
    "is_checkpoint": "ub.learner.checkpoint",
    "latest_checkpoint": "ub.learner.checkpoint",
    "read_checkpoint": "ub.learner.checkpoint",
    "read_manifest": "ub.learner.checkpoint",
    "read_metrics": "ub.learner.checkpoint",
    "LearnerConfig": "ub.learner.config",
    "LearnerSection": "ub.learner.config",
    "LearnerSource": "ub.learner.entry",
    "learn_on_batch": "ub.learner.entry",
    "learn_step": "ub.learner.entry",
    "write_initial_checkpoint": "ub.learner.entry",
    "Learner": "ub.learner.learner",
    "NonFiniteError": "ub.learner.learner",
}

__all__ = [
    "ALGORITHMS",
    "PPO",
    "Algorithm",
    "CheckpointState",
    "Learner",
    "LearnerConfig",
    "LearnerSection",
    "LearnerSource",
    "NonFiniteError",
    "Reinforce",
    "TokenBatch",
    "TrainBatch",
    "algorithm_names",
    "is_checkpoint",
    "latest_checkpoint",
    "learn_on_batch",
    "learn_step",
    "make_algorithm",
    "model_identity",
    "plan_micro_batches",
    "read_checkpoint",
    "read_manifest",
    "read_metrics",
    "register_algorithm",
    "write_initial_checkpoint",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ub.learner' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
