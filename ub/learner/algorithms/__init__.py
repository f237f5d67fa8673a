"""The learner's algorithms, pluggable by name or import path.

An algorithm is one small class (:class:`Algorithm`, :mod:`~ub.learner.algorithms.base`): a
:meth:`~Algorithm.loss` over the completion tokens of one micro-batch, an optional
:meth:`~Algorithm.prepare` over the whole batch, and declarations of what it owns (the batch
columns it reads and adds, the modules it trains besides the adapter, its statistics), which
the learner iterates over. Register it with :func:`register_algorithm` and select it by name in
:class:`ub.learner.LearnerConfig` (``algorithm`` and ``algorithm_params``), or name it there by
import path, ``package.module:Class``, without registering it (:mod:`ub.components`).

The ones ub ships: ``reinforce``, ``ppo`` and ``sft``
(:mod:`~ub.learner.algorithms.policy_gradient`) and ``a2c`` with its value head
(:mod:`~ub.learner.algorithms.a2c`). See ``docs/algorithms.md`` for the formulas and worked
examples.
"""

from ub.learner.algorithms.a2c import A2C, gae
from ub.learner.algorithms.base import (
    ALGORITHMS,
    COLUMNS,
    GUIDE,
    Algorithm,
    PolicyView,
    Reduction,
    TokenBatch,
    Trained,
    algorithm_class,
    algorithm_names,
    algorithm_parameters,
    make_algorithm,
    register_algorithm,
    sampling_refusal,
)
from ub.learner.algorithms.policy_gradient import (
    DEFAULT_TIS_CAP,
    PPO,
    Reinforce,
    Sft,
    check_tis_cap,
    truncated_importance_weights,
)

__all__ = ["A2C", "ALGORITHMS", "COLUMNS", "DEFAULT_TIS_CAP", "GUIDE", "PPO", "Algorithm",
           "PolicyView", "Reduction", "Reinforce", "Sft", "TokenBatch", "Trained",
           "algorithm_class", "algorithm_names", "algorithm_parameters", "check_tis_cap", "gae",
           "make_algorithm", "register_algorithm", "sampling_refusal",
           "truncated_importance_weights"]
