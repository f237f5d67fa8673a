"""The learner's algorithms, pluggable by name or import path.

An algorithm is one small class (:class:`Algorithm`, :mod:`~ub.learner.algorithms.base`): a
:meth:`~Algorithm.loss` over the completion tokens of one micro-batch, an optional
:meth:`~Algorithm.prepare` over the whole batch, and declarations of what it owns (the batch
columns it reads and adds, the modules it trains besides the adapter, its statistics), which
the learner iterates over. Register it with :func:`register_algorithm` and select it by name in
:class:`ub.learner.LearnerConfig` (``algorithm`` and ``algorithm_params``, validated as the
algorithm's :attr:`~Algorithm.Params` section), or name it there by import path,
``package.module:Class``, without registering it (:mod:`ub.components`).

The ones ub ships: ``reinforce``, ``ppo`` and ``sft``
(:mod:`~ub.learner.algorithms.policy_gradient`) and ``a2c`` with its value head
(:mod:`~ub.learner.algorithms.a2c`). See ``docs/algorithms.md`` for the formulas and worked
examples.
"""

from ub.learner.algorithms.a2c import A2C, A2CParams, gae
from ub.learner.algorithms.base import (
    ALGORITHMS,
    COLUMNS,
    GUIDE,
    Algorithm,
    AlgorithmParams,
    PolicyView,
    Reduction,
    TokenBatch,
    Trained,
    algorithm_class,
    algorithm_names,
    algorithm_parameters,
    algorithm_settings,
    make_algorithm,
    register_algorithm,
    sampling_refusal,
)
from ub.learner.algorithms.policy_gradient import (
    DEFAULT_TIS_CAP,
    PPO,
    PPOParams,
    Reinforce,
    ReinforceParams,
    Sft,
    SftParams,
    truncated_importance_weights,
)

__all__ = ["A2C", "ALGORITHMS", "COLUMNS", "DEFAULT_TIS_CAP", "GUIDE", "PPO", "A2CParams",
           "Algorithm", "AlgorithmParams", "PPOParams", "PolicyView", "Reduction", "Reinforce",
           "ReinforceParams", "Sft", "SftParams", "TokenBatch", "Trained", "algorithm_class",
           "algorithm_names", "algorithm_parameters", "algorithm_settings", "gae",
           "make_algorithm", "register_algorithm", "sampling_refusal",
           "truncated_importance_weights"]
