"""What an algorithm is: a small class that declares what it owns, the micro-batch it sees
(:class:`TokenBatch`), and the registry that builds one by name or import path.

An algorithm is :meth:`Algorithm.loss` (one micro-batch's share of the batch loss), an
optional :meth:`Algorithm.prepare` (the whole batch, once per update) and, for one with state,
declarations the learner iterates over and nothing else:

- :attr:`Algorithm.reads`: the batch columns it trains on, ``advantages`` (after the batch's
  sampling stage) or ``returns`` (each decision's reward after the final and step stages);
- :meth:`Algorithm.build`: the modules it trains besides the adapter, each a :class:`Trained`
  with its optimizer's settings, saved in a checkpoint as ``NAME.safetensors``;
- :attr:`Algorithm.adds` and :meth:`Algorithm.measure`: the per-row columns it adds to the
  batch at the update's start, from the state each decision was made in;
- :attr:`Algorithm.reads_states`: its loss reads those states (with their gradient);
- :attr:`Algorithm.statistics`: how its statistics are reduced (every statistic it reports
  reaches the run's data, declared or not).

Its parameters (``learner.algorithm_params``) are declared once, as a typed section,
:attr:`Algorithm.Params` (an :class:`AlgorithmParams`: each parameter's type, default, range
and meaning), which validates them with the config and documents them in docs/config.md; an
algorithm that declares none takes the plain mapping as keyword arguments of its
``__init__``. :func:`make_algorithm` is the one place either is built.

See ``docs/algorithms.md`` for the formulas and worked examples.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

import torch
from pydantic import ValidationError

from ub.components import is_import_path, load_class, public_name
from ub.errors import UbError
from ub.settings import Section, format_errors

if TYPE_CHECKING:
    from ub.batch import Batch

Reduction = Literal["token", "row", "max"]
"""How a statistic is reduced: ``token``, a sum over completion tokens reported per token (the
default); ``row``, a sum over the micro-batches' rows reported per row; ``max``, a maximum
(the default for a name ending in ``_max``)."""

COLUMNS = ("advantages", "returns")
"""The batch columns an algorithm may read (:attr:`Algorithm.reads`)."""


class PolicyView(Protocol):
    """What :meth:`Algorithm.build` reads of the policy its modules sit beside (the learner's
    :class:`ub.learner.policy.Policy`, which has more: its ``model``, its ``dtype``)."""

    hidden_size: int  # the size of the decision states (TokenBatch.states)
    device: torch.device


@dataclass
class TokenBatch:
    """The completion tokens of one micro-batch, flattened (``N`` tokens), and its rows.

    :param logprobs: (N,) the learner's logprob of each token (``log_softmax(logits / T)``,
        float32, with gradient).
    :param behaviour_logprobs: (N,) the sampler's logprob of the same token.
    :param advantages: (N,) the advantage of the token's sequence.
    :param rows: (N,) the index of the token's sequence in the step's batch.
    :param normalizer: ``B * L``: divide summed token terms by it (docs/algorithms.md).
    :param old_logprobs: (N,) the learner's logprob of the token at the weights the update
        started from (no gradient); ``None``: ``logprobs`` are those (the update's first step).
    :param batch: the micro-batch's ``b`` rows (their ``returns``, ``measured`` columns and
        ``rows`` table), in the order of ``states``.
    :param states: (b, hidden) the state each row's decision was made in (the policy's last
        hidden state at the end of its prompt), with its gradient; only for an algorithm that
        sets :attr:`Algorithm.reads_states`.
    :param batch_rows: ``B``, the rows of the step's batch: divide summed row terms by it.
    """

    logprobs: torch.Tensor
    behaviour_logprobs: torch.Tensor
    advantages: torch.Tensor
    rows: torch.Tensor
    normalizer: float
    old_logprobs: torch.Tensor | None = None
    batch: Batch | None = None
    states: torch.Tensor | None = None
    batch_rows: int = 0

    def old(self) -> torch.Tensor:
        """The learner's logprobs at the update's start, detached."""
        return self.logprobs.detach() if self.old_logprobs is None else self.old_logprobs


@dataclass
class Trained:
    """A module an algorithm trains besides the adapter, and its optimizer's settings.

    The learner steps it with its own AdamW (a constant learning rate; the adapter's gradient
    clipping and schedule are the adapter's) after each of the adapter's steps, sums its
    gradients over data-parallel ranks, rolls it back with a failed update, and saves its
    ``state_dict`` in each checkpoint as ``NAME.safetensors`` (tensors ``NAME.<key>``), its
    AdamW state in ``optimizer.safetensors`` under the same names; a resume restores both bit
    for bit. A module without trainable parameters (a running average in a buffer) is saved
    and restored the same way, with no optimizer.
    """

    module: torch.nn.Module
    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8


class AlgorithmParams(Section):
    """Base of an algorithm's typed parameters (:attr:`Algorithm.Params`): the
    ``learner.algorithm_params`` of a config that names the algorithm."""

    key = "learner.algorithm_params"


class Algorithm:
    """Base class of the learner's algorithms.

    Subclasses set :attr:`name` (registered ones) and implement :meth:`loss`. Their parameters
    come from ``LearnerConfig.algorithm_params``, one of two ways:

    - declared: :attr:`Params` names an :class:`AlgorithmParams` subclass; the mapping is
      validated as that section when the config is (each bad value refused by its path,
      ``learner.algorithm_params.NAME``), and ``__init__`` takes the section instance, one
      argument (the built-in algorithms, whose sections docs/config.md shows);
    - not declared (:attr:`Params` ``None``): ``__init__`` takes the mapping's items as
      keyword arguments (with defaults), and checks their values itself.

    ``__init__`` is called when a config is checked: keep it cheap, build modules in
    :meth:`build`.
    """

    name: ClassVar[str] = ""
    # Its parameters' section (AlgorithmParams); None: keyword arguments of __init__. A
    # subclass that takes keyword arguments of its own sets it back to None.
    Params: ClassVar[type[AlgorithmParams] | None] = None
    # Rows whose advantage is exactly 0 get no gradient from a loss linear in the advantage;
    # the learner skips their forward pass unless this is True (e.g. a loss with a KL term).
    needs_zero_advantage_rows: ClassVar[bool] = False
    # True: an update of several optimizer steps scores the batch once more at its start, for
    # TokenBatch.old_logprobs (one step reads them from its own forward pass).
    needs_old_logprobs: bool = False
    # The batch columns it trains on (COLUMNS). An algorithm that reads returns and not
    # advantages makes its own advantages: a batch with sampling transforms is refused for it.
    reads: ClassVar[tuple[str, ...]] = ("advantages",)
    # The per-row columns measure() adds to the batch at the update's start (Batch.measured).
    adds: ClassVar[tuple[str, ...]] = ()
    # True: loss() gets TokenBatch.states.
    reads_states: ClassVar[bool] = False
    # How its statistics are reduced, by name (Reduction); a name not here: "token", or "max"
    # for one ending in _max.
    statistics: ClassVar[Mapping[str, Reduction]] = {}

    def build(self, policy: PolicyView) -> dict[str, Trained]:
        """Make the modules it trains besides the adapter, at their initial state, by name
        (the name of each one's checkpoint file; letters, digits and ``_``). Called at every
        start of the learner (a cold start, or before a checkpoint's state is loaded into
        them), with the policy they sit beside (its ``hidden_size``, ``device``); the torch RNG
        is seeded by the learner's seed. Keep the modules: :meth:`prepare` and :meth:`loss`
        use them."""
        return {}

    def measure(self, states: torch.Tensor) -> dict[str, torch.Tensor]:
        """The columns :attr:`adds` declares, (b,) each, of ``b`` rows whose decision states
        ``states`` (b, hidden) are, at the weights the update starts from (no gradient)."""
        raise NotImplementedError(f"{type(self).__name__} declares adds {self.adds} but has "
                                  "no measure()")

    def prepare(self, batch: Batch, rng: random.Random) -> Batch:
        """Called once per update with the whole batch, before minibatches and micro-batches.

        Return the batch to train on (e.g. with transformed advantages). ``rng`` is the
        learner's Python RNG, saved in checkpoints: use it (not ``random``) for any
        randomness, so a resumed run repeats it.
        """
        return batch

    def loss(self, tokens: TokenBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The micro-batch's share of the batch loss, and its statistics.

        :returns: ``(loss, stats)``: ``loss`` a scalar, a sum over the tokens divided by
            ``tokens.normalizer`` (row terms: by ``tokens.batch_rows``); ``stats`` detached
            scalars, each reduced as :attr:`statistics` says: by default a **sum over the
            tokens** (the learner adds them over micro-batches and reports ``sum / completion
            tokens``), a maximum for keys ending in ``_max``.
        """
        raise NotImplementedError

    @classmethod
    def reduction(cls, statistic: str) -> Reduction:
        """How ``statistic`` is reduced (:attr:`statistics`)."""
        return cls.statistics.get(statistic, "max" if statistic.endswith("_max") else "token")


def sampling_refusal(name: str, sampling: Sequence[str]) -> str | None:
    """Why algorithm ``name`` cannot train on a batch whose sampling stage is ``sampling`` (the
    transforms' names), or ``None``. One that reads returns and not advantages makes its own
    advantages: a sampling transform would change nothing it trains on (and a return
    normalized is no return). (What it reads is a declaration of its class: nothing is built.)"""
    algorithm = algorithm_class(name)
    if not sampling or "advantages" in algorithm.reads:
        return None
    return (f"[{', '.join(sampling)}] makes the batch's advantages, and learner.algorithm "
            f"{name!r} reads its {', '.join(algorithm.reads)} (each decision's reward after "
            "the final and step stages), not its advantages: set batch.sampling: [] (the "
            "algorithm makes its own advantages)")


# --------------------------------------------------------------------------------------------
# The registry
# --------------------------------------------------------------------------------------------


ALGORITHMS: dict[str, type[Algorithm]] = {}


def register_algorithm(cls: type[Algorithm]) -> type[Algorithm]:
    """Class decorator: make ``cls`` available under ``cls.name``."""
    if not cls.name:
        raise UbError(f"algorithm class {cls.__name__} has no name")
    ALGORITHMS[cls.name] = cls
    return cls


def algorithm_names() -> list[str]:
    """The registered algorithms' names, sorted."""
    return sorted(ALGORITHMS)


def algorithm_parameters(name: str) -> dict[str, Any]:
    """The parameters of algorithm ``name`` (a registered name or an import path) and their
    defaults: its :attr:`~Algorithm.Params` section's fields, or its ``__init__``'s keyword
    arguments."""
    cls = algorithm_class(name)
    if cls.Params is not None:
        return {field: info.get_default(call_default_factory=True)
                for field, info in cls.Params.model_fields.items()}
    signature = inspect.signature(cls.__init__)
    return {p.name: p.default for p in list(signature.parameters.values())[1:]
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def algorithm_settings(name: str, params: Mapping[str, Any] | None = None
                       ) -> AlgorithmParams | dict[str, Any]:
    """``params`` checked as algorithm ``name``'s parameters: its :attr:`~Algorithm.Params`
    section, validated (a bad value raises pydantic's ``ValidationError``, each error at the
    parameter's name, so that a config's validation reports it at
    ``learner.algorithm_params.NAME``), or, for an algorithm that declares none, the mapping
    itself once its keys are known to ``__init__``.

    :raises ValueError: a parameter the algorithm does not have (with the valid ones).
    """
    params = dict(params or {})
    cls = algorithm_class(name)
    known = algorithm_parameters(name)
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise ValueError(f"algorithm {name!r} has no parameter(s) {', '.join(unknown)}; "
                         f"valid: {', '.join(sorted(known)) or 'none'}")
    return params if cls.Params is None else cls.Params.model_validate(params)


def make_algorithm(name: str, params: Mapping[str, Any] | None = None) -> Algorithm:
    """An instance of algorithm ``name`` with ``params`` (:func:`algorithm_settings`): the one
    construction of an algorithm, for the config's check and the learner alike. Unknown names
    or params, values out of range, and declarations that mean nothing are errors."""
    cls = algorithm_class(name)
    try:
        settings = algorithm_settings(name, params)
    except ValidationError as exc:
        raise UbError(format_errors(exc, AlgorithmParams.key, cls.Params)) from None
    except ValueError as exc:
        raise UbError(str(exc)) from None
    build: Callable[..., Algorithm] = cls  # (its __init__ is the subclass's: see Algorithm)
    try:
        algorithm = (build(settings) if isinstance(settings, AlgorithmParams)
                     else build(**settings))
    except (TypeError, ValueError) as e:
        raise UbError(f"algorithm {name!r}: {e}") from e
    bad = [c for c in algorithm.reads if c not in COLUMNS]
    if bad or not algorithm.reads:
        raise UbError(f"algorithm {name!r} reads {list(algorithm.reads)}: it reads one or both "
                      f"of the batch's {', '.join(COLUMNS)} ({GUIDE})")
    if algorithm.adds and type(algorithm).measure is Algorithm.measure:
        raise UbError(f"algorithm {name!r} adds {list(algorithm.adds)} and has no measure() "
                      f"to make them ({GUIDE})")
    return algorithm


GUIDE = "docs/algorithms.md, \"Writing a new algorithm\""


def algorithm_class(name: str) -> type[Algorithm]:
    """The class of algorithm ``name``: a registered name, or ``package.module:Class``."""
    if is_import_path(name):
        return load_class(name, Algorithm, "algorithm", GUIDE)
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise UbError(f"unknown algorithm {name!r}; registered: {', '.join(algorithm_names())}; "
                      "or your own as package.module:Class, a subclass of "
                      f"{public_name(Algorithm)} ({GUIDE})") from None
