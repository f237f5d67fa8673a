"""The learner: LoRA policy-gradient updates on stored token ids, and their checkpoints.

Entry points: :func:`learn_on_batch` (the learn step: reuse, or start, update and write a
checkpoint), :func:`learn_step` (a batch assembled from shards first) and
:func:`write_initial_checkpoint` (:mod:`ub.learner.entry`), the :class:`Learner` class they
use, and the update it runs, :func:`ub.learner.update.update` (one function to read top to
bottom). Algorithms are pluggable and declare what they own (:mod:`ub.learner.algorithms`);
checkpoints are described in :mod:`ub.learner.checkpoint`. Importing this package loads no
model.
"""

from ub.learner.algorithms import (
    A2C,
    ALGORITHMS,
    PPO,
    Algorithm,
    Reinforce,
    TokenBatch,
    Trained,
    algorithm_names,
    gae,
    make_algorithm,
    register_algorithm,
)
from ub.learner.base_identity import model_identity
from ub.learner.batching import plan_micro_batches
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
    committed_update,
    learn_on_batch,
    learn_step,
    write_initial_checkpoint,
)
from ub.learner.learner import Learner
from ub.learner.update import NonFiniteError

__all__ = [
    "A2C",
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
    "Trained",
    "algorithm_names",
    "committed_update",
    "gae",
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
